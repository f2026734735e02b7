"""A model of one ring step: when does the ring hide its transfers?

At each of its N steps a rank computes attention of its T/N queries against one K/V block of T/N keys
while the next block travels over the link. With per-GPU kernel rate R (FLOP/s) and link bandwidth W
(bytes/s, one direction), per step:
    compute  c = 4 B H t^2 D f / R            t = T / N tokens per GPU, f = 1/2 causal (zigzag), else 1
    transfer x = 2 B Hkv t D e / W            K and V in e-byte elements
and the backward computes 2.5x the forward's FLOPs while dK / dV travel beside K / V in f32:
    c_bwd = 2.5 c, x_bwd = 2 B Hkv t D (e + 4) / W.
The ring takes (N - 1) max(c, x) + c (the last step has nothing in flight), so it hides every transfer
from t* = Hkv e R / (2 H f W) tokens per GPU (forward; the backward needs (e + 4) / (2.5 e) times that).

Run: /usr/bin/python3 bench/ring_model.py [--png FILE]   (matplotlib only for the PNG)
Prints t* per link and kernel, and the model against the rings measured on 2 H200 (NVLink and sockets),
with the flash kernel's one-GPU rate at each block size (it falls on small blocks).
"""
import argparse

GB = 1e9
# Links, one direction, bytes/s. NVLink: NCCL send/recv between the 2 H200 measured 2026-11-21 (device
# README); sockets: the exchange times of the issue-23 trial below (2.15-2.69 GB/s, mean taken).
LINKS = {"NVLink (H200 pair)": 300 * GB, "InfiniBand NDR (400 Gb/s)": 50 * GB, "100 GbE": 12.5 * GB,
         "TCP sockets (loopback)": 2.45 * GB}
# Kernel rates on one H200, bf16, H=32 D=128, TFLOP/s (README / bench/RESULTS.md, 2026-11-23).
KERNELS = {"flash_attn2 forward": (372.6e12, False), "cudnn forward": (550.3e12, False),
           "cudnn backward": (523.0e12, True), "flash_attn2 backward": (150.9e12, True)}
# The flash_attn2 forward's rate falls on small blocks: one H200, causal, against tokens (README table and
# RESULTS' issue-19 round, 2026-11-23), interpolated in log(tokens) for the model's curves.
FLASH_CAUSAL_BY_TOKENS = {8192: 331.1e12, 32768: 351.3e12, 131072: 372.6e12}


def flash_rate(t):
    import math
    points = sorted(FLASH_CAUSAL_BY_TOKENS.items())
    if t <= points[0][0]:
        return points[0][1]
    for (t0, r0), (t1, r1) in zip(points, points[1:]):
        if t <= t1:
            w = math.log(t / t0) / math.log(t1 / t0)
            return r0 + w * (r1 - r0)
    return points[-1][1]


# Measured on 2 H200, flash_attn2 steps, causal zigzag, H=32 D=128 bf16 (issue 23's trial): per-GPU
# TFLOP/s against global T, over NVLink and over NCCL's socket path (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1).
MEASURED = {"NVLink (H200 pair)": {16384: 298, 65536: 349, 262144: 365},
            "TCP sockets (loopback)": {16384: 18, 65536: 67, 262144: 231}}


def step_times(t, heads, kv_heads, head_dim, elem, rate, bandwidth, causal, backward):
    f = 0.5 if causal else 1.0
    compute = 4 * heads * t * t * head_dim * f / rate * (2.5 if backward else 1.0)
    transfer = 2 * kv_heads * t * head_dim * (elem + (4 if backward else 0)) / bandwidth
    return compute, transfer


def per_gpu_rate(T, n, rate, bandwidth, heads=32, kv_heads=32, head_dim=128, elem=2, causal=True, backward=False):
    """Predicted per-GPU TFLOP/s of a ring of n GPUs over a sequence of T tokens."""
    t = T / n
    c, x = step_times(t, heads, kv_heads, head_dim, elem, rate, bandwidth, causal, backward)
    seconds = (n - 1) * max(c, x) + c
    return n * c / seconds * rate / 1e12  # the ring's FLOPs are n steps of c at `rate`


def hiding_tokens(rate, bandwidth, heads=32, kv_heads=32, elem=2, causal=True, backward=False):
    """Smallest tokens per GPU at which a step's compute covers its transfer."""
    f = 0.5 if causal else 1.0
    t = kv_heads * elem * rate / (2 * heads * f * bandwidth)
    return t * (elem + 4) / (2.5 * elem) if backward else t


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", help="plot predicted and measured per-GPU TFLOP/s to this file")
    args = parser.parse_args()
    print("tokens per GPU from which the ring hides every transfer (H = Hkv = 32, D = 128, bf16, causal zigzag):")
    print(f"{'link':28s}" + "".join(f"{k:>23s}" for k in KERNELS))
    for link, bandwidth in LINKS.items():
        cells = "".join(f"{hiding_tokens(rate, bandwidth, backward=bwd):23,.0f}" for rate, bwd in KERNELS.values())
        print(f"{link:28s}{cells}")
    print("\nthe model against the measured 2-GPU ring (flash_attn2 forward steps, causal, per-GPU TFLOP/s):")
    for link, points in MEASURED.items():
        for T, measured in points.items():
            predicted = per_gpu_rate(T, 2, flash_rate(T / 2), LINKS[link])
            print(f"  {link:24s} T={T:7d}: predicted {predicted:6.1f}, measured {measured:6.1f} "
                  f"({predicted / measured - 1:+.0%})")
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        tokens = [2 ** k for k in range(10, 21)]
        for (link, bandwidth), color in zip(LINKS.items(), ("C0", "C1", "C2", "C3")):
            ax.plot(tokens, [per_gpu_rate(2 * t, 2, flash_rate(t), bandwidth) for t in tokens], color=color, label=f"model, {link}")
            if link in MEASURED:
                points = MEASURED[link]
                ax.plot([T / 2 for T in points], list(points.values()), "o", color=color, label=f"measured, {link}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per GPU (ring of 2 H200, causal zigzag, H=32 D=128 bf16)")
        ax.set_ylabel("per-GPU TFLOP/s (flash_attn2 forward steps)")
        ax.set_title("When the ring hides its K/V transfers")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
