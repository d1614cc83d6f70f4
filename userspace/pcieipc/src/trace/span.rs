//! Reading trace-event JSON: its events, and its complete events
//! (`ph: "X"`) as the summary and the tail read them.

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no \"traceEvents\" array at the top")]
    NoEvents,
    #[error("event {index}: {what}")]
    BadEvent { index: usize, what: &'static str },
}

/// The `traceEvents` array of a trace.
pub fn events(text: &str) -> Result<Vec<Value>, TraceError> {
    let mut trace: Value = serde_json::from_str(text)?;
    match trace.get_mut("traceEvents").map(Value::take) {
        Some(Value::Array(events)) => Ok(events),
        _ => Err(TraceError::NoEvents),
    }
}

/// A complete event (`ph: "X"`) as the summary reads it.
pub(crate) struct Span {
    pub(crate) pid: u64,
    pub(crate) name: String,
    pub(crate) category: String,
    pub(crate) start: f64,
    pub(crate) duration: f64,
    pub(crate) args: Value,
}

impl Span {
    pub(crate) fn end(&self) -> f64 {
        self.start + self.duration
    }

    pub(crate) fn contains(&self, other: &Span) -> bool {
        self.pid == other.pid && self.start <= other.start && other.end() <= self.end()
    }

    pub(crate) fn peer(&self) -> Option<i64> {
        self.args.get("peer").and_then(Value::as_i64)
    }
}

pub(crate) fn spans(events: &[Value]) -> Result<Vec<Span>, TraceError> {
    let mut spans = Vec::new();
    for (index, event) in events.iter().enumerate() {
        if event.get("ph").and_then(Value::as_str) != Some("X") {
            continue;
        }
        let bad = |what| TraceError::BadEvent { index, what };
        spans.push(Span {
            pid: event
                .get("pid")
                .and_then(Value::as_u64)
                .ok_or(bad("no pid"))?,
            name: event
                .get("name")
                .and_then(Value::as_str)
                .ok_or(bad("no name"))?
                .to_owned(),
            category: event
                .get("cat")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            start: event
                .get("ts")
                .and_then(Value::as_f64)
                .ok_or(bad("no ts"))?,
            duration: event
                .get("dur")
                .and_then(Value::as_f64)
                .filter(|duration| *duration >= 0.0)
                .ok_or(bad("no dur, or a negative one"))?,
            args: event.get("args").cloned().unwrap_or(Value::Null),
        });
    }
    Ok(spans)
}
