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
