//! `PCIEIPC_IOC_LIST`: the devices the module has bound.

use std::os::fd::AsRawFd;

use pcieipc_uapi as uapi;

use crate::probe::{bdf::Bdf, link::LinkSpeed};

use super::node::{Device, DeviceError};

/// `pcieipc_device_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceState {
    Bound,
    Frozen,
    Gone,
}

/// `pcieipc_device_kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Generic,
    Ivshmem,
    Edu,
}

/// `pcieipc_irq_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IrqType {
    None,
    Intx,
    Msi,
    Msix,
}

/// One BAR of a bound device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BarInfo {
    pub index: u32,
    pub size: u64,
    pub mmap_offset: u64,
    pub memory: bool,
    pub io: bool,
    pub bits64: bool,
    pub prefetchable: bool,
    /// Whether `Device::map_bar` can map it (a memory BAR of at least a page).
    pub mappable: bool,
}

/// A device the module has bound (or had: `state` gone).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BoundDevice {
    /// The handle every other call takes.
    pub index: u32,
    pub state: DeviceState,
    /// "DDDD:BB:DD.F"
    pub bdf: String,
    pub upstream_bdf: Option<String>,
    pub vendor: u16,
    pub device: u16,
    pub class_code: u32,
    pub kind: DeviceKind,
    pub irq_type: IrqType,
    pub num_vectors: u32,
    /// GT/s of the link above the device, when known.
    pub link_speed_gts: Option<f64>,
    pub link_width: Option<u16>,
    /// ivshmem-doorbell: the peer id that `ring` addresses this device by.
    pub peer_id: Option<u32>,
    /// The non-empty BARs.
    pub bars: Vec<BarInfo>,
}

impl From<&uapi::pcieipc_device_info> for BoundDevice {
    fn from(raw: &uapi::pcieipc_device_info) -> Self {
        let bars = raw
            .bars
            .iter()
            .enumerate()
            .filter(|(_, bar)| bar.size != 0)
            .map(|(index, bar)| BarInfo {
                index: index as u32,
                size: bar.size,
                mmap_offset: bar.mmap_offset,
                memory: bar.flags & uapi::PCIEIPC_BAR_MEM != 0,
                io: bar.flags & uapi::PCIEIPC_BAR_IO != 0,
                bits64: bar.flags & uapi::PCIEIPC_BAR_64BIT != 0,
                prefetchable: bar.flags & uapi::PCIEIPC_BAR_PREFETCH != 0,
                mappable: bar.flags & uapi::PCIEIPC_BAR_MMAP != 0,
            })
            .collect();
        BoundDevice {
            index: raw.index,
            state: match raw.state {
                uapi::PCIEIPC_STATE_BOUND => DeviceState::Bound,
                uapi::PCIEIPC_STATE_FROZEN => DeviceState::Frozen,
                _ => DeviceState::Gone,
            },
            bdf: Bdf::from_abi(raw.bdf).to_string(),
            upstream_bdf: (raw.upstream_bdf != uapi::PCIEIPC_BDF_NONE)
                .then(|| Bdf::from_abi(raw.upstream_bdf).to_string()),
            vendor: raw.vendor,
            device: raw.device,
            class_code: raw.class_code,
            kind: match raw.kind {
                uapi::PCIEIPC_KIND_IVSHMEM => DeviceKind::Ivshmem,
                uapi::PCIEIPC_KIND_EDU => DeviceKind::Edu,
                _ => DeviceKind::Generic,
            },
            irq_type: match raw.irq_type {
                uapi::PCIEIPC_IRQ_INTX => IrqType::Intx,
                uapi::PCIEIPC_IRQ_MSI => IrqType::Msi,
                uapi::PCIEIPC_IRQ_MSIX => IrqType::Msix,
                _ => IrqType::None,
            },
            num_vectors: raw.num_vectors,
            link_speed_gts: u8::try_from(raw.link_speed)
                .ok()
                .and_then(LinkSpeed::from_encoding)
                .map(LinkSpeed::gigatransfers_per_second),
            link_width: (raw.link_width != 0).then_some(raw.link_width),
            peer_id: (raw.peer_id != uapi::PCIEIPC_NO_PEER_ID).then_some(raw.peer_id),
            bars,
        }
    }
}

impl Device {
    /// `PCIEIPC_IOC_LIST`: every device the module knows, in index order.
    pub fn list(&self) -> Result<Vec<BoundDevice>, DeviceError> {
        let mut entries: Vec<uapi::pcieipc_device_info> = Vec::new();
        loop {
            let mut arg = uapi::pcieipc_list {
                argsz: size_of::<uapi::pcieipc_list>() as u32,
                entry_size: size_of::<uapi::pcieipc_device_info>() as u32,
                capacity: entries.len() as u32,
                entries: entries.as_mut_ptr() as u64,
                ..Default::default()
            };
            // SAFETY: `arg` is a live `pcieipc_list` whose `entries` points at
            // `capacity` writable `pcieipc_device_info`s of `entry_size` bytes.
            unsafe { uapi::ioctl::list(self.file.as_raw_fd(), &mut arg) }
                .map_err(|errno| self.ioctl_error("PCIEIPC_IOC_LIST", errno))?;
            if arg.count as usize <= entries.len() {
                entries.truncate(arg.count as usize);
                return Ok(entries.iter().map(BoundDevice::from).collect());
            }
            // Devices were added since the last call: make room and ask again.
            entries.resize(arg.count as usize, Default::default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_formats_like_sysfs() {
        assert_eq!(Bdf::from_abi(0x0001_0312).to_string(), "0001:03:02.2");
        assert_eq!(Bdf::from_abi(0x0000_0008).to_string(), "0000:00:01.0");
    }

    #[test]
    fn device_info_converts_every_field() {
        let mut raw = uapi::pcieipc_device_info {
            index: 4,
            state: uapi::PCIEIPC_STATE_GONE,
            bdf: 0x0000_0300,
            upstream_bdf: uapi::PCIEIPC_BDF_NONE,
            vendor: 0x1af4,
            device: 0x1110,
            class_code: 0x050000,
            kind: uapi::PCIEIPC_KIND_IVSHMEM,
            irq_type: uapi::PCIEIPC_IRQ_MSIX,
            num_vectors: 2,
            link_speed: 4,
            link_width: 16,
            peer_id: 7,
            ..Default::default()
        };
        raw.bars[2] = uapi::pcieipc_bar_info {
            size: 1 << 20,
            mmap_offset: uapi::mmap_offset(4, 2),
            flags: uapi::PCIEIPC_BAR_MEM | uapi::PCIEIPC_BAR_MMAP | uapi::PCIEIPC_BAR_64BIT,
            reserved: 0,
        };
        let device = BoundDevice::from(&raw);
        assert_eq!(device.state, DeviceState::Gone);
        assert_eq!(device.bdf, "0000:03:00.0");
        assert_eq!(device.upstream_bdf, None);
        assert_eq!(device.kind, DeviceKind::Ivshmem);
        assert_eq!(device.irq_type, IrqType::Msix);
        assert_eq!(device.link_speed_gts, Some(16.0));
        assert_eq!(device.link_width, Some(16));
        assert_eq!(device.peer_id, Some(7));
        assert_eq!(
            device.bars,
            vec![BarInfo {
                index: 2,
                size: 1 << 20,
                mmap_offset: (4 << 44) | (2 << 40),
                memory: true,
                io: false,
                bits64: true,
                prefetchable: false,
                mappable: true,
            }]
        );
    }
}
