//! A rank among its peers: waiting for them (a bounded spin, then sleeps in
//! slices between which failures, dead or departed peers, mismatched calls,
//! this rank's device faults and the timeout are checked, so a wait always
//! ends, and a failed one names the rank at fault), and what it keeps doing
//! while it waits (serving its successor's resends). `Peers` owns the
//! transport and the parts every wait consults: the call agreement, the
//! fault monitor, the resend shadows and the trace.

use std::time::{Duration, Instant};

use super::agreement::{Agreement, Published};
use super::shadows::Shadows;
use crate::engine::call::{CallDescriptor, CallKind};
use crate::engine::error::EngineError;
use crate::engine::failure::{Corruption, Failure};
use crate::engine::fault_monitor::{CallPosition, FaultMonitor};
use crate::engine::fault_policy::FaultRecord;
use crate::engine::schedule::Algorithm;
use crate::engine::slot_fill::SlotFill;
use crate::engine::transport::{Signal, Transport};
use crate::trace::{monotonic_ns, Arg, Recorder};

/// How long a waiting rank that is not bound to a CPU polls before it starts
/// yielding its core between polls.
const EAGER_SPIN: Duration = Duration::from_micros(2);

/// How long a blocked rank sleeps between liveness and timeout checks: the
/// bound on how late a dead peer is noticed, and few enough wake-ups that a
/// rank waiting for a late peer costs next to no CPU.
const LIVENESS_SLICE: Duration = Duration::from_millis(10);

/// Whether a counter at `value` has reached `target` (wrapping).
fn reached(value: u32, target: u32) -> bool {
    value.wrapping_sub(target) as i32 >= 0
}

/// How a rank waits: how long it spins, and when it names a peer.
#[derive(Clone, Copy)]
pub(crate) struct WaitPolicy {
    /// How long a wait polls before it sleeps (`CommOptions::spin`).
    pub(crate) spin: Duration,
    /// How long of that it polls back to back before it yields its core
    /// between polls: all of it for a rank bound to a CPU, whose peer is
    /// never queued on its core.
    pub(crate) yield_after: Duration,
    pub(crate) peer_timeout: Duration,
    /// Still joining (init's agreements), a peer may be slow to arrive
    /// without being stuck: it has the rendezvous's time, not a call's.
    pub(crate) join_timeout: Duration,
}

impl WaitPolicy {
    pub(crate) fn new(
        spin: Duration,
        bound_to_cpu: bool,
        peer_timeout: Duration,
        join_timeout: Duration,
    ) -> WaitPolicy {
        WaitPolicy {
            spin,
            yield_after: if bound_to_cpu { spin } else { EAGER_SPIN },
            peer_timeout,
            join_timeout,
        }
    }
}

pub(crate) struct Peers {
    pub(crate) transport: Transport,
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) agreement: Agreement,
    /// The devices the job depends on, and the faults acted on.
    monitor: FaultMonitor,
    /// What this rank posted, where chunk checksums are on: kept to be
    /// written again while the successor asks.
    pub(crate) shadows: Option<Shadows>,
    pub(crate) policy: WaitPolicy,
    /// Whether `init` is still agreeing with the peers: waits then last up
    /// to `join_timeout`, not `peer_timeout`.
    pub(crate) joining: bool,
    /// This rank's timeline, when tracing.
    pub(crate) trace: Option<Recorder>,
}

impl Peers {
    pub(crate) fn new(
        transport: Transport,
        agreement: Agreement,
        monitor: FaultMonitor,
        shadows: Option<Shadows>,
        policy: WaitPolicy,
        trace: Option<Recorder>,
    ) -> Peers {
        Peers {
            rank: transport.rank(),
            nranks: transport.nranks(),
            transport,
            agreement,
            monitor,
            shadows,
            policy,
            joining: true,
            trace,
        }
    }

    pub(crate) fn successor(&self) -> usize {
        (self.rank + 1) % self.nranks
    }

    pub(crate) fn predecessor(&self) -> usize {
        (self.rank + self.nranks - 1) % self.nranks
    }

    /// The faults on this rank's device link it acted on, oldest first.
    pub(crate) fn faults(&self) -> &[FaultRecord] {
        self.monitor.faults()
    }

