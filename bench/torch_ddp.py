"""bench/torch_ddp.py — PyTorch DDP on the MNIST example network, timed the way
`mnist_cnn --bench --gpus N` is.

    torchrun --standalone --nproc_per_node N bench/torch_ddp.py [--steps 200] [--batches 512,4096] [--dtype fp32|bf16]

The network and optimizer of bench/torch_ref.py (Adadelta lr 1.0, dropout on), wrapped in
DistributedDataParallel (NCCL, default 25 MB buckets); each rank has its own batch of the given
per-GPU size already on its GPU (random images and labels); 20 warm-up steps, then `steps` steps
timed with CUDA events on each rank, the slowest rank's time counting. Rank 0 prints one line per
batch size: "torch ddp <dtype> gpus N batch B: X images/s" (X over all GPUs).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from torch_ref import Net


def images_per_second(batch, steps, dtype, local_rank):
    torch.manual_seed(1)
    model = DistributedDataParallel(Net().cuda(), device_ids=[local_rank])
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    generator = torch.Generator(device="cuda").manual_seed(100 + dist.get_rank())
    x = torch.randn(batch, 1, 28, 28, device="cuda", generator=generator)
    y = torch.randint(0, 10, (batch,), device="cuda", generator=generator)

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
    ms = torch.tensor([start.elapsed_time(end)], device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return dist.get_world_size() * batch * steps / (ms.item() / 1e3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batches", default="512,4096")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    for batch in (int(b) for b in args.batches.split(",")):
        rate = images_per_second(batch, args.steps, args.dtype, local_rank)
        if dist.get_rank() == 0:
            print(f"torch ddp {args.dtype} gpus {dist.get_world_size()} batch {batch}: {rate:.0f} images/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
