//! `pcieipc-fault-check`: guest-side checks of the module's event stream
//! that need one process to hold several files of /dev/pcieipc at once.

use std::{
    os::fd::AsFd,
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::{Parser, Subcommand};
use nix::{
    errno::Errno,
    poll::{poll, PollFd, PollFlags, PollTimeout},
};
use pcieipc::{
    device::{Device, DEFAULT_PATH},
    events::EventKind,
    probe::bdf::Bdf,
};
use pcieipc_uapi::PCIEIPC_EVENT_RING_CAPACITY;

#[derive(Parser)]
#[command(name = "pcieipc-fault-check")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A reader that sleeps while EVENTS retrain events arrive reads one
    /// overflow record with the exact number lost, then the newest events.
    Overflow {
        /// A function with an upstream port to retrain (each retrain is one event).
        #[arg(long)]
        bdf: String,
        #[arg(long, default_value_t = 10 * PCIEIPC_EVENT_RING_CAPACITY as u64)]
        events: u64,
    },
    /// poll() reports readability exactly when an event is there; a blocked
    /// read wakes for a new event; O_NONBLOCK gives EAGAIN.
    Poll {
        #[arg(long)]
        bdf: String,
    },
    /// Injects an AER error through the harness (`host hmp
    /// pcie_aer_inject_error INJECT`) and checks the events of BDF: the
    /// error_detected record names BIT with SEVERITY, the recovery steps are
    /// the kernel's for that severity, and the device is bound again after.
    Aer {
        #[arg(long)]
        bdf: String,
        /// Arguments of pcie_aer_inject_error, e.g. "rp1 COMP_TIME".
        #[arg(long)]
        inject: String,
        #[arg(long)]
        bit: u8,
        /// non_fatal or fatal.
        #[arg(long)]
        severity: String,
    },
    /// Every line of FILE (`pcieipc monitor --json` output) is a JSON object
    /// with a kind; prints how many of each kind.
    JsonLines { file: std::path::PathBuf },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Overflow { bdf, events } => overflow(&bdf, events),
        Command::Poll { bdf } => poll_check(&bdf),
        Command::JsonLines { file } => json_lines(&file),
        Command::Aer {
            bdf,
            inject,
            bit,
            severity,
        } => aer(&bdf, &inject, bit, &severity),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("pcieipc-fault-check: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Reads everything there is; returns the seq the next event will have, if known.
fn drain(reader: &mut Device) -> Result<Option<u64>, String> {
    let mut next = None;
    loop {
        match reader.read_events(512) {
            Ok(events) => next = events.last().map(|e| e.seq + 1).or(next),
            Err(e) if e.errno() == Some(Errno::EAGAIN) => return Ok(next),
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn overflow(bdf: &str, count: u64) -> Result<(), String> {
    let bdf = parse_bdf(bdf)?;
    let capacity = PCIEIPC_EVENT_RING_CAPACITY as u64;
    if count <= capacity {
        return Err(format!(
            "--events must exceed the ring's {capacity} to overflow it"
        ));
    }
    let mut reader = Device::open_with(DEFAULT_PATH, true).map_err(|e| e.to_string())?;
    let start = drain(&mut reader)?.unwrap_or(0);
    let writer = Device::open(DEFAULT_PATH).map_err(|e| e.to_string())?;
    let began = Instant::now();
    for _ in 0..count {
        let retrain = writer.retrain(bdf, None, None).map_err(|e| e.to_string())?;
        if !retrain.completed {
            return Err("a retrain did not complete".into());
        }
    }
    let generating = began.elapsed();
    let mut records = Vec::new();
    loop {
        match reader.read_events(1024) {
            Ok(events) => records.extend(events),
            Err(e) if e.errno() == Some(Errno::EAGAIN) => break,
            Err(e) => return Err(e.to_string()),
        }
    }
    let first = records.first().ok_or("the sleeping reader read nothing")?;
    if first.kind != EventKind::Overflow {
        return Err(format!("first record is {:?}, not an overflow", first.kind));
    }
    let lost = first.lost.unwrap_or(0);
    if lost != count - capacity {
        return Err(format!(
            "overflow says {lost} lost, expected exactly {}",
            count - capacity
        ));
    }
    let rest = &records[1..];
    if rest.len() as u64 != capacity {
        return Err(format!(
            "{} events after the overflow, expected the newest {capacity}",
            rest.len()
        ));
    }
    for (i, event) in rest.iter().enumerate() {
        let want = start + count - capacity + i as u64;
        if event.seq != want || event.kind != EventKind::LinkRetrain {
            return Err(format!(
                "record {i} after the overflow: seq {} {:?}, expected seq {want} retrain",
                event.seq, event.kind
            ));
        }
    }
    println!(
        "{count} events in {:.0} ms while the reader slept: overflow record says {lost} lost (exact), then seq {}..={} (the newest {capacity})",
        generating.as_secs_f64() * 1e3,
        rest[0].seq,
        rest[rest.len() - 1].seq
    );
    Ok(())
}

fn readable(device: &Device, timeout_ms: u16) -> Result<bool, String> {
    let mut fds = [PollFd::new(device.as_fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::from(timeout_ms)).map_err(|e| format!("poll: {e}"))?;
    Ok(ready == 1
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN)))
}

fn poll_check(bdf: &str) -> Result<(), String> {
    let bdf = parse_bdf(bdf)?;
    let mut reader = Device::open_with(DEFAULT_PATH, true).map_err(|e| e.to_string())?;
    drain(&mut reader)?;
    if readable(&reader, 0)? {
        return Err("poll reports readable with nothing to read".into());
    }
    match reader.read_events(1) {
        Err(e) if e.errno() == Some(Errno::EAGAIN) => {}
        other => {
            return Err(format!(
                "O_NONBLOCK read with nothing there gave {other:?}, not EAGAIN"
            ))
        }
    }
    let writer = Device::open(DEFAULT_PATH).map_err(|e| e.to_string())?;
    writer.retrain(bdf, None, None).map_err(|e| e.to_string())?;
    if !readable(&reader, 1000)? {
        return Err("poll did not report the new event".into());
    }
    let events = reader.read_events(8).map_err(|e| e.to_string())?;
    if events.len() != 1 || events[0].kind != EventKind::LinkRetrain {
        return Err(format!("expected one retrain event, read {events:?}"));
    }
    // A blocking reader sleeps until an event comes.
    let mut blocking = Device::open(DEFAULT_PATH).map_err(|e| e.to_string())?;
    let backlog = blocking.read_events(512).map_err(|e| e.to_string())?;
    let expected_seq = backlog.last().map_or(0, |e| e.seq + 1);
    let waiter = std::thread::spawn(move || {
        let began = Instant::now();
        blocking
            .read_events(1)
            .map(|events| (events, began.elapsed()))
    });
    std::thread::sleep(Duration::from_millis(300));
    writer.retrain(bdf, None, None).map_err(|e| e.to_string())?;
    let (events, waited) = waiter
        .join()
        .map_err(|_| "reader thread panicked")?
        .map_err(|e| e.to_string())?;
    if events.len() != 1 || events[0].seq != expected_seq {
        return Err(format!(
            "blocked reader read {events:?}, expected seq {expected_seq}"
        ));
    }
    if waited < Duration::from_millis(250) {
        return Err(format!(
            "blocked read returned after {waited:?}, before the event"
        ));
    }
    println!("poll: not readable when empty, readable after an event; EAGAIN when empty; blocked read woke after {waited:?}");
    Ok(())
}

fn json_lines(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for (number, line) in text.lines().enumerate() {
        let value: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| format!("{}:{}: not JSON: {e}", path.display(), number + 1))?;
        let kind = value["kind"]
            .as_str()
            .ok_or_else(|| format!("{}:{}: no kind", path.display(), number + 1))?;
        *kinds.entry(kind.to_string()).or_default() += 1;
    }
    if kinds.is_empty() {
        return Err(format!("{}: no events", path.display()));
    }
    println!("{kinds:?}");
    Ok(())
}

fn aer(bdf_text: &str, inject: &str, bit: u8, severity: &str) -> Result<(), String> {
    use pcieipc::{device::DeviceState, events::Severity};
    // Checks the address; events name functions the same way.
    parse_bdf(bdf_text)?;
    let (want_severity, want_channel, want_steps): (Severity, &str, &[&str]) = match severity {
        "non_fatal" => (
            Severity::NonFatal,
            "normal",
            &["error_detected", "mmio_enabled", "resume"],
        ),
        "fatal" => (
            Severity::Fatal,
            "frozen",
            &["error_detected", "slot_reset", "resume"],
        ),
        other => return Err(format!("--severity {other:?}: use non_fatal or fatal")),
    };
    let mut reader = Device::open_with(DEFAULT_PATH, true).map_err(|e| e.to_string())?;
    drain(&mut reader)?;
    let index = reader
        .list()
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|d| d.bdf == bdf_text)
        .map(|d| d.index)
        .ok_or_else(|| format!("{bdf_text} is not bound"))?;
    // A process waiting on the device's interrupt across any reported error
    // must wake with EIO, not sleep through the recovery.
    let wait_for = Duration::from_secs(20);
    let waiter = std::thread::spawn(move || {
        let device = Device::open(DEFAULT_PATH).map_err(|e| e.to_string())?;
        let counts = device.counters(index).map_err(|e| e.to_string())?;
        Ok::<_, String>(
            device
                .wait(index, 0, counts[0], Some(wait_for))
                .map_err(|e| e.errno()),
        )
    });
    std::thread::sleep(Duration::from_millis(200));
    let answer = std::process::Command::new("host")
        .args(["hmp", &format!("pcie_aer_inject_error {inject}")])
        .output()
        .map_err(|e| format!("running host: {e}"))?;
    let answer_text = String::from_utf8_lossy(&answer.stdout);
    if !answer.status.success() || !answer_text.contains("OK") {
        return Err(format!(
            "injection {inject:?} refused: {answer_text} {}",
            String::from_utf8_lossy(&answer.stderr)
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut steps = Vec::new();
    let mut detected = None;
    while steps.last().map(String::as_str) != Some("resume") {
        if Instant::now() > deadline {
            return Err(format!(
                "no resume for {bdf_text} within 15 s; steps seen: {steps:?}"
            ));
        }
        if !readable(&reader, 200)? {
            continue;
        }
        let events = reader.read_events(64).map_err(|e| e.to_string())?;
        for event in events
            .into_iter()
            .filter(|e| e.kind == EventKind::Aer && e.bdf == bdf_text)
        {
            let step = event.aer_step.unwrap_or("?").to_string();
            if step == "error_detected" {
                detected = Some(event.clone());
            }
            steps.push(step);
        }
    }
    if steps != want_steps {
        return Err(format!("recovery steps {steps:?}, expected {want_steps:?}"));
    }
    let detected = detected.ok_or("no error_detected event")?;
    if detected.channel_state != Some(want_channel) {
        return Err(format!(
            "error_detected channel {:?}, expected {want_channel}",
            detected.channel_state
        ));
    }
    let error = detected
        .errors
        .iter()
        .find(|e| e.bit == bit && e.severity != Severity::Correctable)
        .ok_or_else(|| {
            format!(
                "error_detected names no uncorrectable bit {bit}: {:?}",
                detected.errors
            )
        })?;
    if detected.first_error != Some(bit) {
        return Err(format!(
            "the First Error Pointer says {:?}, expected bit {bit}",
            detected.first_error
        ));
    }
    if error.severity != want_severity {
        return Err(format!(
            "bit {bit} ({}) decoded as {:?}, expected {want_severity:?}",
            error.short, error.severity
        ));
    }
    let waited = waiter.join().map_err(|_| "waiter panicked")??;
    if waited != Err(Some(Errno::EIO)) {
        return Err(format!("a waiter across the recovery got {waited:?}"));
    }
    let device = Device::open(DEFAULT_PATH).map_err(|e| e.to_string())?;
    let state = device
        .list()
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|d| d.bdf == bdf_text)
        .map(|d| d.state)
        .ok_or_else(|| format!("{bdf_text} is not bound"))?;
    if state != DeviceState::Bound {
        return Err(format!("{bdf_text} is {state:?} after recovery, not bound"));
    }
    println!(
        "{inject}: [{bit}] {} ({}) {:?}, steps {steps:?}, result {:?}; waiter got {waited:?}; device bound again",
        error.short,
        error.name,
        error.severity,
        detected.result.as_deref().unwrap_or("?")
    );
    Ok(())
}

/// `PCIEIPC_BDF` of "0000:01:00.0" (or lspci's "01:00.0").
fn parse_bdf(text: &str) -> Result<u32, String> {
    let bdf = text.parse::<Bdf>().map_err(|e| e.to_string())?;
    bdf.to_abi().map_err(|e| e.to_string())
}
