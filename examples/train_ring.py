"""Training with ring attention over the sequence, on CPU ranks under mpirun or torchrun, or on GPUs
under mpirun (one GPU per rank, or ranks sharing one) or torchrun (one GPU per rank):

    mpirun -np 2 python examples/train_ring.py [--steps 200] [--seq 96] [--csv losses.csv] [--png losses.png]
    torchrun --nproc-per-node 2 examples/train_ring.py ...     (torch.distributed's gloo group)
    mpirun -np 2 python examples/train_ring.py --device cuda --dtype bf16 --seq 2048 --dim 256 --lr 1.0 --tolerance 5e-2
    torchrun --nproc-per-node 2 examples/train_ring.py --device cuda ...   (the group carries an NCCL
                                                                          communicator's unique id once)

A small causal transformer block (attention + MLP, pre-norm) learns to imitate a fixed random teacher
block on random sequences. Every rank holds the same parameters and its zigzag shard of each sequence;
attention runs through ringattn.torch.ring_attention, the other layers act per token, and the parameters'
gradients are summed over the ranks (each rank's loss is its share of the global mean) by mpi4py or
torch.distributed. With --dtype bf16 / f16 the parameters stay float32 and attention runs on q, k, v cast
to that dtype (mixed precision), the reference SDPA too. Rank 0 also
trains the same model on the whole sequence with F.scaled_dot_product_attention in one process and
checks that the two loss curves agree (exit 1 if they differ by more than --tolerance, relative).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ringattn
import ringattn.torch as rt


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x, attend):
        B, T, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, dim // self.heads).unbind(2)
        x = x + self.out(attend(q, k, v).reshape(B, T, dim))
        return x + self.mlp(self.norm2(x))


def sdpa(q, k, v):
    """One process's causal attention on (B, T, H, D): PyTorch's SDPA."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True).transpose(1, 2)


def in_dtype(attend, dtype):
    """attend on q, k, v cast to dtype, its output back in float32 (mixed precision)."""
    if dtype == torch.float32:
        return attend
    return lambda q, k, v: attend(q.to(dtype), k.to(dtype), v.to(dtype)).float()


