//! A tracing instance of our own under `<tracefs>/instances/`, following
//! `ras:aer_event` (required) and `pci:pcie_link_event` (where the kernel has
//! it) with trace_clock "mono", read from its `trace_pipe` without blocking.
//! The global buffer and other instances are left alone; dropping the
//! session removes the instance (a killed process leaves it behind: remove
//! it with rmdir).

use std::{
    fs::{self, File, OpenOptions},
    io::{ErrorKind, Read},
    os::{
        fd::{AsFd, BorrowedFd},
        unix::fs::OpenOptionsExt,
    },
    path::{Path, PathBuf},
};

use super::{
    trace_text::{self, TraceParseError},
    SourceError,
};
use crate::events::Event;

const AER_EVENT: &str = "events/ras/aer_event/enable";
const LINK_EVENT: &str = "events/pci/pcie_link_event/enable";

/// What one read gave: the events, and the lines that did not parse (the
/// caller reports them and goes on).
#[derive(Debug, Default)]
pub struct TraceBatch {
    pub events: Vec<Event>,
    pub malformed: Vec<TraceParseError>,
}

/// The instance directory, removed on drop (also when `open` fails half-way).
struct Instance(PathBuf);

impl Drop for Instance {
    fn drop(&mut self) {
        for enable in [AER_EVENT, LINK_EVENT] {
            let _ = fs::write(self.0.join(enable), "0");
        }
        let _ = fs::remove_dir(&self.0);
    }
}

pub struct TraceSession {
    /// Closed before the instance is removed (an open trace_pipe keeps it busy).
    pipe: Option<File>,
    instance: Instance,
    pipe_path: PathBuf,
    /// A line the last read cut off.
    partial: String,
    next_seq: u64,
    link_events: bool,
}

fn write_control(path: &Path, value: &str) -> Result<(), SourceError> {
    fs::write(path, value).map_err(|source| SourceError::io(path, source))
}

impl TraceSession {
    /// Creates the instance `name` under `<root>/instances`, sets its clock
    /// to CLOCK_MONOTONIC, enables the tracepoints and opens its trace_pipe.
    pub fn open(root: &Path, name: &str) -> Result<TraceSession, SourceError> {
        let instances = root.join("instances");
        match fs::metadata(&instances) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(SourceError::TracefsMissing {
                    path: root.to_path_buf(),
                    source: std::io::Error::new(ErrorKind::NotFound, "no instances directory"),
                })
            }
            Err(source) if source.kind() == ErrorKind::NotFound => {
                return Err(SourceError::TracefsMissing {
                    path: root.to_path_buf(),
                    source,
                })
            }
            Err(source) => return Err(SourceError::io(instances, source)),
        }
        let dir = instances.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(source) if source.kind() == ErrorKind::AlreadyExists => {
                return Err(SourceError::InstanceExists { path: dir })
            }
            Err(source) => return Err(SourceError::io(dir, source)),
        }
        let instance = Instance(dir);
        let dir = &instance.0;
        write_control(&dir.join("trace_clock"), "mono")?;
        // Poll wakes on the first record, not when the buffer is half full
        // (the default 50); kernels without the file wake on any record.
        let percent = dir.join("buffer_percent");
        if percent.exists() {
            write_control(&percent, "0")?;
        }
        let aer = dir.join(AER_EVENT);
        if !aer.exists() {
            return Err(SourceError::NoTracepoint {
                path: root.join(AER_EVENT),
                event: "ras:aer_event",
            });
        }
        write_control(&aer, "1")?;
        let link = dir.join(LINK_EVENT);
        let link_events = link.exists();
        if link_events {
            write_control(&link, "1")?;
        }
        let pipe_path = dir.join("trace_pipe");
        let pipe = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&pipe_path)
            .map_err(|source| SourceError::io(&pipe_path, source))?;
        Ok(TraceSession {
            pipe: Some(pipe),
            instance,
            pipe_path,
            partial: String::new(),
            next_seq: 0,
            link_events,
        })
    }

    /// The instance's directory.
    pub fn instance(&self) -> &Path {
        &self.instance.0
    }

    /// Whether the kernel has `pci:pcie_link_event` (7.0 and later).
    pub fn has_link_events(&self) -> bool {
        self.link_events
    }

    /// The trace_pipe, for poll(2): readable when records wait.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.pipe.as_ref().expect("open until drop").as_fd()
    }

    /// Reads what trace_pipe holds now (never blocks). `now_ns` dates lost-
    /// record notices, which carry no time of their own.
    pub fn read_available(&mut self, now_ns: u64) -> Result<TraceBatch, SourceError> {
        let pipe = self.pipe.as_mut().expect("open until drop");
        let mut bytes = Vec::new();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match pipe.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(source) => return Err(SourceError::io(&self.pipe_path, source)),
            }
        }
        self.partial.push_str(&String::from_utf8_lossy(&bytes));
        let mut batch = TraceBatch::default();
        let complete = match self.partial.rfind('\n') {
            Some(end) => {
                let rest = self.partial.split_off(end + 1);
                std::mem::replace(&mut self.partial, rest)
            }
            None => return Ok(batch),
        };
        for line in complete.lines() {
            match trace_text::parse_line(line) {
                Ok(Some(record)) => {
                    batch
                        .events
                        .push(trace_text::to_event(&record, self.next_seq, now_ns));
                    self.next_seq += 1;
                }
                Ok(None) => {}
                Err(error) => batch.malformed.push(error),
            }
        }
        Ok(batch)
    }
}

impl Drop for TraceSession {
    fn drop(&mut self) {
        // Close the pipe first; `instance` is dropped after this, removing it.
        drop(self.pipe.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pcieipc-tracefs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn missing_tracefs_is_named() {
        let dir = scratch("missing");
        let root = dir.join("not-mounted");
        let err = TraceSession::open(&root, "x").err().unwrap();
        assert!(matches!(err, SourceError::TracefsMissing { ref path, .. } if *path == root));
        assert!(err.to_string().contains("mount -t tracefs"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_kernel_without_the_tracepoint_is_named_and_the_instance_removed() {
        // A directory that looks like tracefs with no events: creating the
        // instance works (mkdir), the tracepoint is not there.
        let root = scratch("noevent");
        fs::create_dir(root.join("instances")).unwrap();
        let err = TraceSession::open(&root, "pcieipc-test").err().unwrap();
        assert!(
            matches!(
                err,
                SourceError::NoTracepoint {
                    event: "ras:aer_event",
                    ..
                }
            ),
            "{err}"
        );
        // What open wrote (trace_clock) is a plain file here: the instance
        // directory stays only because a real tracefs would own those files.
        let left: Vec<_> = fs::read_dir(root.join("instances/pcieipc-test"))
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert_eq!(left, ["trace_clock"]);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_existing_instance_is_not_taken_over() {
        let root = scratch("exists");
        fs::create_dir_all(root.join("instances/mine")).unwrap();
        let err = TraceSession::open(&root, "mine").err().unwrap();
        assert!(matches!(err, SourceError::InstanceExists { .. }), "{err}");
        assert!(
            root.join("instances/mine").is_dir(),
            "someone else's instance stays"
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
