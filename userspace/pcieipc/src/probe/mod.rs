//! The topology probe: the PCI tree from sysfs, link speeds and widths, AER
//! counters and the health model, the P2P readiness doctor and the report
//! `pcieipc probe` prints.
//!
//! Parsing (`attributes`, `config_space`, `nvlink`) takes text, bytes and
//! answers only; `sysfs` is the one module that reads files, under a root
//! directory so that tests and `--sysfs-root` can point it at a fixture, and
//! `nvml` the one that asks NVML (or reads recorded answers) about NVLink.
//!
//! ```no_run
//! use pcieipc::probe::{HealthModel, Topology};
//! let topology = Topology::from_sysfs_root("/".as_ref(), HealthModel::default())?;
//! for gpu in topology.gpus() {
//!     if let Some(link) = topology.link_above(gpu) {
//!         println!("{}: {:?} {:?}", topology.devices[gpu].bdf, link.state, link.effective_bandwidth_gbps());
//!     }
//! }
//! # Ok::<(), pcieipc::probe::ProbeError>(())
//! ```

pub mod attributes;
pub mod bdf;
pub mod config_space;
pub mod doctor;
pub mod error;
pub mod health;
pub mod link;
pub mod names;
pub mod nvlink;
pub mod nvml;
pub mod report;
pub mod retrain;
pub mod sysfs;
pub mod topology;
pub mod watch;

pub use bdf::{Bdf, DomainTooWide};
pub use doctor::{diagnose, Finding, FindingKind, PeerRoute, Severity};
pub use error::ProbeError;
pub use health::{AerTotals, HealthBasis, HealthModel};
pub use link::{Link, LinkSpeed, LinkState};
pub use nvlink::{NvlinkConnection, NvlinkStatus, Nvlinks, NvmlAnswers};
pub use nvml::{NvlinkSource, NvmlError, NvmlFixture, NvmlLibrary};
pub use report::{ProbeReport, AER_NOT_REPORTED, SCHEMA_VERSION};
pub use topology::{DeviceKind, DevicePath, PathClass, PciDevice, Topology};
pub use watch::{Change, DeviceChange, DeviceWindow, LinkSample, Sample, Watch, WatchStep};
