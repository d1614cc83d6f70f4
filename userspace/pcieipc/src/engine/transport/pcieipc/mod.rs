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
pub(crate) use link_events::tracefs_root;

use super::config::{Registered, Setup, TransportConfig, TransportOptions};
use super::segment::{SegmentTransport, Signalling};
use super::{Capabilities, LinkPoll, Signal, Transport, SIGNALS};
use crate::device::{BoundDevice, Device, MappedWindow, WaitResult};
use crate::engine::chunk::LinkFacts;
use crate::engine::error::EngineError;
use crate::engine::fault_policy::Recovery;
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
        <Doorbells as Signalling>::CAPABILITIES
    }

    fn open(&self, setup: &Setup<'_>) -> Result<Box<dyn Transport>, EngineError> {
        Ok(Box::new(PcieipcTransport::init(setup, self.device)?))
    }
}

fn sleep_code(owner: usize, signal: Signal) -> u32 {
    (owner * SIGNALS.len() + signal as usize + 1) as u32
}

type PcieipcTransport = SegmentTransport<Doorbells>;

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

impl PcieipcTransport {
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
            self.note_wake();
        }
    }
}

impl Signalling for Doorbells {
    const NAME: &'static str = REGISTERED.name;
    const SLEEP_NAME: &'static str = "MSI-X WAIT";
    const WAKE_NAME: &'static str = "doorbell";
    const CAPABILITIES: Capabilities = Capabilities {
        peer_reads: false,
        link_events: true,
        device_memory: true,
    };

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

    fn device_link(&self) -> Option<LinkFacts> {
        self.link_events.as_ref().and_then(LinkEvents::facts)
    }

    fn poll_link(&mut self) -> LinkPoll {
        self.link_events
            .as_mut()
            .map_or_else(LinkPoll::default, LinkEvents::poll)
    }

    fn retrain_degraded_link(&mut self) -> Option<LinkFacts> {
        self.link_events.as_mut()?.retrain_degraded()
    }

    fn await_recovery(&mut self, bound: Duration) -> Recovery {
        match self.link_events.as_mut() {
            Some(link_events) => link_events.await_recovery(bound),
            None => Recovery::Unfinished { waited_ms: 0 },
        }
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
