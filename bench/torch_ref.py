"""bench/torch_ref.py — PyTorch's MNIST example network, timed the way `mnist_cnn --bench` is.

    python3 bench/torch_ref.py [--steps 200] [--batches 64,512,4096] [--dtype fp32|bf16]

Same network (conv 1->32 3x3, relu, conv 32->64 3x3, relu, max-pool 2, dropout 0.25, flatten,
linear 9216->128, relu, dropout 0.5, linear 128->10, log-softmax, NLL), Adadelta lr 1.0, data
already on the GPU (random images and labels), eager mode; 20 warm-up steps, then `steps` steps
timed with CUDA events. Prints one line per batch size: "torch eager <dtype> batch B: X images/s".
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def images_per_second(batch, steps, dtype):
    torch.manual_seed(1)
    model = Net().cuda()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    x = torch.randn(batch, 1, 28, 28, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = F.nll_loss(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return batch * steps / (start.elapsed_time(end) / 1e3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batches", default="64,512,4096")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()
    # fp32 means fp32: no TF32 in matrix products or convolutions (umtrain's fp32 uses none).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    for batch in (int(b) for b in args.batches.split(",")):
        rate = images_per_second(batch, args.steps, args.dtype)
        print(f"torch eager {args.dtype} batch {batch}: {rate:.0f} images/s", flush=True)


if __name__ == "__main__":
    main()
