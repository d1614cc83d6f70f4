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

mod error;
mod link_events;
mod setup;

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub use error::PcieipcError;

use super::config::{Registered, Setup, TransportConfig, TransportOptions};
use super::segment::{Kind, Segment, Signalling, Transport};
use super::{Capabilities, Signal, SIGNALS};
use crate::device::{BoundDevice, Device, MappedWindow, WaitResult};
use crate::engine::error::EngineError;
use crate::engine::link_monitor::LinkMonitor;
use link_events::LinkEvents;

/// The region's shared memory is BAR2 of an ivshmem-doorbell device.
const SHARED_BAR: u32 = 2;
/// Every doorbell of the transport raises vector 0: a region may have only one.
const VECTOR: u16 = 0;

/// The pcieipc transport's options.
#[derive(Clone, Copy, Debug, Default)]
pub struct PcieipcOptions {
    /// This rank's device: this index of /dev/pcieipc; `None` takes the
    /// rank-th bound ivshmem-doorbell device.
    pub device: Option<u32>,
}

pub(super) const REGISTERED: Registered = Registered {
    name: "pcieipc",
    summary: "the shared BAR2 of ivshmem-doorbell devices bound by /dev/pcieipc, rank r on \
              the r-th, doorbells and MSI-X interrupt waits",
    defaults: || TransportOptions::new(PcieipcOptions::default()),
};

impl TransportConfig for PcieipcOptions {
    fn name(&self) -> &'static str {
        REGISTERED.name
    }

    fn capabilities(&self) -> Capabilities {
        KIND.capabilities
    }

    fn open(&self, setup: &Setup<'_>) -> Result<Transport, EngineError> {
        setup::init(setup, self.device)
    }
}

const KIND: Kind = Kind {
    name: REGISTERED.name,
    capabilities: Capabilities {
        peer_reads: false,
        link_events: true,
        device_memory: true,
    },
    sleep_name: "MSI-X WAIT",
    wake_name: "doorbell",
};

fn sleep_code(owner: usize, signal: Signal) -> u32 {
    (owner * SIGNALS.len() + signal as usize + 1) as u32
}

/// Doorbells and interrupt waits through this rank's device, whose BAR2
/// mapping this keeps.
pub(crate) struct Doorbells {
    device: Device,
    /// This rank's device, as /dev/pcieipc listed it.
    mine: BoundDevice,
    /// Its ivshmem peer id.
    peer_id: u32,
    region: MappedWindow,
    /// The interrupt count of this rank's vector that the last wait returned:
    /// a doorbell rung since makes the next wait return at once.
    seen_interrupts: Cell<u64>,
    /// The device's faults and the link above it (set once the rank is
    /// set up).
    link_events: Option<LinkEvents>,
}

impl Doorbells {
    /// Rings the doorbell of every other rank asleep on `code` (any counter
    /// if `None`), as `rank`; returns how many it rang.
    fn ring_sleepers(&self, segment: &Segment, rank: usize, code: Option<u32>) -> usize {
        let mut rung = 0;
        for peer in (0..segment.layout().nranks).filter(|peer| *peer != rank) {
            let status = &segment.control(peer).status;
            let sleeping_on = status.sleeping_on.load(Ordering::SeqCst);
            if sleeping_on == 0 || code.is_some_and(|code| code != sleeping_on) {
                continue;
            }
            // A rank publishes its peer id before it first sleeps.
            let peer_id = status.peer_id.load(Ordering::Acquire).wrapping_sub(1);
            // A failed ring costs the sleeper at most its slice: it re-checks
            // the counter when its wait times out.
            let _ = self.device.ring(self.mine.index, peer_id as u16, VECTOR);
            rung += 1;
        }
        rung
    }
}

impl Signalling for Doorbells {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn store(
        &self,
        segment: &Segment,
        rank: usize,
        owner: usize,
        signal: Signal,
        value: u32,
    ) -> usize {
        // SeqCst here and in `sleep`: either this store sees the sleeper's
        // `sleeping_on` and rings it, or the sleeper sees the new value and
        // does not wait. A doorbell is rung only when someone sleeps.
        segment
            .counter(owner, signal)
            .value
            .store(value, Ordering::SeqCst);
        self.ring_sleepers(segment, rank, Some(sleep_code(owner, signal)))
    }

    fn sleep(
        &self,
        segment: &Segment,
        rank: usize,
        owner: usize,
        signal: Signal,
        observed: u32,
        slice: Duration,
    ) {
        let status = &segment.control(rank).status;
        status
            .sleeping_on
            .store(sleep_code(owner, signal), Ordering::SeqCst);
        if segment.counter(owner, signal).value.load(Ordering::SeqCst) == observed {
            // The module waits in whole milliseconds: rounding down would turn
            // the last sub-millisecond slice before a timeout into a spin.
            let timeout = Duration::from_millis(slice.as_micros().div_ceil(1000) as u64);
            match self.device.wait(
                self.mine.index,
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

    fn wake(&self, segment: &Segment, rank: usize, _only_on: Option<usize>) -> usize {
        // A doorbell says nothing of the counter: ring every sleeper.
        self.ring_sleepers(segment, rank, None)
    }

    fn take_link_monitor(&mut self) -> Option<Box<dyn LinkMonitor>> {
        self.link_events
            .take()
            .map(|events| Box::new(events) as Box<dyn LinkMonitor>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
