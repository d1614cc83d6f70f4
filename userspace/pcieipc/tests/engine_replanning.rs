//! Chunk sizes re-planned between calls: one rank changes its link mid-stream,
//! alone, and every rank switches chunk size at the same call with exact
//! results and no mismatch; in host memory the chunk follows the message size.

mod engine_support;

use std::time::Duration;

use engine_support::{run_ranks, Role};
use pcieipc::engine::{
    Algorithm, AlgorithmChoice, ChunkPolicy, CommOptions, Communicator, LinkFacts, ReduceOp,
    SizeStep, HOST_MEMORY_STEPS,
};

const LIMIT: Duration = Duration::from_secs(120);
const COUNT: usize = 5000;
const ITERATIONS: usize = 40;
/// Rank 1's link gets AER errors after this iteration's calls...
const ERRORS_AFTER: usize = 10;
/// ...and rank `nranks − 1`'s degrades to Gen3 x8 after this one.
const DEGRADED_AFTER: usize = 25;

/// Distinct sizes per link condition, so the chunk a call used says which
/// links its deciding rank saw.
fn policy() -> ChunkPolicy {
    ChunkPolicy {
        healthy: 4096,
        aer_errors: 1024,
        degraded: 2048,
        slow: 512,
        host_memory: [SizeStep {
            up_to_bytes: usize::MAX,
            chunk_bytes: 8192,
        }; HOST_MEMORY_STEPS],
        aer_error_threshold: 1,
    }
}

const HEALTHY: LinkFacts = LinkFacts {
    speed_gt_s: 16.0,
    width: 16,
    recent_aer_errors: 0,
    over_nvlink: false,
};

fn init(
    role: &Role,
    name: &str,
    link: Option<LinkFacts>,
    chunk_policy: ChunkPolicy,
) -> Communicator {
    Communicator::init(
        &format!("{}-{name}", role.rendezvous),
        role.rank,
        role.nranks,
        CommOptions {
            chunk_policy,
            link,
            algorithm: AlgorithmChoice::Fixed(Algorithm::Ring),
            peer_timeout: Duration::from_secs(30),
            ..CommOptions::default()
        },
    )
    .expect("init")
}

fn all_reduce_exact(comm: &mut Communicator, iteration: usize, count: usize) -> u32 {
    let (rank, nranks) = (comm.rank() as i64, comm.nranks() as i64);
    let base = iteration as i64 * 1_000_000;
    let input: Vec<i64> = (0..count as i64).map(|i| base + rank * 7919 + i).collect();
    let mut output = vec![0i64; count];
    comm.all_reduce(&input, &mut output, ReduceOp::Sum)
        .unwrap_or_else(|error| panic!("rank {rank}, iteration {iteration}: {error}"));
    for (i, got) in output.iter().enumerate() {
        let i = i as i64;
        let want = nranks * (base + i) + 7919 * nranks * (nranks - 1) / 2;
        assert_eq!(
            *got, want,
            "rank {rank}, iteration {iteration}, element {i}"
        );
    }
    comm.last_call().expect("a call ran").chunk_bytes
}

fn broadcast_exact(comm: &mut Communicator, iteration: usize, root: usize) -> u32 {
    let rank = comm.rank();
    let value = |i: usize| (iteration * 31 + root * 7 + i) as i64;
    let mut buffer: Vec<i64> = (0..COUNT)
        .map(|i| if rank == root { value(i) } else { -1 })
        .collect();
    comm.broadcast(&mut buffer, root)
        .unwrap_or_else(|error| panic!("rank {rank}, iteration {iteration}: {error}"));
    for (i, got) in buffer.iter().enumerate() {
        assert_eq!(
            *got,
            value(i),
            "rank {rank}, iteration {iteration}, element {i}"
        );
    }
    comm.last_call().expect("a call ran").chunk_bytes
}

