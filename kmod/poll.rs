// SPDX-License-Identifier: GPL-2.0

//! Readers of a misc device that must not block: `poll`, and a read's
//! O_NONBLOCK.
//!
//! 7.3's `MiscDevice` builds the device's `file_operations` without a poll
//! callback, and its `Kiocb` does not give the file's flags. At open, the
//! file's operations are swapped for a copy of the misc device's own with
//! `poll` added; everything else stays the kernel crate's. Both tables belong
//! to this module, so the module reference counting of `file->f_op` is
//! unchanged.

use kernel::{
    bindings,
    fs::{file::flags::O_NONBLOCK, File, Kiocb},
    miscdevice::MiscDevice,
    prelude::*,
    sync::{
        poll::{PollCondVar, PollTable},
        SetOnce,
    },
    types::{ForeignOwnable, Opaque},
};

/// A misc device file that can be polled for readability.
pub(crate) trait Poll {
    /// Signalled whenever the file may have become readable.
    fn poll_condvar(&self) -> &PollCondVar;
    /// Whether a read would return data now.
    fn readable(&self) -> bool;
}

/// The misc device's operations table with `poll` added, and the table it
/// was copied from: only files opened with that table get this one.
struct WithPoll {
    source: *const bindings::file_operations,
    ops: Opaque<bindings::file_operations>,
}

// SAFETY: the table is written once, before it is published, and only read
// after; `source` is only compared.
unsafe impl Sync for WithPoll {}
// SAFETY: as above.
unsafe impl Send for WithPoll {}

static WITH_POLL: SetOnce<WithPoll> = SetOnce::new();

/// Gives `file`, being opened on the misc device of `T`, the operations with
/// `poll`.
pub(crate) fn install<T>(file: &File)
where
    T: MiscDevice<Ptr = Pin<KBox<T>>> + Poll,
{
    let raw = file.as_ptr();
    // SAFETY: `raw` is the file being opened; its `f_op` is the misc
    // device's static operations table, set before `open` was called.
    let source = unsafe { (*raw).f_op };
    if WITH_POLL.as_ref().is_none() {
        // SAFETY: `source` is a valid operations table (above), which we copy.
        let mut ops: bindings::file_operations = unsafe { core::ptr::read(source) };
        ops.poll = Some(poll::<T>);
        // Another opener may win the race; both copies are identical.
        let _ = WITH_POLL.populate(WithPoll {
            source,
            ops: Opaque::new(ops),
        });
    }
    // A file of another misc device keeps its own table: `poll::<T>` would
    // misread its private data.
    if let Some(with_poll) = WITH_POLL.as_ref().filter(|w| w.source == source) {
        // SAFETY: the file is being opened (no other user yet); the new table
        // is static, equal to the old one but for `poll`, and has the same
        // owner.
        unsafe { (*raw).f_op = with_poll.ops.get() };
    }
}

/// Whether the read of `kiocb` must not block (O_NONBLOCK).
pub(crate) fn nonblocking<T: ForeignOwnable>(kiocb: &Kiocb<'_, T>) -> bool {
    // SAFETY: the kiocb of a read on an open file points to that file, which
    // stays open during the read; it was not obtained with `fdget_pos`.
    let file = unsafe { File::from_raw_file((*kiocb.as_raw()).ki_filp) };
    file.flags() & O_NONBLOCK != 0
}

/// # Safety
///
/// Called by the VFS on a file of `T`'s misc device whose operations
/// `install::<T>` swapped: its `private_data` is the `T` that the misc
/// device's open stored.
unsafe extern "C" fn poll<T>(
    file: *mut bindings::file,
    table: *mut bindings::poll_table_struct,
) -> bindings::__poll_t
where
    T: MiscDevice<Ptr = Pin<KBox<T>>> + Poll,
{
    // SAFETY: the VFS passes a valid file for the duration of the call.
    let file_ref = unsafe { File::from_raw_file(file) };
    // SAFETY: `private_data` holds the `Pin<KBox<T>>` stored at open,
    // released only at release, which cannot run during poll.
    let me: Pin<&T> = unsafe { <Pin<KBox<T>> as ForeignOwnable>::borrow((*file).private_data) };
    // SAFETY: `table` is the VFS's poll table (or NULL) for this call.
    let table = unsafe { PollTable::from_raw(table) };
    table.register_wait(file_ref, me.poll_condvar());
    if me.readable() {
        bindings::POLLIN | bindings::POLLRDNORM
    } else {
        0
    }
}
