//! Rank 0's side of the rendezvous: it listens, admits every rank once,
//! and hands each the segment, the sizes and the pids.

use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{getsockopt, sendmsg, sockopt, ControlMessage, MsgFlags};

use super::meeting::{socket_name, Context, Joined};
use super::secret::{same_bytes, JobSecret};
use super::wire::{self, Hello};

use crate::engine::error::EngineError;
use crate::engine::transport::segment::memfd::create_segment;
use crate::engine::transport::WindowSizes;

/// How long a connection may take to say who it is before rank 0 drops it.
const HELLO_DEADLINE: Duration = Duration::from_secs(1);

/// A connection that has not yet said who it is.
struct Pending {
    stream: UnixStream,
    /// Its process, as the kernel saw it connect.
    pid: u32,
    deadline: Instant,
    hello: Vec<u8>,
}

/// What reading a pending connection gave.
enum Heard {
    Nothing,
    Hello(Hello),
    /// Closed, or sent what no rank sends: dropped.
    Junk,
}

impl Pending {
    /// Admits a new connection for its hello if it comes from a process of
    /// this user; `None` drops it.
    fn new(stream: UnixStream, uid: u32) -> Option<Pending> {
        let credentials = getsockopt(&stream, sockopt::PeerCredentials).ok()?;
        if credentials.uid() != uid || stream.set_nonblocking(true).is_err() {
            return None;
        }
        Some(Pending {
            stream,
            pid: u32::try_from(credentials.pid()).ok()?,
            deadline: Instant::now() + HELLO_DEADLINE,
            hello: Vec::with_capacity(wire::HELLO_BYTES),
        })
    }

