"""Type stubs of pcieipc._native (the Rust extension module)."""

from typing import Any, Optional, Union

DTYPES: list[str]
OPS: list[str]

class Error(RuntimeError):
    """A pcieipc collective or communicator failed."""

    rank: Optional[int]
    """The rank that raised it."""
    peer: Optional[int]
    """The peer rank it concerns, where the engine names one."""
    device: Optional[str]
    """The device it concerns, where the engine names one."""

class PeerError(Error):
    """A peer exited, left, hung, its GPU work failed, or it published corrupt data."""

class MismatchError(Error):
    """Ranks made different calls or joined with different rank counts."""

class RendezvousError(Error):
    """Joining failed: name taken or foreign, secret refused, a rank never came."""

class DeviceError(Error):
    """This rank's transport, GPU or PCIe device failed."""

class InvalidArgument(Error, ValueError):
    """A call's arguments were refused before any data moved."""

class Communicator:
    """Collectives on host memory among `nranks` processes of this host.

    Buffers: any C-contiguous object with the buffer protocol or
    ``__dlpack__`` (numpy arrays, bytearray, torch CPU tensors) of float32,
    float64, float16, bfloat16, int32, int64 or uint8; nothing is copied.
    """

    def __init__(
        self,
        rendezvous: str,
        rank: int,
        nranks: int,
        *,
        transport: str = "shm",
        secret: Optional[str] = None,
        join_timeout: float = 30.0,
        peer_timeout: float = 60.0,
    ) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def nranks(self) -> int: ...
    @property
    def transport(self) -> str: ...
    def all_reduce(self, input: Any, output: Optional[Any] = None, op: str = "sum") -> None:
        """output[i] = op over all ranks' input[i]; in place when output is None."""
    def reduce_scatter(self, input: Any, output: Any, op: str = "sum") -> None:
        """Rank r's output = op over all ranks' input[r*m:(r+1)*m], m = len(output)."""
    def all_gather(self, input: Any, output: Any) -> None:
        """output[r*m:(r+1)*m] = rank r's input, m = len(input)."""
    def broadcast(self, buffer: Any, root: int = 0) -> None:
        """Every rank's buffer = rank root's."""
    def barrier(self) -> None:
        """Returns once every rank has called it."""
    def close(self) -> None:
        """Leaves the communicator; later calls raise Error."""
    def __enter__(self) -> "Communicator": ...
    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None: ...

class CudaCommunicator:
    """Stream-ordered collectives on CUDA tensors, one GPU per rank.

    Calls are ordered on ``stream``. On the GPU hand-off (``hands_off_on_gpu``)
    they are queued and return at once; ``synchronize()`` waits for them and
    raises what a GPU-side hand-off reported. On the host hand-off (ranks
    sharing a GPU) a call runs after the stream's queued work and is done
    when it returns.
    """

    def __init__(
        self,
        rendezvous: str,
        rank: int,
        nranks: int,
        device: int,
        *,
        transport: str = "shm",
        secret: Optional[str] = None,
        join_timeout: float = 30.0,
        peer_timeout: float = 60.0,
        handoff: str = "auto",
        p2p: str = "auto",
        handoff_timeout: float = 10.0,
        handoff_blocks: Optional[int] = None,
        copy_engines_from: Union[int, str, None] = None,
        copy_chunk_bytes: Optional[int] = None,
    ) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def nranks(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def stream(self) -> int:
        """The communicator's own CUstream: calls given no stream are queued on it."""
    @property
    def hands_off_on_gpu(self) -> bool: ...
    @property
    def data_path(self) -> str: ...
    @property
    def last_algorithm(self) -> Optional[str]:
        """The algorithm the last collective took ("ring", "one-shot", "direct"), None before the first."""
    @property
    def control(self) -> Communicator:
        """The host control plane, a host communicator of the same ranks."""
    def all_reduce(
        self, input: Any, output: Optional[Any] = None, op: str = "sum", stream: Optional[int] = None
    ) -> None:
        """Orders the all_reduce on `stream` (a CUstream of this GPU's context; None: `self.stream`)."""
    def reduce_scatter(self, input: Any, output: Any, op: str = "sum", stream: Optional[int] = None) -> None: ...
    def all_gather(self, input: Any, output: Any, stream: Optional[int] = None) -> None: ...
    def broadcast(self, buffer: Any, root: int = 0, stream: Optional[int] = None) -> None: ...
    def synchronize(self) -> None: ...
    def check(self) -> None: ...
    def close(self) -> None: ...
