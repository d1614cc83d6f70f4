// SPDX-License-Identifier: GPL-2.0

//! Config-space access to any PCI function by BDF, whether this module owns
//! it or not (a GPU bound to its vendor driver, a root port).
//!
//! 7.3's `kernel::pci` only reaches the config space of a device the driver
//! is bound to; this is the one place that uses the raw PCI bindings for
//! others. A `PciFunction` holds a reference on the `struct pci_dev`, so it
//! stays valid even if the device is removed meanwhile (its config reads
//! then return all ones).

use core::ptr::NonNull;

use kernel::{bindings, error::to_result, prelude::*};

use crate::uapi;

/// The registers of the PCI Express and AER capabilities this file and its
/// users touch, from include/uapi/linux/pci_regs.h through the bindings, typed
/// as the config accessors take them.
pub(crate) mod regs {
    use kernel::bindings;

    pub(crate) const PCI_EXP_FLAGS: i32 = bindings::PCI_EXP_FLAGS as i32;
    pub(crate) const PCI_EXP_FLAGS_TYPE: u16 = bindings::PCI_EXP_FLAGS_TYPE as u16;
    pub(crate) const PCI_EXP_TYPE_ROOT_PORT: u16 = bindings::PCI_EXP_TYPE_ROOT_PORT as u16;
    pub(crate) const PCI_EXP_TYPE_DOWNSTREAM: u16 = bindings::PCI_EXP_TYPE_DOWNSTREAM as u16;
    pub(crate) const PCI_EXP_TYPE_PCIE_BRIDGE: u16 = bindings::PCI_EXP_TYPE_PCIE_BRIDGE as u16;
    pub(crate) const PCI_EXP_LNKCAP: i32 = bindings::PCI_EXP_LNKCAP as i32;
    pub(crate) const PCI_EXP_LNKCTL: i32 = bindings::PCI_EXP_LNKCTL as i32;
    pub(crate) const PCI_EXP_LNKCTL_RL: u16 = bindings::PCI_EXP_LNKCTL_RL as u16;
    pub(crate) const PCI_EXP_LNKSTA: i32 = bindings::PCI_EXP_LNKSTA as i32;
    pub(crate) const PCI_EXP_LNKSTA_LT: u16 = bindings::PCI_EXP_LNKSTA_LT as u16;
    pub(crate) const PCI_EXP_LNKSTA_DLLLA: u16 = bindings::PCI_EXP_LNKSTA_DLLLA as u16;
    pub(crate) const PCI_EXP_LNKSTA_LBMS: u16 = bindings::PCI_EXP_LNKSTA_LBMS as u16;
    pub(crate) const PCI_EXP_LNKCTL2: i32 = bindings::PCI_EXP_LNKCTL2 as i32;
    pub(crate) const PCI_EXP_LNKCTL2_TLS: u16 = bindings::PCI_EXP_LNKCTL2_TLS as u16;
    pub(crate) const PCI_EXT_CAP_ID_ERR: i32 = bindings::PCI_EXT_CAP_ID_ERR as i32;
    pub(crate) const PCI_ERR_UNCOR_STATUS: i32 = bindings::PCI_ERR_UNCOR_STATUS as i32;
    pub(crate) const PCI_ERR_UNCOR_MASK: i32 = bindings::PCI_ERR_UNCOR_MASK as i32;
    pub(crate) const PCI_ERR_UNCOR_SEVER: i32 = bindings::PCI_ERR_UNCOR_SEVER as i32;
    pub(crate) const PCI_ERR_COR_STATUS: i32 = bindings::PCI_ERR_COR_STATUS as i32;
    pub(crate) const PCI_ERR_COR_MASK: i32 = bindings::PCI_ERR_COR_MASK as i32;
    pub(crate) const PCI_ERR_CAP: i32 = bindings::PCI_ERR_CAP as i32;
    pub(crate) const PCI_ERR_HEADER_LOG: i32 = bindings::PCI_ERR_HEADER_LOG as i32;
    pub(crate) const PCI_BASE_CLASS_STORAGE: u32 = bindings::PCI_BASE_CLASS_STORAGE;
}

