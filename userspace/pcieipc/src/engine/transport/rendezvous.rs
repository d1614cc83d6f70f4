//! The rendezvous: ranks meet on an abstract Unix socket named after the job,
//! rank 0 checks that every rank joined exactly once for the same rank count,
//! and hands each the transport's shared segment (a memfd, over SCM_RIGHTS),
//! the agreed window sizes and every rank's pid (for liveness).
//!
//! The socket is in Linux's abstract namespace, so nothing is left in the file
//! system whatever happens to the ranks; it is closed as soon as everyone has
//! joined.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::{shm, WindowSizes};
use crate::engine::error::EngineError;

const MAGIC: u32 = 0x5043_4945; // "PCIE"
const VERSION: u32 = 1;
const HELLO_BYTES: usize = 20;
/// How often a rank retries connecting while rank 0 is not listening yet.
const CONNECT_RETRY: Duration = Duration::from_micros(200);

const WELCOME_OK: u32 = 0;
const REFUSED_NEVER_JOINED: u32 = 1;
const REFUSED_DUPLICATE: u32 = 2;
const REFUSED_RANK_COUNT: u32 = 3;
const REFUSED_HOST_FAILED: u32 = 4;

/// What a rank leaves the rendezvous with.
pub(crate) struct Joined {
    pub segment: OwnedFd,
    pub sizes: WindowSizes,
    pub pids: Vec<u32>,
}

fn socket_name(name: &str) -> Vec<u8> {
    format!("pcieipc/{name}").into_bytes()
}

struct Context<'a> {
    name: &'a str,
}

impl Context<'_> {
    fn io(&self, context: &'static str) -> impl Fn(std::io::Error) -> EngineError + '_ {
        move |source| EngineError::RendezvousIo {
            name: self.name.to_owned(),
            context,
            source,
        }
    }

    fn protocol(&self, rank: usize, reason: impl Into<String>) -> EngineError {
        EngineError::RendezvousProtocol {
            name: self.name.to_owned(),
            rank,
            reason: reason.into(),
        }
    }
}

fn put_u32(bytes: &mut Vec<u8>, value: u32) {
    bytes.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut Vec<u8>, value: u64) {
    bytes.extend_from_slice(&value.to_le_bytes());
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Rank 0: listens, runs `prepare` (what must be ready before anyone is
/// admitted), admits the other ranks, creates and hands out the segment. If
/// `prepare` fails, every rank that joins within `join_timeout` is told so at
/// once (`EngineError::HostFailed`) instead of waiting out its own timeout,
/// and rank 0 returns the failure.
pub(crate) fn host<T>(
    name: &str,
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
        let segment = shm::create_segment(nranks, sizes)?;
        return Ok((
            Joined {
                segment,
                sizes,
                pids,
            },
            prepared,
        ));
    }
    let address =
        SocketAddr::from_abstract_name(socket_name(name)).map_err(cx.io("socket name"))?;
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
    let prepared = prepare();
    let mut joined: Vec<Option<UnixStream>> = (0..nranks).map(|_| None).collect();
    let mut outcome: Result<(), EngineError> = Ok(());
    while joined.iter().skip(1).any(Option::is_none) {
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
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                wait_readable(&listener, remaining.min(Duration::from_millis(50)));
                continue;
            }
            Err(err) => return Err(cx.io("accept")(err)),
        };
        stream.set_nonblocking(false).map_err(cx.io("accept"))?;
        stream
            .set_read_timeout(Some(remaining.max(Duration::from_millis(1))))
            .map_err(cx.io("accept"))?;
        let mut hello = [0u8; HELLO_BYTES];
        if stream.read_exact(&mut hello).is_err() {
            // A process that connects and does not say who it is is not a rank.
            continue;
        }
        let (magic, version) = (u32_at(&hello, 0), u32_at(&hello, 4));
        let rank = u32_at(&hello, 8) as usize;
        let its_nranks = u32_at(&hello, 12) as usize;
        if magic != MAGIC || version != VERSION {
            return Err(cx.protocol(rank, format!("bad magic {magic:#x} or version {version}")));
        }
        if its_nranks != nranks {
            refuse(&mut stream, REFUSED_RANK_COUNT, rank, nranks as u64);
            outcome = Err(EngineError::RankCountMismatch {
                rank,
                its_nranks,
                nranks,
            });
            break;
        }
        if rank == 0 || rank >= nranks || joined[rank].is_some() {
            refuse(&mut stream, REFUSED_DUPLICATE, rank, 0);
            outcome = Err(EngineError::DuplicateRank { rank });
            break;
        }
        if prepared.is_err() {
            refuse(&mut stream, REFUSED_HOST_FAILED, 0, 0);
        }
        pids[rank] = u32_at(&hello, 16);
        joined[rank] = Some(stream);
    }
    let prepared = prepared?;
    if let Err(error) = outcome {
        // Everyone who did join learns why the job cannot start.
        let (reason, rank, detail) = match &error {
            EngineError::RankNeverJoined { rank, waited } => {
                (REFUSED_NEVER_JOINED, *rank, waited.as_millis() as u64)
            }
            EngineError::RankCountMismatch {
                rank, its_nranks, ..
            } => (REFUSED_RANK_COUNT, *rank, *its_nranks as u64),
            EngineError::DuplicateRank { rank } => (REFUSED_DUPLICATE, *rank, 0),
            _ => unreachable!("only refusals are recorded as outcomes"),
        };
        for stream in joined.iter_mut().flatten() {
            refuse(stream, reason, rank, detail);
        }
        return Err(error);
    }
    drop(listener);
    let segment = shm::create_segment(nranks, sizes)?;
    let mut welcome = Vec::new();
    put_u32(&mut welcome, MAGIC);
    put_u32(&mut welcome, WELCOME_OK);
    put_u64(&mut welcome, sizes.slot_bytes as u64);
    put_u64(&mut welcome, sizes.raw_slots as u64);
    put_u64(&mut welcome, sizes.relay_slots as u64);
    put_u64(&mut welcome, sizes.one_shot_bytes as u64);
    for pid in &pids {
        put_u32(&mut welcome, *pid);
    }
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
    Ok((
        Joined {
            segment,
            sizes,
            pids,
        },
        prepared,
    ))
}

