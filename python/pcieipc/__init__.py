"""pcieipc: AllReduce over PCIe peer-to-peer IPC between the processes of one
host, for host buffers and CUDA tensors.

- ``Communicator``: collectives on host memory (numpy arrays, buffers, torch
  CPU tensors), over shared memory or the pcieipc kernel module's devices.
- ``CudaCommunicator``: stream-ordered collectives on CUDA tensors, handed
  over GPU to GPU.
- ``pcieipc.torch``: the ``torch.distributed`` backend "pcieipc" (importing it
  registers it), the DDP communication hook and the hierarchical all-reduce
  for jobs of more than one machine.

Errors are ``pcieipc.Error`` subclasses carrying ``rank`` (the rank that
raised), ``peer`` (the rank it concerns) and ``device`` where known.
docs/python.md has the details.
"""

from ._native import (
    DTYPES,
    OPS,
    Communicator,
    CudaCommunicator,
    DeviceError,
    Error,
    InvalidArgument,
    MismatchError,
    PeerError,
    RendezvousError,
)

# Raised from Python code too (pcieipc.torch): the attributes every instance
# raised by the engine carries exist on the classes with no value.
Error.rank = None
Error.peer = None
Error.device = None

__all__ = [
    "DTYPES",
    "OPS",
    "Communicator",
    "CudaCommunicator",
    "DeviceError",
    "Error",
    "InvalidArgument",
    "MismatchError",
    "PeerError",
    "RendezvousError",
]
