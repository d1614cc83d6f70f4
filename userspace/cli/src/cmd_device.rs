//! `pcieipc device`: talk to the kernel module through /dev/pcieipc.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use pcieipc::device::{Device, DmaWaitResult, WaitResult, DEFAULT_PATH};

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
    /// The bound devices: BDF, IDs, BARs, interrupt vectors, link, state.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Block until an interrupt of DEVICE's VECTOR passes LAST_SEEN; prints the count.
    Wait {
        device: u32,
        vector: u32,
        #[arg(long, default_value_t = 0)]
        last_seen: u64,
        /// Give up after this many milliseconds (default: wait forever).
        #[arg(long)]
        timeout_ms: Option<u64>,
    },
    /// Every vector's interrupt count of DEVICE.
    Counters { device: u32 },
    /// Ring VECTOR of ivshmem peer PEER through DEVICE's doorbell.
    Ring { device: u32, peer: u16, vector: u16 },
    /// Copy SIZE bytes between two DMA buffers of DEVICE with its engine,
    /// verify them, and print the engine and the time.
    DmaCopy {
        device: u32,
        #[arg(long, default_value_t = 4096)]
        size: u64,
    },
    /// Function reset of DEVICE (config space saved and restored); emits a RESET event.
    Reset { device: u32 },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let device = Device::open(&args.path)?;
    match args.command {
        DeviceCommand::Version { json } => {
            let version = device.version()?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&version).context("serialising the version")?
                );
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
        DeviceCommand::List { json } => {
            let devices = device.list()?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&devices).context("serialising the list")?
                );
            }
            for d in devices.iter().filter(|_| !json) {
                let link = match (d.link_speed_gts, d.link_width) {
                    (Some(speed), Some(width)) => format!("{speed} GT/s x{width}"),
                    _ => "link unknown".into(),
                };
                println!(
                    "{} {} {:04x}:{:04x} {:?} {:?} {} {:?} vector(s), {link}, upstream {}, peer {}",
                    d.index,
                    d.bdf,
                    d.vendor,
                    d.device,
                    d.kind,
                    d.state,
                    d.num_vectors,
                    d.irq_type,
                    d.upstream_bdf.as_deref().unwrap_or("none"),
                    d.peer_id.map_or("none".into(), |p| p.to_string()),
                );
                for bar in &d.bars {
                    println!(
                        "    BAR{} {} bytes{}{} mmap offset {:#x}",
                        bar.index,
                        bar.size,
                        if bar.memory { " mem" } else { " io" },
                        if bar.mappable { " mappable" } else { "" },
                        bar.mmap_offset
                    );
                }
            }
        }
        DeviceCommand::Wait {
            device: index,
            vector,
            last_seen,
            timeout_ms,
        } => match device.wait(
            index,
            vector,
            last_seen,
            timeout_ms.map(Duration::from_millis),
        )? {
            WaitResult::Interrupt(count) => println!("{count}"),
            WaitResult::TimedOut => anyhow::bail!("device {index} vector {vector}: timed out"),
            WaitResult::Interrupted => {
                anyhow::bail!("device {index} vector {vector}: interrupted by a signal")
            }
        },
        DeviceCommand::Counters { device: index } => {
            let counts: Vec<String> = device.counters(index)?.iter().map(u64::to_string).collect();
            println!("{}", counts.join(" "));
        }
        DeviceCommand::Ring {
            device: index,
            peer,
            vector,
        } => device.ring(index, peer, vector)?,
        DeviceCommand::DmaCopy {
            device: index,
            size,
        } => dma_copy(&device, index, size)?,
        DeviceCommand::Reset { device: index } => {
            let took = device.reset(index)?;
            println!("device {index} reset in {} us", took.as_micros());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `pcieipc device dma-copy`: one verified copy between two fresh buffers.
fn dma_copy(device: &Device, index: u32, size: u64) -> anyhow::Result<()> {
    let src = device.dma_alloc(index, size)?;
    let dst = device.dma_alloc(index, size)?;
    let src_map = device.map_dma(&src)?;
    let dst_map = device.map_dma(&dst)?;
    let pattern: Vec<u8> = (0..size).map(|i| (i % 251) as u8 ^ 0x5a).collect();
    src_map.write(0, &pattern);
    let start = std::time::Instant::now();
    let ticket = device.dma_copy((&src, 0), (&dst, 0), size)?;
    loop {
        match device.dma_wait(&ticket, None)? {
            DmaWaitResult::Done => break,
            DmaWaitResult::TimedOut | DmaWaitResult::Interrupted => continue,
        }
    }
    let elapsed = start.elapsed();
    let mut copied = vec![0u8; size as usize];
    dst_map.read(0, &mut copied);
    anyhow::ensure!(
        copied == pattern,
        "device {index}: the copy differs from its source"
    );
    println!(
        "device {index}: {size} bytes copied by the {:?} engine in {:.3} ms, verified",
        ticket.engine,
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
