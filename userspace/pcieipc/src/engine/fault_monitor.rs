//! The fault monitor: one rank's view of the devices its job depends on.
//! It reads what its `LinkMonitor` reported (the transport's device, or the
//! device the rank follows through the kernel's tracepoints) and takes the action the
//! AER matrix gives each fault (`fault_policy`): nothing more than the
//! link's smaller chunk for a correctable error, a wait for the kernel's
//! recovery for a non-fatal one (and the opt-in retrain of a link left
//! degraded), and the job's failure, named for every rank, for a fatal one,
//! a surprise down or a device lost. The communicator owns it and polls it
//! between calls and on a bounded clock (`due`).

use std::time::{Duration, Instant};

use super::chunk::LinkFacts;
use super::error::EngineError;
use super::failure::Failure;
use super::fault_policy::{self, Fault, FaultAction, FaultBits, FaultRecord, Loss, Recovery};
use super::link_monitor::LinkMonitor;
use super::transport::Transport;
use crate::probe::bdf::Bdf;
use crate::trace::{monotonic_ns, Arg, Recorder};

/// How often a rank whose transport follows a device link polls it: a
/// non-blocking read, kept off the path of back-to-back small calls.
const POLL_PERIOD: Duration = Duration::from_millis(1);
/// How long a rank waits for the kernel's recovery of its device after an
/// uncorrectable error: the kernel's own fatal recovery (a secondary bus
/// reset and the link's retraining) takes about a second; peers wait for
/// the rank meanwhile, well within their `peer_timeout`.
pub(crate) const RECOVERY_WAIT: Duration = Duration::from_secs(10);

/// Where in the rank's calls a poll happens, for the records it keeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallPosition {
    /// The current call's number, or the next one's between calls.
    pub(crate) call: u64,
    pub(crate) in_call: bool,
}

pub(crate) struct FaultMonitor {
    rank: usize,
    /// The link this rank's data crosses: the transport's own device's, or
    /// a device followed through the kernel's tracepoints where the
    /// transport follows none (`CommOptions::link_device`); `None`: no
    /// device is followed.
    link: Option<Box<dyn LinkMonitor>>,
    /// Whether a link the kernel recovered but left degraded is retrained
    /// (`CommOptions::retrain_degraded`).
    retrain_degraded: bool,
    polled: Instant,
    /// The faults this rank acted on, oldest first.
    faults: Vec<FaultRecord>,
}

impl FaultMonitor {
    pub(crate) fn new(
        rank: usize,
        link: Option<Box<dyn LinkMonitor>>,
        retrain_degraded: bool,
    ) -> FaultMonitor {
        FaultMonitor {
            rank,
            link,
            retrain_degraded,
            polled: Instant::now(),
            faults: Vec::new(),
        }
    }

    /// The faults acted on, oldest first, each with the stall it cost.
    pub(crate) fn faults(&self) -> &[FaultRecord] {
        &self.faults
    }

    /// The followed link's facts as they stand, where one is followed.
    pub(crate) fn link_facts(&self) -> Option<LinkFacts> {
        self.link.as_ref()?.facts()
    }

    /// Whether a poll is due: at most one every `POLL_PERIOD`.
    pub(crate) fn due(&self) -> bool {
        self.polled.elapsed() >= POLL_PERIOD
    }

    /// Reads what happened since the last poll (never blocking, except to
    /// wait for a recovery a fault calls for), publishes the link's changed
    /// facts through `transport` as it learns them, and acts on each fault.
    /// A fault that fails the job is recorded in `transport`'s abort record
    /// and returned. A rank that follows nothing returns at once.
    pub(crate) fn poll(
        &mut self,
        transport: &Transport,
        at: CallPosition,
        trace: Option<&Recorder>,
    ) -> Result<(), EngineError> {
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        self.polled = Instant::now();
        let mut poll = link.poll();
        // Another rank's device lost: that rank fails, but what it records
        // goes with its device's memory, so every rank that sees the loss
        // names it.
        for mut fault in std::mem::take(&mut poll.lost_elsewhere) {
            let bdf = fault
                .bdf
                .parse::<Bdf>()
                .ok()
                .and_then(|bdf| bdf.to_abi().ok());
            fault.peer = bdf.and_then(|bdf| transport.rank_of_device(bdf));
            if fault.peer.is_some_and(|peer| peer != self.rank) {
                poll.faults.push(fault);
            }
        }
        if let Some(link) = poll.facts {
            if let Some(trace) = trace {
                trace.instant(
                    "link change",
                    "link",
                    monotonic_ns(),
                    [("link", Arg::Owned(format!("{link:?}")))],
                );
            }
            transport.publish_link(Some(link));
        }
        // After the facts the poll read: acting on a fault may change them
        // again (a retrain).
        for fault in poll.faults {
            if let Some(link) = self.act_on(transport, fault, at, trace)? {
                transport.publish_link(Some(link));
            }
        }
        Ok(())
    }

    /// Takes the action `fault` calls for; returns the link's facts after a
    /// retrain, where one ran.
    fn act_on(
        &mut self,
        transport: &Transport,
        fault: Fault,
        at: CallPosition,
        trace: Option<&Recorder>,
    ) -> Result<Option<LinkFacts>, EngineError> {
        let Some(mut action) = fault_policy::action(&fault) else {
            return Ok(None);
        };
        let started = Instant::now();
        let recovery = match (action, fault.lost) {
            (FaultAction::SmallerChunk, _) => None,
            // A lost device's recovery is over: nothing to wait for (and a
            // peer's device is the peer's to wait on).
            (_, Some(loss)) => Some(loss.recovery()),
            (FaultAction::AwaitRecovery | FaultAction::Fail, None) => Some(
                self.link
                    .as_mut()
                    .map_or(Recovery::Unfinished { waited_ms: 0 }, |link| {
                        link.await_recovery(RECOVERY_WAIT)
                    }),
            ),
        };
        if recovery
            .is_some_and(|recovery| !matches!(recovery, Recovery::Recovered | Recovery::Answering))
        {
            action = FaultAction::Fail;
        }
        // Through the module's link control: of the transport's own device,
        // or of the followed one where root allowed it (`link_control`).
        let retrained = (action == FaultAction::AwaitRecovery && self.retrain_degraded)
            .then(|| self.link.as_mut()?.retrain_degraded())
            .flatten();
        let record = FaultRecord {
            call: at.call,
            in_call: at.in_call,
            bits: FaultBits::of(&fault.errors),
            lost: fault.lost,
            peer: fault.peer,
            action,
            recovery,
            retrained,
            stall: started.elapsed(),
            bdf: fault.bdf,
        };
        if let Some(trace) = trace {
            trace.instant(
                "fault",
                "link",
                monotonic_ns(),
                [("fault", Arg::Owned(record.to_string()))],
            );
        }
        // The module and the kernel's trace name functions in PCI address
        // form, in domains the ABI encodes.
        let bdf = record
            .bdf
            .parse::<Bdf>()
            .ok()
            .and_then(|bdf| bdf.to_abi().ok())
            .unwrap_or(u32::MAX);
        let rank = fault.peer.unwrap_or(self.rank);
        let failure = (action == FaultAction::Fail).then(|| match fault.lost {
            Some(Loss::Removed) => Failure::DeviceRemoved { rank, bdf },
            _ => Failure::DeviceFault {
                rank,
                bdf,
                bits: record.bits,
                recovery: recovery.unwrap_or(Recovery::Unfinished { waited_ms: 0 }),
            },
        });
        self.faults.push(record);
        match failure {
            Some(failure) => Err(transport.abort(failure).into()),
            None => Ok(retrained),
        }
    }
}
