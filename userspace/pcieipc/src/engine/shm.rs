//! The shm transport: one memfd segment shared by all ranks of a host.
//!
//! The segment exists only as a memfd (nothing under /dev/shm): rank 0 creates
//! it, passes the descriptor over the rendezvous socket, and every rank closes
//! its descriptor once mapped, so the memory is freed when the last rank unmaps
//! it, however the ranks end. Waiting ranks sleep on futex words inside the
//! segment (shared futexes: no FUTEX_PRIVATE_FLAG, since the word is in several
//! processes); liveness comes from a pidfd per peer.

use std::num::NonZeroUsize;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

use super::call::CallDescriptor;
use super::error::EngineError;
use super::failure::{Failure, FAILURE_WORDS};
use super::transport::{Signal, Transport, TransportKind, Window, WindowSizes, SIGNALS};

/// The name under which the segment appears in /proc/<pid>/maps and fd links
/// (`/memfd:pcieipc-engine`); tests look for it to prove nothing is left.
pub const SEGMENT_NAME: &str = "pcieipc-engine";

const PAGE: usize = 4096;

#[repr(C, align(64))]
struct Counter {
    value: AtomicU32,
    waiters: AtomicU32,
}

#[repr(C, align(64))]
struct PublishedCall {
    /// seq + 1 of the call described, 0 while none: written after the words.
    seq_plus_one: AtomicU64,
    words: [AtomicU64; 3],
}

#[repr(C, align(64))]
struct RankStatus {
    /// rank + 1 of the peer this rank is blocked on, 0 while running.
    blocked_on: AtomicU32,
    departed: AtomicU32,
}

