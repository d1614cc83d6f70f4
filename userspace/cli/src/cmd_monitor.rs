//! `pcieipc monitor`: one ordered stream of events (AER, link changes,
//! retrains, device removal) from the module's /dev/pcieipc (devices it
//! binds), the kernel's tracepoints through tracefs (every device) or, where
//! tracing is unavailable, the kernel's AER counters; as lines or JSON lines,
//! each marked with its source. With `--store` every event printed is also
//! appended to an event store, with `--metrics` a Prometheus page is served
//! (`monitor_service`).

use std::{
    io::Write,
    os::fd::AsFd,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{bail, Context};
use nix::{
    poll::{poll, PollFd, PollFlags, PollTimeout},
    sys::{
        signal::{SigSet, Signal},
        signalfd::{SfdFlags, SignalFd},
    },
};
use pcieipc::{
    device::{Device, DeviceError, DEFAULT_PATH},
    event_source::{
        merge::Merger,
        monotonic_now_ns,
        sysfs_counters::{CounterPoller, CounterReadings},
        tracefs::TraceSession,
        DEFAULT_TRACEFS_ROOT,
    },
    events::Event,
    metrics::EventCounts,
};

use crate::monitor_service::{self, MetricsServer, StoreWriter};
use crate::output::eprint_line;

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Source {
    /// The module's /dev/pcieipc: devices it binds, with the recovery steps.
    Module,
    /// ras:aer_event and pci:pcie_link_event through a tracefs instance of
    /// our own: every device.
    Tracefs,
    /// The aer_dev_* counters in sysfs, polled: every device.
    Counters,
}

#[derive(clap::Args)]
pub struct Args {
    /// The module's device node.
    #[arg(long, default_value = DEFAULT_PATH)]
    path: PathBuf,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<u64>,
    /// Print the events already there and stop instead of waiting for more.
    /// Only the module keeps a backlog, so this reads the module alone unless
    /// --source or --seconds says otherwise.
    #[arg(long)]
    no_wait: bool,
    /// Follow for this many seconds, then print what is left and stop.
    #[arg(long)]
    seconds: Option<f64>,
    /// Sources (comma-separated). Default: the module where it is loaded, and
    /// tracefs, or the counters where tracing is unavailable.
    #[arg(long, value_delimiter = ',')]
    source: Vec<Source>,
    /// Where tracefs is mounted.
    #[arg(long, default_value = DEFAULT_TRACEFS_ROOT)]
    tracefs_root: PathBuf,
    /// Root under which sys/bus/pci/devices is read (the counters source).
    #[arg(long, default_value = "/")]
    sysfs_root: PathBuf,
    /// How often the counters source reads the counters, in milliseconds.
    #[arg(long, default_value_t = 500)]
    poll_ms: u64,
    #[command(flatten)]
    service: monitor_service::Args,
}

/// Records taken per read of the module.
const BATCH: usize = 64;
/// The longest the monitor sleeps with a tracefs source.
const TRACE_RECHECK: Duration = Duration::from_millis(200);
/// How long an event waits for older ones from slower sources.
const REORDER_WINDOW: Duration = Duration::from_millis(250);

struct Sources {
    module: Option<Device>,
    trace: Option<TraceSession>,
    counters: Option<CounterPoller>,
}

fn note(text: &str) {
    eprint_line(&format!("pcieipc monitor: {text}"));
}

/// Opens the sources asked for (or the default set), saying on stderr which
/// ones run; a source asked for by name that cannot open is an error, a
/// default one a note.
/// `kept`: the counters' baseline an event store kept from an earlier monitor.
fn open_sources(args: &Args, kept: &CounterReadings) -> anyhow::Result<Sources> {
    let following = !args.no_wait || args.seconds.is_some();
    let explicit = !args.source.is_empty();
    let wanted = |source: Source| {
        if explicit {
            args.source.contains(&source)
        } else {
            source == Source::Module || following
        }
    };
    let mut sources = Sources {
        module: None,
        trace: None,
        counters: None,
    };
    let mut reasons = Vec::new();
    if wanted(Source::Module) {
        match Device::open_with(&args.path, true) {
            Ok(device) => sources.module = Some(device),
            Err(err @ DeviceError::Open { .. }) if !explicit => {
                reasons.push(format!("module: {err}"));
            }
            Err(err) => return Err(err).context("the module source"),
        }
    }
    let mut trace_failed = false;
    if wanted(Source::Tracefs) {
        let name = format!("pcieipc-monitor-{}", std::process::id());
        match TraceSession::open(&args.tracefs_root, &name) {
            Ok(session) => sources.trace = Some(session),
            Err(err) if !explicit => {
                note(&format!(
                    "tracefs: {err}; using the aer_dev_* counters instead"
                ));
                reasons.push(format!("tracefs: {err}"));
                trace_failed = true;
            }
            Err(err) => return Err(err).context("the tracefs source"),
        }
    }
    if (explicit && args.source.contains(&Source::Counters)) || (!explicit && trace_failed) {
        match CounterPoller::open_from(&args.sysfs_root, kept) {
            Ok(poller) => sources.counters = Some(poller),
            Err(err) if !explicit => reasons.push(format!("counters: {err}")),
            Err(err) => return Err(err).context("the counters source"),
        }
    }
    let mut running = Vec::new();
    if sources.module.is_some() {
        running.push(format!("module ({})", args.path.display()));
    }
    if let Some(trace) = &sources.trace {
        running.push(format!(
            "tracefs (instance {}{})",
            trace.instance().display(),
            if trace.has_link_events() {
                ", with pcie_link_event"
            } else {
                ", no pcie_link_event in this kernel"
            }
        ));
    }
    if let Some(counters) = &sources.counters {
        running.push(format!(
            "counters ({} devices under {}, every {} ms)",
            counters.devices(),
            args.sysfs_root.display(),
            args.poll_ms
        ));
    }
    if running.is_empty() {
        bail!("no event source could be opened: {}", reasons.join("; "));
    }
    if following {
        note(&format!("following {}", running.join(", ")));
    } else if sources.module.is_none() {
        note("only the module keeps a backlog: --no-wait without it prints nothing");
    }
    Ok(sources)
}

/// What the sources hold now, read without blocking.
fn read_sources(
    sources: &mut Sources,
    now: u64,
    poll_counters: bool,
) -> anyhow::Result<Vec<Event>> {
    let mut events = Vec::new();
    if let Some(device) = sources.module.as_mut() {
        loop {
            match device.read_events(BATCH) {
                Ok(batch) if batch.is_empty() => break,
                Ok(batch) => events.extend(batch),
                Err(err) if err.errno() == Some(nix::errno::Errno::EAGAIN) => break,
                Err(err) => return Err(err.into()),
            }
        }
    }
    if let Some(trace) = sources.trace.as_mut() {
        let batch = trace.read_available(now)?;
        for error in &batch.malformed {
            note(&format!("tracefs: skipped: {error}"));
        }
        events.extend(batch.events);
    }
    if poll_counters {
        if let Some(counters) = sources.counters.as_mut() {
            let batch = counters.poll(now)?;
            for problem in &batch.problems {
                note(&format!("counters: skipped: {problem}"));
            }
            events.extend(batch.events);
        }
    }
    Ok(events)
}

/// Blocks SIGINT and SIGTERM and returns them as a descriptor, so that an
/// interrupted monitor still removes its tracing instance.
fn signals() -> anyhow::Result<SignalFd> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block().context("blocking SIGINT/SIGTERM")?;
    SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).context("signalfd")
}

