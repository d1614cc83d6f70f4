"""The ``torch.distributed`` backend "pcieipc" and the DDP communication hook.

Importing this module registers the backend for ``cpu`` and ``cuda`` tensors::

    import pcieipc.torch
    torch.distributed.init_process_group("pcieipc")   # under torchrun

Ranks meet through the ``Store`` torch hands the backend: rank 0 of each
node makes the rendezvous name and the job secret and publishes them there.

On more than one machine (``LOCAL_WORLD_SIZE`` below the world size, as
torchrun sets it) the backend is hierarchical: inside a node it runs over
pcieipc, between nodes over a process group torch already has (Gloo for CPU
tensors, NCCL for CUDA tensors), made from the same store. all_reduce is
reduce-scatter inside the node, all-reduce of each rank's shard across the
nodes, all-gather inside the node.

``allreduce_hook`` is the DDP communication hook for jobs whose default
process group is another backend (``HookState`` says which groups it uses).
"""

import atexit
import gc
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from . import Communicator, CudaCommunicator, InvalidArgument

__all__ = [
    "BACKEND",
    "HookState",
    "ProcessGroupPcieipc",
    "allreduce_hook",
    "hierarchical_all_reduce",
]

BACKEND = "pcieipc"

# The engine's element types, as torch names them.
SUPPORTED_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
    torch.uint8,
)

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}

# Environment knobs (docs/python.md).
TRANSPORT_ENV = "PCIEIPC_TRANSPORT"
HANDOFF_ENV = "PCIEIPC_HANDOFF"
P2P_ENV = "PCIEIPC_P2P"
HANDOFF_BLOCKS_ENV = "PCIEIPC_HANDOFF_BLOCKS"
COPY_ENGINES_FROM_ENV = "PCIEIPC_COPY_ENGINES_FROM"
COPY_CHUNK_ENV = "PCIEIPC_COPY_CHUNK"
NODE_ENV = "PCIEIPC_NODE"


def _handoff_blocks():
    """PCIEIPC_HANDOFF_BLOCKS as the CUDA communicator takes it: unset is
    None (one block a multiprocessor); the range is checked there."""
    text = os.environ.get(HANDOFF_BLOCKS_ENV)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(f"{HANDOFF_BLOCKS_ENV}={text!r}: expected a whole number of thread blocks, 1 to 64") from None


_SIZE_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _bytes_env(name, never=False):
    """A size from the environment as the CUDA communicator takes it: unset
    is None (its default); bytes with an optional K, M or G, or "never"
    where `never` allows it; the range is checked there."""
    text = os.environ.get(name)
    if text is None:
        return None
    if never and text == "never":
        return "never"
    digits, scale = text, 1
    if text[-1:].upper() in _SIZE_SUFFIXES:
        digits, scale = text[:-1], _SIZE_SUFFIXES[text[-1:].upper()]
    if not digits.isdigit():
        expected = "bytes with an optional K, M or G" + (', or "never"' if never else "")
        raise InvalidArgument(f"{name}={text!r}: expected {expected}")
    return int(digits) * scale


def _op_name(op) -> str:
    # ReduceOp arrives as the enum member or as a ReduceOp object wrapping it.
    for member, name in _OPS.items():
        if op == member:
            return name
    raise InvalidArgument(
        f"pcieipc backend: reduce op {op} is not supported (sum, avg, min, max, product)"
    )


def _check_tensor(tensor: torch.Tensor, what: str) -> torch.Tensor:
    if tensor.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        raise InvalidArgument(
            f"pcieipc backend: {what} is {tensor.dtype}; the engine reduces {names}"
        )
    if not tensor.is_contiguous():
        raise InvalidArgument(f"pcieipc backend: {what} is not contiguous")
    if tensor.device.type not in ("cpu", "cuda"):
        raise InvalidArgument(f"pcieipc backend: {what} is on {tensor.device}")
    # Tensors that require grad refuse __dlpack__; the memory is the same.
    return tensor.detach()


def _same_device(tensors, what: str) -> torch.device:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise InvalidArgument(f"pcieipc backend: {what} spans devices {sorted(map(str, devices))}")
    return devices.pop()


