"""What a tensor format costs ringattn.torch.attention on a GPU, side by side in one run: a training step's
attention (forward + backward through autograd, CUDA events, median of --iters) on bshd tensors, on bhsd
tensors (PyTorch's scaled_dot_product_attention layout, contiguous in it) read as they lie, and on the same
bhsd tensors copied to bshd first (what ringattn.torch did before it read views), with PyTorch's SDPA on
the bhsd tensors beside them (its cuDNN backend for impl cudnn, FlashAttention-2 for flash_attn2).

Usage: PYTHONPATH=build/python python3 bench/qkv_format_cost.py [--seq 32768] [--heads 32] [--head-dim 128]
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.dlpack import to_dlpack

import ringattn.torch as rt
from bench_common import median_ms


def step_ms(fn, leaves, do, iters):
    """Median device time of a forward and its backward through autograd, after 2 untimed steps."""
    return median_ms(lambda: torch.autograd.grad(fn(*leaves), leaves, do), iters, warmup=2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    T, H, D = args.seq, args.heads, args.head_dim
    as_it_lies = rt._as_it_lies
    copied = lambda x: to_dlpack(x.detach().contiguous())  # noqa: E731 (the layer before it read views)
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash_attn2": SDPBackend.FLASH_ATTENTION}
    for impl in ("cudnn", "flash_attn2"):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(0)
            bhsd = [torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                    for _ in range(3)]
            bshd = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in bhsd]
            do_bhsd = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
            do_bshd = do_bhsd.transpose(1, 2).contiguous()
            ours = lambda fmt: (lambda q, k, v: rt.attention(q, k, v, causal=causal, impl=impl, qkv_format=fmt))  # noqa
            rt._as_it_lies = as_it_lies
            row = {"bshd": step_ms(ours(None), bshd, do_bshd, args.iters),
                   "bhsd as it lies": step_ms(ours("bhsd"), bhsd, do_bhsd, args.iters)}
            rt._as_it_lies = copied
            row["bhsd copied"] = step_ms(ours("bhsd"), bhsd, do_bhsd, args.iters)
            rt._as_it_lies = as_it_lies
            sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
            with sdpa_kernel(backends[impl]):
                row["torch sdpa bhsd"] = step_ms(sdpa, bhsd, do_bhsd, args.iters)
            cells = "  ".join("%s %.2f ms" % kv for kv in row.items())
            print("%s causal=%d T=%d H=%d D=%d: %s  (bhsd as it lies / copied %.3fx)" % (
                impl, causal, T, H, D, cells, row["bhsd copied"] / row["bhsd as it lies"]), flush=True)


if __name__ == "__main__":
    main()
