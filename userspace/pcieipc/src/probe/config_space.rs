//! Decoders for PCI configuration space: the capability lists, the PCI
//! Express capability's link registers, and the AER, ACS and Resizable BAR
//! extended capabilities. No I/O: they take the bytes of a `config` file (or
//! of a read through the kernel module) and return typed registers. Offsets
//! and fields are those of the PCI Express Base Specification (and
//! include/uapi/linux/pci_regs.h).

use serde::Serialize;

use super::link::LinkSpeed;

/// What an unprivileged read of sysfs `config` returns: the standard header.
pub const STANDARD_HEADER_LEN: usize = 64;
/// Where the PCI Express extended capabilities start.
pub const EXTENDED_CAPABILITIES_START: usize = 0x100;
/// Size of PCI Express configuration space.
pub const EXTENDED_CONFIG_LEN: usize = 4096;

const STATUS: usize = 0x06;
const STATUS_CAPABILITY_LIST: u16 = 0x0010;
const CAPABILITY_POINTER: usize = 0x34;

/// Capability id of the PCI Express capability.
pub const CAP_ID_PCI_EXPRESS: u8 = 0x10;
/// Extended capability ids.
pub const EXT_CAP_ID_AER: u16 = 0x0001;
pub const EXT_CAP_ID_ACS: u16 = 0x000d;
pub const EXT_CAP_ID_RESIZABLE_BAR: u16 = 0x0015;

// Registers of the PCI Express capability, relative to its offset.
const PCIE_CAPABILITIES: usize = 0x02;
const PCIE_LINK_CAPABILITIES: usize = 0x0c;
const PCIE_LINK_STATUS: usize = 0x12;
const PCIE_LINK_CONTROL_2: usize = 0x30;
/// LnkCap to LnkCtl2: what changes of a link, and what it can do.
pub const PCIE_LINK_REGISTERS: std::ops::Range<usize> =
    PCIE_LINK_CAPABILITIES..PCIE_LINK_CONTROL_2 + 2;

/// Bytes of one `config` file, possibly cut short (64 bytes unprivileged,
/// 256 for conventional PCI devices).
#[derive(Debug, Clone, Copy)]
pub struct ConfigSpace<'a> {
    bytes: &'a [u8],
}

