//! Trace-event JSON: merging the ranks' files into one trace and
//! summarising a trace. Pure functions over text.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{json, Value};

use super::span::{events, spans, TraceError};
use super::tail::{tail, Tail};

/// One trace of every rank's file, each keeping its own process track.
pub fn merge(rank_files: &[String]) -> Result<String, TraceError> {
    let mut all = Vec::new();
    for text in rank_files {
        all.extend(events(text)?);
    }
    Ok(serde_json::to_string(
        &json!({"traceEvents": all, "displayTimeUnit": "ns"}),
    )?)
}

/// One rank's time, in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct RankSummary {
    pub rank: u64,
    pub calls: usize,
    pub call_us: f64,
    /// Time in each kind of step (send, reduce, copy...), summed.
    pub steps_us: BTreeMap<String, f64>,
    pub wait_us: f64,
    /// Time waited, by the peer waited on.
    pub waits_on_us: BTreeMap<i64, f64>,
    /// Calls' kernels on the GPU (the CUDA transport's GPU hand-off).
    pub kernels: usize,
    pub kernel_us: f64,
    /// The steps of launches by the copy engines (through host memory), by
    /// name: how many, and their time summed.
    pub gpu_steps: BTreeMap<String, (usize, f64)>,
}

/// The longest step of the trace, and the longest wait inside it.
#[derive(Clone, Debug, PartialEq)]
pub struct SlowestStep {
    pub rank: u64,
    pub name: String,
    pub duration_us: f64,
    pub args: Value,
    /// (peer, µs) of the longest wait inside the step.
    pub waited_on: Option<(i64, f64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub ranks: Vec<RankSummary>,
    pub slowest_step: Option<SlowestStep>,
    /// The calls at or above p99.7 and what each went to (`tail`).
    pub tail: Option<Tail>,
}

/// Time per phase and waits per rank, the slowest step with who it
/// waited on, and the tail of the calls with what each went to.
pub fn summarise(text: &str) -> Result<Summary, TraceError> {
    let spans = spans(&events(text)?)?;
    let mut ranks: BTreeMap<u64, RankSummary> = BTreeMap::new();
    for span in &spans {
        let rank = ranks.entry(span.pid).or_insert_with(|| RankSummary {
            rank: span.pid,
            calls: 0,
            call_us: 0.0,
            steps_us: BTreeMap::new(),
            wait_us: 0.0,
            waits_on_us: BTreeMap::new(),
            kernels: 0,
            kernel_us: 0.0,
            gpu_steps: BTreeMap::new(),
        });
        match span.category.as_str() {
            "call" => {
                rank.calls += 1;
                rank.call_us += span.duration;
            }
            "step" => *rank.steps_us.entry(span.name.clone()).or_default() += span.duration,
            "kernel" => {
                rank.kernels += 1;
                rank.kernel_us += span.duration;
            }
            "gpu step" => {
                let (count, us) = rank.gpu_steps.entry(span.name.clone()).or_default();
                *count += 1;
                *us += span.duration;
            }
            "wait" => {
                rank.wait_us += span.duration;
                if let Some(peer) = span.peer() {
                    *rank.waits_on_us.entry(peer).or_default() += span.duration;
                }
            }
            _ => {}
        }
    }
    let slowest_step = spans
        .iter()
        .filter(|span| span.category == "step")
        .max_by(|a, b| a.duration.total_cmp(&b.duration))
        .map(|step| SlowestStep {
            rank: step.pid,
            name: step.name.clone(),
            duration_us: step.duration,
            args: step.args.clone(),
            waited_on: spans
                .iter()
                .filter(|wait| wait.category == "wait" && step.contains(wait))
                .max_by(|a, b| a.duration.total_cmp(&b.duration))
                .and_then(|wait| wait.peer().map(|peer| (peer, wait.duration))),
        });
    Ok(Summary {
        ranks: ranks.into_values().collect(),
        slowest_step,
        tail: tail(&spans),
    })
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for rank in &self.ranks {
            writeln!(
                f,
                "rank {}: {} calls, {:.1} µs in calls, {:.1} µs waiting ({:.0}%)",
                rank.rank,
                rank.calls,
                rank.call_us,
                rank.wait_us,
                if rank.call_us > 0.0 {
                    100.0 * rank.wait_us / rank.call_us
                } else {
                    0.0
                }
            )?;
            if rank.kernels > 0 {
                writeln!(
                    f,
                    "  GPU kernels: {} calls, {:.1} µs",
                    rank.kernels, rank.kernel_us
                )?;
            }
            for (step, us) in &rank.steps_us {
                writeln!(f, "  {step:<8} {us:>12.1} µs")?;
            }
            if !rank.gpu_steps.is_empty() {
                writeln!(f, "  GPU steps (copy engines), count / mean:")?;
                for (step, (count, us)) in &rank.gpu_steps {
                    let mean = us / *count as f64;
                    writeln!(f, "    {step:<12} {count:>8} / {mean:>8.1} µs")?;
                }
            }
            for (peer, us) in &rank.waits_on_us {
                writeln!(f, "  waited on rank {peer}: {us:.1} µs")?;
            }
        }
        match &self.slowest_step {
            Some(step) => {
                write!(
                    f,
                    "slowest step: rank {} {} {:.1} µs {}",
                    step.rank, step.name, step.duration_us, step.args
                )?;
                match step.waited_on {
                    Some((peer, us)) => {
                        writeln!(f, ", of which {us:.1} µs waiting on rank {peer}")?
                    }
                    None => writeln!(f, ", no wait inside")?,
                }
            }
            None => writeln!(f, "no steps recorded")?,
        }
        if let Some(tail) = &self.tail {
            writeln!(
                f,
                "calls: {}, median {:.2} µs, p99.7 {:.2} µs (each the slowest rank's); the {} at or above p99.7:",
                tail.calls,
                tail.median_us,
                tail.p99_7_us,
                tail.slowest.len()
            )?;
            for (cause, count) in tail.causes() {
                writeln!(f, "  {count:>5}  {}", cause.name())?;
            }
            // The slowest few in full.
            for call in tail.slowest.iter().take(SLOWEST_SHOWN) {
                writeln!(f, "  {call}")?;
            }
        }
        Ok(())
    }
}

