//! What the shm and pcieipc transports share: the region every rank maps (a
//! memfd segment for shm, the ivshmem BAR2 for pcieipc), laid out alike as a
//! control page, a control block per rank, then per rank its windows; the
//! accessors of the control blocks; peer liveness through pidfds (the ranks
//! share a host); and the `Transport` over all of it. How a rank sleeps on a
//! counter and whom a store wakes stay with each transport (`Signalling`).

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

use super::{Capabilities, LinkPoll, Signal, Transport, Window, WindowSizes};
use crate::engine::call::CallDescriptor;
use crate::engine::chunk::LinkFacts;
use crate::engine::error::EngineError;
use crate::engine::failure::Failure;
use crate::engine::fault_policy::Recovery;
use crate::probe::bdf::Bdf;

/// Rounds the requested window sizes so every slot starts on a page.
pub(crate) fn page_aligned(sizes: WindowSizes) -> WindowSizes {
    WindowSizes {
        slot_bytes: round_up(sizes.slot_bytes.max(1), PAGE),
        one_shot_bytes: round_up(sizes.one_shot_bytes.max(1), PAGE),
        backend_bytes: round_up(sizes.backend_bytes, PAGE),
        ..sizes
    }
}

/// What sets one transport over a segment apart from another: how a store
/// wakes sleepers and how a rank sleeps. It also owns the mapping.
pub(crate) trait Signalling: Sized + Send {
    /// The name the transport is registered under.
    const NAME: &'static str;
    const CAPABILITIES: Capabilities;
    /// What `sleep` waits in, as a trace names it.
    const SLEEP_NAME: &'static str;
    /// How a store wakes a sleeper, as a trace names it.
    const WAKE_NAME: &'static str;

    /// Sets `owner`'s `signal` and wakes whoever sleeps on it.
    fn store(transport: &SegmentTransport<Self>, owner: usize, signal: Signal, value: u32);

    /// Sleeps until `owner`'s `signal` may differ from `observed`, or `slice`
    /// passes.
    fn sleep(
        transport: &SegmentTransport<Self>,
        owner: usize,
        signal: Signal,
        observed: u32,
        slice: Duration,
    );

    /// Wakes the peers asleep on the counters of the rank that just departed.
    fn wake_departed(transport: &SegmentTransport<Self>);

    /// Wakes every sleeper, once an abort is recorded.
    fn wake_all(transport: &SegmentTransport<Self>);

    /// Lets peers read this process's memory, where the transport has
    /// `peer_reads`, until `end_peer_reads` or drop; false where they may not.
    fn allow_peer_reads(&self) -> bool {
        false
    }

    /// `Transport::end_peer_reads`.
    fn end_peer_reads(&self) {}

    /// `Transport::read_peer`, for `owner`'s process `pid`.
    fn read_peer(_pid: u32, _address: u64, _into: &mut [u8]) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }

    /// `Transport::device_link`.
    fn device_link(&self) -> Option<LinkFacts> {
        None
    }

    /// `Transport::poll_link`.
    fn poll_link(&mut self) -> LinkPoll {
        LinkPoll::default()
    }

    /// `Transport::retrain_degraded_link`.
    fn retrain_degraded_link(&mut self) -> Option<LinkFacts> {
        None
    }

    /// `Transport::await_recovery`.
    fn await_recovery(&mut self, _bound: Duration) -> Recovery {
        Recovery::Unfinished { waited_ms: 0 }
    }
}

/// A transport over a mapped segment; `signalling` is what the shm and the
/// pcieipc transports do differently.
pub(crate) struct SegmentTransport<S> {
    pub(crate) rank: usize,
    /// Declared before `signalling`, which owns the mapping, so that it drops
    /// first.
    pub(crate) segment: Segment,
    pub(crate) signalling: S,
    peers: PeerWatch,
    /// When this rank woke sleeping peers (CLOCK_MONOTONIC ns), kept only
    /// while the communicator traces (`log_wakes`).
    wakes: RefCell<Option<Vec<u64>>>,
    /// This rank's failure once the device its segment lives in is lost:
    /// what the segment holds since is not the job's.
    lost: Cell<Option<Failure>>,
}

// SAFETY: the mapping is process-wide and every shared field is accessed through
// atomics or through windows whose ownership the counters hand over.
unsafe impl<S: Signalling> Send for SegmentTransport<S> {}

impl<S: Signalling> SegmentTransport<S> {
    /// A transport over `segment` that does not watch its peers yet.
    pub(crate) fn new(rank: usize, segment: Segment, signalling: S) -> SegmentTransport<S> {
        SegmentTransport {
            rank,
            segment,
            signalling,
            peers: PeerWatch::default(),
            wakes: RefCell::new(None),
            lost: Cell::new(None),
        }
    }

    /// Notes that a store just woke a sleeping peer (a doorbell, a futex
    /// wake), when wakes are logged.
    pub(crate) fn note_wake(&self) {
        if let Some(wakes) = self.wakes.borrow_mut().as_mut() {
            wakes.push(crate::trace::monotonic_ns());
        }
    }

    /// Watches the peers' processes; one already gone aborts the job.
    pub(crate) fn watch(mut self, pids: Vec<u32>) -> Result<SegmentTransport<S>, EngineError> {
        let peers = PeerWatch::open(self.rank, pids).map_err(|failure| self.abort(failure))?;
        self.peers = peers;
        Ok(self)
    }
}

