//! What the shm and pcieipc transports share: the region every rank maps (a
//! memfd segment for shm, the ivshmem BAR2 for pcieipc), laid out alike as a
//! control page, a control block per rank, then per rank its windows; the
//! accessors of the control blocks; peer liveness through pidfds (the ranks
//! share a host); and the `Transport` over all of it. How a rank sleeps on a
//! counter and whom a store wakes stay with each transport (`Signalling`).

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::call::CallDescriptor;
use super::chunk::LinkFacts;
use super::error::EngineError;
use super::failure::{Failure, FAILURE_WORDS};
use super::transport::{Signal, Transport, TransportKind, Window, WindowSizes, SIGNALS};

pub(super) const PAGE: usize = 4096;

#[repr(C, align(64))]
pub(super) struct Counter {
    pub(super) value: AtomicU32,
    /// Ranks asleep on `value` in a futex wait (shm), so that a store pays
    /// the wake syscall only when someone sleeps.
    pub(super) waiters: AtomicU32,
}

#[repr(C, align(64))]
struct PublishedCall {
    /// seq + 1 of the call described, 0 while none: written after the words.
    seq_plus_one: AtomicU64,
    words: [AtomicU64; 3],
}

#[repr(C, align(64))]
pub(super) struct RankStatus {
    /// rank + 1 of the peer this rank is blocked on, 0 while running.
    blocked_on: AtomicU32,
    departed: AtomicU32,
    /// pcieipc: `sleep_code` of the counter this rank sleeps on, 0 while
    /// awake: a store rings the doorbell of exactly the ranks asleep on its
    /// counter.
    pub(super) sleeping_on: AtomicU32,
    /// pcieipc: peer id + 1 of this rank's device, written before it first
    /// sleeps.
    pub(super) peer_id: AtomicU32,
    /// `LinkFacts::to_word` of the link under this rank's ring hop.
    link: AtomicU64,
    /// shm: the address of this very word in this rank's process, written
    /// by the rank itself; a peer reads it back with `process_vm_readv` to
    /// prove it may read this rank's memory (the single-copy all-gather).
    probe: AtomicU64,
    /// shm: the message sizes (first, last) for which the ring's all-gather
    /// reads finished chunks straight from the predecessor, then those
    /// (first, last) that go direct, written before `probe`.
    single_copy_messages: [AtomicU64; 4],
}

#[repr(C)]
pub(super) struct RankControl {
    counters: [Counter; SIGNALS.len()],
    pub(super) status: RankStatus,
    /// Indexed by call parity. A rank waiting on a peer in the one-shot path
    /// finds the peer at most one call ahead; elsewhere (a broadcast chain) a
    /// peer may run further ahead and reuse the entry, which readers detect
    /// and then ignore: messages carry their own call stamp for that case.
    published: [PublishedCall; 2],
}

const ABORT_NONE: u32 = 0;
const ABORT_WRITING: u32 = 1;
const ABORT_SET: u32 = 2;

#[repr(C, align(64))]
pub(super) struct GlobalControl {
    /// pcieipc: the job's tag, written by rank 0 once the control blocks are
    /// zeroed: the other ranks check it to prove their BAR2 is the same region.
    pub(super) job_tag: AtomicU64,
    abort_state: AtomicU32,
    abort_words: [AtomicU64; FAILURE_WORDS],
}

/// Where everything lives in the region; a pure function of the rank count
/// and window sizes, so every rank computes the same offsets.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) nranks: usize,
    pub(super) sizes: WindowSizes,
    controls: usize,
    /// Where the windows start: everything before is the control area.
    pub(super) windows: usize,
    per_rank_windows: usize,
    relay: usize,
    one_shot: usize,
    pub(super) total: usize,
}

pub(super) fn round_up(bytes: usize, to: usize) -> usize {
    bytes.div_ceil(to) * to
}

impl Layout {
    pub(super) fn new(nranks: usize, sizes: WindowSizes) -> Layout {
        let controls = round_up(std::mem::size_of::<GlobalControl>(), PAGE);
        let windows = controls + round_up(nranks * std::mem::size_of::<RankControl>(), PAGE);
        let relay = sizes.raw_slots * sizes.slot_bytes;
        let one_shot = relay + sizes.relay_slots * sizes.slot_bytes;
        let per_rank_windows = round_up(one_shot + 2 * sizes.one_shot_bytes, PAGE);
        Layout {
            nranks,
            sizes,
            controls,
            windows,
            per_rank_windows,
            relay,
            one_shot,
            total: windows + nranks * per_rank_windows,
        }
    }
}

/// A mapping of the region, seen through its layout.
pub(super) struct Segment {
    base: NonNull<u8>,
    layout: Layout,
}

impl Segment {
    /// # Safety
    ///
    /// `base` is page aligned and starts a shared mapping of at least
    /// `layout.total` bytes that outlives the `Segment`, whose control area is
    /// zeroed or written only through segments of the same layout.
    pub(super) unsafe fn new(base: NonNull<u8>, layout: Layout) -> Segment {
        Segment { base, layout }
    }