/// How many of the tail's calls the summary shows one by one.
const SLOWEST_SHOWN: usize = 5;

#[cfg(test)]
mod tests {
    use super::*;

    fn span(pid: u64, name: &str, cat: &str, ts: f64, dur: f64, args: Value) -> Value {
        json!({"ph": "X", "pid": pid, "tid": 0, "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args})
    }

    fn trace(events: Vec<Value>) -> String {
        json!({"traceEvents": events}).to_string()
    }

    #[test]
    fn summary_adds_phases_and_names_who_the_slowest_step_waited_on() {
        let rank0 = trace(vec![
            span(0, "all_reduce", "call", 0.0, 100.0, json!({})),
            span(0, "send", "step", 1.0, 10.0, json!({})),
            span(0, "reduce", "step", 20.0, 70.0, json!({"step": 0})),
            span(0, "wait", "wait", 21.0, 50.0, json!({"peer": 1})),
            span(0, "wait", "wait", 75.0, 5.0, json!({"peer": 1})),
        ]);
        let rank1 = trace(vec![
            span(1, "all_reduce", "call", 0.0, 90.0, json!({})),
            span(1, "reduce", "step", 5.0, 20.0, json!({})),
            span(1, "wait", "wait", 6.0, 3.0, json!({"peer": 0})),
            span(1, "all_reduce", "kernel", 30.0, 12.5, json!({})),
            span(1, "push", "gpu step", 30.0, 4.0, json!({"bytes": 64})),
            span(1, "signal", "gpu step", 34.5, 1.0, json!({"chunk": 0})),
            span(1, "push", "gpu step", 35.5, 6.0, json!({"bytes": 64})),
        ]);
        let merged = merge(&[rank0, rank1]).unwrap();
        let summary = summarise(&merged).unwrap();
        assert_eq!(summary.ranks.len(), 2);
        assert_eq!(summary.ranks[0].calls, 1);
        assert_eq!(summary.ranks[0].steps_us["reduce"], 70.0);
        assert_eq!(summary.ranks[0].steps_us["send"], 10.0);
        assert_eq!(summary.ranks[0].wait_us, 55.0);
        assert_eq!(summary.ranks[0].waits_on_us[&1], 55.0);
        assert_eq!(summary.ranks[1].waits_on_us[&0], 3.0);
        assert_eq!(
            (summary.ranks[1].kernels, summary.ranks[1].kernel_us),
            (1, 12.5)
        );
        assert_eq!(summary.ranks[0].kernels, 0);
        assert_eq!(summary.ranks[1].gpu_steps["push"], (2, 10.0));
        assert_eq!(summary.ranks[1].gpu_steps["signal"], (1, 1.0));
        assert!(summary.ranks[0].gpu_steps.is_empty());
        let text = summary.to_string();
        assert!(text.contains("GPU kernels: 1 calls, 12.5 µs"), "{text}");
        assert!(
            text.contains("push                2 /      5.0 µs"),
            "{text}"
        );
        let slowest = summary.slowest_step.unwrap();
        assert_eq!((slowest.rank, slowest.name.as_str()), (0, "reduce"));
        assert_eq!(slowest.waited_on, Some((1, 50.0)));
    }

    #[test]
    fn malformed_traces_are_errors_not_panics() {
        assert!(matches!(summarise("{"), Err(TraceError::Json(_))));
        assert!(matches!(summarise("{}"), Err(TraceError::NoEvents)));
        assert!(matches!(
            summarise(&trace(vec![
                json!({"ph": "X", "name": "x", "ts": 1.0, "dur": 1.0})
            ])),
            Err(TraceError::BadEvent { index: 0, .. })
        ));
        assert!(matches!(
            summarise(&trace(vec![span(0, "x", "step", 0.0, -1.0, json!({}))])),
            Err(TraceError::BadEvent { index: 0, .. })
        ));
    }
}
