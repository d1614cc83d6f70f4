//! `pcieipc-ivshmem-server --socket PATH --size BYTES --vectors N`: serves ivshmem-doorbell
//! devices until SIGINT or SIGTERM, then removes the socket.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use pcieipc_ivshmem_server::{parse_size, run_until_signal, ServerConfig, DEFAULT_MAX_PEERS};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "ivshmem server (QEMU ivshmem-spec) for ivshmem-doorbell devices"
)]
struct Args {
    /// UNIX socket for QEMU's `-chardev socket,path=...`.
    #[arg(long)]
    socket: PathBuf,
    /// Shared memory size in bytes, a power of two; K, M and G suffixes accepted (e.g. 4M).
    #[arg(long, value_parser = parse_size)]
    size: u64,
    /// Interrupt vectors per peer; match the device's `vectors=`.
    #[arg(long)]
    vectors: u16,
    /// Peers served at once (peer ids 0..N); further connections are refused.
    #[arg(long, default_value_t = DEFAULT_MAX_PEERS)]
    max_peers: u16,
}

fn main() -> ExitCode {
    let args = Args::parse();
    raise_open_file_limit(args.max_peers, args.vectors);
    let config = ServerConfig {
        socket_path: args.socket,
        shm_size: args.size,
        vectors: args.vectors,
        max_peers: args.max_peers,
    };
    match run_until_signal(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pcieipc-ivshmem-server: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The server holds a socket and an eventfd per vector for every peer (64 peers x 64 vectors
/// passes the usual soft limit of 1024), and the kernel caps fds in flight over SCM_RIGHTS at
/// the same limit; the soft limit is raised to the hard one when that is not enough.
fn raise_open_file_limit(max_peers: u16, vectors: u16) {
    // Listening socket, shared memory, signalfd, stdio and a margin for the probe connection.
    let needed = u64::from(max_peers) * (u64::from(vectors) + 1) + 16;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= needed {
        return;
    }
    if let Err(errno) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        eprintln!("pcieipc-ivshmem-server: cannot raise the open file limit from {soft} to {hard}: {errno}");
    }
    if hard < needed {
        eprintln!(
            "pcieipc-ivshmem-server: open file limit {hard} is below the {needed} that \
             {max_peers} peers with {vectors} vectors need; peers past it will be dropped"
        );
    }
}
