//! `pcieipc link`: the link above any PCI function (owned by the module or
//! not), retraining it, and watching it, through /dev/pcieipc; and root's
//! opt-in that lets it retrain the links of devices another driver owns.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use pcieipc::{
    device::{Device, DeviceError, LinkControl, RetrainRefusal, TargetSpeed, DEFAULT_PATH},
    events::speed_gts,
    probe::bdf::Bdf,
};

#[derive(clap::Args)]
pub struct Args {
    /// The module's device node.
    #[arg(long, default_value = DEFAULT_PATH)]
    path: PathBuf,
    /// Root under which sys/ is read and written (the module's parameters,
    /// the kernel's cooling devices).
    #[arg(long, default_value = "/")]
    sysfs_root: PathBuf,
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
    /// Retrain the link from the upstream port (CAP_SYS_ADMIN). The link
    /// above a device pcieipc does not bind needs root's opt-in first
    /// (`pcieipc link allow`).
    Retrain {
        bdf: String,
        /// Target speed for this retrain: a generation (1 = 2.5 GT/s ...
        /// 6 = 64 GT/s), or max (the highest both ends support). The port's
        /// Target Link Speed is put back after. Where the kernel's bandwidth
        /// controller sets the port's speed, the speed goes through its
        /// cooling device instead and stays set (max lifts it).
        #[arg(long)]
        speed: Option<TargetSpeed>,
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
    /// Allow pcieipc to retrain the links above these devices although
    /// another driver owns them (root; adds them to the module parameter
    /// link_control). Mass-storage devices stay refused.
    Allow {
        #[arg(required = true)]
        bdfs: Vec<String>,
    },
    /// Withdraw that permission.
    Disallow {
        #[arg(required = true)]
        bdfs: Vec<String>,
    },
    /// The devices root allowed (the module parameter link_control).
    Allowed {
        #[arg(long)]
        json: bool,
    },
}

fn bdf(text: &str) -> anyhow::Result<u32> {
    Ok(text.parse::<Bdf>()?.to_abi()?)
}

fn bdfs(texts: &[String]) -> anyhow::Result<Vec<Bdf>> {
    texts.iter().map(|text| Ok(text.parse::<Bdf>()?)).collect()
}

/// The list root allowed, after `change`, written back whole.
fn change_allowed(
    control: &LinkControl,
    texts: &[String],
    change: impl FnOnce(&mut Vec<Bdf>, Vec<Bdf>),
) -> anyhow::Result<()> {
    let given = bdfs(texts)?;
    let mut list = control.allowed()?;
    change(&mut list, given);
    control.set_allowed(&list)?;
    print_allowed(&control.allowed()?, false)
}

fn print_allowed(list: &[Bdf], json: bool) -> anyhow::Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string(list).context("serialising the list")?
        );
    } else if list.is_empty() {
        println!(
            "link_control: no device (pcieipc retrains only the links above devices it binds)"
        );
    } else {
        for bdf in list {
            println!("{bdf}");
        }
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let control = LinkControl::new(&args.sysfs_root);
    // Only the commands that use the module's ioctls open it: the opt-in
    // list is its parameter in sysfs.
    let open = || Device::open(&args.path);
    match args.command {
        LinkCommand::Allow { bdfs: texts } => {
            change_allowed(&control, &texts, |list, given| {
                for bdf in given {
                    if !list.contains(&bdf) {
                        list.push(bdf);
                    }
                }
            })?;
        }
        LinkCommand::Disallow { bdfs: texts } => {
            change_allowed(&control, &texts, |list, given| {
                list.retain(|bdf| !given.contains(bdf))
            })?;
        }
        LinkCommand::Allowed { json } => print_allowed(&control.allowed()?, json)?,
        LinkCommand::Status { bdf: text, json } => {
            let link = open()?.link_status(bdf(&text)?)?;
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
            let abi = bdf(&text)?;
            let device = open()?;
            let retrain = match device.retrain(abi, speed, timeout_ms.map(Duration::from_millis)) {
                Err(DeviceError::RetrainRefused {
                    refusal: RetrainRefusal::BandwidthController { port },
                    ..
                }) => {
                    let speed = speed.context("a plain retrain refused for a target speed")?;
                    let state = control.set_port_speed(port, speed)?;
                    println!(
                        "{}: speed set through the kernel's bandwidth controller \
                         (PCIe_Port_Link_Speed_{port}, cooling state {state}); it stays set until \
                         changed (--speed max lifts it)",
                        Bdf::from_abi(abi)
                    );
                    println!("after:  {}", device.link_status(abi)?);
                    return Ok(ExitCode::SUCCESS);
                }
                other => other?,
            };
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
            if let Some(TargetSpeed::Generation(generation)) = speed {
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
            open()?.watch(bdf(&text)?, Duration::from_millis(period_ms))?;
        }
        LinkCommand::Unwatch { bdf: text } => open()?.unwatch(bdf(&text)?)?,
    }
    Ok(ExitCode::SUCCESS)
}
