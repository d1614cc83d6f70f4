//! `pcieipc monitor`: streams the module's events (AER, link changes,
//! retrains, device removal) as lines or JSON lines until interrupted.

use std::{io::Write, path::PathBuf, process::ExitCode};

use anyhow::Context;
use pcieipc::device::{Device, DEFAULT_PATH};

#[derive(clap::Args)]
pub struct Args {
    /// The module's device node.
    #[arg(long, default_value = DEFAULT_PATH)]
    path: PathBuf,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<u64>,
    /// Print the events already there and stop instead of waiting for more.
    #[arg(long)]
    no_wait: bool,
}

/// Records taken per read.
const BATCH: usize = 64;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut device = Device::open_with(&args.path, args.no_wait)?;
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    loop {
        let events = match device.read_events(BATCH) {
            Ok(events) => events,
            Err(err) if args.no_wait && err.errno() == Some(nix::errno::Errno::EAGAIN) => break,
            Err(err) => return Err(err.into()),
        };
        let mut out = stdout.lock();
        for event in events {
            if args.json {
                serde_json::to_writer(&mut out, &event).context("writing JSON")?;
                writeln!(out)?;
            } else {
                writeln!(out, "{event}")?;
            }
            printed += 1;
            if args.count.is_some_and(|count| printed >= count) {
                out.flush()?;
                return Ok(ExitCode::SUCCESS);
            }
        }
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}
