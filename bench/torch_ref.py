"""bench/torch_ref.py — PyTorch's MNIST example network, timed the way `mnist_cnn --bench` is.

    python3 bench/torch_ref.py [--steps 200] [--batches 64,512,4096] [--dtype fp32|bf16]
                               [--modes eager,default,reduce-overhead] [--floor] [--deterministic]
                               [--tf32-default] [--device cuda|cpu] [--threads N]

Same network (conv 1->32 3x3, relu, conv 32->64 3x3, relu, max-pool 2, dropout 0.25, flatten,
linear 9216->128, relu, dropout 0.5, linear 128->10, log-softmax, NLL), Adadelta lr 1.0, data
already on the GPU (random images and labels); 20 warm-up steps, then `steps` steps timed with
CUDA events. Modes: "eager", or torch.compile with mode "default" or "reduce-overhead" (CUDA
Graphs) over the whole step (forward, backward and optimizer). Prints one line per mode and
batch size: "torch <mode> <dtype> batch B: X images/s".

--floor also measures what bounds any implementation on this GPU, in the same process: the
matrix rate (a bf16 or fp32 8192^3 product, TFLOP/s) and the copy bandwidth (a 1 GiB
device-to-device copy, bytes read + written per second). Lines: "floor matmul <dtype>: X TFLOP/s",
"floor copy: X GB/s".

--deterministic sets torch.backends.cudnn.deterministic: cuDNN then takes only algorithms whose
results do not depend on the order of atomic additions, the condition every umtrain kernel meets.

--device cpu times the same step on the CPU (fp32, eager: what bench/cpu_speed.sh compares the CPU
backend with), 20 warm-up steps, then `steps` steps timed by the wall clock, on --threads N
intra-op threads (torch.set_num_threads; default: PyTorch's own choice). Its lines add the thread count:
"torch eager fp32 cpu 2 threads batch B: X images/s".
"""
import argparse
import time

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


def make_step(model, opt, x, y, dtype):
    def step():
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = F.nll_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def images_per_second(batch, steps, dtype, mode):
    torch.manual_seed(1)
    model = Net().cuda()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    x = torch.randn(batch, 1, 28, 28, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    step = make_step(model, opt, x, y, dtype)
    if mode != "eager":
        step = torch.compile(step, mode=mode, dynamic=False)
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


def cpu_images_per_second(batch, steps):
    """The step above on the CPU, fp32 eager, timed by the wall clock (each step ends before the
    next begins: there is no queue to drain)."""
    torch.manual_seed(1)
    model = Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    step = make_step(model, opt, x, y, "fp32")
    for _ in range(20):
        step()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - began)


def timed_ms(fn, repeats):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def floor(dtype):
    size = 8192
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn(size, size, device="cuda", dtype=torch_dtype)
    b = torch.randn(size, size, device="cuda", dtype=torch_dtype)
    ms = timed_ms(lambda: torch.mm(a, b), 20)
    print(f"floor matmul {dtype}: {2 * size ** 3 / (ms / 1e3) / 1e12:.1f} TFLOP/s", flush=True)
    del a, b
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), 20)
    print(f"floor copy: {2 * src.numel() / (ms / 1e3) / 1e9:.0f} GB/s", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batches", default="64,512,4096")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--modes", default="eager")
    parser.add_argument("--floor", action="store_true")
    parser.add_argument("--tf32-default", action="store_true",
                        help="PyTorch's own TF32 settings (convolutions may use TF32, matrix products not)")
    parser.add_argument("--deterministic", action="store_true",
                        help="cuDNN's deterministic algorithms only, as umtrain's kernels always are")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.device == "cpu":
        if args.threads > 0:
            torch.set_num_threads(args.threads)
        for batch in (int(b) for b in args.batches.split(",")):
            rate = cpu_images_per_second(batch, args.steps)
            print(f"torch eager fp32 cpu {torch.get_num_threads()} threads batch {batch}: {rate:.0f} images/s",
                  flush=True)
        return
    torch.backends.cudnn.deterministic = args.deterministic
    # fp32 means fp32: no TF32 in matrix products or convolutions (umtrain's fp32 uses none),
    # unless --tf32-default leaves PyTorch's defaults (umtrain's --tf32 compares with those).
    if not args.tf32_default:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    if args.floor:
        floor(args.dtype)
    for mode in args.modes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            began = time.time()
            rate = images_per_second(batch, args.steps, args.dtype, mode)
            print(f"torch {mode} {args.dtype} batch {batch}: {rate:.0f} images/s "
                  f"(with compile {time.time() - began:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
