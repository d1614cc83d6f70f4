//! Failures: a rank killed mid-operation, a rank that never joins, a rank that
//! stops calling, calls that differ across ranks, a buffer peers cannot read.
//! The other ranks must return
//! an error naming the rank concerned, within their timeout, and leave no
//! shared memory behind.

mod engine_support;

use std::time::{Duration, Instant};

use engine_support::{
    assert_only_victim_killed, assert_succeeded, dev_shm_segments, role, run_ranks,
    segment_references, spawn_ranks, wait_ranks, Role,
};
use pcieipc::engine::{
    Algorithm, AlgorithmChoice, CallKind, CommOptions, Communicator, DType, EngineError, ReduceOp,
};

const LIMIT: Duration = Duration::from_secs(60);

fn options(peer_timeout: Duration) -> CommOptions {
    CommOptions {
        join_timeout: Duration::from_secs(10),
        peer_timeout,
        ..CommOptions::default()
    }
}

fn assert_no_segment_left() {
    let left = segment_references();
    assert!(left.is_empty(), "segment still referenced: {left:?}");
}

/// A rank killed mid-operation: the others fail naming it within the
/// timeout, and no shared memory is left. 4 MiB messages: the automatic
/// choice, with the direct window at 4–16 MiB, sends them direct
/// (single-copy reads) or, forced, by the ring.
fn killed_rank(test: &str, algorithm: AlgorithmChoice) {
    const VICTIM: usize = 1;
    let peer_timeout = Duration::from_secs(20);
    if let Some(role) = role() {
        let mut comm = Communicator::init(
            &role.rendezvous,
            role.rank,
            role.nranks,
            CommOptions {
                algorithm,
                direct_messages: (4 << 20)..=(16 << 20),
                ..options(peer_timeout)
            },
        )
        .expect("init");
        let input = vec![1.0f32; 1 << 20];
        let mut output = vec![0.0f32; 1 << 20];
        let expected = match algorithm {
            AlgorithmChoice::Auto => Algorithm::Direct,
            AlgorithmChoice::Fixed(algorithm) => algorithm,
        };
        assert_eq!(comm.algorithm_for::<f32>(input.len()), expected);
        if role.rank == VICTIM {
            // Killed from a second thread while the main thread is inside a
            // stream of all_reduce calls: almost surely mid-operation.
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).expect("raise SIGKILL");
            });
        }
        let error = loop {
            let started = Instant::now();
            if let Err(error) = comm.all_reduce(&input, &mut output, ReduceOp::Sum) {
                break (error, started.elapsed());
            }
        };
        match error {
            (EngineError::PeerDied { rank: VICTIM, .. }, waited) => {
                assert!(waited < peer_timeout, "noticed after {waited:?}")
            }
            other => panic!(
                "rank {} expected PeerDied for rank {VICTIM}, got {other:?}",
                role.rank
            ),
        }
        // The communicator stays failed, with the same error.
        assert!(matches!(
            comm.all_reduce(&input, &mut output, ReduceOp::Sum),
            Err(EngineError::PeerDied { rank: VICTIM, .. })
        ));
        drop(comm);
        assert_no_segment_left();
        return;
    }
    let outputs = wait_ranks(spawn_ranks(test, 3, &[0, 1, 2]), LIMIT);
    assert_only_victim_killed(&outputs, VICTIM);
    assert_eq!(dev_shm_segments(), Vec::<String>::new());
}

#[test]
fn killed_rank_is_named_and_leaves_no_shared_memory() {
    killed_rank(
        "killed_rank_is_named_and_leaves_no_shared_memory",
        AlgorithmChoice::Auto,
    );
}

#[test]
fn killed_rank_mid_ring_is_named_and_leaves_no_shared_memory() {
    killed_rank(
        "killed_rank_mid_ring_is_named_and_leaves_no_shared_memory",
        AlgorithmChoice::Fixed(Algorithm::Ring),
    );
}

/// The first page of this process's vDSO data (`[vvar]`): readable here,
/// but a PFN mapping, which `process_vm_readv` cannot pin (EFAULT) — as a
/// buffer in a device's mapped BAR would be.
fn vdso_data_page() -> &'static [u8] {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let line = maps
        .lines()
        .find(|line| line.ends_with("[vvar]"))
        .expect("a [vvar] mapping in /proc/self/maps");
    let start = usize::from_str_radix(line.split('-').next().expect("range"), 16).expect("address");
    // SAFETY: the kernel maps the vDSO data page readable for the whole life
    // of the process, and nothing writes it from user space.
    unsafe { std::slice::from_raw_parts(start as *const u8, 4096) }
}

