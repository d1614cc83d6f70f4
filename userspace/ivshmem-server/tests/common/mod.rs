//! The client side of QEMU's ivshmem protocol, as QEMU's ivshmem-doorbell device speaks it, plus
//! scratch directories for the tests' sockets.

#![allow(dead_code)] // Each test binary uses its own part of these helpers.

use std::collections::BTreeMap;
use std::fs;
use std::io::{IoSliceMut, Write};
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

/// Long enough for a loaded CI machine, short enough that a protocol bug fails instead of hangs.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(10);

/// A directory under the system temp dir, removed with its contents on drop.
pub struct TestDir {
    pub path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        let path = std::env::temp_dir().join(format!("pcieipc-ivs-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TestDir { path }
    }

    pub fn socket(&self) -> PathBuf {
        self.path.join("ivshmem.sock")
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// One server message: the int64 and the fd that came with it, if any.
#[derive(Debug)]
pub struct Message {
    pub value: i64,
    pub fd: Option<OwnedFd>,
}

/// What a client holds once the server has sent its connect-time messages.
pub struct Handshake {
    pub version: i64,
    pub id: i64,
    pub shm: OwnedFd,
    /// Existing peers' eventfds by peer id, in vector order (messages step 4).
    pub peers: BTreeMap<i64, Vec<OwnedFd>>,
    /// This client's own eventfds, in vector order (messages step 5).
    pub own_vectors: Vec<OwnedFd>,
}

pub struct TestClient {
    pub stream: UnixStream,
}

impl TestClient {
    pub fn connect(socket: &Path) -> TestClient {
        let stream = UnixStream::connect(socket).unwrap();
        stream.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
        TestClient { stream }
    }

    /// Connects as soon as a server started in another process listens.
    pub fn connect_when_listening(socket: &Path) -> TestClient {
        let deadline = Instant::now() + RECV_TIMEOUT;
        loop {
            match UnixStream::connect(socket) {
                Ok(stream) => {
                    stream.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
                    return TestClient { stream };
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(error) => panic!("{}: server never listened: {error}", socket.display()),
            }
        }
    }

    /// The next message, or None when the server closed the connection (a reset when it
    /// closed with bytes from us unread).
    pub fn recv(&self) -> Option<Message> {
        let mut bytes = [0u8; 8];
        let mut iov = [IoSliceMut::new(&mut bytes)];
        let mut cmsg_space = nix::cmsg_space!([RawFd; 1]);
        let (length, fds) = {
            let msg = match recvmsg::<()>(
                self.stream.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg_space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(msg) => msg,
                Err(Errno::ECONNRESET) => return None,
                Err(errno) => panic!("recvmsg from the server: {errno}"),
            };
            let fds: Vec<RawFd> = msg
                .cmsgs()
                .expect("control messages fit")
                .flat_map(|cmsg| match cmsg {
                    ControlMessageOwned::ScmRights(fds) => fds,
                    other => panic!("unexpected control message {other:?}"),
                })
                .collect();
            (msg.bytes, fds)
        };
        // SAFETY: SCM_RIGHTS just installed these fds in this process and nothing else owns them.
        let mut owned: Vec<OwnedFd> = fds
            .into_iter()
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        if length == 0 {
            assert!(owned.is_empty(), "fd without a message");
            return None;
        }
        assert_eq!(length, 8, "short message");
        assert!(owned.len() <= 1, "more than one fd with a message");
        Some(Message {
            value: i64::from_le_bytes(bytes),
            fd: owned.pop(),
        })
    }

    pub fn recv_message(&self) -> Message {
        self.recv().expect("server closed the connection")
    }

    /// Reads the connect-time messages for a server with `existing_peers` other peers.
    pub fn handshake(&self, existing_peers: usize, vectors: usize) -> Handshake {
        let version = self.recv_message();
        assert!(version.fd.is_none(), "version came with an fd");
        let id = self.recv_message();
        assert!(id.fd.is_none(), "own id came with an fd");
        let shm = self.recv_message();
        assert_eq!(shm.value, -1, "third message is not the shared memory");
        let mut peers: BTreeMap<i64, Vec<OwnedFd>> = BTreeMap::new();
        for _ in 0..existing_peers * vectors {
            let message = self.recv_message();
            assert_ne!(
                message.value, id.value,
                "own eventfds before the other peers'"
            );
            peers
                .entry(message.value)
                .or_default()
                .push(message.fd.expect("peer announcement without an eventfd"));
        }
        let own_vectors = (0..vectors)
            .map(|_| {
                let message = self.recv_message();
                assert_eq!(message.value, id.value, "interrupt setup for another id");
                message.fd.expect("interrupt setup without an eventfd")
            })
            .collect();
        Handshake {
            version: version.value,
            id: id.value,
            shm: shm.fd.expect("shared memory message without an fd"),
            peers,
            own_vectors,
        }
    }

    pub fn has_pending_message(&self) -> bool {
        is_readable(self.stream.as_fd())
    }
}

pub fn is_readable(fd: BorrowedFd) -> bool {
    let mut poll_fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut poll_fds, PollTimeout::ZERO).unwrap() == 1
}

/// Rings an eventfd the way QEMU does: writes the 8-byte integer 1.
pub fn ring(eventfd: &OwnedFd) {
    let mut file = fs::File::from(eventfd.try_clone().unwrap());
    file.write_all(&1u64.to_ne_bytes()).unwrap();
}

/// Reads an eventfd's counter (resetting it); the caller checks it is readable first, since the
/// server's eventfds block.
pub fn read_counter(eventfd: &OwnedFd) -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let mut file = fs::File::from(eventfd.try_clone().unwrap());
    file.read_exact(&mut bytes).unwrap();
    u64::from_ne_bytes(bytes)
}

/// A shared mapping of a whole shared-memory fd.
pub struct Mapping {
    address: NonNull<std::ffi::c_void>,
    length: usize,
}

impl Mapping {
    pub fn new(fd: &OwnedFd, length: usize) -> Mapping {
        // SAFETY: a fresh shared mapping chosen by the kernel; it aliases nothing in this process.
        let address = unsafe {
            mmap(
                None,
                NonZeroUsize::new(length).unwrap(),
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                0,
            )
        }
        .unwrap();
        Mapping { address, length }
    }

    pub fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.length);
        for (index, byte) in bytes.iter().enumerate() {
            // SAFETY: in bounds (checked above) of a live mapping; volatile because another
            // mapping of the same memory reads it.
            unsafe {
                self.address
                    .cast::<u8>()
                    .add(offset + index)
                    .write_volatile(*byte)
            };
        }
    }

    pub fn read(&self, offset: usize, length: usize) -> Vec<u8> {
        assert!(offset + length <= self.length);
        // SAFETY: in bounds (checked above) of a live mapping.
        (0..length)
            .map(|index| unsafe {
                self.address
                    .cast::<u8>()
                    .add(offset + index)
                    .read_volatile()
            })
            .collect()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in new, which nothing references any more.
        unsafe { munmap(self.address, self.length) }.unwrap();
    }
}

/// Open fds of this process.
pub fn open_fd_count() -> usize {
    fs::read_dir("/proc/self/fd").unwrap().count()
}
