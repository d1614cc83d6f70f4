//! `pcieipc-guest`: checks run inside a testbed guest.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use pcieipc_testbed::tree::{compare, scan, TreeLine};

// The data-path checks; under guest/ so that cargo does not take them for
// binaries of their own.
#[path = "guest/abi.rs"]
mod abi;
#[path = "guest/caps.rs"]
mod caps;
#[path = "guest/common.rs"]
mod common;
#[path = "guest/dma.rs"]
mod dma;
#[path = "guest/events.rs"]
mod events;
#[path = "guest/fuzz.rs"]
mod fuzz;
#[path = "guest/lockdown.rs"]
mod lockdown;
#[path = "guest/long_copy.rs"]
mod long_copy;
#[path = "guest/mappings.rs"]
mod mappings;
#[path = "guest/pingpong.rs"]
mod pingpong;
#[path = "guest/waits.rs"]
mod waits;
#[path = "guest/windows.rs"]
mod windows;

#[derive(Parser)]
#[command(
    name = "pcieipc-guest",
    about = "Checks run inside a pcieipc testbed guest"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compare the PCI tree under the root ports with the expected tree.
    Tree {
        /// Expected tree (the harness writes /testbed/expected-tree.txt).
        #[arg(long, default_value = "/testbed/expected-tree.txt")]
        expect: PathBuf,
        #[arg(long, default_value = "/sys")]
        sysfs: PathBuf,
    },
    /// ivshmem ping-pong: MEMBERS processes on as many ivshmem-doorbell
    /// devices of one region pass a checked pattern around ROUNDS times;
    /// prints the round-trip time.
    PingPong {
        #[arg(long, default_value_t = 2)]
        members: usize,
        #[arg(long, default_value_t = 10_000)]
        rounds: u64,
    },
    /// One non-leading member of a ping-pong (started by `ping-pong`).
    #[command(hide = true)]
    PingPongMember {
        #[arg(long)]
        position: usize,
        #[arg(long)]
        members: usize,
        #[arg(long)]
        rounds: u64,
    },
    /// A wait of TIMEOUT_MS ends with ETIMEDOUT after TIMEOUT_MS ± 50%.
    WaitTimeout {
        #[arg(long, default_value_t = 200)]
        timeout_ms: u64,
    },
    /// A signal ends a wait without a limit with EINTR.
    WaitEintr,
    /// A process blocked in a wait uses under 5% of a spinning reader's CPU.
    CpuTime {
        #[arg(long, default_value_t = 2000)]
        ms: u64,
    },
    /// One side of `cpu-time`: "wait" or "spin" for MS; prints its CPU µs.
    #[command(hide = true)]
    CpuTimeChild {
        mode: String,
        #[arg(long)]
        ms: u64,
    },
    /// BAR windows: shared memory seen by both devices, bad windows refused.
    MmapChecks,
    /// The BAR2 window of a gone device is refused with ENODEV.
    MmapGone {
        #[arg(long)]
        device: u32,
    },
    /// DMA copies between two buffers of the first bound device of KIND
    /// (edu: its DMA engine; ivshmem, generic: the CPU), verified.
    DmaCopy {
        /// edu, ivshmem or generic.
        #[arg(long)]
        kind: String,
        /// Sizes in bytes.
        #[arg(long, value_delimiter = ',', default_values_t = [1u64, 4095, 4096, 1 << 20])]
        sizes: Vec<u64>,
    },
    /// Bad DMA requests are refused with the documented errnos.
    DmaErrors,
    /// Copies between a DMA buffer and an ivshmem BAR2 window, verified.
    DmaBar,
    /// BAR mmap and BAR copies work ("allowed") or get EPERM ("refused":
    /// kernel locked down); DMA buffers work either way.
    RawPci {
        #[arg(long)]
        expect: String,
    },
    /// The longest buffer <-> BAR2 CPU copies (16 MiB - 1, odd offsets),
    /// ROUNDS times back to back, verified; a SCHED_FIFO thread on the same
    /// CPU never waits more than MAX_LATENCY_MS for it.
    BarCopyLong {
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        #[arg(long, default_value_t = 100)]
        max_latency_ms: u64,
    },
    /// Root-only open; without CAP_SYS_ADMIN, hardware operations get EPERM.
    CapsCheck,
    /// Maps BAR2 of DEVICE and of WITNESS (a device of the same region),
    /// writes through DEVICE, creates READY, waits for GO (DEVICE unbound
    /// meanwhile), then reads and writes DEVICE's window again: it must not
    /// kill the process, and the write must not reach the region.
    MmapTouch {
        #[arg(long)]
        device: u32,
        #[arg(long)]
        witness: u32,
        #[arg(long)]
        ready: PathBuf,
        #[arg(long)]
        go: PathBuf,
    },
    /// Maps a BAR window through another device node (a tmpfs one).
    MmapNode {
        #[arg(long)]
        node: PathBuf,
        #[arg(long)]
        device: u32,
        #[arg(long)]
        bar: u32,
    },
    /// Maps and fills a DMA buffer, then touches it again on a signal
    /// (after its device is unbound: the module's stand-in page, no signal).
    DmaTouch {
        #[arg(long)]
        device: u32,
        #[arg(long)]
        size: u64,
        #[arg(long)]
        ready: PathBuf,
        #[arg(long)]
        go: PathBuf,
    },
    /// An e1000 holding its INTx line asserted is masked, not storming.
    IntxLevel {
        #[arg(long)]
        device: u32,
        #[arg(long)]
        bdf: String,
    },
    /// edu and an e1000 on one INTx line: neither counts the other's
    /// interrupts.
    IntxShared {
        #[arg(long)]
        edu: u32,
        #[arg(long)]
        nic: u32,
        #[arg(long)]
        nic_bdf: String,
    },
    /// A function reset of DEVICE zaps its mapped BAR0, and a reader of
    /// the register at OFFSET never reads it mid-reset.
    ResetMapping {
        #[arg(long)]
        device: u32,
        #[arg(long)]
        offset: usize,
    },
    /// BUFFERS DMA buffers of SIZE bytes of edu DEVICE lie within its
    /// 28-bit reach, and edu's copy between the highest two arrives.
    DmaReach {
        #[arg(long)]
        device: u32,
        #[arg(long)]
        buffers: usize,
        #[arg(long)]
        size: u64,
    },
    /// Copies and allocations of SIZE-byte DMA buffers of DEVICE back to
    /// back until the device goes; READY after the first copy.
    DmaRace {
        #[arg(long)]
        device: u32,
        #[arg(long)]
        size: u64,
        #[arg(long)]
        ready: PathBuf,
    },
    /// VERSION with an ABI 0.3 binary's smaller struct is accepted.
    ArgszOld,
    /// Two readers block in read() on one file: poll answers at once and
    /// both sleep interruptibly; two events release them.
    EventsBlockedRead,
    /// Random ioctls and mmaps: only errnos come back.
    Fuzz {
        #[arg(long, default_value_t = 10_000)]
        iterations: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Prints a failed check and turns it into the exit status.
fn report(result: common::CheckResult) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pcieipc-guest: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::PingPong { members, rounds } => report(pingpong::run(members, rounds)),
        Command::PingPongMember {
            position,
            members,
            rounds,
        } => report(pingpong::member(position, members, rounds)),
        Command::WaitTimeout { timeout_ms } => report(waits::timeout(timeout_ms)),
        Command::WaitEintr => report(waits::eintr()),
        Command::CpuTime { ms } => report(waits::cpu_time_compare(ms)),
        Command::CpuTimeChild { mode, ms } => match mode.as_str() {
            "wait" => report(waits::cpu_time_child(false, ms)),
            "spin" => report(waits::cpu_time_child(true, ms)),
            _ => report(Err(format!("cpu-time-child: unknown mode {mode:?}"))),
        },
        Command::MmapChecks => report(windows::run()),
        Command::MmapGone { device } => report(windows::gone(device)),
        Command::MmapTouch {
            device,
            witness,
            ready,
            go,
        } => report(windows::touch(device, witness, &ready, &go)),
        Command::DmaCopy { kind, sizes } => report(dma::copy(&kind, &sizes)),
        Command::DmaErrors => report(dma::errors()),
        Command::DmaBar => report(dma::bar()),
        Command::RawPci { expect } => report(lockdown::run(&expect)),
        Command::BarCopyLong {
            rounds,
            max_latency_ms,
        } => report(long_copy::run(rounds, max_latency_ms)),
        Command::CapsCheck => report(caps::run()),
        Command::MmapNode { node, device, bar } => report(mappings::mmap_node(&node, device, bar)),
        Command::DmaTouch {
            device,
            size,
            ready,
            go,
        } => report(mappings::dma_touch(device, size, &ready, &go)),
        Command::IntxLevel { device, bdf } => report(mappings::intx_level(device, &bdf)),
        Command::IntxShared { edu, nic, nic_bdf } => {
            report(mappings::intx_shared(edu, nic, &nic_bdf))
        }
        Command::ResetMapping { device, offset } => report(mappings::reset_mapping(device, offset)),
        Command::DmaReach {
            device,
            buffers,
            size,
        } => report(mappings::dma_reach(device, buffers, size)),
        Command::DmaRace {
            device,
            size,
            ready,
        } => report(mappings::dma_race(device, size, &ready)),
        Command::ArgszOld => report(abi::old_struct()),
        Command::EventsBlockedRead => report(events::blocked_read()),
        Command::Fuzz { iterations, seed } => report(fuzz::run(iterations, seed)),
        Command::Tree { expect, sysfs } => {
            let expected: Result<Vec<TreeLine>, String> = match std::fs::read_to_string(&expect) {
                Ok(text) => text
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(str::parse)
                    .collect(),
                Err(e) => Err(format!("{}: {e}", expect.display())),
            };
            let expected = match expected {
                Ok(lines) => lines,
                Err(e) => {
                    eprintln!("pcieipc-guest: {e}");
                    return ExitCode::from(2);
                }
            };
            let actual = match scan(&sysfs) {
                Ok(lines) => lines,
                Err(e) => {
                    eprintln!("pcieipc-guest: {e}");
                    return ExitCode::from(2);
                }
            };
            for line in &actual {
                println!("{line}");
            }
            let problems = compare(&expected, &actual);
            for problem in &problems {
                eprintln!("pcieipc-guest: tree: {problem}");
            }
            if problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
