"""The multi-process halves of the tests: `python scenarios.py NAME` runs as one
rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT set by conftest.launch) and writes
its findings to SCENARIO_RESULT as JSON; the test asserts on them."""

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import pcieipc
import pcieipc.torch as pcieipc_torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "product": dist.ReduceOp.PRODUCT,
}


def report(result: dict) -> None:
    Path(os.environ["SCENARIO_RESULT"]).write_text(json.dumps(result))


def init(backend: str = "pcieipc") -> None:
    dist.init_process_group(backend, timeout=timedelta(seconds=30))


def values(rank: int, count: int, dtype, op: str) -> torch.Tensor:
    """Small integers, different on every rank, whose sums and products are
    exact in every dtype (so the order of reduction cannot matter)."""
    generator = torch.Generator().manual_seed(7919 * rank + count)
    high = 3 if op == "product" else 9
    low = 1 if op in ("product", "avg") else 0
    return torch.randint(low, high, (count,), generator=generator).to(dtype)


def reference_all_reduce(tensor: torch.Tensor, op: str, gloo) -> torch.Tensor:
    """Gloo's result; Gloo has no AVG, so avg is Gloo's sum divided by N
    (truncating for integers, as the engine does)."""
    result = tensor.clone()
    if op == "avg":
        dist.all_reduce(result, op=dist.ReduceOp.SUM, group=gloo)
        if result.is_floating_point():
            return result / WORLD
        return torch.div(result, WORLD, rounding_mode="trunc")
    dist.all_reduce(result, op=OPS[op], group=gloo)
    return result


