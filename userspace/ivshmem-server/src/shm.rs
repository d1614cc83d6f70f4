//! The shared memory every peer maps as BAR2: an anonymous memfd, so nothing is left in
//! /dev/shm when the server and its clients are gone.

use std::os::fd::OwnedFd;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::unistd::ftruncate;

use crate::Error;

pub(crate) fn create_shared_memory(size: u64) -> Result<OwnedFd, Error> {
    let memfd = memfd_create(
        c"pcieipc-ivshmem",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(|source| Error::CreateShm { source })?;
    let length = i64::try_from(size).map_err(|_| Error::SizeShm {
        size,
        source: Errno::EFBIG,
    })?;
    ftruncate(&memfd, length).map_err(|source| Error::SizeShm { size, source })?;
    // Every peer maps the full size; a client that shrank the memfd would make the others'
    // accesses fault with SIGBUS, so the size is sealed before any client sees the fd.
    fcntl(
        &memfd,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(|source| Error::SealShm { source })?;
    Ok(memfd)
}
