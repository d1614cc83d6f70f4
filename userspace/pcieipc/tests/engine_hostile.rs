//! A hostile rank: one that joins honestly, makes a few calls honestly,
//! then writes random words over the shared control blocks and message
//! stamps. The honest rank must end every job with a result or an error,
//! never a panic or a hang, and the hostile rank's own engine must not crash
//! either. The calls before the turn must all be exact; the sums after it
//! may be wrong (a rank cannot tell a wrong sum from a right one:
//! docs/security.md), so those are counted, not checked; and the scribbles
//! must be noticed: some jobs end in an error.

mod engine_support;

use std::time::Duration;

use engine_support::{run_ranks, segment_references};
use pcieipc::engine::{CommOptions, Communicator, ReduceOp};

const JOBS: u64 = 40;
/// Calls before rank 1 turns, and after.
const HONEST_CALLS: usize = 4;
const CALLS: usize = 12;

/// The start and length of this process's mapping of the engine's segment.
fn segment_mapping() -> (usize, usize) {
    let line = segment_references()
        .into_iter()
        .find(|line| line.contains('-') && line.contains("rw"))
        .expect("the segment is mapped");
    let range = line.split_whitespace().next().expect("an address range");
    let (start, end) = range.split_once('-').expect("start-end");
    let start = usize::from_str_radix(start, 16).expect("hex start");
    let end = usize::from_str_radix(end, 16).expect("hex end");
    (start, end - start)
}

/// Writes `count` random words into the first `span` bytes of the mapping.
fn scribble(seed: u64, count: usize, span: usize) {
    let (start, length) = segment_mapping();
    let span = span.min(length) / 8;
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut random = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for _ in 0..count {
        let at = (random() % span as u64) as usize;
        let value = match random() % 3 {
            0 => random() % 16,
            _ => random(),
        };
        // SAFETY: 8-byte aligned, inside this process's live mapping of the
        // segment; the engine's views of it tolerate any value (this test is
        // about exactly that).
        unsafe { ((start + at * 8) as *mut u64).write_volatile(value) };
    }
}

#[test]
fn a_rank_that_scribbles_on_shared_state_costs_the_others_an_error_not_a_crash() {
    run_ranks(
        "a_rank_that_scribbles_on_shared_state_costs_the_others_an_error_not_a_crash",
        2,
        Duration::from_secs(180),
        |role| {
            let (mut errors, mut wrong) = (0, 0);
            for job in 0..JOBS {
                let options = CommOptions {
                    join_timeout: Duration::from_secs(20),
                    peer_timeout: Duration::from_secs(2),
                    ..CommOptions::default()
                };
                let name = format!("{}-{job}", role.rendezvous);
                let mut comm =
                    Communicator::init(&name, role.rank, role.nranks, options).expect("init");
                // Rank 0 says when its honest calls are over: rank 1 may
                // finish the last one first, and must not turn before.
                let honest_done = std::env::temp_dir().join(format!("{name}-honest-done"));
                for call in 0..HONEST_CALLS + CALLS {
                    if call == HONEST_CALLS && role.rank == 0 {
                        std::fs::write(&honest_done, b"").expect("write the marker");
                    }
                    // Rank 1 turns: the control area in the even jobs, the
                    // whole of its first windows in the odd ones.
                    if call == HONEST_CALLS && role.rank == 1 {
                        let waited = std::time::Instant::now();
                        while !honest_done.exists() {
                            assert!(
                                waited.elapsed() < Duration::from_secs(20),
                                "rank 0 never got there"
                            );
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        std::fs::remove_file(&honest_done).expect("remove the marker");
                        let span = if job % 2 == 0 { 8 << 10 } else { 256 << 10 };
                        scribble(job, 16 << (job % 5), span);
                    }
                    let count = [2usize, 4096, 1 << 18, 1 << 20][call % 4];
                    let input = vec![1.0f32; count];
                    let mut output = vec![0.0f32; count];
                    let result = comm.all_reduce(&input, &mut output, ReduceOp::Sum);
                    let exact = output.iter().all(|&sum| sum == role.nranks as f32);
                    if call < HONEST_CALLS {
                        assert!(
                            result.is_ok() && exact,
                            "rank {} job {job} call {call}, before any scribble: {result:?}, \
                             {} of {count} elements wrong",
                            role.rank,
                            output
                                .iter()
                                .filter(|&&sum| sum != role.nranks as f32)
                                .count()
                        );
                        continue;
                    }
                    if let Err(error) = result {
                        eprintln!("rank {} job {job}: {error}", role.rank);
                        errors += 1;
                        break;
                    }
                    wrong += usize::from(!exact);
                }
            }
            eprintln!(
                "rank {}: {errors} of {JOBS} jobs ended in an error; {wrong} calls after the \
                 turn returned a wrong sum",
                role.rank
            );
            assert!(
                errors > 0,
                "rank {}: no job of {JOBS} noticed the scribbles",
                role.rank
            );
        },
    );
}