struct Printer<'a> {
    json: bool,
    count: Option<u64>,
    printed: u64,
    out: std::io::StdoutLock<'a>,
    /// Where every printed event is also stored (`--store`).
    store: Option<StoreWriter>,
    /// What `--metrics` counts; `following_tracefs` as `EventCounts::record` says.
    counts: Option<(Arc<Mutex<EventCounts>>, bool)>,
}

impl Printer<'_> {
    /// Stores and prints `events` (those up to `--count`); false once
    /// `--count` is reached. `settled_ns`: no source will deliver an event
    /// older than this any more (`None`: the last call), which says which
    /// counter baseline the store may keep with them.
    fn print(&mut self, mut events: Vec<Event>, settled_ns: Option<u64>) -> anyhow::Result<bool> {
        let room = self.count.map(|count| count.saturating_sub(self.printed));
        let reached = room.is_some_and(|room| events.len() as u64 >= room);
        let mut settled_ns = settled_ns;
        if let Some(room) = room.filter(|room| (*room as usize) < events.len()) {
            // The events left out must be found again by a later monitor: no
            // baseline that accounts for them is kept.
            let first_left_out = events[room as usize].timestamp_ns;
            settled_ns = Some(
                settled_ns
                    .map_or(first_left_out, |s| s.min(first_left_out))
                    .saturating_sub(1),
            );
            events.truncate(room as usize);
        }
        // Stored before printed: an event the store refused is not shown as kept.
        if let Some(store) = self.store.as_mut() {
            store.write(&events, settled_ns)?;
        }
        if let Some((counts, following_tracefs)) = &self.counts {
            // A panicked scrape leaves the counts as they were: still usable.
            let mut counts = counts
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for event in &events {
                counts.record(event, *following_tracefs);
            }
        }
        for event in events {
            if self.json {
                serde_json::to_writer(&mut self.out, &event).context("writing JSON")?;
                writeln!(self.out)?;
            } else {
                writeln!(self.out, "{event}")?;
            }
            self.printed += 1;
        }
        self.out.flush()?;
        Ok(!reached)
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(seconds) = args.seconds {
        if !(seconds.is_finite() && seconds >= 0.0) {
            bail!("--seconds must be a number of seconds >= 0, not {seconds}");
        }
    }
    let following = !args.no_wait || args.seconds.is_some();
    // Blocked before any thread starts (the metrics listener's included), so
    // that SIGTERM reaches the loop below, which removes the tracing instance.
    let signal_fd = if following { Some(signals()?) } else { None };
    // The address is checked and bound, and the store opened, before any
    // source: a wrong flag fails at once, and nothing is read from the
    // module's backlog that could not be kept.
    let metrics = args.service.bind_metrics()?;
    let mut store = args.service.open_store(&args.sysfs_root)?;
    let kept = match &store {
        Some(store) => store.kept_baseline()?,
        None => CounterReadings::new(),
    };
    let mut sources = open_sources(&args, &kept)?;
    if let (Some(store), Some(counters)) = (store.as_mut(), sources.counters.as_ref()) {
        store.note_poll(0, counters.readings());
    }
    let counts = metrics
        .map(|server: MetricsServer| server.serve(&args.sysfs_root, &args.path, &args.service));
    let mut printer = Printer {
        json: args.json,
        count: args.count,
        printed: 0,
        out: std::io::stdout().lock(),
        store,
        counts: counts.map(|counts| (counts, sources.trace.is_some())),
    };
    let mut merger = Merger::new(REORDER_WINDOW.as_nanos() as u64);
    let start = monotonic_now_ns();
    let deadline = args.seconds.map(|s| start.saturating_add((s * 1e9) as u64));
    let poll_every = Duration::from_millis(args.poll_ms.max(1)).as_nanos() as u64;
    let mut next_counters = start + poll_every;
    loop {
        let now = monotonic_now_ns();
        let poll_counters = now >= next_counters;
        if poll_counters {
            next_counters = now + poll_every;
        }
        merger.push(read_sources(&mut sources, now, poll_counters)?);
        if poll_counters {
            if let (Some(store), Some(counters)) = (printer.store.as_mut(), &sources.counters) {
                store.note_poll(now, counters.readings());
            }
        }
        if !following || deadline.is_some_and(|d| now >= d) {
            break;
        }
        let settled = now.saturating_sub(REORDER_WINDOW.as_nanos() as u64);
        if !printer.print(merger.ready(now), Some(settled))? {
            return Ok(ExitCode::SUCCESS);
        }
        // Sleep until a source has something, the next counters poll, the
        // reorder window of what waits, or the deadline.
        let mut wake = u64::MAX;
        if sources.counters.is_some() {
            wake = wake.min(next_counters);
        }
        if !merger.is_empty() {
            wake = wake.min(now + REORDER_WINDOW.as_nanos() as u64 / 4);
        }
        if let Some(d) = deadline {
            wake = wake.min(d);
        }
        if sources.trace.is_some() {
            // trace_pipe wakes pollers on any record with buffer_percent 0
            // (set where the kernel has it); read again at least this often.
            wake = wake.min(now + TRACE_RECHECK.as_nanos() as u64);
        }
        let timeout = if wake == u64::MAX {
            PollTimeout::NONE
        } else {
            let ms = wake.saturating_sub(now).div_ceil(1_000_000).min(60_000);
            PollTimeout::try_from(ms as i32).unwrap_or(PollTimeout::MAX)
        };
        let mut fds = Vec::new();
        if let Some(device) = &sources.module {
            fds.push(PollFd::new(device.as_fd(), PollFlags::POLLIN));
        }
        if let Some(trace) = &sources.trace {
            fds.push(PollFd::new(trace.fd(), PollFlags::POLLIN));
        }
        let signal_fd = signal_fd.as_ref().expect("following");
        fds.push(PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN));
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(err) => return Err(err).context("poll"),
        }
        if fds
            .last()
            .and_then(|fd| fd.revents())
            .is_some_and(|r| r.contains(PollFlags::POLLIN))
        {
            // Interrupted: print what was gathered, then clean up on return.
            merger.push(read_sources(&mut sources, monotonic_now_ns(), false)?);
            break;
        }
    }
    printer.print(merger.drain(), None)?;
    Ok(ExitCode::SUCCESS)
}