impl<'a> ConfigSpace<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        ConfigSpace { bytes }
    }

    /// How many bytes were readable.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Whether the standard capability list lies within what was read.
    pub fn capabilities_readable(&self) -> bool {
        self.bytes.len() > STANDARD_HEADER_LEN
    }

    /// Whether the extended capabilities lie within what was read.
    pub fn extended_capabilities_readable(&self) -> bool {
        self.bytes.len() >= EXTENDED_CONFIG_LEN
    }

    pub fn read_u8(&self, offset: usize) -> Option<u8> {
        self.bytes.get(offset).copied()
    }

    pub fn read_u16(&self, offset: usize) -> Option<u16> {
        let bytes = self.bytes.get(offset..offset.checked_add(2)?)?;
        Some(u16::from_le_bytes([bytes[0], bytes[1]]))
    }

    pub fn read_u32(&self, offset: usize) -> Option<u32> {
        let bytes = self.bytes.get(offset..offset.checked_add(4)?)?;
        Some(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// Offset of the first standard capability with this id. `None` when the
    /// list is absent, unreadable or has no such entry.
    pub fn find_capability(&self, id: u8) -> Option<usize> {
        if !self.capabilities_readable() || self.read_u16(STATUS)? & STATUS_CAPABILITY_LIST == 0 {
            return None;
        }
        let mut offset = usize::from(self.read_u8(CAPABILITY_POINTER)? & 0xfc);
        // At most 48 capabilities fit in 192 bytes: the bound stops a looping list.
        for _ in 0..48 {
            if offset < STANDARD_HEADER_LEN {
                return None;
            }
            if self.read_u8(offset)? == id {
                return Some(offset);
            }
            offset = usize::from(self.read_u8(offset + 1)? & 0xfc);
        }
        None
    }

    /// Offset of the first extended capability with this id. `None` when
    /// extended space is not readable (unprivileged or conventional PCI).
    pub fn find_extended_capability(&self, id: u16) -> Option<usize> {
        if !self.extended_capabilities_readable() {
            return None;
        }
        let mut offset = EXTENDED_CAPABILITIES_START;
        // Each capability takes at least 4 bytes: the bound stops a looping list.
        for _ in 0..(EXTENDED_CONFIG_LEN - EXTENDED_CAPABILITIES_START) / 4 {
            let header = self.read_u32(offset)?;
            if header == 0 || header == u32::MAX {
                return None;
            }
            if header & 0xffff == u32::from(id) {
                return Some(offset);
            }
            offset = (header >> 20) as usize & 0xffc;
            if offset < EXTENDED_CAPABILITIES_START {
                return None;
            }
        }
        None
    }

    /// The PCI Express capability, when present and readable.
    pub fn pci_express(&self) -> Option<PciExpressCapability> {
        let offset = self.find_capability(CAP_ID_PCI_EXPRESS)?;
        let capabilities = self.read_u16(offset + PCIE_CAPABILITIES)?;
        let version = capabilities & 0xf;
        let port_type = PciePortType::from_encoding(((capabilities >> 4) & 0xf) as u8);
        // Root complex integrated devices have no link: their link registers
        // are reserved.
        let has_link = !matches!(
            port_type,
            PciePortType::RootComplexIntegratedEndpoint | PciePortType::RootComplexEventCollector
        );
        let link = if has_link {
            Some(LinkRegisters {
                link_capabilities: self.read_u32(offset + PCIE_LINK_CAPABILITIES)?,
                link_status: self.read_u16(offset + PCIE_LINK_STATUS)?,
                // LnkCtl2 exists from capability version 2 on.
                link_control_2: if version >= 2 {
                    self.read_u16(offset + PCIE_LINK_CONTROL_2)
                } else {
                    None
                },
            })
        } else {
            None
        };
        Some(PciExpressCapability {
            offset,
            port_type,
            link,
        })
    }

    /// The AER extended capability's status and mask registers.
    pub fn advanced_error_reporting(&self) -> Option<AerRegisters> {
        let offset = self.find_extended_capability(EXT_CAP_ID_AER)?;
        Some(AerRegisters {
            offset,
            uncorrectable_status: self.read_u32(offset + 0x04)?,
            uncorrectable_mask: self.read_u32(offset + 0x08)?,
            uncorrectable_severity: self.read_u32(offset + 0x0c)?,
            correctable_status: self.read_u32(offset + 0x10)?,
            correctable_mask: self.read_u32(offset + 0x14)?,
        })
    }

    /// The ACS extended capability's capability and control registers.
    pub fn access_control_services(&self) -> Option<AcsRegisters> {
        let offset = self.find_extended_capability(EXT_CAP_ID_ACS)?;
        Some(AcsRegisters {
            offset,
            capability: self.read_u16(offset + 0x04)?,
            control: self.read_u16(offset + 0x06)?,
        })
    }

    /// The Resizable BAR extended capability: one entry per resizable BAR.
    pub fn resizable_bars(&self) -> Option<ResizableBarCapability> {
        let offset = self.find_extended_capability(EXT_CAP_ID_RESIZABLE_BAR)?;
        let first_control = self.read_u32(offset + 0x08)?;
        let count = ((first_control >> 5) & 0x7) as usize;
        let entries = (0..count)
            .map(|entry| {
                let capability = self.read_u32(offset + 0x04 + 8 * entry)?;
                let control = self.read_u32(offset + 0x08 + 8 * entry)?;
                Some(ResizableBar {
                    bar_index: (control & 0x7) as u8,
                    // Bit n+4 of the capability register: 2^(n+20) bytes supported.
                    supported_sizes_bytes: (0..28)
                        .filter(|bit| capability & (1 << (bit + 4)) != 0)
                        .map(|bit| 1u64 << (bit + 20))
                        .collect(),
                    // Encoded as n for 2^(n+20) bytes; beyond 2^63 is malformed.
                    current_size_bytes: 1u64.checked_shl(((control >> 8) & 0x3f) + 20)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(ResizableBarCapability { offset, entries })
    }
}

/// Device/port type from the PCI Express Capabilities register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PciePortType {
    Endpoint,
    LegacyEndpoint,
    RootPort,
    SwitchUpstreamPort,
    SwitchDownstreamPort,
    PcieToPciBridge,
    PciToPcieBridge,
    RootComplexIntegratedEndpoint,
    RootComplexEventCollector,
    Reserved(u8),
}

impl PciePortType {
    pub fn from_encoding(code: u8) -> PciePortType {
        match code {
            0x0 => PciePortType::Endpoint,
            0x1 => PciePortType::LegacyEndpoint,
            0x4 => PciePortType::RootPort,
            0x5 => PciePortType::SwitchUpstreamPort,
            0x6 => PciePortType::SwitchDownstreamPort,
            0x7 => PciePortType::PcieToPciBridge,
            0x8 => PciePortType::PciToPcieBridge,
            0x9 => PciePortType::RootComplexIntegratedEndpoint,
            0xa => PciePortType::RootComplexEventCollector,
            other => PciePortType::Reserved(other),
        }
    }
}

/// The PCI Express capability: where it is, the port type, the link registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciExpressCapability {
    pub offset: usize,
    pub port_type: PciePortType,
    /// `None` for root complex integrated devices, which have no link.
    pub link: Option<LinkRegisters>,
}

/// Raw LnkCap, LnkSta and LnkCtl2 with their fields decoded on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkRegisters {
    pub link_capabilities: u32,
    pub link_status: u16,
    pub link_control_2: Option<u16>,
}

impl LinkRegisters {
    /// LnkCap Max Link Speed (bits 3:0).
    pub fn max_speed(&self) -> Option<LinkSpeed> {
        LinkSpeed::from_encoding((self.link_capabilities & 0xf) as u8)
    }

    /// LnkCap Maximum Link Width (bits 9:4).
    pub fn max_width(&self) -> u8 {
        ((self.link_capabilities >> 4) & 0x3f) as u8
    }

    /// LnkSta Current Link Speed (bits 3:0).
    pub fn current_speed(&self) -> Option<LinkSpeed> {
        LinkSpeed::from_encoding((self.link_status & 0xf) as u8)
    }

    /// LnkSta Negotiated Link Width (bits 9:4).
    pub fn current_width(&self) -> u8 {
        ((self.link_status >> 4) & 0x3f) as u8
    }

    /// LnkCtl2 Target Link Speed (bits 3:0).
    pub fn target_speed(&self) -> Option<LinkSpeed> {
        LinkSpeed::from_encoding((self.link_control_2? & 0xf) as u8)
    }
}

/// AER status, mask and severity registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AerRegisters {
    pub offset: usize,
    pub uncorrectable_status: u32,
    pub uncorrectable_mask: u32,
    pub uncorrectable_severity: u32,
    pub correctable_status: u32,
    pub correctable_mask: u32,
}

/// ACS Capability and Control register bits (the same bit in both).
pub mod acs {
    pub const SOURCE_VALIDATION: u16 = 1 << 0;
    pub const TRANSLATION_BLOCKING: u16 = 1 << 1;
    pub const P2P_REQUEST_REDIRECT: u16 = 1 << 2;
    pub const P2P_COMPLETION_REDIRECT: u16 = 1 << 3;
    pub const UPSTREAM_FORWARDING: u16 = 1 << 4;
    pub const P2P_EGRESS_CONTROL: u16 = 1 << 5;
    pub const DIRECT_TRANSLATED_P2P: u16 = 1 << 6;

    /// lspci's names, in bit order.
    pub const NAMES: [(u16, &str); 7] = [
        (SOURCE_VALIDATION, "SrcValid"),
        (TRANSLATION_BLOCKING, "TransBlk"),
        (P2P_REQUEST_REDIRECT, "ReqRedir"),
        (P2P_COMPLETION_REDIRECT, "CmpltRedir"),
        (UPSTREAM_FORWARDING, "UpstreamFwd"),
        (P2P_EGRESS_CONTROL, "EgressCtrl"),
        (DIRECT_TRANSLATED_P2P, "DirectTrans"),
    ];
}

/// The ACS capability and control registers of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcsRegisters {
    pub offset: usize,
    pub capability: u16,
    pub control: u16,
}

