"""The deterministic host ring's backward with a per-row bias, its gradient asked for or not (out= with None),
side by side in one run under mpirun: medians of 5 calls, three rounds.

Usage: mpirun -np 2 python3 bench/exact_ring_bias_without_gradient.py
"""
import time

import numpy as np
from mpi4py import MPI
import ringattn
comm = MPI.COMM_WORLD; r, n = comm.Get_rank(), comm.Get_size()
rng = np.random.default_rng(0)
T, H, D = 256, 4, 32
q, k, v, do = (rng.standard_normal((1, T, H, D)).astype(np.float32) for _ in range(4))
bias = rng.standard_normal((1, H, T, T)).astype(np.float32)
part = lambda x, a=1: ringattn.shard(x, a, "zigzag", r, n)
pb = np.ascontiguousarray(part(bias, 2))
o, lse = ringattn.ring_attention(part(q), part(k), part(v), comm=comm, return_lse=True, bias=pb, deterministic=True)
def run(with_dbias):
    out = tuple(np.empty(part(x).shape, np.float32) for x in (q, k, v)) + ((np.empty(pb.shape, np.float32) if with_dbias else None),)
    comm.Barrier(); t = time.perf_counter()
    ringattn.ring_attention_backward(part(q), part(k), part(v), o, lse, part(do), comm=comm, bias=pb, deterministic=True, out=out)
    return time.perf_counter() - t
for rnd in range(3):
    a = sorted(run(True) for _ in range(5))[2]; b = sorted(run(False) for _ in range(5))[2]
    if r == 0: print(f"round {rnd}: deterministic ring backward T={T} H={H} D={D} per-row bias, 2 ranks: with dbias {a*1e3:.1f} ms, without {b*1e3:.1f} ms, {a/b:.2f}x")
