//! The server-to-client messages of QEMU's ivshmem protocol (docs/specs/ivshmem-spec.rst):
//! each is one int64 in little-endian, optionally accompanied by one fd through SCM_RIGHTS.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

/// First message on every connection; QEMU refuses any other value.
pub const PROTOCOL_VERSION: i64 = 0;
/// Sent in place of the version to a client the server has no peer id for, and the connection
/// closed. The spec's clients close on versions they can't handle, and QEMU fails the device
/// with "server sent version 9223372036854775807, expecting 0"; closing without it instead makes
/// QEMU (7.2 at least) spin on the end of file while realizing the device.
pub const REFUSED_VERSION: i64 = i64::MAX;
/// Value of the message that carries the shared-memory fd.
pub const SHM_MESSAGE: i64 = -1;

pub(crate) fn send_message(
    socket: BorrowedFd,
    value: i64,
    fd: Option<BorrowedFd>,
) -> Result<(), Errno> {
    let bytes = value.to_le_bytes();
    let iov = [IoSlice::new(&bytes)];
    let fds = fd.map(|fd| [fd.as_raw_fd()]);
    let cmsgs: &[ControlMessage] = match &fds {
        Some(fds) => &[ControlMessage::ScmRights(fds)],
        None => &[],
    };
    loop {
        // MSG_NOSIGNAL: a client that has gone away must cost an EPIPE, not a SIGPIPE that kills
        // the server.
        match sendmsg::<()>(
            socket.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(sent) if sent == bytes.len() => return Ok(()),
            // Only the send timeout cuts a blocking stream send short; the stream is then
            // out of step with the protocol, so it counts as a timed-out send.
            Ok(_) => return Err(Errno::EAGAIN),
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(errno),
        }
    }
}
