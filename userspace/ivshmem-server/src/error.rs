//! Every way the server can fail, each carrying the socket path or peer id it concerns.

use std::io;
use std::path::PathBuf;

use nix::errno::Errno;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "shared memory size {size} is not a power of two \
         (QEMU maps it as a PCI BAR, and BAR sizes are powers of two)"
    )]
    ShmSizeNotPowerOfTwo { size: u64 },
    #[error("shared memory size {size} is below the minimum of {min} bytes (one page)")]
    ShmSizeTooSmall { size: u64, min: u64 },
    #[error("{vectors} interrupt vectors per peer requested; the server supports 1 to {max}")]
    VectorCountOutOfRange { vectors: u16, max: u16 },
    #[error("the peer limit must be at least 1")]
    MaxPeersZero,
    #[error(
        "invalid size {text:?}: expected a byte count with an optional K, M or G suffix, e.g. 4M"
    )]
    InvalidSizeText { text: String },

    #[error("{}: the directory for the socket does not exist", path.display())]
    SocketDirMissing { path: PathBuf },
    #[error("{}: another server is listening on this socket", path.display())]
    SocketInUse { path: PathBuf },
    #[error("{}: exists and is not a socket; refusing to replace it", path.display())]
    PathNotSocket { path: PathBuf },
    #[error("{}: cannot check whether the existing socket is live: {source}", path.display())]
    ProbeExistingSocket { path: PathBuf, source: io::Error },
    #[error("{}: cannot remove the stale socket: {source}", path.display())]
    RemoveStaleSocket { path: PathBuf, source: io::Error },
    #[error("{}: cannot bind the listening socket: {source}", path.display())]
    Bind { path: PathBuf, source: io::Error },

    #[error("cannot create the shared memory memfd: {source}")]
    CreateShm { source: Errno },
    #[error("cannot size the shared memory to {size} bytes: {source}")]
    SizeShm { size: u64, source: Errno },
    #[error("cannot seal the size of the shared memory: {source}")]
    SealShm { source: Errno },

    #[error("cannot create the eventfd that stops the server: {source}")]
    CreateStopEvent { source: Errno },
    #[error("cannot signal the server on {} to stop: {source}", path.display())]
    SignalStop { path: PathBuf, source: Errno },
    #[error("cannot block SIGINT and SIGTERM for the signalfd: {source}")]
    BlockSignals { source: Errno },
    #[error("cannot create the signalfd for SIGINT and SIGTERM: {source}")]
    CreateSignalFd { source: Errno },
    #[error("{}: cannot start the server thread: {source}", path.display())]
    SpawnThread { path: PathBuf, source: io::Error },
    #[error("{}: the server thread panicked", path.display())]
    ServerThreadPanicked { path: PathBuf },

    #[error("{}: poll failed: {source}", path.display())]
    Poll { path: PathBuf, source: Errno },
    #[error("{}: accept failed: {source}", path.display())]
    Accept { path: PathBuf, source: io::Error },

    #[error("{}: refused a connection: all {max_peers} peer ids are in use", path.display())]
    PeersFull { path: PathBuf, max_peers: u16 },
    #[error("peer {peer_id}: cannot set the send timeout on its socket: {source}")]
    ConfigurePeerSocket { peer_id: u16, source: io::Error },
    #[error("peer {peer_id}: cannot create the eventfd for vector {vector}: {source}")]
    CreatePeerEventfd {
        peer_id: u16,
        vector: u16,
        source: Errno,
    },
    #[error("peer {peer_id}: send failed, dropping the peer: {source}")]
    SendToPeer { peer_id: u16, source: Errno },
}
