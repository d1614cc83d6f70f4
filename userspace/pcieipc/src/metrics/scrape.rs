//! What a page shows, read when Prometheus asks for it: the topology, links
//! and AER counters under a sysfs root (`--sysfs-root`: a fixture in tests),
//! whether the module is loaded, NVML's NVLink answers; the windowed health
//! is `probe --watch`'s, over the samples the scrapes took.
//!
//! The tree is probed in full once, and again only when the devices listed
//! change or one stops answering; every other scrape re-reads what changes
//! of each device (`sysfs::LiveAttributes`: link status and target speed,
//! driver, AER counters), which is what keeps an idle monitor's cost small
//! next to node_exporter's. What else a full probe reads (BARs, ACS, the AER
//! registers) the page does not show.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{render, EventCounts, ModuleState, Scrape};
use crate::device::Device;
use crate::probe::sysfs::{self, LiveAttributes, SysfsDevice};
use crate::probe::watch::{Sample, Watch};
use crate::probe::{HealthModel, NvlinkSource, ProbeError, Topology};

pub struct Scraper {
    sysfs_root: PathBuf,
    /// The devices as the last full probe listed and read them, and what
    /// re-reads them.
    probed: Option<Probed>,
    device_path: PathBuf,
    model: HealthModel,
    watch: Watch,
    started: Instant,
    nvml: Option<Box<dyn NvlinkSource + Send>>,
}

impl Scraper {
    /// `nvml`: where NVLink answers come from; `None` where none are asked
    /// (a copied sysfs tree, a machine without NVIDIA's driver).
    pub fn new(
        sysfs_root: &Path,
        device_path: &Path,
        window: Duration,
        model: HealthModel,
        nvml: Option<Box<dyn NvlinkSource + Send>>,
    ) -> Scraper {
        Scraper {
            sysfs_root: sysfs_root.to_path_buf(),
            probed: None,
            device_path: device_path.to_path_buf(),
            model,
            watch: Watch::new(window, model),
            started: Instant::now(),
            nvml,
        }
    }

    /// Reads everything anew and renders the page.
    pub fn page(&mut self, events: &EventCounts) -> Result<String, ProbeError> {
        let devices = self.devices()?;
        let topology = Topology::from_devices(&self.sysfs_root, devices, self.model);
        let step = self
            .watch
            .push(Sample::of_topology(&topology, self.started.elapsed()));
        let loaded = self.sysfs_root.join("sys/module/pcieipc").exists();
        let module = ModuleState {
            loaded,
            version: loaded
                .then(|| Device::open(&self.device_path).and_then(|device| device.version()))
                .and_then(Result::ok),
        };
        // NVML that does not answer this time leaves NVLink off this page only.
        let nvml = self.nvml.as_ref().and_then(|source| source.answers().ok());
        Ok(render(&Scrape {
            topology: &topology,
            window: &step.health,
            events,
            module: &module,
            nvml: nvml.as_ref(),
        }))
    }

    /// The devices as they are now: re-read where the listing is the one
    /// last probed and every device still answers, else probed anew.
    fn devices(&mut self) -> Result<Vec<SysfsDevice>, ProbeError> {
        let listed = sysfs::list_devices(&self.sysfs_root)?;
        if let Some(probed) = &mut self.probed {
            if probed.listed == listed && probed.live.refresh(&mut probed.records).is_ok() {
                return Ok(probed.records.clone());
            }
        }
        self.probed = None;
        let records = sysfs::read_devices(&self.sysfs_root)?;
        let live = LiveAttributes::open(&records)?;
        self.probed = Some(Probed {
            listed,
            records: records.clone(),
            live,
        });
        Ok(records)
    }
}

struct Probed {
    listed: Vec<String>,
    records: Vec<SysfsDevice>,
    live: LiveAttributes,
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::events::{aer_error_at, Severity};
    use crate::events::{Event, EventKind, EventSource};
    use crate::probe::nvlink::{Answer, NvmlReturn};
    use crate::probe::NvmlAnswers;
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
