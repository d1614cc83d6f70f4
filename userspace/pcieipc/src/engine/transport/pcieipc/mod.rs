//! The pcieipc transport: the engine's windows and counters in the shared BAR2
//! of ivshmem-doorbell devices bound by `/dev/pcieipc`, doorbells instead of
//! futex wakes, and the module's interrupt wait instead of a futex sleep.
//!
//! All ranks' devices belong to one ivshmem region, so each rank's BAR2 is the
//! same memory; it holds the shm segment's layout (`segment`: control page, a
//! block of counters per rank, then per rank its windows). A rank about to sleep
//! publishes which counter it sleeps on; a rank that stores that counter rings
//! the sleeper's doorbell (the peer id of the sleeper's device, vector 0),
//! which raises MSI-X vector 0 on the sleeper's device and ends its
//! `PCIEIPC_IOC_WAIT`. Ranks run on one host, so liveness is a pidfd per peer,
//! as in the shm transport.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::error::EngineError;
use super::link_events::LinkEvents;
use super::rendezvous;
use super::segment::{Layout, Segment, SegmentTransport, Signalling};
use super::transport::{Signal, TransportKind, WindowSizes, SIGNALS};
use crate::device::{
    BoundDevice, Device, DeviceError, DeviceKind, DeviceState, MappedWindow, WaitResult,
    DEFAULT_PATH,
};

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

pub(super) type PcieipcTransport = SegmentTransport<Doorbells>;

/// Doorbells and interrupt waits through this rank's device, whose BAR2
/// mapping this keeps.
pub(super) struct Doorbells {
    device: Device,
    /// This rank's device, as /dev/pcieipc listed it.
    mine: BoundDevice,
    /// Its ivshmem peer id.
    peer_id: u32,
    region: MappedWindow,
    /// The interrupt count of this rank's vector that the last wait returned:
    /// a doorbell rung since makes the next wait return at once.
    seen_interrupts: Cell<u64>,
}

