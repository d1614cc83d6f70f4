"""NCCL's in-place all_reduce timed like `pcieipc bench` (float sum, the
nccl-tests busbw), one process per GPU through torch.distributed. Started by
scripts/bench-vs-nccl.sh with torchrun; rank 0 prints one JSON line per size:
{"size_bytes", "ip_us", "wrong"}. (torch.distributed has no out-of-place
all_reduce, so only in place is compared.)

With --latency, every timed call is also timed on its own, as `pcieipc bench
--latency` times the GPU hand-off's queued calls: by events recorded on the
stream between the calls, so queuing does not hide a slow call; each call's
time is the mean of the ranks' (as pcieipc's: the ranks' calls end together,
and each rank's events add only when its stream reached them), on the CPU the
slowest rank's; rank 0 prints them as a line
"calls SIZE ip T1 ... TN" (us), the format `pcieipc bench --latency-peer`
and scripts/bench_compare.py read. --backend gloo runs the same on the CPU
(each call timed by the clock around it), which checks this script where no
two GPUs are.

Usage: torchrun --nproc-per-node N bench/nccl_allreduce.py MIN_BYTES MAX_BYTES
       FACTOR ITERS WARMUP [--latency] [--backend nccl|gloo]"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("min_bytes", "max_bytes", "factor", "iters", "warmup"):
        parser.add_argument(name, type=int)
    parser.add_argument("--latency", action="store_true", help="time each timed call on its own")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    args = parser.parse_args()
    if args.factor < 2 or args.iters < 1 or args.warmup < 0 or not 0 < args.min_bytes <= args.max_bytes:
        parser.error("expected 0 < MIN_BYTES <= MAX_BYTES, FACTOR >= 2, ITERS >= 1, WARMUP >= 0")
    return args


def each_call_us(buffer, iters, on_gpu):
    """`iters` all_reduce calls back to back, each one's time in us (this
    rank's): on the GPU the events between the queued calls, on the CPU the
    clock around each call (gloo's calls return when done)."""
    if on_gpu:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        marks[0].record()
        for mark in marks[1:]:
            dist.all_reduce(buffer)
            mark.record()
        torch.cuda.synchronize()
        return [before.elapsed_time(after) * 1e3 for before, after in zip(marks, marks[1:])]
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        dist.all_reduce(buffer)
        times.append((time.perf_counter() - started) * 1e6)
    return times


def main():
    args = arguments()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    on_gpu = args.backend == "nccl"
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = "cuda" if on_gpu else "cpu"
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    dist.init_process_group(args.backend)
    size = args.min_bytes
    while size <= args.max_bytes:
        count = max(size // 4, 1)
        # Small integers: every partial sum is exact in float.
        index = torch.arange(count, device=device, dtype=torch.int64)
        buffer = ((index * 7 + rank * 3) % 8).to(torch.float32)
        expected = sum(((index * 7 + r * 3) % 8) for r in range(world)).to(torch.float32)
        dist.all_reduce(buffer)
        synchronize()
        wrong = int((buffer != expected).sum())
        for _ in range(args.warmup):
            dist.all_reduce(buffer)
        synchronize()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buffer)
        synchronize()
        elapsed_us = (time.perf_counter() - started) / args.iters * 1e6
        total = torch.tensor([elapsed_us, float(wrong)], device=device, dtype=torch.float64)
        dist.all_reduce(total)
        calls = None
        if args.latency:
            dist.barrier()
            times = torch.tensor(each_call_us(buffer, args.iters, on_gpu), device=device, dtype=torch.float64)
            if on_gpu:
                dist.all_reduce(times)
                times /= world
            else:
                dist.all_reduce(times, op=dist.ReduceOp.MAX)
            calls = times.tolist()
        if rank == 0:
            print(json.dumps({
                "size_bytes": count * 4,
                "ip_us": total[0].item() / world,
                "wrong": int(total[1].item()),
            }), flush=True)
            if calls is not None:
                print(f"calls {count * 4} ip " + " ".join(f"{us:.3f}" for us in calls), flush=True)
        size *= args.factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