/// A rank whose input peers cannot read (the direct all_reduce reads it with
/// `process_vm_readv`): every rank fails at once with `PeerMemoryUnreadable`
/// naming the reader and the owner, not after the peer timeout as an
/// unresponsive peer.
#[test]
fn unreadable_peer_buffer_is_reported_at_once() {
    const OWNER: usize = 1;
    run_ranks(
        "unreadable_peer_buffer_is_reported_at_once",
        2,
        LIMIT,
        |role| {
            let peer_timeout = Duration::from_secs(20);
            let mut comm = Communicator::init(
                &role.rendezvous,
                role.rank,
                role.nranks,
                CommOptions {
                    algorithm: AlgorithmChoice::Fixed(Algorithm::Direct),
                    ..options(peer_timeout)
                },
            )
            .expect("init");
            let ordinary = vec![1u8; 4096];
            let input = if role.rank == OWNER {
                vdso_data_page()
            } else {
                &ordinary[..]
            };
            let mut output = vec![0u8; 4096];
            let started = Instant::now();
            match comm.all_reduce(input, &mut output, ReduceOp::Max) {
                Err(error @ EngineError::PeerMemoryUnreadable { rank: 0, owner: OWNER, errno }) => {
                    assert_eq!(errno, libc::EFAULT, "rank {}: {error}", role.rank);
                    assert!(
                        started.elapsed() < peer_timeout / 2,
                        "rank {}: reported after {:?}",
                        role.rank,
                        started.elapsed()
                    );
                    assert!(error.to_string().contains("--single-copy off"), "{error}");
                }
                other => panic!(
                    "rank {} expected PeerMemoryUnreadable (rank 0 reading rank {OWNER}), got {other:?}",
                    role.rank
                ),
            }
        },
    );
}

fn expect_never_joined(role: &Role, missing: usize) {
    let join_timeout = Duration::from_millis(500);
    let started = Instant::now();
    let result = Communicator::init(
        &role.rendezvous,
        role.rank,
        role.nranks,
        CommOptions {
            join_timeout,
            ..CommOptions::default()
        },
    );
    match result {
        Err(EngineError::RankNeverJoined { rank, .. }) => assert_eq!(rank, missing),
        Err(other) => panic!(
            "rank {} expected RankNeverJoined({missing}), got {other}",
            role.rank
        ),
        Ok(_) => panic!(
            "rank {} joined a communicator missing rank {missing}",
            role.rank
        ),
    }
    // Rank 0 gives up at its timeout; the others hear it from rank 0 or give
    // up connecting at theirs.
    let elapsed = started.elapsed();
    assert!(
        elapsed < join_timeout + Duration::from_secs(5),
        "gave up after {elapsed:?}"
    );
}

#[test]
fn rank_that_never_joins_is_named() {
    const TEST: &str = "rank_that_never_joins_is_named";
    if let Some(role) = role() {
        expect_never_joined(&role, 2);
        return;
    }
    assert_succeeded(&wait_ranks(spawn_ranks(TEST, 3, &[0, 1]), LIMIT));
}

#[test]
fn missing_rank_0_is_named() {
    const TEST: &str = "missing_rank_0_is_named";
    if let Some(role) = role() {
        expect_never_joined(&role, 0);
        return;
    }
    assert_succeeded(&wait_ranks(spawn_ranks(TEST, 3, &[1, 2]), LIMIT));
}

#[test]
fn rank_that_stops_calling_is_named_after_the_timeout() {
    run_ranks(
        "rank_that_stops_calling_is_named_after_the_timeout",
        3,
        LIMIT,
        |role| {
            const SLEEPER: usize = 2;
            // Long enough that a healthy rank descheduled on a busy 2-CPU
            // machine (three ranks and another test's share it) is not it.
            let peer_timeout = Duration::from_secs(1);
            let mut comm = Communicator::init(
                &role.rendezvous,
                role.rank,
                role.nranks,
                options(peer_timeout),
            )
            .expect("init");
            let mut buffer = vec![1i64; 100_000];
            comm.all_reduce_in_place(&mut buffer, ReduceOp::Sum)
                .expect("first call");
            assert!(buffer.iter().all(|value| *value == 3));
            if role.rank == SLEEPER {
                std::thread::sleep(peer_timeout * 4);
            }
            let started = Instant::now();
            match comm.all_reduce_in_place(&mut buffer, ReduceOp::Sum) {
                Err(EngineError::PeerUnresponsive { rank, waited }) => {
                    assert_eq!(rank, SLEEPER, "rank {} named the wrong rank", role.rank);
                    assert!(waited >= peer_timeout);
                }
                other => panic!(
                    "rank {} expected PeerUnresponsive({SLEEPER}), got {other:?}",
                    role.rank
                ),
            }
            if role.rank != SLEEPER {
                let elapsed = started.elapsed();
                assert!(elapsed < peer_timeout * 3, "took {elapsed:?}");
            }
        },
    );
}

