//! What makes `pcieipc monitor` a service: `--store` (every printed event
//! appended to an event store, with the counters' baseline) and `--metrics`
//! (the Prometheus page, served from a thread of its own).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use pcieipc::{
    event_source::sysfs_counters::CounterReadings,
    event_store::{
        device_identity, read_boot_id, realtime_offset_ns, EventStore, StoreContext, StoredEvent,
        BOOT_ID_PATH,
    },
    events::Event,
    metrics::{scrape::Scraper, EventCounts, DEFAULT_METRICS_ADDRESS},
    probe::{HealthModel, NvlinkSource, NvmlLibrary},
};

use crate::output::eprint_line;

#[derive(clap::Args)]
pub struct Args {
    /// Append every event printed to this event store (SQLite; created when
    /// missing). `pcieipc events` reads it.
    #[arg(long, value_name = "FILE")]
    store: Option<PathBuf>,
    /// Drop stored events older than this many days.
    #[arg(long, value_name = "DAYS", default_value_t = 90, requires = "store")]
    retain_days: u64,
    /// Drop the oldest stored events while they take more than this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256, requires = "store")]
    retain_mib: u64,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (default port
    /// 9773: --metrics 127.0.0.1:9773), the links and counters read at each
    /// scrape.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "no_wait")]
    metrics: Option<String>,
    /// Seconds of AER errors pcieipc_health_score_window is scored from
    /// (as probe --watch --window), sampled at each scrape.
    #[arg(long, value_name = "SECS", default_value_t = 60, requires = "metrics")]
    window: u64,
}

/// How often the store's retention runs while the monitor follows.
const RETENTION_EVERY: Duration = Duration::from_secs(600);

impl Args {
    /// Checks `--metrics` and listens on it.
    pub fn bind_metrics(&self) -> anyhow::Result<Option<MetricsServer>> {
        let Some(text) = &self.metrics else {
            return Ok(None);
        };
        let address: SocketAddr = text.parse().map_err(|_| {
            anyhow::anyhow!(
                "--metrics {text}: not an address and port like {DEFAULT_METRICS_ADDRESS} or [::1]:9773"
            )
        })?;
        let server = tiny_http::Server::http(address)
            .map_err(|err| anyhow::anyhow!("--metrics {text}: cannot listen there: {err}"))?;
        Ok(Some(MetricsServer { server, address }))
    }

    /// Opens `--store` and applies its retention once.
    pub fn open_store(&self, sysfs_root: &Path) -> anyhow::Result<Option<StoreWriter>> {
        let Some(path) = &self.store else {
            return Ok(None);
        };
        let store = EventStore::open(path)?;
        let boot_id = read_boot_id(Path::new(BOOT_ID_PATH))
            .with_context(|| format!("{BOOT_ID_PATH}: the boot id the store's keys need"))?;
        let mut writer = StoreWriter {
            store,
            boot_id,
            sysfs_root: sysfs_root.to_path_buf(),
            pending_baselines: Vec::new(),
            noted: None,
            max_age: Duration::from_secs(self.retain_days.saturating_mul(86_400)),
            max_bytes: self.retain_mib.saturating_mul(1 << 20),
            next_retention: Instant::now(),
        };
        writer.retain()?;
        eprint_line(&format!(
            "pcieipc monitor: storing events in {} ({} kept)",
            path.display(),
            writer.store.count()?
        ));
        Ok(Some(writer))
    }
}

/// The event store as the monitor writes it.
pub struct StoreWriter {
    store: EventStore,
    boot_id: String,
    sysfs_root: PathBuf,
    /// Counter readings taken at a poll (its CLOCK_MONOTONIC time) whose
    /// events may still wait in the merger: kept with those events.
    pending_baselines: Vec<(u64, CounterReadings)>,
    noted: Option<CounterReadings>,
    max_age: Duration,
    max_bytes: u64,
    next_retention: Instant,
}

impl StoreWriter {
    /// The baseline an earlier monitor of this boot stored.
    pub fn kept_baseline(&self) -> anyhow::Result<CounterReadings> {
        Ok(self.store.counter_baseline(&self.boot_id)?)
    }

    /// The counters source polled at `at_ns` and now has `readings`.
    pub fn note_poll(&mut self, at_ns: u64, readings: &CounterReadings) {
        if self.noted.as_ref() != Some(readings) {
            self.pending_baselines.push((at_ns, readings.clone()));
            self.noted = Some(readings.clone());
        }
    }

