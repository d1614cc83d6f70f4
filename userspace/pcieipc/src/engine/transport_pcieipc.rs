//! The pcieipc transport: the engine's windows and counters in the shared BAR2
//! of ivshmem-doorbell devices bound by `/dev/pcieipc`, doorbells instead of
//! futex wakes, and the module's interrupt wait instead of a futex sleep.
//!
//! All ranks' devices belong to one ivshmem region, so each rank's BAR2 is the
//! same memory; it is laid out like the shm segment (control page, a block of
//! counters per rank, then per rank its windows). A rank about to sleep
//! publishes which counter it sleeps on; a rank that stores that counter rings
//! the sleeper's doorbell (the peer id of the sleeper's device, vector 0),
//! which raises MSI-X vector 0 on the sleeper's device and ends its
//! `PCIEIPC_IOC_WAIT`. Ranks run on one host, so liveness is a pidfd per peer,
//! as in the shm transport.

use std::cell::Cell;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::call::CallDescriptor;
use super::error::EngineError;
use super::failure::{Failure, FAILURE_WORDS};
use super::rendezvous;
use super::shm::pidfd_open;
use super::transport::{Signal, Transport, TransportKind, Window, WindowSizes, SIGNALS};
use crate::device::{
    BoundDevice, Device, DeviceError, DeviceKind, DeviceState, MappedWindow, WaitResult,
    DEFAULT_PATH,
};

const PAGE: usize = 4096;
/// The region's shared memory is BAR2 of an ivshmem-doorbell device.
const SHARED_BAR: u32 = 2;
/// Every doorbell of the transport raises vector 0: a region may have only one.
const VECTOR: u16 = 0;

/// Why the pcieipc transport could not be set up on a rank.
#[derive(Debug, thiserror::Error)]
pub enum PcieipcError {
    #[error(transparent)]
    Device(#[from] DeviceError),

    #[error(
        "needs bound ivshmem-doorbell device number {position} (counting from 0) of {path}, \
         but only {found} are bound"
    )]
    TooFewDevices {
        path: String,
        position: usize,
        found: usize,
    },

    #[error(
        "device {device} of {path} is not a bound ivshmem-doorbell device with a peer id \
         and a doorbell vector"
    )]
    NotIvshmem { path: String, device: u32 },

    #[error(
        "device {device}: BAR2 holds {bar_bytes} bytes, the windows of {nranks} ranks need \
         {needed} (use a larger region, or smaller chunks or fewer chunks in flight)"
    )]
    RegionTooSmall {
        device: u32,
        bar_bytes: u64,
        needed: usize,
        nranks: usize,
    },

    #[error(
        "device {device}: its BAR2 is not the region rank 0 set up for this job (the ranks' \
         devices belong to different ivshmem regions, or another job took the region)"
    )]
    ForeignRegion { device: u32 },
}

#[repr(C, align(64))]
struct Counter {
    value: AtomicU32,
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
    /// `sleep_code` of the counter this rank sleeps on, 0 while awake: a store
    /// rings the doorbell of exactly the ranks asleep on its counter.
    sleeping_on: AtomicU32,
    /// peer id + 1 of this rank's device, written before it first sleeps.
    peer_id: AtomicU32,
}

#[repr(C)]
struct RankControl {
    counters: [Counter; SIGNALS.len()],
    status: RankStatus,
    /// Indexed by call parity, as in the shm transport.
    published: [PublishedCall; 2],
}

const ABORT_NONE: u32 = 0;
const ABORT_WRITING: u32 = 1;
const ABORT_SET: u32 = 2;

#[repr(C, align(64))]
struct GlobalControl {
    /// The job's tag, written by rank 0 once the control blocks are zeroed:
    /// the other ranks check it to prove their BAR2 is the same region.
    job_tag: AtomicU64,
    abort_state: AtomicU32,
    abort_words: [AtomicU64; FAILURE_WORDS],
}

/// Where everything lives in the region; a pure function of the rank count and
/// window sizes, so every rank computes the same offsets.
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

fn sleep_code(owner: usize, signal: Signal) -> u32 {
    (owner * SIGNALS.len() + signal as usize + 1) as u32
}

