//! The CUDA backend: collectives of GPU buffers between ranks in separate
//! processes, through CUDA IPC and peer-to-peer kernels. Its steps and
//! segments come from `schedule`, its host control plane is a host
//! `Communicator`, and its errors reach callers as the engine's transport
//! errors (named `cuda`). docs/engine.md has the design and the
//! measurements.
//!
//! Layers, each importing only those above it:
//!
//! - `error`, `kernels` (the NVRTC-compiled CUDA C of `kernels/*.cu`),
//!   `gpu` (a context, its stream and kernels), `memory`, `stream_gate`, `ipc`,
//!   `tracing`, `options`, `call` (`GpuCall`, one call's description),
//!   `agreement` (steps every rank must agree on), `host_link` (the
//!   measured limit of a GPU's link to host memory);
//! - `staging` and `registration`: the memory peers read;
//! - `host_handoff` and `gpu_handoff`: the two ways ranks hand over;
//! - `communicator` (the façade: the public API) and `init`.

mod agreement;
mod call;
mod communicator;
mod error;
mod gpu;
mod gpu_handoff;
mod host_handoff;
mod host_link;
mod init;
mod ipc;
mod kernel_store;
mod kernels;
mod memory;
mod nvrtc;
mod options;
mod registration;
mod staging;
mod stream_gate;
mod tracing;

pub use call::GpuCall;
pub use communicator::CudaCommunicator;
/// cudarc itself, for graphs and the rest of the CUDA API around the
/// stream-ordered calls, at the version this crate uses.
pub use cudarc;
/// The stream type stream-ordered calls take (cudarc's).
pub use cudarc::driver::CudaStream;
pub use error::{CudaError, BACKEND};
pub use gpu::Gpu;
pub use host_link::{HostLink, HostLinkRate, HostLinks, MEASURED_COPIES, MEASURED_COPY_BYTES};
pub use memory::DeviceBuffer;
pub use options::{CopyEnginePlan, CudaOptions, DataPath, Handoff, PeerRead, PeerToPeer};
pub use stream_gate::StreamGate;
