//! What one rank records while tracing, and the file it writes.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::monotonic_ns;
use super::storage::Prefaulted;

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

/// The timeline of a rank's process an event is drawn on (its `tid`): the
/// host thread's, or one a transport names for work that runs beside it,
/// such as a GPU stream's (`Recorder::track`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Track(u32);

impl Track {
    pub(crate) const HOST: Track = Track(0);
}

/// One event: a span or an instant; its arguments are the next
/// `arg_count` entries of the recorder's argument storage (stored in the
/// same order as the events).
struct Event {
    track: Track,
    name: &'static str,
    category: &'static str,
    start_ns: u64,
    /// `INSTANT` for an event with no duration.
    end_ns: u64,
    arg_count: u8,
}

/// `Event::end_ns` of an instant.
const INSTANT: u64 = u64::MAX;

/// Bytes of each chunk of events and of arguments (`Prefaulted`): about
/// 10,000 calls of a small all_reduce, whose call, step and wait spans and
/// their arguments take about 200 and 500 bytes a call. A new chunk stalls
/// the call that needs it about 0.25 ms a MiB (2-vCPU VM): small chunks,
/// short stalls.
const EVENT_CHUNK_BYTES: usize = 2 << 20;
const ARG_CHUNK_BYTES: usize = 4 << 20;

struct Recorded {
    events: Prefaulted<Event>,
    args: Prefaulted<(&'static str, Arg)>,
}

/// A rank's events, kept in memory and written when the communicator goes.
/// Interior mutability: waits record from `&self` methods. Recording takes
/// no allocation and no page fault (`Prefaulted`) except when a chunk of
/// storage fills, which is recorded as an event of its own ("trace storage
/// grown", with what it took).
pub(crate) struct Recorder {
    rank: usize,
    file: PathBuf,
    recorded: RefCell<Recorded>,
    /// The names of the tracks beside the host's, `Track(1)` first.
    tracks: RefCell<Vec<&'static str>>,
    call_started: Cell<u64>,
}

impl Recorder {
    pub(crate) fn new(rank: usize, file: PathBuf) -> Recorder {
        Recorder {
            rank,
            file,
            recorded: RefCell::new(Recorded {
                events: Prefaulted::new(EVENT_CHUNK_BYTES / std::mem::size_of::<Event>()),
                args: Prefaulted::new(ARG_CHUNK_BYTES / std::mem::size_of::<(&str, Arg)>()),
            }),
            tracks: RefCell::new(Vec::new()),
            call_started: Cell::new(0),
        }
    }

    /// The track named `name`, a new one the first time.
    pub(crate) fn track(&self, name: &'static str) -> Track {
        let mut tracks = self.tracks.borrow_mut();
        let index = match tracks.iter().position(|&known| known == name) {
            Some(index) => index,
            None => {
                tracks.push(name);
                tracks.len() - 1
            }
        };
        Track(index as u32 + 1)
    }

    /// Marks the start of the call that `end_call` closes.
    pub(crate) fn begin_call(&self) {
        self.call_started.set(monotonic_ns());
    }

