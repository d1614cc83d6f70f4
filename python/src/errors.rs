//! The engine's errors as Python exceptions: a class per kind of failure,
//! each instance carrying the rank that raised it and, where the engine
//! names one, the peer rank or device it concerns (`peer`, `device`), so a
//! failed job says which process to look at.
//!
//! ```text
//! Error (RuntimeError)          rank
//! ├── PeerError                 peer: a peer died, left, hung, failed or corrupted memory
//! ├── MismatchError             peer: ranks called different collectives
//! ├── RendezvousError           joining failed (secret, names, rank counts)
//! ├── DeviceError               device: a transport, GPU or PCIe fault on this rank
//! └── InvalidArgument (+ ValueError)  a call's arguments were refused before any data moved
//! ```

use pcieipc::engine::EngineError;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    pcieipc,
    Error,
    PyRuntimeError,
    "A pcieipc collective or communicator failed. `rank` is the rank that raised it."
);
create_exception!(
    pcieipc,
    PeerError,
    Error,
    "A peer rank failed: it exited, left, stopped making progress, its GPU work failed, or it \
     published corrupt data. `peer` names it."
);
create_exception!(
    pcieipc,
    MismatchError,
    Error,
    "Ranks made different calls (collective, type, count, operator or root) or joined with \
     different rank counts. `peer` names the first rank that differs."
);
create_exception!(
    pcieipc,
    RendezvousError,
    Error,
    "Joining the communicator failed: the rendezvous name is taken or foreign, the job secret \
     was refused, or a rank never came."
);
create_exception!(
    pcieipc,
    DeviceError,
    Error,
    "This rank's transport, GPU or PCIe device failed. `device` names it where known."
);
create_exception!(
    pcieipc,
    InvalidArgument,
    Error,
    "A call's arguments were refused before any data moved (sizes, ranks, types, devices)."
);

/// Registers the exception classes in the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("Error", py.get_type::<Error>())?;
    module.add("PeerError", py.get_type::<PeerError>())?;
    module.add("MismatchError", py.get_type::<MismatchError>())?;
    module.add("RendezvousError", py.get_type::<RendezvousError>())?;
    module.add("DeviceError", py.get_type::<DeviceError>())?;
    module.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    Ok(())
}

/// `error`, raised on `rank`, as the Python exception of its kind.
pub fn to_python(error: EngineError, rank: usize) -> PyErr {
    use EngineError as E;
    let message = error.to_string();
    let (peer, device): (Option<usize>, Option<String>) = match &error {
        E::PeerDied { rank, .. }
        | E::PeerLeft { rank }
        | E::PeerUnresponsive { rank, .. }
        | E::PeerGpuFailed { rank }
        | E::RankNeverJoined { rank, .. }
        | E::DuplicateRank { rank }
        | E::RankCountMismatch { rank, .. } => (Some(*rank), None),
        E::PeerCorrupt { peer, .. } | E::DamagedMessage { peer, .. } => (Some(*peer), None),
        // Both ranks of a mismatch get the same record: the peer is the
        // one that is not this process.
        E::MismatchedCall {
            rank: first, peer, ..
        }
        | E::MismatchedRegistration {
            rank: first, peer, ..
        } => (Some(if *peer == rank { *first } else { *peer }), None),
        E::PeerMemoryUnreadable { owner, .. } => (Some(*owner), None),
        E::DeviceFault { device, .. } | E::DeviceRemoved { device, .. } => {
            (None, Some(device.clone()))
        }
        E::WrongGpu { gpu, .. } => (None, Some(format!("GPU {gpu}"))),
        E::Transport { transport, .. } => (None, Some((*transport).to_owned())),
        _ => (None, None),
    };
    let error = match error {
        E::PeerDied { .. }
        | E::PeerLeft { .. }
        | E::PeerUnresponsive { .. }
        | E::PeerGpuFailed { .. }
        | E::PeerCorrupt { .. }
        | E::PeerMemoryUnreadable { .. } => PeerError::new_err(message),
        // Data damaged on a link: the device's (link's) failure, as DeviceFault.
        E::DamagedMessage { .. } => DeviceError::new_err(message),
        E::MismatchedCall { .. }
        | E::MismatchedRegistration { .. }
        | E::RankCountMismatch { .. } => MismatchError::new_err(message),
        E::RendezvousInUse { .. }
        | E::RendezvousIo { .. }
        | E::RendezvousProtocol { .. }
        | E::RendezvousForeign { .. }
        | E::RankNeverJoined { .. }
        | E::HostFailed { .. }
        | E::WrongSecret { .. }
        | E::DuplicateRank { .. } => RendezvousError::new_err(message),
        E::RankOutOfRange { .. }
        | E::NoRanks
        | E::BufferLength { .. }
        | E::RootOutOfRange { .. }
        | E::BadWindowSizes { .. }
        | E::AlgorithmUnavailable { .. }
        | E::WrongGpu { .. }
        | E::DamageWithoutChecksums { .. } => InvalidArgument::new_err(message),
        E::Transport { .. }
        | E::BindCpu { .. }
        | E::SharedMemory { .. }
        | E::DeviceFault { .. }
        | E::DeviceRemoved { .. }
        | E::FollowDevice { .. } => DeviceError::new_err(message),
    };
    with_attributes(error, rank, peer, device)
}

/// `error` with the attributes every pcieipc exception carries.
fn with_attributes(
    error: PyErr,
    rank: usize,
    peer: Option<usize>,
    device: Option<String>,
) -> PyErr {
    Python::attach(|py| {
        let value = error.value(py);
        // Setting attributes on a fresh exception instance cannot fail
        // short of memory exhaustion, which the raise reports anyway.
        let _ = value.setattr("rank", rank);
        let _ = value.setattr("peer", peer);
        let _ = value.setattr("device", device);
    });
    error
}

/// An argument refused by the binding itself, as `InvalidArgument` on `rank`.
pub fn invalid(message: impl Into<String>, rank: usize) -> PyErr {
    with_attributes(InvalidArgument::new_err(message.into()), rank, None, None)
}

/// A failure of `device` on `rank` outside the engine (opening a GPU).
pub fn device_error(message: String, rank: usize, device: String) -> PyErr {
    with_attributes(DeviceError::new_err(message), rank, None, Some(device))
}

/// The error of a call on a closed communicator.
pub fn to_closed(rank: usize) -> PyErr {
    with_attributes(
        Error::new_err("the communicator is closed"),
        rank,
        None,
        None,
    )
}

/// `InvalidArgument` also is a `ValueError`: callers that catch bad
/// arguments generically still catch it.
pub fn make_invalid_argument_a_value_error(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let class = py.get_type::<InvalidArgument>();
    let bases = pyo3::types::PyTuple::new(
        py,
        [
            py.get_type::<Error>().into_any(),
            py.get_type::<PyValueError>().into_any(),
        ],
    )?;
    class.setattr("__bases__", bases)
}
