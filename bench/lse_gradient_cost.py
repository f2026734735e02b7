"""What a loss that reads lse costs through ringattn.torch on one GPU, side by side in one run: forward +
backward through autograd of loss = sum(o * do) against loss = sum(o * do) + sum(lse * dlse), per
implementation (cudnn's backward takes no dlse: with it, flash_attn2's kernels run the backward), medians
of --iters calls timed with CUDA events.

Usage: PYTHONPATH=build/python python3 bench/lse_gradient_cost.py [--seq T] [--heads H] [--head-dim D] [--iters N]
(from the repository root: bench/ is on sys.path as the script's folder)
"""

import argparse

import torch

import ringattn.torch as rt
from bench_common import add_shape_arguments, median_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(parser)  # its --causal is unused: both masks run
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    T, H, D = args.seq, args.heads, args.head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    dlse = torch.randn(1, H, T, device="cuda", generator=g)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    for causal in (False, True):
        flops = 4 * T * T * H * D * 3.5 / (2 if causal else 1)  # forward (4 T^2 H D) + backward (2.5x)
        for impl in ("flash_attn2", "cudnn"):
            def step(with_lse):
                o, lse = rt.attention(*leaves, causal=causal, impl=impl, return_lse=True)
                loss = (o.float() * do.float()).sum()
                if with_lse:
                    loss = loss + (lse * dlse).sum()
                loss.backward()
                for x in leaves:
                    x.grad = None
            plain = median_ms(lambda: step(False), args.iters)
            with_lse = median_ms(lambda: step(True), args.iters)
            print(f"T={T} H={H} D={D} bf16 causal={int(causal)} {impl}: forward+backward {plain:.2f} ms "
                  f"({flops / plain / 1e9:.1f} TFLOP/s), with lse in the loss {with_lse:.2f} ms "
                  f"({flops / with_lse / 1e9:.1f} TFLOP/s), ratio {plain / with_lse:.3f}", flush=True)


if __name__ == "__main__":
    main()
