//! The transport every communicator speaks to: the region every rank maps
//! (a memfd segment for shm, the ivshmem BAR2 for pcieipc), laid out alike
//! as a control page, a control block per rank, then per rank its windows;
//! the accessors of the control blocks; and peer liveness through pidfds
//! (the ranks share a host). How a rank sleeps on a counter, whom a store
//! wakes and who owns the mapping stay with each transport (`Signalling`,
//! the one plug-in trait).
//!
//! Counters follow release/acquire: a `store` publishes every write its
//! owner made to its windows before it, a `load` that observes it makes
//! them visible.

mod layout;
pub(crate) mod memfd;
mod peers;
mod region;

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use std::time::Duration;

pub(crate) use layout::{round_up, Layout, PAGE};
pub(crate) use peers::PeerWatch;
pub(crate) use region::Segment;

use super::{Capabilities, Signal, Window, WindowSizes};
use crate::engine::call::CallDescriptor;
use crate::engine::chunk::LinkFacts;
use crate::engine::error::EngineError;
use crate::engine::failure::Failure;
use crate::engine::link_monitor::LinkMonitor;

/// Rounds the requested window sizes so every slot starts on a page.
pub(crate) fn page_aligned(sizes: WindowSizes) -> WindowSizes {
    WindowSizes {
        slot_bytes: round_up(sizes.slot_bytes.max(1), PAGE),
        one_shot_bytes: round_up(sizes.one_shot_bytes.max(1), PAGE),
        backend_bytes: round_up(sizes.backend_bytes, PAGE),
        ..sizes
    }
}

/// What sets one transport apart from another, and nothing else: how a
/// store wakes a rank asleep on a counter, how a rank sleeps, whether peers
/// may read each other's memory, and the device link it follows. An
/// implementation owns the mapping of the segment (`segment::Segment`) that
/// every call here is handed; the control block, the windows and the
/// peers' liveness are the same for every transport (`Transport`).
pub(crate) trait Signalling: Send {
    /// What the transport is.
    fn kind(&self) -> &'static Kind;

    /// Sets `owner`'s `signal` to `value` and wakes whoever sleeps on it, as
    /// `rank`; returns how many sleepers it woke. Release ordering at least:
    /// the store publishes every write to `rank`'s windows before it.
    fn store(
        &self,
        segment: &Segment,
        rank: usize,
        owner: usize,
        signal: Signal,
        value: u32,
    ) -> usize;

    /// Sleeps, as `rank`, until `owner`'s `signal` may differ from
    /// `observed`, or `slice` passes, whichever is first. Never spins.
    fn sleep(
        &self,
        segment: &Segment,
        rank: usize,
        owner: usize,
        signal: Signal,
        observed: u32,
        slice: Duration,
    );

    /// Wakes the ranks asleep on `rank`'s counters (it departed), or with
    /// `None` every sleeper (a failure is recorded, or a request every peer
    /// must see at once); returns how many it woke.
    fn wake(&self, segment: &Segment, rank: usize, only_on: Option<usize>) -> usize;

    /// Lets the processes `peers` read this process's memory, where the
    /// transport has `peer_reads`, until `end_peer_reads` or drop; false
    /// where they may not.
    fn allow_peer_reads(&self, _peers: &[u32]) -> bool {
        false
    }

    /// Withdraws what `allow_peer_reads` allowed.
    fn end_peer_reads(&self) {}

    /// Copies `into.len()` bytes at `address` in process `pid` into `into`.
    fn read_peer(&self, _pid: u32, _address: u64, _into: &mut [u8]) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }

    /// Backs the pages of `len` bytes at `start` (page aligned, inside the
    /// mapping) in this process before a call touches them: for writing
    /// (this rank's own windows) or reading (a peer's). Where the segment is
    /// demand-paged host memory, a page's first touch is a fault, and the
    /// calls that first touch a message size's slots pay for every page
    /// (docs/engine.md, Slots backed before use); the default, for memory
    /// mapped whole (a device's BAR), does nothing.
    fn prepare(&self, _start: *mut u8, _len: usize, _write: bool) {}

    /// The monitor of the link under this rank's device, where the
    /// transport follows one (`capabilities().link_events`): handed over
    /// once, to the communicator's fault monitor.
    fn take_link_monitor(&mut self) -> Option<Box<dyn LinkMonitor>> {
        None
    }
}

/// What a transport is, as the engine and its traces see it.
#[derive(Debug)]
pub(crate) struct Kind {
    /// The name it is registered under.
    pub(crate) name: &'static str,
    pub(crate) capabilities: Capabilities,
    /// What `sleep` waits in, as a trace names it.
    pub(crate) sleep_name: &'static str,
    /// How a store wakes a sleeper, as a trace names it.
    pub(crate) wake_name: &'static str,
}

