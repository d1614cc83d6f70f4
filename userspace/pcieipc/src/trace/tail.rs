//! The tail of a trace's calls: which calls were the slowest, and what
//! each spent its extra time on: a peer that began the call late, a wait on
//! a peer (and the sleep inside it), a step that took long with no wait
//! inside, or time in no step or wait at all. The last two are what a
//! preempted rank or a page fault looks like from inside: the trace sees
//! a stretch of time, not its cause.

use std::collections::BTreeMap;
use std::fmt;

use super::span::Span;

/// What the slowest rank of a call spent the call on, in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct CallTime {
    /// The call's number (its `call` argument).
    pub call: i64,
    /// The slowest rank's time in the call: the job's time for it.
    pub duration_us: f64,
    pub rank: u64,
    /// How much later than this rank the last other rank began the call,
    /// and which (`None`: every other rank began it before this one).
    pub late_peer: Option<(u64, f64)>,
    /// Its longest wait inside the call: the peer waited on, µs, and µs of
    /// it asleep.
    pub longest_wait: Option<(i64, f64, f64)>,
    /// Its longest step less the waits inside it: the step and µs.
    pub longest_step: Option<(String, f64)>,
    /// Time in the call in no step and no wait.
    pub outside_us: f64,
}

/// What a slow call's extra time went to, as the trace can tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// A peer began the call late: this rank waited for it to arrive.
    LatePeer,
    /// A wait on a peer inside the call that did not start late.
    Waiting,
    /// A step that took long with no wait inside: preempted or faulting
    /// while copying or reducing.
    SlowStep,
    /// Time outside any step or wait: preempted or faulting between them.
    Outside,
}

impl Cause {
    pub fn name(self) -> &'static str {
        match self {
            Cause::LatePeer => "a peer began the call late",
            Cause::Waiting => "waiting on a peer",
            Cause::SlowStep => "a step with no wait inside took long (preempted, or a page fault)",
            Cause::Outside => "time in no step or wait (preempted, or a page fault)",
        }
    }
}

impl CallTime {
    /// The largest of the four shares of the call.
    pub fn cause(&self) -> Cause {
        let late = self.late_peer.map_or(0.0, |(_, us)| us);
        let wait = self.longest_wait.map_or(0.0, |(_, us, _)| us);
        let step = self.longest_step.as_ref().map_or(0.0, |(_, us)| *us);
        [
            (Cause::LatePeer, late),
            (Cause::Waiting, wait - late),
            (Cause::SlowStep, step),
            (Cause::Outside, self.outside_us),
        ]
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(cause, _)| cause)
        .expect("four candidates")
    }
}

/// The calls whose job time is at or above p99.7 of all the calls, slowest
/// first, with the calls' median and p99.7 (nearest rank).
#[derive(Clone, Debug, PartialEq)]
pub struct Tail {
    pub calls: usize,
    pub median_us: f64,
    pub p99_7_us: f64,
    pub slowest: Vec<CallTime>,
}

impl Tail {
    /// How many of the tail's calls each cause took.
    pub fn causes(&self) -> BTreeMap<Cause, usize> {
        let mut causes = BTreeMap::new();
        for call in &self.slowest {
            *causes.entry(call.cause()).or_default() += 1;
        }
        causes
    }
}

