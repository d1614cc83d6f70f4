//! `pcieipc-testbed`: run a topology file and a guest script in QEMU.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use pcieipc_testbed::{
    qmp::Qmp,
    run::{run, RunConfig},
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

#[derive(Subcommand)]
enum Command {
    /// Boot a VM with the fabric of TOPOLOGY and run GUEST (a shell script) in it.
    Run {
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
    },
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
        Command::Run {
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
        } => {
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
                echo_console: !quiet,
            };
            match run(&config) {
                Ok(outcome) => {
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
