"""The Python package on a GPU (scripts/test-gpu.sh runs this; never part of
`make test`). Ranks share GPU 0 unless GPUS names one per rank. Runs under
pytest, or as a plain script where pytest is missing."""

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import describe, expect_success, launch  # noqa: E402

GPUS = os.environ.get("GPUS", "0,0").split(",")


def gpu_env(extra):
    return lambda rank: {"GPU": GPUS[rank % len(GPUS)], **extra}


def test_cuda_collectives_gpu_handoff(tmp_path):
    outcomes = expect_success(launch(tmp_path, "cuda_collectives", len(GPUS), timeout=500, env_of_rank=gpu_env({"PCIEIPC_HANDOFF": "gpu"})))
    for outcome in outcomes:
        assert outcome.result["mismatches"] == [], outcome.result
        assert outcome.result["hands_off_on_gpu"] is True
        assert outcome.result["checked"] == 7 * (20 + len(GPUS) + 2) + 4
        # The GPU hand-off's kernels: one-shot for the small calls, two-shot above.
        assert outcome.result["all_reduce_algorithms"] == ["direct", "one-shot"], outcome.result
    print(json.dumps(outcomes[0].result))


def test_cuda_collectives_host_handoff(tmp_path):
    outcomes = expect_success(launch(tmp_path, "cuda_collectives", len(GPUS), timeout=500, env_of_rank=gpu_env({"PCIEIPC_HANDOFF": "host"})))
    for outcome in outcomes:
        assert outcome.result["mismatches"] == [], outcome.result
        assert outcome.result["hands_off_on_gpu"] is False
        assert outcome.result["checked"] == 7 * (20 + len(GPUS) + 2) + 4
        # The engine's host hand-off ran them (no host copies in Python):
        # one-shot for the small calls, the ring above.
        assert outcome.result["all_reduce_algorithms"] == ["one-shot", "ring"], outcome.result
    print(json.dumps(outcomes[0].result))


def test_cuda_ddp_equals_gloo(tmp_path):
    outcomes = expect_success(launch(tmp_path, "cuda_ddp", len(GPUS), timeout=500, env_of_rank=gpu_env({"PCIEIPC_HANDOFF": "gpu"})))
    for outcome in outcomes:
        assert outcome.result["equal"], describe(outcomes)
    print("median step ms:", json.dumps(outcomes[0].result["median_step_ms"]))


if __name__ == "__main__":
    failed = 0
    for name, test in sorted(globals().items()):
        if name.startswith("test_"):
            with tempfile.TemporaryDirectory() as directory:
                try:
                    test(Path(directory))
                    print(f"PASSED {name}")
                except BaseException as error:  # report every test, then fail
                    failed += 1
                    print(f"FAILED {name}: {error}")
    sys.exit(1 if failed else 0)