    fn read(&mut self) -> Heard {
        let mut buffer = [0u8; wire::HELLO_BYTES];
        let wanted = wire::HELLO_BYTES - self.hello.len();
        match self.stream.read(&mut buffer[..wanted]) {
            Ok(0) => Heard::Junk,
            Ok(read) => {
                self.hello.extend_from_slice(&buffer[..read]);
                if self.hello.len() < wire::HELLO_BYTES {
                    return Heard::Nothing;
                }
                Hello::decode(&self.hello).map_or(Heard::Junk, Heard::Hello)
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => Heard::Nothing,
            Err(_) => Heard::Junk,
        }
    }
}

/// Waits until the listener or a pending connection is readable, or `timeout`.
fn wait_readable(listener: &UnixListener, pending: &[Pending], timeout: Duration) {
    let mut fds: Vec<PollFd> = std::iter::once(listener.as_fd())
        .chain(pending.iter().map(|pending| pending.stream.as_fd()))
        .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
        .collect();
    let timeout =
        PollTimeout::try_from(timeout.as_millis().max(1) as u64).unwrap_or(PollTimeout::MAX);
    let _ = poll(&mut fds, timeout);
}

fn refuse(stream: &mut UnixStream, reason: u32, rank: usize, detail: u64) {
    // The refused rank learns why from this; if it is gone already there is
    // nobody left to tell.
    let _ = stream.set_nonblocking(false);
    let _ = stream.write_all(&wire::refusal(reason, rank, detail));
}

/// Rank 0: listens, runs `prepare` (what must be ready before anyone is
/// admitted), admits the other ranks, creates and hands out the segment. If
/// `prepare` fails, every rank that joins within `join_timeout` is told so at
/// once (`EngineError::HostFailed`) instead of waiting out its own timeout,
/// and rank 0 returns the failure.
pub(crate) fn host<T>(
    name: &str,
    secret: Option<&JobSecret>,
    nranks: usize,
    sizes: WindowSizes,
    join_timeout: Duration,
    prepare: impl FnOnce() -> Result<T, EngineError>,
) -> Result<(Joined, T), EngineError> {
    let cx = Context { name };
    let started = Instant::now();
    let mut pids = vec![0u32; nranks];
    pids[0] = std::process::id();
    if nranks == 1 {
        let prepared = prepare()?;
        let segment = create_segment(nranks, sizes)?;
        let joined = Joined {
            segment,
            sizes,
            pids,
        };
        return Ok((joined, prepared));
    }
    let address =
        SocketAddr::from_abstract_name(socket_name(name, secret)).map_err(cx.io("socket name"))?;
    let listener = UnixListener::bind_addr(&address).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            EngineError::RendezvousInUse {
                name: name.to_owned(),
            }
        } else {
            cx.io("bind")(source)
        }
    })?;
    listener.set_nonblocking(true).map_err(cx.io("listen"))?;
    let uid = nix::unistd::getuid().as_raw();
    // A job without a secret admits the ranks that present none (zeros).
    let our_secret = secret.map_or([0; 16], JobSecret::bytes);
    let prepared = prepare();
    let mut joined: Vec<Option<UnixStream>> = (0..nranks).map(|_| None).collect();
    let mut pending: Vec<Pending> = Vec::new();
    let mut outcome: Result<(), EngineError> = Ok(());
    'admit: while joined.iter().skip(1).any(Option::is_none) {
        let remaining = join_timeout.saturating_sub(started.elapsed());
        if remaining.is_zero() {
            if prepared.is_err() {
                // The ranks still missing will give up at their own timeout.
                break;
            }
            let missing = (1..nranks)
                .find(|rank| joined[*rank].is_none())
                .expect("a rank is missing");
            outcome = Err(EngineError::RankNeverJoined {
                rank: missing,
                waited: join_timeout,
            });
            break;
        }
        let now = Instant::now();
        let next_deadline = pending
            .iter()
            .map(|pending| pending.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(remaining);
        wait_readable(
            &listener,
            &pending,
            remaining.min(next_deadline).min(Duration::from_millis(50)),
        );
        loop {
            match listener.accept() {
                Ok((stream, _)) => pending.extend(Pending::new(stream, uid)),
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(err) => return Err(cx.io("accept")(err)),
            }
        }
        let mut index = 0;
        while index < pending.len() {
            let hello = match pending[index].read() {
                Heard::Nothing if Instant::now() < pending[index].deadline => {
                    index += 1;
                    continue;
                }
                Heard::Nothing | Heard::Junk => {
                    pending.swap_remove(index);
                    continue;
                }
                Heard::Hello(hello) => hello,
            };
            let Pending {
                mut stream, pid, ..
            } = pending.swap_remove(index);
            let rank = hello.rank;
            if !same_bytes(&our_secret, &hello.secret) {
                refuse(&mut stream, wire::REFUSED_SECRET, rank, 0);
                continue;
            }
            if hello.nranks != nranks {
                refuse(&mut stream, wire::REFUSED_RANK_COUNT, rank, nranks as u64);
                outcome = Err(EngineError::RankCountMismatch {
                    rank,
                    its_nranks: hello.nranks,
                    nranks,
                });
                break 'admit;
            }
            if rank == 0 || rank >= nranks || joined[rank].is_some() {
                refuse(&mut stream, wire::REFUSED_DUPLICATE, rank, 0);
                outcome = Err(EngineError::DuplicateRank { rank });
                break 'admit;
            }
            if prepared.is_err() {
                refuse(&mut stream, wire::REFUSED_HOST_FAILED, 0, 0);
            }
            stream.set_nonblocking(false).map_err(cx.io("accept"))?;
            pids[rank] = pid;
            joined[rank] = Some(stream);
        }
    }
    let prepared = prepared?;
    if let Err(error) = outcome {
        // Everyone who did join learns why the job cannot start.
        let (reason, rank, detail) = match &error {
            EngineError::RankNeverJoined { rank, waited } => {
                (wire::REFUSED_NEVER_JOINED, *rank, waited.as_millis() as u64)
            }
            EngineError::RankCountMismatch {
                rank, its_nranks, ..
            } => (wire::REFUSED_RANK_COUNT, *rank, *its_nranks as u64),
            EngineError::DuplicateRank { rank } => (wire::REFUSED_DUPLICATE, *rank, 0),
            _ => unreachable!("only refusals are recorded as outcomes"),
        };
        for stream in joined.iter_mut().flatten() {
            refuse(stream, reason, rank, detail);
        }
        return Err(error);
    }
    drop(listener);
    let segment = create_segment(nranks, sizes)?;
    let welcome = wire::welcome(sizes, &pids);
    for stream in joined.iter().flatten() {
        let fds = [segment.as_raw_fd()];
        sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&welcome)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|errno| cx.io("send welcome")(errno.into()))?;
    }
    let joined = Joined {
        segment,
        sizes,
        pids,
    };
    Ok((joined, prepared))
}
