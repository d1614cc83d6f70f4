"""NCCL's in-place all_reduce timed like `pcieipc bench` (float sum, the
nccl-tests busbw), one process per GPU through torch.distributed. Started by
scripts/bench-vs-nccl.sh with torchrun; rank 0 prints one JSON line per size:
{"size_bytes", "ip_us", "wrong"}. (torch.distributed has no out-of-place
all_reduce, so only in place is compared.)"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    min_bytes, max_bytes, factor, iters, warmup = (int(arg) for arg in sys.argv[1:6])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    size = min_bytes
    while size <= max_bytes:
        count = max(size // 4, 1)
        # Small integers: every partial sum is exact in float.
        index = torch.arange(count, device="cuda", dtype=torch.int64)
        buffer = ((index * 7 + rank * 3) % 8).to(torch.float32)
        expected = sum(((index * 7 + r * 3) % 8) for r in range(world)).to(torch.float32)
        dist.all_reduce(buffer)
        torch.cuda.synchronize()
        wrong = int((buffer != expected).sum())
        for _ in range(warmup):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        elapsed_us = (time.perf_counter() - started) / max(iters, 1) * 1e6
        total = torch.tensor([elapsed_us, float(wrong)], device="cuda", dtype=torch.float64)
        dist.all_reduce(total)
        if rank == 0:
            print(json.dumps({
                "size_bytes": count * 4,
                "ip_us": total[0].item() / world,
                "wrong": int(total[1].item()),
            }), flush=True)
        size *= factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
