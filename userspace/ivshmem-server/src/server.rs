//! The serving loop: admits peers, hands out the shared memory and eventfds in the order of
//! QEMU's contrib/ivshmem-server, and announces arrivals and departures to the other peers.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::protocol::{send_message, PROTOCOL_VERSION, REFUSED_VERSION, SHM_MESSAGE};
use crate::shm::create_shared_memory;
use crate::socket::ListeningSocket;
use crate::{Error, ServerConfig};

/// How long a send may wait for a client to make room in its socket buffer. A new peer gets
/// peers x vectors messages before QEMU has read any; a client that stops reading for this long
/// is dropped rather than stalling every other peer.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

struct Peer {
    id: u16,
    socket: UnixStream,
    /// Eventfd per interrupt vector; a write to vector_eventfds[v] interrupts this peer on v.
    vector_eventfds: Vec<EventFd>,
}

pub(crate) struct Server {
    socket: ListeningSocket,
    shm: OwnedFd,
    vectors: u16,
    max_peers: u16,
    peers: BTreeMap<u16, Peer>,
}

impl Server {
    pub(crate) fn bind(config: &ServerConfig) -> Result<Server, Error> {
        config.validate()?;
        let shm = create_shared_memory(config.shm_size)?;
        let socket = ListeningSocket::bind(&config.socket_path)?;
        Ok(Server {
            socket,
            shm,
            vectors: config.vectors,
            max_peers: config.max_peers,
            peers: BTreeMap::new(),
        })
    }

    pub(crate) fn socket_path(&self) -> &Path {
        self.socket.path()
    }

    /// Serves until `stop` becomes readable. Per-peer failures drop that peer and are reported
    /// on stderr; only failures of the listening socket or of poll end the loop with an error.
    pub(crate) fn serve_until(&mut self, stop: BorrowedFd) -> Result<(), Error> {
        loop {
            let ids: Vec<u16> = self.peers.keys().copied().collect();
            let mut poll_fds = Vec::with_capacity(2 + ids.len());
            poll_fds.push(PollFd::new(stop, PollFlags::POLLIN));
            poll_fds.push(PollFd::new(self.socket.as_fd(), PollFlags::POLLIN));
            poll_fds.extend(
                self.peers
                    .values()
                    .map(|peer| PollFd::new(peer.socket.as_fd(), PollFlags::POLLIN)),
            );
            match poll(&mut poll_fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(source) => {
                    return Err(Error::Poll {
                        path: self.socket_path().to_owned(),
                        source,
                    })
                }
            }
            let is_ready =
                |poll_fd: &PollFd| poll_fd.revents().is_some_and(|events| !events.is_empty());
            let stop_requested = is_ready(&poll_fds[0]);
            let connection_pending = is_ready(&poll_fds[1]);
            // The protocol is one-way: anything a peer sends, its hang-up included, ends it.
            let departed: Vec<u16> = ids
                .iter()
                .zip(&poll_fds[2..])
                .filter(|(_, poll_fd)| is_ready(poll_fd))
                .map(|(&id, _)| id)
                .collect();

            if stop_requested {
                return Ok(());
            }
            for id in departed {
                self.disconnect(id);
            }
            if connection_pending {
                while let Some(stream) = self.socket.accept()? {
                    self.admit(stream);
                }
            }
        }
    }

    fn lowest_free_id(&self) -> Option<u16> {
        (0..self.max_peers).find(|id| !self.peers.contains_key(id))
    }