impl AcsRegisters {
    /// P2P Request or Completion Redirect enabled: peer-to-peer traffic
    /// entering this port goes up to the root complex instead of across.
    pub fn redirects_peer_to_peer(&self) -> bool {
        self.control & (acs::P2P_REQUEST_REDIRECT | acs::P2P_COMPLETION_REDIRECT) != 0
    }

    /// The control register the way `lspci -vvv` prints it ("SrcValid+ ...").
    pub fn describe_control(&self) -> String {
        acs::NAMES
            .iter()
            .map(|(bit, name)| format!("{name}{}", if self.control & bit != 0 { '+' } else { '-' }))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The Resizable BAR capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizableBarCapability {
    pub offset: usize,
    pub entries: Vec<ResizableBar>,
}

/// One resizable BAR: the sizes it supports and the size programmed now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResizableBar {
    pub bar_index: u8,
    pub supported_sizes_bytes: Vec<u64>,
    pub current_size_bytes: u64,
}

impl ResizableBar {
    pub fn max_supported_bytes(&self) -> Option<u64> {
        self.supported_sizes_bytes.iter().copied().max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4 KiB config space with a PCIe capability (v2) at 0x40 behind a power
    /// management capability at 0x60 in the list, and AER -> ACS -> ReBAR.
    fn sample() -> Vec<u8> {
        let mut bytes = vec![0u8; EXTENDED_CONFIG_LEN];
        let put16 =
            |b: &mut Vec<u8>, o: usize, v: u16| b[o..o + 2].copy_from_slice(&v.to_le_bytes());
        let put32 =
            |b: &mut Vec<u8>, o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_le_bytes());
        put16(&mut bytes, 0, 0x10de);
        put16(&mut bytes, STATUS, STATUS_CAPABILITY_LIST);
        bytes[CAPABILITY_POINTER] = 0x60;
        bytes[0x60] = 0x01; // power management
        bytes[0x61] = 0x40;
        bytes[0x40] = CAP_ID_PCI_EXPRESS;
        bytes[0x41] = 0x00;
        put16(&mut bytes, 0x42, 0x0002); // v2, endpoint
        put32(&mut bytes, 0x40 + 0x0c, 0x0040_0104); // 16 GT/s x16
        put16(&mut bytes, 0x40 + 0x12, 0x1083); // 8 GT/s x8
        put16(&mut bytes, 0x40 + 0x30, 0x0004); // target 16 GT/s
        put32(&mut bytes, 0x100, 0x1400_0000 | (2 << 16) | 0x0001); // AER -> 0x140
        put32(&mut bytes, 0x104, 0x0000_4000);
        put32(&mut bytes, 0x110, 0x0000_0041);
        put32(&mut bytes, 0x140, 0x1500_0000 | (1 << 16) | 0x000d); // ACS -> 0x150
        put16(&mut bytes, 0x144, 0x005f);
        put16(&mut bytes, 0x146, 0x001d);
        put32(&mut bytes, 0x150, (1 << 16) | 0x0015); // ReBAR, last
        put32(&mut bytes, 0x154, 0x000f_fff0); // 1 MiB .. 32 GiB
        put32(&mut bytes, 0x158, (1 << 5) | (8 << 8) | 1); // one BAR: BAR1, 256 MiB
        bytes
    }

