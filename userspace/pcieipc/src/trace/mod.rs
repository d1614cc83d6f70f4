//! The timeline of a job (`pcieipc trace`): each rank records its calls, the
//! steps inside them, its waits on peers and the sleeps inside those, and
//! link events, and writes them as Chrome trace-event JSON (Perfetto UI and
//! chrome://tracing open it), one process track per rank.
//!
//! Off unless asked for (`CommOptions::trace`, or the `PCIEIPC_TRACE`
//! environment variable naming a file prefix): a communicator without a
//! recorder pays one branch per site. Times are CLOCK_MONOTONIC, which every
//! process of a host shares and the module stamps its events with
//! (`ktime_get`), so the ranks' tracks line up without any alignment step.
//!
//! `record` holds what a rank collects and writes (`<prefix>.rank<R>.json`,
//! a complete trace on its own), in `storage`'s chunks faulted in ahead;
//! `chrome` merges rank files and summarises
//! a trace, and `svg` draws one, pure functions over JSON text.

pub mod chrome;
mod record;
mod span;
mod storage;
mod tail;

pub use chrome::{merge, summarise, Summary};
pub(crate) use record::{Arg, Recorder, Track};
pub use span::{events, TraceError};
pub use tail::{CallTime, Cause, Tail};

/// Names the file prefix every rank of a traced job writes to.
pub const TRACE_ENV: &str = "PCIEIPC_TRACE";

/// The file rank `rank` of a job traced under `prefix` writes.
pub fn rank_file(prefix: &std::path::Path, rank: usize) -> std::path::PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!(".rank{rank}.json"));
    name.into()
}

/// Nanoseconds of CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable");
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}
