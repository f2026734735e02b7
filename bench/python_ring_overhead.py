"""What a ringattn.torch.ring_attention call costs from Python on GPUs, under mpirun: CUDA-event medians of
forward and of forward + backward through autograd at a tiny shape (the per-call cost: the ring, its
copy-engine window or NCCL communicator, is built by every call) and at a large one.

Usage: mpirun -np 2 python3 bench/python_ring_overhead.py [--seqs 512 32768] [--iters 10]
"""

import argparse

import torch
from mpi4py import MPI

import ringattn
import ringattn.torch as rt
from bench_common import median_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 32768])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=10)
    a = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    for T in a.seqs:
        g = torch.Generator(device="cuda").manual_seed(rank)
        q, k, v, do = (ringattn.shard(torch.randn(1, T, a.heads, a.head_dim, device="cuda", dtype=torch.bfloat16,
                                                  generator=g), 1, "zigzag", rank, size).contiguous() for _ in range(4))
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        fwd = median_ms(lambda: rt.ring_attention(q, k, v, comm=comm, causal=True), a.iters, comm.Barrier)
        both = median_ms(lambda: rt.ring_attention(*leaves, comm=comm, causal=True).backward(do), a.iters, comm.Barrier)
        if rank == 0:
            print(f"ring of {size}, T={T} H={a.heads} D={a.head_dim} bf16 causal zigzag, median of {a.iters}: "
                  f"forward {fwd:.3f} ms, forward+backward {both:.3f} ms")


if __name__ == "__main__":
    main()
