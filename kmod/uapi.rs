// SPDX-License-Identifier: GPL-2.0

//! The ABI types: the very bindgen output that userspace uses, plus the
//! argsz protocol shared by every ioctl.

#![allow(
    dead_code,
    unreachable_pub,
    non_camel_case_types,
    non_upper_case_globals,
    clippy::all,
    missing_docs
)]

use kernel::{
    prelude::*,
    transmute::{AsBytes, FromBytes},
    uaccess::{UserPtr, UserSlice},
};

include!("../userspace/uapi/src/generated.rs");

/// `FromBytes` + `AsBytes` for ABI structs made only of integer fields
/// (and arrays or structs of them) with no implicit padding: bindgen's
/// layout assertions in the generated file pin each size and offset, and the
/// header places every field at its natural alignment with explicit
/// `reserved` fields where needed, so the fields cover every byte.
macro_rules! plain_abi_struct {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: `repr(C)`, integer fields only, no padding (see above):
        // every bit pattern is valid.
        unsafe impl FromBytes for $t {}
        // SAFETY: as above: no padding, so every byte is initialised.
        unsafe impl AsBytes for $t {}
    )*};
}

plain_abi_struct!(
    pcieipc_bar_info,
    pcieipc_device_info,
    pcieipc_list,
    pcieipc_wait,
    pcieipc_counters,
    pcieipc_ring,
    pcieipc_dma_alloc,
    pcieipc_dma_copy,
    pcieipc_dma_wait,
    pcieipc_version,
    pcieipc_link_regs,
    pcieipc_link_status,
    pcieipc_link_retrain,
    pcieipc_watch,
    pcieipc_reset,
    pcieipc_aer_regs,
    pcieipc_event,
);

/// An argsz-versioned ioctl struct and the size of its first published
/// version, the least `argsz` the module accepts: a caller's argsz covers at
/// least the fields it knew (VFIO's rule). Frozen numbers: a struct grows at
/// its end, and an old binary's smaller argsz must keep working.
pub(crate) trait Argsz: FromBytes + AsBytes + Default {
    /// Size of the struct in the ABI version that introduced the ioctl.
    const FIRST_SIZE: usize;
}

macro_rules! argsz_structs {
    ($($t:ty = $first:expr),* $(,)?) => {$(
        impl Argsz for $t {
            const FIRST_SIZE: usize = {
                assert!($first <= size_of::<$t>());
                $first
            };
        }
    )*};
}

argsz_structs!(
    pcieipc_version = 48,
    pcieipc_list = 32,
    pcieipc_wait = 40,
    pcieipc_counters = 272,
    pcieipc_ring = 16,
    pcieipc_dma_alloc = 40,
    pcieipc_dma_copy = 56,
    pcieipc_dma_wait = 24,
    pcieipc_link_status = 52,
    pcieipc_link_retrain = 128,
    pcieipc_watch = 16,
    pcieipc_reset = 16,
);

/// An ioctl argument of an argsz-versioned struct (see the header's
/// conventions): `argsz` must cover at least `T::FIRST_SIZE` bytes; only the
/// first `min(argsz, size_of::<T>())` bytes are read (the rest of the value
/// stays zero, the default of every field an old caller did not send) and
/// written back.
pub(crate) struct ArgszArg<T> {
    user: UserPtr,
    len: usize,
    pub(crate) value: T,
}

impl<T: Argsz> ArgszArg<T> {
    /// Reads the caller's struct.
    pub(crate) fn read(arg: usize) -> Result<Self> {
        let mut argsz_reader = UserSlice::new(UserPtr::from_addr(arg), size_of::<u32>()).reader();
        let argsz = argsz_reader.read::<u32>()? as usize;
        if argsz < T::FIRST_SIZE {
            return Err(EINVAL);
        }
        let len = argsz.min(size_of::<T>());
        let mut value = T::default();
        let mut reader = UserSlice::new(UserPtr::from_addr(arg), len).reader();
        reader.read_slice(&mut value.as_bytes_mut()[..len])?;
        Ok(Self {
            user: UserPtr::from_addr(arg),
            len,
            value,
        })
    }

    /// Copies the struct back to the caller, as far as its argsz reaches.
    pub(crate) fn write_back(&self) -> Result {
        let mut writer = UserSlice::new(self.user, self.len).writer();
        writer.write_slice(&self.value.as_bytes()[..self.len])
    }
}