    #[test]
    fn decodes_link_registers() {
        let bytes = sample();
        let pcie = ConfigSpace::new(&bytes).pci_express().unwrap();
        assert_eq!(pcie.offset, 0x40);
        assert_eq!(pcie.port_type, PciePortType::Endpoint);
        let link = pcie.link.unwrap();
        assert_eq!(link.max_speed(), Some(LinkSpeed::Gt16));
        assert_eq!(link.max_width(), 16);
        assert_eq!(link.current_speed(), Some(LinkSpeed::Gt8));
        assert_eq!(link.current_width(), 8);
        assert_eq!(link.target_speed(), Some(LinkSpeed::Gt16));
    }

    #[test]
    fn decodes_extended_capabilities() {
        let bytes = sample();
        let config = ConfigSpace::new(&bytes);
        let aer = config.advanced_error_reporting().unwrap();
        assert_eq!(aer.offset, 0x100);
        assert_eq!(aer.uncorrectable_status, 0x4000);
        assert_eq!(aer.correctable_status, 0x41);
        let acs = config.access_control_services().unwrap();
        assert_eq!(acs.offset, 0x140);
        assert_eq!(acs.control, 0x1d);
        assert!(acs.redirects_peer_to_peer());
        assert_eq!(
            acs.describe_control(),
            "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
        );
        let rebar = config.resizable_bars().unwrap();
        assert_eq!(rebar.offset, 0x150);
        assert_eq!(rebar.entries.len(), 1);
        assert_eq!(rebar.entries[0].bar_index, 1);
        assert_eq!(rebar.entries[0].current_size_bytes, 256 << 20);
        assert_eq!(rebar.entries[0].supported_sizes_bytes.len(), 16);
        assert_eq!(rebar.entries[0].max_supported_bytes(), Some(1 << 35));
    }

    #[test]
    fn out_of_range_rebar_size_is_unknown_not_a_panic() {
        let mut bytes = sample();
        bytes[0x159] = 0x3f; // BAR size 2^(63+20)
        assert!(ConfigSpace::new(&bytes).resizable_bars().is_none());
    }

    #[test]
    fn truncated_reads_leave_capabilities_unknown() {
        let bytes = sample();
        let header_only = ConfigSpace::new(&bytes[..STANDARD_HEADER_LEN]);
        assert_eq!(header_only.read_u16(0), Some(0x10de));
        assert!(header_only.pci_express().is_none());
        let legacy = ConfigSpace::new(&bytes[..256]);
        assert!(legacy.pci_express().is_some());
        assert!(legacy.access_control_services().is_none());
        assert!(legacy.advanced_error_reporting().is_none());
    }

    #[test]
    fn looping_capability_lists_end() {
        let mut bytes = sample();
        bytes[0x41] = 0x60; // PCIe -> PM -> PCIe -> ...
        assert!(ConfigSpace::new(&bytes).find_capability(0x05).is_none());
        bytes[0x152] = 0x00;
        bytes[0x153] = 0x10; // ReBAR points back to 0x100
        assert!(ConfigSpace::new(&bytes)
            .find_extended_capability(0x0b)
            .is_none());
    }
}
