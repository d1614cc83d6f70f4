//! What one rank records while tracing, and the file it writes.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;

use serde_json::{json, Map, Value};

use super::monotonic_ns;

/// An argument of a recorded event.
#[derive(Clone, Debug)]
pub(crate) enum Arg {
    Int(i64),
    Text(&'static str),
    Owned(String),
}

impl From<&Arg> for Value {
    fn from(arg: &Arg) -> Value {
        match arg {
            Arg::Int(value) => json!(value),
            Arg::Text(text) => json!(text),
            Arg::Owned(text) => json!(text),
        }
    }
}

/// One event: a span (`end_ns` set) or an instant.
struct Event {
    name: &'static str,
    category: &'static str,
    start_ns: u64,
    end_ns: Option<u64>,
    args: Vec<(&'static str, Arg)>,
}

/// A rank's events, kept in memory and written when the communicator goes.
/// Interior mutability: waits record from `&self` methods.
pub(crate) struct Recorder {
    rank: usize,
    file: PathBuf,
    events: RefCell<Vec<Event>>,
    call_started: Cell<u64>,
}

impl Recorder {
    pub(crate) fn new(rank: usize, file: PathBuf) -> Recorder {
        Recorder {
            rank,
            file,
            events: RefCell::new(Vec::with_capacity(4096)),
            call_started: Cell::new(0),
        }
    }

    /// Marks the start of the call that `end_call` closes.
    pub(crate) fn begin_call(&self) {
        self.call_started.set(monotonic_ns());
    }

    pub(crate) fn end_call(&self, name: &'static str, args: Vec<(&'static str, Arg)>) {
        self.span(name, "call", self.call_started.get(), args);
    }

    /// A span from `start_ns` to now.
    pub(crate) fn span(
        &self,
        name: &'static str,
        category: &'static str,
        start_ns: u64,
        args: Vec<(&'static str, Arg)>,
    ) {
        self.events.borrow_mut().push(Event {
            name,
            category,
            start_ns,
            end_ns: Some(monotonic_ns()),
            args,
        });
    }

    /// A span between two times taken elsewhere (a GPU's events).
    pub(crate) fn span_between(
        &self,
        name: &'static str,
        category: &'static str,
        start_ns: u64,
        end_ns: u64,
        args: Vec<(&'static str, Arg)>,
    ) {
        self.events.borrow_mut().push(Event {
            name,
            category,
            start_ns,
            end_ns: Some(end_ns),
            args,
        });
    }

    /// An event with no duration, at `at_ns`.
    pub(crate) fn instant(
        &self,
        name: &'static str,
        category: &'static str,
        at_ns: u64,
        args: Vec<(&'static str, Arg)>,
    ) {
        self.events.borrow_mut().push(Event {
            name,
            category,
            start_ns: at_ns,
            end_ns: None,
            args,
        });
    }

    /// The trace-event JSON of everything recorded: a metadata event naming
    /// the rank's track, then the events in the order they ended.
    fn to_json(&self) -> Value {
        let pid = self.rank;
        let mut events = vec![
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                   "args": {"name": format!("rank {pid}")}}),
            json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                   "args": {"sort_index": pid}}),
        ];
        for event in self.events.borrow().iter() {
            let args: Map<String, Value> = event
                .args
                .iter()
                .map(|(key, arg)| ((*key).to_owned(), Value::from(arg)))
                .collect();
            let mut entry = json!({
                "name": event.name,
                "cat": event.category,
                "pid": pid,
                "tid": 0,
                "ts": event.start_ns as f64 / 1e3,
                "args": args,
            });
            match event.end_ns {
                Some(end) => {
                    entry["ph"] = json!("X");
                    entry["dur"] = json!(end.saturating_sub(event.start_ns) as f64 / 1e3);
                }
                None => {
                    entry["ph"] = json!("i");
                    entry["s"] = json!("p");
                }
            }
            events.push(entry);
        }
        json!({"traceEvents": events, "displayTimeUnit": "ns"})
    }

    /// Writes the rank's file: a trace that opens on its own, or merges
    /// with the other ranks' (`trace::merge`).
    pub(crate) fn write(&self) -> std::io::Result<()> {
        let text = serde_json::to_string(&self.to_json()).map_err(std::io::Error::other)?;
        std::fs::write(&self.file, text)
    }
}