/// A referenced `struct pci_dev`.
///
/// # Invariants
///
/// `dev` points to a `struct pci_dev` on which this value holds a reference
/// (taken by `pci_get_domain_bus_and_slot` or `pci_dev_get`).
pub(crate) struct PciFunction {
    dev: NonNull<bindings::pci_dev>,
    domain: u32,
}

// SAFETY: a referenced `pci_dev` may be used and released from any thread;
// config accessors take the PCI config lock themselves.
unsafe impl Send for PciFunction {}
// SAFETY: as above: every method only reads through the pointer or calls
// functions that serialise config accesses.
unsafe impl Sync for PciFunction {}

impl PciFunction {
    /// Finds a function by `PCIEIPC_BDF(domain, bus, devfn)`.
    pub(crate) fn find(bdf: u32) -> Result<Self> {
        let domain = bdf >> 16;
        // SAFETY: a plain lookup; it returns a referenced device or NULL.
        let dev = unsafe {
            bindings::pci_get_domain_bus_and_slot(domain as i32, (bdf >> 8) & 0xff, bdf & 0xff)
        };
        // INVARIANT: a non-NULL result carries a reference for us.
        NonNull::new(dev)
            .map(|dev| Self { dev, domain })
            .ok_or(ENODEV)
    }

    /// `PCIEIPC_BDF` of this function.
    pub(crate) fn bdf(&self) -> u32 {
        // SAFETY: `dev` is valid (invariant) and `bus` is set for every
        // enumerated device and never changes.
        let (bus, devfn) = unsafe {
            (
                u32::from((*(*self.dev.as_ptr()).bus).number),
                (*self.dev.as_ptr()).devfn,
            )
        };
        self.domain << 16 | bus << 8 | devfn
    }

    /// The bridge above this function, if it is not on a root bus.
    pub(crate) fn upstream_bridge(&self) -> Option<Self> {
        // SAFETY: `dev` is valid; `bus` and `bus->self` (the bridge leading
        // to the bus, NULL on a root bus) do not change while it exists.
        let bridge = unsafe { (*(*self.dev.as_ptr()).bus).self_ };
        let bridge = NonNull::new(bridge)?;
        // SAFETY: `bridge` is a valid device (the parent of a device we hold);
        // `pci_dev_get` takes the reference the new value owns.
        unsafe { bindings::pci_dev_get(bridge.as_ptr()) };
        Some(Self {
            dev: bridge,
            domain: self.domain,
        })
    }

    /// The first function below this bridge (on its secondary bus or
    /// further down) whose class code `matches`, if any.
    pub(crate) fn find_below(&self, matches: fn(u32) -> bool) -> Option<PciFunction> {
        struct Walk {
            matches: fn(u32) -> bool,
            found: *mut bindings::pci_dev,
        }
        /// # Safety
        ///
        /// Called by `pci_walk_bus` with a valid device and our `Walk`.
        unsafe extern "C" fn visit(dev: *mut bindings::pci_dev, data: *mut c_void) -> c_int {
            // SAFETY: `data` is the `Walk` below, borrowed for the walk.
            let walk = unsafe { &mut *data.cast::<Walk>() };
            // SAFETY: `dev` is valid for the call (the walk holds the bus
            // lock); `class` is read at enumeration.
            if (walk.matches)(unsafe { (*dev).class }) {
                // SAFETY: as above; the reference is the found function's.
                walk.found = unsafe { bindings::pci_dev_get(dev) };
                1
            } else {
                0
            }
        }
        // SAFETY: `dev` is valid; `subordinate` (NULL for a non-bridge) is
        // set while the bridge is enumerated.
        let bus = unsafe { (*self.dev.as_ptr()).subordinate };
        if bus.is_null() {
            return None;
        }
        let mut walk = Walk {
            matches,
            found: core::ptr::null_mut(),
        };
        // SAFETY: `bus` is valid (above); `visit` matches the callback's
        // contract and `walk` outlives the walk.
        unsafe { bindings::pci_walk_bus(bus, Some(visit), (&raw mut walk).cast()) };
        // INVARIANT: `found` carries the reference `visit` took; everything
        // below a bridge is in the bridge's domain.
        NonNull::new(walk.found).map(|dev| Self {
            dev,
            domain: self.domain,
        })
    }