impl<S: Signalling> Transport for SegmentTransport<S> {
    fn name(&self) -> &'static str {
        S::NAME
    }

    fn capabilities(&self) -> Capabilities {
        S::CAPABILITIES
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.segment.layout().nranks
    }

    fn sizes(&self) -> WindowSizes {
        self.segment.layout().sizes
    }

    fn window(&self, owner: usize, window: Window) -> *mut u8 {
        self.segment.window(owner, window)
    }

    fn load(&self, owner: usize, signal: Signal) -> u32 {
        self.segment
            .counter(owner, signal)
            .value
            .load(Ordering::Acquire)
    }

    fn store(&self, owner: usize, signal: Signal, value: u32) {
        S::store(self, owner, signal, value);
    }

    fn sleep(&self, owner: usize, signal: Signal, observed: u32, slice: Duration) {
        S::sleep(self, owner, signal, observed, slice);
    }

    fn log_wakes(&mut self) {
        *self.wakes.get_mut() = Some(Vec::new());
    }

    fn take_wakes(&self) -> Vec<u64> {
        self.wakes
            .borrow_mut()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn wake_name(&self) -> &'static str {
        S::WAKE_NAME
    }

    fn sleep_name(&self) -> &'static str {
        S::SLEEP_NAME
    }

    fn dead_peers(&self) -> Vec<(usize, u32)> {
        self.peers.dead()
    }

    fn pids(&self) -> Vec<u32> {
        self.peers.pids().to_vec()
    }

    fn set_blocked_on(&self, peer: Option<usize>) {
        self.segment.set_blocked_on(self.rank, peer);
    }

    fn blocked_on(&self, rank: usize) -> Option<usize> {
        self.segment.blocked_on(rank)
    }

    fn set_departed(&self) {
        self.segment.set_departed(self.rank);
        // A peer asleep on one of this rank's counters must notice the departure.
        S::wake_departed(self);
    }

    fn departed(&self, rank: usize) -> bool {
        self.segment.departed(rank)
    }

    fn publish_call(&self, seq: u64, call: CallDescriptor) {
        self.segment.publish_call(self.rank, seq, call);
    }

    fn published_call(&self, owner: usize, seq: u64) -> Option<CallDescriptor> {
        self.segment.published_call(owner, seq)
    }

    fn publish_link(&self, link: Option<LinkFacts>) {
        self.segment
            .control(self.rank)
            .status
            .link
            .store(LinkFacts::to_word(link.as_ref()), Ordering::Release);
    }

    fn published_link(&self, rank: usize) -> Option<LinkFacts> {
        LinkFacts::from_word(
            self.segment
                .control(rank)
                .status
                .link
                .load(Ordering::Acquire),
        )
    }

    fn publish_probe(&self, messages: [u64; 4]) -> bool {
        if !S::CAPABILITIES.peer_reads || !self.signalling.allow_peer_reads() {
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

    fn probe(&self, rank: usize) -> (u64, [u64; 4]) {
        let status = &self.segment.control(rank).status;
        let address = status.probe.load(Ordering::Acquire);
        let messages =
            [0, 1, 2, 3].map(|at| status.single_copy_messages[at].load(Ordering::Relaxed));
        (address, messages)
    }

    fn read_peer(&self, owner: usize, address: u64, into: &mut [u8]) -> std::io::Result<()> {
        S::read_peer(self.peers.pid(owner), address, into)
    }

    fn end_peer_reads(&self) {
        self.signalling.end_peer_reads();
    }

    fn device_link(&self) -> Option<LinkFacts> {
        self.signalling.device_link()
    }

    fn poll_link(&mut self) -> LinkPoll {
        let mut poll = self.signalling.poll_link();
        // Another rank's device lost: that rank fails, but what it records
        // goes with its device's memory, so every rank that sees the loss
        // names it.
        for mut fault in std::mem::take(&mut poll.lost_elsewhere) {
            let bdf = fault
                .bdf
                .parse::<Bdf>()
                .ok()
                .and_then(|bdf| bdf.to_abi().ok());
            fault.peer = bdf.and_then(|bdf| self.segment.rank_of_device(bdf));
            if fault.peer.is_some_and(|peer| peer != self.rank) {
                poll.faults.push(fault);
            }
        }
        poll
    }

    fn await_recovery(&mut self, bound: Duration) -> Recovery {
        self.signalling.await_recovery(bound)
    }

    fn retrain_degraded_link(&mut self) -> Option<LinkFacts> {
        self.signalling.retrain_degraded_link()
    }

    fn wake_all(&self) {
        S::wake_all(self);
    }

    fn abort(&self, failure: Failure) -> Failure {
        if let Some(standing) = self.lost.get() {
            return standing;
        }
        // A rank whose segment lives in its own device's memory loses the
        // segment with the device: it keeps its failure to itself (the
        // peers see the same loss in the module's events).
        if S::CAPABILITIES.device_memory && failure.lost_device_of() == Some(self.rank) {
            self.lost.set(Some(failure));
            return failure;
        }
        self.segment.abort(failure, || S::wake_all(self))
    }

    fn failure(&self) -> Option<Failure> {
        self.lost.get().or_else(|| self.segment.failure())
    }
}
