"""examples/ddp_train.py under torchrun: the pcieipc backend and hook train
to exactly Gloo's parameters."""

import os
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