def collectives() -> None:
    """Every collective and dtype through the pcieipc default group, against
    a Gloo group of the same ranks."""
    init()
    gloo = dist.new_group(backend="gloo")
    checked = []
    mismatches = []

    def check(name, got, expected):
        checked.append(name)
        if not torch.equal(got, expected):
            mismatches.append(f"{name}: got {got.tolist()[:8]}, expected {expected.tolist()[:8]}")

    for dtype in DTYPES:
        for op in OPS:
            for count in (1, 37, 4099):
                mine = values(RANK, count, dtype, op)
                expected = reference_all_reduce(mine, op, gloo)
                got = mine.clone()
                dist.all_reduce(got, op=OPS[op])
                check(f"all_reduce {dtype} {op} {count}", got, expected)
        count = 1000
        for root in range(WORLD):
            mine = values(RANK, count, dtype, "sum")
            got, expected = mine.clone(), mine.clone()
            dist.broadcast(got, src=root)
            dist.broadcast(expected, src=root, group=gloo)
            check(f"broadcast {dtype} root {root}", got, expected)
        mine = values(RANK, count, dtype, "sum")
        got = torch.empty(WORLD * count, dtype=dtype)
        expected = torch.empty(WORLD * count, dtype=dtype)
        dist.all_gather_into_tensor(got, mine)
        dist.all_gather_into_tensor(expected, mine, group=gloo)
        check(f"all_gather_into_tensor {dtype}", got, expected)
        got_list = [torch.empty(count, dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(got_list, mine)
        check(f"all_gather {dtype}", torch.cat(got_list), expected)
        # In place: this rank's part of the output is the input.
        inplace = torch.zeros(WORLD * count, dtype=dtype)
        inplace[RANK * count : (RANK + 1) * count] = mine
        dist.all_gather_into_tensor(inplace, inplace[RANK * count : (RANK + 1) * count])
        check(f"all_gather_into_tensor in place {dtype}", inplace, expected)
        for op in ("sum", "max"):
            mine = values(RANK, WORLD * count, dtype, op)
            got = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(got, mine, op=OPS[op])
            reduced = reference_all_reduce(mine, op, gloo)
            expected = reduced[RANK * count : (RANK + 1) * count]
            check(f"reduce_scatter_tensor {dtype} {op}", got, expected)
            got = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(got, list(mine.chunk(WORLD)), op=OPS[op])
            check(f"reduce_scatter {dtype} {op}", got, expected)
    # async_op: the Work completes with the result.
    tensors = [values(RANK, 5000, torch.float32, "sum") for _ in range(4)]
    expected = [reference_all_reduce(t, "sum", gloo) for t in tensors]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for index, (work, tensor, want) in enumerate(zip(works, tensors, expected)):
        work.wait()
        check(f"async all_reduce {index}", tensor, want)
    futures_done = all(work.is_completed() for work in works)
    # reduce / gather / scatter, built on the collectives above.
    mine = values(RANK, 64, torch.int64, "sum")
    reduced = reference_all_reduce(mine, "sum", gloo)
    got = mine.clone()
    dist.reduce(got, dst=0)
    check("reduce", got, reduced if RANK == 0 else mine)
    gathered = [torch.empty(64, dtype=torch.int64) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(mine, gathered, dst=0)
    if RANK == 0:
        check("gather", torch.cat(gathered), torch.cat([values(r, 64, torch.int64, "sum") for r in range(WORLD)]))
    received = torch.empty(64, dtype=torch.int64)
    dist.scatter(received, [values(r, 64, torch.int64, "sum") for r in range(WORLD)] if RANK == 0 else None, src=0)
    check("scatter", received, values(RANK, 64, torch.int64, "sum"))
    dist.barrier()
    # What the backend refuses, and how.
    refusals = {}
    for name, call in {
        "int8": lambda: dist.all_reduce(torch.zeros(4, dtype=torch.int8)),
        "band": lambda: dist.all_reduce(torch.zeros(4, dtype=torch.int32), op=dist.ReduceOp.BAND),
        "send": lambda: dist.send(torch.zeros(4), dst=(RANK + 1) % WORLD),
        "non-contiguous": lambda: dist.all_reduce(torch.zeros(4, 4).t()),
    }.items():
        try:
            call()
            refusals[name] = None
        except Exception as error:  # the test asserts on the kind and message
            refusals[name] = [type(error).__name__, str(error)]
    # Still usable after the refusals.
    after = values(RANK, 10, torch.float32, "sum")
    want = reference_all_reduce(after, "sum", gloo)
    dist.all_reduce(after)
    check("all_reduce after refusals", after, want)
    report(
        {
            "checked": len(checked),
            "mismatches": mismatches,
            "futures_done": futures_done,
            "refusals": refusals,
            "backend": dist.get_backend(),
        }
    )
    dist.destroy_process_group()


class DlpackOnly:
    """Hands an array out through __dlpack__ alone, as exporters without the
    buffer protocol (JAX, CuPy) do; numpy marks its read-only arrays so."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class ForgedDlpack:
    """An exporter that lies about its shape: a DLPack tensor (the first
    ABI) over 16 bytes whose extents say otherwise."""

    def __init__(self, shape):
        import ctypes

        class Device(ctypes.Structure):
            _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

        class DataType(ctypes.Structure):
            _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

        class Tensor(ctypes.Structure):
            _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int32),
                        ("dtype", DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

        class Managed(ctypes.Structure):
            _fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

        self.memory = (ctypes.c_float * 4)()
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        float32 = DataType(2, 32, 1)
        tensor = Tensor(ctypes.addressof(self.memory), Device(1, 0), len(shape), float32, self.shape, None, 0)
        self.managed = Managed(tensor, None, None)
        self.capsule_new = ctypes.pythonapi.PyCapsule_New
        self.capsule_new.restype = ctypes.py_object
        self.capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.address = ctypes.addressof(self.managed)

    def __dlpack__(self, stream=None):
        return self.capsule_new(self.address, b"dltensor", None)


def host_communicator() -> None:
    """The bare communicator on numpy arrays and buffers, no torch groups."""
    import numpy as np

    secret = os.environ["SECRET"]
    name = os.environ["RENDEZVOUS"]
    findings = {}
    with pcieipc.Communicator(name, RANK, WORLD, secret=secret) as comm:
        data = np.arange(1000, dtype=np.float64) * (RANK + 1)
        out = np.empty_like(data)
        comm.all_reduce(data, out)
        findings["sum_ok"] = bool(np.array_equal(out, np.arange(1000) * sum(r + 1 for r in range(WORLD))))
        findings["input_untouched"] = bool(np.array_equal(data, np.arange(1000, dtype=np.float64) * (RANK + 1)))
        raw = bytearray([RANK + 1] * 16)
        comm.all_reduce(raw, op="max")
        findings["bytearray_max"] = list(raw) == [WORLD] * 16
        view = np.zeros(WORLD * 3, dtype=np.int32)
        comm.all_gather(np.full(3, RANK, dtype=np.int32), view)
        findings["all_gather"] = view.tolist() == [r for r in range(WORLD) for _ in range(3)]
        errors = {}
        for label, call in {
            "length": lambda: comm.all_reduce(np.zeros(3, np.float32), np.zeros(4, np.float32)),
            "types": lambda: comm.all_reduce(np.zeros(3, np.float32), np.zeros(3, np.float64)),
            "overlap": lambda: comm.all_reduce(data[:10], data[5:15]),
            "op": lambda: comm.all_reduce(data, op="xor"),
            "int8": lambda: comm.all_reduce(np.zeros(3, np.int8)),
            "readonly": lambda: comm.all_reduce(np.zeros(3, np.float32), bytes(12)),
            "strided": lambda: comm.all_reduce(np.zeros((4, 4), np.float32)[:, 0]),
            "root": lambda: comm.broadcast(np.zeros(3, np.float32), root=WORLD),
            "dlpack_readonly_output": lambda: comm.all_reduce(
                np.zeros(4, np.float32), DlpackOnly(np.frombuffer(bytes(16), np.float32))
            ),
            "dlpack_negative_shape": lambda: comm.all_reduce(ForgedDlpack([-1, -1])),
            "dlpack_overflowing_shape": lambda: comm.all_reduce(ForgedDlpack([2**62, 2**62])),
        }.items():
            try:
                call()
                errors[label] = None
            except Exception as error:
                errors[label] = [type(error).__name__, isinstance(error, pcieipc.InvalidArgument), str(error)]
        findings["errors"] = errors
        # A read-only array is a fine input through DLPack (numpy flags it in DLPack 1.x).
        readonly = np.frombuffer(np.full(4, RANK + 1, np.float32).tobytes(), np.float32)
        out4 = np.empty(4, np.float32)
        comm.all_reduce(DlpackOnly(readonly), out4)
        findings["dlpack_readonly_input"] = out4.tolist() == [sum(r + 1 for r in range(WORLD))] * 4
        # Nothing was lost: the next collective still agrees on every rank.
        check = np.full(4, RANK, dtype=np.int64)
        comm.all_reduce(check)
        findings["after_errors"] = check.tolist() == [sum(range(WORLD))] * 4
    try:
        comm.barrier()
        findings["closed"] = None
    except pcieipc.Error as error:
        findings["closed"] = str(error)
    report(findings)


def mismatched() -> None:
    """Rank 1 calls with another count: every rank raises MismatchError."""
    init()
    tensor = torch.ones(100 if RANK != 1 else 101)
    try:
        dist.all_reduce(tensor)
        report({"raised": None})
    except pcieipc.Error as error:
        report({"raised": type(error).__name__, "peer": error.peer, "message": str(error)})


def secret_from_env() -> None:
    """One all_reduce of ones under a short timeout; reports the result or
    the error (the launcher's PCIEIPC_JOB_SECRET may differ between ranks)."""
    tensor = torch.ones(8)
    try:
        dist.init_process_group("pcieipc", timeout=timedelta(seconds=5))
        dist.all_reduce(tensor)
        report({"sum": tensor.tolist()})
    except pcieipc.Error as error:
        report({"raised": type(error).__name__, "message": str(error)})


def ddp() -> None:
    """The example model for 200 steps three ways in one job: DDP over a
    pcieipc group, DDP over Gloo with the pcieipc hook, DDP over Gloo."""
    import ddp_train

    init("gloo")
    results = {}
    for mode in ("gloo", "pcieipc-hook", "pcieipc-group"):
        if mode == "pcieipc-group":
            group = dist.new_group(backend="pcieipc")
            torch.manual_seed(0)
            model = ddp_train.make_model()
            model_ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
            optimizer = torch.optim.SGD(model_ddp.parameters(), lr=0.05, momentum=0.9)
            for step in range(200):
                inputs, targets = ddp_train.batch(step, RANK, torch.device("cpu"))
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(model_ddp(inputs), targets).backward()
                optimizer.step()
            parameters = [p.detach().clone() for p in model.parameters()]
        else:
            parameters, _ = ddp_train.train(mode, 200, torch.device("cpu"), log_every=0)
        results[mode] = parameters
    reference = results["gloo"]
    torch.manual_seed(0)
    initial = [p.detach() for p in ddp_train.make_model().parameters()]
    findings = {
        mode: all(torch.equal(a, b) for a, b in zip(reference, parameters))
        for mode, parameters in results.items()
    }
    findings["trained"] = any(not torch.equal(a, b) for a, b in zip(reference, initial))
    report(findings)
    dist.destroy_process_group()


def hierarchical() -> None:
    """2 simulated nodes × 2 ranks (PCIEIPC_NODE): the backend's hierarchical
    collectives and the hook's all-reduce against a flat Gloo group."""
    init()
    gloo = dist.new_group(backend="gloo")
    mismatches = []
    checked = 0
    layout = dist.distributed_c10d._get_default_group()._layout
    for dtype in DTYPES:
        for op in OPS:
            for count in (1, 1001):
                mine = values(RANK, count, dtype, op)
                expected = reference_all_reduce(mine, op, gloo)
                got = mine.clone()
                dist.all_reduce(got, op=OPS[op])
                checked += 1
                if not torch.equal(got, expected):
                    mismatches.append(f"all_reduce {dtype} {op} {count}")
    for root in range(WORLD):
        mine = values(RANK, 333, torch.float32, "sum")
        got, expected = mine.clone(), mine.clone()
        dist.broadcast(got, src=root)
        dist.broadcast(expected, src=root, group=gloo)
        checked += 1
        if not torch.equal(got, expected):
            mismatches.append(f"broadcast root {root}")
    mine = values(RANK, 100, torch.int64, "sum")
    got = torch.empty(WORLD * 100, dtype=torch.int64)
    expected = torch.empty(WORLD * 100, dtype=torch.int64)
    dist.all_gather_into_tensor(got, mine)
    dist.all_gather_into_tensor(expected, mine, group=gloo)
    checked += 1
    if not torch.equal(got, expected):
        mismatches.append("all_gather")
    mine = values(RANK, WORLD * 50, torch.float32, "sum")
    got = torch.empty(50)
    dist.reduce_scatter_tensor(got, mine)
    checked += 1
    if not torch.equal(got, reference_all_reduce(mine, "sum", gloo)[RANK * 50 : (RANK + 1) * 50]):
        mismatches.append("reduce_scatter")
    # The hook's path: a pcieipc group per node, a Gloo group per column.
    state = pcieipc_torch.HookState.create(inter_backend="gloo")
    mine = values(RANK, 1234, torch.float32, "sum")
    expected = reference_all_reduce(mine, "sum", gloo)
    pcieipc_torch.hierarchical_all_reduce(mine, state.intra, state.inter)
    checked += 1
    if not torch.equal(mine, expected):
        mismatches.append("hierarchical_all_reduce")
    report(
        {
            "checked": checked,
            "mismatches": mismatches,
            "local_size": layout.local_size,
            "intra_size": dist.get_world_size(state.intra),
            "inter_size": dist.get_world_size(state.inter),
        }
    )
    dist.destroy_process_group()


def killed() -> None:
    """Training over the pcieipc backend; the last rank kills itself at step
    50. The others must raise an error that names it, not hang."""
    import ddp_train

    init()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(ddp_train.make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    victim = WORLD - 1
    started = None
    try:
        for step in range(200):
            if step == 50:
                started = time.monotonic()
                if RANK == victim:
                    os.kill(os.getpid(), signal.SIGKILL)
            inputs, targets = ddp_train.batch(step, RANK, torch.device("cpu"))
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
            # A collective of its own after each step, straight through the backend.
            dist.all_reduce(torch.ones(1))
        report({"raised": None})
    except Exception as error:
        report(
            {
                "raised": type(error).__name__,
                "peer": getattr(error, "peer", None),
                "message": str(error),
                "seconds": time.monotonic() - started if started else None,
            }
        )
    os._exit(0)


def local_reference(count: int, dtype, op: str) -> torch.Tensor:
    """The all_reduce of every rank's `values`, computed here in 64 bits."""
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stacked = torch.stack([values(r, count, dtype, op).to(wide) for r in range(WORLD)])
    if op in ("sum", "avg"):
        result = stacked.sum(0)
        if op == "avg":
            result = result / WORLD if dtype.is_floating_point else torch.div(result, WORLD, rounding_mode="trunc")
    elif op == "product":
        result = stacked.prod(0)
    elif op == "min":
        result = stacked.min(0).values
    else:
        result = stacked.max(0).values
    return result.to(dtype)


def cuda_collectives() -> None:
    """The backend on CUDA tensors (GPU tests): every dtype and op against a
    reference computed on the host, the other collectives, async calls
    ordered on the caller's stream, and the algorithms the engine's CUDA
    communicator ran the all_reduce calls with (the backend hands it every
    CUDA tensor, on either hand-off)."""
    device = torch.device("cuda", int(os.environ.get("GPU", "0")))
    torch.cuda.set_device(device)
    init()
    group = dist.distributed_c10d._get_default_group()
    mismatches, checked, algorithms = [], 0, set()

    def check(name, got, expected):
        nonlocal checked
        checked += 1
        if not torch.equal(got.cpu(), expected.cpu()):
            mismatches.append(name)

    for dtype in DTYPES:
        for op in OPS:
            for count in (1, 37, 4099, 300_001):
                got = values(RANK, count, dtype, op).to(device)
                dist.all_reduce(got, op=OPS[op])
                algorithms.add(group._cuda.last_algorithm)
                check(f"all_reduce {dtype} {op} {count}", got, local_reference(count, dtype, op))
        for root in range(WORLD):
            got = values(RANK, 5000, dtype, "sum").to(device)
            dist.broadcast(got, src=root)
            check(f"broadcast {dtype} {root}", got, values(root, 5000, dtype, "sum"))
        gathered = torch.empty(WORLD * 5000, dtype=dtype, device=device)
        dist.all_gather_into_tensor(gathered, values(RANK, 5000, dtype, "sum").to(device))
        check(f"all_gather {dtype}", gathered, torch.cat([values(r, 5000, dtype, "sum") for r in range(WORLD)]))
        scattered = torch.empty(5000, dtype=dtype, device=device)
        dist.reduce_scatter_tensor(scattered, values(RANK, WORLD * 5000, dtype, "sum").to(device))
        check(f"reduce_scatter {dtype}", scattered, local_reference(WORLD * 5000, dtype, "sum")[RANK * 5000 : (RANK + 1) * 5000])
    # async: the result is used on the caller's stream right after wait().
    tensors = [values(RANK, 1 << 20, torch.float32, "sum").to(device) for _ in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for index, (work, tensor) in enumerate(zip(works, tensors)):
        work.wait()
        check(f"async {index}", tensor * 2, local_reference(1 << 20, torch.float32, "sum") * 2)
    report(
        {
            "checked": checked,
            "mismatches": mismatches,
            "all_reduce_algorithms": sorted(map(str, algorithms)),
            "data_path": group._cuda.data_path,
            "hands_off_on_gpu": group._cuda.hands_off_on_gpu,
        }
    )
    dist.destroy_process_group()


def cuda_ddp() -> None:
    """The example model on CUDA for 200 steps: DDP over a pcieipc group and
    over Gloo (GPU tests), parameters and step times."""
    import statistics

    import ddp_train

    device = torch.device("cuda", int(os.environ.get("GPU", "0")))
    torch.cuda.set_device(device)
    init("gloo")
    results, times = {}, {}
    for mode in ("gloo", "pcieipc-group"):
        group = dist.new_group(backend="pcieipc") if mode == "pcieipc-group" else None
        torch.manual_seed(0)
        model = ddp_train.make_model().to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        steps = []
        for step in range(200):
            inputs, targets = ddp_train.batch(step, RANK, device)
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
            optimizer.step()
            torch.cuda.synchronize(device)
            steps.append(time.perf_counter() - started)
        results[mode] = [p.detach().cpu() for p in model.parameters()]
        times[mode] = statistics.median(steps[10:]) * 1e3
    report(
        {
            "equal": all(torch.equal(a, b) for a, b in zip(results["gloo"], results["pcieipc-group"])),
            "median_step_ms": times,
        }
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    globals()[sys.argv[1]]()