    /// Whether the kernel's bandwidth controller sets this port's link speed
    /// through a thermal cooling device (`PCIe_Port_Link_Speed_<port>`):
    /// a speed change then has to go through it, where the kernel
    /// serialises it with its own.
    pub(crate) fn has_bandwidth_cooling_device(&self) -> bool {
        #[cfg(CONFIG_PCIE_THERMAL)]
        {
            // SAFETY: `dev` is valid; `link_bwctrl` is set while the
            // bandwidth controller is bound to the port, which is when it
            // registers the cooling device.
            !unsafe { (*self.dev.as_ptr()).link_bwctrl }.is_null()
        }
        #[cfg(not(CONFIG_PCIE_THERMAL))]
        false
    }

    /// Whether the function has a PCI Express capability.
    pub(crate) fn is_pcie(&self) -> bool {
        // SAFETY: `dev` is valid; `pcie_cap` is set at enumeration.
        unsafe { (*self.dev.as_ptr()).pcie_cap != 0 }
    }

    /// The PCI Express device/port type (PCI_EXP_TYPE_*), if PCI Express.
    pub(crate) fn pcie_type(&self) -> Option<u16> {
        let flags = self.pcie_read16(regs::PCI_EXP_FLAGS).ok()?;
        Some((flags & regs::PCI_EXP_FLAGS_TYPE) >> 4)
    }

    /// Whether this function is the downstream-facing end of a link (a root
    /// port or a switch downstream port), whose Link Control retrains it.
    pub(crate) fn is_downstream_port(&self) -> bool {
        matches!(
            self.pcie_type(),
            Some(
                regs::PCI_EXP_TYPE_ROOT_PORT
                    | regs::PCI_EXP_TYPE_DOWNSTREAM
                    | regs::PCI_EXP_TYPE_PCIE_BRIDGE
            )
        )
    }

    /// Reads a 16-bit register of the PCI Express capability.
    pub(crate) fn pcie_read16(&self, pos: i32) -> Result<u16> {
        let mut value = 0u16;
        // SAFETY: `dev` is valid; the function checks `pos` against the
        // capability's version and returns an error for unknown registers.
        to_result(unsafe {
            bindings::pcie_capability_read_word(self.dev.as_ptr(), pos, &mut value)
        })?;
        Ok(value)
    }

    /// Reads a 32-bit register of the PCI Express capability.
    pub(crate) fn pcie_read32(&self, pos: i32) -> Result<u32> {
        let mut value = 0u32;
        // SAFETY: as in `pcie_read16`.
        to_result(unsafe {
            bindings::pcie_capability_read_dword(self.dev.as_ptr(), pos, &mut value)
        })?;
        Ok(value)
    }

    /// Read-modify-write of Link Control with the kernel's lock for it
    /// (ASPM and bandwidth control write the same register).
    pub(crate) fn link_control_clear_and_set(&self, clear: u16, set: u16) -> Result {
        // SAFETY: `dev` is valid; the locked helper serialises with the
        // kernel's own writers of Link Control.
        to_result(unsafe {
            bindings::pcie_capability_clear_and_set_word_locked(
                self.dev.as_ptr(),
                regs::PCI_EXP_LNKCTL,
                clear,
                set,
            )
        })
    }

    /// Read-modify-write of Link Control 2 with the same lock as Link Control
    /// (bandwidth control writes the target speed under it; this is what
    /// `pcie_capability_clear_and_set_word` does for this register).
    pub(crate) fn link_control2_clear_and_set(&self, clear: u16, set: u16) -> Result {
        // SAFETY: `dev` is valid; the locked helper serialises with the
        // kernel's own writers of Link Control 2.
        to_result(unsafe {
            bindings::pcie_capability_clear_and_set_word_locked(
                self.dev.as_ptr(),
                regs::PCI_EXP_LNKCTL2,
                clear,
                set,
            )
        })
    }

    /// Whether the kernel's quirks mark this port as needing Retrain Link
    /// cleared again by hand after setting it (an erratum of some devices).
    pub(crate) fn needs_retrain_bit_cleared(&self) -> bool {
        // SAFETY: `dev` is valid; the quirk bit is set at enumeration.
        unsafe { (*self.dev.as_ptr()).clear_retrain_link() != 0 }
    }

