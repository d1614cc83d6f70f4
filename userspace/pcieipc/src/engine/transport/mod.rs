//! What the engine needs from a transport, and nothing more: windows a rank
//! writes and its peers read, counters a rank publishes and its peers wait on,
//! peer liveness, a small shared control block (published calls, who waits
//! for whom, the abort record), and the capabilities the engine may use
//! where a transport has them (peers reading each other's memory, a device
//! link followed through events). All of it is one concrete type,
//! `Transport`, over a mapped segment laid out alike for every transport
//! (`segment`); what really differs between transports is the one plug-in
//! trait, `Signalling` (who maps the memory, how a store wakes a waiter,
//! how a rank sleeps, peer reads, the link it follows). `registry` maps the
//! names users pick to constructors.
//!
//! The shm transport keeps all of it in one memfd segment and sleeps on
//! futexes. The pcieipc transport maps the same windows onto the ivshmem BAR,
//! rings the sleeping peer's doorbell in `store` and waits on its own MSI-X
//! interrupt in `sleep`. Both share the rendezvous that admits the ranks
//! (`rendezvous`).

mod config;
mod contract;
mod pcieipc;
mod registry;
mod rendezvous;
mod segment;
mod shm;

pub use config::{Registered, Setup, TransportConfig, TransportOptions};
pub(crate) use contract::SIGNALS;
pub use contract::{Capabilities, Signal, Window, WindowSizes};
pub use pcieipc::{PcieipcError, PcieipcOptions};
pub use registry::{describe_all, UnknownTransport, TRANSPORTS};
pub use rendezvous::{BadSecret, JobSecret, SECRET_ENV};
pub use segment::memfd::SEGMENT_NAME;
/// Peer liveness through pidfds, for backends that watch ranks themselves.
pub(crate) use segment::PeerWatch;
pub use segment::Transport;
pub use shm::ShmOptions;
