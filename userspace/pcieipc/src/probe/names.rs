//! Short names for the class codes and vendors the probe shows, so the tree
//! reads like `lspci -tv` without a copy of pci.ids.

/// Name of a class code's class and subclass (`class >> 8`).
pub fn class_name(class_code: u32) -> &'static str {
    match class_code >> 8 {
        0x0100 => "SCSI storage controller",
        0x0104 => "RAID bus controller",
        0x0106 => "SATA controller",
        0x0108 => "Non-Volatile memory controller",
        0x0180 => "Mass storage controller",
        0x0200 => "Ethernet controller",
        0x0207 => "Infiniband controller",
        0x0280 => "Network controller",
        0x0300 => "VGA compatible controller",
        0x0302 => "3D controller",
        0x0380 => "Display controller",
        0x0600 => "Host bridge",
        0x0601 => "ISA bridge",
        0x0604 | 0x0609 => "PCI bridge",
        0x0680 => "Bridge",
        0x0700 => "Serial controller",
        0x0880 => "System peripheral",
        0x0c03 => "USB controller",
        0x0c05 => "SMBus",
        0x1200 => "Processing accelerators",
        0x1180 => "Signal processing controller",
        0xff00..=0xffff => "Unassigned class",
        _ => "Device",
    }
}

/// Name of a PCI vendor id, for the vendors common in GPU servers.
pub fn vendor_name(vendor_id: u16) -> Option<&'static str> {
    Some(match vendor_id {
        0x10de => "NVIDIA",
        0x1002 => "AMD",
        0x1022 => "AMD",
        0x8086 => "Intel",
        0x15b3 => "Mellanox",
        0x10b5 => "Broadcom / PLX",
        0x1000 => "Broadcom / LSI",
        0x14e4 => "Broadcom",
        0x11f8 => "Microchip",
        0x144d => "Samsung",
        0x1af4 => "Red Hat (virtio)",
        0x1b36 => "Red Hat (QEMU)",
        0x1a03 => "ASPEED",
        0x1d0f => "Amazon",
        0x1ded => "Alibaba",
        0x1da3 => "Habana Labs",
        _ => return None,
    })
}
