//! This backend's errors: what failed on which GPU, and how the engine
//! reports them (transport errors named `cuda`, on the rank that saw them).

use cudarc::driver::DriverError;

use crate::engine::EngineError;

/// The name this backend's errors carry.
pub const BACKEND: &str = "cuda";

/// A CUDA failure, with the GPU and the step it concerns.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("the CUDA {library} library is not installed (searched the loader path: set LD_LIBRARY_PATH to the directory holding it)")]
    LibraryMissing { library: &'static str },

    #[error("GPU {ordinal}: {what}: {source}")]
    Driver {
        ordinal: usize,
        what: &'static str,
        #[source]
        source: DriverError,
    },

    #[error("GPU {ordinal}: compiling the reduce kernels with NVRTC: {log}")]
    Compile { ordinal: usize, log: String },

    #[error("the control plane's segment has no backend area of {bytes} bytes per rank for the GPU hand-off through host memory (its transport keeps its windows in device memory, or rank 0 asked for none)")]
    NoHostExchange { bytes: usize },

    #[error("GPU {ordinal}: stream {stream:#x} belongs to another CUDA context than this GPU's primary one")]
    ForeignStream { ordinal: usize, stream: usize },

    #[error("GPU {ordinal}: rank {peer}'s IPC allocation holds {got} bytes from the address it shares, this rank reads and writes {needed} there")]
    PeerAllocationTooSmall {
        ordinal: usize,
        peer: usize,
        got: usize,
        needed: usize,
    },

    #[error("GPU {ordinal}: {what} needs calls handed over on the GPU; this communicator hands over on the host (--handoff gpu, or a GPU per rank)")]
    NoGpuHandoff { ordinal: usize, what: &'static str },

    #[error("GPU {ordinal}: {what} of {got} elements, expected {expected}")]
    BufferLength {
        ordinal: usize,
        what: &'static str,
        got: usize,
        expected: usize,
    },
}

/// Turns a driver error on GPU `ordinal` during `what` into a `CudaError`.
pub(crate) fn driver_error(
    ordinal: usize,
    what: &'static str,
) -> impl FnOnce(DriverError) -> CudaError {
    move |source| CudaError::Driver {
        ordinal,
        what,
        source,
    }
}

/// This backend's errors as the engine reports them, on `rank`.
pub(crate) fn on_rank(rank: usize) -> impl Fn(CudaError) -> EngineError {
    move |error| EngineError::transport(rank, BACKEND, error)
}
