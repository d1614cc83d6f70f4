// SPDX-License-Identifier: GPL-2.0

//! The one capability check of the module.
//!
//! 7.3's kernel crate has no `capable()`; this is the one place that calls
//! it.

use kernel::{bindings, prelude::*};

/// Fails with `EPERM` unless the caller has CAP_SYS_ADMIN: required by every
/// operation that touches hardware (BAR mmap, RING, DMA, link retraining,
/// watches, reset).
pub(crate) fn require_sys_admin() -> Result {
    // SAFETY: `capable` only reads the current task's credentials.
    if unsafe { bindings::capable(bindings::CAP_SYS_ADMIN as i32) } {
        Ok(())
    } else {
        Err(EPERM)
    }
}
