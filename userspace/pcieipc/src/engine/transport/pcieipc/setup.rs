//! Setting up a rank: choosing its device, mapping the region through it,
//! and proving every rank maps the same region.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::super::config::Setup;
use super::super::rendezvous;
use super::super::segment::{page_aligned, Layout, Segment, Transport};
use super::super::WindowSizes;
use super::link_events::LinkEvents;
use super::{Doorbells, PcieipcError, REGISTERED, SHARED_BAR, VECTOR};
use crate::device::{BoundDevice, Device, DeviceKind, DeviceState, DEFAULT_PATH};
use crate::engine::error::EngineError;
use crate::probe::bdf::Bdf;

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

/// A rank's region mapped through its device, not yet a transport.
struct Mapped {
    rank: usize,
    segment: Segment,
    doorbells: Doorbells,
}

/// Sets up `rank`'s transport around the rendezvous `name`: rank 0 zeroes
/// the control blocks of its device's region and tags it before it admits
/// anyone (and tells those who join if it cannot); the others map their
/// device's BAR2 once welcomed and check the tag. `chosen`: the device, or
/// the rank-th usable one.
pub(super) fn init(setup: &Setup<'_>, chosen: Option<u32>) -> Result<Transport, EngineError> {
    let Setup {
        rendezvous: name,
        rank,
        nranks,
        join_timeout,
        ..
    } = *setup;
    let secret = setup.secret.as_ref();
    let requested = page_aligned(setup.sizes);
    // A setup failure is the transport's, on this rank.
    let fail = |error: PcieipcError| EngineError::transport(rank, REGISTERED.name, error);
    let open = || Device::open(DEFAULT_PATH).map_err(|source| fail(source.into()));
    let (mut mapped, pids) = if rank == 0 {
        // The rendezvous also creates the shm segment, sparse and never
        // mapped: this transport does not use it.
        let (joined, mapped) =
            rendezvous::host(name, secret, nranks, requested, join_timeout, || {
                let mapped = Mapped::new(open()?, rank, nranks, requested, chosen).map_err(fail)?;
                mapped.initialise(job_tag(name, std::process::id()));
                mapped.publish_device();
                Ok(mapped)
            })?;
        (mapped, joined.pids)
    } else {
        let device = open()?;
        let joined = rendezvous::join(name, secret, rank, nranks, join_timeout)?;
        let mapped = Mapped::new(device, rank, nranks, joined.sizes, chosen).map_err(fail)?;
        if mapped.segment.global().job_tag.load(Ordering::Acquire) != job_tag(name, joined.pids[0])
        {
            return Err(fail(PcieipcError::ForeignRegion {
                device: mapped.doorbells.mine.index,
            }));
        }
        mapped.publish_device();
        (mapped, joined.pids)
    };
    mapped.doorbells.link_events = Some(LinkEvents::open(&mapped.doorbells.mine).map_err(fail)?);
    Transport::new(rank, mapped.segment, Box::new(mapped.doorbells), pids)
}

impl Mapped {
    /// Maps the region through `device`'s BAR2.
    fn new(
        device: Device,
        rank: usize,
        nranks: usize,
        sizes: WindowSizes,
        chosen: Option<u32>,
    ) -> Result<Mapped, PcieipcError> {
        let mine = select_device(&device, rank, chosen)?;
        let layout = Layout::new(nranks, sizes).map_err(PcieipcError::WindowSizes)?;
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
            link_events: None,
        };
        Ok(Mapped {
            rank,
            segment,
            doorbells,
        })
    }

    /// Tells the peers which device this rank maps the region through and
    /// which doorbell wakes it; done before it can first sleep.
    fn publish_device(&self) {
        if let Some(bdf) = self
            .doorbells
            .mine
            .bdf
            .parse::<Bdf>()
            .ok()
            .and_then(|bdf| bdf.to_abi().ok())
        {
            self.segment.publish_device(self.rank, bdf);
        }
        self.segment
            .control(self.rank)
            .status
            .peer_id
            .store(self.doorbells.peer_id + 1, Ordering::SeqCst);
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
                self.doorbells.region.as_ptr(),
                0,
                self.segment.layout().windows,
            )
        };
        self.segment.global().job_tag.store(tag, Ordering::SeqCst);
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
}
