"""What the Python layer costs over the C++ core, side by side in one run: ringattn.attention and
attention_backward on numpy arrays against `ringattn bench --backward` at the same shape (one
process, host, flash_attn2), medians of --iters calls each.

Usage: PYTHONPATH=build/python python3 bench/python_overhead.py build/bin/ringattn [--seq T] [--iters N]
"""

import argparse
import re
import statistics
import subprocess
import time

import numpy as np

import ringattn


def median_ms(fn, iters):
    fn()  # warm-up
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ringattn")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    a = parser.parse_args()
    B, T, H, D = 1, a.seq, a.heads, a.head_dim
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(4))
    o, lse = ringattn.attention(q, k, v, causal=True, return_lse=True)
    py_fwd = median_ms(lambda: ringattn.attention(q, k, v, causal=True, return_lse=True), a.iters)
    py_bwd = median_ms(lambda: ringattn.attention_backward(q, k, v, o, lse, do, causal=True), a.iters)
    out = subprocess.run([a.ringattn, "bench", "--backward", "--impl", "flash_attn2", "--seq", str(T), "--heads",
                          str(H), "--head-dim", str(D), "--causal", "--iters", str(a.iters)],
                         check=True, capture_output=True, text=True).stdout
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"\s(forward|backward)\s+([0-9.]+)\s", out)}
    print(f"B={B} T={T} H={H} D={D} f32 causal, flash_attn2 on the host, median of {a.iters}:")
    print(f"  forward:  Python {py_fwd:8.2f} ms, C++ {rows['forward']:8.2f} ms, ratio {py_fwd / rows['forward']:.3f}")
    print(f"  backward: Python {py_bwd:8.2f} ms, C++ {rows['backward']:8.2f} ms, ratio {py_bwd / rows['backward']:.3f}")


if __name__ == "__main__":
    main()
