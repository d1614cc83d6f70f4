//! Ranks 1..N: join rank 0 and receive the segment.

use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant};

use nix::sys::socket::{getsockopt, recvmsg, sockopt, ControlMessageOwned, MsgFlags};

use super::meeting::{socket_name, Context, Joined};
use super::secret::JobSecret;
use super::wire::{self, u32_at, u64_at, Hello};
use crate::engine::error::EngineError;
use crate::engine::transport::segment::Layout;

/// How often a rank retries connecting while rank 0 is not listening yet.
const CONNECT_RETRY: Duration = Duration::from_micros(200);

/// Joins rank 0 of `name` as `rank` of `nranks`.
pub(crate) fn join(
    name: &str,
    secret: Option<&JobSecret>,
    rank: usize,
    nranks: usize,
    join_timeout: Duration,
) -> Result<Joined, EngineError> {
    let cx = Context { name };
    let started = Instant::now();
    let address =
        SocketAddr::from_abstract_name(socket_name(name, secret)).map_err(cx.io("socket name"))?;
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
    // Whoever listens is rank 0 only if it is this user's process: another
    // user may have bound the name first to take the job's data.
    let host = getsockopt(&stream, sockopt::PeerCredentials)
        .map_err(|errno| cx.io("peer credentials")(errno.into()))?;
    if host.uid() != nix::unistd::getuid().as_raw() {
        return Err(EngineError::RendezvousForeign {
            name: name.to_owned(),
            uid: host.uid(),
            pid: host.pid(),
        });
    }
    let hello = Hello {
        rank,
        nranks,
        secret: secret.map_or([0; 16], JobSecret::bytes),
    };
    stream
        .write_all(&hello.encode())
        .map_err(cx.io("send hello"))?;
    // Rank 0 answers once all ranks joined, at most its own join timeout after
    // it started listening, which was no earlier than our connect.
    stream
        .set_read_timeout(Some(join_timeout + Duration::from_secs(1)))
        .map_err(cx.io("wait for welcome"))?;
    let welcome_bytes = wire::WELCOME_HEAD_BYTES + 4 * nranks;
    let mut welcome = vec![0u8; welcome_bytes.max(wire::REFUSAL_BYTES)];
    let (received, segment) =
        receive_with_fd(&stream, &mut welcome).map_err(cx.io("wait for welcome"))?;
    if received < 8 {
        return Err(cx.io("wait for welcome")(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "rank 0 closed the rendezvous before welcoming this rank",
        )));
    }
    if u32_at(&welcome, 0) != wire::MAGIC {
        return Err(cx.protocol(0, "bad magic in welcome"));
    }
    let status = u32_at(&welcome, 4);
    if status != wire::WELCOME_OK {
        if received < wire::REFUSAL_BYTES {
            stream
                .read_exact(&mut welcome[received..wire::REFUSAL_BYTES])
                .map_err(cx.io("read refusal"))?;
        }
        return Err(refusal(name, rank, nranks, status, &welcome));
    }
    if received < welcome_bytes {
        stream
            .read_exact(&mut welcome[received..welcome_bytes])
            .map_err(cx.io("read welcome"))?;
    }
    let segment = segment.ok_or_else(|| cx.protocol(0, "welcome carried no segment descriptor"))?;
    let (sizes, pids) = wire::welcome_contents(&welcome, nranks);
    Layout::new(nranks, sizes)
        .map_err(|reason| cx.protocol(0, format!("window sizes: {reason}")))?;
    // The pids are the kernel's: rank 0's as we saw it, ours as it saw us.
    let ours = std::process::id();
    if i32::try_from(pids[0]).ok() != Some(host.pid()) || pids[rank] != ours {
        return Err(cx.protocol(
            0,
            format!(
                "pids {} (rank 0) and {} (rank {rank}) are not those of the processes \
                 connected ({} and {ours})",
                pids[0],
                pids[rank],
                host.pid()
            ),
        ));
    }
    Ok(Joined {
        segment,
        sizes,
        pids,
    })
}

/// The error a refusal from rank 0 stands for.
fn refusal(name: &str, rank: usize, nranks: usize, status: u32, message: &[u8]) -> EngineError {
    let about = u64_at(message, 8) as usize;
    let detail = u64_at(message, 16);
    match status {
        wire::REFUSED_NEVER_JOINED => EngineError::RankNeverJoined {
            rank: about,
            waited: Duration::from_millis(detail),
        },
        // The offender is told rank 0's count, the others the offender's.
        wire::REFUSED_RANK_COUNT if about == rank => EngineError::RankCountMismatch {
            rank,
            its_nranks: nranks,
            nranks: detail as usize,
        },
        wire::REFUSED_RANK_COUNT => EngineError::RankCountMismatch {
            rank: about,
            its_nranks: detail as usize,
            nranks,
        },
        wire::REFUSED_DUPLICATE => EngineError::DuplicateRank { rank: about },
        wire::REFUSED_HOST_FAILED => EngineError::HostFailed {
            name: name.to_owned(),
        },
        wire::REFUSED_SECRET => EngineError::WrongSecret {
            name: name.to_owned(),
        },
        _ => Context { name }.protocol(0, format!("unknown welcome status {status}")),
    }
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
