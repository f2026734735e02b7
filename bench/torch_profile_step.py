"""Where a training step's attention through ringattn.torch spends device time (issue 22's overhead
hunt): torch.profiler over forward + backward through autograd against the two core calls, at one shape.

Usage: PYTHONPATH=build/python python3 bench/torch_profile_step.py [--seq 32768] [--causal 1]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import ringattn
import ringattn.torch as rt
from bench_common import add_shape_arguments


def main():
    parser = argparse.ArgumentParser()
    add_shape_arguments(parser)
    a = parser.parse_args()
    q, k, v, do = (torch.randn(1, a.seq, a.heads, a.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    causal = bool(a.causal)

    def step():
        for x in leaves:
            x.grad = None
        o, lse = rt.attention(*leaves, causal=causal, return_lse=True)
        o.backward(do)

    def core():
        o, lse = ringattn.attention(q, k, v, causal=causal, return_lse=True)
        ringattn.attention_backward(q, k, v, o, lse, do, causal=causal)

    for name, fn in (("autograd step", step), ("core calls", core)):
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        print(f"==== {name}, 3 iterations")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
        kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda e: e.time_range.start)
        if kernels:
            span = (kernels[-1].time_range.end - kernels[0].time_range.start) / 1e3
            busy = sum(e.time_range.end - e.time_range.start for e in kernels) / 1e3
            print(f"{name}: device span {span:.2f} ms, busy {busy:.2f} ms, idle {span - busy:.2f} ms over 3 iterations")
            gaps = sorted(((kernels[i + 1].time_range.start - kernels[i].time_range.end) / 1e3, kernels[i].name,
                           kernels[i + 1].name) for i in range(len(kernels) - 1))[-6:]
            for gap, before, after in reversed(gaps):
                print(f"  gap {gap:7.3f} ms between {before[:50]} and {after[:50]}")


if __name__ == "__main__":
    main()
