//! Chunk checksums (docs/fault-path.md): chunks damaged in their slot are
//! detected, read again and resent, so results stay exact; a chunk that stays
//! damaged fails every rank with the message named; ranks that disagree on
//! checksums are told so. The damage is injected by the sending rank
//! (`CommOptions::damage`), after it checksummed the chunk.

mod engine_support;

use std::time::{Duration, Instant};

use engine_support::{run_ranks, spawn_ranks, wait_ranks};
use pcieipc::engine::{
    Algorithm, AlgorithmChoice, Carrier, ChunkPolicy, CommOptions, Communicator, Corruption,
    DamageInjection, EngineError, ReduceOp, SizeStep,
};

const LIMIT: Duration = Duration::from_secs(60);

fn options(damage: Option<DamageInjection>) -> CommOptions {
    CommOptions {
        join_timeout: Duration::from_secs(10),
        peer_timeout: Duration::from_secs(20),
        chunk_checksums: Some(true),
        chunk_policy: ChunkPolicy::fixed(64 << 10),
        algorithm: AlgorithmChoice::Fixed(Algorithm::Ring),
        damage,
        ..CommOptions::default()
    }
}

/// Rank r's input: distinct per rank and element, small integers (exact sums).
fn input(rank: usize, len: usize) -> Vec<i64> {
    (0..len)
        .map(|i| (i % 1000) as i64 * 3 + rank as i64)
        .collect()
}

fn sum_of_inputs(nranks: usize, len: usize) -> Vec<i64> {
    let inputs: Vec<Vec<i64>> = (0..nranks).map(|rank| input(rank, len)).collect();
    (0..len)
        .map(|i| inputs.iter().map(|input| input[i]).sum())
        .collect()
}

/// Each of 3 ranks damages one chunk it sends (rank 1 its first resend too):
/// every collective's result is exact, and each rank's record names the
/// message its predecessor damaged and the reads it took.
#[test]
fn damaged_chunks_are_resent_and_results_are_exact() {
    run_ranks(
        "damaged_chunks_are_resent_and_results_are_exact",
        3,
        LIMIT,
        |role| {
            let writes = |rank: usize| if rank == 1 { 2 } else { 1 };
            let damage = DamageInjection {
                chunk: 3 + 5 * role.rank as u64,
                writes: writes(role.rank),
            };
            let mut comm = Communicator::init(
                &role.rendezvous,
                role.rank,
                role.nranks,
                options(Some(damage)),
            )
            .expect("init");
            assert!(comm.chunk_checksums());
            let (n, r) = (role.nranks, role.rank);
            let len = 3 << 16;
            let mine = input(r, len);
            let sum = sum_of_inputs(n, len);

            let mut output = vec![0i64; len];
            comm.all_reduce(&mine, &mut output, ReduceOp::Sum)
                .expect("all_reduce");
            assert_eq!(output, sum, "all_reduce on rank {r}");

            let mut share = vec![0i64; len / n];
            comm.reduce_scatter(&mine, &mut share, ReduceOp::Sum)
                .expect("reduce_scatter");
            assert_eq!(
                share,
                sum[r * len / n..(r + 1) * len / n],
                "reduce_scatter on rank {r}"
            );

            let mut gathered = vec![0i64; len * n];
            comm.all_gather(&mine, &mut gathered).expect("all_gather");
            for rank in 0..n {
                assert_eq!(gathered[rank * len..(rank + 1) * len], input(rank, len));
            }

            let mut buffer = mine.clone();
            comm.broadcast(&mut buffer, 1).expect("broadcast");
            assert_eq!(buffer, input(1, len), "broadcast on rank {r}");

            let predecessor = (r + n - 1) % n;
            let resends = comm.resends();
            assert_eq!(resends.len(), 1, "rank {r}: {resends:?}");
            let record = &resends[0];
            assert_eq!(record.call, 0, "rank {r}: {record}");
            assert_eq!(record.peer, predecessor, "rank {r}: {record}");
            // The first read, the re-read, then one read per damaged resend
            // and the whole one.
            assert_eq!(record.reads, 2 + writes(predecessor), "rank {r}: {record}");
            assert!(
                matches!(record.carrier, Carrier::RawSlot | Carrier::RelaySlot),
                "rank {r}: {record}"
            );
        },
    );
}

