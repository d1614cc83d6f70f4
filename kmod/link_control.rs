// SPDX-License-Identifier: GPL-2.0

//! Root's per-device opt-in to link control of devices another driver owns
//! (a GPU bound to its vendor driver): the module parameter `link_control`,
//! a comma-separated list of PCI addresses whose upstream link may be
//! retrained. Given at load (`insmod pcieipc.ko link_control=0000:3b:00.0`,
//! or modprobe.d) or at run time through
//! `/sys/module/pcieipc/parameters/link_control` (root only).
//!
//! A retrain takes a link down for its duration, so by default only the
//! links above devices this module binds are retrained. A write is checked
//! whole: one bad entry refuses it (EINVAL, the reason in the kernel log)
//! and the list in force stays as it was, so nothing is half-applied.

use kernel::{prelude::*, str::BStr};

use crate::text_param::{text_param, with_param_lock, ParamWriter, TextParam};

/// At most this many devices may be listed: a server has a few GPUs and
/// NICs per root complex, and the list lives in a fixed array (the kernel
/// sets it before the module's init runs, where nothing can be allocated
/// for it yet).
const MAX_DEVICES: usize = 64;

/// The PCI addresses root listed, in `PCIEIPC_BDF` form, each once.
#[derive(Clone, Copy)]
struct AllowList {
    bdfs: [u32; MAX_DEVICES],
    len: usize,
}

impl AllowList {
    const EMPTY: Self = Self {
        bdfs: [0; MAX_DEVICES],
        len: 0,
    };

    fn as_slice(&self) -> &[u32] {
        &self.bdfs[..self.len]
    }
}

/// The list in force.
struct ListInForce(core::cell::UnsafeCell<AllowList>);

// SAFETY: read and written only under the module's parameter lock: by the
// kernel around `LinkControl::store`/`show`, and by `is_listed` through
// `with_param_lock`.
unsafe impl Sync for ListInForce {}

static LIST: ListInForce = ListInForce(core::cell::UnsafeCell::new(AllowList::EMPTY));

/// The parameter.
struct LinkControl;

text_param!(
    "link_control",
    LinkControl,
    "PCI addresses (comma-separated) of devices another driver owns whose upstream link root allows pcieipc to retrain"
);

impl TextParam for LinkControl {
    fn store(text: &[u8]) -> Result {
        let list = parse(text).map_err(|error| {
            pr_err!(
                "link_control: refused, the list in force is unchanged: {}\n",
                error
            );
            EINVAL
        })?;
        // SAFETY: the kernel calls `store` under the parameter lock (see
        // `ListInForce`).
        unsafe { *LIST.0.get() = list };
        Ok(())
    }

    fn show(out: &mut ParamWriter<'_>) -> core::fmt::Result {
        use core::fmt::Write;
        // SAFETY: the kernel calls `show` under the parameter lock.
        let list = unsafe { &*LIST.0.get() };
        for (i, &bdf) in list.as_slice().iter().enumerate() {
            if i > 0 {
                out.write_char(',')?;
            }
            Address(bdf).write_to(out)?;
        }
        out.write_char('\n')
    }
}

/// Whether root listed `bdf` (a `PCIEIPC_BDF`).
pub(crate) fn is_listed(bdf: u32) -> bool {
    with_param_lock(|| {
        // SAFETY: read under the parameter lock (`with_param_lock`).
        let list = unsafe { &*LIST.0.get() };
        list.as_slice().contains(&bdf)
    })
}

/// A `PCIEIPC_BDF` printed as the kernel prints PCI addresses.
pub(crate) struct Address(pub(crate) u32);

impl Address {
    fn write_to(&self, out: &mut impl core::fmt::Write) -> core::fmt::Result {
        let bdf = self.0;
        write!(
            out,
            "{:04x}:{:02x}:{:02x}.{}",
            bdf >> 16,
            (bdf >> 8) & 0xff,
            (bdf >> 3) & 0x1f,
            bdf & 7
        )
    }
}

impl kernel::fmt::Display for Address {
    fn fmt(&self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        self.write_to(f)
    }
}

/// Why a list was refused.
enum ListError<'a> {
    Malformed(&'a [u8]),
    DomainTooLarge(&'a [u8]),
    Duplicate(&'a [u8]),
    TooMany,
}

/// At most the first 32 bytes of an entry (a 4 KiB write is not logged whole).
fn shown(entry: &[u8]) -> &BStr {
    BStr::from_bytes(&entry[..entry.len().min(32)])
}

impl kernel::fmt::Display for ListError<'_> {
    fn fmt(&self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        match self {
            Self::Malformed(entry) => f.write_fmt(fmt!(
                "'{}' is not a PCI address (DDDD:BB:DD.F or BB:DD.F, hexadecimal)",
                shown(entry)
            )),
            Self::DomainTooLarge(entry) => f.write_fmt(fmt!(
                "'{}': PCI domains above 0xffff are not supported",
                shown(entry)
            )),
            Self::Duplicate(entry) => f.write_fmt(fmt!("'{}' is listed twice", shown(entry))),
            Self::TooMany => f.write_fmt(fmt!("more than {MAX_DEVICES} devices")),
        }
    }
}

/// The list `text` gives (comma-separated, blanks around entries and a
/// trailing newline ignored, empty for none).
fn parse(text: &[u8]) -> core::result::Result<AllowList, ListError<'_>> {
    let text = text.trim_ascii();
    let mut list = AllowList::EMPTY;
    if text.is_empty() {
        return Ok(list);
    }
    for entry in text.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
        let bdf = parse_address(entry)?;
        if list.as_slice().contains(&bdf) {
            return Err(ListError::Duplicate(entry));
        }
        if list.len == MAX_DEVICES {
            return Err(ListError::TooMany);
        }
        list.bdfs[list.len] = bdf;
        list.len += 1;
    }
    Ok(list)
}

/// `DDDD:BB:DD.F` or `BB:DD.F` (domain 0) as a `PCIEIPC_BDF`.
fn parse_address(entry: &[u8]) -> core::result::Result<u32, ListError<'_>> {
    let malformed = ListError::Malformed(entry);
    let (slot, function) = match entry.split_last() {
        Some((&f @ b'0'..=b'7', rest)) => match rest.split_last() {
            Some((b'.', slot)) => (slot, u32::from(f - b'0')),
            _ => return Err(malformed),
        },
        _ => return Err(malformed),
    };
    let mut parts = slot.rsplit(|&b| b == b':');
    let device = hex(parts.next(), 2).filter(|&d| d <= 0x1f);
    let bus = hex(parts.next(), 2);
    let domain = match parts.next() {
        None => Some(0),
        Some(digits) => hex(Some(digits), 8),
    };
    let (Some(device), Some(bus), Some(domain), None) = (device, bus, domain, parts.next()) else {
        return Err(malformed);
    };
    if domain > 0xffff {
        return Err(ListError::DomainTooLarge(entry));
    }
    Ok(domain << 16 | bus << 8 | device << 3 | function)
}

/// A hexadecimal number of 1 to `max_digits` digits.
fn hex(digits: Option<&[u8]>, max_digits: usize) -> Option<u32> {
    let digits = digits?;
    if digits.is_empty() || digits.len() > max_digits {
        return None;
    }
    digits.iter().try_fold(0u32, |value, &d| {
        let digit = (d as char).to_digit(16)?;
        Some(value << 4 | digit)
    })
}
