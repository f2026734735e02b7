"""What ringattn.torch's naming of masks saves a model: `layers` attention calls (forward and backward) sharing one
boolean mask of documents, as a Transformers model's layers share its mask, against the same calls with the mask's
version bumped (torch.autograd.graph.increment_version, no kernel: a new name) before each layer (a summary a layer,
its forward's and backward's) and before each call (a summary a call, as before masks were named). One GPU,
CUDA events, the median of --runs steps.
  python3 bench/torch_named_mask.py [--seq 32768] [--heads 16] [--head-dim 128] [--documents 16] [--layers 8]"""

import argparse
import statistics

import torch

import ringattn.torch as rt


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    a = parser.parse_args()
    gpu = torch.device("cuda")
    T, H, D = a.seq, a.heads, a.head_dim
    g = torch.Generator(device=gpu).manual_seed(0)
    q, k, v, do = (torch.randn(1, T, H, D, device=gpu, dtype=torch.bfloat16, generator=g) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    document = torch.arange(T, device=gpu) * a.documents // T
    mask = (document[:, None] == document[None, :])[None, None]

    def step(renamed):
        for _ in range(a.layers):
            if renamed != "never":
                torch.autograd.graph.increment_version(mask)
            o = rt.attention(q, k, v, mask=mask)
            if renamed == "each call":
                torch.autograd.graph.increment_version(mask)
            q.grad = k.grad = v.grad = None  # (not summed over the layers: each step's adds the same in every mode)
            o.backward(do)

    results = {}
    modes = ("never", "each layer", "each call")
    for renamed in modes * 2:  # interleaved
        step(renamed)  # warm-up (and the shared mask's summary)
        times = []
        for _ in range(a.runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(renamed)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        results.setdefault(renamed, []).append(statistics.median(times))
    pairs = T * T / a.documents
    flops = a.layers * 3.5 * 4 * H * pairs * D  # forward + backward (2.5x), as `ringattn bench`
    for renamed in modes:
        ms = min(results[renamed])
        print(f"mask renamed {renamed:10s} layers={a.layers} T={T} H={H} D={D} documents={a.documents} step_ms={ms:8.3f} "
              f"TFLOP/s={flops / ms / 1e9:7.1f}")


if __name__ == "__main__":
    main()
