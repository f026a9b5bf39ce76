"""bench/speed_table.py — the table of bench/speed.sh, from its two logs.

    python3 bench/speed_table.py --precision bf16 --gpu NAME ours.log torch.log

ours.log holds `mnist_cnn --bench` outputs, each after a line "== ours batch B"; torch.log
holds bench/torch_ref.py's lines. Prints a markdown table: images/s of umtrain and of each
PyTorch mode, our ratio to each, and the floor with our percentage of it.

The floor is what the measured GPU could not beat for this network: per image, the FLOPs of a
training step (forward, data and weight gradients of each convolution and linear layer; conv1
needs no data gradient) over the measured matrix rate, and the bytes a perfectly fused step
must move (each activation written once and read by its consumers, each activation gradient
likewise; values in the compute dtype, the input image in f32) over the measured copy bandwidth.
The larger of the two times bounds the step; its inverse is the floor in images/s. Parameters,
optimizer state and launch costs are left out (they do not grow with the batch), so the floor
is an upper bound on images/s, not a promise.
"""
import argparse
import re
import sys

# conv1 1->32 3x3 on 28x28 -> 26x26, conv2 32->64 3x3 -> 24x24, pool -> 12x12, fc1 9216->128, fc2 128->10.
CONV1_OUT, CONV2_OUT, POOL_OUT, FC1_OUT, IMAGE = 32 * 26 * 26, 64 * 24 * 24, 64 * 12 * 12, 128, 28 * 28
FORWARD_FLOPS = {
    "conv1": 2 * CONV1_OUT * 1 * 9,
    "conv2": 2 * CONV2_OUT * 32 * 9,
    "fc1": 2 * 9216 * 128,
    "fc2": 2 * 128 * 10,
}


def flops_per_image():
    # Backward: a weight gradient for every layer, a data gradient for all but conv1.
    forward = sum(FORWARD_FLOPS.values())
    return forward + forward + (forward - FORWARD_FLOPS["conv1"])


def bytes_per_image(value_bytes):
    # Forward: each activation written once and read once by the next layer (ReLU, bias, pooling
    # and dropout fused into their neighbours). Backward: the pool's gradient (written by fc1,
    # read by the pool), conv2's output gradient (written once, read by its data and weight
    # gradients), conv2's input read again for its weight gradient, conv1's output gradient
    # (written, read for its weight gradient), and the image read again.
    forward = 2 * (CONV1_OUT + CONV2_OUT + POOL_OUT + FC1_OUT)
    backward = 2 * POOL_OUT + 3 * CONV2_OUT + CONV1_OUT + 2 * CONV1_OUT
    return (forward + backward) * value_bytes + 2 * IMAGE * 4


def parse_ours(path):
    rates, batch = {}, None
    for line in open(path):
        m = re.match(r"== ours batch (\d+)", line)
        if m:
            batch = int(m.group(1))
        m = re.search(r"^bench: .*: (\d+) images/s", line)
        if m and batch is not None:
            rates[batch] = float(m.group(1))
    return rates


def parse_torch(path):
    rates, floor = {}, {}
    for line in open(path):
        m = re.match(r"torch (\S+) \S+ batch (\d+): (\d+) images/s", line)
        if m:
            rates[(m.group(1), int(m.group(2)))] = float(m.group(3))
        m = re.match(r"floor matmul \S+: ([\d.]+) TFLOP/s", line)
        if m:
            floor["tflops"] = float(m.group(1))
        m = re.match(r"floor copy: ([\d.]+) GB/s", line)
        if m:
            floor["gbps"] = float(m.group(1))
    return rates, floor


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--gpu", default="?")
    parser.add_argument("ours")
    parser.add_argument("torch")
    args = parser.parse_args()
    ours = parse_ours(args.ours)
    torch_rates, floor = parse_torch(args.torch)
    value_bytes = 4 if args.precision == "fp32" else 2
    flops, nbytes = flops_per_image(), bytes_per_image(value_bytes)
    floor_rate = None
    print(f"GPU: {args.gpu}; precision {args.precision}; data on the GPU")
    if "tflops" in floor and "gbps" in floor:
        compute_s, memory_s = flops / (floor["tflops"] * 1e12), nbytes / (floor["gbps"] * 1e9)
        floor_rate = 1.0 / max(compute_s, memory_s)
        print(f"floor: {flops / 1e6:.1f} MFLOP/image at {floor['tflops']:.0f} TFLOP/s = {1 / compute_s / 1e6:.2f}M "
              f"images/s; {nbytes / 1e3:.0f} kB/image at {floor['gbps']:.0f} GB/s = {1 / memory_s / 1e6:.2f}M images/s; "
              f"floor {floor_rate / 1e6:.2f}M images/s")
    modes = sorted({m for m, _ in torch_rates}, key=["eager", "default", "reduce-overhead"].index)
    batches = sorted(set(ours) | {b for _, b in torch_rates})
    head = ["umtrain"] + [f"torch {m}" for m in modes]
    head += [f"ours / {m}" for m in modes] + ["% of floor"]
    print("| batch | " + " | ".join(head) + " |")
    print("|---:|" + "---:|" * len(head))
    for b in batches:
        best = ours.get(b, 0)
        cells = [f"{best:,.0f}" if best else "-"]
        cells += [f"{torch_rates[(m, b)]:,.0f}" if (m, b) in torch_rates else "-" for m in modes]
        cells += [f"{best / torch_rates[(m, b)]:.2f}x" if best and (m, b) in torch_rates else "-" for m in modes]
        cells.append(f"{100 * best / floor_rate:.1f}%" if best and floor_rate else "-")
        print(f"| {b} | " + " | ".join(cells) + " |")
    return 0 if ours else 1


if __name__ == "__main__":
    sys.exit(main())
