"""What a new shape costs each implementation of a training step's attention (forward + backward through
autograd, bf16, causal) on one GPU: cuDNN builds a graph per shape (ours and PyTorch's SDPA alike), the flash
kernels build none. For each of --lengths distinct sequence lengths, the wall time of the first call at that
length and the median of the next --iters, side by side for ringattn's cudnn and flash_attn2 and PyTorch's SDPA
cuDNN backend, each implementation on lengths it has not seen.

Usage: PYTHONPATH=build/python python3 bench/cudnn_graph_build_cost.py [--base 8192] [--lengths 6] [--heads 16]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ringattn.torch as rt


def step_seconds(fn, q, k, v, do):
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=int, default=8192)
    parser.add_argument("--lengths", type=int, default=6)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    H, D = args.heads, args.head_dim

    def ours(impl):
        return lambda q, k, v: rt.attention(q, k, v, causal=True, impl=impl, qkv_format="bhsd")

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    who = {"ringattn cudnn": ours("cudnn"), "ringattn flash_attn2": ours("flash_attn2"), "torch sdpa cudnn": sdpa}
    for index, (name, fn) in enumerate(who.items()):
        firsts, steadies = [], []
        for i in range(-1, args.lengths):  # i = -1: a warm-up length (libraries loaded, handles made)
            T = args.base + 64 * (i * len(who) + index) + 8 if i >= 0 else args.base // 2 + 8 * index  # unseen
            q, k, v = (torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            do = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16)
            first = step_seconds(fn, q, k, v, do)
            steady = statistics.median(step_seconds(fn, q, k, v, do) for _ in range(args.iters))
            if i >= 0:
                firsts.append(first * 1e3)
                steadies.append(steady * 1e3)
        print("%-21s H=%d D=%d T=%d..: first call at a new length %s ms (median %.1f); steady %.2f ms median" % (
            name, H, D, args.base, " ".join("%.1f" % t for t in firsts), statistics.median(firsts),
            statistics.median(steadies)), flush=True)


if __name__ == "__main__":
    main()
