//! Waiting for a peer: a bounded spin, then sleeps in slices between which
//! failures, dead or departed peers, mismatched calls and the timeout are
//! checked, so a wait always ends, and a failed one names the rank at fault.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Communicator;
use crate::engine::error::EngineError;
use crate::engine::failure::Failure;
use crate::engine::transport::Signal;
use crate::trace::{monotonic_ns, Arg};

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

impl Communicator {
    pub(crate) fn successor(&self) -> usize {
        (self.rank + 1) % self.nranks
    }

    pub(crate) fn predecessor(&self) -> usize {
        (self.rank + self.nranks - 1) % self.nranks
    }

    /// Waits until `owner` has posted `round` of its one-shot window of
    /// `parity`: polls the window's own round word (the data's cache line
    /// for small messages) for the spin, then waits on the posted counter
    /// as `wait_for` does.
    pub(crate) fn wait_for_one_shot(
        &mut self,
        owner: usize,
        parity: usize,
        round: u32,
    ) -> Result<(), EngineError> {
        if self.trace.is_some() {
            // Traced, the wait is recorded as every other is.
            return self.wait_for(owner, owner, Signal::OneShotPosted, round);
        }
        let word = self.one_shot_round_word(owner, parity);
        let started = Instant::now();
        if self.spin_until(started, || word.load(Ordering::Acquire) as u32 == round) {
            return Ok(());
        }
        self.sleep_until(owner, owner, Signal::OneShotPosted, round, started)
    }

    /// Polls `done` until it holds (true) or `spin` has passed since
    /// `started` (false), serving resends between polls. Back to back at
    /// first (a peer on another core is usually about to post); an unbound
    /// rank then yields between polls, since on an oversubscribed host its
    /// peer may be queued on this very core; a bound rank's peer never is,
    /// and yielding would only hand the core to an unrelated task for a
    /// whole scheduler slice.
    fn spin_until(&self, started: Instant, mut done: impl FnMut() -> bool) -> bool {
        let yield_after = match self.options.bind_cpu {
            Some(_) => self.options.spin,
            None => EAGER_SPIN,
        };
        loop {
            if done() {
                return true;
            }
            let spun = started.elapsed();
            if spun >= self.options.spin {
                return false;
            }
            if spun < yield_after {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            // The peer we wait for may itself wait for a chunk of ours again.
            self.serve_resends();
        }
    }

    /// Posts this rank's next round on its one-shot counter.
    pub(crate) fn post_round(&mut self) {
        self.one_shot_rounds = self.one_shot_rounds.wrapping_add(1);
        self.transport
            .store(self.rank, Signal::OneShotPosted, self.one_shot_rounds);
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

    /// Waits until `owner`'s `signal` reaches `target` (wrapping), which `peer`
    /// is to bring about: a bounded spin, then futex sleeps in slices between
    /// which failures, dead or departed peers, mismatched calls and the
    /// timeout are checked.
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
        let transport = &*self.transport;
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
                vec![
                    ("peer", Arg::Int(peer as i64)),
                    ("owner", Arg::Int(owner as i64)),
                    ("signal", Arg::Owned(format!("{signal:?}"))),
                    ("target", Arg::Int(i64::from(target))),
                ],
            );
        }
        outcome
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
        let mut value;
        // Still joining (init's agreements), a peer may be slow to arrive
        // without being stuck: it has the rendezvous's time, not a call's.
        let timeout = if self.joining {
            self.options.peer_timeout.max(self.options.join_timeout)
        } else {
            self.options.peer_timeout
        };
        self.transport.set_blocked_on(Some(peer));
        let outcome = loop {
            // The peer we wait for may itself wait for a chunk of ours again.
            self.serve_resends();
            // A peer may post what we need and then leave or exit: what it
            // posted stays readable, so progress is checked before failures.
            value = self.transport.load(owner, signal);
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
            if let Err(fault) = self.follow_link_events() {
                break Err(fault);
            }
            if let Err(mismatch) = self.check_call(peer) {
                break Err(mismatch);
            }
            let transport = &*self.transport;
            // A rank that exited after dropping its communicator finished
            // cleanly; one that exited without doing so died mid-job.
            let died = transport
                .dead_peers()
                .into_iter()
                .find(|(rank, _)| !transport.departed(*rank));
            if let Some((rank, pid)) = died {
                break Err(self.blame_peer(Failure::PeerDied { rank, pid }));
            }
            if transport.departed(peer) {
                // It may have posted what we wait for after our load above and
                // then left (a rank returns from its last call without waiting
                // for its successor to read): the departure, seen here,
                // publishes that post.
                if reached(transport.load(owner, signal)) {
                    break Ok(());
                }
                break Err(self.blame_peer(Failure::PeerLeft { rank: peer }));
            }
            let waited = started.elapsed();
            if waited >= timeout {
                let rank = self.culprit(peer);
                break Err(self.blame_peer(Failure::PeerUnresponsive { rank, waited }));
            }
            let transport = &*self.transport;
            let slept_from = self.trace.as_ref().map(|_| monotonic_ns());
            transport.sleep(owner, signal, value, LIVENESS_SLICE.min(timeout - waited));
            if let (Some(trace), Some(start)) = (&self.trace, slept_from) {
                trace.span(transport.sleep_name(), "sleep", start, Vec::new());
            }
        };
        self.transport.set_blocked_on(None);
        outcome
    }
}