impl PcieipcTransport {
    /// Sets up `rank`'s transport around the rendezvous `name`: rank 0 zeroes
    /// the control blocks of its device's region and tags it before it admits
    /// anyone (and tells those who join if it cannot); the others map their
    /// device's BAR2 once welcomed and check the tag.
    pub(crate) fn init(
        name: &str,
        rank: usize,
        nranks: usize,
        requested: WindowSizes,
        chosen: Option<u32>,
        join_timeout: Duration,
    ) -> Result<PcieipcTransport, EngineError> {
        let fail = |error: PcieipcError| EngineError::Pcieipc { rank, error };
        let open = || Device::open(DEFAULT_PATH).map_err(|source| fail(source.into()));
        if rank == 0 {
            // The rendezvous also creates the shm segment, sparse and never
            // mapped: this transport does not use it.
            let (joined, unattached) =
                rendezvous::host(name, nranks, requested, join_timeout, || {
                    let unattached =
                        Self::map(open()?, rank, nranks, requested, chosen).map_err(fail)?;
                    unattached.initialise(job_tag(name, std::process::id()));
                    unattached.publish_peer_id();
                    Ok(unattached)
                })?;
            unattached.watch(joined.pids)
        } else {
            let device = open()?;
            let joined = rendezvous::join(name, rank, nranks, join_timeout)?;
            let unattached = Self::map(device, rank, nranks, joined.sizes, chosen).map_err(fail)?;
            if unattached.segment.global().job_tag.load(Ordering::Acquire)
                != job_tag(name, joined.pids[0])
            {
                return Err(fail(PcieipcError::ForeignRegion {
                    device: unattached.signalling.mine.index,
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
        let base = NonNull::new(region.as_ptr()).expect("a mapped BAR is never at address 0");
        // SAFETY: `region` maps BAR2 from offset 0 (page aligned) for
        // `layout.total` bytes and moves into the transport with the segment;
        // its control area is only written through segments of this job's
        // layout once rank 0 has zeroed it.
        let segment = unsafe { Segment::new(base, layout) };
        let doorbells = Doorbells {
            peer_id: mine
                .peer_id
                .expect("select_device keeps devices with a peer id"),
            mine,
            device,
            region,
            seen_interrupts: Cell::new(seen),
        };
        Ok(PcieipcTransport::new(rank, segment, doorbells))
    }

    /// Follows the link above this rank's device through the module's events.
    pub(crate) fn link_events(&self) -> Result<Option<LinkEvents>, EngineError> {
        LinkEvents::open(&self.signalling.mine).map_err(|error| EngineError::Pcieipc {
            rank: self.rank,
            error: error.into(),
        })
    }

    /// Tells the peers which doorbell wakes this rank; done before it can
    /// first sleep.
    fn publish_peer_id(&self) {
        self.segment
            .control(self.rank)
            .status
            .peer_id
            .store(self.signalling.peer_id + 1, Ordering::SeqCst);
    }

    /// Rank 0, before anyone else attaches: a clean control area (a previous
    /// job's counters, abort record and peer ids are in the region), then the
    /// tag. Windows need no clearing: a slot is read only once its counter
    /// says it was written.
    fn initialise(&self, tag: u64) {
        // SAFETY: the control area is the first `windows` bytes of the mapping,
        // and no other rank of this job has mapped it yet.
        unsafe {
            std::ptr::write_bytes(
                self.signalling.region.as_ptr(),
                0,
                self.segment.layout().windows,
            )
        };
        self.segment.global().job_tag.store(tag, Ordering::SeqCst);
    }

    /// Rings the doorbell of every other rank asleep on `code` (any counter
    /// if `None`).
    fn wake(&self, code: Option<u32>) {
        for rank in (0..self.segment.layout().nranks).filter(|rank| *rank != self.rank) {
            let status = &self.segment.control(rank).status;
            let sleeping_on = status.sleeping_on.load(Ordering::SeqCst);
            if sleeping_on == 0 || code.is_some_and(|code| code != sleeping_on) {
                continue;
            }
            // A rank publishes its peer id before it first sleeps.
            let peer_id = status.peer_id.load(Ordering::Acquire).wrapping_sub(1);
            // A failed ring costs the sleeper at most its slice: it re-checks
            // the counter when its wait times out.
            let doorbells = &self.signalling;
            let _ = doorbells
                .device
                .ring(doorbells.mine.index, peer_id as u16, VECTOR);
        }
    }
}

impl Signalling for Doorbells {
    const KIND: TransportKind = TransportKind::Pcieipc;

    fn store(transport: &PcieipcTransport, owner: usize, signal: Signal, value: u32) {
        // SeqCst here and in `sleep`: either this store sees the sleeper's
        // `sleeping_on` and rings it, or the sleeper sees the new value and
        // does not wait. A doorbell is rung only when someone sleeps.
        transport
            .segment
            .counter(owner, signal)
            .value
            .store(value, Ordering::SeqCst);
        transport.wake(Some(sleep_code(owner, signal)));
    }

    fn sleep(
        transport: &PcieipcTransport,
        owner: usize,
        signal: Signal,
        observed: u32,
        slice: Duration,
    ) {
        let status = &transport.segment.control(transport.rank).status;
        status
            .sleeping_on
            .store(sleep_code(owner, signal), Ordering::SeqCst);
        if transport
            .segment
            .counter(owner, signal)
            .value
            .load(Ordering::SeqCst)
            == observed
        {
            // The module waits in whole milliseconds: rounding down would turn
            // the last sub-millisecond slice before a timeout into a spin.
            let timeout = Duration::from_millis(slice.as_micros().div_ceil(1000) as u64);
            let doorbells = &transport.signalling;
            match doorbells.device.wait(
                doorbells.mine.index,
                u32::from(VECTOR),
                doorbells.seen_interrupts.get(),
                Some(timeout),
            ) {
                Ok(WaitResult::Interrupt(count)) => doorbells.seen_interrupts.set(count),
                Ok(WaitResult::TimedOut | WaitResult::Interrupted) => {}
                // A frozen or gone device cannot wake us: sleep the slice out
                // so the caller's liveness and timeout checks still pace it.
                Err(_) => std::thread::sleep(timeout),
            }
        }
        status.sleeping_on.store(0, Ordering::SeqCst);
    }

    fn wake_departed(transport: &PcieipcTransport) {
        transport.wake(None);
    }

    fn wake_all(transport: &PcieipcTransport) {
        transport.wake(None);
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
}
