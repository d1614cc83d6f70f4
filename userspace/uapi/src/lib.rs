//! Bindings of `include/uapi/pcieipc.h`, the ABI of `/dev/pcieipc`.
//!
//! `generated.rs` is bindgen's output for the header (scripts/gen-uapi.sh); it
//! is committed so that building userspace needs no libclang, and the test
//! command regenerates it and fails on any difference. The kernel module
//! includes the same file. This crate adds the raw ioctl calls, made with
//! nix's ioctl macros; `pcieipc::device` wraps them in a typed API.

#[allow(non_camel_case_types, non_upper_case_globals, clippy::all)]
mod generated {
    include!("generated.rs");
}
pub use generated::*;

/// Raw ioctl calls, one per ioctl of the header.
///
/// Every pcieipc ioctl is `_IO(magic, nr)` with an argsz-versioned struct
/// behind the pointer (the VFIO convention), which is nix's "bad" ioctl form:
/// the request number is taken as it is from the header.
pub mod ioctl {
    use super::*;

    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_VERSION`: fills a `pcieipc_version` whose `argsz` is set.
        version,
        PCIEIPC_IOC_VERSION,
        pcieipc_version
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_LIST`: fills a `pcieipc_list` and its `entries` array.
        list,
        PCIEIPC_IOC_LIST,
        pcieipc_list
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_WAIT`: blocks until an interrupt count passes `last_seen`.
        wait,
        PCIEIPC_IOC_WAIT,
        pcieipc_wait
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_COUNTERS`: every vector's interrupt count.
        counters,
        PCIEIPC_IOC_COUNTERS,
        pcieipc_counters
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_RING`: rings a peer's doorbell.
        ring,
        PCIEIPC_IOC_RING,
        pcieipc_ring
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_DMA_ALLOC`: a coherent DMA buffer owned by the file.
        dma_alloc,
        PCIEIPC_IOC_DMA_ALLOC,
        pcieipc_dma_alloc
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_DMA_COPY`: submits a copy between two DMA buffers.
        dma_copy,
        PCIEIPC_IOC_DMA_COPY,
        pcieipc_dma_copy
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_DMA_WAIT`: waits for a copy's ticket.
        dma_wait,
        PCIEIPC_IOC_DMA_WAIT,
        pcieipc_dma_wait
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_LINK_STATUS`: the link above `bdf`.
        link_status,
        PCIEIPC_IOC_LINK_STATUS,
        pcieipc_link_status
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_LINK_RETRAIN`: retrains the link above `bdf`.
        link_retrain,
        PCIEIPC_IOC_LINK_RETRAIN,
        pcieipc_link_retrain
    );
    nix::ioctl_write_ptr_bad!(
        /// `PCIEIPC_IOC_WATCH`: adds or removes a watch.
        watch,
        PCIEIPC_IOC_WATCH,
        pcieipc_watch
    );
    nix::ioctl_readwrite_bad!(
        /// `PCIEIPC_IOC_RESET`: resets a bound device.
        reset,
        PCIEIPC_IOC_RESET,
        pcieipc_reset
    );
}

/// `PCIEIPC_MMAP_OFFSET(index, bar)` of the header (a function-like macro,
/// which bindgen does not translate): the mmap offset of a BAR's window.
pub const fn mmap_offset(index: u32, bar: u32) -> u64 {
    ((index as u64) << PCIEIPC_MMAP_INDEX_SHIFT) | ((bar as u64) << PCIEIPC_MMAP_BAR_SHIFT)
}
