"""What the Python layer costs over the C++ core, side by side in one run: ringattn.attention and
attention_backward on numpy arrays against `ringattn bench --backward` at the same shape (one
process, host, flash_attn2), medians of --iters calls each. With --cuda: ringattn.torch.attention on
PyTorch CUDA tensors (bf16), forward and forward + backward through autograd, timed with CUDA events,
against `ringattn bench --backend cuda --backward` at the same shape.

Usage: PYTHONPATH=build/python python3 bench/python_overhead.py build/bin/ringattn [--seq T] [--iters N]
       [--cuda --heads 32 --head-dim 128]
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


def cuda_median_ms(fn, iters, before=lambda: None):
    """Median device time of fn() between two CUDA events. What fn returns is released after the end
    event, and before() runs before the start one, as `ringattn bench` releases a call's outputs outside
    its timed region (each device free waits for the device)."""
    import torch

    fn()  # warm-up
    times = []
    for _ in range(iters):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        kept = fn()
        end.record()
        end.synchronize()
        del kept
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def cpp_rows(args):
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    # The table's rows: pass, time_ms, TFLOP/s (the line on peak memory after it names "backward" too).
    rows = re.finditer(r"\s(forward|backward|forward\+backward)\s+([0-9.]+)\s+[0-9.]+\s", out)
    return {m.group(1): float(m.group(2)) for m in rows}


def cuda_main(a):
    import torch

    import ringattn.torch as rt

    B, T, H, D = 1, a.seq, a.heads, a.head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def step():  # a training step's attention: forward, then backward through autograd
        o, lse = rt.attention(*leaves, causal=a.causal, return_lse=True)
        o.backward(do)
        return o, lse

    def clear_grads():
        for x in leaves:
            x.grad = None

    o, lse = ringattn.attention(q, k, v, causal=bool(a.causal), return_lse=True)
    cmd = [a.ringattn, "bench", "--backend", "cuda", "--backward", "--impl", "flash_attn2", "--seq", str(T),
           "--heads", str(H), "--head-dim", str(D), "--dtype", "bf16", "--iters", str(a.iters), "--warmup", "2"]
    cmd += ["--causal"] if a.causal else []
    print(f"B={B} T={T} H={H} D={D} bf16 causal={int(a.causal)}, flash_attn2 on one GPU, median of {a.iters} "
          "(round 1 Python first, round 2 C++ first):")
    for i in (1, 2):
        rows = cpp_rows(cmd) if i == 2 else None
        fwd = cuda_median_ms(lambda: rt.attention(q, k, v, causal=a.causal, return_lse=True), a.iters)
        # The backward alone through the framework-neutral core (no torch.library, no autograd).
        core_bwd = cuda_median_ms(lambda: ringattn.attention_backward(q, k, v, o, lse, do, causal=bool(a.causal)),
                                  a.iters)
        both = cuda_median_ms(step, a.iters, clear_grads)
        # As a training loop runs it: the outputs released and the gradients added into .grad inside the timing.
        loop = cuda_median_ms(lambda: rt.attention(*leaves, causal=a.causal).backward(do), a.iters)
        rows = rows or cpp_rows(cmd)
        print(f"  round {i} forward:          Python {fwd:8.3f} ms, C++ {rows['forward']:8.3f} ms, "
              f"ratio {fwd / rows['forward']:.3f}")
        print(f"  round {i} backward (core):  Python {core_bwd:8.3f} ms, C++ {rows['backward']:8.3f} ms, "
              f"ratio {core_bwd / rows['backward']:.3f}")
        print(f"  round {i} forward+backward: Python {both:8.3f} ms, C++ {rows['forward+backward']:8.3f} ms, "
              f"ratio {both / rows['forward+backward']:.3f}; as a training loop (frees and .grad sums timed) "
              f"{loop:8.3f} ms, ratio {loop / rows['forward+backward']:.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ringattn")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--causal", type=int, default=1)
    a = parser.parse_args()
    if a.cuda:
        return cuda_main(a)
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
