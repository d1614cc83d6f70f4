//! PCI addresses (`domain:bus:device.function`) as sysfs names them.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use super::attributes::ParseError;

/// A PCI function address. The derived order is the PCI bus-id order that
/// NCCL and CUDA use to number devices by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    /// Segment; wider than 16 bits because VMD domains start at 0x10000.
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl FromStr for Bdf {
    type Err = ParseError;

    /// Parses `0000:65:00.0` (the name of an entry in /sys/bus/pci/devices),
    /// or `65:00.0` as lspci prints it, in domain 0.
    fn from_str(text: &str) -> Result<Self, ParseError> {
        let malformed = || ParseError::Unexpected {
            expected: "a PCI address like 0000:65:00.0",
            found: text.to_string(),
        };
        let (domain, rest) = match text.matches(':').count() {
            1 => ("0000", text),
            _ => text.split_once(':').ok_or_else(malformed)?,
        };
        let (bus, rest) = rest.split_once(':').ok_or_else(malformed)?;
        let (device, function) = rest.split_once('.').ok_or_else(malformed)?;
        if domain.len() < 4 || bus.len() != 2 || device.len() != 2 || function.len() != 1 {
            return Err(malformed());
        }
        let domain = u32::from_str_radix(domain, 16).map_err(|_| malformed())?;
        let bus = u8::from_str_radix(bus, 16).map_err(|_| malformed())?;
        let device = u8::from_str_radix(device, 16).map_err(|_| malformed())?;
        let function = u8::from_str_radix(function, 16).map_err(|_| malformed())?;
        if device > 0x1f || function > 7 {
            return Err(malformed());
        }
        Ok(Bdf {
            domain,
            bus,
            device,
            function,
        })
    }
}

/// A function that `PCIEIPC_BDF` cannot name: the module's ABI has 16 bits
/// for the domain, and a truncated one would name a function of domain 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{bdf}: PCI domain {:#x} does not fit the module's 16-bit domain field (PCIEIPC_BDF); pcieipc cannot address it", .bdf.domain)]
pub struct DomainTooWide {
    pub bdf: Bdf,
}

impl Bdf {
    /// `PCIEIPC_BDF(domain, bus, devfn)` of the module's ABI; domains above
    /// 0xffff (VMD's) are refused, never truncated.
    pub fn to_abi(self) -> Result<u32, DomainTooWide> {
        let domain = u16::try_from(self.domain).map_err(|_| DomainTooWide { bdf: self })?;
        Ok(u32::from(domain) << 16
            | u32::from(self.bus) << 8
            | u32::from(self.device) << 3
            | u32::from(self.function))
    }

    /// The inverse of `to_abi`.
    pub fn from_abi(bdf: u32) -> Bdf {
        Bdf {
            domain: bdf >> 16,
            bus: (bdf >> 8) as u8,
            device: ((bdf >> 3) & 0x1f) as u8,
            function: (bdf & 7) as u8,
        }
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl Serialize for Bdf {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_encoding_and_short_form() {
        let bdf: Bdf = "3b:00.1".parse().unwrap();
        assert_eq!(bdf.to_abi(), Ok(0x3b01));
        assert_eq!(Bdf::from_abi(0x0001_3b09).to_string(), "0001:3b:01.1");
        assert_eq!("0000:00:10.0".parse::<Bdf>().unwrap().to_abi(), Ok(0x80));
        assert_eq!(
            "ffff:01:00.0".parse::<Bdf>().unwrap().to_abi(),
            Ok(0xffff_0100)
        );
        assert!("00:20.0".parse::<Bdf>().is_err());
        assert!("garbage".parse::<Bdf>().is_err());
    }

    #[test]
    fn parses_and_prints_sysfs_names() {
        let bdf: Bdf = "0000:8a:1f.7".parse().unwrap();
        assert_eq!(
            bdf,
            Bdf {
                domain: 0,
                bus: 0x8a,
                device: 0x1f,
                function: 7
            }
        );
        assert_eq!(bdf.to_string(), "0000:8a:1f.7");
        let vmd: Bdf = "10000:01:00.0".parse().unwrap();
        assert_eq!(vmd.domain, 0x10000);
        assert_eq!(vmd.to_string(), "10000:01:00.0");
        // Never aliased to 0000:01:00.0 (0x100) in the module's encoding.
        let refused = vmd.to_abi().unwrap_err();
        assert_eq!(refused, DomainTooWide { bdf: vmd });
        assert!(refused
            .to_string()
            .contains("10000:01:00.0: PCI domain 0x10000"));
    }

    #[test]
    fn rejects_other_names() {
        for bad in [
            "pci0000:00",
            "0000:00:20.0",
            "0000:00:00.8",
            "0000:0:00.0",
            "",
        ] {
            assert!(bad.parse::<Bdf>().is_err(), "{bad}");
        }
    }

    #[test]
    fn orders_by_bus_id() {
        let a: Bdf = "0000:05:00.0".parse().unwrap();
        let b: Bdf = "0000:0a:00.0".parse().unwrap();
        let c: Bdf = "0001:00:00.0".parse().unwrap();
        assert!(a < b && b < c);
    }
}