def _unsupported(name: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(
            f"pcieipc backend: {name} is not supported (it has all_reduce, broadcast, "
            "all_gather, reduce_scatter, reduce, gather, scatter and barrier)"
        )

    method.__name__ = name
    return method


class _Work(dist.Work):
    """A collective's handle: `wait()` raises what the collective raised
    (torch's future-wrapping Work does not), and on CUDA the caller's stream
    is already ordered after the collective when the call returns."""

    def __init__(self, future: torch.futures.Future):
        super().__init__()
        self._future = future

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self._future.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        # torch.futures.Future.set_exception stores the exception as the
        # value, which C++ consumers (DDP's reducer) take for a result; a
        # callback that raises marks the chained future failed in C++ too.
        return self._future.then(_value_or_raise)

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:
            return False
        return True

    def exception(self):
        try:
            self._future.value()
        except Exception as error:
            return error
        return None


class _OnStream:
    """A CudaCommunicator whose calls are ordered on `stream`: queued there
    on the GPU hand-off, run after its queued work on the host hand-off."""

    def __init__(self, comm: CudaCommunicator, stream: int):
        self._comm = comm
        self._stream = stream

    def all_reduce(self, input, output=None, op="sum"):
        self._comm.all_reduce(input, output, op=op, stream=self._stream)

    def reduce_scatter(self, input, output, op="sum"):
        self._comm.reduce_scatter(input, output, op=op, stream=self._stream)

    def all_gather(self, input, output):
        self._comm.all_gather(input, output, stream=self._stream)

    def broadcast(self, buffer, root=0):
        self._comm.broadcast(buffer, root=root, stream=self._stream)


def _padded(flat: torch.Tensor, ranks: int) -> torch.Tensor:
    """`flat`, or a copy with zeros after it, to split evenly among `ranks`
    (the hierarchical all_reduce's reduce-scatter)."""
    padded = (flat.numel() + ranks - 1) // ranks * ranks
    if padded == flat.numel():
        return flat
    return torch.cat([flat, flat.new_zeros(padded - flat.numel())])


def _value_or_raise(future: torch.futures.Future):
    return future.value()


@dataclass
class _Layout:
    """Where this rank sits: its node's ranks and the ranks of its column
    (same local rank on every node)."""

    rank: int
    size: int
    local_size: int

    @property
    def nodes(self) -> int:
        return self.size // self.local_size

    @property
    def node(self) -> int:
        return self.rank // self.local_size

    @property
    def local_rank(self) -> int:
        return self.rank % self.local_size


class ProcessGroupPcieipc(dist.ProcessGroup):
    """The "pcieipc" process group. Made by ``init_process_group("pcieipc")``
    or ``new_group(backend="pcieipc")``; not meant to be built directly."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._store = store
        self._timeout = timeout
        self._layout = _Layout(rank, size, _local_size(store, rank, size))
        self._transport = os.environ.get(TRANSPORT_ENV, "shm")
        seconds = max(timeout.total_seconds(), 1.0)
        name, secret = self._rendezvous("host")
        self._host = Communicator(
            name,
            self._layout.local_rank,
            self._layout.local_size,
            secret=secret,
            transport=self._transport,
            join_timeout=seconds,
            peer_timeout=seconds,
        )
        self._cuda: Optional[CudaCommunicator] = None
        # Between nodes: torch's own process groups over the same store.
        self._inter_cpu = None
        self._inter_cuda = None

    # -- torch's ProcessGroup interface -----------------------------------

    def getBackendName(self) -> str:
        return BACKEND

    def allreduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        tensors = [_check_tensor(t, "all_reduce tensor") for t in tensors]
        return self._collective(tensors, lambda c, t: self._all_reduce(c, t, op))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        tensors = [_check_tensor(t, "broadcast tensor") for t in tensors]
        return self._collective(tensors, lambda c, t: self._broadcast(c, t, root))

    def _allgather_base(self, output, input, opts=None):
        output = _check_tensor(output, "all_gather output")
        input = _check_tensor(input, "all_gather input")
        return self._collective([output, input], lambda c, t: [self._all_gather(c, t[1], t[0])])

    def allgather(self, output_lists, inputs, opts=None):
        for outputs, input in zip(output_lists, inputs):
            if len(outputs) != self._size:
                raise InvalidArgument(
                    f"pcieipc backend: all_gather needs {self._size} output tensors, got {len(outputs)}"
                )
        pairs = []
        for outputs, input in zip(output_lists, inputs):
            input = _check_tensor(input, "all_gather input")
            flat = self._one_per_rank(input)
            pairs.append((outputs, input, flat))

        def gather(comm, _):
            for outputs, input, flat in pairs:
                self._all_gather(comm, input, flat)
                for out, part in zip(outputs, flat):
                    out.copy_(part)
            return [t for outputs, _, _ in pairs for t in outputs]

        return self._collective([p[1] for p in pairs], gather)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        outputs = [_check_tensor(t, "all_gather output") for t in outputs]
        inputs = [_check_tensor(t, "all_gather input") for t in inputs]

        def gather(comm, _):
            for output, input in zip(outputs, inputs):
                self._all_gather(comm, input, output)
            return outputs

        return self._collective(outputs + inputs, gather)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        output = _check_tensor(output, "reduce_scatter output")
        input = _check_tensor(input, "reduce_scatter input")
        return self._collective([output, input], lambda c, t: [self._reduce_scatter(c, t[1], t[0], op)])

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        pairs = []
        for output, inputs in zip(outputs, input_lists):
            if len(inputs) != self._size:
                raise InvalidArgument(
                    f"pcieipc backend: reduce_scatter needs {self._size} input tensors, got {len(inputs)}"
                )
            output = _check_tensor(output, "reduce_scatter output")
            pairs.append((output, torch.stack([_check_tensor(t, "reduce_scatter input") for t in inputs])))

        def scatter(comm, _):
            for output, stacked in pairs:
                self._reduce_scatter(comm, stacked, output, op)
            return [p[0] for p in pairs]

        return self._collective([p[0] for p in pairs], scatter)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        outputs = [_check_tensor(t, "reduce_scatter output") for t in outputs]
        inputs = [_check_tensor(t, "reduce_scatter input") for t in inputs]

        def scatter(comm, _):
            for output, input in zip(outputs, inputs):
                self._reduce_scatter(comm, input, output, op)
            return outputs

        return self._collective(outputs + inputs, scatter)

    def reduce(self, tensors, opts):
        # all_reduce into a copy: only the root's tensor changes, as with NCCL.
        op = _op_name(opts.reduceOp)
        root = opts.rootRank
        tensors = [_check_tensor(t, "reduce tensor") for t in tensors]

        def reduce(comm, _):
            for tensor in tensors:
                result = tensor.clone()
                self._all_reduce(comm, [result], op)
                if self._rank == root:
                    tensor.copy_(result)
            return tensors

        return self._collective(tensors, reduce)

    def gather(self, output_lists, inputs, opts):
        root = opts.rootRank
        inputs = [_check_tensor(t, "gather input") for t in inputs]

        def gather(comm, _):
            for index, input in enumerate(inputs):
                flat = self._one_per_rank(input)
                self._all_gather(comm, input, flat)
                if self._rank == root:
                    for out, part in zip(output_lists[index], flat):
                        out.copy_(part)
            return inputs

        return self._collective(inputs, gather)

    def scatter(self, outputs, input_lists, opts):
        root = opts.rootRank
        outputs = [_check_tensor(t, "scatter output") for t in outputs]

        def scatter(comm, _):
            for index, output in enumerate(outputs):
                flat = self._one_per_rank(output)
                if self._rank == root:
                    flat.copy_(torch.stack(list(input_lists[index])))
                self._broadcast(comm, [flat], root)
                output.copy_(flat[self._rank])
            return outputs

        return self._collective(outputs, scatter)

    def barrier(self, opts=None):
        marker = torch.zeros(1, dtype=torch.uint8)
        return self._collective([marker], lambda c, t: self._all_reduce(c, t, "max"))

    send = _unsupported("send")
    recv = _unsupported("recv")
    recv_anysource = _unsupported("recv_anysource")
    alltoall = _unsupported("alltoall")
    alltoall_base = _unsupported("alltoall_base")
    monitored_barrier = _unsupported("monitored_barrier")

    def shutdown(self) -> None:
        if self._cuda is not None:
            self._cuda.close()
        self._host.close()

    def __repr__(self) -> str:
        return f"ProcessGroupPcieipc(rank={self._rank}, size={self._size}, transport={self._transport})"

    # -- the collectives over one communicator ----------------------------

    def _collective(self, tensors, run):
        """Runs `run(comm, tensors)`, whose value the Work's future carries,
        in the calling thread (the interpreter
        lock released while the engine works): on the host it returns when
        the collective is done, on CUDA once it is queued on the caller's
        current stream. async_op=True gets a completed Work on the host: a
        worker thread would let the caller overlap, but handing each call to
        it cost 120 µs against 18 µs for the whole Python layer
        (docs/python.md), and the host engine's copies need the CPU the
        caller would overlap with."""
        device = _same_device(tensors, "the call")
        future = torch.futures.Future(devices=[device] if device.type == "cuda" else None)
        try:
            if device.type == "cpu":
                value = run(self._host, tensors)
            else:
                value = self._run_cuda(device, tensors, run)
        except Exception as error:  # handed to whoever waits, as torch's own groups do
            future.set_exception(error)
            return _Work(future)
        future.set_result(value)
        return _Work(future)

    def _run_cuda(self, device, tensors, run):
        comm = self._cuda_communicator(device)
        # Handed to the engine by device pointer on the caller's current
        # stream, in order with its work: queued there on the GPU hand-off,
        # done before the call returns on the host hand-off (ranks sharing a
        # GPU without MPS). A tensor allocated on another stream is recorded
        # on this one, so that the caching allocator hands its memory to no
        # other tensor (freed, or resized meanwhile) before the queued call
        # is done with it.
        stream = torch.cuda.current_stream(device)
        for tensor in tensors:
            tensor.record_stream(stream)
        value = run(_OnStream(comm, stream.cuda_stream), tensors)
        comm.check()
        return value

    def _one_per_rank(self, like: torch.Tensor) -> torch.Tensor:
        """An empty tensor of `like`'s kind holding one `like` per rank."""
        return like.new_empty((self._size,) + tuple(like.shape))

    def _cuda_communicator(self, device: torch.device) -> CudaCommunicator:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if self._cuda is None:
            # Every rank makes its first CUDA call at the same point, so all
            # of them join here together.
            seconds = max(self._timeout.total_seconds(), 1.0)
            name, secret = self._rendezvous("cuda")
            self._cuda = CudaCommunicator(
                name,
                self._layout.local_rank,
                self._layout.local_size,
                index,
                secret=secret,
                transport=self._transport,
                join_timeout=seconds,
                peer_timeout=seconds,
                handoff=os.environ.get(HANDOFF_ENV, "auto"),
                p2p=os.environ.get(P2P_ENV, "auto"),
                handoff_blocks=_handoff_blocks(),
                copy_engines_from=_bytes_env(COPY_ENGINES_FROM_ENV, never=True),
                copy_chunk_bytes=_bytes_env(COPY_CHUNK_ENV),
            )
        elif self._cuda.device != index:
            raise InvalidArgument(
                f"pcieipc backend: tensor on cuda:{index}, the group's GPU is cuda:{self._cuda.device}"
            )
        return self._cuda

    def _inter(self, device_type: str):
        """The process group between this rank's column of nodes (None on one node)."""
        layout = self._layout
        if layout.nodes == 1:
            return None
        attribute = "_inter_cuda" if device_type == "cuda" else "_inter_cpu"
        group = getattr(self, attribute)
        if group is None:
            prefix = f"pcieipc/inter/{device_type}/local{layout.local_rank}"
            store = dist.PrefixStore(prefix, self._store)
            if device_type == "cuda":
                group = dist.ProcessGroupNCCL(store, layout.node, layout.nodes)
            else:
                group = dist.ProcessGroupGloo(store, layout.node, layout.nodes, self._timeout)
            setattr(self, attribute, group)
        return group

    def _all_reduce(self, comm, tensors, op: str):
        inter = self._inter(tensors[0].device.type)
        for tensor in tensors:
            if inter is None:
                comm.all_reduce(tensor, op=op)
            else:
                self._hierarchical_all_reduce(comm, inter, tensor, op)
        return tensors

    def _hierarchical_all_reduce(self, comm, inter, tensor, op: str):
        if op == "avg":
            self._hierarchical_all_reduce(comm, inter, tensor, "sum")
            if tensor.is_floating_point():
                tensor.div_(self._size)
            else:
                tensor.div_(self._size, rounding_mode="trunc")
            return
        flat = tensor.view(-1)
        work = _padded(flat, self._layout.local_size)
        shard = work.new_empty(work.numel() // self._layout.local_size)
        comm.reduce_scatter(work, shard, op=op)
        # On CUDA, torch's group orders its own stream after the current one,
        # and `wait` orders the current one after it.
        opts = dist.AllreduceOptions()
        opts.reduceOp = {v: k for k, v in _OPS.items()}[op]
        inter.allreduce([shard], opts).wait()
        comm.all_gather(shard, work)
        if work is not flat:
            flat.copy_(work[: flat.numel()])

    def _broadcast(self, comm, tensors, root: int):
        layout = self._layout
        inter = self._inter(tensors[0].device.type)
        for tensor in tensors:
            if inter is None:
                comm.broadcast(tensor, root=root)
                continue
            # Across the root's column of nodes first, then inside each node.
            if layout.local_rank == root % layout.local_size:
                opts = dist.BroadcastOptions()
                opts.rootRank = root // layout.local_size
                inter.broadcast([tensor], opts).wait()
            comm.broadcast(tensor, root=root % layout.local_size)
        return tensors

    def _all_gather(self, comm, input, output):
        layout = self._layout
        inter = self._inter(input.device.type)
        if inter is None:
            comm.all_gather(input, output)
            return output
        # Inside the node into this node's block, then the blocks across nodes
        # (ranks are node-contiguous, so node order is rank order).
        block = output.view(layout.nodes, -1)[layout.node]
        comm.all_gather(input, block)
        inter.allgather([list(output.view(layout.nodes, -1).unbind(0))], [block.clone()]).wait()
        return output

    def _reduce_scatter(self, comm, input, output, op: str):
        if self._inter(input.device.type) is None:
            comm.reduce_scatter(input, output, op=op)
            return output
        # Across nodes: the whole input all-reduced hierarchically, then this
        # rank's part (N times the traffic of a native reduce-scatter).
        whole = input.clone()
        self._all_reduce(comm, [whole], op)
        output.copy_(whole.view(self._size, -1)[self._rank].view_as(output))
        return output

    def _rendezvous(self, what: str):
        """This node's rendezvous name and secret for communicator `what`.
        The node's first rank makes the name and publishes it in the store.
        The secret is the launcher's where PCIEIPC_JOB_SECRET is set (it
        then never enters the store); else the first rank makes one and
        publishes it beside the name, and the store is the job's trust
        boundary, as it is for torch itself (docs/security.md)."""
        layout = self._layout
        key = f"pcieipc/{what}/node{layout.node}"
        from_launcher = os.environ.get("PCIEIPC_JOB_SECRET")
        if layout.local_rank == 0:
            name = f"pcieipc-torch-{secrets.token_hex(8)}"
            secret = from_launcher or secrets.token_hex(16)
            self._store.set(key, name if from_launcher else f"{name} {secret}")
            return name, secret
        name, *published = self._store.get(key).decode().split()
        # A rank given no secret while its node's first rank had one presents
        # none and is refused by name (RendezvousError), as it should be.
        return name, from_launcher or (published[0] if published else None)


def node_name() -> str:
    """The machine this process runs on: PCIEIPC_NODE where set (to
    simulate nodes on one machine), else the host name and boot id."""
    name = os.environ.get(NODE_ENV)
    if name:
        return name
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
    except OSError:
        boot_id = ""
    return f"{socket.gethostname()}/{boot_id}"


def _local_size(store, rank: int, size: int) -> int:
    """How many ranks share this rank's machine, after checking that the
    group's ranks come in whole nodes of equal size, consecutive ranks
    together (torchrun's order: the hierarchical collectives rely on it)."""
    store.set(f"pcieipc/node-of/{rank}", node_name())
    nodes = [store.get(f"pcieipc/node-of/{r}").decode() for r in range(size)]
    local = nodes.count(nodes[rank])
    layout_ok = size % local == 0 and all(
        nodes[r] == nodes[r - r % local] and (r % local or r == 0 or nodes[r] != nodes[r - 1])
        for r in range(size)
    )
    if not layout_ok:
        raise InvalidArgument(
            "pcieipc backend: the group's ranks are not whole nodes of consecutive ranks "
            f"of equal size (machine of each rank: {nodes})"
        )
    return local


def _create(store, rank, size, timeout):
    return ProcessGroupPcieipc(store, rank, size, timeout)


@atexit.register
def _release_at_exit() -> None:
    # A failed collective's exception and the futures that carry it form
    # reference cycles (exception → traceback → frame → Work → future). Left
    # to the end of the interpreter, torch destroys such a future after
    # Python is gone and the process aborts; collect them while it lives.
    gc.collect()


dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])


