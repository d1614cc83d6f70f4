//! Event sources besides the module's `/dev/pcieipc`: the kernel's AER and
//! link tracepoints read through tracefs (errors of every device, those the
//! vendor drivers own included) and, where tracing is unavailable, the
//! kernel's `aer_dev_*` counters polled in sysfs. Both give the module's
//! event records (`events::Event`) with their `source` set, times in
//! CLOCK_MONOTONIC; `merge` orders several sources into one stream.
//!
//! Parsing is pure (`trace_text`, `counters`, `merge`: text and values in,
//! records out); `tracefs` and `sysfs_counters` do the I/O under a root
//! path that tests and `--tracefs-root`/`--sysfs-root` can move.

pub mod counters;
pub mod merge;
pub mod sysfs_counters;
pub mod trace_text;
pub mod tracefs;

use std::path::PathBuf;

/// Where tracefs is mounted on current systems.
pub const DEFAULT_TRACEFS_ROOT: &str = "/sys/kernel/tracing";

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of the module's
/// `timestamp_ns` and of a tracefs instance with trace_clock "mono".
pub fn monotonic_now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: tracefs is not mounted there ({source}); mount it with 'mount -t tracefs tracefs {path}'")]
    TracefsMissing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: this kernel has no {event} tracepoint (it needs CONFIG_PCIEAER and CONFIG_RAS, and tracing: CONFIG_FTRACE, CONFIG_EVENT_TRACING)")]
    NoTracepoint { path: PathBuf, event: &'static str },
    #[error("{path}: a tracing instance of that name exists already (another monitor, or one that was killed: remove it with rmdir)")]
    InstanceExists { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Counters {
        path: PathBuf,
        source: crate::probe::attributes::ParseError,
    },
    #[error("{path}: no device has AER counters (aer_dev_*): this kernel has no CONFIG_PCIEAER, or no device reports AER")]
    NoCounters { path: PathBuf },
}

impl SourceError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SourceError::Io {
            path: path.into(),
            source,
        }
    }
}
