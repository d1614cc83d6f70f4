//! The rendezvous against hostile or broken peers: rank 0 sending random
//! welcomes and segments, connections that say nothing or something else.

use std::io::{IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::sys::socket::{getsockopt, sendmsg, sockopt, ControlMessage, MsgFlags};

use super::super::config::{Setup, TransportConfig};
use super::super::shm::ShmOptions;
use super::super::WindowSizes;
use super::meeting::socket_name;
use super::wire::{self, Hello};
use super::{host, join, JobSecret};
use crate::engine::error::EngineError;
use crate::engine::transport::segment::memfd::create_segment;

/// xorshift64*: a reproducible stream of test values.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

const PAGE: usize = 4096;

fn plausible_sizes(random: &mut Random) -> WindowSizes {
    WindowSizes {
        slot_bytes: PAGE * (1 + random.below(4) as usize),
        raw_slots: 1 + random.below(3) as usize,
        relay_slots: 1 + random.below(3) as usize,
        one_shot_bytes: PAGE * (1 + random.below(2) as usize),
        backend_bytes: PAGE * random.below(2) as usize,
    }
}

/// One welcome from a hostile rank 0: sometimes the right header, pids and
/// sizes with a wrong segment, sometimes random words, sometimes cut short.
fn hostile_welcome(random: &mut Random, joiner: u32, nranks: usize) -> (Vec<u8>, WindowSizes) {
    let sizes = plausible_sizes(random);
    let mut pids = vec![std::process::id(); nranks];
    pids[1] = joiner;
    let mut welcome = wire::welcome(sizes, &pids);
    match random.below(6) {
        // Random sizes: huge, zero, unaligned, overflowing.
        0 => {
            for at in [8, 16, 24, 32, 40] {
                let value = match random.below(4) {
                    0 => random.next(),
                    1 => 0,
                    2 => u64::MAX - random.below(PAGE as u64),
                    _ => random.below(1 << 20),
                };
                welcome[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
        }
        // Random pids.
        1 => {
            let at = wire::WELCOME_HEAD_BYTES + 4 * random.below(nranks as u64) as usize;
            welcome[at..at + 4].copy_from_slice(&(random.next() as u32).to_le_bytes());
        }
        // Random bytes anywhere, the status included.
        2 => {
            for _ in 0..1 + random.below(8) {
                let at = random.below(welcome.len() as u64) as usize;
                welcome[at] = random.next() as u8;
            }
        }
        // Cut short.
        3 => welcome.truncate(random.below(welcome.len() as u64) as usize),
        // The right welcome: the segment sent with it is what is wrong.
        _ => {}
    }
    (welcome, sizes)
}

/// Plays rank 0 of `name` for one joiner: takes its hello and answers with
/// `welcome` and, by `random`, a segment of the right size and seals, an
/// unsealed or short one, or none.
fn serve(listener: &UnixListener, random: &mut Random, nranks: usize) {
    let (mut stream, _) = listener.accept().expect("accept");
    let mut hello = [0u8; wire::HELLO_BYTES];
    stream.read_exact(&mut hello).expect("hello");
    let credentials = getsockopt(&stream, sockopt::PeerCredentials).expect("joiner's credentials");
    let (welcome, sizes) = hostile_welcome(random, credentials.pid() as u32, nranks);
    let segment = match random.below(4) {
        0 => None,
        1 => {
            // Unsealed, of the right size.
            let fd =
                nix::sys::memfd::memfd_create("hostile", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                    .expect("memfd");
            nix::unistd::ftruncate(&fd, (64 << 20) as i64).expect("ftruncate");
            Some(fd)
        }
        2 => {
            // Sealed, but for fewer ranks' windows than the welcome claims.
            Some(create_segment(1, sizes).expect("segment"))
        }
        _ => Some(create_segment(nranks, sizes).expect("segment")),
    };
    let fds: Vec<i32> = segment.iter().map(|fd| fd.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&fds)];
    let _ = sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&welcome)],
        if fds.is_empty() { &[] } else { &rights },
        MsgFlags::MSG_NOSIGNAL,
        None,
    );
}