    pub(super) fn layout(&self) -> Layout {
        self.layout
    }

    pub(super) fn global(&self) -> &GlobalControl {
        // SAFETY: the control page is at the start of the mapping (page
        // aligned), zero-initialised atomics are valid, and the mapping
        // outlives `self`.
        unsafe { &*self.base.as_ptr().cast::<GlobalControl>() }
    }

    pub(super) fn control(&self, rank: usize) -> &RankControl {
        assert!(rank < self.layout.nranks, "rank {rank} out of range");
        // SAFETY: `Layout` reserves nranks RankControl blocks at `controls`;
        // the mapping is page aligned and outlives `self`.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(self.layout.controls)
                .cast::<RankControl>()
                .add(rank)
        }
    }

    pub(super) fn counter(&self, owner: usize, signal: Signal) -> &Counter {
        &self.control(owner).counters[signal as usize]
    }

    fn window(&self, owner: usize, window: Window) -> *mut u8 {
        let sizes = self.layout.sizes;
        let offset = match window {
            Window::Raw { slot } => {
                assert!(slot < sizes.raw_slots);
                slot * sizes.slot_bytes
            }
            Window::Relay { slot } => {
                assert!(slot < sizes.relay_slots);
                self.layout.relay + slot * sizes.slot_bytes
            }
            Window::OneShot { parity } => {
                assert!(parity < 2);
                self.layout.one_shot + parity * sizes.one_shot_bytes
            }
        };
        assert!(owner < self.layout.nranks);
        // SAFETY: `Layout` places every window of every rank inside the mapping.
        unsafe {
            self.base
                .as_ptr()
                .add(self.layout.windows + owner * self.layout.per_rank_windows + offset)
        }
    }

    fn set_blocked_on(&self, rank: usize, peer: Option<usize>) {
        let encoded = peer.map_or(0, |peer| peer as u32 + 1);
        self.control(rank)
            .status
            .blocked_on
            .store(encoded, Ordering::Release);
    }

    fn blocked_on(&self, rank: usize) -> Option<usize> {
        match self.control(rank).status.blocked_on.load(Ordering::Acquire) {
            0 => None,
            encoded => Some(encoded as usize - 1),
        }
    }

    /// Marks `rank` departed; the caller then wakes the peers asleep on its
    /// counters.
    fn set_departed(&self, rank: usize) {
        // SeqCst, not just Release: pcieipc then reads the sleepers'
        // `sleeping_on`, and this store must not pass that load.
        self.control(rank)
            .status
            .departed
            .store(1, Ordering::SeqCst);
    }

    fn departed(&self, rank: usize) -> bool {
        self.control(rank).status.departed.load(Ordering::Acquire) != 0
    }

    fn publish_call(&self, rank: usize, seq: u64, call: CallDescriptor) {
        // A seqlock: readers that see the sequence change under them discard
        // what they read.
        let entry = &self.control(rank).published[(seq % 2) as usize];
        entry.seq_plus_one.store(0, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        for (word, value) in entry.words.iter().zip(call.to_words()) {
            word.store(value, Ordering::Relaxed);
        }
        entry.seq_plus_one.store(seq + 1, Ordering::Release);
    }

    fn published_call(&self, owner: usize, seq: u64) -> Option<CallDescriptor> {
        let entry = &self.control(owner).published[(seq % 2) as usize];
        if entry.seq_plus_one.load(Ordering::Acquire) != seq + 1 {
            return None;
        }
        let words = [0, 1, 2].map(|at| entry.words[at].load(Ordering::Relaxed));
        std::sync::atomic::fence(Ordering::Acquire);
        if entry.seq_plus_one.load(Ordering::Relaxed) != seq + 1 {
            return None;
        }
        CallDescriptor::from_words(words)
    }

    /// Records `failure` unless a failure is already recorded, runs `wake_all`
    /// (the transport wakes every sleeper), and returns the failure that
    /// stands.
    fn abort(&self, failure: Failure, wake_all: impl FnOnce()) -> Failure {
        let global = self.global();
        if global
            .abort_state
            .compare_exchange(
                ABORT_NONE,
                ABORT_WRITING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            for (word, value) in global.abort_words.iter().zip(failure.to_words()) {
                word.store(value, Ordering::Relaxed);
            }
            // SeqCst, not just Release: as in `set_departed`.
            global.abort_state.store(ABORT_SET, Ordering::SeqCst);
        }
        wake_all();
        // Another rank may be writing its record right now: it takes a few
        // stores, unless that rank died between them, which the bound covers.
        let give_up = std::time::Instant::now() + Duration::from_millis(100);
        while std::time::Instant::now() < give_up {
            if let Some(standing) = self.failure() {
                return standing;
            }
            std::hint::spin_loop();
        }
        failure
    }

    fn failure(&self) -> Option<Failure> {
        let global = self.global();
        if global.abort_state.load(Ordering::Acquire) != ABORT_SET {
            return None;
        }
        let words = std::array::from_fn(|at| global.abort_words[at].load(Ordering::Relaxed));
        Failure::from_words(words)
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The peers' processes, watched through a pidfd each.
#[derive(Default)]
pub(super) struct PeerWatch {
    /// One per rank; `None` for this rank.
    pidfds: Vec<Option<OwnedFd>>,
    pids: Vec<u32>,
}

impl PeerWatch {
    /// Watches every rank of `pids` but `rank`; a peer that cannot be watched
    /// has already exited.
    fn open(rank: usize, pids: Vec<u32>) -> Result<PeerWatch, Failure> {
        let mut pidfds = Vec::with_capacity(pids.len());
        for (peer, pid) in pids.iter().enumerate() {
            if peer == rank {
                pidfds.push(None);
                continue;
            }
            let pidfd = pidfd_open(*pid).map_err(|_| Failure::PeerDied {
                rank: peer,
                pid: *pid,
            })?;
            pidfds.push(Some(pidfd));
        }
        Ok(PeerWatch { pidfds, pids })
    }

    fn pid(&self, rank: usize) -> u32 {
        self.pids[rank]
    }

    fn dead(&self) -> Vec<(usize, u32)> {
        let watched: Vec<(usize, &OwnedFd)> = self
            .pidfds
            .iter()
            .enumerate()
            .filter_map(|(peer, pidfd)| pidfd.as_ref().map(|pidfd| (peer, pidfd)))
            .collect();
        let mut fds: Vec<PollFd> = watched
            .iter()
            .map(|(_, pidfd)| PollFd::new(pidfd.as_fd(), PollFlags::POLLIN))
            .collect();
        // A pidfd polls readable once its process has exited.
        if poll(&mut fds, PollTimeout::ZERO).unwrap_or(0) <= 0 {
            return Vec::new();
        }
        fds.iter()
            .zip(&watched)
            .filter(|(fd, _)| fd.revents().is_some_and(|revents| !revents.is_empty()))
            .map(|(_, (peer, _))| (*peer, self.pids[*peer]))
            .collect()
    }
}

/// What sets one transport over a segment apart from another: how a store
/// wakes sleepers and how a rank sleeps. It also owns the mapping.
pub(super) trait Signalling: Sized + Send {
    const KIND: TransportKind;

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
}

/// A transport over a mapped segment; `signalling` is what the shm and the
/// pcieipc transports do differently.
pub(super) struct SegmentTransport<S> {
    pub(super) rank: usize,
    /// Declared before `signalling`, which owns the mapping, so that it drops
    /// first.
    pub(super) segment: Segment,
    pub(super) signalling: S,
    peers: PeerWatch,
}

// SAFETY: the mapping is process-wide and every shared field is accessed through
// atomics or through windows whose ownership the counters hand over.
unsafe impl<S: Signalling> Send for SegmentTransport<S> {}

impl<S: Signalling> SegmentTransport<S> {
    /// A transport over `segment` that does not watch its peers yet.
    pub(super) fn new(rank: usize, segment: Segment, signalling: S) -> SegmentTransport<S> {
        SegmentTransport {
            rank,
            segment,
            signalling,
            peers: PeerWatch::default(),
        }
    }

    /// Watches the peers' processes; one already gone aborts the job.
    pub(super) fn watch(mut self, pids: Vec<u32>) -> Result<SegmentTransport<S>, EngineError> {
        let peers = PeerWatch::open(self.rank, pids).map_err(|failure| self.abort(failure))?;
        self.peers = peers;
        Ok(self)
    }
}

impl<S: Signalling> Transport for SegmentTransport<S> {
    fn kind(&self) -> TransportKind {
        S::KIND
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.segment.layout.nranks
    }

    fn sizes(&self) -> WindowSizes {
        self.segment.layout.sizes
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

    fn dead_peers(&self) -> Vec<(usize, u32)> {
        self.peers.dead()
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

    fn pid(&self, rank: usize) -> u32 {
        self.peers.pid(rank)
    }

    fn publish_probe(&self, messages: [u64; 4]) -> bool {
        if S::KIND != TransportKind::Shm {
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

    fn abort(&self, failure: Failure) -> Failure {
        self.segment.abort(failure, || S::wake_all(self))
    }

    fn failure(&self) -> Option<Failure> {
        self.segment.failure()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fits_windows_after_the_control_blocks() {
        let sizes = WindowSizes {
            slot_bytes: 8192,
            raw_slots: 5,
            relay_slots: 25,
            one_shot_bytes: 8192,
        };
        let layout = Layout::new(4, sizes);
        assert_eq!(layout.controls, PAGE);
        assert!(layout.controls + 4 * std::mem::size_of::<RankControl>() <= layout.windows);
        assert_eq!(layout.per_rank_windows, (5 + 25 + 2) * 8192);
        assert_eq!(layout.total, layout.windows + 4 * (5 + 25 + 2) * 8192);
    }
}
