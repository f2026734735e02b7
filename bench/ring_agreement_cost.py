"""What the ring's agreement to start costs a call, side by side in one run under mpirun: the host time of a
tiny ring call (host arrays, and with --cuda CUDA arrays over the GPU ring) against one MPI all-reduce of
three int64 values through mpi4py, which is what the agreement adds to a call where no rank refuses (its
Python binding's checks are agreed in the all-reduce that compared the options before). Medians of --iters
calls, each after a barrier.

Usage: mpirun -np 2 python3 bench/ring_agreement_cost.py [--iters 500] [--cuda]
"""

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import ringattn


def median_us(fn, iters, comm):
    fn()
    times = []
    for _ in range(iters):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--cuda", action="store_true")
    a = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(rank)
    q, k, v = (rng.standard_normal((1, 8, 2, 16)).astype(np.float32) for _ in range(3))
    values = np.zeros(3, np.int64)
    rows = {
        "MPI all-reduce of 3 int64": lambda: comm.Allreduce(MPI.IN_PLACE, values, op=MPI.MIN),
        "ring_attention, host arrays (8 rows a rank, H=2, D=16)": lambda: ringattn.ring_attention(q, k, v, comm=comm),
    }
    if a.cuda:
        import torch

        torch.cuda.set_device(rank % torch.cuda.device_count())
        qc, kc, vc = (torch.from_numpy(x).cuda().to(torch.bfloat16) for x in (q, k, v))

        def cuda_call():
            ringattn.ring_attention(qc, kc, vc, comm=comm)
            torch.cuda.synchronize()

        rows["ring_attention, CUDA arrays (bf16, the GPU ring), synchronised"] = cuda_call
    for name, fn in rows.items():
        us = median_us(fn, a.iters, comm)
        if rank == 0:
            print(f"{size} ranks, {name}: median {us:.1f} us a call", flush=True)


if __name__ == "__main__":
    main()
