"""bench/nccl_allreduce.py, NCCL's side of scripts/bench-vs-nccl.sh, run on
Gloo under torchrun (no two GPUs here): each size's checked average, and
with --latency every timed call's time, the slowest rank's, in the lines
`pcieipc bench --latency-peer` and scripts/bench_compare.py read."""

import json
import os
import subprocess
import sys

from conftest import REPO


def run_script(*options):
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(REPO / "bench" / "nccl_allreduce.py"), *options],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    return completed


def test_each_size_is_checked_and_with_latency_each_call_is_timed():
    completed = run_script("8", "512", "8", "20", "2", "--latency", "--backend", "gloo")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    assert [row["size_bytes"] for row in rows] == [8, 64, 512]
    assert all(row["wrong"] == 0 and row["ip_us"] > 0 for row in rows), rows
    calls = [line.split() for line in lines if line.startswith("calls ")]
    assert [(call[1], call[2]) for call in calls] == [("8", "ip"), ("64", "ip"), ("512", "ip")]
    for call in calls:
        times = [float(us) for us in call[3:]]
        assert len(times) == 20 and all(us > 0 for us in times), call


def test_without_latency_no_call_is_timed_and_bad_arguments_are_refused():
    completed = run_script("8", "8", "2", "5", "0", "--backend", "gloo")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert not any(line.startswith("calls ") for line in completed.stdout.splitlines())
    refused = subprocess.run(
        [sys.executable, str(REPO / "bench" / "nccl_allreduce.py"), "64", "8", "2", "5", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode == 2 and "MIN_BYTES <= MAX_BYTES" in refused.stderr, refused.stderr
