//! The probe's I/O layer: reads a sysfs tree under a root directory (`/` on a
//! live system, a fixture in tests) into raw per-device records. A missing or
//! unreadable attribute is `None`; an attribute whose text does not parse is
//! an error carrying its path.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{open, openat, readlinkat, OFlag};
use nix::sys::stat::Mode;

use super::attributes::{self, AerCounterFile, Bar, ParseError};
use super::bdf::Bdf;
use super::config_space::{ConfigSpace, PciePortType, PCIE_LINK_REGISTERS};
use super::error::ProbeError;
use super::link::LinkSpeed;

/// Where a device sits: its host bridge and the device above it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Name of the host bridge directory, e.g. `pci0000:00`.
    pub host_bridge: String,
    /// The bridge above this device; `None` when it sits on the host bridge's bus.
    pub parent: Option<Bdf>,
}

/// Link attributes as this device's sysfs directory reports them; left
/// unread (`None`) when config space shows the link registers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkAttributes {
    pub current_speed: Option<LinkSpeed>,
    pub current_width: Option<u8>,
    pub max_speed: Option<LinkSpeed>,
    pub max_width: Option<u8>,
}

/// The AER counter files of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AerCounters {
    pub correctable: Option<AerCounterFile>,
    pub nonfatal: Option<AerCounterFile>,
    pub fatal: Option<AerCounterFile>,
    /// Root ports only: errors reported to this root port by the hierarchy below it.
    pub rootport_total_correctable: Option<u64>,
    pub rootport_total_nonfatal: Option<u64>,
    pub rootport_total_fatal: Option<u64>,
}

/// Everything read for one device, before the tree is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsDevice {
    pub bdf: Bdf,
    /// The device's directory under `<root>/sys/devices`.
    pub path: PathBuf,
    pub placement: Placement,
    pub class_code: Option<u32>,
    pub vendor_id: Option<u16>,
    pub device_id: Option<u16>,
    pub numa_node: Option<u32>,
    pub local_cpulist: Option<String>,
    pub driver: Option<String>,
    pub iommu_group: Option<u32>,
    pub link: LinkAttributes,
    pub aer: AerCounters,
    pub bars: Option<Vec<Bar>>,
    /// Bytes of `config`: 64 unprivileged, 256 or 4096 as root.
    pub config: Option<Vec<u8>>,
}