/// The tail of `spans`' calls (spans of category `call` with a `call`
/// argument, matched across ranks by it); `None` without such calls.
pub(crate) fn tail(spans: &[Span]) -> Option<Tail> {
    // Each rank's inner spans (steps, waits, sleeps), by start.
    let mut inner: BTreeMap<u64, Vec<&Span>> = BTreeMap::new();
    let mut calls: BTreeMap<i64, Vec<&Span>> = BTreeMap::new();
    for span in spans {
        match span.category.as_str() {
            "call" => {
                if let Some(call) = span.args.get("call").and_then(|call| call.as_i64()) {
                    calls.entry(call).or_default().push(span);
                }
            }
            "step" | "wait" | "sleep" => inner.entry(span.pid).or_default().push(span),
            _ => {}
        }
    }
    for spans in inner.values_mut() {
        spans.sort_by(|a, b| a.start.total_cmp(&b.start));
    }
    let mut times: Vec<CallTime> = calls
        .iter()
        .filter_map(|(&call, ranks)| {
            let slowest = ranks
                .iter()
                .max_by(|a, b| a.duration.total_cmp(&b.duration))?;
            let within = inner.get(&slowest.pid).map_or(&[][..], |spans| {
                let from = spans.partition_point(|span| span.start < slowest.start);
                let to = spans.partition_point(|span| span.start < slowest.end());
                &spans[from..to]
            });
            Some(call_time(call, slowest, ranks, within))
        })
        .collect();
    if times.is_empty() {
        return None;
    }
    let mut durations: Vec<f64> = times.iter().map(|time| time.duration_us).collect();
    durations.sort_by(f64::total_cmp);
    let nearest_rank = |share: f64| {
        let rank = (share * durations.len() as f64).ceil() as usize;
        durations[rank.clamp(1, durations.len()) - 1]
    };
    let (median_us, p99_7_us) = (nearest_rank(0.5), nearest_rank(0.997));
    times.retain(|time| time.duration_us >= p99_7_us);
    times.sort_by(|a, b| b.duration_us.total_cmp(&a.duration_us));
    Some(Tail {
        calls: durations.len(),
        median_us,
        p99_7_us,
        slowest: times,
    })
}

fn call_time(call: i64, slowest: &Span, ranks: &[&Span], within: &[&Span]) -> CallTime {
    let late_peer = ranks
        .iter()
        .filter(|other| other.pid != slowest.pid && other.start > slowest.start)
        .max_by(|a, b| a.start.total_cmp(&b.start))
        .map(|other| (other.pid, other.start - slowest.start));
    let inside = |outer: &Span, category: &str| -> f64 {
        within
            .iter()
            .filter(|span| span.category == category && outer.contains(span))
            // Folded from +0.0: an empty f64 sum is -0.0.
            .fold(0.0, |total, span| total + span.duration)
    };
    let longest_wait = within
        .iter()
        .filter(|span| span.category == "wait")
        .max_by(|a, b| a.duration.total_cmp(&b.duration))
        .map(|wait| {
            (
                wait.peer().unwrap_or(-1),
                wait.duration,
                inside(wait, "sleep"),
            )
        });
    let longest_step = within
        .iter()
        .filter(|span| span.category == "step")
        .map(|step| (step.name.clone(), step.duration - inside(step, "wait")))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    // Steps and waits outside steps: what the call spent inside a phase.
    let covered: f64 = within
        .iter()
        .filter(|span| {
            span.category == "step"
                || (span.category == "wait"
                    && !within
                        .iter()
                        .any(|step| step.category == "step" && step.contains(span)))
        })
        .fold(0.0, |total, span| total + span.duration);
    CallTime {
        call,
        duration_us: slowest.duration,
        rank: slowest.pid,
        late_peer,
        longest_wait,
        longest_step,
        outside_us: (slowest.duration - covered).max(0.0),
    }
}