def train(model, batches, attend, rows, total_rows, comm, steps, lr):
    """Losses per step of SGD on the mean squared error over every rank's rows (`rows` picks this rank's)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = batches[step % len(batches)]
        x, y = x[:, rows], y[:, rows]
        optimizer.zero_grad()
        local = F.mse_loss(model(x, attend), y, reduction="sum") / total_rows
        local.backward()
        loss = local.detach().clone()
        if comm is not None:  # data are split over the ranks: sum the loss and the gradients
            for tensor in [p.grad for p in model.parameters()] + [loss]:
                comm.sum(tensor)
        loss = loss.item()
        optimizer.step()
        losses.append(loss)
    return losses


class Launcher:
    """The ranks as mpirun (mpi4py) or torchrun (torch.distributed: gloo, and NCCL for CUDA tensors) made them."""

    def __init__(self, device_type):
        if "TORCHELASTIC_RUN_ID" in os.environ:
            if device_type == "cuda":
                torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            dist.init_process_group("cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo")
            self.rank, self.size, self.ring = dist.get_rank(), dist.get_world_size(), {}
        else:
            from mpi4py import MPI

            self.mpi = MPI
            self.rank, self.size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
            self.ring = {"comm": MPI.COMM_WORLD}

    def close(self):
        """Ends torchrun's process group on every rank once the ring's collectives are done. Without it a
        rank may exit while a gloo worker thread still drops its last all_reduce's tensors, which needs the
        interpreter that is shutting down: the process aborts ("terminate called without an active
        exception"). The barrier lets those workers finish; destroying the group joins them."""
        if "comm" not in self.ring:
            dist.barrier()
            dist.destroy_process_group()
            # A gloo worker may still be releasing the barrier's work (which holds the last all_reduce's
            # tensors) when this returns; that release needs the interpreter, so give it the GIL before
            # the interpreter's shutdown begins (PyTorch's hazard: pytorch/pytorch#179291, abandoned).
            time.sleep(0.2)

    def sum(self, tensor):
        if "comm" in self.ring:  # through host memory: Open MPI need not be CUDA-aware
            host = tensor.cpu()
            self.ring["comm"].Allreduce(self.mpi.IN_PLACE, host.numpy(), op=self.mpi.SUM)
            tensor.copy_(host)
        else:
            dist.all_reduce(tensor)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq", type=int, default=96)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--csv", help="write step, ring loss, one-process loss here (rank 0)")
    parser.add_argument("--png", help="plot both loss curves and their relative difference here (rank 0; matplotlib)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: rank r on GPU r %% (GPUs visible) under mpirun, its local rank's under torchrun")
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"], help="attention's input dtype")
    args = parser.parse_args()
    comm = Launcher(args.device)
    rank, size = comm.rank, comm.size
    torch.set_num_threads(1)
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local % torch.cuda.device_count()) if args.device == "cuda" else torch.device("cpu")
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]

    torch.manual_seed(0)  # every rank: the same data, teacher and initial parameters
    teacher = Block(args.dim, args.heads).to(device)
    batches = []
    with torch.no_grad():
        for _ in range(8):
            x = torch.randn(args.batch, args.seq, args.dim).to(device)
            batches.append((x, teacher(x, sdpa)))
    initial = Block(args.dim, args.heads).to(device).state_dict()
    total_rows = args.batch * args.seq * args.dim

    model = Block(args.dim, args.heads).to(device)
    model.load_state_dict(initial)
    rows = ringattn.shard(torch.arange(args.seq), 0, "zigzag", rank, size).to(device)
    ring = lambda q, k, v: rt.ring_attention(q, k, v, **comm.ring, layout="zigzag", causal=True)  # noqa: E731
    ring_losses = train(model, batches, in_dtype(ring, dtype), rows, total_rows, comm, args.steps, args.lr)
    comm.close()
    if rank != 0:
        return 0

    reference = Block(args.dim, args.heads).to(device)
    reference.load_state_dict(initial)
    one_losses = train(reference, batches, in_dtype(sdpa, dtype), slice(None), total_rows, None, args.steps, args.lr)
    worst = max(abs(a - b) / abs(b) for a, b in zip(ring_losses, one_losses))
    if args.csv:
        with open(args.csv, "w") as out:
            out.write("step,ring_loss,one_process_sdpa_loss\n")
            for step, (a, b) in enumerate(zip(ring_losses, one_losses)):
                out.write(f"{step},{a:.8g},{b:.8g}\n")
    if args.png:
        plot(args.png, ring_losses, one_losses, f"{size} ranks, {args.device}, attention in {args.dtype}")
    print(f"train_ring: {size} ranks ({args.device}, attention in {args.dtype}), {args.steps} steps, loss {one_losses[0]:.5f} -> {ring_losses[-1]:.5f} "
          f"(one process with SDPA: {one_losses[-1]:.5f}); largest relative difference {worst:.2e}")
    if not one_losses[-1] < 0.5 * one_losses[0]:
        print("train_ring: the loss did not fall by half", file=sys.stderr)
        return 1
    if worst > args.tolerance:
        print(f"train_ring: the ring's losses differ from one process's by {worst:.2e} > {args.tolerance}",
              file=sys.stderr)
        return 1
    return 0


def plot(path, ring_losses, one_losses, what):
    """The two loss curves (log scale) and the ring's relative difference from one process, to a PNG."""
    try:
        import matplotlib
    except ImportError:
        sys.exit("train_ring: --png needs matplotlib (pip install matplotlib, or apt install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = range(len(ring_losses))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=[3, 1])
    top.plot(steps, one_losses, label="one process, PyTorch SDPA", linewidth=3, alpha=0.5)
    top.plot(steps, ring_losses, label="ring (ringattn.torch.ring_attention)", linewidth=1)
    top.set_yscale("log")
    top.set_ylabel("loss")
    top.set_title(f"train_ring: {what}")
    top.legend()
    # Points, not a line: steps where the two agree to the last bit (0) have no place on a log scale.
    bottom.plot(steps, [abs(a - b) / abs(b) for a, b in zip(ring_losses, one_losses)], ".", markersize=3)
    bottom.set_yscale("log")
    bottom.set_ylabel("|ring - one| / one")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
