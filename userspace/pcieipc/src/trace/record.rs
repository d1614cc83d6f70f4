//! What one rank records while tracing, and the file it writes.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};

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
        recorder.instant("mark", "test", 1, Vec::new());
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
            recorder.instant(mark, "test", 1, Vec::new());
            recorder.write().unwrap();
        }
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("\"second\"") && !text.contains("\"first\""),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_place_is_an_error_naming_nothing_left_behind() {
        let error = Recorder::new(0, PathBuf::from("/proc/pcieipc-no/job.rank0.json"))
            .write()
            .unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
    }
}
