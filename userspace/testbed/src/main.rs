//! `pcieipc-testbed`: run a topology file and a guest script in QEMU.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use pcieipc_testbed::{
    qmp::Qmp,
    run::{kernel_log, run, Echo, RunConfig},
};

#[derive(Parser)]
#[command(
    name = "pcieipc-testbed",
    version,
    about = "QEMU PCIe testbed for pcieipc and PCIe drivers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Topology file (docs/topology-format.md).
    #[arg(long)]
    topology: PathBuf,
    /// Guest shell script; /testbed/lib.sh is sourced before it.
    #[arg(long)]
    guest: PathBuf,
    /// Kernel image (bzImage).
    #[arg(long, env = "PCIEIPC_KERNEL")]
    kernel: PathBuf,
    /// Kernel module put in the guest's /lib/modules.
    #[arg(long)]
    module: Option<PathBuf>,
    /// Program copied to the guest's /bin (with its shared libraries); repeatable.
    #[arg(long = "bin")]
    binaries: Vec<PathBuf>,
    /// Script run on the host during the guest's run; PCIEIPC_TESTBED_QMP names a QMP socket.
    #[arg(long)]
    host_script: Option<PathBuf>,
    /// QEMU binary.
    #[arg(long, env = "PCIEIPC_QEMU", default_value = "qemu-system-x86_64")]
    qemu: PathBuf,
    /// QEMU firmware directory (-L); repeatable. Default: PCIEIPC_QEMU_FIRMWARE, then Debian's.
    #[arg(long = "firmware")]
    firmware_dirs: Vec<PathBuf>,
    /// Time limit in seconds (default: the topology's vm.timeout_s, else 300).
    #[arg(long)]
    timeout: Option<u64>,
    /// One more QEMU argument, after the harness's own (e.g. -d for
    /// QEMU's logs, or -S to start it paused); repeatable.
    #[arg(long = "qemu-arg", allow_hyphen_values = true)]
    qemu_args: Vec<String>,
    /// Do not echo the guest console.
    #[arg(long)]
    quiet: bool,
    /// Write the whole guest console here, and echo it without the guest's kernel log
    /// (shown only when the run fails).
    #[arg(long)]
    console_log: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Boot a VM with the fabric of TOPOLOGY and run GUEST (a shell script) in it.
    // Boxed: its flags make it several times larger than the other.
    Run(Box<RunArgs>),
    /// Send a human monitor command over a QMP socket (for host scripts).
    Hmp {
        /// QMP socket (PCIEIPC_TESTBED_QMP in a host script).
        #[arg(long, env = "PCIEIPC_TESTBED_QMP")]
        socket: PathBuf,
        /// The monitor command line, e.g. "pcie_aer_inject_error rp1 COMP_TIME".
        command: String,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run(args) => {
            let RunArgs {
                topology,
                guest,
                kernel,
                module,
                binaries,
                host_script,
                qemu,
                mut firmware_dirs,
                timeout,
                qemu_args,
                quiet,
                console_log,
            } = *args;
            if firmware_dirs.is_empty() {
                firmware_dirs.extend(std::env::var_os("PCIEIPC_QEMU_FIRMWARE").map(PathBuf::from));
                firmware_dirs.extend(["/usr/share/seabios", "/usr/share/qemu"].map(PathBuf::from));
            }
            let config = RunConfig {
                topology,
                guest_script: guest,
                kernel,
                module,
                binaries,
                host_script,
                qemu,
                firmware_dirs,
                timeout: timeout.map(Duration::from_secs),
                extra_qemu_args: qemu_args,
                echo: match (quiet, &console_log) {
                    (true, _) => Echo::Nothing,
                    (false, Some(_)) => Echo::AllButKernelLog,
                    (false, None) => Echo::All,
                },
            };
            match run(&config) {
                Ok(outcome) => {
                    if let Some(path) = &console_log {
                        if let Err(err) = std::fs::write(path, outcome.console.join("\n") + "\n") {
                            eprintln!("pcieipc-testbed: error: writing {}: {err}", path.display());
                            return ExitCode::from(2);
                        }
                        if !outcome.passed() && config.echo == Echo::AllButKernelLog {
                            for line in kernel_log(&outcome.console).unwrap_or_default() {
                                println!("{line}");
                            }
                        }
                    }
                    for line in &outcome.kernel_log_failures {
                        eprintln!("pcieipc-testbed: guest kernel log: {line}");
                    }
                    if outcome.passed() {
                        eprintln!("pcieipc-testbed: {}: passed", config.guest_script.display());
                        ExitCode::SUCCESS
                    } else {
                        eprintln!(
                            "pcieipc-testbed: {}: FAILED (guest exit {}, {} kernel log problem(s))",
                            config.guest_script.display(),
                            outcome.guest_exit,
                            outcome.kernel_log_failures.len()
                        );
                        ExitCode::FAILURE
                    }
                }
                Err(err) => {
                    eprintln!("pcieipc-testbed: error: {err}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Hmp { socket, command } => {
            match Qmp::connect(&socket).and_then(|mut q| q.hmp(&command)) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("pcieipc-testbed: error: {err}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