    fn admit(&mut self, stream: UnixStream) {
        let Some(id) = self.lowest_free_id() else {
            report(&Error::PeersFull {
                path: self.socket_path().to_owned(),
                max_peers: self.max_peers,
            });
            // Best effort: the connection is closed right after, whether it arrived or not.
            let _ = send_message(stream.as_fd(), REFUSED_VERSION, None);
            return;
        };
        let peer = match self.new_peer(id, stream) {
            Ok(peer) => peer,
            Err(error) => {
                report(&error);
                return;
            }
        };
        // Not yet announced to anyone, so a failure here needs no disconnect notices.
        if let Err(error) = self.send_setup_head(&peer) {
            report(&error);
            return;
        }

        let mut failed = Vec::new();
        for other in self.peers.values() {
            if let Err(error) = send_vectors(other, peer.id, &peer.vector_eventfds) {
                report(&error);
                failed.push(other.id);
            }
        }
        // Others' eventfds first, its own last: QEMU takes its own ID with fds as the
        // interrupt setup for receiving.
        let new_peer_result = self
            .peers
            .values()
            .try_for_each(|other| send_vectors(&peer, other.id, &other.vector_eventfds))
            .and_then(|()| send_vectors(&peer, peer.id, &peer.vector_eventfds));
        if let Err(error) = new_peer_result {
            report(&error);
            failed.push(peer.id);
        }
        self.peers.insert(peer.id, peer);
        for id in failed {
            self.disconnect(id);
        }
    }

    fn new_peer(&self, id: u16, socket: UnixStream) -> Result<Peer, Error> {
        socket
            .set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(|source| Error::ConfigurePeerSocket {
                peer_id: id,
                source,
            })?;
        let vector_eventfds = (0..self.vectors)
            .map(|vector| {
                EventFd::from_flags(EfdFlags::EFD_CLOEXEC).map_err(|source| {
                    Error::CreatePeerEventfd {
                        peer_id: id,
                        vector,
                        source,
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Peer {
            id,
            socket,
            vector_eventfds,
        })
    }

    /// Version, the peer's own id, then the shared memory.
    fn send_setup_head(&self, peer: &Peer) -> Result<(), Error> {
        let send_error = |source| Error::SendToPeer {
            peer_id: peer.id,
            source,
        };
        let socket = peer.socket.as_fd();
        send_message(socket, PROTOCOL_VERSION, None).map_err(send_error)?;
        send_message(socket, i64::from(peer.id), None).map_err(send_error)?;
        send_message(socket, SHM_MESSAGE, Some(self.shm.as_fd())).map_err(send_error)
    }

    /// Closes the peer, then tells the remaining peers its id (without an fd). A peer that
    /// cannot be told is disconnected in turn.
    fn disconnect(&mut self, id: u16) {
        let mut pending = vec![id];
        while let Some(id) = pending.pop() {
            // Already gone when it failed more than once in one round.
            let Some(peer) = self.peers.remove(&id) else {
                continue;
            };
            drop(peer);
            for other in self.peers.values() {
                if let Err(source) = send_message(other.socket.as_fd(), i64::from(id), None) {
                    report(&Error::SendToPeer {
                        peer_id: other.id,
                        source,
                    });
                    pending.push(other.id);
                }
            }
        }
    }
}

impl Drop for Server {
    /// Like QEMU's server on exit: every peer is closed in turn and the rest are told.
    fn drop(&mut self) {
        let ids: Vec<u16> = self.peers.keys().copied().collect();
        for id in ids {
            self.disconnect(id);
        }
    }
}

/// `subject`'s id once per vector, each with that vector's eventfd, in vector order.
fn send_vectors(recipient: &Peer, subject: u16, vector_eventfds: &[EventFd]) -> Result<(), Error> {
    vector_eventfds.iter().try_for_each(|eventfd| {
        send_message(
            recipient.socket.as_fd(),
            i64::from(subject),
            Some(eventfd.as_fd()),
        )
        .map_err(|source| Error::SendToPeer {
            peer_id: recipient.id,
            source,
        })
    })
}

/// Failures that concern one peer do not stop the server; QEMU shows them only as a missing
/// peer, so they are written where the testbed's logs collect them.
fn report(error: &Error) {
    eprintln!("pcieipc-ivshmem-server: {error}");
}
