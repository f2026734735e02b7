"""A Hugging Face Transformers model's training step (forward + backward) with attn_implementation="ringattn"
beside "sdpa" (PyTorch's SDPA, the models' default), side by side in one run on one GPU: a Llama-shaped model
of random weights (no download), bf16, one row of T tokens, as one sequence (causal) and as packed documents
(position_ids restarting: SDPA then takes Transformers' dense T x T mask, ringattn segment ids). Checks first
that both give the same logits and gradients (bf16's rounding), then times each step with CUDA events,
median of --iters after a warm-up; prints one line a case and implementation.

Usage: PYTHONPATH=build/python python3 bench/hf_train_step.py [--seq 16384] [--layers 2] [--iters 10]
"""

import argparse
import torch
import transformers

import ringattn.hf

import bench_common
from python_overhead import median_ms as host_median_ms


def model_of(a, implementation):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=a.heads * a.head_dim, intermediate_size=4 * 1024,
                                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                      num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                                      max_position_embeddings=a.seq, attn_implementation=implementation)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32  # (cpu: a quick check of the script)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).to(a.device)


def step_of(model, inputs):
    def step():
        model.zero_grad(set_to_none=True)
        out = model(**inputs, use_cache=False)
        out.loss.backward()
        return out.loss.detach()
    return step


def median_ms(fn, iters, device):
    """CUDA events' median on a GPU; wall-clock on the host (the script's quick check)."""
    return bench_common.median_ms(fn, iters) if device == "cuda" else host_median_ms(fn, iters)


def peak_gib(fn, device):
    if device != "cuda":
        return float("nan")
    torch.cuda.reset_peak_memory_stats()
    fn()
    return torch.cuda.max_memory_allocated() / 2**30


def relative_error(got, want):
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-30))


def parser():
    """The model's and the run's options (bench/hf_step_profile.py takes them too)."""
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=16384)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--documents", type=int, default=16, help="packed documents of random lengths in the second case")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", default="cuda")
    return p


def main():
    a = parser().parse_args()
    ringattn.hf.register()  # impl "auto": cudnn where it can, flash_attn2 for the rest (packed documents)
    ringattn.hf.register("ringattn_own_kernels", impl="flash_attn2")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 32000, (1, a.seq), generator=g).to(a.device)
    cuts = torch.sort(torch.randperm(a.seq - 1, generator=g)[:a.documents - 1] + 1).values.tolist()
    lengths = [b - e for e, b in zip([0] + cuts, cuts + [a.seq])]
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(a.device)
    cases = {"one sequence": dict(input_ids=ids, labels=ids),
             "%d packed documents" % a.documents: dict(input_ids=ids, labels=ids, position_ids=positions)}
    models = {name: model_of(a, name) for name in ("sdpa", "ringattn", "ringattn_own_kernels")}
    name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print("# %s, torch %s, transformers %s, bf16, B=1, T=%d, %d layers, H=%d, Hkv=%d, D=%d" %
          (name, torch.__version__, transformers.__version__, a.seq, a.layers, a.heads,
           a.kv_heads, a.head_dim))
    for case, inputs in cases.items():
        grads = {}
        for name, model in models.items():
            step_of(model, inputs)()
            grads[name] = [q.grad.clone() for q in model.parameters()]
        times = {name: median_ms(step_of(model, inputs), a.iters, a.device) for name, model in models.items()}
        peaks = {name: peak_gib(step_of(model, inputs), a.device) for name, model in models.items()}
        for name in ("ringattn", "ringattn_own_kernels"):
            worst = max(relative_error(x, y) for x, y in zip(grads[name], grads["sdpa"]))
            print("%s: step ms sdpa %.2f %s %.2f (%.3fx); peak GiB sdpa %.2f %s %.2f; gradients' largest relative "
                  "difference to sdpa's %.3g" % (case, times["sdpa"], name, times[name], times["sdpa"] / times[name],
                                                 peaks["sdpa"], name, peaks[name], worst))


if __name__ == "__main__":
    main()
