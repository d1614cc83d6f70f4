//! `pcieipc link`: the link above any PCI function (owned by the module or
//! not), retraining it, and watching it, through /dev/pcieipc.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use pcieipc::{
    device::{Device, DEFAULT_PATH},
    events::speed_gts,
    probe::bdf::Bdf,
};

#[derive(clap::Args)]
pub struct Args {
    /// The module's device node.
    #[arg(long, default_value = DEFAULT_PATH)]
    path: PathBuf,
    #[command(subcommand)]
    command: LinkCommand,
}

#[derive(clap::Subcommand)]
enum LinkCommand {
    /// Link registers of the function and its upstream port, decoded.
    Status {
        /// PCI address, e.g. 0000:3b:00.0.
        bdf: String,
        #[arg(long)]
        json: bool,
    },
    /// Retrain the link from the upstream port (CAP_SYS_ADMIN).
    Retrain {
        bdf: String,
        /// Target speed generation to set first (1 = 2.5 GT/s ... 6 = 64 GT/s).
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=6))]
        speed: Option<u8>,
        /// Longest wait for Link Training to end (default: the kernel's 1000 ms).
        #[arg(long)]
        timeout_ms: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Check the function's link and config space every PERIOD_MS; changes
    /// become events (see `pcieipc monitor`). CAP_SYS_ADMIN.
    Watch {
        bdf: String,
        #[arg(long, default_value_t = 100)]
        period_ms: u64,
    },
    /// Stop watching the function.
    Unwatch { bdf: String },
}

fn bdf(text: &str) -> anyhow::Result<u32> {
    Ok(text.parse::<Bdf>()?.to_abi()?)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let device = Device::open(&args.path)?;
    match args.command {
        LinkCommand::Status { bdf: text, json } => {
            let link = device.link_status(bdf(&text)?)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&link).context("serialising the link")?
                );
            } else {
                println!("{link}");
            }
        }
        LinkCommand::Retrain {
            bdf: text,
            speed,
            timeout_ms,
            json,
        } => {
            let retrain =
                device.retrain(bdf(&text)?, speed, timeout_ms.map(Duration::from_millis))?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&retrain).context("serialising the retrain")?
                );
            } else {
                println!("before: {}", retrain.before);
                println!("after:  {}", retrain.after);
                println!(
                    "training {} after {} us",
                    if retrain.completed {
                        "ended"
                    } else {
                        "DID NOT END"
                    },
                    retrain.elapsed_us
                );
            }
            if !retrain.completed {
                return Ok(ExitCode::FAILURE);
            }
            if let Some(generation) = speed {
                if retrain.after.speed != generation {
                    eprintln!(
                        "pcieipc: the link trained to {}, not the {} asked for",
                        speed_gts(retrain.after.speed),
                        speed_gts(generation)
                    );
                }
            }
        }
        LinkCommand::Watch {
            bdf: text,
            period_ms,
        } => {
            device.watch(bdf(&text)?, Duration::from_millis(period_ms))?;
        }
        LinkCommand::Unwatch { bdf: text } => device.unwatch(bdf(&text)?)?,
    }
    Ok(ExitCode::SUCCESS)
}