    /// Clears write-one-to-clear bits of Link Status (LBMS after a retrain).
    pub(crate) fn link_status_clear(&self, bits: u16) -> Result {
        // SAFETY: `dev` is valid; Link Status has only read-only and
        // write-one-to-clear bits, so writing `bits` changes nothing else.
        to_result(unsafe {
            bindings::pcie_capability_write_word(self.dev.as_ptr(), regs::PCI_EXP_LNKSTA, bits)
        })
    }

    /// A 32-bit config read; all ones when the device does not answer (removed,
    /// link down), as the hardware gives.
    pub(crate) fn config_read32(&self, offset: i32) -> u32 {
        let mut value = u32::MAX;
        // SAFETY: `dev` is valid; a failed read leaves all ones.
        let ret = unsafe { bindings::pci_read_config_dword(self.dev.as_ptr(), offset, &mut value) };
        if ret != 0 {
            u32::MAX
        } else {
            value
        }
    }

    /// The kernel's function reset: save config space, reset by the best
    /// method available, restore (takes the device lock itself).
    pub(crate) fn reset(&self) -> Result {
        // SAFETY: `dev` is valid; the function serialises with the driver core.
        to_result(unsafe { bindings::pci_reset_function(self.dev.as_ptr()) })
    }

    /// The AER capability's registers now (all zero, `present` 0, without one).
    pub(crate) fn aer_regs(&self) -> uapi::pcieipc_aer_regs {
        // SAFETY: `dev` is valid; the walk reads config space only.
        let pos = i32::from(unsafe {
            bindings::pci_find_ext_capability(self.dev.as_ptr(), regs::PCI_EXT_CAP_ID_ERR)
        });
        if pos == 0 {
            return uapi::pcieipc_aer_regs {
                source_bdf: self.bdf(),
                ..Default::default()
            };
        }
        let read = |offset: i32| self.config_read32(pos + offset);
        uapi::pcieipc_aer_regs {
            uncor_status: read(regs::PCI_ERR_UNCOR_STATUS),
            uncor_mask: read(regs::PCI_ERR_UNCOR_MASK),
            uncor_severity: read(regs::PCI_ERR_UNCOR_SEVER),
            cor_status: read(regs::PCI_ERR_COR_STATUS),
            cor_mask: read(regs::PCI_ERR_COR_MASK),
            cap_control: read(regs::PCI_ERR_CAP),
            header_log: [0, 4, 8, 12].map(|i| read(regs::PCI_ERR_HEADER_LOG + i)),
            present: 1,
            source_bdf: self.bdf(),
        }
    }

    /// The AER registers that logged an error reported for this function:
    /// those of the first function from this one up to the root port whose
    /// status holds an unmasked error (a conventional endpoint has no AER
    /// capability, and a port two switches up may be the one that logged
    /// it), else of the nearest with an AER capability, else this
    /// function's (absent).
    pub(crate) fn logged_aer_regs(&self) -> uapi::pcieipc_aer_regs {
        let logs = |regs: &uapi::pcieipc_aer_regs| {
            regs.uncor_status & !regs.uncor_mask != 0 || regs.cor_status & !regs.cor_mask != 0
        };
        let own = self.aer_regs();
        if logs(&own) {
            return own;
        }
        let mut nearest = (own.present != 0).then_some(own);
        let mut above = self.upstream_bridge();
        while let Some(port) = above {
            let regs = port.aer_regs();
            if logs(&regs) {
                return regs;
            }
            if regs.present != 0 {
                nearest.get_or_insert(regs);
            }
            above = port.upstream_bridge();
        }
        nearest.unwrap_or(own)
    }
}

impl Clone for PciFunction {
    fn clone(&self) -> Self {
        // SAFETY: `dev` is valid; the clone owns the new reference.
        unsafe { bindings::pci_dev_get(self.dev.as_ptr()) };
        Self {
            dev: self.dev,
            domain: self.domain,
        }
    }
}

impl Drop for PciFunction {
    fn drop(&mut self) {
        // SAFETY: we own one reference (invariant).
        unsafe { bindings::pci_dev_put(self.dev.as_ptr()) };
    }
}