    /// Starts the call `call` describes (its decisions still open; this
    /// rank's output is its input where `in_place`): refuses if the
    /// communicator has failed, acts on the device's faults, settles the
    /// chunk size and slot fill (deciding them, or adopting rank 0's), and
    /// publishes the call for the peers to check.
    pub(crate) fn begin_call(
        &mut self,
        mut call: CallDescriptor,
        in_place: bool,
    ) -> Result<CallDescriptor, EngineError> {
        if let Some(trace) = &self.trace {
            trace.begin_call();
        }
        if let Some(failure) = self.transport.failure() {
            return Err(failure.into());
        }
        self.follow_faults()?;
        if call.algorithm == Algorithm::Ring {
            if self.rank == Agreement::decider(&call) {
                self.agreement.decide(&self.transport, &mut call, in_place);
            } else if call.kind != CallKind::Broadcast {
                (call.chunk_bytes, call.bypass_slots) = self.adopt_decision(call)?;
            }
        }
        self.agreement.start(&self.transport, call);
        Ok(call)
    }

    /// Ends the current call, which returned `result` having filled its
    /// slots as `fill` (a ring call that succeeded), and returns the call's
    /// outcome.
    pub(crate) fn end_call(
        &mut self,
        result: Result<(), EngineError>,
        fill: Option<SlotFill>,
    ) -> Result<(), EngineError> {
        if let Some(trace) = &self.trace {
            let call = self.agreement.current();
            // The peers this call woke, at the times the stores woke them.
            for at in self.transport.take_wakes() {
                trace.instant(self.transport.kind().wake_name, "wake", at, []);
            }
            let args = [
                ("call", Arg::Int(self.agreement.calls() as i64)),
                ("dtype", Arg::Text(call.dtype.name())),
                ("count", Arg::Int(call.count as i64)),
                ("algorithm", Arg::Text(call.algorithm.name())),
                ("chunk_bytes", Arg::Int(i64::from(call.chunk_bytes))),
                ("ok", Arg::Int(i64::from(result.is_ok()))),
            ];
            let fill = fill.map(|fill| ("slot_fill", Arg::Text(fill.name())));
            trace.end_call(call.kind.name(), args.into_iter().chain(fill));
        }
        // Where the data lives in a device's memory, a call that read
        // through a window of a device that went away meanwhile read the
        // module's stand-in page, not the data: the module queues
        // DEVICE_GONE before that page can appear, so a call that ends
        // without the event in the stream read the device.
        let result = result.and_then(|()| {
            if self.transport.capabilities().device_memory {
                self.poll_faults()
            } else {
                Ok(())
            }
        });
        self.agreement.finish(fill);
        result
    }

    /// Waits for rank 0 to publish this call and returns the chunk size and
    /// slot fill it decided; a different call there is a mismatch.
    fn adopt_decision(&mut self, call: CallDescriptor) -> Result<(u32, bool), EngineError> {
        let published = (self.agreement.calls() + 1) as u32;
        self.wait_for(0, 0, Signal::CallsPublished, published)?;
        match self
            .agreement
            .published_by_rank_zero(&self.transport, &call)
        {
            Published::Decided {
                chunk_bytes,
                bypass_slots,
            } => Ok((self.check_chunk(0, chunk_bytes)?, bypass_slots)),
            Published::Differs(peer_call) => Err(self.mismatch(call, 0, peer_call)),
            // Until the stamp on the first message reports the difference,
            // any chunk and fill do.
            Published::Overtaken => {
                let message_bytes = self.agreement.message_bytes(&call);
                let chunk_bytes = self.agreement.chunk_for(
                    &self.transport,
                    message_bytes,
                    call.dtype.size_bytes(),
                );
                Ok((chunk_bytes, false))
            }
        }
    }

    /// Polls the fault monitor where it is due (at each call's start, at
    /// each step that sends a chunk, at each sleep slice of a wait): the
    /// device link's changes, and the action the AER matrix gives each
    /// fault (`fault_monitor`).
    pub(crate) fn follow_faults(&mut self) -> Result<(), EngineError> {
        if !self.monitor.due() {
            return Ok(());
        }
        self.poll_faults()
    }

