"""What a collective costs through each layer, side by side in one run: the
bare communicator (pcieipc.Communicator / CudaCommunicator), the
torch.distributed backend "pcieipc" (a Python ProcessGroup), and Gloo.
Microseconds per all_reduce of float32, 2 ranks, results checked.

    python python/benchmarks/call_overhead.py [--device cuda] [--rounds 15] [--calls 20]

Launches its own ranks (one process each); with --device cuda every rank
uses GPU 0 unless GPUS names one per rank (e.g. GPUS=0,1).
"""

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta

SIZES = [8, 64 << 10, 4 << 20]


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    import pcieipc
    import pcieipc.torch  # noqa: F401  registers the backend

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("GPUS", "0").split(",")[rank % len(os.environ.get("GPUS", "0").split(","))]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("pcieipc", timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    name, secret = os.environ["BENCH_RENDEZVOUS"], os.environ["BENCH_SECRET"]
    if cuda:
        bare = pcieipc.CudaCommunicator(name, rank, world, device.index, secret=secret, handoff=os.environ.get("PCIEIPC_HANDOFF", "auto"))
    else:
        bare = pcieipc.Communicator(name, rank, world, secret=secret)

    def finish():
        if cuda:
            torch.cuda.current_stream(device).synchronize()

    def bare_call(tensor):
        if cuda:
            bare.all_reduce(tensor, stream=torch.cuda.current_stream(device).cuda_stream)
        else:
            bare.all_reduce(tensor)

    layers = {
        "bare communicator": bare_call,
        "torch backend pcieipc": lambda t: dist.all_reduce(t),
        "torch backend gloo": lambda t: dist.all_reduce(t, group=gloo),
    }
    rows = []
    for size in SIZES:
        count = size // 4
        samples = {layer: [] for layer in layers}
        tensors = {layer: torch.ones(count, device=device) for layer in layers}
        for round_ in range(args.rounds + 1):
            for layer, call in layers.items():  # alternating: the machine's noise hits all alike
                tensor = tensors[layer]
                tensor.fill_(1.0)
                finish()
                dist.barrier(group=gloo)
                started = time.perf_counter()
                for _ in range(args.calls):
                    call(tensor)
                finish()
                elapsed = (time.perf_counter() - started) / args.calls
                if round_ > 0:  # the first round warms up
                    samples[layer].append(elapsed)
                # Each call sums N copies: the values grow as N**calls.
                expected = float(world) ** args.calls
                if not bool((tensor == expected).all()):
                    raise SystemExit(f"{layer}: wrong result at {size} bytes: {tensor[:2].tolist()}, expected {expected}")
        rows.append((size, {layer: statistics.median(s) * 1e6 for layer, s in samples.items()}))
    if rank == 0:
        print(
            f"device {args.device}, {world} ranks, µs per all_reduce of float32: median over {args.rounds} "
            f"rounds of {args.calls} back-to-back calls, layers alternating"
        )
        header = ["bytes"] + list(layers)
        print(" | ".join(header))
        for size, medians in rows:
            print(" | ".join([str(size)] + [f"{medians[layer]:.1f}" for layer in layers]))
    bare.close()
    dist.destroy_process_group()


def launch(args) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = dict(
        os.environ,
        WORLD_SIZE=str(args.nranks),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        BENCH_RENDEZVOUS=f"bench-{secrets.token_hex(6)}",
        BENCH_SECRET=secrets.token_hex(16),
        OMP_NUM_THREADS="1",
    )
    processes = [
        subprocess.Popen([sys.executable, __file__, "--rank-main", *sys.argv[1:]], env=dict(common, RANK=str(rank)))
        for rank in range(args.nranks)
    ]
    codes = [process.wait() for process in processes]
    return max(abs(code) for code in codes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20, help="calls per round (N**calls must stay finite)")
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
    else:
        sys.exit(launch(args))


if __name__ == "__main__":
    main()
