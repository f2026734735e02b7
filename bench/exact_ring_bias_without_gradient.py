"""The deterministic host ring's backward with a per-row bias, its gradient asked for or not (out= with None),
side by side in one run under mpirun: medians of 5 calls, three rounds.

Usage: mpirun -np 2 python3 bench/exact_ring_bias_without_gradient.py
"""

import time

import numpy as np
from mpi4py import MPI

import ringattn

T, H, D = 256, 4, 32


def main():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, T, H, D)).astype(np.float32) for _ in range(4))
    bias = rng.standard_normal((1, H, T, T)).astype(np.float32)
    part = lambda x, axis=1: np.ascontiguousarray(ringattn.shard(x, axis, "zigzag", rank, size))  # noqa: E731
    q, k, v, do, bias = part(q), part(k), part(v), part(do), part(bias, 2)
    o, lse = ringattn.ring_attention(q, k, v, comm=comm, return_lse=True, bias=bias, deterministic=True)

    def backward_seconds(with_dbias):
        out = tuple(np.empty(x.shape, np.float32) for x in (q, k, v))
        out += (np.empty(bias.shape, np.float32) if with_dbias else None,)
        comm.Barrier()
        start = time.perf_counter()
        ringattn.ring_attention_backward(q, k, v, o, lse, do, comm=comm, bias=bias, deterministic=True, out=out)
        return time.perf_counter() - start

    for round_ in range(3):
        with_ms, without_ms = (1e3 * sorted(backward_seconds(w) for _ in range(5))[2] for w in (True, False))
        if rank == 0:
            print(f"round {round_}: deterministic ring backward T={T} H={H} D={D} per-row bias, {size} ranks: "
                  f"with dbias {with_ms:.1f} ms, without {without_ms:.1f} ms, {with_ms / without_ms:.2f}x")


if __name__ == "__main__":
    main()