/// Each rank makes `call(rank)`; every rank must fail with a MismatchedCall
/// whose two descriptors are `differing` between the two ranks it names.
fn expect_mismatch(
    role: &Role,
    name: &str,
    algorithm: Algorithm,
    call: impl Fn(&mut Communicator, usize) -> Result<(), EngineError>,
    differing: impl Fn(&pcieipc::engine::CallDescriptor) -> String,
) {
    let mut comm = Communicator::init(
        &format!("{}-{name}", role.rendezvous),
        role.rank,
        role.nranks,
        CommOptions {
            algorithm: AlgorithmChoice::Fixed(algorithm),
            ..options(Duration::from_secs(20))
        },
    )
    .expect("init");
    match call(&mut comm, role.rank) {
        Err(EngineError::MismatchedCall {
            rank,
            call,
            peer,
            peer_call,
        }) => {
            assert_ne!(rank, peer);
            assert_ne!(
                differing(&call),
                differing(&peer_call),
                "{name}: {call} vs {peer_call}"
            );
        }
        other => panic!(
            "{name} via {algorithm}: rank {} expected MismatchedCall, got {other:?}",
            role.rank
        ),
    }
    // Later calls report the same failure instead of running.
    assert!(matches!(
        call(&mut comm, role.rank),
        Err(EngineError::MismatchedCall { .. })
    ));
}

fn mismatches(role: Role) {
    // The last rank differs, so on 3 ranks one rank sees only matching
    // neighbours and must learn of the mismatch from the others.
    let odd = role.nranks - 1;
    for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::Direct] {
        expect_mismatch(
            &role,
            &format!("count-{algorithm}"),
            algorithm,
            |comm, rank| {
                let count = if rank == odd { 101 } else { 100 };
                let input = vec![1.0f32; count];
                comm.all_reduce(&input, &mut vec![0.0f32; count], ReduceOp::Sum)
            },
            |call| call.count.to_string(),
        );
        expect_mismatch(
            &role,
            &format!("dtype-{algorithm}"),
            algorithm,
            |comm, rank| {
                if rank == odd {
                    comm.all_reduce_in_place(&mut vec![1i32; 64], ReduceOp::Sum)
                } else {
                    comm.all_reduce_in_place(&mut vec![1.0f32; 64], ReduceOp::Sum)
                }
            },
            |call| call.dtype.to_string(),
        );
        expect_mismatch(
            &role,
            &format!("op-{algorithm}"),
            algorithm,
            |comm, rank| {
                let op = if rank == odd {
                    ReduceOp::Max
                } else {
                    ReduceOp::Sum
                };
                comm.all_reduce_in_place(&mut [1u8; 64], op)
            },
            |call| format!("{:?}", call.op),
        );
    }
    expect_mismatch(
        &role,
        "kind",
        Algorithm::Ring,
        |comm, rank| {
            let mut buffer = vec![2.0f64; 64];
            if rank == odd {
                comm.broadcast(&mut buffer, 0)
            } else {
                comm.all_reduce_in_place(&mut buffer, ReduceOp::Prod)
            }
        },
        |call| call.kind.name().to_owned(),
    );
    // The last rank, and then rank 0 (whose descriptor the ring ranks wait
    // for to adopt its chunk size), takes the other algorithm.
    for odd in [odd, 0] {
        expect_mismatch(
            &role,
            &format!("algorithm-{odd}"),
            Algorithm::Ring,
            |comm, rank| {
                if rank == odd {
                    comm.set_algorithm(AlgorithmChoice::Fixed(Algorithm::OneShot));
                }
                comm.all_reduce_in_place(&mut vec![1i64; 64], ReduceOp::Min)
            },
            |call| call.algorithm.name().to_owned(),
        );
    }
}

#[test]
fn mismatched_calls_are_reported_on_2_ranks() {
    run_ranks(
        "mismatched_calls_are_reported_on_2_ranks",
        2,
        LIMIT,
        mismatches,
    );
}

#[test]
fn mismatched_calls_are_reported_on_3_ranks() {
    run_ranks(
        "mismatched_calls_are_reported_on_3_ranks",
        3,
        LIMIT,
        mismatches,
    );
}

#[test]
fn rank_out_of_range_is_refused() {
    match Communicator::init("unused-out-of-range", 4, 4, CommOptions::default()) {
        Err(EngineError::RankOutOfRange { rank: 4, nranks: 4 }) => {}
        other => panic!("expected RankOutOfRange, got {:?}", other.err()),
    }
}

#[test]
fn call_descriptor_names_both_calls() {
    let call = pcieipc::engine::CallDescriptor {
        kind: CallKind::AllReduce,
        dtype: DType::F32,
        op: Some(ReduceOp::Sum),
        count: 100,
        root: 0,
        algorithm: Algorithm::Ring,
        chunk_bytes: 262144,
        bypass_slots: false,
    };
    assert_eq!(
        call.to_string(),
        "all_reduce(count=100, float, sum; ring, 262144-byte chunks)"
    );
}
