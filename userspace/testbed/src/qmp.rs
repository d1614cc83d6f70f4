//! A small QMP client (QEMU Machine Protocol: JSON lines over a socket).

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP: {0}")]
    Io(#[from] std::io::Error),
    #[error("QMP: unreadable message {line:?}: {source}")]
    Json {
        line: String,
        source: serde_json::Error,
    },
    #[error("QMP: `{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("QMP: no {event} event within {timeout:?}")]
    NoEvent { event: String, timeout: Duration },
    #[error("QMP: QEMU closed the connection")]
    Closed,
}

pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// Events that arrived while waiting for a command's answer.
    pending_events: Vec<Value>,
}

impl Qmp {
    /// Takes over a connected QMP socket: reads the greeting and leaves
    /// capability negotiation mode.
    pub fn handshake(stream: UnixStream) -> Result<Self, QmpError> {
        let writer = stream.try_clone()?;
        let mut qmp = Self {
            reader: BufReader::new(stream),
            writer,
            pending_events: Vec::new(),
        };
        let greeting = qmp.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Command {
                command: "greeting".into(),
                message: format!("unexpected greeting {greeting}"),
            });
        }
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    pub fn connect(path: &Path) -> Result<Self, QmpError> {
        Self::handshake(UnixStream::connect(path)?)
    }

    /// Connects with every read and write bounded by `timeout`, for a QEMU
    /// that may be stuck.
    pub fn connect_with_timeout(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Self::handshake(stream)
    }

    fn read_message(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(QmpError::Closed);
        }
        serde_json::from_str(&line).map_err(|source| QmpError::Json { line, source })
    }

    /// Runs a command and returns its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        let request = json!({ "execute": command, "arguments": arguments });
        writeln!(self.writer, "{request}")?;
        loop {
            let message = self.read_message()?;
            if let Some(value) = message.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = message.get("error") {
                return Err(QmpError::Command {
                    command: command.into(),
                    message: error
                        .get("desc")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown error")
                        .into(),
                });
            }
            if message.get("event").is_some() {
                self.pending_events.push(message);
            }
        }
    }

    /// A human monitor command (such as `pcie_aer_inject_error`), through QMP
    /// so that no readline echo gets in the way. Its text output is returned;
    /// HMP reports many failures only as text, so callers check it.
    pub fn hmp(&mut self, command_line: &str) -> Result<String, QmpError> {
        let value = self.execute(
            "human-monitor-command",
            json!({ "command-line": command_line }),
        )?;
        Ok(value.as_str().unwrap_or_default().to_string())
    }

    /// Waits for an event whose name is `event` and, if given, whose
    /// `data.device` is `device`.
    pub fn wait_event(
        &mut self,
        event: &str,
        device: Option<&str>,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        let matches = |m: &Value| {
            m.get("event").and_then(Value::as_str) == Some(event)
                && device
                    .is_none_or(|d| m.pointer("/data/device").and_then(Value::as_str) == Some(d))
        };
        if let Some(index) = self.pending_events.iter().position(matches) {
            return Ok(self.pending_events.remove(index));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Later requests on this connection read without a limit.
                self.reader.get_ref().set_read_timeout(None)?;
                return Err(QmpError::NoEvent {
                    event: event.into(),
                    timeout,
                });
            }
            self.reader.get_ref().set_read_timeout(Some(left))?;
            let message = match self.read_message() {
                Ok(m) => m,
                Err(QmpError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            };
            self.reader.get_ref().set_read_timeout(None)?;
            if matches(&message) {
                return Ok(message);
            }
        }
    }
}
