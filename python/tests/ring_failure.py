"""A rank that fails leaves no other rank hanging (run by CTest on 2 ranks, not under pytest: the ranks
take different paths). Rank 1 passes a shard of the wrong length and raises ValueError at once; rank 0
waits at its first exchange for at most `timeout` and raises too, naming the step and the peer."""

import sys
import time

import numpy as np
from mpi4py import MPI

import ringattn

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
rng = np.random.default_rng(rank)
rows = 8 if rank == 0 else 5  # rank 1's shard is 3 rows short of the layout's 8
q = rng.standard_normal((1, rows, 2, 16)).astype(np.float32)
start = time.monotonic()
try:
    ringattn.ring_attention(q, q[:, :, :1], q[:, :, :1], comm=comm, layout="contiguous", global_q_len=16,
                            global_kv_len=16, timeout=2.0)
    print(f"rank {rank}: no error raised", flush=True)
    sys.exit(1)
except ValueError as e:
    took = time.monotonic() - start
    print(f"rank {rank}: ValueError after {took:.1f} s: {e}", flush=True)
    named = "rows (dimension 1) on rank 1" in str(e) if rank == 1 else "ring step 0" in str(e)
    sys.exit(0 if took < 30 and named else 1)
