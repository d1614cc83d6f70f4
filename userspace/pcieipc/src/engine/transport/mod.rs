//! What the engine needs from a transport, and nothing more: windows a rank
//! writes and its peers read, counters a rank publishes and its peers wait on,
//! peer liveness, and a small shared control block (published calls, who waits
//! for whom, the abort record).
//!
//! The shm transport keeps all of it in one memfd segment and sleeps on
//! futexes. The pcieipc transport maps the same windows onto the ivshmem BAR,
//! rings the sleeping peer's doorbell in `store` and waits on its own MSI-X
//! interrupt in `sleep`; a CUDA transport maps them onto IPC device memory. The algorithms in
//! the communicator never see which.

use std::time::Duration;

use super::call::CallDescriptor;
use super::chunk::LinkFacts;
use super::failure::Failure;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// A memfd segment in host memory shared by ranks on one host.
    Shm,
    /// The shared BAR2 of ivshmem-doorbell devices bound by /dev/pcieipc,
    /// doorbells and MSI-X interrupt waits.
    Pcieipc,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Shm => "shm",
            TransportKind::Pcieipc => "pcieipc",
        }
    }
}

impl std::str::FromStr for TransportKind {
    type Err = UnknownTransport;
    fn from_str(name: &str) -> Result<TransportKind, UnknownTransport> {
        match name {
            "shm" => Ok(TransportKind::Shm),
            "pcieipc" => Ok(TransportKind::Pcieipc),
            _ => Err(UnknownTransport(name.to_owned())),
        }
    }
}

/// A transport name this build does not provide.
#[derive(Debug, thiserror::Error)]
#[error("unknown transport {0:?} (this build provides: shm, pcieipc)")]
pub struct UnknownTransport(pub String);

/// A window its owner writes and its peers read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// A slot of the stream of first ring steps (the rank's raw input), which
    /// may run ahead of the rest: see docs/engine.md.
    Raw { slot: usize },
    /// A slot of the stream of all later ring steps and of broadcast.
    Relay { slot: usize },
    /// One of the two one-shot buffers, alternated between calls so a rank can
    /// publish the next call while a slow peer still reads the previous one.
    OneShot { parity: usize },
}

/// A counter published in shared memory. `*Posted` counts messages its owner has
/// written to its windows; `*Consumed` counts those its successor has finished
/// reading (written by the successor into the owner's block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    RawPosted = 0,
    RawConsumed = 1,
    RelayPosted = 2,
    RelayConsumed = 3,
    OneShotPosted = 4,
    /// Calls rank 0 has published (only rank 0's counts): its descriptor
    /// carries each ring call's chunk size, which the other ranks adopt.
    CallsPublished = 5,
    /// The single-copy probe at init (shm): 1 once this rank has published
    /// its probe word, then 2 if it read its predecessor's back with
    /// `process_vm_readv`, 3 if it could not or would not.
    Probed = 6,
}

pub(crate) const SIGNALS: [Signal; 7] = [
    Signal::RawPosted,
    Signal::RawConsumed,
    Signal::RelayPosted,
    Signal::RelayConsumed,
    Signal::OneShotPosted,
    Signal::CallsPublished,
    Signal::Probed,
];

/// The window sizes all ranks agreed on at the rendezvous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSizes {
    /// Bytes in one Raw or Relay slot: the largest chunk.
    pub slot_bytes: usize,
    pub raw_slots: usize,
    pub relay_slots: usize,
    /// Bytes in each of the two one-shot buffers.
    pub one_shot_bytes: usize,
}

/// The shared state of a communicator, as a transport provides it.
///
/// Counters follow release/acquire: a `store` publishes every write its owner
/// made to its windows before it, a `load` that observes it makes them visible.
pub trait Transport: Send {
    fn kind(&self) -> TransportKind;
    fn rank(&self) -> usize;
    fn nranks(&self) -> usize;
    fn sizes(&self) -> WindowSizes;

    /// The start of `owner`'s `window`, valid for the window's size for the
    /// transport's lifetime. Only the owner writes through it, and only while no
    /// peer may read it (the counters say when).
    fn window(&self, owner: usize, window: Window) -> *mut u8;

    fn load(&self, owner: usize, signal: Signal) -> u32;
    /// Sets `owner`'s `signal` and wakes whoever sleeps on it.
    fn store(&self, owner: usize, signal: Signal, value: u32);
    /// Sleeps until `owner`'s `signal` may differ from `observed`, or `slice`
    /// passes, whichever is first. Never spins.
    fn sleep(&self, owner: usize, signal: Signal, observed: u32, slice: Duration);

    /// The peers whose processes have exited, with their pids.
    fn dead_peers(&self) -> Vec<(usize, u32)>;

    /// Tells peers which rank this one is blocked on (`None`: running).
    fn set_blocked_on(&self, peer: Option<usize>);
    fn blocked_on(&self, rank: usize) -> Option<usize>;
    /// Marks this rank as gone (its communicator was dropped).
    fn set_departed(&self);
    fn departed(&self, rank: usize) -> bool;

    /// Publishes this rank's descriptor of its `seq`-th call.
    fn publish_call(&self, seq: u64, call: CallDescriptor);
    /// `owner`'s descriptor of its `seq`-th call, once it has published it.
    fn published_call(&self, owner: usize, seq: u64) -> Option<CallDescriptor>;

    /// Publishes the link under this rank's ring hop (`None`: host memory),
    /// from which the rank deciding a call's chunk size takes its wish.
    fn publish_link(&self, link: Option<LinkFacts>);
    fn published_link(&self, rank: usize) -> Option<LinkFacts>;

    /// The pid of `rank`'s process.
    fn pid(&self, rank: usize) -> u32;

    /// Single-copy reads: publishes, in this rank's control block, the
    /// address in this process of that very word, for a peer to read back
    /// from this process with `process_vm_readv` and so prove that it may.
    /// `messages` (the ranges of message sizes for which this rank would
    /// read straight from peers: the ring's all-gather's, then the direct
    /// algorithm's, each as first and last) goes with it, for the ranks to
    /// check that they agree. False (and nothing published) where peers must
    /// not read this process's memory: every transport but shm.
    fn publish_probe(&self, _messages: [u64; 4]) -> bool {
        false
    }
    /// The address and the message ranges `rank` published with
    /// `publish_probe` (address 0 while none).
    fn probe(&self, _rank: usize) -> (u64, [u64; 4]) {
        (0, [0; 4])
    }

    /// Records `failure` unless another is recorded already, wakes every
    /// sleeper, and returns the failure that stands.
    fn abort(&self, failure: Failure) -> Failure;
    fn failure(&self) -> Option<Failure>;
}
