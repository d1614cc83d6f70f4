//! The ring AllReduce engine: a communicator of N ranks in separate processes
//! on one host, all_reduce (ring or one-shot), reduce_scatter, all_gather and
//! broadcast over a pluggable transport, chunk sizes from link facts, and
//! failures (dead, missing, hung or mismatched ranks) reported as errors that
//! name the rank. docs/engine.md describes the algorithms and guarantees.

mod algorithm;
mod call;
mod chunk;
mod communicator;
pub mod cuda;
mod dtype;
mod error;
mod failure;
mod link_events;
mod rendezvous;
mod segment;
mod shm;
mod transport;
mod transport_pcieipc;

pub use algorithm::{Algorithm, AlgorithmChoice, UnknownAlgorithm};
pub use call::{CallDescriptor, CallKind};
pub use chunk::{ChunkPolicy, LinkFacts, SizeStep, HOST_MEMORY_STEPS};
pub use communicator::{CommOptions, Communicator};
pub use dtype::{bf16, f16, DType, Element, ReduceOp, UnknownDType, UnknownReduceOp};
pub use error::EngineError;
pub use failure::Failure;
pub use link_events::AER_MEMORY;
pub use shm::SEGMENT_NAME;
pub use transport::{Signal, Transport, TransportKind, UnknownTransport, Window, WindowSizes};
pub use transport_pcieipc::PcieipcError;