/// A chunk damaged on every write: its receiver gives up after the re-read and
/// three resends, and every rank fails with the same error naming it.
#[test]
fn chunk_that_stays_damaged_fails_every_rank() {
    const DAMAGER: usize = 1;
    let test = "chunk_that_stays_damaged_fails_every_rank";
    if let Some(role) = engine_support::role() {
        let damage = (role.rank == DAMAGER).then_some(DamageInjection {
            chunk: 2,
            writes: 100,
        });
        // Ranks that damage nothing still check.
        let mut comm =
            Communicator::init(&role.rendezvous, role.rank, role.nranks, options(damage))
                .expect("init");
        let mine = input(role.rank, 1 << 18);
        let mut output = vec![0i64; mine.len()];
        let started = Instant::now();
        match comm.all_reduce(&mine, &mut output, ReduceOp::Sum) {
            Err(EngineError::DamagedMessage {
                rank,
                peer,
                message,
                reads,
                ..
            }) => {
                assert_eq!((rank, peer), (DAMAGER + 1, DAMAGER), "rank {}", role.rank);
                assert_eq!(reads, 5);
                assert!(message >= 1);
            }
            other => panic!("rank {}: expected DamagedMessage, got {other:?}", role.rank),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        // The communicator stays failed.
        assert!(matches!(
            comm.all_reduce(&mine, &mut output, ReduceOp::Sum),
            Err(EngineError::DamagedMessage { .. })
        ));
        return;
    }
    let outputs = wait_ranks(spawn_ranks(test, 3, &[0, 1, 2]), LIMIT);
    engine_support::assert_succeeded(&outputs);
}

/// One rank checks, its predecessor sends no checksums: the checking rank
/// names the setting, and every rank fails with it.
#[test]
fn ranks_that_disagree_on_checksums_are_told() {
    run_ranks(
        "ranks_that_disagree_on_checksums_are_told",
        2,
        LIMIT,
        |role| {
            let mut comm = Communicator::init(
                &role.rendezvous,
                role.rank,
                role.nranks,
                CommOptions {
                    chunk_checksums: Some(role.rank == 0),
                    ..options(None)
                },
            )
            .expect("init");
            let mut buffer = input(role.rank, 1 << 16);
            match comm.all_reduce_in_place(&mut buffer, ReduceOp::Sum) {
                Err(EngineError::PeerCorrupt { rank, peer, what }) => {
                    assert_eq!((rank, peer, what), (0, 1, Corruption::ChecksumSetting));
                }
                other => panic!("rank {}: expected PeerCorrupt, got {other:?}", role.rank),
            }
        },
    );
}

/// Every algorithm with checksums on, undamaged: one-shot windows and the
/// direct algorithm's address windows are checked too, and nothing is
/// resent.
#[test]
fn every_algorithm_is_exact_with_checksums() {
    run_ranks(
        "every_algorithm_is_exact_with_checksums",
        3,
        LIMIT,
        |role| {
            let mut comm = Communicator::init(
                &role.rendezvous,
                role.rank,
                role.nranks,
                CommOptions {
                    algorithm: AlgorithmChoice::Auto,
                    direct_messages: (4 << 20)..=(16 << 20),
                    ..options(None)
                },
            )
            .expect("init");
            let n = role.nranks;
            let mut seen = Vec::new();
            for len in [1, 7, 1000, 8 << 10, 1 << 19] {
                let mine = input(role.rank, len);
                let sum = sum_of_inputs(n, len);
                let mut output = vec![0i64; len];
                comm.all_reduce(&mine, &mut output, ReduceOp::Sum)
                    .expect("all_reduce");
                assert_eq!(output, sum, "{len} elements");
                seen.push(comm.last_call().expect("a call").algorithm);
            }
            assert!(seen.contains(&Algorithm::OneShot), "{seen:?}");
            assert!(seen.contains(&Algorithm::Ring), "{seen:?}");
            if comm.single_copy() {
                assert!(seen.contains(&Algorithm::Direct), "{seen:?}");
            }
            assert!(comm.resends().is_empty(), "{:?}", comm.resends());
        },
    );
}

#[test]
fn damage_without_checksums_is_refused() {
    let result = Communicator::init(
        &format!("damage-refused-{}", std::process::id()),
        0,
        1,
        CommOptions {
            chunk_checksums: Some(false),
            ..options(Some(DamageInjection {
                chunk: 0,
                writes: 1,
            }))
        },
    );
    assert!(
        matches!(result, Err(EngineError::DamageWithoutChecksums { rank: 0 })),
        "{:?}",
        result.err()
    );
}

#[test]
fn damage_option_parses() {
    assert_eq!(
        "7x3".parse::<DamageInjection>(),
        Ok(DamageInjection {
            chunk: 7,
            writes: 3
        })
    );
    assert_eq!(
        "12".parse::<DamageInjection>(),
        Ok(DamageInjection {
            chunk: 12,
            writes: 1
        })
    );
    for bad in ["", "x2", "3x0", "3x", "-1", "3x99999999999"] {
        assert!(bad.parse::<DamageInjection>().is_err(), "{bad:?}");
    }
}

/// A ring call in 1 MiB chunks cycles through 2 raw slots, one in 1 KiB
/// chunks and a broadcast through all 5: calls that change the cycle,
/// back to back, with rank 0's second chunk damaged (with checksums) so a
/// resend is served from the 2-slot cycle. Every result exact.
fn raw_slot_cycles_change_between_calls(role: engine_support::Role, checksums: bool) {
    let host_memory = [
        SizeStep {
            up_to_bytes: 64 << 10,
            chunk_bytes: 1 << 10,
        },
        SizeStep {
            up_to_bytes: usize::MAX,
            chunk_bytes: 1 << 20,
        },
        SizeStep {
            up_to_bytes: usize::MAX,
            chunk_bytes: 1 << 20,
        },
    ];
    let damage = (checksums && role.rank == 0).then_some(DamageInjection {
        chunk: 1,
        writes: 1,
    });
    let options = CommOptions {
        chunk_checksums: Some(checksums),
        chunk_policy: ChunkPolicy {
            host_memory,
            ..ChunkPolicy::default()
        },
        damage,
        ..options(None)
    };
    let (n, r) = (role.nranks, role.rank);
    let mut comm = Communicator::init(&role.rendezvous, r, n, options).expect("init");
    let (large, small) = (3 << 17, 2000);
    for round in 0..2 {
        for len in [large, small, large] {
            let what = format!("round {round}, {len} elements, rank {r}");
            let mine = input(r, len);
            let sum = sum_of_inputs(n, len);
            let mut output = vec![0i64; len];
            comm.all_reduce(&mine, &mut output, ReduceOp::Sum)
                .expect(&what);
            assert_eq!(output, sum, "all_reduce, {what}");
            let mut buffer = mine.clone();
            comm.broadcast(&mut buffer, round % n).expect(&what);
            assert_eq!(buffer, input(round % n, len), "broadcast, {what}");
            let mut share = vec![0i64; len / n];
            comm.reduce_scatter(&mine[..len / n * n], &mut share, ReduceOp::Sum)
                .expect(&what);
            assert_eq!(
                share,
                sum[r * (len / n)..(r + 1) * (len / n)],
                "reduce_scatter, {what}"
            );
            let mut gathered = vec![0i64; len * n];
            comm.all_gather(&mine, &mut gathered).expect(&what);
            for rank in 0..n {
                assert_eq!(
                    gathered[rank * len..(rank + 1) * len],
                    input(rank, len),
                    "all_gather, rank {rank}'s part, {what}"
                );
            }
            let chunk = comm.last_call().expect("a call").chunk_bytes;
            let expected = if len == large { 1 << 20 } else { 1 << 10 };
            assert_eq!(chunk, expected, "{what}");
        }
    }
    let resends = comm.resends().len();
    assert_eq!(resends, usize::from(checksums && r == 1), "rank {r}");
}

#[test]
fn raw_slot_cycle_changes_are_exact_on_2_ranks() {
    run_ranks(
        "raw_slot_cycle_changes_are_exact_on_2_ranks",
        2,
        LIMIT,
        |role| raw_slot_cycles_change_between_calls(role, false),
    );
}

#[test]
fn raw_slot_cycle_changes_are_exact_with_resends_on_3_ranks() {
    run_ranks(
        "raw_slot_cycle_changes_are_exact_with_resends_on_3_ranks",
        3,
        LIMIT,
        |role| raw_slot_cycles_change_between_calls(role, true),
    );
}

/// Rank 0 broadcasts six 1 MiB chunks through all 5 raw slots (the sixth
/// lands in slot 0 again) and goes on to a ring call on 2 slots while rank 1,
/// late, is still reading the broadcast: the ring's first chunk must not
/// overwrite the sixth before rank 1 has read it.
#[test]
fn a_smaller_raw_slot_cycle_waits_for_a_late_receiver() {
    run_ranks(
        "a_smaller_raw_slot_cycle_waits_for_a_late_receiver",
        2,
        LIMIT,
        |role| {
            let r = role.rank;
            let options = CommOptions {
                chunk_checksums: Some(false),
                chunk_policy: ChunkPolicy::fixed(1 << 20),
                ..options(None)
            };
            let mut comm = Communicator::init(&role.rendezvous, r, 2, options).expect("init");
            let len = 6 << 17;
            let mut buffer = input(r, len);
            if r == 1 {
                std::thread::sleep(Duration::from_millis(300));
            }
            comm.broadcast(&mut buffer, 0).expect("broadcast");
            assert_eq!(buffer, input(0, len), "broadcast on rank {r}");
            let mine = input(r, len);
            let mut output = vec![0i64; len];
            comm.all_reduce(&mine, &mut output, ReduceOp::Sum)
                .expect("all_reduce");
            assert_eq!(output, sum_of_inputs(2, len), "all_reduce on rank {r}");
        },
    );
}