    pub(crate) fn end_call(
        &self,
        name: &'static str,
        args: impl IntoIterator<Item = (&'static str, Arg)>,
    ) {
        self.span(name, "call", self.call_started.get(), args);
    }

    /// A span from `start_ns` to now.
    pub(crate) fn span(
        &self,
        name: &'static str,
        category: &'static str,
        start_ns: u64,
        args: impl IntoIterator<Item = (&'static str, Arg)>,
    ) {
        self.span_between(name, category, start_ns, monotonic_ns(), args);
    }

    /// An event with no duration, at `at_ns`.
    pub(crate) fn instant(
        &self,
        name: &'static str,
        category: &'static str,
        at_ns: u64,
        args: impl IntoIterator<Item = (&'static str, Arg)>,
    ) {
        self.span_between(name, category, at_ns, INSTANT, args);
    }

    /// A span between two times taken elsewhere (a GPU's events); an
    /// instant where `end_ns` is `INSTANT`.
    pub(crate) fn span_between(
        &self,
        name: &'static str,
        category: &'static str,
        start_ns: u64,
        end_ns: u64,
        args: impl IntoIterator<Item = (&'static str, Arg)>,
    ) {
        self.span_on(Track::HOST, name, category, start_ns, end_ns, args);
    }

    /// `span_between` on `track`.
    pub(crate) fn span_on(
        &self,
        track: Track,
        name: &'static str,
        category: &'static str,
        start_ns: u64,
        end_ns: u64,
        args: impl IntoIterator<Item = (&'static str, Arg)>,
    ) {
        let mut recorded = self.recorded.borrow_mut();
        let mut grown = Duration::ZERO;
        let mut arg_count = 0u8;
        for arg in args {
            grown += recorded.args.push(arg).unwrap_or_default();
            arg_count += 1;
        }
        grown += recorded
            .events
            .push(Event {
                track,
                name,
                category,
                start_ns,
                end_ns,
                arg_count,
            })
            .unwrap_or_default();
        if !grown.is_zero() {
            // The stall the trace itself caused, where a reader finds it.
            recorded
                .args
                .push(("took_us", Arg::Int(grown.as_micros() as i64)));
            recorded.events.push(Event {
                track: Track::HOST,
                name: "trace storage grown",
                category: "trace",
                start_ns: monotonic_ns(),
                end_ns: INSTANT,
                arg_count: 1,
            });
        }
    }

    /// The trace-event JSON of everything recorded: metadata events naming
    /// the rank's process and the tracks beside the host's, then the
    /// events in the order they ended.
    fn to_json(&self) -> Value {
        let pid = self.rank;
        let mut events = vec![
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                   "args": {"name": format!("rank {pid}")}}),
            json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                   "args": {"sort_index": pid}}),
        ];
        for (index, name) in self.tracks.borrow().iter().enumerate() {
            let tid = index + 1;
            events.push(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": name}}),
            );
            events.push(
                json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                               "args": {"sort_index": tid}}),
            );
        }
        let recorded = self.recorded.borrow();
        let mut args = recorded.args.iter();
        for event in recorded.events.iter() {
            let args: Map<String, Value> = args
                .by_ref()
                .take(usize::from(event.arg_count))
                .map(|(key, arg)| ((*key).to_owned(), Value::from(arg)))
                .collect();
            let mut entry = json!({
                "name": event.name,
                "cat": event.category,
                "pid": pid,
                "tid": event.track.0,
                "ts": event.start_ns as f64 / 1e3,
                "args": args,
            });
            if event.end_ns == INSTANT {
                entry["ph"] = json!("i");
                entry["s"] = json!("p");
            } else {
                entry["ph"] = json!("X");
                entry["dur"] = json!(event.end_ns.saturating_sub(event.start_ns) as f64 / 1e3);
            }
            events.push(entry);
        }
        json!({"traceEvents": events, "displayTimeUnit": "ns"})
    }

    /// Writes the rank's file: a trace that opens on its own, or merges
    /// with the other ranks' (`trace::merge`).
    pub(crate) fn write(&self) -> std::io::Result<()> {
        let text = serde_json::to_string(&self.to_json()).map_err(std::io::Error::other)?;
        write_without_following(&self.file, text.as_bytes())
    }
}