fn wait_readable(listener: &UnixListener, timeout: Duration) {
    use std::os::fd::AsFd;
    let mut fds = [nix::poll::PollFd::new(
        listener.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    let timeout = nix::poll::PollTimeout::try_from(timeout.as_millis().max(1) as u64)
        .unwrap_or(nix::poll::PollTimeout::MAX);
    let _ = nix::poll::poll(&mut fds, timeout);
}

fn refuse(stream: &mut UnixStream, reason: u32, rank: usize, detail: u64) {
    let mut message = Vec::new();
    put_u32(&mut message, MAGIC);
    put_u32(&mut message, reason);
    put_u64(&mut message, rank as u64);
    put_u64(&mut message, detail);
    // The refused rank learns why from this; if it is gone already there is
    // nobody left to tell.
    let _ = stream.write_all(&message);
}

/// Ranks 1..N: join rank 0 and receive the segment.
pub(crate) fn join(
    name: &str,
    rank: usize,
    nranks: usize,
    join_timeout: Duration,
) -> Result<Joined, EngineError> {
    let cx = Context { name };
    let started = Instant::now();
    let address =
        SocketAddr::from_abstract_name(socket_name(name)).map_err(cx.io("socket name"))?;
    let mut stream = loop {
        match UnixStream::connect_addr(&address) {
            Ok(stream) => break stream,
            Err(_) if started.elapsed() < join_timeout => std::thread::sleep(CONNECT_RETRY),
            Err(_) => {
                return Err(EngineError::RankNeverJoined {
                    rank: 0,
                    waited: join_timeout,
                })
            }
        }
    };
    let mut hello = Vec::new();
    for word in [
        MAGIC,
        VERSION,
        rank as u32,
        nranks as u32,
        std::process::id(),
    ] {
        put_u32(&mut hello, word);
    }
    stream.write_all(&hello).map_err(cx.io("send hello"))?;
    // Rank 0 answers once all ranks joined, at most its own join timeout after
    // it started listening, which was no earlier than our connect.
    stream
        .set_read_timeout(Some(join_timeout + Duration::from_secs(1)))
        .map_err(cx.io("wait for welcome"))?;
    let welcome_bytes = 8 + 4 * 8 + 4 * nranks;
    let mut welcome = vec![0u8; welcome_bytes];
    let (received, segment) =
        receive_with_fd(&stream, &mut welcome).map_err(cx.io("wait for welcome"))?;
    if received < 8 {
        return Err(cx.io("wait for welcome")(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "rank 0 closed the rendezvous before welcoming this rank",
        )));
    }
    if u32_at(&welcome, 0) != MAGIC {
        return Err(cx.protocol(0, "bad magic in welcome"));
    }
    let status = u32_at(&welcome, 4);
    if status != WELCOME_OK {
        let mut rest = [0u8; 16];
        rest[..received.min(24) - 8].copy_from_slice(&welcome[8..received.min(24)]);
        if received < 24 {
            stream
                .read_exact(&mut rest[received - 8..])
                .map_err(cx.io("read refusal"))?;
        }
        let about = u64_at(&rest, 0) as usize;
        let detail = u64_at(&rest, 8);
        return Err(match status {
            REFUSED_NEVER_JOINED => EngineError::RankNeverJoined {
                rank: about,
                waited: Duration::from_millis(detail),
            },
            // The offender is told rank 0's count, the others the offender's.
            REFUSED_RANK_COUNT if about == rank => EngineError::RankCountMismatch {
                rank,
                its_nranks: nranks,
                nranks: detail as usize,
            },
            REFUSED_RANK_COUNT => EngineError::RankCountMismatch {
                rank: about,
                its_nranks: detail as usize,
                nranks,
            },
            REFUSED_DUPLICATE => EngineError::DuplicateRank { rank: about },
            REFUSED_HOST_FAILED => EngineError::HostFailed {
                name: name.to_owned(),
            },
            _ => cx.protocol(0, format!("unknown welcome status {status}")),
        });
    }
    if received < welcome_bytes {
        stream
            .read_exact(&mut welcome[received..])
            .map_err(cx.io("read welcome"))?;
    }
    let segment = segment.ok_or_else(|| cx.protocol(0, "welcome carried no segment descriptor"))?;
    let sizes = WindowSizes {
        slot_bytes: u64_at(&welcome, 8) as usize,
        raw_slots: u64_at(&welcome, 16) as usize,
        relay_slots: u64_at(&welcome, 24) as usize,
        one_shot_bytes: u64_at(&welcome, 32) as usize,
    };
    let pids = (0..nranks)
        .map(|peer| u32_at(&welcome, 40 + 4 * peer))
        .collect();
    Ok(Joined {
        segment,
        sizes,
        pids,
    })
}

/// One recvmsg: the bytes it returned and the descriptor that came with them.
fn receive_with_fd(
    stream: &UnixStream,
    buffer: &mut [u8],
) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let mut space = nix::cmsg_space!(RawFd);
    let mut iov = [IoSliceMut::new(buffer)];
    let message = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut segment = None;
    for cmsg in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: SCM_RIGHTS installed this descriptor in our table for us.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                segment.get_or_insert(owned);
            }
        }
    }
    Ok((message.bytes, segment))
}
