//! ivshmem server for pcieipc's QEMU testbed: the server side of the protocol in QEMU's
//! docs/specs/ivshmem-spec.rst, giving every `ivshmem-doorbell` device that connects the same
//! shared memory and an eventfd per peer and vector to ring the others with.
//!
//! [`spawn`] serves from a background thread (for the testbed harness); [`run_until_signal`]
//! serves in the calling thread until SIGINT or SIGTERM (for the binary).

mod config;
mod error;
mod protocol;
mod server;
mod shm;
mod socket;

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

pub use config::{parse_size, ServerConfig, DEFAULT_MAX_PEERS, MAX_VECTORS, MIN_SHM_SIZE};
pub use error::Error;
pub use protocol::{PROTOCOL_VERSION, REFUSED_VERSION, SHM_MESSAGE};

use server::Server;

/// A server serving from its own thread. Dropping it stops the thread, closes every peer, the
/// shared memory and the eventfds, and removes the socket file; [`RunningServer::shutdown`] does
/// the same and returns the loop's error, if it ended with one.
pub struct RunningServer {
    socket_path: PathBuf,
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<Result<(), Error>>>,
}

/// Validates `config`, creates the shared memory, binds the socket and starts serving. The
/// socket accepts connections once this returns.
pub fn spawn(config: ServerConfig) -> Result<RunningServer, Error> {
    let stop = Arc::new(
        EventFd::from_flags(EfdFlags::EFD_CLOEXEC)
            .map_err(|source| Error::CreateStopEvent { source })?,
    );
    let mut server = Server::bind(&config)?;
    let thread_stop = Arc::clone(&stop);
    let thread = thread::Builder::new()
        .name("ivshmem-server".to_owned())
        .spawn(move || server.serve_until(thread_stop.as_fd()))
        .map_err(|source| Error::SpawnThread {
            path: config.socket_path.clone(),
            source,
        })?;
    Ok(RunningServer {
        socket_path: config.socket_path,
        stop,
        thread: Some(thread),
    })
}

impl RunningServer {
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Stops serving and waits until every fd is closed and the socket file is removed.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), Error> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.stop.write(1).map_err(|source| Error::SignalStop {
            path: self.socket_path.clone(),
            source,
        })?;
        thread.join().map_err(|_| Error::ServerThreadPanicked {
            path: self.socket_path.clone(),
        })?
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Err(error) = self.stop_and_join() {
            eprintln!("pcieipc-ivshmem-server: {error}");
        }
    }
}

/// Serves in the calling thread until SIGINT or SIGTERM, then closes everything and removes the
/// socket file. SIGINT and SIGTERM are blocked in the calling thread and read from a signalfd;
/// call this before starting other threads, since a thread started earlier keeps them unblocked
/// and a signal delivered to it would end the process without cleanup.
pub fn run_until_signal(config: ServerConfig) -> Result<(), Error> {
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals
        .thread_block()
        .map_err(|source| Error::BlockSignals { source })?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC)
        .map_err(|source| Error::CreateSignalFd { source })?;
    let mut server = Server::bind(&config)?;
    server.serve_until(signal_fd.as_fd())
}