/// Every iteration an all_reduce and a broadcast (root turning), each
/// checked exactly; rank 1 and then the last rank change their links alone.
/// Every rank then gathers every rank's chunk history: call by call they
/// must agree, and each switch must land within the one call in which the
/// deciding rank may not have seen the change yet.
fn link_changes_switch_every_rank_at_the_same_call(role: Role) {
    let mut comm = init(&role, "links", Some(HEALTHY), policy());
    let last = role.nranks - 1;
    let mut history = Vec::new();
    for iteration in 0..ITERATIONS {
        history.push(i64::from(all_reduce_exact(&mut comm, iteration, COUNT)));
        history.push(i64::from(broadcast_exact(
            &mut comm,
            iteration,
            iteration % role.nranks,
        )));
        if iteration == ERRORS_AFTER && role.rank == 1 {
            comm.set_link(Some(LinkFacts {
                recent_aer_errors: 3,
                ..HEALTHY
            }));
        }
        if iteration == DEGRADED_AFTER && role.rank == last {
            // On 2 ranks this is rank 1 again: its errors are gone, its link
            // degraded.
            comm.set_link(Some(LinkFacts {
                speed_gt_s: 8.0,
                width: 8,
                ..HEALTHY
            }));
        }
    }
    let mut everyone = vec![0i64; history.len() * role.nranks];
    comm.all_gather(&history, &mut everyone)
        .expect("all_gather");
    let calls = history.len();
    for (rank, theirs) in everyone.chunks(calls).enumerate() {
        assert_eq!(
            theirs,
            history.as_slice(),
            "rank {rank} disagrees with rank {}",
            role.rank
        );
    }
    // After the degraded link, the last rank still has no errors, but on 3+
    // ranks rank 1 does: the smallest wish wins.
    let after_degraded = if role.nranks == 2 { 2048 } else { 1024 };
    for (call, chunk) in history.iter().enumerate() {
        let iteration = call / 2;
        let broadcast = call % 2 == 1;
        let expected: &[i64] = if iteration <= ERRORS_AFTER {
            &[4096]
        } else if iteration == ERRORS_AFTER + 1 && !broadcast {
            &[4096, 1024]
        } else if iteration <= DEGRADED_AFTER {
            &[1024]
        } else if iteration == DEGRADED_AFTER + 1 && !broadcast {
            &[1024, after_degraded]
        } else {
            &[after_degraded]
        };
        assert!(
            expected.contains(chunk),
            "call {call} (iteration {iteration}, {}) used {chunk}-byte chunks, expected one of {expected:?}",
            if broadcast { "broadcast" } else { "all_reduce" }
        );
    }
}

#[test]
fn link_changes_switch_every_rank_at_the_same_call_on_2_ranks() {
    run_ranks(
        "link_changes_switch_every_rank_at_the_same_call_on_2_ranks",
        2,
        LIMIT,
        link_changes_switch_every_rank_at_the_same_call,
    );
}

#[test]
fn link_changes_switch_every_rank_at_the_same_call_on_3_ranks() {
    run_ranks(
        "link_changes_switch_every_rank_at_the_same_call_on_3_ranks",
        3,
        LIMIT,
        link_changes_switch_every_rank_at_the_same_call,
    );
}

/// In host memory the chunk follows the message size: small messages the
/// first step's chunk, larger ones the next, on every rank.
#[test]
fn host_memory_chunk_follows_the_message_size() {
    run_ranks(
        "host_memory_chunk_follows_the_message_size",
        2,
        LIMIT,
        |role| {
            let mut steps = [SizeStep {
                up_to_bytes: usize::MAX,
                chunk_bytes: 16 << 10,
            }; HOST_MEMORY_STEPS];
            steps[0] = SizeStep {
                up_to_bytes: 64 << 10,
                chunk_bytes: 1 << 10,
            };
            let mut comm = init(
                &role,
                "sizes",
                None,
                ChunkPolicy {
                    host_memory: steps,
                    ..policy()
                },
            );
            for (iteration, count, chunk) in [
                (0, 1000, 1 << 10),
                (1, 8192, 1 << 10),
                (2, 8193, 16 << 10),
                (3, 100_000, 16 << 10),
                (4, 10, 1 << 10),
            ] {
                assert_eq!(
                    all_reduce_exact(&mut comm, iteration, count),
                    chunk,
                    "{count} i64 elements"
                );
            }
        },
    );
}
