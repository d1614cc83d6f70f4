//! The engine's typed errors. Every error that concerns another rank names it, so
//! a failed job says which process to look at.

use std::io;
use std::time::Duration;

use super::call::CallDescriptor;
use super::schedule::Algorithm;

impl EngineError {
    /// `error`, a transport's or a backend's own, on `rank`.
    pub(crate) fn transport(
        rank: usize,
        transport: &'static str,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> EngineError {
        EngineError::Transport {
            rank,
            transport,
            error: Box::new(error),
        }
    }

    /// `BufferLength` unless a buffer holds the `expected` elements.
    pub(crate) fn check_length(
        what: &'static str,
        got: usize,
        expected: usize,
    ) -> Result<(), EngineError> {
        if got == expected {
            Ok(())
        } else {
            Err(EngineError::BufferLength {
                what,
                got,
                expected,
            })
        }
    }
}

/// Why a collective or the rendezvous failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("rank {rank} is out of range for a communicator of {nranks} ranks")]
    RankOutOfRange { rank: usize, nranks: usize },

    #[error("a communicator needs at least one rank, got nranks = 0")]
    NoRanks,

    #[error("rendezvous {name:?}: another rank 0 already listens there")]
    RendezvousInUse { name: String },

    #[error("rendezvous {name:?}: {context}: {source}")]
    RendezvousIo {
        name: String,
        context: &'static str,
        #[source]
        source: io::Error,
    },

    #[error("rendezvous {name:?}: rank {rank} sent a malformed message: {reason}")]
    RendezvousProtocol {
        name: String,
        rank: usize,
        reason: String,
    },

    #[error("rank {rank} never joined the rendezvous within {waited:?}")]
    RankNeverJoined { rank: usize, waited: Duration },

    #[error(
        "rendezvous {name:?}: rank 0 failed to set up the transport before admitting the \
         ranks (its own error says why)"
    )]
    HostFailed { name: String },

    #[error(
        "rendezvous {name:?}: rank 0 refused this rank's job secret (the launcher must hand \
         every rank the same PCIEIPC_JOB_SECRET)"
    )]
    WrongSecret { name: String },

    #[error("rank {rank} joined twice (a second process claims the same rank)")]
    DuplicateRank { rank: usize },

    #[error("rank {rank} was started for {its_nranks} ranks, this communicator has {nranks}")]
    RankCountMismatch {
        rank: usize,
        its_nranks: usize,
        nranks: usize,
    },

    #[error("window sizes out of range: {reason}")]
    BadWindowSizes { reason: String },

    #[error(
        "rendezvous {name:?} is held by a process of uid {uid} (pid {pid}), not by this \
         user's rank 0: refusing to join"
    )]
    RendezvousForeign { name: String, uid: u32, pid: i32 },

    #[error("rank {rank}: rank {peer} published {what}")]
    PeerCorrupt {
        rank: usize,
        peer: usize,
        what: super::failure::Corruption,
    },

    #[error("shared segment of {bytes} bytes: {context}: {source}")]
    SharedMemory {
        bytes: usize,
        context: &'static str,
        #[source]
        source: io::Error,
    },

    // `error` is printed, not chained as a source: a transport's own
    // messages already carry its device, path or step and the errno.
    #[error("rank {rank}: {transport} transport: {error}")]
    Transport {
        rank: usize,
        /// The transport's (or backend's) registered name.
        transport: &'static str,
        error: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error("rank {rank} (pid {pid}) exited")]
    PeerDied { rank: usize, pid: u32 },

    #[error("rank {rank} left the communicator while others still needed it")]
    PeerLeft { rank: usize },

    #[error("rank {rank} made no progress for {waited:?} (it is alive but not in the collective)")]
    PeerUnresponsive { rank: usize, waited: Duration },

    #[error("rank {rank} called {call}, but rank {peer} called {peer_call}")]
    MismatchedCall {
        rank: usize,
        call: CallDescriptor,
        peer: usize,
        peer_call: CallDescriptor,
    },

    #[error(
        "rank {rank} could not read rank {owner}'s buffer with process_vm_readv ({}): \
         single-copy reads need buffers in ordinary process memory, not a device mapping; \
         turn them off for such buffers (CommOptions::single_copy = false, \
         pcieipc bench --single-copy off)",
        io::Error::from_raw_os_error(*errno)
    )]
    PeerMemoryUnreadable {
        rank: usize,
        owner: usize,
        errno: i32,
    },

    #[error("{what}: got {got} elements, expected {expected}")]
    BufferLength {
        what: &'static str,
        got: usize,
        expected: usize,
    },

    #[error("binding this rank to CPU {cpu}: {source}")]
    BindCpu {
        cpu: usize,
        #[source]
        source: io::Error,
    },

    #[error("rank {rank}'s GPU work failed (its own error says why)")]
    PeerGpuFailed { rank: usize },

    #[error("rank {rank}: the buffer is on GPU {buffer_gpu}, the communicator on GPU {gpu}")]
    WrongGpu {
        rank: usize,
        buffer_gpu: usize,
        gpu: usize,
    },

    #[error("rank {rank} and rank {peer} registered different buffers: {detail}")]
    MismatchedRegistration {
        rank: usize,
        peer: usize,
        detail: String,
    },

    #[error("the {algorithm} algorithm is not available here: {reason}")]
    AlgorithmUnavailable {
        algorithm: Algorithm,
        reason: &'static str,
    },

    #[error(
        "rank {rank}: device {device} reported {bits}; the kernel's recovery: {recovery} \
         (docs/fault-path.md, the AER action matrix)"
    )]
    DeviceFault {
        rank: usize,
        device: String,
        bits: super::fault_policy::FaultBits,
        recovery: super::fault_policy::Recovery,
    },

    #[error(
        "rank {rank}: device {device} was removed (DEVICE_GONE: hot-unplugged, unbound, or its \
         config space reads all ones); the ranks cannot go on without it (docs/fault-path.md, \
         surprise removal)"
    )]
    DeviceRemoved { rank: usize, device: String },

    #[error(
        "rank {rank}: message {message} in rank {peer}'s {carrier} failed its checksum on all \
         {reads} reads (re-read and resent): the data crossing the link stays damaged \
         (docs/fault-path.md, chunk checksums)"
    )]
    DamagedMessage {
        rank: usize,
        peer: usize,
        carrier: super::failure::Carrier,
        message: u32,
        reads: u32,
    },

    #[error("rank {rank}: {source}")]
    FollowDevice {
        rank: usize,
        #[source]
        source: super::followed_device::FollowError,
    },

    #[error("rank {rank}: damage injection needs chunk checksums on (they are off)")]
    DamageWithoutChecksums { rank: usize },

    #[error("broadcast root {root} is out of range for {nranks} ranks")]
    RootOutOfRange { root: usize, nranks: usize },
}