    /// `follow_faults` whether or not it is due.
    pub(crate) fn poll_faults(&mut self) -> Result<(), EngineError> {
        let at = CallPosition {
            call: self.agreement.calls(),
            in_call: self.agreement.in_call(),
        };
        self.monitor.poll(&self.transport, at, self.trace.as_ref())
    }

    /// Records `failure`, which blames a peer (for what this rank read of
    /// the peer's shared memory, or for dying, leaving or stalling), unless
    /// a device of the job reports a fault: reads through a device in error
    /// (its reset in progress reads zeros) are no evidence against a peer,
    /// a peer whose device was removed fails or stalls for that, and the
    /// device's fault is the failure then.
    pub(crate) fn blame(&mut self, failure: Failure) -> EngineError {
        match self.poll_faults() {
            Err(fault) => fault,
            Ok(()) => self.transport.abort(failure).into(),
        }
    }

    /// Records that `peer` made `peer_call` where this rank made `call`, and
    /// returns the failure that stands (another may have been recorded first).
    fn mismatch(
        &mut self,
        call: CallDescriptor,
        peer: usize,
        peer_call: CallDescriptor,
    ) -> EngineError {
        self.blame(Failure::MismatchedCall {
            rank: self.rank,
            call,
            peer,
            peer_call,
        })
    }

    /// `chunk_bytes` as `peer` decided it, if a slot holds such a chunk;
    /// otherwise the peer's shared memory was written by no honest rank.
    pub(crate) fn check_chunk(
        &mut self,
        peer: usize,
        chunk_bytes: u32,
    ) -> Result<u32, EngineError> {
        if Agreement::chunk_fits(&self.transport, chunk_bytes) {
            return Ok(chunk_bytes);
        }
        Err(self.blame(Failure::PeerCorrupt {
            rank: self.rank,
            peer,
            what: Corruption::ChunkSize,
        }))
    }

    /// Checks the stamp `peer` wrote on a message it published against our
    /// call (`Agreement::check_stamp`) and returns the peer's call.
    pub(crate) fn check_stamp(
        &mut self,
        peer: usize,
        stamp: [u64; 4],
    ) -> Result<CallDescriptor, EngineError> {
        self.agreement
            .check_stamp(stamp)
            .map_err(|peer_call| self.mismatch(self.agreement.current(), peer, peer_call))
    }

    /// Waits until `owner`'s `signal` reaches `target` (wrapping), which `peer`
    /// is to bring about.
    pub(crate) fn wait_for(
        &mut self,
        peer: usize,
        owner: usize,
        signal: Signal,
        target: u32,
    ) -> Result<(), EngineError> {
        if reached(self.transport.load(owner, signal), target) {
            return Ok(());
        }
        let started = Instant::now();
        let traced_from = self.trace.as_ref().map(|_| monotonic_ns());
        let transport = &self.transport;
        let outcome = if self.spin_until(started, || reached(transport.load(owner, signal), target))
        {
            Ok(())
        } else {
            self.sleep_until(peer, owner, signal, target, started)
        };
        if let (Some(trace), Some(start)) = (&self.trace, traced_from) {
            trace.span(
                "wait",
                "wait",
                start,
                [
                    ("peer", Arg::Int(peer as i64)),
                    ("owner", Arg::Int(owner as i64)),
                    ("signal", Arg::Text(signal.name())),
                    ("target", Arg::Int(i64::from(target))),
                ],
            );
        }
        outcome
    }

    /// Waits until `done` holds, which `peer` brings about together with
    /// `owner`'s `signal` reaching `target`: `done` is polled for the spin
    /// (a word a peer writes may be cheaper to poll than the counter), then
    /// the counter is slept on.
    pub(crate) fn wait_until(
        &mut self,
        peer: usize,
        owner: usize,
        signal: Signal,
        target: u32,
        done: impl FnMut() -> bool,
    ) -> Result<(), EngineError> {
        let started = Instant::now();
        if self.spin_until(started, done) {
            return Ok(());
        }
        self.sleep_until(peer, owner, signal, target, started)
    }

