"""examples/ddp_train.py under torchrun: the pcieipc backend and hook train
to exactly Gloo's parameters; the README's Python example runs as written."""

import os
import re
import subprocess
import sys

import torch

from conftest import REPO


def torchrun(tmp_path, backend):
    saved = tmp_path / f"{backend}.pt"
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         str(REPO / "examples" / "ddp_train.py"), "--backend", backend, "--steps", "200", "--save", str(saved)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"backend {backend} on cpu: 200 steps" in completed.stdout
    return torch.load(saved)


def test_ddp_example_under_torchrun_matches_gloo(tmp_path):
    gloo = torchrun(tmp_path, "gloo")
    for backend in ("pcieipc", "pcieipc-hook"):
        parameters = torchrun(tmp_path, backend)
        assert len(parameters) == len(gloo)
        assert all(torch.equal(a, b) for a, b in zip(parameters, gloo)), backend


def test_readme_python_example_runs_as_written(tmp_path):
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 1, "the README has one Python example"
    example = tmp_path / "example.py"
    example.write_text(blocks[0])
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(example)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    # Each rank prints its element of the sum of two ranks' ones (the two
    # ranks' lines may interleave in the one pipe).
    assert completed.stdout.count("2.0") == 2, completed.stdout
    assert completed.stdout.replace("2.0", "").split() == [], completed.stdout
