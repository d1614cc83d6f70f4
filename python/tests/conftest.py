"""Runs a scenario of scenarios.py in N processes, as torchrun would (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and hands the test each rank's exit
status and result record. A job that outlives its timeout is killed and
fails the test: a hang is a failure, never a wait."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@dataclass
class RankOutcome:
    rank: int
    returncode: int
    output: str
    result: dict


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path: Path, scenario: str, nranks: int, timeout: float = 240, env_of_rank=None, args=()):
    port = free_port()
    processes = []
    for rank in range(nranks):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nranks),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            SCENARIO_RESULT=str(tmp_path / f"result.{rank}.json"),
            OMP_NUM_THREADS="1",
        )
        if env_of_rank:
            env.update(env_of_rank(rank))
        log = open(tmp_path / f"rank{rank}.log", "w")
        processes.append(
            (
                subprocess.Popen(
                    [sys.executable, str(HERE / "scenarios.py"), scenario, *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                ),
                log,
            )
        )
    deadline = time.monotonic() + timeout
    hung = False
    for process, _ in processes:
        try:
            process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            hung = True
    if hung:
        for process, _ in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    outcomes = []
    for rank, (process, log) in enumerate(processes):
        log.close()
        result_file = tmp_path / f"result.{rank}.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        outcomes.append(RankOutcome(rank, process.returncode, (tmp_path / f"rank{rank}.log").read_text(), result))
    if hung:
        raise AssertionError(f"{scenario} on {nranks} ranks hung past {timeout} s:\n" + describe(outcomes))
    return outcomes


def describe(outcomes) -> str:
    return "\n".join(f"--- rank {o.rank} (exit {o.returncode}):\n{o.output[-3000:]}" for o in outcomes)


def expect_success(outcomes):
    failed = [o for o in outcomes if o.returncode != 0]
    assert not failed, describe(outcomes)
    return outcomes