impl fmt::Display for CallTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "call {}: {:.1} µs on rank {}: {}",
            self.call,
            self.duration_us,
            self.rank,
            self.cause().name()
        )?;
        // Later by less than the printed precision is not late.
        if let Some((peer, us)) = self.late_peer.filter(|(_, us)| *us >= 0.05) {
            write!(f, "; rank {peer} began it {us:.1} µs later")?;
        }
        if let Some((peer, us, asleep)) = self.longest_wait {
            write!(f, "; waited {us:.1} µs on rank {peer} ({asleep:.1} asleep)")?;
        }
        if let Some((step, us)) = &self.longest_step {
            write!(f, "; {step} {us:.1} µs")?;
        }
        write!(f, "; {:.1} µs in no step or wait", self.outside_us)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::trace::span::spans;

    fn span(pid: u64, name: &str, cat: &str, ts: f64, dur: f64, args: Value) -> Value {
        json!({"ph": "X", "pid": pid, "tid": 0, "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args})
    }

    /// 1,000 calls of 1 µs on two ranks (a send and a reduce each), four of
    /// them slow, each for another reason.
    fn job() -> Vec<Value> {
        let mut events = Vec::new();
        for call in 0..1000i64 {
            let at = call as f64 * 100.0;
            for rank in 0..2u64 {
                let (start, duration) = match (call, rank) {
                    // Rank 1 arrives 50 µs late; rank 0 waits for it.
                    (10, 1) => (at + 50.0, 1.0),
                    (10, 0) => (at, 51.0),
                    (20, 0) => (at, 40.0),
                    (30, 1) => (at, 35.0),
                    (40, 0) => (at, 30.0),
                    _ => (at, 1.0),
                };
                events.push(span(
                    rank,
                    "all_reduce",
                    "call",
                    start,
                    duration,
                    json!({"call": call}),
                ));
                let (send, reduce_at) = if (call, rank) == (20, 0) {
                    (39.0, at + 39.2)
                } else {
                    (0.4, start + 0.5)
                };
                events.push(span(rank, "send", "step", start, send, json!({})));
                match (call, rank) {
                    (10, 0) => {
                        events.push(span(0, "reduce", "step", at + 0.5, 50.4, json!({})));
                        events.push(span(0, "wait", "wait", at + 0.6, 50.0, json!({"peer": 1})));
                    }
                    (40, 0) => {
                        events.push(span(0, "wait", "wait", at + 0.5, 29.0, json!({"peer": 1})));
                        events.push(span(0, "futex sleep", "sleep", at + 2.0, 25.0, json!({})));
                        events.push(span(0, "reduce", "step", at + 29.6, 0.3, json!({})));
                    }
                    _ => events.push(span(rank, "reduce", "step", reduce_at, 0.4, json!({}))),
                }
            }
        }
        events
    }

    #[test]
    fn the_tail_names_what_each_slow_call_went_to() {
        let tail = tail(&spans(&job()).unwrap()).unwrap();
        assert_eq!(
            (tail.calls, tail.median_us, tail.p99_7_us),
            (1000, 1.0, 30.0)
        );
        let order: Vec<(i64, u64, Cause)> = tail
            .slowest
            .iter()
            .map(|call| (call.call, call.rank, call.cause()))
            .collect();
        assert_eq!(
            order,
            [
                (10, 0, Cause::LatePeer),
                (20, 0, Cause::SlowStep),
                (30, 1, Cause::Outside),
                (40, 0, Cause::Waiting),
            ]
        );
        let late = &tail.slowest[0];
        assert_eq!(late.late_peer, Some((1, 50.0)));
        assert_eq!(late.longest_wait, Some((1, 50.0, 0.0)));
        let slow_step = &tail.slowest[1];
        assert_eq!(slow_step.longest_step, Some(("send".to_owned(), 39.0)));
        let outside = &tail.slowest[2];
        assert!((outside.outside_us - 34.2).abs() < 1e-9, "{outside:?}");
        let waiting = &tail.slowest[3];
        assert_eq!(waiting.longest_wait, Some((1, 29.0, 25.0)));
        assert_eq!(waiting.late_peer, None);
        assert!(tail.causes().values().all(|&count| count == 1));
        let text = late.to_string();
        assert!(
            text.starts_with("call 10: 51.0 µs on rank 0: a peer began the call late; rank 1 began it 50.0 µs later; waited 50.0 µs on rank 1 (0.0 asleep)"),
            "{text}"
        );
    }

    #[test]
    fn a_trace_without_numbered_calls_has_no_tail() {
        let events = vec![
            span(0, "init", "init", 0.0, 5.0, json!({})),
            span(0, "all_reduce", "call", 10.0, 1.0, json!({})),
        ];
        assert_eq!(tail(&spans(&events).unwrap()), None);
    }
}
