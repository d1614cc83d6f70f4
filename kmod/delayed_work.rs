// SPDX-License-Identifier: GPL-2.0

//! Waiting for a delayed work item to be idle.
//!
//! 7.3's `workqueue` queues a `DelayedWork` but can neither flush nor cancel
//! it; a watch that stops must wait until its work item is neither queued nor
//! running (the module may unload next). This is the one place that calls
//! `flush_delayed_work`.

use kernel::{bindings, workqueue::DelayedWork};

/// Runs `work` at once if its timer is pending and waits until it has run.
/// A work item that queues itself again must have been told to stop first.
pub(crate) fn flush<T: ?Sized, const ID: u64>(work: &DelayedWork<T, ID>) {
    let raw: *const DelayedWork<T, ID> = work;
    // SAFETY: a reference to a `DelayedWork` exists only once its initialiser
    // ran, and `DelayedWork` is a transparent wrapper of `struct
    // delayed_work`; flushing it only waits, it frees nothing.
    unsafe { bindings::flush_delayed_work(raw.cast_mut().cast::<bindings::delayed_work>()) };
}
