//! The shm transport: one memfd segment shared by all ranks of a host.
//!
//! The segment exists only as a memfd (nothing under /dev/shm): rank 0 creates
//! it, passes the descriptor over the rendezvous socket, and every rank closes
//! its descriptor once mapped, so the memory is freed when the last rank unmaps
//! it, however the ranks end. Waiting ranks sleep on futex words inside the
//! segment (shared futexes: no FUTEX_PRIVATE_FLAG, since the word is in several
//! processes); liveness comes from a pidfd per peer.

use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sys::mman::{madvise, mmap, munmap, MapFlags, MmapAdvise, ProtFlags};

mod peer_reads;

use super::config::{Registered, Setup, TransportConfig, TransportOptions};
use super::rendezvous;
use super::segment::memfd::check_segment;
use super::segment::{page_aligned, Kind, Layout, Segment, Signalling, Transport};
use super::{Capabilities, Signal, WindowSizes, SIGNALS};
use crate::engine::error::EngineError;

/// The shm transport's options: it has none of its own.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShmOptions;

pub(super) const REGISTERED: Registered = Registered {
    name: "shm",
    summary: "a memfd segment in host memory shared by the ranks of one host, futex sleeps",
    defaults: || TransportOptions::new(ShmOptions),
};

impl TransportConfig for ShmOptions {
    fn name(&self) -> &'static str {
        REGISTERED.name
    }

    fn capabilities(&self) -> Capabilities {
        KIND.capabilities
    }

    fn open(&self, setup: &Setup<'_>) -> Result<Transport, EngineError> {
        let sizes = page_aligned(setup.sizes);
        let joined = if setup.rank == 0 {
            rendezvous::host(
                setup.rendezvous,
                setup.secret.as_ref(),
                setup.nranks,
                sizes,
                setup.join_timeout,
                || Ok(()),
            )?
            .0
        } else {
            rendezvous::join(
                setup.rendezvous,
                setup.secret.as_ref(),
                setup.rank,
                setup.nranks,
                setup.join_timeout,
            )?
        };
        attach(joined.segment, setup.rank, joined.sizes, joined.pids)
    }
}

const KIND: Kind = Kind {
    name: REGISTERED.name,
    capabilities: Capabilities {
        peer_reads: true,
        link_events: false,
        device_memory: false,
    },
    sleep_name: "futex sleep",
    wake_name: "futex wake",
};

/// Futex sleeps and wakes on the counters of the memfd segment, which this
/// keeps mapped.
pub(crate) struct Futexes {
    mapping: NonNull<std::ffi::c_void>,
    length: usize,
    /// Held while this rank lets its peers read its memory.
    peer_reads: std::sync::Mutex<Option<peer_reads::Permission>>,
}

// SAFETY: the mapping is process-wide; `Futexes` only unmaps it.
unsafe impl Send for Futexes {}

impl Drop for Futexes {
    fn drop(&mut self) {
        // SAFETY: `mapping` and `length` are exactly the mapping made in
        // `attach`; the transport's segment, the only view of it, drops with it.
        unsafe {
            let _ = munmap(self.mapping, self.length);
        }
    }
}

/// Maps the segment `fd` (then closes the descriptor) and watches the
/// peers' processes.
fn attach(
    fd: OwnedFd,
    rank: usize,
    sizes: WindowSizes,
    pids: Vec<u32>,
) -> Result<Transport, EngineError> {
    let layout =
        Layout::new(pids.len(), sizes).map_err(|reason| EngineError::BadWindowSizes { reason })?;
    check_segment(&fd, &layout)?;
    let length = NonZeroUsize::new(layout.total).expect("segment holds at least its control page");
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
    // SAFETY: the mapping just made is page aligned, `layout.total` bytes
    // long, zeroed or written only by ranks of this layout, and unmapped
    // only when `Futexes` drops with the transport.
    let segment = unsafe { Segment::new(base.cast(), layout) };
    let futexes = Futexes {
        mapping: base,
        length: layout.total,
        peer_reads: std::sync::Mutex::new(None),
    };
    Transport::new(rank, segment, Box::new(futexes), pids)
}

fn wake_all_counters_of(segment: &Segment, rank: usize) {
    for signal in SIGNALS {
        futex_wake_all(&segment.counter(rank, signal).value);
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

impl Signalling for Futexes {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn allow_peer_reads(&self, peers: &[u32]) -> bool {
        let mut held = self
            .peer_reads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        held.get_or_insert_with(|| peer_reads::Permission::acquire(peers));
        true
    }

    fn end_peer_reads(&self) {
        let mut held = self
            .peer_reads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *held = None;
    }

    fn prepare(&self, start: *mut u8, len: usize, write: bool) {
        let Some(start) = NonNull::new(start.cast::<std::ffi::c_void>()) else {
            return;
        };
        let advice = if write {
            MmapAdvise::MADV_POPULATE_WRITE
        } else {
            MmapAdvise::MADV_POPULATE_READ
        };
        // SAFETY: `start` and `len` lie inside the segment's mapping, which
        // lives as long as `self`; populating changes no byte of it. Where it
        // fails (a kernel before 5.14, memory short) the pages are faulted in
        // by the first touch instead, as without it.
        let _ = unsafe { madvise(start, len, advice) };
    }

    fn read_peer(&self, pid: u32, address: u64, into: &mut [u8]) -> std::io::Result<()> {
        peer_reads::read(pid, address, into)
    }

    fn store(
        &self,
        segment: &Segment,
        _rank: usize,
        owner: usize,
        signal: Signal,
        value: u32,
    ) -> usize {
        let counter = segment.counter(owner, signal);
        // SeqCst on both the value and the waiter count (here and in `sleep`):
        // either this store sees the sleeper registered, or the sleeper sees the
        // new value before it sleeps. A syscall is paid only when someone sleeps.
        counter.value.store(value, Ordering::SeqCst);
        if counter.waiters.load(Ordering::SeqCst) == 0 {
            return 0;
        }
        futex_wake_all(&counter.value);
        1
    }

    fn sleep(
        &self,
        segment: &Segment,
        _rank: usize,
        owner: usize,
        signal: Signal,
        observed: u32,
        slice: Duration,
    ) {
        let counter = segment.counter(owner, signal);
        counter.waiters.fetch_add(1, Ordering::SeqCst);
        if counter.value.load(Ordering::SeqCst) == observed {
            futex_wait(&counter.value, observed, slice);
        }
        counter.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    fn wake(&self, segment: &Segment, _rank: usize, only_on: Option<usize>) -> usize {
        match only_on {
            Some(rank) => wake_all_counters_of(segment, rank),
            None => {
                (0..segment.layout().nranks).for_each(|rank| wake_all_counters_of(segment, rank))
            }
        }
        // Futex wakes do not say whom they woke; traces count stores' wakes.
        0
    }
}