/// A communicator's shared state over a mapped segment; `signalling` is
/// what the shm and the pcieipc transports do differently. Opaque outside
/// the engine: a `TransportConfig` opens one for the communicator.
pub struct Transport {
    rank: usize,
    /// Declared before `signalling`, which owns the mapping, so that it drops
    /// first.
    segment: Segment,
    signalling: Box<dyn Signalling>,
    peers: PeerWatch,
    /// When this rank woke sleeping peers (CLOCK_MONOTONIC ns), kept only
    /// while the communicator traces (`log_wakes`).
    wakes: RefCell<Option<Vec<u64>>>,
    /// This rank's failure once the device its segment lives in is lost:
    /// what the segment holds since is not the job's.
    lost: Cell<Option<Failure>>,
}

// SAFETY: the mapping is process-wide and every shared field is accessed
// through atomics or through windows whose ownership the counters hand over.
unsafe impl Send for Transport {}

impl Transport {
    /// A transport over `segment` (mapped by `signalling`) for `rank`,
    /// watching the peers' processes `pids`; one already gone aborts the
    /// job.
    pub(crate) fn new(
        rank: usize,
        segment: Segment,
        signalling: Box<dyn Signalling>,
        pids: Vec<u32>,
    ) -> Result<Transport, EngineError> {
        let mut transport = Transport {
            rank,
            segment,
            signalling,
            peers: PeerWatch::default(),
            wakes: RefCell::new(None),
            lost: Cell::new(None),
        };
        transport.peers =
            PeerWatch::open(rank, pids).map_err(|failure| transport.abort(failure))?;
        Ok(transport)
    }

    /// Notes `count` wakes of sleeping peers a store just made, when wakes
    /// are logged.
    fn note_wakes(&self, count: usize) {
        if count == 0 {
            return;
        }
        if let Some(wakes) = self.wakes.borrow_mut().as_mut() {
            let now = crate::trace::monotonic_ns();
            wakes.extend(std::iter::repeat_n(now, count));
        }
    }

