//! The page itself: `render` turns what a scrape read into the text
//! exposition format. Pure.

use std::collections::{BTreeMap, BTreeSet};

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, TextEncoder};

use crate::device::ModuleVersion;
use crate::event_source::counters::{counter_names, FILES};
use crate::event_store::record::{kind_name, severity_name};
use crate::events::{Event, EventKind, EventSource};
use crate::probe::names::class_name;
use crate::probe::nvlink::{NvmlAnswers, NVLINK_ERROR_COUNTERS};
use crate::probe::watch::WindowedHealth;
use crate::probe::{Bdf, LinkState, Topology};

/// The address the service listens on (and the one `--metrics` errors
/// suggest): loopback, a port in the exporters' range 9100-9999. That range
/// is wholly allocated on Prometheus' list by now, so where another exporter
/// has 9773, `--metrics` takes any other.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9773";

/// What the monitor's sources delivered since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventCounts {
    /// (source, kind) -> events.
    by_source_and_kind: BTreeMap<(&'static str, String), u64>,
    /// (device, severity, error) -> errors, from events (see the module's
    /// comment for which ones count).
    aer_from_events: BTreeMap<(String, &'static str, String), u64>,
}

impl EventCounts {
    /// Counts an event; `following_tracefs`: the monitor reads tracefs, which
    /// reports every error the module reports too.
    pub fn record(&mut self, event: &Event, following_tracefs: bool) {
        *self
            .by_source_and_kind
            .entry((event.source.name(), kind_name(event)))
            .or_default() += 1;
        if event.kind != EventKind::Aer {
            return;
        }
        let device = match event.source {
            EventSource::Tracefs => event.bdf.clone(),
            EventSource::Module
                if !following_tracefs
                    && matches!(
                        event.aer_step,
                        Some("error_detected" | "cor_error_detected")
                    ) =>
            {
                // The error was reported by the port above the bound device.
                event
                    .aer_source
                    .clone()
                    .unwrap_or_else(|| event.bdf.clone())
            }
            // The counters source: the counters themselves are the metric.
            _ => return,
        };
        for error in &event.errors {
            *self
                .aer_from_events
                .entry((
                    device.clone(),
                    severity_name(error.severity),
                    error.short.clone(),
                ))
                .or_default() += 1;
        }
    }
}

/// Whether the module is loaded, and what it says of itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModuleState {
    pub loaded: bool,
    /// `PCIEIPC_IOC_VERSION`, where `/dev/pcieipc` opened.
    pub version: Option<ModuleVersion>,
}

/// Everything one page shows.
pub struct Scrape<'a> {
    pub topology: &'a Topology,
    /// `probe --watch`'s health over its window, for the same devices.
    pub window: &'a WindowedHealth,
    pub events: &'a EventCounts,
    pub module: &'a ModuleState,
    /// `None` where NVML was not asked or did not answer.
    pub nvml: Option<&'a NvmlAnswers>,
}

/// One family of the page, filled in the client's data model
/// (`prometheus::proto`) and written by its encoder. A registry of metric
/// vectors built anew at each scrape cost most of a scrape in allocation
/// (`scripts/bench-monitor-cpu.sh`); the page is read state, not state kept.
struct Family(MetricFamily);

impl Family {
    fn new(name: &str, help: &str, kind: MetricType) -> Family {
        let mut family = MetricFamily::default();
        family.set_name(name.to_string());
        family.set_help(help.to_string());
        family.set_field_type(kind);
        Family(family)
    }

    /// A sample; `labels` in name order, as Prometheus' own clients write them.
    fn add(&mut self, labels: &[(&str, &str)], value: f64) {
        let mut metric = Metric::from_label(
            labels
                .iter()
                .map(|(name, value)| {
                    let mut pair = LabelPair::default();
                    pair.set_name((*name).to_string());
                    pair.set_value((*value).to_string());
                    pair
                })
                .collect(),
        );
        if self.0.get_field_type() == MetricType::COUNTER {
            let mut counter = Counter::default();
            counter.set_value(value);
            metric.set_counter(counter);
        } else {
            let mut gauge = Gauge::default();
            gauge.set_value(value);
            metric.set_gauge(gauge);
        }
        self.0.mut_metric().push(metric);
    }
}

/// A device's labels: bus id, class name, driver, GPU number ("" where none).
struct DeviceLabels {
    bdf: String,
    class: &'static str,
    driver: String,
    gpu: String,
}

impl DeviceLabels {
    fn pairs(&self) -> [(&str, &str); 4] {
        [
            ("bdf", &self.bdf),
            ("class", self.class),
            ("driver", &self.driver),
            ("gpu", &self.gpu),
        ]
    }

