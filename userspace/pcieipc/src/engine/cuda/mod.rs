//! The CUDA backend: all_reduce of GPU buffers between ranks in separate
//! processes, through CUDA IPC and peer-to-peer reduce kernels. Its steps
//! come from `schedule`, its host control plane is a host `Communicator`,
//! and its errors reach callers as the engine's transport errors (named
//! `cuda`). docs/engine.md has the design and the measurements.

mod collective;
mod communicator;
mod gpu;
mod handoff;
mod ipc;
mod kernels;
mod one_shot;
mod registration;
mod ring;
mod tracing;

pub use communicator::{CudaCommunicator, CudaOptions, DataPath, PeerRead, PeerToPeer};
/// cudarc itself, for graphs and the rest of the CUDA API around the
/// stream-ordered calls, at the version this crate uses.
pub use cudarc;
/// The stream type stream-ordered calls take (cudarc's).
pub use cudarc::driver::CudaStream;
pub use gpu::{CudaError, DeviceBuffer, Gpu, BACKEND};
pub use handoff::Handoff;
