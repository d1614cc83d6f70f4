//! `pcieipc monitor --metrics`: the page Prometheus scrapes, in its text
//! exposition format (0.0.4). `render` is pure: the probed topology, the
//! windowed health, the monitor's event counts, the module's state and
//! NVML's answers in, the page out; `scrape` reads them at each scrape, as
//! node_exporter reads its files.
//!
//! AER errors are never counted twice: a device whose kernel shows its
//! `aer_dev_*` counters is counted from them (what the kernel counted, the
//! errors before the monitor started included); only a device without them
//! is counted from events, from tracefs where the monitor follows it, else
//! from the module's first recovery step of each error.

pub mod scrape;

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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::scrape::Scraper;
    use super::*;
    use crate::events::{aer_error_at, Severity};
    use crate::probe::nvlink::{Answer, NvmlReturn};
    use crate::probe::{HealthModel, NvlinkSource};

    /// GPU6's Bad TLP count in the fixture's aer_dev_correctable.
    const GPU6_BAD_TLP: f64 = 9_000.0;

    fn dgx8() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sysfs/dgx8")
    }

    /// The value of the one sample of `name` whose labels include all of `labels`.
    fn sample(page: &str, name: &str, labels: &[&str]) -> Option<f64> {
        let found: Vec<f64> = page
            .lines()
            .filter(|line| {
                line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
            })
            .filter(|line| labels.iter().all(|label| line.contains(label)))
            .map(|line| line.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?}: {found:?}");
        found.first().copied()
    }

    #[test]
    fn the_fixture_page_names_links_health_and_errors() {
        let mut scraper = Scraper::new(
            &dgx8(),
            Path::new("/nonexistent/pcieipc"),
            Duration::from_secs(60),
            HealthModel::default(),
            None,
        );
        let page = scraper.page(&EventCounts::default()).unwrap();
        // GPU2/GPU3's switch uplink trained to x8 of x16: degraded.
        let uplink = r#"bdf="0000:08:00.0""#;
        assert_eq!(sample(&page, "pcieipc_link_degraded", &[uplink]), Some(1.0));
        assert_eq!(sample(&page, "pcieipc_link_width", &[uplink]), Some(8.0));
        assert_eq!(
            sample(&page, "pcieipc_link_max_width", &[uplink]),
            Some(16.0)
        );
        assert_eq!(
            sample(&page, "pcieipc_link_speed_gts", &[uplink]),
            Some(16.0)
        );
        // GPU7 at 2.5 GT/s of 16 is an idle downshift, not degraded.
        let gpu7 = [
            r#"bdf="0000:8b:00.0""#,
            r#"gpu="7""#,
            r#"class="3D controller""#,
        ];
        assert_eq!(sample(&page, "pcieipc_link_degraded", &gpu7), Some(0.0));
        assert_eq!(sample(&page, "pcieipc_link_speed_gts", &gpu7), Some(2.5));
        assert_eq!(
            sample(&page, "pcieipc_link_max_speed_gts", &gpu7),
            Some(16.0)
        );
        let degraded_links = page
            .lines()
            .filter(|l| l.starts_with("pcieipc_link_degraded{") && l.ends_with(" 1"))
            .count();
        assert_eq!(degraded_links, 1);
        // GPU6: 90,000 correctable and 3 non-fatal errors in its lifetime.
        let gpu6 = r#"bdf="0000:8a:00.0""#;
        let lifetime = sample(&page, "pcieipc_health_score", &[gpu6, r#"gpu="6""#]).unwrap();
        assert!((lifetime - 0.91 * 0.9997).abs() < 1e-9, "{lifetime}");
        // The window starts with the monitor: nothing in it yet.
        assert_eq!(
            sample(&page, "pcieipc_health_score_window", &[gpu6]),
            Some(1.0)
        );
        let total: f64 = page
            .lines()
            .filter(|l| {
                l.starts_with("pcieipc_aer_errors_total{")
                    && l.contains(gpu6)
                    && l.contains(r#"severity="correctable""#)
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        assert_eq!(total, 90_000.0);
        // Every known bit is there from zero.
        assert_eq!(
            sample(
                &page,
                "pcieipc_aer_errors_total",
                &[gpu6, r#"severity="fatal""#, r#"error="MalfTLP""#]
            ),
            Some(0.0)
        );
        assert_eq!(sample(&page, "pcieipc_module_loaded", &[]), Some(0.0));
        assert_eq!(
            sample(
                &page,
                "pcieipc_events_total",
                &[r#"source="tracefs""#, r#"kind="aer""#]
            ),
            Some(0.0)
        );
        assert!(page.contains("# TYPE pcieipc_aer_errors_total counter\n"));
        assert!(!page.contains("pcieipc_module_info"));
    }

    #[test]
    fn nvlink_state_where_nvml_answers() {
        let root =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sysfs/h200-2gpu-vm");
        let nvml = crate::probe::NvmlFixture::new(&root.join("nvml.json"));
        let mut scraper = Scraper::new(
            &root,
            Path::new("/nonexistent"),
            Duration::from_secs(60),
            HealthModel::default(),
            Some(Box::new(nvml)),
        );
        let page = scraper.page(&EventCounts::default()).unwrap();
        // Two H200s joined by 18 links each (NV18).
        let up: Vec<&str> = page
            .lines()
            .filter(|line| line.starts_with("pcieipc_nvlink_up{"))
            .collect();
        assert_eq!(up.len(), 36, "{up:?}");
        assert!(up.iter().all(|line| line.ends_with(" 1")));
        assert_eq!(
            sample(
                &page,
                "pcieipc_nvlink_up",
                &[
                    r#"bdf="0000:00:06.0""#,
                    r#"gpu="0""#,
                    r#"link="17""#,
                    r#"remote="0000:00:07.0""#
                ]
            ),
            Some(1.0)
        );
        // Their own links (no port above them in the VM): Gen5 x16.
        let gpu1 = [r#"bdf="0000:00:07.0""#, r#"gpu="1""#];
        assert_eq!(sample(&page, "pcieipc_link_speed_gts", &gpu1), Some(32.0));
        assert_eq!(sample(&page, "pcieipc_link_width", &gpu1), Some(16.0));
        // The captured answers predate the error counters: none shown.
        assert!(!page.contains("pcieipc_nvlink_errors_total{"));
        // With them (GPU 0's link 3 counting 7 CRC flit errors, the ECC
        // counter NOT_SUPPORTED), each counter NVML keeps is a series.
        let mut answers = nvml_fixture(&root).answers().unwrap();
        for gpu in &mut answers.gpus {
            for link in &mut gpu.links {
                let crc_flit = if gpu.index == 0 && link.link == 3 {
                    7
                } else {
                    0
                };
                link.error_counters = vec![
                    Answer::Ok(0),
                    Answer::Ok(0),
                    Answer::Ok(crc_flit),
                    Answer::Ok(0),
                    Answer::Error(NvmlReturn::NOT_SUPPORTED),
                ];
            }
        }
        let mut counting = Scraper::new(
            &root,
            Path::new("/nonexistent"),
            Duration::from_secs(60),
            HealthModel::default(),
            Some(Box::new(Answered(answers))),
        );
        let page = counting.page(&EventCounts::default()).unwrap();
        let gpu0_link3 = [r#"bdf="0000:00:06.0""#, r#"gpu="0""#, r#"link="3""#];
        assert_eq!(
            sample(
                &page,
                "pcieipc_nvlink_errors_total",
                &[gpu0_link3.as_slice(), &[r#"error="crc_flit""#]].concat()
            ),
            Some(7.0)
        );
        let series = page
            .lines()
            .filter(|line| line.starts_with("pcieipc_nvlink_errors_total{"))
            .count();
        assert_eq!(series, 2 * 18 * 4, "two GPUs, 18 links, 4 counters kept");
        assert!(!page.contains(r#"error="ecc_data""#));
        // Without NVML (a copied tree), no NVLink metrics.
        let mut without = Scraper::new(
            &root,
            Path::new("/nonexistent"),
            Duration::from_secs(60),
            HealthModel::default(),
            None,
        );
        assert!(!without
            .page(&EventCounts::default())
            .unwrap()
            .contains("pcieipc_nvlink_up{"));
    }

    #[test]
    fn events_count_only_where_the_kernel_has_no_counters() {
        let mut counts = EventCounts::default();
        // A root port without counters in this tree (a made-up one) and
        // GPU6, which has them.
        let port = "0000:ee:00.0";
        let mut traced = Event::new(EventSource::Tracefs, EventKind::Aer, port.into(), 1);
        traced.errors = vec![aer_error_at(6, Severity::Correctable, false)];
        counts.record(&traced, true);
        counts.record(&traced, true);
        let mut on_gpu6 = traced.clone();
        on_gpu6.bdf = "0000:8a:00.0".into();
        counts.record(&on_gpu6, true);
        // The module's steps of an error tracefs reported already.
        let mut module = Event::new(
            EventSource::Module,
            EventKind::Aer,
            "0000:ef:00.0".into(),
            2,
        );
        module.aer_step = Some("error_detected");
        module.aer_source = Some(port.into());
        module.errors = vec![aer_error_at(14, Severity::NonFatal, false)];
        counts.record(&module, true);
        let mut scraper = Scraper::new(
            &dgx8(),
            Path::new("/nonexistent"),
            Duration::from_secs(60),
            HealthModel::default(),
            None,
        );
        let page = scraper.page(&counts).unwrap();
        let at_port = format!(r#"bdf="{port}""#);
        assert_eq!(
            sample(
                &page,
                "pcieipc_aer_errors_total",
                &[&at_port, r#"error="BadTLP""#]
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &page,
                "pcieipc_aer_errors_total",
                &[&at_port, r#"error="CmpltTO""#]
            ),
            None
        );
        // GPU6's stays its counter's value.
        assert_eq!(
            sample(
                &page,
                "pcieipc_aer_errors_total",
                &[r#"bdf="0000:8a:00.0""#, r#"error="BadTLP""#]
            ),
            Some(GPU6_BAD_TLP)
        );
        assert_eq!(
            sample(
                &page,
                "pcieipc_events_total",
                &[r#"source="tracefs""#, r#"kind="aer""#]
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(
                &page,
                "pcieipc_events_total",
                &[r#"source="module""#, r#"kind="aer""#]
            ),
            Some(1.0)
        );

        // Without tracefs, the module's first step counts, at the reporting port.
        let mut without_tracefs = EventCounts::default();
        without_tracefs.record(&module, false);
        let mut resume = module.clone();
        resume.aer_step = Some("resume");
        without_tracefs.record(&resume, false);
        let page = scraper.page(&without_tracefs).unwrap();
        assert_eq!(
            sample(
                &page,
                "pcieipc_aer_errors_total",
                &[&at_port, r#"severity="nonfatal""#, r#"error="CmpltTO""#]
            ),
            Some(1.0)
        );
    }

    fn nvml_fixture(root: &Path) -> crate::probe::NvmlFixture {
        crate::probe::NvmlFixture::new(&root.join("nvml.json"))
    }

    /// NVML that gives these answers.
    struct Answered(NvmlAnswers);

    impl NvlinkSource for Answered {
        fn answers(&self) -> Result<NvmlAnswers, crate::probe::NvmlError> {
            Ok(self.0.clone())
        }
    }

    /// A copy of the dgx8 fixture that a test may change; removed on drop.
    struct CopiedTree(std::path::PathBuf);

    impl CopiedTree {
        fn of_dgx8(name: &str) -> CopiedTree {
            let path = std::env::temp_dir().join(format!("pcieipc-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            let copied = std::process::Command::new("cp")
                .arg("-a")
                .arg(dgx8())
                .arg(&path)
                .status()
                .expect("run cp");
            assert!(copied.success());
            CopiedTree(path)
        }

        /// The directory of device `bdf`.
        fn device(&self, bdf: &str) -> std::path::PathBuf {
            std::fs::canonicalize(self.0.join("sys/bus/pci/devices").join(bdf)).unwrap()
        }
    }

    impl Drop for CopiedTree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn each_scrape_sees_links_and_counters_change_and_devices_come_and_go() {
        use std::os::unix::fs::FileExt;

        let tree = CopiedTree::of_dgx8("scrape-live");
        let mut scraper = Scraper::new(
            &tree.0,
            Path::new("/nonexistent"),
            Duration::from_secs(60),
            HealthModel::default(),
            None,
        );
        let uplink = r#"bdf="0000:08:00.0""#;
        let gpu6 = r#"bdf="0000:8a:00.0""#;
        let gpu7 = r#"bdf="0000:8b:00.0""#;
        let bad_tlp = |page: &str| {
            sample(
                page,
                "pcieipc_aer_errors_total",
                &[gpu6, r#"error="BadTLP""#],
            )
        };
        let page = scraper.page(&EventCounts::default()).unwrap();
        assert_eq!(sample(&page, "pcieipc_link_width", &[uplink]), Some(8.0));
        assert_eq!(bad_tlp(&page), Some(GPU6_BAD_TLP));

        // The uplink retrains to x16, written in place into its config
        // space's LnkSta as the hardware changes it; GPU6 counts 5 more
        // Bad TLPs, its counter file replaced as a fixture's may be.
        let config_path = tree.device("0000:08:00.0").join("config");
        let config = std::fs::read(&config_path).unwrap();
        let capability = crate::probe::config_space::ConfigSpace::new(&config)
            .pci_express()
            .unwrap();
        let status_at = capability.offset + 0x12;
        let status = u16::from_le_bytes([config[status_at], config[status_at + 1]]);
        let x16 = (status & !0x3f0) | (16 << 4);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&config_path)
            .unwrap()
            .write_all_at(&x16.to_le_bytes(), status_at as u64)
            .unwrap();
        let counters = tree.device("0000:8a:00.0").join("aer_dev_correctable");
        let text = std::fs::read_to_string(&counters).unwrap();
        let rose = text.replace("BadTLP 9000", "BadTLP 9005");
        assert_ne!(rose, text);
        std::fs::write(counters.with_extension("new"), rose).unwrap();
        std::fs::rename(counters.with_extension("new"), &counters).unwrap();
        let page = scraper.page(&EventCounts::default()).unwrap();
        assert_eq!(sample(&page, "pcieipc_link_width", &[uplink]), Some(16.0));
        assert_eq!(sample(&page, "pcieipc_link_degraded", &[uplink]), Some(0.0));
        assert_eq!(bad_tlp(&page), Some(GPU6_BAD_TLP + 5.0));

        // GPU7 removed: gone from the page; found again: back.
        let listed = tree.0.join("sys/bus/pci/devices/0000:8b:00.0");
        let target = std::fs::read_link(&listed).unwrap();
        std::fs::remove_file(&listed).unwrap();
        let page = scraper.page(&EventCounts::default()).unwrap();
        assert_eq!(sample(&page, "pcieipc_link_width", &[gpu7]), None);
        std::os::unix::fs::symlink(&target, &listed).unwrap();
        let page = scraper.page(&EventCounts::default()).unwrap();
        assert_eq!(sample(&page, "pcieipc_link_width", &[gpu7]), Some(16.0));

        // GPU6 removed and found again between two scrapes, as a new
        // directory with a new counter file: read anew, not from the old one.
        let gpu6_dir = tree.device("0000:8a:00.0");
        let moved = gpu6_dir.with_extension("old");
        std::fs::rename(&gpu6_dir, &moved).unwrap();
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(&moved)
            .arg(&gpu6_dir)
            .status()
            .unwrap();
        assert!(copied.success());
        std::fs::remove_dir_all(&moved).unwrap();
        let counters = gpu6_dir.join("aer_dev_correctable");
        let text = std::fs::read_to_string(&counters).unwrap();
        std::fs::write(&counters, text.replace("BadTLP 9005", "BadTLP 9100")).unwrap();
        let page = scraper.page(&EventCounts::default()).unwrap();
        assert_eq!(bad_tlp(&page), Some(GPU6_BAD_TLP + 100.0));
    }
}
