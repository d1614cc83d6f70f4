//! pcieipc userspace library: PCIe topology probe and link health, the ring
//! planner, the ring AllReduce engine with its transports, and the typed client
//! of the `/dev/pcieipc` kernel module.

pub mod device;
pub mod engine;
pub mod event_source;
pub mod event_store;
pub mod events;
pub mod metrics;
pub mod plan;
pub mod probe;
pub mod trace;