/// Writes `file` whole without following a link planted at its name (the
/// prefix often lies in a shared directory such as /tmp): the text goes to
/// a new file beside it, created exclusively and without following links,
/// readable by the owner only, which then replaces `file` by rename, which
/// replaces a link itself, never what it points to.
fn write_without_following(file: &Path, text: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    let mut staged = file.as_os_str().to_owned();
    staged.push(format!(
        ".{}.{}.partial",
        std::process::id(),
        monotonic_ns()
    ));
    let staged = PathBuf::from(staged);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&staged)?;
    let written = out
        .write_all(text)
        .and_then(|()| std::fs::rename(&staged, file));
    if written.is_err() {
        // Nothing of ours is left half-written.
        let _ = std::fs::remove_file(&staged);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private_dir(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pcieipc-record-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    #[test]
    fn a_link_planted_at_the_rank_file_is_replaced_not_followed() {
        let dir = private_dir("link");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let file = dir.join("job.rank0.json");
        std::os::unix::fs::symlink(&victim, &file).unwrap();
        let recorder = Recorder::new(0, file.clone());
        recorder.instant("mark", "test", 1, []);
        recorder.write().unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let written = std::fs::symlink_metadata(&file).unwrap();
        assert!(written.file_type().is_file(), "the link is still there");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(written.permissions().mode() & 0o777, 0o600);
        assert!(std::fs::read_to_string(&file).unwrap().contains("\"mark\""));
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "a staged file was left: {names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_job_with_the_same_prefix_replaces_the_file() {
        let dir = private_dir("again");
        let file = dir.join("job.rank1.json");
        for mark in ["first", "second"] {
            let recorder = Recorder::new(1, file.clone());
            recorder.instant(mark, "test", 1, []);
            recorder.write().unwrap();
        }
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("\"second\"") && !text.contains("\"first\""),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Past a chunk of events and one of arguments, every event still
    /// carries its own arguments, and each growth is an event of its own.
    #[test]
    fn events_keep_their_arguments_across_chunks_and_growth_is_recorded() {
        let recorder = Recorder::new(0, PathBuf::from("/nonexistent"));
        let per_event_chunk = EVENT_CHUNK_BYTES / std::mem::size_of::<Event>();
        let per_arg_chunk = ARG_CHUNK_BYTES / std::mem::size_of::<(&str, Arg)>();
        // Three arguments each: both kinds of chunk fill at least once.
        let spans = per_event_chunk.max(per_arg_chunk / 3) + 10;
        for index in 0..spans as i64 {
            recorder.span_between(
                "send",
                "step",
                index as u64,
                index as u64 + 1,
                [
                    ("index", Arg::Int(index)),
                    ("name", Arg::Text("send")),
                    ("twice", Arg::Int(2 * index)),
                ],
            );
        }
        let json = recorder.to_json();
        let events = json["traceEvents"].as_array().unwrap();
        let sends: Vec<&Value> = events.iter().filter(|e| e["name"] == "send").collect();
        assert_eq!(sends.len(), spans);
        for (index, event) in sends.iter().enumerate() {
            let args = &event["args"];
            assert_eq!(args["index"], index as i64, "{event}");
            assert_eq!(args["twice"], 2 * index as i64, "{event}");
            assert_eq!(args["name"], "send", "{event}");
            assert_eq!(args.as_object().unwrap().len(), 3, "{event}");
        }
        let grown: Vec<&Value> = events
            .iter()
            .filter(|e| e["name"] == "trace storage grown")
            .collect();
        assert_eq!(grown.len(), 2, "one growth of each storage");
        assert!(grown
            .iter()
            .all(|e| e["ph"] == "i" && e["args"]["took_us"].as_i64().unwrap() >= 0));
    }

    /// Spans on a named track carry its `tid`, and the track its name;
    /// the host's spans stay on `tid` 0.
    #[test]
    fn spans_on_a_named_track_are_drawn_on_their_own_thread() {
        let recorder = Recorder::new(3, PathBuf::from("/nonexistent"));
        let to_host = recorder.track("GPU to host");
        let from_host = recorder.track("GPU from host");
        assert_eq!(recorder.track("GPU to host"), to_host);
        assert_ne!(to_host, from_host);
        recorder.span_on(to_host, "push", "gpu step", 10, 20, []);
        recorder.span_on(from_host, "pull", "gpu step", 15, 30, []);
        recorder.span_between("all_reduce", "kernel", 5, 40, []);
        let json = recorder.to_json();
        let events = json["traceEvents"].as_array().unwrap();
        let tid_of = |name: &str| {
            let found: Vec<&Value> = events.iter().filter(|e| e["name"] == name).collect();
            assert_eq!(found.len(), 1, "{name}: {found:?}");
            found[0]["tid"].as_u64().unwrap()
        };
        assert_eq!(tid_of("all_reduce"), 0);
        let (push, pull) = (tid_of("push"), tid_of("pull"));
        assert!(push != 0 && pull != 0 && push != pull);
        for (tid, name) in [(push, "GPU to host"), (pull, "GPU from host")] {
            assert!(
                events.iter().any(|e| e["ph"] == "M"
                    && e["name"] == "thread_name"
                    && e["tid"] == tid
                    && e["pid"] == 3
                    && e["args"]["name"] == name),
                "no name {name} for tid {tid}: {events:?}"
            );
        }
    }

    #[test]
    fn an_unwritable_place_is_an_error_naming_nothing_left_behind() {
        let error = Recorder::new(0, PathBuf::from("/proc/pcieipc-no/job.rank0.json"))
            .write()
            .unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
    }
}
