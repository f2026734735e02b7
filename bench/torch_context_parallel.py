"""PyTorch's `context_parallel` (DTensor ring over SDPA, all-to-all rotation) per GPU, for the side-by-side
rows of bench/RESULTS.md: bf16, B=1, (B, H, T, D) buffers sharded by `context_parallel` (its head-tail load
balancing for causal, contiguous shards otherwise), forward and backward each the median of `--iters`
CUDA-event-timed calls after 2 warm-up calls, the slowest rank's time; TFLOP/s per GPU as `ringattn bench` counts them (4 B H T^2 D for
the forward, 2.5x that for the backward, halved for causal, divided by the GPUs).

Usage: torchrun --nproc-per-node 2 bench/torch_context_parallel.py [--seqs 16384 32768]
       [--backends cudnn flash]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench_common import median_ms

try:  # where PyTorch keeps its ring's switches moved between releases
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options, set_rotate_method
except ImportError:
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def slowest_median_ms(fn, iters):
    """The median of `iters` timed calls on this rank, then the largest median over the ranks."""
    median = torch.tensor([median_ms(fn, iters, dist.barrier, warmup=2)], device="cuda")
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return median.item()


def measure(mesh, backend, seq, heads, head_dim, causal, iters):
    g = torch.Generator(device="cuda").manual_seed(0)
    _cp_options.enable_load_balance = causal  # head-tail balancing is for causal only (it refuses the rest)
    q, k, v, d_o = (torch.randn(1, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
                    for _ in range(4))
    with sdpa_kernel(BACKENDS[backend]), context_parallel(mesh, buffers=[q, k, v, d_o], buffer_seq_dims=[2] * 4):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        forward_ms = slowest_median_ms(lambda: F.scaled_dot_product_attention(*leaves, is_causal=causal), iters)
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        backward_ms = slowest_median_ms(lambda: torch.autograd.grad(out, leaves, d_o, retain_graph=True), iters)
    flops = 4 * heads * seq * seq * head_dim / (2 if causal else 1) / mesh.size()
    return forward_ms, flops / forward_ms / 1e9, backward_ms, 2.5 * flops / backward_ms / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--backends", nargs="+", default=["cudnn", "flash"], choices=sorted(BACKENDS))
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=8)
    a = parser.parse_args()
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    set_rotate_method("alltoall")
    for seq in a.seqs:
        for causal in (False, True):
            for backend in a.backends:
                fwd_ms, fwd_tf, bwd_ms, bwd_tf = measure(mesh, backend, seq, a.heads, a.head_dim, causal, a.iters)
                if dist.get_rank() == 0:
                    print(f"context_parallel_{backend:5s} gpus={mesh.size()} T={seq} H={a.heads} D={a.head_dim} "
                          f"causal={int(causal)} fwd_ms={fwd_ms:8.3f} fwd_TFLOP/s/GPU={fwd_tf:6.1f} "
                          f"bwd_ms={bwd_ms:8.3f} bwd_TFLOP/s/GPU={bwd_tf:6.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
