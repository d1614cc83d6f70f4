//! `pcieipc monitor --metrics`: the page Prometheus scrapes, in its text
//! exposition format (0.0.4). `render` is pure: the probed topology, the
//! windowed health, the monitor's event counts, the module's state and
//! NVML's answers in, the page out; `scrape` reads them at each scrape, as
//! node_exporter reads its files.
//!
//! AER errors are never counted twice: a device whose kernel shows its
//! `aer_dev_*` counters is counted from them (what the kernel counted, the
//! errors before the monitor started included); only a device without them
//! is counted from events, from tracefs where the monitor follows it, else
//! from the module's first recovery step of each error.

mod render;
pub mod scrape;

pub use render::{render, EventCounts, ModuleState, Scrape, DEFAULT_METRICS_ADDRESS};