    fn aer_pairs<'a>(&'a self, severity: &'a str, error: &'a str) -> [(&'a str, &'a str); 6] {
        [
            ("bdf", &self.bdf),
            ("class", self.class),
            ("driver", &self.driver),
            ("error", error),
            ("gpu", &self.gpu),
            ("severity", severity),
        ]
    }
}

/// The page, in Prometheus' text format.
pub fn render(scrape: &Scrape) -> String {
    use MetricType::{COUNTER, GAUGE};
    let mut speed = Family::new(
        "pcieipc_link_speed_gts",
        "Current speed of the link above the device, GT/s per lane.",
        GAUGE,
    );
    let mut width = Family::new(
        "pcieipc_link_width",
        "Current width of the link above the device, lanes.",
        GAUGE,
    );
    let mut max_speed = Family::new(
        "pcieipc_link_max_speed_gts",
        "The highest speed both ends of the link can do, GT/s per lane.",
        GAUGE,
    );
    let mut max_width = Family::new(
        "pcieipc_link_max_width",
        "The widest both ends of the link can do, lanes.",
        GAUGE,
    );
    let mut degraded = Family::new(
        "pcieipc_link_degraded",
        "1 when the link runs below what both ends can do and it is not a GPU's idle downshift.",
        GAUGE,
    );
    let mut health = Family::new(
        "pcieipc_health_score",
        "(1 - correctable/1e6)(1 - uncorrectable/1e4) on the device's lifetime AER counters; without counters, its link's state.",
        GAUGE,
    );
    let mut health_window = Family::new(
        "pcieipc_health_score_window",
        "The health score on the AER errors within the monitor's --window (probe --watch's formula).",
        GAUGE,
    );
    let mut aer = Family::new(
        "pcieipc_aer_errors_total",
        "AER errors by the kernel's name of the status bit: the kernel's aer_dev_* counters, or for devices without them the monitor's events.",
        COUNTER,
    );
    let mut events = Family::new(
        "pcieipc_events_total",
        "Events the monitor's sources delivered since it started.",
        COUNTER,
    );
    let mut module_loaded = Family::new(
        "pcieipc_module_loaded",
        "1 when the pcieipc kernel module is loaded.",
        GAUGE,
    );
    let mut module_info = Family::new(
        "pcieipc_module_info",
        "The loaded module's ABI (major.minor) and version, as PCIEIPC_IOC_VERSION reports them.",
        GAUGE,
    );
    let mut nvlink_up = Family::new(
        "pcieipc_nvlink_up",
        "1 when NVML reports the GPU's NVLink active, 0 when inactive.",
        GAUGE,
    );
    let mut nvlink_errors = Family::new(
        "pcieipc_nvlink_errors_total",
        "NVML's NVLink error counters (nvmlDeviceGetNvLinkErrorCounter): replay, recovery, crc_flit, crc_data, ecc_data.",
        COUNTER,
    );

    let topology = scrape.topology;
    let mut gpu_numbers = BTreeMap::new();
    for (number, index) in topology.gpus().into_iter().enumerate() {
        gpu_numbers.insert(index, number.to_string());
    }
    let mut probed = BTreeSet::new();
    for (index, device) in topology.devices.iter().enumerate() {
        let labels = DeviceLabels {
            bdf: device.bdf.to_string(),
            class: device.class_code.map(class_name).unwrap_or_default(),
            driver: device.driver.clone().unwrap_or_default(),
            gpu: gpu_numbers.get(&index).cloned().unwrap_or_default(),
        };
        let pairs = labels.pairs();
        if let Some(link) = topology.link_above(index) {
            if let Some(value) = link.current_speed {
                speed.add(&pairs, value.gigatransfers_per_second());
            }
            if let Some(value) = link.current_width {
                width.add(&pairs, value.into());
            }
            if let Some(value) = link.max_speed {
                max_speed.add(&pairs, value.gigatransfers_per_second());
            }
            if let Some(value) = link.max_width {
                max_width.add(&pairs, value.into());
            }
            if link.state != LinkState::Unknown {
                degraded.add(
                    &pairs,
                    f64::from(u8::from(link.state == LinkState::Degraded)),
                );
            }
        }
        if let Some(score) = device.health {
            health.add(&pairs, score);
        }
        let in_window = scrape
            .window
            .devices
            .binary_search_by_key(&device.bdf, |windowed| windowed.bdf)
            .ok()
            .and_then(|found| scrape.window.devices[found].health);
        if let Some(score) = in_window {
            health_window.add(&pairs, score);
        }
        let files = [
            &device.aer.correctable,
            &device.aer.nonfatal,
            &device.aer.fatal,
        ];
        for (file, (_, severity)) in files.into_iter().zip(FILES) {
            let Some(file) = file else { continue };
            let known = counter_names(severity);
            let unknown = file
                .nonzero_counts
                .iter()
                .map(|(name, _)| name.as_str())
                .filter(|name| !known.contains(name));
            for name in known.iter().copied().chain(unknown) {
                let count = file
                    .nonzero_counts
                    .iter()
                    .find(|(counted, _)| counted == name)
                    .map_or(0, |(_, count)| *count);
                aer.add(
                    &labels.aer_pairs(severity_name(severity), name),
                    count as f64,
                );
            }
        }
        probed.insert(labels.bdf.clone());
        // The kernel counts this device's errors: its events add nothing.
        if device.aer_reported() {
            continue;
        }
        for ((_, severity, error), count) in scrape
            .events
            .aer_from_events
            .range((labels.bdf.clone(), "", String::new())..)
            .take_while(|((bdf, _, _), _)| *bdf == labels.bdf)
        {
            aer.add(&labels.aer_pairs(severity, error), *count as f64);
        }
    }
    // Devices the events named that this scrape did not find (removed).
    for ((bdf, severity, error), count) in &scrape.events.aer_from_events {
        if !probed.contains(bdf) {
            let gone = DeviceLabels {
                bdf: bdf.clone(),
                class: "",
                driver: String::new(),
                gpu: String::new(),
            };
            aer.add(&gone.aer_pairs(severity, error), *count as f64);
        }
    }
    // Every source and kind from zero, so that the first event of a kind is
    // an increase Prometheus sees.
    let mut event_counts: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for source in [
        EventSource::Module,
        EventSource::Tracefs,
        EventSource::Counters,
    ] {
        for kind in [
            "aer",
            "device_gone",
            "link_change",
            "link_retrain",
            "overflow",
            "reset",
        ] {
            event_counts.insert((source.name(), kind), 0);
        }
    }
    for ((source, kind), count) in &scrape.events.by_source_and_kind {
        event_counts.insert((source, kind.as_str()), *count);
    }
    for ((source, kind), count) in event_counts {
        events.add(&[("kind", kind), ("source", source)], count as f64);
    }
    module_loaded.add(&[], f64::from(u8::from(scrape.module.loaded)));
    if let Some(version) = &scrape.module.version {
        module_info.add(
            &[
                (
                    "abi",
                    &format!("{}.{}", version.abi_major, version.abi_minor),
                ),
                ("version", &version.module_version),
            ],
            1.0,
        );
    }
    if let Some(answers) = scrape.nvml {
        for gpu in &answers.gpus {
            let Some(bdf) = gpu.pci_bus_id.ok().and_then(|id| id.parse::<Bdf>().ok()) else {
                continue;
            };
            let number = topology
                .find(bdf)
                .and_then(|index| gpu_numbers.get(&index).cloned())
                .unwrap_or_else(|| gpu.index.to_string());
            for link in &gpu.links {
                let Some(active) = link.state.ok() else {
                    continue;
                };
                let remote = link
                    .remote_pci_bus_id
                    .ok()
                    .and_then(|id| id.parse::<Bdf>().ok())
                    .map(|remote| remote.to_string())
                    .unwrap_or_default();
                let (bdf, link_number) = (bdf.to_string(), link.link.to_string());
                nvlink_up.add(
                    &[
                        ("bdf", &bdf),
                        ("gpu", &number),
                        ("link", &link_number),
                        ("remote", &remote),
                    ],
                    f64::from(u8::from(*active)),
                );
                // A counter NVML does not keep (NOT_SUPPORTED) is left off.
                for (error, answer) in NVLINK_ERROR_COUNTERS.iter().zip(&link.error_counters) {
                    if let Some(count) = answer.ok() {
                        nvlink_errors.add(
                            &[
                                ("bdf", &bdf),
                                ("error", error),
                                ("gpu", &number),
                                ("link", &link_number),
                            ],
                            *count as f64,
                        );
                    }
                }
            }
        }
    }
    let mut families: Vec<MetricFamily> = [
        speed,
        width,
        max_speed,
        max_width,
        degraded,
        health,
        health_window,
        aer,
        events,
        module_loaded,
        module_info,
        nvlink_up,
        nvlink_errors,
    ]
    .into_iter()
    .map(|family| family.0)
    // The encoder refuses a family without samples.
    .filter(|family| !family.get_metric().is_empty())
    .collect();
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut page = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut page)
        .expect("writing into memory");
    // The encoder writes UTF-8 from UTF-8 names and labels.
    String::from_utf8(page).expect("UTF-8")
}