/// 10,000 hostile welcomes: the joining rank gets an error (or, for the few
/// welcomes that are whole and right, a working transport), never a panic or
/// a hang, and maps nothing it was not promised.
#[test]
fn a_hostile_rank_0_gets_errors_not_crashes() {
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let name = format!("hostile-welcome-{}", std::process::id());
    let address = SocketAddr::from_abstract_name(socket_name(&name, None)).unwrap();
    let listener = UnixListener::bind_addr(&address).unwrap();
    let (mut refused, mut accepted) = (0, 0);
    for round in 0..10_000 {
        let nranks = 2 + (round % 3);
        let joiner = {
            let name = name.clone();
            std::thread::spawn(move || {
                let setup = Setup {
                    rendezvous: &name,
                    rank: 1,
                    nranks,
                    sizes: WindowSizes {
                        slot_bytes: PAGE,
                        raw_slots: 1,
                        relay_slots: 1,
                        one_shot_bytes: PAGE,
                        backend_bytes: 0,
                    },
                    join_timeout: Duration::from_secs(5),
                    secret: None,
                };
                // The transport's own watch of peer 0 and others: all of them
                // are this process, so liveness holds.
                ShmOptions.open(&setup).map(drop)
            })
        };
        serve(&listener, &mut random, nranks);
        match joiner.join().expect("the joining rank panicked") {
            Ok(()) => accepted += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 5_000, "{refused} refused, {accepted} accepted");
    assert!(accepted > 0, "no whole welcome was accepted");
}

/// Connections that say nothing, or junk, or come from another user, do
/// not hold up the ranks that do join, and are dropped.
#[test]
fn silent_and_junk_connections_do_not_stall_the_rendezvous() {
    let name = format!("silent-{}", std::process::id());
    let address = SocketAddr::from_abstract_name(socket_name(&name, None)).unwrap();
    let host = {
        let name = name.clone();
        std::thread::spawn(move || {
            let sizes = WindowSizes {
                slot_bytes: PAGE,
                raw_slots: 1,
                relay_slots: 1,
                one_shot_bytes: PAGE,
                backend_bytes: 0,
            };
            host(&name, None, 2, sizes, Duration::from_secs(20), || Ok(()))
        })
    };
    let started = Instant::now();
    let connect = || loop {
        match UnixStream::connect_addr(&address) {
            Ok(stream) => break stream,
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    // Says nothing and stays connected.
    let _silent = connect();
    // Says something that is not a hello.
    let mut junk = connect();
    junk.write_all(&[0xff; wire::HELLO_BYTES]).unwrap();
    let joined = join(&name, None, 1, 2, Duration::from_secs(20)).expect("rank 1 joins");
    let (hosted, ()) = host.join().unwrap().expect("rank 0 admits rank 1");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the silent connection held the rendezvous up for {:?}",
        started.elapsed()
    );
    assert_eq!(joined.pids, hosted.pids);
    assert_eq!(joined.pids, vec![std::process::id(); 2]);
    // The junk connection was dropped: reading it ends.
    junk.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut byte = [0u8];
    assert_eq!(junk.read(&mut byte).map_err(|e| e.kind()), Ok(0));
}

/// A rank with another secret never reaches the job; with the same secret
/// under a colliding name tag it is refused by name.
#[test]
fn a_rank_without_the_job_secret_is_refused() {
    let name = format!("secret-{}", std::process::id());
    let secret = JobSecret::generate().unwrap();
    let other = JobSecret::generate().unwrap();
    let sizes = WindowSizes {
        slot_bytes: PAGE,
        raw_slots: 1,
        relay_slots: 1,
        one_shot_bytes: PAGE,
        backend_bytes: 0,
    };
    let host = {
        let name = name.clone();
        std::thread::spawn(move || {
            host(
                &name,
                Some(&secret),
                2,
                sizes,
                Duration::from_secs(3),
                || Ok(()),
            )
        })
    };
    let wrong = join(&name, Some(&other), 1, 2, Duration::from_millis(500));
    assert!(
        matches!(wrong, Err(EngineError::RankNeverJoined { rank: 0, .. })),
        "{:?}",
        wrong.err()
    );
    // Same socket, wrong hello: refused with the reason.
    let address = SocketAddr::from_abstract_name(socket_name(&name, Some(&secret))).unwrap();
    let mut stream = UnixStream::connect_addr(&address).unwrap();
    let hello = Hello {
        rank: 1,
        nranks: 2,
        secret: other.bytes(),
    };
    stream.write_all(&hello.encode()).unwrap();
    let mut refusal = [0u8; wire::REFUSAL_BYTES];
    stream.read_exact(&mut refusal).unwrap();
    assert_eq!(wire::u32_at(&refusal, 4), wire::REFUSED_SECRET);
    let joined =
        join(&name, Some(&secret), 1, 2, Duration::from_secs(3)).expect("the right secret joins");
    assert_eq!(joined.sizes, sizes);
    host.join().unwrap().expect("rank 0");
}
