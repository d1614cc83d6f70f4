//! The CUDA transport: all_reduce of GPU buffers between ranks in separate
//! processes, through CUDA IPC and peer-to-peer reduce kernels, with a host
//! control plane that sleeps instead of spinning. docs/engine.md has the
//! design and the measurements.

mod communicator;
mod gpu;
mod ipc;
mod kernels;

pub use communicator::{CudaCommunicator, CudaOptions, DataPath, PeerRead, PeerToPeer};
pub use gpu::{CudaError, DeviceBuffer, Gpu};
