//! The contract between the engine and a transport: the `Transport` trait
//! and the small types it speaks in.

use std::time::Duration;

use crate::engine::call::CallDescriptor;
use crate::engine::chunk::LinkFacts;
use crate::engine::failure::Failure;
use crate::engine::fault_policy::{Fault, Recovery};

/// What one poll of a device link found.
#[derive(Debug, Default)]
pub struct LinkPoll {
    /// The link's facts, if they changed.
    pub facts: Option<LinkFacts>,
    /// The faults reported on it, oldest first.
    pub faults: Vec<Fault>,
    /// Other devices the module reported lost, for the transport to
    /// attribute to the peers whose devices they are (or to drop); a
    /// transport returns none of these from `Transport::poll_link`.
    pub lost_elsewhere: Vec<Fault>,
}

/// What a transport lets the engine do beyond windows and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Ranks may read each other's process memory (`read_peer`), so finished
    /// chunks can be read where they lie (the single-copy all-gather, the
    /// direct all_reduce). Still probed at init: the host may forbid it.
    pub peer_reads: bool,
    /// The transport follows the link under its device and reports changes
    /// (`device_link`, `poll_link`).
    pub link_events: bool,
    /// The windows live in device memory (a BAR), not host memory.
    pub device_memory: bool,
}

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
    /// The rank's backend area (`WindowSizes::backend_bytes`).
    Backend,
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
    /// Chunk checksums: the message of this rank's streams its successor
    /// wants written again (stream in bit 31: 0 Raw, 1 Relay; the low 31 bits
    /// of the message's number), written by the successor before it counts
    /// the request in `ResendRequests`.
    ResendWanted = 7,
    /// Resends the successor has asked this rank for (written by the successor).
    ResendRequests = 8,
    /// Resends this rank has made (its own).
    Resent = 9,
}

pub(crate) const SIGNALS: [Signal; 10] = [
    Signal::RawPosted,
    Signal::RawConsumed,
    Signal::RelayPosted,
    Signal::RelayConsumed,
    Signal::OneShotPosted,
    Signal::CallsPublished,
    Signal::Probed,
    Signal::ResendWanted,
    Signal::ResendRequests,
    Signal::Resent,
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
    /// Bytes of each rank's backend area (0: none): memory the engine never
    /// touches, for a backend layered on the communicator whose devices read
    /// and write the segment themselves (the CUDA hand-off through host
    /// memory registers it with the GPU).
    pub backend_bytes: usize,
}

/// The shared state of a communicator, as a transport provides it.
///
/// Counters follow release/acquire: a `store` publishes every write its owner
/// made to its windows before it, a `load` that observes it makes them visible.
pub trait Transport: Send {
    /// The name it is registered under.
    fn name(&self) -> &'static str;
    fn capabilities(&self) -> Capabilities;
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

    /// What `sleep` waits in, as a trace names it.
    fn sleep_name(&self) -> &'static str;

    /// From now on, note when a store wakes a sleeping peer (tracing).
    fn log_wakes(&mut self);

    /// The wakes noted since the last call (CLOCK_MONOTONIC ns).
    fn take_wakes(&self) -> Vec<u64>;

    /// How a store wakes a sleeper, as a trace names it.
    fn wake_name(&self) -> &'static str;

    /// The peers whose processes have exited, with their pids.
    fn dead_peers(&self) -> Vec<(usize, u32)>;
    /// Every rank's pid (the kernel's, from the rendezvous).
    fn pids(&self) -> Vec<u32>;

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

    /// Peer reads: publishes, in this rank's control block, the address in
    /// this process of that very word, for a peer to read back with
    /// `read_peer` and so prove that it may. `messages` (the ranges of
    /// message sizes for which this rank would read straight from peers:
    /// the ring's all-gather's, then the direct algorithm's, each as first
    /// and last) goes with it, for the ranks to check that they agree. False
    /// (and nothing published) where peers may not read this process's
    /// memory.
    fn publish_probe(&self, _messages: [u64; 4]) -> bool {
        false
    }
    /// The address and the message ranges `rank` published with
    /// `publish_probe` (address 0 while none).
    fn probe(&self, _rank: usize) -> (u64, [u64; 4]) {
        (0, [0; 4])
    }
    /// Copies `into.len()` bytes at `address` in `owner`'s process into
    /// `into`: only where `capabilities().peer_reads`, and only memory the
    /// owner has said it will not change until this rank is done.
    fn read_peer(&self, _owner: usize, _address: u64, _into: &mut [u8]) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }

    /// Withdraws what `publish_probe` allowed (the ranks did not agree on
    /// peer reads); dropping the transport does the same.
    fn end_peer_reads(&self) {}

    /// The link under this rank's device as the transport sees it at init,
    /// where it follows one (`capabilities().link_events`).
    fn device_link(&self) -> Option<LinkFacts> {
        None
    }
    /// The device link's facts if they changed since the last poll, and the
    /// faults reported on it since; never blocks.
    fn poll_link(&mut self) -> LinkPoll {
        LinkPoll::default()
    }
    /// Retrains the device link if it reads degraded and returns its facts
    /// after; `None` when it is not degraded or the transport follows none.
    fn retrain_degraded_link(&mut self) -> Option<LinkFacts> {
        None
    }
    /// Waits at most `bound` for the kernel's recovery of the device from
    /// the last fault `poll_link` reported to end. A transport that follows
    /// no device reports no fault, and sees no recovery.
    fn await_recovery(&mut self, _bound: Duration) -> Recovery {
        Recovery::Unfinished { waited_ms: 0 }
    }

    /// Wakes every sleeping rank, whatever it sleeps on: for a request a
    /// peer must see at once (a resend), which is rare enough that the other
    /// sleepers' spurious wake-ups cost nothing.
    fn wake_all(&self);

    /// Records `failure` unless another is recorded already, wakes every
    /// sleeper, and returns the failure that stands.
    fn abort(&self, failure: Failure) -> Failure;
    fn failure(&self) -> Option<Failure>;
}