# -- hierarchical all-reduce and the DDP hook -----------------------------


def hierarchical_all_reduce(tensor: torch.Tensor, intra, inter=None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """All-reduces `tensor` in place: reduce-scatter inside the node over
    `intra` (a pcieipc group), all-reduce of this rank's shard across nodes
    over `inter` (any process group: NCCL, Gloo), all-gather inside the node.
    Without `inter`, a plain all-reduce over `intra`."""
    if inter is None:
        dist.all_reduce(tensor, op=op, group=intra)
        return tensor
    local = dist.get_world_size(intra)
    flat = tensor.view(-1)
    work = _padded(flat, local)
    shard = work.new_empty(work.numel() // local)
    dist.reduce_scatter_tensor(shard, work, op=op, group=intra)
    dist.all_reduce(shard, op=op, group=inter)
    dist.all_gather_into_tensor(work, shard, group=intra)
    if work is not flat:
        flat.copy_(work[: flat.numel()])
    return tensor


@dataclass
class HookState:
    """The groups ``allreduce_hook`` reduces gradients over: `intra`, a
    pcieipc group of this node's ranks, and `inter`, a group of the ranks
    with this rank's local rank on every node (None on one node)."""

    intra: object
    inter: object = None

    @classmethod
    def create(cls, inter_backend: Optional[str] = None) -> "HookState":
        """Makes the groups from the default process group, which must
        come in whole nodes of consecutive ranks (torchrun's order).
        `inter_backend`: the backend between nodes (default: the default
        group's). Every rank must call it (it makes groups)."""
        world = dist.get_world_size()
        rank = dist.get_rank()
        local = _local_size(dist.distributed_c10d._get_default_store(), rank, world)
        intra = inter = None
        for node in range(world // local):
            group = dist.new_group(list(range(node * local, (node + 1) * local)), backend=BACKEND)
            if rank // local == node:
                intra = group
        if world > local:
            for local_rank in range(local):
                group = dist.new_group(list(range(local_rank, world, local)), backend=inter_backend)
                if rank % local == local_rank:
                    inter = group
        return cls(intra=intra, inter=inter)


def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages the gradient bucket over every rank,
    inside the node over pcieipc and across nodes over `state.inter`
    (``model.register_comm_hook(HookState.create(), allreduce_hook)``)."""
    tensor = bucket.buffer()
    # As DDP's default hook: divide first, then sum, so the result does not
    # depend on how the sum is split.
    tensor.div_(dist.get_world_size())
    hierarchical_all_reduce(tensor, state.intra, state.inter)
    future = torch.futures.Future(devices=[tensor.device] if tensor.is_cuda else None)
    future.set_result(tensor)
    return future