/// Reads every device listed in `<root>/sys/bus/pci/devices`, in bus-id order.
/// Devices are read on several threads: the probe is bound by file-system
/// calls, about twenty per device.
pub fn read_devices(root: &Path) -> Result<Vec<SysfsDevice>, ProbeError> {
    let list_dir = root.join("sys/bus/pci/devices");
    let listing_error = |source| ProbeError::ListDevices {
        path: list_dir.clone(),
        source,
    };
    let entries = fs::read_dir(&list_dir)
        .map_err(listing_error)?
        .map(|entry| entry.map(|entry| (entry.path(), entry.file_name())))
        .collect::<Result<Vec<_>, _>>()
        .map_err(listing_error)?;
    let threads = std::thread::available_parallelism()
        .map_or(1, |count| count.get())
        .min(16);
    let per_thread = entries.len().div_ceil(threads).max(1);
    let mut devices = std::thread::scope(|scope| {
        let workers: Vec<_> = entries
            .chunks(per_thread)
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|(link_path, name)| {
                            let bdf =
                                parse_at(link_path, &name.to_string_lossy(), str::parse::<Bdf>)?;
                            read_device(root, link_path, bdf)
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect::<Result<Vec<Vec<_>>, _>>()
    })?
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    devices.sort_by_key(|device| device.bdf);
    Ok(devices)
}

fn read_device(root: &Path, link_path: &Path, bdf: Bdf) -> Result<SysfsDevice, ProbeError> {
    let relative = resolve_device_link(link_path)?;
    let placement = placement_of(&relative).ok_or_else(|| ProbeError::DeviceLink {
        path: link_path.to_path_buf(),
        reason: format!(
            "{} has no pciDDDD:BB host bridge above it",
            relative.display()
        ),
    })?;
    let dir = DeviceDir::open(root.join(&relative)).map_err(|err| ProbeError::DeviceLink {
        path: link_path.to_path_buf(),
        reason: format!("{}: {err}", relative.display()),
    })?;
    let iommu_group = dir
        .link_name("iommu_group")
        .map(|group| {
            parse_at(&dir.path.join("iommu_group"), &group, |text| {
                text.parse::<u32>().map_err(|_| ParseError::Unexpected {
                    expected: "a link to kernel/iommu_groups/<number>",
                    found: text.to_string(),
                })
            })
        })
        .transpose()?;
    let config = dir.read_with("config", <[u8]>::to_vec);
    let pci_express = config
        .as_deref()
        .and_then(|bytes| ConfigSpace::new(bytes).pci_express());
    // The sysfs link attributes are computed from the link registers; when
    // config space shows them (read as root) they are not read again, which
    // saves a quarter of a probe's system calls. Unprivileged readers get
    // the 64-byte header only and use the attributes.
    let link = if pci_express.is_some_and(|capability| capability.link.is_some()) {
        LinkAttributes::default()
    } else {
        dir.link_attributes()?
    };
    // The kernel creates the aer_rootport_* files on root ports only.
    let may_be_root_port =
        pci_express.is_none_or(|capability| capability.port_type == PciePortType::RootPort);
    Ok(SysfsDevice {
        bdf,
        placement,
        class_code: dir.parse("class", attributes::parse_class)?,
        vendor_id: dir.parse("vendor", attributes::parse_id)?,
        device_id: dir.parse("device", attributes::parse_id)?,
        numa_node: dir
            .parse("numa_node", attributes::parse_numa_node)?
            .flatten(),
        local_cpulist: dir.parse("local_cpulist", attributes::parse_cpu_list)?,
        driver: dir.link_name("driver"),
        iommu_group,
        link,
        aer: dir.aer_counters(may_be_root_port)?,
        bars: dir.parse("resource", attributes::parse_resource)?,
        config,
        path: dir.path,
    })
}

/// A device directory, opened once so that each attribute is found by name
/// in it (openat) rather than by walking its deep path again, with one read
/// buffer for all its attributes: system calls and page-sized allocations
/// are most of a probe's time.
struct DeviceDir {
    path: PathBuf,
    fd: OwnedFd,
    buffer: RefCell<Vec<u8>>,
}

impl DeviceDir {
    fn open(path: PathBuf) -> nix::Result<DeviceDir> {
        let fd = open(
            &path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        // Larger than a page, the most a sysfs attribute holds.
        let buffer = RefCell::new(vec![0u8; 8192]);
        Ok(DeviceDir { path, fd, buffer })
    }

    /// Calls `use_bytes` with an attribute's bytes; `None` when the file is
    /// missing or unreadable. Sysfs attributes and regular files give all
    /// they have in one read when the buffer is larger, so a short read ends
    /// the file without a second read.
    fn read_with<T>(&self, name: &str, use_bytes: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let mut file = fs::File::from(fd);
        let mut buffer = self.buffer.borrow_mut();
        let mut filled = 0;
        loop {
            let count = file.read(&mut buffer[filled..]).ok()?;
            filled += count;
            if count == 0 || filled < buffer.len() {
                return Some(use_bytes(&buffer[..filled]));
            }
            let grown = buffer.len() * 2;
            buffer.resize(grown, 0);
        }
    }

    /// Reads and parses an attribute: `None` when it is missing or
    /// unreadable, an error with its path when its text does not parse.
    fn parse<T>(
        &self,
        name: &str,
        parser: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<Option<T>, ProbeError> {
        self.read_with(name, |bytes| {
            parse_at(
                &self.path.join(name),
                &String::from_utf8_lossy(bytes),
                parser,
            )
        })
        .transpose()
    }

    /// The link attributes, for a reader who cannot see the link registers.
    fn link_attributes(&self) -> Result<LinkAttributes, ProbeError> {
        Ok(LinkAttributes {
            current_speed: self
                .parse("current_link_speed", attributes::parse_link_speed)?
                .flatten(),
            current_width: self.parse("current_link_width", attributes::parse_link_width)?,
            max_speed: self
                .parse("max_link_speed", attributes::parse_link_speed)?
                .flatten(),
            max_width: self.parse("max_link_width", attributes::parse_link_width)?,
        })
    }

    fn aer_counters(&self, may_be_root_port: bool) -> Result<AerCounters, ProbeError> {
        let parse_if_root_port = |name: &str| -> Result<Option<u64>, ProbeError> {
            if may_be_root_port {
                self.parse(name, attributes::parse_count)
            } else {
                Ok(None)
            }
        };
        Ok(AerCounters {
            correctable: self.parse("aer_dev_correctable", attributes::parse_aer_counters)?,
            nonfatal: self.parse("aer_dev_nonfatal", attributes::parse_aer_counters)?,
            fatal: self.parse("aer_dev_fatal", attributes::parse_aer_counters)?,
            rootport_total_correctable: parse_if_root_port("aer_rootport_total_err_cor")?,
            rootport_total_nonfatal: parse_if_root_port("aer_rootport_total_err_nonfatal")?,
            rootport_total_fatal: parse_if_root_port("aer_rootport_total_err_fatal")?,
        })
    }

    /// The last component of a symlink's target (`driver`, `iommu_group`).
    fn link_name(&self, name: &str) -> Option<String> {
        let target = PathBuf::from(readlinkat(&self.fd, name).ok()?);
        Some(target.file_name()?.to_string_lossy().into_owned())
    }
}

/// The names listed in `<root>/sys/bus/pci/devices`, sorted: what
/// `read_devices` would read now.
pub fn list_devices(root: &Path) -> Result<Vec<String>, ProbeError> {
    let list_dir = root.join("sys/bus/pci/devices");
    let listing_error = |source| ProbeError::ListDevices {
        path: list_dir.clone(),
        source,
    };
    let mut names = fs::read_dir(&list_dir)
        .map_err(listing_error)?
        .map(|entry| entry.map(|entry| entry.file_name().to_string_lossy().into_owned()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(listing_error)?;
    names.sort();
    Ok(names)
}

/// What changes while a device runs (its link's status and target speed,
/// its driver, its AER counters), re-read through its directory and config
/// file kept open since `read_devices`: a few system calls per device where
/// a full read takes about twenty, and 40 bytes of config space where a full
/// read takes all 4096 (each dword a config cycle on real hardware).
/// `pcieipc monitor --metrics` re-reads these at each scrape, as
/// node_exporter re-reads its attributes.
pub struct LiveAttributes {
    devices: Vec<LiveDevice>,
}

struct LiveDevice {
    dir: DeviceDir,
    /// The config file and where in it the link registers lie, when the
    /// full read found them there (read as root); else the link attributes
    /// are re-read.
    link_registers: Option<(fs::File, Range<usize>)>,
    may_be_root_port: bool,
}

impl LiveAttributes {
    /// Opens what the re-reads of `records` (from `read_devices`) need.
    pub fn open(records: &[SysfsDevice]) -> Result<LiveAttributes, ProbeError> {
        let devices = records
            .iter()
            .map(|record| {
                let dir =
                    DeviceDir::open(record.path.clone()).map_err(|err| ProbeError::Vanished {
                        path: record.path.clone(),
                        source: err.into(),
                    })?;
                let pci_express = record
                    .config
                    .as_deref()
                    .and_then(|bytes| ConfigSpace::new(bytes).pci_express());
                let link_registers = match (pci_express, &record.config) {
                    (Some(capability), Some(bytes)) if capability.link.is_some() => {
                        let path = record.path.join("config");
                        let config = fs::File::open(&path)
                            .map_err(|source| ProbeError::Vanished { path, source })?;
                        // LnkCtl2 may lie past what was read (a version 1
                        // capability at the end of a 256-byte space).
                        let start = capability.offset + PCIE_LINK_REGISTERS.start;
                        let end = (capability.offset + PCIE_LINK_REGISTERS.end).min(bytes.len());
                        Some((config, start..end))
                    }
                    _ => None,
                };
                Ok(LiveDevice {
                    dir,
                    link_registers,
                    may_be_root_port: pci_express
                        .is_none_or(|capability| capability.port_type == PciePortType::RootPort),
                })
            })
            .collect::<Result<_, ProbeError>>()?;
        Ok(LiveAttributes { devices })
    }

    /// Re-reads into `records`, the ones `open` took, in the same order. A
    /// device whose config file no longer reads, or whose attributes are
    /// gone, was removed (maybe found again, as a new directory): the error
    /// says so, and the caller reads the devices anew.
    pub fn refresh(&self, records: &mut [SysfsDevice]) -> Result<(), ProbeError> {
        for (live, record) in self.devices.iter().zip(records.iter_mut()) {
            let vanished = |source: io::Error| ProbeError::Vanished {
                path: record.path.clone(),
                source,
            };
            match (&live.link_registers, record.config.as_mut()) {
                (Some((config, range)), Some(bytes)) => {
                    config
                        .read_exact_at(&mut bytes[range.clone()], range.start as u64)
                        .map_err(vanished)?;
                }
                _ => {
                    let link = live.dir.link_attributes()?;
                    if record.link.current_speed.is_some() && link.current_speed.is_none() {
                        return Err(vanished(io::ErrorKind::NotFound.into()));
                    }
                    record.link = link;
                }
            }
            let aer = live.dir.aer_counters(live.may_be_root_port)?;
            if record.aer.correctable.is_some() && aer.correctable.is_none() {
                return Err(vanished(io::ErrorKind::NotFound.into()));
            }
            record.aer = aer;
            record.driver = live.dir.link_name("driver");
        }
        Ok(())
    }
}

fn parse_at<T>(
    path: &Path,
    text: &str,
    parser: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<T, ProbeError> {
    parser(text).map_err(|source| ProbeError::Malformed {
        path: path.to_path_buf(),
        source,
    })
}

/// Resolves `sys/bus/pci/devices/<bdf>` lexically to its target relative to
/// the root (`sys/devices/pci0000:00/...`), so a fixture's links stay inside
/// the fixture and one readlink per device suffices.
fn resolve_device_link(link_path: &Path) -> Result<PathBuf, ProbeError> {
    let bad = |reason: String| ProbeError::DeviceLink {
        path: link_path.to_path_buf(),
        reason,
    };
    let target = fs::read_link(link_path).map_err(|err| bad(format!("readlink: {err}")))?;
    let mut resolved: Vec<&OsStr> = if target.is_absolute() {
        Vec::new()
    } else {
        ["sys", "bus", "pci", "devices"].map(OsStr::new).to_vec()
    };
    for component in target.components() {
        match component {
            Component::Normal(name) => resolved.push(name),
            Component::ParentDir => {
                resolved
                    .pop()
                    .ok_or_else(|| bad(format!("{} leaves the root", target.display())))?;
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let resolved: PathBuf = resolved.iter().collect();
    if !resolved.starts_with("sys/devices") {
        return Err(bad(format!(
            "{} is not under sys/devices",
            target.display()
        )));
    }
    Ok(resolved)
}

/// The host bridge (the last `pciDDDD:BB` component) and the parent bridge
/// (the last PCI address before the device's own) of a device path.
fn placement_of(relative: &Path) -> Option<Placement> {
    let names: Vec<String> = relative
        .components()
        .map(|component| component.as_os_str().to_string_lossy().into_owned())
        .collect();
    let bridge_at = names.iter().rposition(|name| is_host_bridge_name(name))?;
    let parent = names[bridge_at + 1..names.len().checked_sub(1)?]
        .iter()
        .rev()
        .find_map(|name| name.parse::<Bdf>().ok());
    Some(Placement {
        host_bridge: names[bridge_at].clone(),
        parent,
    })
}

/// `pci0000:00`, `pci10000:00`.
pub fn is_host_bridge_name(name: &str) -> bool {
    parse_host_bridge_name(name).is_some()
}

/// Domain and root bus number of a host bridge directory name.
pub fn parse_host_bridge_name(name: &str) -> Option<(u32, u8)> {
    let (domain, bus) = name.strip_prefix("pci")?.split_once(':')?;
    if domain.len() < 4 || bus.len() != 2 {
        return None;
    }
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u8::from_str_radix(bus, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_from_device_paths() {
        let path = Path::new("sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0");
        assert_eq!(
            placement_of(path),
            Some(Placement {
                host_bridge: "pci0000:80".to_string(),
                parent: Some("0000:81:00.0".parse().unwrap()),
            })
        );
        let on_root_bus = Path::new("sys/devices/pci0000:00/0000:00:03.0");
        assert_eq!(placement_of(on_root_bus).unwrap().parent, None);
        let platform = Path::new("sys/devices/platform/soc/40000000.pcie/pci0001:00/0001:00:00.0");
        assert_eq!(placement_of(platform).unwrap().host_bridge, "pci0001:00");
        // A VMD domain nested below an endpoint: the nearest host bridge counts.
        let vmd = Path::new("sys/devices/pci0000:00/0000:00:0e.0/pci10000:00/10000:00:02.0");
        let vmd = placement_of(vmd).unwrap();
        assert_eq!(
            (vmd.host_bridge.as_str(), vmd.parent),
            ("pci10000:00", None)
        );
        assert_eq!(
            placement_of(Path::new("sys/devices/virtual/0000:00:01.0")),
            None
        );
    }

    #[test]
    fn host_bridge_names() {
        assert_eq!(parse_host_bridge_name("pci0000:80"), Some((0, 0x80)));
        assert_eq!(parse_host_bridge_name("pci10000:00"), Some((0x10000, 0)));
        assert_eq!(parse_host_bridge_name("pci_bus"), None);
        assert_eq!(parse_host_bridge_name("0000:00:01.0"), None);
    }
}
