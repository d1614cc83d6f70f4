//! The segment's file: a memfd rank 0 creates at the rendezvous, sized,
//! zeroed and sealed, and the others check before they map it.

use std::os::fd::OwnedFd;

use super::layout::Layout;
use crate::engine::error::EngineError;
use crate::engine::transport::WindowSizes;

/// The name under which the segment appears in /proc/<pid>/maps and fd links
/// (`/memfd:pcieipc-engine`); tests look for it to prove nothing is left.
pub const SEGMENT_NAME: &str = "pcieipc-engine";

/// The seals rank 0 puts on the segment before handing it out: no rank can
/// shrink it under the others' mappings (which would SIGBUS them), grow it,
/// or lift the seals.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Creates the segment for `nranks` ranks (rank 0 does this once), sized and
/// sealed.
pub(crate) fn create_segment(nranks: usize, sizes: WindowSizes) -> Result<OwnedFd, EngineError> {
    let layout =
        Layout::new(nranks, sizes).map_err(|reason| EngineError::BadWindowSizes { reason })?;
    let io = |context: &'static str| {
        move |errno: nix::errno::Errno| EngineError::SharedMemory {
            bytes: layout.total,
            context,
            source: errno.into(),
        }
    };
    let fd = nix::sys::memfd::memfd_create(
        SEGMENT_NAME,
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC | nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(io("memfd_create"))?;
    // ftruncate leaves the memory sparse and zeroed: zero is every counter's
    // initial value, and pages are only allocated where ranks write.
    nix::unistd::ftruncate(&fd, layout.total as i64).map_err(io("ftruncate"))?;
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_ADD_SEALS(nix::fcntl::SealFlag::from_bits_truncate(SEALS)),
    )
    .map_err(io("seal"))?;
    Ok(fd)
}

/// Checks that the segment rank 0 sent is sealed and holds `layout`.
pub(crate) fn check_segment(fd: &OwnedFd, layout: &Layout) -> Result<(), EngineError> {
    let refused = |reason: String| EngineError::SharedMemory {
        bytes: layout.total,
        context: "checking the segment rank 0 sent",
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
    };
    let seals = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GET_SEALS)
        .map_err(|errno| refused(format!("it is not a sealable memfd ({errno})")))?;
    if seals & SEALS != SEALS {
        return Err(refused(format!("its seals are {seals:#x}, not {SEALS:#x}")));
    }
    let length = nix::sys::stat::fstat(fd)
        .map_err(|errno| refused(format!("fstat: {errno}")))?
        .st_size;
    if u64::try_from(length).map_or(true, |length| length < layout.total as u64) {
        return Err(refused(format!("it holds {length} bytes")));
    }
    Ok(())
}
