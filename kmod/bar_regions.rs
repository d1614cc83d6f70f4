// SPDX-License-Identifier: GPL-2.0

//! The memory BARs the module hands to userspace, requested for it while the
//! device is bound (so no other driver claims them), released on unbind.
//! BARs that the module maps (`pci::Bar`) are requested by that mapping; 7.3
//! has no abstraction to request a region without mapping it, hence this
//! wrapper for the others (BARs too large to map into the kernel).

use kernel::{bindings, device::Bound, pci, prelude::*};

use crate::{
    pci_info::{self, BarInfo},
    uapi,
};

pub(crate) struct BarRegions<'bound> {
    pdev: &'bound pci::Device<Bound>,
    /// Bit i: BAR i is requested.
    requested: u32,
}

impl<'bound> BarRegions<'bound> {
    /// Requests every non-empty memory BAR for which `requested_elsewhere`
    /// is false (BARs that a `pci::Bar` maps are requested by it).
    pub(crate) fn request(
        pdev: &'bound pci::Device<Bound>,
        bars: &[BarInfo],
        requested_elsewhere: impl Fn(usize) -> bool,
    ) -> Result<Self> {
        let mut regions = Self { pdev, requested: 0 };
        for (index, bar) in bars.iter().enumerate() {
            if bar.size == 0 || bar.flags & uapi::PCIEIPC_BAR_MEM == 0 || requested_elsewhere(index)
            {
                continue;
            }
            // SAFETY: `pdev` is bound; `index` is a standard BAR (< 6); the
            // name is 'static.
            let ret = unsafe {
                bindings::pci_request_region(
                    pci_info::raw(pdev),
                    index as i32,
                    c"pcieipc".as_char_ptr(),
                )
            };
            if ret != 0 {
                // Dropping `regions` releases what was requested so far.
                return Err(EBUSY);
            }
            regions.requested |= 1 << index;
        }
        Ok(regions)
    }
}

impl Drop for BarRegions<'_> {
    fn drop(&mut self) {
        for index in 0..uapi::PCIEIPC_NUM_BARS {
            if self.requested & (1 << index) != 0 {
                // SAFETY: BAR `index` was requested in `request` and not
                // released since; the device is still bound ('bound).
                unsafe { bindings::pci_release_region(pci_info::raw(self.pdev), index as i32) };
            }
        }
    }
}
