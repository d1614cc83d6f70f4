//! `pcieipc`: the command-line front end. Each subcommand lives in its own
//! file and only parses flags, calls the library and prints.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod bench_collective;
mod bench_latency;
mod cmd_bench;
mod cmd_completions;
mod cmd_device;
mod cmd_events;
mod cmd_link;
mod cmd_man_pages;
mod cmd_monitor;
mod cmd_probe;
mod cmd_trace;
mod cmd_version;
mod html;
mod latency_svg;
mod monitor_service;
mod output;
mod probe_text;
mod probe_watch;
mod trace_svg;

#[derive(Parser)]
#[command(
    name = "pcieipc",
    about = "PCIe peer-to-peer AllReduce, topology and link health",
    disable_version_flag = true,
    arg_required_else_help = true
)]
struct Cli {
    /// Print the version, the commit it was built from, the ABI it speaks and the loaded
    /// module's (where /dev/pcieipc exists).
    #[arg(short = 'V', long)]
    version: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// PCIe topology, link health, AER counters, P2P readiness and the optimal ring.
    Probe(cmd_probe::Args),
    /// nccl-tests style AllReduce benchmark over local ranks.
    // Boxed: its flags make it several times larger than the others.
    Bench(Box<cmd_bench::Args>),
    /// Talk to the pcieipc kernel module through /dev/pcieipc.
    Device(cmd_device::Args),
    /// Link status, retraining and watching of any PCI function (needs the module).
    Link(cmd_link::Args),
    /// Stream AER, link and device events (module, tracefs, AER counters) until interrupted;
    /// store them (--store) and serve Prometheus metrics (--metrics).
    Monitor(cmd_monitor::Args),
    /// The events a monitor stored (--store): listed, or counted per device and error.
    Events(cmd_events::Args),
    Trace(cmd_trace::Args),
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell).
    Completions(cmd_completions::Args),
    /// Write the man pages, pcieipc.1 and one per subcommand, into a directory.
    ManPages(cmd_man_pages::Args),
}

fn main() -> ExitCode {
    end_quietly_on_closed_stdout();
    let cli = Cli::parse();
    let Some(command) = cli.command.filter(|_| !cli.version) else {
        return match cmd_version::run() {
            Ok(code) => code,
            Err(err) => {
                output::eprint_line(&format!("pcieipc: error: {err:#}"));
                ExitCode::from(2)
            }
        };
    };
    let result = match command {
        Command::Probe(args) => cmd_probe::run(args),
        Command::Bench(args) => cmd_bench::run(*args),
        Command::Device(args) => cmd_device::run(args),
        Command::Link(args) => cmd_link::run(args),
        Command::Monitor(args) => cmd_monitor::run(args),
        Command::Events(args) => cmd_events::run(args),
        Command::Trace(args) => cmd_trace::run(args),
        Command::Completions(args) => cmd_completions::run(args, Cli::command()),
        Command::ManPages(args) => cmd_man_pages::run(args, Cli::command()),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            output::eprint_line(&format!("pcieipc: error: {err:#}"));
            ExitCode::from(2)
        }
    }
}

/// Rust starts programs with SIGPIPE ignored, so output into a closed pipe
/// (`pcieipc probe | head -3`) made `println!` panic with a backtrace. A
/// command-line filter ends quietly there instead, killed by the signal, as
/// the shell expects.
fn end_quietly_on_closed_stdout() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: the default disposition installs no handler of ours, so
    // nothing can run in a signal context; this runs first in `main`,
    // before any thread starts.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}