/// A tag only this job's rank 0 writes: FNV-1a of the rendezvous name and
/// rank 0's pid, both of which every rank knows after the rendezvous.
fn job_tag(name: &str, rank0_pid: u32) -> u64 {
    name.bytes()
        .chain(rank0_pid.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
        // Zero is what a zeroed region holds.
        .max(1)
}

/// The ivshmem-doorbell device `rank` uses: `chosen` if given, else the
/// `rank`-th bound one.
fn select_device(
    device: &Device,
    rank: usize,
    chosen: Option<u32>,
) -> Result<BoundDevice, PcieipcError> {
    let path = device.path().display().to_string();
    let usable = |candidate: &BoundDevice| {
        candidate.kind == DeviceKind::Ivshmem
            && candidate.state == DeviceState::Bound
            && candidate.peer_id.is_some()
            && candidate.num_vectors > u32::from(VECTOR)
    };
    let devices = device.list()?;
    match chosen {
        Some(index) => devices
            .into_iter()
            .find(|candidate| candidate.index == index && usable(candidate))
            .ok_or(PcieipcError::NotIvshmem {
                path,
                device: index,
            }),
        None => {
            let mut usable: Vec<BoundDevice> = devices.into_iter().filter(usable).collect();
            let found = usable.len();
            if rank >= found {
                return Err(PcieipcError::TooFewDevices {
                    path,
                    position: rank,
                    found,
                });
            }
            Ok(usable.swap_remove(rank))
        }
    }
}

pub struct PcieipcTransport {
    rank: usize,
    layout: Layout,
    device: Device,
    /// This rank's device: its index in /dev/pcieipc and its ivshmem peer id.
    index: u32,
    peer_id: u32,
    region: MappedWindow,
    /// The interrupt count of this rank's vector that the last wait returned:
    /// a doorbell rung since makes the next wait return at once.
    seen_interrupts: Cell<u64>,
    /// One per rank; `None` for this rank.
    peer_pidfds: Vec<Option<OwnedFd>>,
    pids: Vec<u32>,
}

// SAFETY: the mapping is process-wide and every shared field is accessed through
// atomics or through windows whose ownership the counters hand over; the Cell
// is only touched by the thread that owns the transport.
unsafe impl Send for PcieipcTransport {}

impl PcieipcTransport {
    /// Sets up `rank`'s transport around the rendezvous `name`: rank 0 zeroes
    /// the control blocks of its device's region and tags it before it admits
    /// anyone; the others map their device's BAR2 once welcomed and check the
    /// tag.
    pub(crate) fn init(
        name: &str,
        rank: usize,
        nranks: usize,
        requested: WindowSizes,
        chosen: Option<u32>,
        join_timeout: Duration,
    ) -> Result<PcieipcTransport, EngineError> {
        let fail = |error: PcieipcError| EngineError::Pcieipc { rank, error };
        let device = Device::open(DEFAULT_PATH).map_err(|source| fail(source.into()))?;
        if rank == 0 {
            let unattached = Self::map(device, rank, nranks, requested, chosen).map_err(fail)?;
            unattached.initialise(job_tag(name, std::process::id()));
            unattached.publish_peer_id();
            // The rendezvous also creates the shm segment, sparse and never
            // mapped: this transport does not use it.
            let joined = rendezvous::host(name, nranks, requested, join_timeout)?;
            unattached.watch(joined.pids)
        } else {
            let joined = rendezvous::join(name, rank, nranks, join_timeout)?;
            let unattached = Self::map(device, rank, nranks, joined.sizes, chosen).map_err(fail)?;
            if unattached.global().job_tag.load(Ordering::Acquire) != job_tag(name, joined.pids[0])
            {
                return Err(fail(PcieipcError::ForeignRegion {
                    device: unattached.index,
                }));
            }
            unattached.publish_peer_id();
            unattached.watch(joined.pids)
        }
    }

    /// Maps the region through `rank`'s device; peers are not watched yet.
    fn map(
        device: Device,
        rank: usize,
        nranks: usize,
        sizes: WindowSizes,
        chosen: Option<u32>,
    ) -> Result<PcieipcTransport, PcieipcError> {
        let mine = select_device(&device, rank, chosen)?;
        let layout = Layout::new(nranks, sizes);
        let bar_bytes = mine
            .bars
            .iter()
            .find(|bar| bar.index == SHARED_BAR)
            .map_or(0, |bar| bar.size);
        if (bar_bytes as usize) < layout.total {
            return Err(PcieipcError::RegionTooSmall {
                device: mine.index,
                bar_bytes,
                needed: layout.total,
                nranks,
            });
        }
        let region = device.map_bar(mine.index, SHARED_BAR, 0, layout.total)?;
        let seen = device.counters(mine.index)?[usize::from(VECTOR)];
        Ok(PcieipcTransport {
            rank,
            layout,
            index: mine.index,
            peer_id: mine
                .peer_id
                .expect("select_device keeps devices with a peer id"),
            device,
            region,
            seen_interrupts: Cell::new(seen),
            peer_pidfds: Vec::new(),
            pids: Vec::new(),
        })
    }

    /// Tells the peers which doorbell wakes this rank; done before it can
    /// first sleep.
    fn publish_peer_id(&self) {
        self.control(self.rank)
            .status
            .peer_id
            .store(self.peer_id + 1, Ordering::SeqCst);
    }

    /// Rank 0, before anyone else attaches: a clean control area (a previous
    /// job's counters, abort record and peer ids are in the region), then the
    /// tag. Windows need no clearing: a slot is read only once its counter
    /// says it was written.
    fn initialise(&self, tag: u64) {
        // SAFETY: the control area is the first `windows` bytes of the mapping,
        // and no other rank of this job has mapped it yet.
        unsafe { std::ptr::write_bytes(self.region.as_ptr(), 0, self.layout.windows) };
        self.global().job_tag.store(tag, Ordering::SeqCst);
    }

    /// Opens a pidfd per peer, as the shm transport does.
    fn watch(mut self, pids: Vec<u32>) -> Result<PcieipcTransport, EngineError> {
        for (peer, pid) in pids.iter().enumerate() {
            if peer == self.rank {
                self.peer_pidfds.push(None);
                continue;
            }
            match pidfd_open(*pid) {
                Ok(pidfd) => self.peer_pidfds.push(Some(pidfd)),
                Err(_) => {
                    let failure = Failure::PeerDied {
                        rank: peer,
                        pid: *pid,
                    };
                    return Err(self.abort(failure).into());
                }
            }
        }
        self.pids = pids;
        Ok(self)
    }

    fn global(&self) -> &GlobalControl {
        // SAFETY: the control page is at the start of the mapping (page aligned),
        // zero-initialised atomics are valid, and the mapping outlives `self`.
        unsafe { &*self.region.as_ptr().cast::<GlobalControl>() }
    }

    fn control(&self, rank: usize) -> &RankControl {
        assert!(rank < self.layout.nranks, "rank {rank} out of range");
        // SAFETY: `Layout` reserves nranks RankControl blocks at `controls`;
        // the mapping is page aligned and outlives `self`.
        unsafe {
            &*self
                .region
                .as_ptr()
                .add(self.layout.controls)
                .cast::<RankControl>()
                .add(rank)
        }
    }

    fn counter(&self, owner: usize, signal: Signal) -> &AtomicU32 {
        &self.control(owner).counters[signal as usize].value
    }

    /// Rings the doorbell of every other rank asleep on `code` (any counter
    /// if `None`).
    fn wake(&self, code: Option<u32>) {
        for rank in (0..self.layout.nranks).filter(|rank| *rank != self.rank) {
            let status = &self.control(rank).status;
            let sleeping_on = status.sleeping_on.load(Ordering::SeqCst);
            if sleeping_on == 0 || code.is_some_and(|code| code != sleeping_on) {
                continue;
            }
            // A rank publishes its peer id before it first sleeps.
            let peer_id = status.peer_id.load(Ordering::Acquire).wrapping_sub(1);
            // A failed ring costs the sleeper at most its slice: it re-checks
            // the counter when its wait times out.
            let _ = self.device.ring(self.index, peer_id as u16, VECTOR);
        }
    }
}

impl Transport for PcieipcTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Pcieipc
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
            self.region
                .as_ptr()
                .add(self.layout.windows + owner * self.layout.per_rank_windows + offset)
        }
    }

    fn load(&self, owner: usize, signal: Signal) -> u32 {
        self.counter(owner, signal).load(Ordering::Acquire)
    }

    fn store(&self, owner: usize, signal: Signal, value: u32) {
        // SeqCst here and in `sleep`: either this store sees the sleeper's
        // `sleeping_on` and rings it, or the sleeper sees the new value and
        // does not wait. A doorbell is rung only when someone sleeps.
        self.counter(owner, signal).store(value, Ordering::SeqCst);
        self.wake(Some(sleep_code(owner, signal)));
    }

    fn sleep(&self, owner: usize, signal: Signal, observed: u32, slice: Duration) {
        let status = &self.control(self.rank).status;
        status
            .sleeping_on
            .store(sleep_code(owner, signal), Ordering::SeqCst);
        if self.counter(owner, signal).load(Ordering::SeqCst) == observed {
            // The module waits in whole milliseconds: rounding down would turn
            // the last sub-millisecond slice before a timeout into a spin.
            let timeout = Duration::from_millis(slice.as_micros().div_ceil(1000) as u64);
            match self.device.wait(
                self.index,
                u32::from(VECTOR),
                self.seen_interrupts.get(),
                Some(timeout),
            ) {
                Ok(WaitResult::Interrupt(count)) => self.seen_interrupts.set(count),
                Ok(WaitResult::TimedOut | WaitResult::Interrupted) => {}
                // A frozen or gone device cannot wake us: sleep the slice out
                // so the caller's liveness and timeout checks still pace it.
                Err(_) => std::thread::sleep(timeout),
            }
        }
        status.sleeping_on.store(0, Ordering::SeqCst);
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
            .store(1, Ordering::SeqCst);
        // A peer asleep on one of this rank's counters must notice the departure.
        self.wake(None);
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
            global.abort_state.store(ABORT_SET, Ordering::SeqCst);
        }
        self.wake(None);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_tags_differ_by_name_and_pid_and_are_never_zero() {
        assert_ne!(job_tag("bench-1", 7), job_tag("bench-2", 7));
        assert_ne!(job_tag("bench-1", 7), job_tag("bench-1", 8));
        assert_eq!(job_tag("bench-1", 7), job_tag("bench-1", 7));
        assert_ne!(job_tag("", 0), 0);
    }

    #[test]
    fn sleep_codes_are_distinct_and_nonzero() {
        let codes: Vec<u32> = (0..4)
            .flat_map(|owner| SIGNALS.map(|signal| sleep_code(owner, signal)))
            .collect();
        assert!(codes.iter().all(|code| *code != 0));
        let mut unique = codes.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), codes.len());
    }

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
