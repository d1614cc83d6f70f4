//! `pcieipc device`: talk to the kernel module through /dev/pcieipc.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use pcieipc::device::{Device, DEFAULT_PATH};

#[derive(clap::Args)]
pub struct Args {
    /// The module's device node.
    #[arg(long, default_value = DEFAULT_PATH)]
    path: PathBuf,
    #[command(subcommand)]
    command: DeviceCommand,
}

#[derive(clap::Subcommand)]
enum DeviceCommand {
    /// The module's ABI and version, and how many devices it has bound.
    Version {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let device = Device::open(&args.path)?;
    match args.command {
        DeviceCommand::Version { json } => {
            let version = device.version()?;
            if json {
                println!("{}", serde_json::to_string(&version).context("serialising the version")?);
            } else {
                println!(
                    "pcieipc module {} (ABI {}.{}), {} bound device(s), userspace {}",
                    version.module_version,
                    version.abi_major,
                    version.abi_minor,
                    version.bound_devices,
                    env!("CARGO_PKG_VERSION")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
