// SPDX-License-Identifier: GPL-2.0

//! `poll` for /dev/pcieipc.
//!
//! 7.3's `MiscDevice` builds the device's `file_operations` without a poll
//! callback. At open, the file's operations are swapped for a copy of the
//! misc device's own with `poll` added; everything else stays the kernel
//! crate's. Both tables belong to this module, so the module reference
//! counting of `file->f_op` is unchanged.

use kernel::{
    bindings,
    fs::File,
    prelude::*,
    sync::{poll::PollTable, SetOnce},
    types::{ForeignOwnable, Opaque},
};

use crate::chardev::PcieIpcFile;

struct FileOperations(Opaque<bindings::file_operations>);

// SAFETY: the table is written once, before it is published, and only read after.
unsafe impl Sync for FileOperations {}
// SAFETY: as above.
unsafe impl Send for FileOperations {}

static WITH_POLL: SetOnce<FileOperations> = SetOnce::new();

/// Gives `file` (being opened on /dev/pcieipc) the operations with `poll`.
pub(crate) fn install(file: &File) {
    let raw = file.as_ptr();
    if WITH_POLL.as_ref().is_none() {
        // SAFETY: `raw` is the file being opened; its `f_op` points to the
        // misc device's static operations table, which we copy.
        let mut ops: bindings::file_operations = unsafe { core::ptr::read((*raw).f_op) };
        ops.poll = Some(poll);
        // Another opener may win the race; both copies are identical.
        let _ = WITH_POLL.populate(FileOperations(Opaque::new(ops)));
    }
    if let Some(ops) = WITH_POLL.as_ref() {
        // SAFETY: the file is being opened (no other user yet); the new table
        // is static, equal to the old one but for `poll`, and has the same owner.
        unsafe { (*raw).f_op = ops.0.get() };
    }
}

/// # Safety
///
/// Called by the VFS on a file of /dev/pcieipc, whose `private_data` is the
/// `PcieIpcFile` the misc device's open stored.
unsafe extern "C" fn poll(file: *mut bindings::file, table: *mut bindings::poll_table_struct) -> bindings::__poll_t {
    // SAFETY: the VFS passes a valid file for the duration of the call.
    let file_ref = unsafe { File::from_raw_file(file) };
    // SAFETY: `private_data` holds the `KBox<PcieIpcFile>` stored at open,
    // released only at release, which cannot run during poll.
    let me: Pin<&PcieIpcFile> = unsafe { <Pin<KBox<PcieIpcFile>> as ForeignOwnable>::borrow((*file).private_data) };
    // SAFETY: `table` is the VFS's poll table (or NULL) for this call.
    let table = unsafe { PollTable::from_raw(table) };
    table.register_wait(file_ref, me.events().poll_condvar());
    if me.has_events() {
        bindings::POLLIN | bindings::POLLRDNORM
    } else {
        0
    }
}
