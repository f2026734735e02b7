"""What a CUDA graph saves a short training step: the forward and backward of `--layers` attention calls in a
chain (each layer's output is the next layer's q), run eagerly and as one captured graph's replay, per
implementation, with PyTorch's SDPA (cuDNN backend) beside it the same two ways. Wall time per step, the host
synchronised only at the end of N steps: where the host's time per call exceeds the device's, the eager step is
the host's and the replay the device's.
Arguments: --seqs T,... --heads H --kv-heads Hkv --head-dim D --layers L --steps N --impls a,b (torch_sdpa: PyTorch's)"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ringattn.torch as rt
from bench_common import host_ms

parser = argparse.ArgumentParser()
parser.add_argument("--seqs", default="512,2048,8192")
parser.add_argument("--heads", type=int, default=16)
parser.add_argument("--kv-heads", type=int, default=16)
parser.add_argument("--head-dim", type=int, default=128)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--impls", default="flash_attn2,cudnn,torch_sdpa")
args = parser.parse_args()


def attend(impl, q, k, v):
    if impl != "torch_sdpa":
        return rt.attention(q, k, v, causal=True, impl=impl)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                              enable_gqa=k.shape[2] != q.shape[2]).transpose(1, 2)


for T in (int(t) for t in args.seqs.split(",")):
    shape = (1, T, args.heads, args.head_dim)
    q0 = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kv = [[torch.randn(1, T, args.kv_heads, args.head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(2)] for _ in range(args.layers)]
    for impl in args.impls.split(","):
        def step():
            x = q0
            for k, v in kv:
                x = attend(impl, x, k, v)
            x.float().square().mean().backward()

        eager = host_ms(step, args.steps)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        replay = host_ms(graph.replay, args.steps)
        print(f"T={T:6d} H={args.heads} Hkv={args.kv_heads} D={args.head_dim} layers={args.layers} {impl:12s} causal "
              f"eager {eager:8.3f} ms/step  graph replay {replay:8.3f} ms/step  ({eager / replay:5.2f}x)", flush=True)
        del graph