#[repr(C)]
struct RankControl {
    counters: [Counter; SIGNALS.len()],
    status: RankStatus,
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
struct GlobalControl {
    abort_state: AtomicU32,
    abort_words: [AtomicU64; FAILURE_WORDS],
}

/// Where everything lives in the segment; a pure function of the rank count
/// and window sizes, so every rank computes the same offsets.
#[derive(Clone, Copy, Debug)]
struct Layout {
    nranks: usize,
    sizes: WindowSizes,
    controls: usize,
    windows: usize,
    per_rank_windows: usize,
    relay: usize,
    one_shot: usize,
    total: usize,
}

fn round_up(bytes: usize, to: usize) -> usize {
    bytes.div_ceil(to) * to
}

impl Layout {
    fn new(nranks: usize, sizes: WindowSizes) -> Layout {
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

/// Rounds the requested window sizes so every slot starts on a page.
pub(crate) fn page_aligned(sizes: WindowSizes) -> WindowSizes {
    WindowSizes {
        slot_bytes: round_up(sizes.slot_bytes.max(1), PAGE),
        one_shot_bytes: round_up(sizes.one_shot_bytes.max(1), PAGE),
        ..sizes
    }
}

/// Creates the segment for `nranks` ranks (rank 0 does this once).
pub(crate) fn create_segment(nranks: usize, sizes: WindowSizes) -> Result<OwnedFd, EngineError> {
    let layout = Layout::new(nranks, sizes);
    let io = |context: &'static str| {
        move |errno: nix::errno::Errno| EngineError::SharedMemory {
            bytes: layout.total,
            context,
            source: errno.into(),
        }
    };
    let fd = nix::sys::memfd::memfd_create(SEGMENT_NAME, nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(io("memfd_create"))?;
    // ftruncate leaves the memory sparse and zeroed: zero is every counter's
    // initial value, and pages are only allocated where ranks write.
    nix::unistd::ftruncate(&fd, layout.total as i64).map_err(io("ftruncate"))?;
    Ok(fd)
}

pub struct ShmTransport {
    rank: usize,
    base: NonNull<u8>,
    layout: Layout,
    /// One per rank; `None` for this rank.
    peer_pidfds: Vec<Option<OwnedFd>>,
    pids: Vec<u32>,
}

// SAFETY: the mapping is process-wide and every shared field is accessed through
// atomics or through windows whose ownership the counters hand over.
unsafe impl Send for ShmTransport {}

pub(crate) fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

impl ShmTransport {
    /// Maps the segment `fd` (then closes the descriptor) and watches the
    /// peers' processes.
    pub(crate) fn attach(
        fd: OwnedFd,
        rank: usize,
        sizes: WindowSizes,
        pids: Vec<u32>,
    ) -> Result<ShmTransport, EngineError> {
        let nranks = pids.len();
        let layout = Layout::new(nranks, sizes);
        let length =
            NonZeroUsize::new(layout.total).expect("segment holds at least its control page");
        // SAFETY: a fresh shared mapping of a memfd of exactly this length; no
        // Rust reference aliases it yet.
        let base = unsafe {
            mmap(
                None,
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }
        .map_err(|errno| EngineError::SharedMemory {
            bytes: layout.total,
            context: "mmap",
            source: errno.into(),
        })?;
        drop(fd);
        let mut transport = ShmTransport {
            rank,
            base: base.cast(),
            layout,
            peer_pidfds: Vec::with_capacity(nranks),
            pids: pids.clone(),
        };
        for (peer, pid) in pids.iter().enumerate() {
            if peer == rank {
                transport.peer_pidfds.push(None);
                continue;
            }
            match pidfd_open(*pid) {
                Ok(pidfd) => transport.peer_pidfds.push(Some(pidfd)),
                Err(_) => {
                    let failure = Failure::PeerDied {
                        rank: peer,
                        pid: *pid,
                    };
                    return Err(transport.abort(failure).into());
                }
            }
        }
        Ok(transport)
    }

    fn global(&self) -> &GlobalControl {
        // SAFETY: the control page is at the start of the mapping, zero-initialised
        // atomics are valid, and the mapping outlives `self`.
        unsafe { &*self.base.as_ptr().cast::<GlobalControl>() }
    }

    fn control(&self, rank: usize) -> &RankControl {
        assert!(rank < self.layout.nranks, "rank {rank} out of range");
        // SAFETY: `Layout` reserves nranks RankControl blocks at `controls`;
        // the mapping is 64-byte aligned (page aligned) and outlives `self`.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(self.layout.controls)
                .cast::<RankControl>()
                .add(rank)
        }
    }

    fn counter(&self, owner: usize, signal: Signal) -> &Counter {
        &self.control(owner).counters[signal as usize]
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the word is a live, aligned u32 in a shared mapping; the timeout is
    // a valid timespec. A spurious return (EAGAIN, EINTR, ETIMEDOUT) is harmless:
    // callers re-check the counter.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &timeout as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: the word is a live, aligned u32 in a shared mapping.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

impl Transport for ShmTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.layout.nranks
    }

    fn sizes(&self) -> WindowSizes {
        self.layout.sizes
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

    fn load(&self, owner: usize, signal: Signal) -> u32 {
        self.counter(owner, signal).value.load(Ordering::Acquire)
    }

    fn store(&self, owner: usize, signal: Signal, value: u32) {
        let counter = self.counter(owner, signal);
        // SeqCst on both the value and the waiter count (here and in `sleep`):
        // either this store sees the sleeper registered, or the sleeper sees the
        // new value before it sleeps. A syscall is paid only when someone sleeps.
        counter.value.store(value, Ordering::SeqCst);
        if counter.waiters.load(Ordering::SeqCst) != 0 {
            futex_wake_all(&counter.value);
        }
    }

    fn sleep(&self, owner: usize, signal: Signal, observed: u32, slice: Duration) {
        let counter = self.counter(owner, signal);
        counter.waiters.fetch_add(1, Ordering::SeqCst);
        if counter.value.load(Ordering::SeqCst) == observed {
            futex_wait(&counter.value, observed, slice);
        }
        counter.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    fn dead_peers(&self) -> Vec<(usize, u32)> {
        let watched: Vec<(usize, &OwnedFd)> = self
            .peer_pidfds
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

    fn set_blocked_on(&self, peer: Option<usize>) {
        let encoded = peer.map_or(0, |peer| peer as u32 + 1);
        self.control(self.rank)
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

    fn set_departed(&self) {
        self.control(self.rank)
            .status
            .departed
            .store(1, Ordering::Release);
        // A peer asleep on one of this rank's counters must notice the departure.
        for signal in SIGNALS {
            futex_wake_all(&self.counter(self.rank, signal).value);
        }
    }

    fn departed(&self, rank: usize) -> bool {
        self.control(rank).status.departed.load(Ordering::Acquire) != 0
    }

    fn publish_call(&self, seq: u64, call: CallDescriptor) {
        // A seqlock: readers that see the sequence change under them discard
        // what they read.
        let entry = &self.control(self.rank).published[(seq % 2) as usize];
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

    fn abort(&self, failure: Failure) -> Failure {
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
            global.abort_state.store(ABORT_SET, Ordering::Release);
        }
        for rank in 0..self.layout.nranks {
            for signal in SIGNALS {
                futex_wake_all(&self.counter(rank, signal).value);
            }
        }
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

impl Drop for ShmTransport {
    fn drop(&mut self) {
        // SAFETY: `base` and `total` are exactly the mapping made in `attach`; no
        // reference into it outlives the transport.
        unsafe {
            let _ = munmap(self.base.cast(), self.layout.total);
        }
    }
}