    /// Serves the successor's resends, where chunk checksums are on: at
    /// every step boundary and between the polls of every wait.
    pub(crate) fn serve_resends(&self) {
        if let Some(shadows) = &self.shadows {
            shadows.serve(&self.transport, self.rank);
        }
    }

    /// Polls `done` until it holds (true) or the spin has passed since
    /// `started` (false), serving resends between polls. Back to back at
    /// first (a peer on another core is usually about to post); an unbound
    /// rank then yields between polls, since on an oversubscribed host its
    /// peer may be queued on this very core; a bound rank's peer never is,
    /// and yielding would only hand the core to an unrelated task for a
    /// whole scheduler slice.
    fn spin_until(&self, started: Instant, mut done: impl FnMut() -> bool) -> bool {
        loop {
            if done() {
                return true;
            }
            let spun = started.elapsed();
            if spun >= self.policy.spin {
                return false;
            }
            if spun < self.policy.yield_after {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            // The peer we wait for may itself wait for a chunk of ours again.
            self.serve_resends();
        }
    }

    /// The rank at the end of the chain of ranks blocked on each other that
    /// starts at `peer`: the one actually not making progress.
    fn culprit(&self, peer: usize) -> usize {
        let mut culprit = peer;
        for _ in 0..self.nranks {
            match self.transport.blocked_on(culprit) {
                Some(next) if next != self.rank && next != culprit => culprit = next,
                _ => break,
            }
        }
        culprit
    }

    /// The sleeping half of a wait whose spin (from `started`) is over:
    /// futex sleeps in slices, between which failures, dead or departed
    /// peers, mismatched calls and the timeout are checked.
    fn sleep_until(
        &mut self,
        peer: usize,
        owner: usize,
        signal: Signal,
        target: u32,
        started: Instant,
    ) -> Result<(), EngineError> {
        let reached = |value: u32| reached(value, target);
        let timeout = if self.joining {
            self.policy.peer_timeout.max(self.policy.join_timeout)
        } else {
            self.policy.peer_timeout
        };
        self.transport.set_blocked_on(Some(peer));
        let outcome = loop {
            // The peer we wait for may itself wait for a chunk of ours again.
            self.serve_resends();
            // A peer may post what we need and then leave or exit: what it
            // posted stays readable, so progress is checked before failures.
            let value = self.transport.load(owner, signal);
            if reached(value) {
                break Ok(());
            }
            if let Some(failure) = self.transport.failure() {
                break Err(failure.into());
            }
            // A fault of this rank's device is acted on here, not only at
            // the next step: a fatal error's reset drops what the ranks
            // stored through the device meanwhile, so both may wait for a
            // post that never lands, and the fault, not the peers' timeout,
            // must end the wait.
            if let Err(fault) = self.follow_faults() {
                break Err(fault);
            }
            if let Some((call, peer_call)) = self.agreement.differs_from(&self.transport, peer) {
                break Err(self.mismatch(call, peer, peer_call));
            }
            let transport = &self.transport;
            // A rank that exited after dropping its communicator finished
            // cleanly; one that exited without doing so died mid-job.
            let died = transport
                .dead_peers()
                .into_iter()
                .find(|(rank, _)| !transport.departed(*rank));
            if let Some((rank, pid)) = died {
                break Err(self.blame(Failure::PeerDied { rank, pid }));
            }
            if transport.departed(peer) {
                // It may have posted what we wait for after our load above and
                // then left (a rank returns from its last call without waiting
                // for its successor to read): the departure, seen here,
                // publishes that post.
                if reached(transport.load(owner, signal)) {
                    break Ok(());
                }
                break Err(self.blame(Failure::PeerLeft { rank: peer }));
            }
            let waited = started.elapsed();
            if waited >= timeout {
                let rank = self.culprit(peer);
                break Err(self.blame(Failure::PeerUnresponsive { rank, waited }));
            }
            let transport = &self.transport;
            let slept_from = self.trace.as_ref().map(|_| monotonic_ns());
            transport.sleep(owner, signal, value, LIVENESS_SLICE.min(timeout - waited));
            if let (Some(trace), Some(start)) = (&self.trace, slept_from) {
                trace.span(transport.kind().sleep_name, "sleep", start, []);
            }
        };
        self.transport.set_blocked_on(None);
        outcome
    }
}
