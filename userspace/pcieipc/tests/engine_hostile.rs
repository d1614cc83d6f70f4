//! A hostile rank: one that joins honestly, then writes random words over
//! the shared control blocks and message stamps. The honest rank must end
//! every job with a result or an error, never a panic or a hang, and the
//! hostile rank's own engine must not crash either.

mod engine_support;

use std::time::Duration;

use engine_support::{run_ranks, segment_references};
use pcieipc::engine::{CommOptions, Communicator, ReduceOp};

const JOBS: u64 = 40;
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
            let mut errors = 0;
            for job in 0..JOBS {
                let options = CommOptions {
                    join_timeout: Duration::from_secs(20),
                    peer_timeout: Duration::from_secs(2),
                    ..CommOptions::default()
                };
                let name = format!("{}-{job}", role.rendezvous);
                let mut comm =
                    Communicator::init(&name, role.rank, role.nranks, options).expect("init");
                // Rank 1 joins honestly, then turns: the control area in the
                // even jobs, the whole of its first windows in the odd ones.
                if role.rank == 1 {
                    let span = if job % 2 == 0 { 8 << 10 } else { 256 << 10 };
                    scribble(job, 16 << (job % 5), span);
                }
                for call in 0..CALLS {
                    let count = [2usize, 4096, 1 << 18, 1 << 20][call % 4];
                    let input = vec![1.0f32; count];
                    let mut output = vec![0.0f32; count];
                    if let Err(error) = comm.all_reduce(&input, &mut output, ReduceOp::Sum) {
                        eprintln!("rank {} job {job}: {error}", role.rank);
                        errors += 1;
                        break;
                    }
                }
            }
            eprintln!(
                "rank {}: {errors} of {JOBS} jobs ended in an error",
                role.rank
            );
        },
    );
}
