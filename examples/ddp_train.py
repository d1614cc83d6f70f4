"""Trains a small model with DistributedDataParallel under torchrun, with the
gradients reduced by pcieipc or by a backend torch ships.

    torchrun --nproc-per-node 2 examples/ddp_train.py --backend pcieipc
    torchrun --nproc-per-node 2 examples/ddp_train.py --backend gloo
    torchrun --nproc-per-node 2 examples/ddp_train.py --backend pcieipc-hook   # gloo + pcieipc's DDP hook
    torchrun --nproc-per-node 2 examples/ddp_train.py --backend nccl --device cuda

Every rank sees the same model (seeded) and its own slice of a synthetic
regression task. Rank 0 prints the loss every 50 steps and the median step
time, and with --save writes the final parameters, which are the same
whatever the backend (same seeds, float32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BACKENDS = ("pcieipc", "pcieipc-hook", "gloo", "nccl")


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))


def batch(step: int, rank: int, device: torch.device, size: int = 32):
    generator = torch.Generator().manual_seed(1_000_003 * step + rank)
    inputs = torch.randn(size, 64, generator=generator)
    targets = torch.sin(inputs[:, :8] * 2.0) + 0.1 * torch.randn(size, 8, generator=generator)
    return inputs.to(device), targets.to(device)


def train(backend: str, steps: int, device: torch.device, log_every: int = 50):
    """Runs `steps` steps of DDP training over `backend` in the current
    process group job; returns (final parameters, step times in seconds)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = make_model().to(device)
    if backend == "pcieipc-hook":
        import pcieipc.torch as pcieipc_torch

        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(pcieipc_torch.HookState.create(), pcieipc_torch.allreduce_hook)
    else:
        ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.MSELoss()
    times = []
    for step in range(steps):
        inputs, targets = batch(step, rank, device)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(inputs), targets)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
        if rank == 0 and log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.5f}", flush=True)
    return [p.detach().cpu().clone() for p in model.parameters()], times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="pcieipc")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save", help="write the final parameters here (rank 0)")
    args = parser.parse_args()

    if args.backend.startswith("pcieipc"):
        import pcieipc.torch  # noqa: F401  registers the "pcieipc" backend
    process_group_backend = "gloo" if args.backend == "pcieipc-hook" else args.backend
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(process_group_backend)
    parameters, times = train(args.backend, args.steps, device)
    if dist.get_rank() == 0:
        # The first steps include DDP's bucket set-up; the median is the steady state.
        median_ms = statistics.median(times[10:] or times) * 1e3
        print(f"backend {args.backend} on {args.device}: {args.steps} steps, median step {median_ms:.3f} ms")
        if args.save:
            torch.save(parameters, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