    /// Appends `events` with the newest baseline whose poll is no newer than
    /// `settled_ns` (every pending one when `None`).
    pub fn write(&mut self, events: &[Event], settled_ns: Option<u64>) -> anyhow::Result<()> {
        let ready = self
            .pending_baselines
            .iter()
            .take_while(|(at, _)| settled_ns.is_none_or(|settled| *at <= settled))
            .count();
        let baseline = self
            .pending_baselines
            .drain(..ready)
            .next_back()
            .map(|(_, b)| b);
        if events.is_empty() && baseline.is_none() {
            return self.retain_when_due();
        }
        let context = StoreContext {
            boot_id: &self.boot_id,
            realtime_offset_ns: realtime_offset_ns(),
        };
        let rows: Vec<StoredEvent> = events
            .iter()
            .map(|event| {
                StoredEvent::new(
                    event,
                    device_identity(&self.sysfs_root, &event.bdf),
                    &context,
                )
            })
            .collect();
        self.store
            .append(&rows, baseline.as_ref().map(|b| (self.boot_id.as_str(), b)))?;
        self.retain_when_due()
    }

    fn retain_when_due(&mut self) -> anyhow::Result<()> {
        if Instant::now() >= self.next_retention {
            self.retain()?;
        }
        Ok(())
    }

    fn retain(&mut self) -> anyhow::Result<()> {
        let now = realtime_offset_ns().saturating_add(
            i64::try_from(pcieipc::event_source::monotonic_now_ns()).unwrap_or(i64::MAX),
        );
        let removed = self
            .store
            .enforce_retention(now, self.max_age, self.max_bytes)?;
        if removed.expired + removed.over_size > 0 {
            eprint_line(&format!(
                "pcieipc monitor: {}: removed {} events older than {} days, {} over {} MiB",
                self.store.path().display(),
                removed.expired,
                self.max_age.as_secs() / 86_400,
                removed.over_size,
                self.max_bytes >> 20
            ));
        }
        self.next_retention = Instant::now() + RETENTION_EVERY;
        Ok(())
    }
}

/// The `--metrics` listener, bound.
pub struct MetricsServer {
    server: tiny_http::Server,
    address: SocketAddr,
}

impl MetricsServer {
    /// Serves `/metrics` on a thread of its own until the process ends;
    /// returns the counts the monitor adds its events to.
    pub fn serve(
        self,
        sysfs_root: &Path,
        device_path: &Path,
        args: &Args,
    ) -> Arc<Mutex<EventCounts>> {
        let counts = Arc::new(Mutex::new(EventCounts::default()));
        // NVML describes this machine, not a copied sysfs tree.
        let nvml: Option<Box<dyn NvlinkSource + Send>> = if sysfs_root == Path::new("/") {
            NvmlLibrary::open()
                .ok()
                .map(|library| Box::new(library) as Box<dyn NvlinkSource + Send>)
        } else {
            None
        };
        let mut scraper = Scraper::new(
            sysfs_root,
            device_path,
            Duration::from_secs(args.window),
            HealthModel::default(),
            nvml,
        );
        eprint_line(&format!(
            "pcieipc monitor: metrics at http://{}/metrics",
            self.address
        ));
        let shared = Arc::clone(&counts);
        std::thread::spawn(move || {
            for request in self.server.incoming_requests() {
                let path = request.url().split('?').next().unwrap_or_default();
                let response = if path == "/metrics" {
                    let counts = shared
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .clone();
                    match scraper.page(&counts) {
                        Ok(page) => tiny_http::Response::from_string(page).with_header(
                            "Content-Type: text/plain; version=0.0.4; charset=utf-8"
                                .parse::<tiny_http::Header>()
                                .expect("a valid header"),
                        ),
                        Err(err) => {
                            eprint_line(&format!("pcieipc monitor: a scrape failed: {err}"));
                            tiny_http::Response::from_string(format!("{err}\n"))
                                .with_status_code(500)
                        }
                    }
                } else {
                    tiny_http::Response::from_string("pcieipc monitor: metrics at /metrics\n")
                        .with_status_code(404)
                };
                // A scraper that hung up is its own problem.
                let _ = request.respond(response);
            }
        });
        counts
    }
}