    /// What the transport is: its name, capabilities, and how traces
    /// name its sleeps and wakes.
    pub(crate) fn kind(&self) -> &'static Kind {
        self.signalling.kind()
    }

    pub(crate) fn capabilities(&self) -> Capabilities {
        self.kind().capabilities
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn nranks(&self) -> usize {
        self.segment.layout().nranks
    }

    pub(crate) fn sizes(&self) -> WindowSizes {
        self.segment.layout().sizes
    }

    /// The start of `owner`'s `window`, valid for the window's size for the
    /// transport's lifetime. Only the owner writes through it, and only
    /// while no peer may read it (the counters say when).
    pub(crate) fn window(&self, owner: usize, window: Window) -> *mut u8 {
        self.segment.window(owner, window)
    }

    /// Backs the first `bytes` of `owner`'s `window` in this process
    /// (`Signalling::prepare`): written where it is this rank's, read where
    /// it is a peer's.
    pub(crate) fn prepare(&self, owner: usize, window: Window, bytes: usize) {
        let len = round_up(bytes, PAGE).min(self.segment.window_bytes(window));
        self.signalling
            .prepare(self.window(owner, window), len, owner == self.rank);
    }

    pub(crate) fn load(&self, owner: usize, signal: Signal) -> u32 {
        self.segment
            .counter(owner, signal)
            .value
            .load(Ordering::Acquire)
    }

    /// Sets `owner`'s `signal` and wakes whoever sleeps on it.
    pub(crate) fn store(&self, owner: usize, signal: Signal, value: u32) {
        let woke = self
            .signalling
            .store(&self.segment, self.rank, owner, signal, value);
        self.note_wakes(woke);
    }

    /// Sleeps until `owner`'s `signal` may differ from `observed`, or
    /// `slice` passes, whichever is first. Never spins.
    pub(crate) fn sleep(&self, owner: usize, signal: Signal, observed: u32, slice: Duration) {
        self.signalling
            .sleep(&self.segment, self.rank, owner, signal, observed, slice);
    }

    /// From now on, note when a store wakes a sleeping peer (tracing).
    pub(crate) fn log_wakes(&mut self) {
        *self.wakes.get_mut() = Some(Vec::new());
    }

    /// The wakes noted since the last call (CLOCK_MONOTONIC ns).
    pub(crate) fn take_wakes(&self) -> Vec<u64> {
        self.wakes
            .borrow_mut()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The peers whose processes have exited, with their pids.
    pub(crate) fn dead_peers(&self) -> Vec<(usize, u32)> {
        self.peers.dead()
    }

    /// Every rank's pid (the kernel's, from the rendezvous).
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.peers.pids().to_vec()
    }

    /// Tells peers which rank this one is blocked on (`None`: running).
    pub(crate) fn set_blocked_on(&self, peer: Option<usize>) {
        self.segment.set_blocked_on(self.rank, peer);
    }

    pub(crate) fn blocked_on(&self, rank: usize) -> Option<usize> {
        self.segment.blocked_on(rank)
    }

    /// Marks this rank as gone (its communicator was dropped).
    pub(crate) fn set_departed(&self) {
        self.segment.set_departed(self.rank);
        // A peer asleep on one of this rank's counters must notice the departure.
        let woke = self
            .signalling
            .wake(&self.segment, self.rank, Some(self.rank));
        self.note_wakes(woke);
    }

    pub(crate) fn departed(&self, rank: usize) -> bool {
        self.segment.departed(rank)
    }

    /// Publishes this rank's descriptor of its `seq`-th call.
    pub(crate) fn publish_call(&self, seq: u64, call: CallDescriptor) {
        self.segment.publish_call(self.rank, seq, call);
    }

    /// `owner`'s descriptor of its `seq`-th call, once it has published it.
    pub(crate) fn published_call(&self, owner: usize, seq: u64) -> Option<CallDescriptor> {
        self.segment.published_call(owner, seq)
    }

    /// Publishes the link under this rank's ring hop (`None`: host memory),
    /// from which the rank deciding a call's chunk size takes its wish.
    pub(crate) fn publish_link(&self, link: Option<LinkFacts>) {
        self.segment
            .control(self.rank)
            .status
            .link
            .store(LinkFacts::to_word(link.as_ref()), Ordering::Release);
    }

    pub(crate) fn published_link(&self, rank: usize) -> Option<LinkFacts> {
        LinkFacts::from_word(
            self.segment
                .control(rank)
                .status
                .link
                .load(Ordering::Acquire),
        )
    }

    /// The rank whose device is `bdf` (in the ABI's encoding), where the
    /// ranks published their devices (pcieipc).
    pub(crate) fn rank_of_device(&self, bdf: u32) -> Option<usize> {
        self.segment.rank_of_device(bdf)
    }

    /// Peer reads: publishes, in this rank's control block, the address in
    /// this process of that very word, for a peer to read back with
    /// `read_peer` and so prove that it may. `messages` (the ranges of
    /// message sizes for which this rank would read straight from peers:
    /// the ring's all-gather's, then the direct algorithm's, each as first
    /// and last) goes with it, for the ranks to check that they agree. False
    /// (and nothing published) where peers may not read this process's
    /// memory.
    pub(crate) fn publish_probe(&self, messages: [u64; 4]) -> bool {
        let peers: Vec<u32> = (self.pids().into_iter())
            .enumerate()
            .filter(|(rank, _)| *rank != self.rank)
            .map(|(_, pid)| pid)
            .collect();
        if !self.capabilities().peer_reads || !self.signalling.allow_peer_reads(&peers) {
            return false;
        }
        let status = &self.segment.control(self.rank).status;
        for (word, value) in status.single_copy_messages.iter().zip(messages) {
            word.store(value, Ordering::Relaxed);
        }
        status
            .probe
            .store(status.probe.as_ptr() as u64, Ordering::Release);
        true
    }

    /// The address and the message ranges `rank` published with
    /// `publish_probe` (address 0 while none).
    pub(crate) fn probe(&self, rank: usize) -> (u64, [u64; 4]) {
        let status = &self.segment.control(rank).status;
        let address = status.probe.load(Ordering::Acquire);
        let messages =
            [0, 1, 2, 3].map(|at| status.single_copy_messages[at].load(Ordering::Relaxed));
        (address, messages)
    }

    /// Copies `into.len()` bytes at `address` in `owner`'s process into
    /// `into`: only where `capabilities().peer_reads`, and only memory the
    /// owner has said it will not change until this rank is done.
    pub(crate) fn read_peer(
        &self,
        owner: usize,
        address: u64,
        into: &mut [u8],
    ) -> std::io::Result<()> {
        self.signalling
            .read_peer(self.peers.pid(owner), address, into)
    }

    /// Withdraws what `publish_probe` allowed (the ranks did not agree on
    /// peer reads); dropping the transport does the same.
    pub(crate) fn end_peer_reads(&self) {
        self.signalling.end_peer_reads();
    }

    /// The monitor of the link under this rank's device, where the
    /// transport follows one; handed over once.
    pub(crate) fn take_link_monitor(&mut self) -> Option<Box<dyn LinkMonitor>> {
        self.signalling.take_link_monitor()
    }

    /// Wakes every sleeping rank, whatever it sleeps on: for a request a
    /// peer must see at once (a resend), which is rare enough that the other
    /// sleepers' spurious wake-ups cost nothing.
    pub(crate) fn wake_all(&self) {
        let woke = self.signalling.wake(&self.segment, self.rank, None);
        self.note_wakes(woke);
    }

    /// Records `failure` unless another is recorded already, wakes every
    /// sleeper, and returns the failure that stands.
    pub(crate) fn abort(&self, failure: Failure) -> Failure {
        if let Some(standing) = self.lost.get() {
            return standing;
        }
        // A rank whose segment lives in its own device's memory loses the
        // segment with the device: it keeps its failure to itself (the
        // peers see the same loss in the module's events).
        if self.capabilities().device_memory && failure.lost_device_of() == Some(self.rank) {
            self.lost.set(Some(failure));
            return failure;
        }
        self.segment.abort(failure, || self.wake_all())
    }

    pub(crate) fn failure(&self) -> Option<Failure> {
        self.lost.get().or_else(|| self.segment.failure())
    }
}
