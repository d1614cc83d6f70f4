//! The AllReduce engine: a communicator of N ranks in separate processes on
//! one host, all_reduce (ring, one-shot or direct), reduce_scatter,
//! all_gather and broadcast over a pluggable transport, chunk sizes from link
//! facts, and failures (dead, missing, hung or mismatched ranks) reported as
//! errors that name the rank. docs/engine.md describes the layout, the
//! algorithms and the guarantees.
//!
//! - `schedule`: which rank moves what at which step (pure).
//! - `comm`: the communicator: joining, per-call agreement, waits, slots.
//! - `collectives`: the host algorithms, steps from `schedule`.
//! - `cache_bypass`: when and how the ring's slot fills skip the cache.
//! - `slot_fill`: below that, plain or non-temporal fills as calls measure.
//! - `fault_policy`: the AER → action matrix (pure); `fault_monitor` acts
//!   on it for what a `link_monitor` reports.
//! - `transport`: the shared segment every rank speaks through, its
//!   plug-in trait, the registry and the transports (shm, pcieipc).
//! - `cuda`: the GPU backend, steps from `schedule`, control over `comm`.

mod cache_bypass;
mod call;
mod checksum;
mod chunk;
mod collectives;
mod comm;
pub mod cuda;
mod dtype;
mod error;
mod failure;
mod fault_monitor;
pub mod fault_policy;
mod followed_device;
mod link_monitor;
pub mod schedule;
mod slot_fill;
pub mod transport;

pub use cache_bypass::StreamingStores;
pub use call::{CallDescriptor, CallKind};
pub use chunk::{ChunkPolicy, LinkFacts, SizeStep, AER_MEMORY, HOST_MEMORY_STEPS};
pub use comm::{CommOptions, Communicator, DamageInjection, ResendRecord};
pub use dtype::{bf16, f16, DType, Element, ReduceOp, UnknownDType, UnknownReduceOp};
pub use error::EngineError;
pub use failure::{Carrier, Corruption, Failure};
pub use followed_device::{FollowError, LinkDevice};
pub use schedule::{Algorithm, AlgorithmChoice, UnknownAlgorithm};
pub use transport::{
    BadSecret, Capabilities, JobSecret, PcieipcError, PcieipcOptions, ShmOptions, TransportOptions,
    UnknownTransport, SECRET_ENV, SEGMENT_NAME, TRANSPORTS,
};
