//! The CUDA transport on a real GPU: every dtype × op against the CPU
//! reference, a killed rank, mismatched calls, the host-staged path,
//! registered buffers, and 1,000 communicators without leaking device
//! memory; the same for the GPU hand-off (forced: ranks on one GPU would
//! otherwise hand over on the host), with stream-ordered calls and CUDA
//! graph replay, through device memory and (peer-to-peer off) through
//! pinned shared host memory, whose GPU links the copy engines measure,
//! and calls that stamp their ends on the GPU; and the gate that holds a
//! stream until calls are queued ahead.
//! Several ranks share GPU 0 unless PCIEIPC_TEST_GPUS says
//! how many GPUs to spread them over.
//! Built only with `--features gpu-tests`; run by `make test-gpu`.

mod engine_support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_support::{
    assert_only_victim_killed, describe, role, run_ranks, spawn_ranks, wait_ranks, Role,
};
use pcieipc::engine::cuda::{
    CudaCommunicator, CudaOptions, DataPath, DeviceBuffer, Gpu, GpuCall, Handoff, PeerRead,
    PeerToPeer, StreamGate,
};
use pcieipc::engine::{
    bf16, f16, Algorithm, AlgorithmChoice, CallKind, CommOptions, Communicator, DType, Element,
    EngineError, ReduceOp, SEGMENT_NAME,
};

const LIMIT: Duration = Duration::from_secs(300);

fn options(algorithm: AlgorithmChoice) -> CudaOptions {
    CudaOptions {
        control: CommOptions {
            join_timeout: Duration::from_secs(60),
            peer_timeout: Duration::from_secs(20),
            ..CommOptions::default()
        },
        algorithm,
        ..CudaOptions::default()
    }
}

/// The GPU of `rank`: GPU 0, or rank mod PCIEIPC_TEST_GPUS.
fn gpu_of(rank: usize) -> usize {
    std::env::var("PCIEIPC_TEST_GPUS")
        .ok()
        .and_then(|gpus| gpus.parse::<usize>().ok())
        .filter(|gpus| *gpus > 0)
        .map_or(0, |gpus| rank % gpus)
}

fn join(role: &Role, suffix: &str, options: CudaOptions) -> CudaCommunicator {
    let gpu = Gpu::open(gpu_of(role.rank)).expect("open the rank's GPU");
    CudaCommunicator::init(
        &format!("{}-{suffix}", role.rendezvous),
        role.rank,
        role.nranks,
        gpu,
        options,
    )
    .expect("init")
}

/// Small integers (so every type holds every partial result exactly) and,
/// for the float types, values with fractions whose sums round.
trait TestElement: Element + Default {
    fn from_f64(value: f64) -> Self;
    fn to_f64(self) -> f64;
    /// Relative tolerance for the summation order of `nranks` values.
    const EPSILON: f64;
}

macro_rules! test_element {
    ($ty:ty, $from:expr, $to:expr, $eps:expr) => {
        impl TestElement for $ty {
            fn from_f64(value: f64) -> Self {
                $from(value)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            const EPSILON: f64 = $eps;
        }
    };
}

test_element!(f32, |v| v as f32, |v: f32| v as f64, 1e-6);
test_element!(f64, |v| v, |v: f64| v, 1e-14);
test_element!(f16, f16::from_f64, |v: f16| v.to_f64(), 4e-3);
test_element!(bf16, bf16::from_f64, |v: bf16| v.to_f64(), 3e-2);
test_element!(i32, |v| v as i32, |v: i32| v as f64, 0.0);
test_element!(i64, |v| v as i64, |v: i64| v as f64, 0.0);
test_element!(u8, |v| v as u8, |v: u8| v as f64, 0.0);

/// Rank `rank`'s element `index` for `op`: exact in every type (sums of
/// small integers, products of 1s and 2s), and for floats under sum a
/// fraction that makes the order of summation show.
fn value<T: TestElement>(rank: usize, index: usize, op: ReduceOp) -> T {
    let small = match op {
        ReduceOp::Sum | ReduceOp::Avg => ((index * 7 + rank * 3) % 8) as f64,
        ReduceOp::Prod => (1 + (index + rank) % 2) as f64,
        ReduceOp::Min | ReduceOp::Max => ((index * 13 + rank * 5) % 17) as f64,
    };
    let fraction = if T::EPSILON > 0.0 && op == ReduceOp::Sum {
        ((index * 31 + rank * 17) % 97) as f64 / 97.0
    } else {
        0.0
    };
    T::from_f64(small + fraction)
}

/// The sequential CPU reference: the engine's scalar arithmetic in rank order.
fn reference<T: TestElement>(nranks: usize, index: usize, op: ReduceOp) -> T {
    let mut acc = value::<T>(0, index, op);
    for rank in 1..nranks {
        let next = value::<T>(rank, index, op);
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => T::sum(acc, next),
            ReduceOp::Prod => T::prod(acc, next),
            ReduceOp::Min => T::min(acc, next),
            ReduceOp::Max => T::max(acc, next),
        };
    }
    if op == ReduceOp::Avg {
        acc = acc.div_by_ranks(nranks);
    }
    acc
}

fn close<T: TestElement>(got: T, want: T, nranks: usize) -> bool {
    if T::EPSILON == 0.0 {
        return got == want;
    }
    let (got, want) = (got.to_f64(), want.to_f64());
    (got - want).abs() <= T::EPSILON * nranks as f64 * want.abs().max(1.0)
}

/// One all_reduce of `count` elements, out of place and in place, checked
/// element by element. Returns a description of the first difference.
fn check_one<T: TestElement>(
    comm: &mut CudaCommunicator,
    count: usize,
    op: ReduceOp,
) -> Result<(), String> {
    let (rank, nranks) = (comm.rank(), comm.nranks());
    let host: Vec<T> = generate(count, |index| value(rank, index, op));
    let gpu = comm.gpu().clone();
    let input = DeviceBuffer::from_host(&gpu, &host).map_err(|e| e.to_string())?;
    let mut output = DeviceBuffer::<T>::zeroed(&gpu, count).map_err(|e| e.to_string())?;
    comm.run(GpuCall::all_reduce(&input, &mut output, op))
        .map_err(|e| e.to_string())?;
    let mut in_place = DeviceBuffer::from_host(&gpu, &host).map_err(|e| e.to_string())?;
    comm.run(GpuCall::all_reduce_in_place(&mut in_place, op))
        .map_err(|e| e.to_string())?;
    let untouched = input.to_host().map_err(|e| e.to_string())?;
    if untouched != host {
        return Err("out of place: the input buffer changed".into());
    }
    let out_of_place = output.to_host().map_err(|e| e.to_string())?;
    let in_place = in_place.to_host().map_err(|e| e.to_string())?;
    let describe = |what: &str, index: usize, got: T, want: T| {
        format!(
            "{what}: {} {} count {count} element {index}: got {got:?}, want {want:?}",
            T::DTYPE.name(),
            op.name()
        )
    };
    let first_wrong = |results: &[T]| {
        first_index(results.len(), |index| {
            !close(results[index], reference::<T>(nranks, index, op), nranks)
        })
    };
    for (what, results) in [("out of place", &out_of_place), ("in place", &in_place)] {
        if let Some(index) = first_wrong(results) {
            return Err(describe(
                what,
                index,
                results[index],
                reference::<T>(nranks, index, op),
            ));
        }
    }
    Ok(())
}

/// Threads a rank uses for the host side of a check: the 256 MiB cases
/// would otherwise dominate the run.
const CHECK_THREADS: usize = 4;

fn generate<T: Send>(count: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let part = count.div_ceil(CHECK_THREADS).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> = (0..count)
            .step_by(part)
            .map(|start| {
                let f = &f;
                scope.spawn(move || {
                    (start..(start + part).min(count))
                        .map(f)
                        .collect::<Vec<T>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|part| part.join().expect("generator thread"))
            .collect()
    })
}

/// The smallest index in 0..count where `wrong` holds.
fn first_index(count: usize, wrong: impl Fn(usize) -> bool + Sync) -> Option<usize> {
    let part = count.div_ceil(CHECK_THREADS).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> = (0..count)
            .step_by(part)
            .map(|start| {
                let wrong = &wrong;
                scope.spawn(move || (start..(start + part).min(count)).find(|index| wrong(*index)))
            })
            .collect();
        parts
            .into_iter()
            .find_map(|part| part.join().expect("checker thread"))
    })
}

fn check_dtype(
    comm: &mut CudaCommunicator,
    dtype: DType,
    count: usize,
    op: ReduceOp,
) -> Result<(), String> {
    match dtype {
        DType::F32 => check_one::<f32>(comm, count, op),
        DType::F64 => check_one::<f64>(comm, count, op),
        DType::F16 => check_one::<f16>(comm, count, op),
        DType::Bf16 => check_one::<bf16>(comm, count, op),
        DType::I32 => check_one::<i32>(comm, count, op),
        DType::I64 => check_one::<i64>(comm, count, op),
        DType::U8 => check_one::<u8>(comm, count, op),
    }
}

/// Every dtype × op at the sizes of the acceptance list, through both
/// algorithms (auto picks one-shot for the small sizes; a second
/// communicator forces the ring).
fn every_dtype_and_op(role: Role) {
    let mut auto = join(&role, "auto", options(AlgorithmChoice::Auto));
    let mut ring = join(
        &role,
        "ring",
        options(AlgorithmChoice::Fixed(Algorithm::Ring)),
    );
    assert_eq!(
        auto.data_path(),
        &DataPath::PeerToPeer,
        "ranks on one GPU must pass the P2P check"
    );
    let mut failures = Vec::new();
    let mut ran = std::collections::HashSet::new();
    for dtype in DType::ALL {
        let element = dtype.size_bytes();
        let counts = [
            0,
            1,
            role.nranks - 1,
            role.nranks + 1,
            7919,
            (1 << 20) + 3,
            (256 << 20) / element,
        ];
        for op in ReduceOp::ALL {
            for &count in &counts {
                let comm = if count < 64 { &mut ring } else { &mut auto };
                if let Err(failure) = check_dtype(comm, dtype, count, op) {
                    failures.push(failure);
                }
                if count > 0 {
                    ran.extend(comm.last_call().map(|call| call.algorithm));
                }
                if count > 0 && count < 64 {
                    let algorithm = ring.last_call().map(|call| call.algorithm);
                    if algorithm != Some(Algorithm::Ring) {
                        failures.push(format!(
                            "{dtype:?} {op:?} {count}: the forced ring ran {algorithm:?}"
                        ));
                    }
                }
            }
            if let Err(failure) = check_dtype(&mut auto, dtype, 5, op) {
                failures.push(format!("one-shot: {failure}"));
            }
            let algorithm = auto.last_call().map(|call| call.algorithm);
            if algorithm != Some(Algorithm::OneShot) {
                failures.push(format!(
                    "{dtype:?} {op:?} 5: auto ran {algorithm:?}, not one-shot"
                ));
            }
        }
    }
    // Both algorithms ran, whatever auto picked at the larger sizes.
    assert!(
        ran.contains(&Algorithm::Ring) && ran.contains(&Algorithm::OneShot),
        "rank {}: algorithms that ran: {ran:?}",
        role.rank
    );
    assert!(
        failures.is_empty(),
        "rank {}: {} failures:\n{}",
        role.rank,
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_dtype_and_op_with_2_ranks() {
    run_ranks(
        "every_dtype_and_op_with_2_ranks",
        2,
        LIMIT,
        every_dtype_and_op,
    );
}

#[test]
fn every_dtype_and_op_with_4_ranks() {
    run_ranks(
        "every_dtype_and_op_with_4_ranks",
        4,
        LIMIT,
        every_dtype_and_op,
    );
}

#[test]
fn host_staged_path_gives_the_same_results() {
    run_ranks(
        "host_staged_path_gives_the_same_results",
        3,
        LIMIT,
        |role| {
            let mut comm = join(
                &role,
                "staged",
                CudaOptions {
                    peer_to_peer: PeerToPeer::Off,
                    ..options(AlgorithmChoice::Auto)
                },
            );
            assert!(matches!(comm.data_path(), DataPath::HostStaged { .. }));
            for op in ReduceOp::ALL {
                check_dtype(&mut comm, DType::F32, (1 << 20) + 3, op).unwrap();
                check_dtype(&mut comm, DType::Bf16, 7919, op).unwrap();
            }
        },
    );
}

#[test]
fn copy_engine_reads_give_the_same_results() {
    run_ranks(
        "copy_engine_reads_give_the_same_results",
        3,
        LIMIT,
        |role| {
            let mut comm = join(
                &role,
                "copy-engine",
                CudaOptions {
                    peer_read: PeerRead::CopyEngine,
                    chunk_bytes: 1 << 20,
                    ..options(AlgorithmChoice::Fixed(Algorithm::Ring))
                },
            );
            assert_eq!(comm.peer_read(), PeerRead::CopyEngine);
            for dtype in DType::ALL {
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                    for count in [1, 7919, (3 << 20) + 3] {
                        check_dtype(&mut comm, dtype, count, op).unwrap();
                    }
                }
            }
        },
    );
}

#[test]
fn registered_input_is_read_in_place_by_the_peers() {
    run_ranks(
        "registered_input_is_read_in_place_by_the_peers",
        3,
        LIMIT,
        |role| {
            let mut comm = join(
                &role,
                "registered",
                options(AlgorithmChoice::Fixed(Algorithm::Ring)),
            );
            let count = (3 << 20) + 5;
            let gpu = comm.gpu().clone();
            let host: Vec<i32> = generate(count, |index| value(role.rank, index, ReduceOp::Sum));
            let input = DeviceBuffer::from_host(&gpu, &host).unwrap();
            let mut output = DeviceBuffer::<i32>::zeroed(&gpu, count).unwrap();
            comm.register(&input).unwrap();
            for round in 0..3 {
                comm.run(GpuCall::all_reduce(&input, &mut output, ReduceOp::Sum))
                    .unwrap();
                let got = output.to_host().unwrap();
                for (index, got) in got.into_iter().enumerate() {
                    assert_eq!(
                        got,
                        reference::<i32>(role.nranks, index, ReduceOp::Sum),
                        "round {round} element {index}"
                    );
                }
            }
            comm.deregister(&input).unwrap();
        },
    );
}

#[test]
fn a_dropped_registered_buffer_stays_allocated_until_deregistered() {
    run_ranks(
        "a_dropped_registered_buffer_stays_allocated_until_deregistered",
        2,
        LIMIT,
        |role| {
            let mut comm = join(&role, "dropped", options(AlgorithmChoice::Auto));
            let gpu = comm.gpu().clone();
            let count = 4 << 20;
            // What the test relies on: unregistered, a freed block's address
            // comes back at the next allocation of its size.
            let probe = DeviceBuffer::<f32>::zeroed(&gpu, count).unwrap();
            let freed = probe.address();
            drop(probe);
            let again = DeviceBuffer::<f32>::zeroed(&gpu, count).unwrap();
            assert_eq!(
                again.address(),
                freed,
                "cuMemAlloc did not reuse a freed block"
            );
            drop(again);
            let registered = DeviceBuffer::<f32>::zeroed(&gpu, count).unwrap();
            comm.register(&registered).unwrap();
            let address = registered.address();
            drop(registered);
            // Peers still map it: the same-sized allocation that follows must
            // not land on it (cuMemAlloc reuses a just-freed block).
            let next = DeviceBuffer::<f32>::zeroed(&gpu, count).unwrap();
            assert_ne!(
                next.address(),
                address,
                "rank {}: a dropped registered buffer's address was reused while peers map it",
                role.rank
            );
            let mut ones = DeviceBuffer::<f32>::from_host(&gpu, &vec![1.0; count]).unwrap();
            comm.run(GpuCall::all_reduce_in_place(&mut ones, ReduceOp::Sum))
                .unwrap();
            assert!(ones
                .to_host()
                .unwrap()
                .iter()
                .all(|&v| v == role.nranks as f32));
        },
    );
}

#[test]
fn mismatched_counts_are_reported_by_every_rank() {
    run_ranks(
        "mismatched_counts_are_reported_by_every_rank",
        2,
        LIMIT,
        |role| {
            let mut comm = join(&role, "mismatch", options(AlgorithmChoice::Auto));
            let gpu = comm.gpu().clone();
            let mut buffer = DeviceBuffer::<f32>::zeroed(&gpu, 1000 + role.rank).unwrap();
            match comm.run(GpuCall::all_reduce_in_place(&mut buffer, ReduceOp::Sum)) {
                Err(EngineError::MismatchedCall { peer, .. }) => assert_eq!(peer, 1 - role.rank),
                other => panic!("rank {}: expected a mismatch, got {other:?}", role.rank),
            }
        },
    );
}

#[test]
fn killed_rank_is_named_by_the_others() {
    const TEST: &str = "killed_rank_is_named_by_the_others";
    const VICTIM: usize = 1;
    let peer_timeout = Duration::from_secs(20);
    if let Some(role) = role() {
        let mut comm = join(
            &role,
            "killed",
            CudaOptions {
                control: CommOptions {
                    peer_timeout,
                    join_timeout: Duration::from_secs(60),
                    ..CommOptions::default()
                },
                ..CudaOptions::default()
            },
        );
        let gpu = comm.gpu().clone();
        let mut buffer = DeviceBuffer::<f32>::zeroed(&gpu, 16 << 20).unwrap();
        if role.rank == VICTIM {
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(500));
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).expect("raise SIGKILL");
            });
        }
        let (error, waited) = loop {
            let started = Instant::now();
            if let Err(error) = comm.run(GpuCall::all_reduce_in_place(&mut buffer, ReduceOp::Sum)) {
                break (error, started.elapsed());
            }
        };
        assert!(
            waited < peer_timeout + Duration::from_secs(5),
            "noticed after {waited:?}"
        );
        match error {
            EngineError::PeerDied { rank, .. } => assert_eq!(rank, VICTIM),
            other => panic!(
                "rank {}: expected rank {VICTIM} named as dead, got {other}",
                role.rank
            ),
        }
        return;
    }
    let outputs = wait_ranks(spawn_ranks(TEST, 3, &[0, 1, 2]), LIMIT);
    assert_only_victim_killed(&outputs, VICTIM);
}

/// A rank 0 that broadcasts staging sizes no block can hold (a chunk whose
/// slots overflow the block's size, a one-shot budget that is -8 as a word)
/// is refused by every rank, naming rank 0 and the value, before anything
/// is allocated or copied by them: no rank panics, wraps, or crashes.
#[test]
fn a_hostile_rank_0s_staging_geometry_is_refused() {
    run_ranks(
        "a_hostile_rank_0s_staging_geometry_is_refused",
        2,
        LIMIT,
        |role| {
            let honest = options(AlgorithmChoice::Auto);
            let hostile = [
                (
                    "chunk",
                    1usize << 62,
                    CudaOptions {
                        chunk_bytes: 1 << 62,
                        ..honest.clone()
                    },
                ),
                (
                    "one-shot",
                    usize::MAX - 7,
                    CudaOptions {
                        one_shot_read_budget: Some(usize::MAX - 7),
                        ..honest.clone()
                    },
                ),
            ];
            for (what, value, hostile_options) in hostile {
                let joining = if role.rank == 0 {
                    hostile_options
                } else {
                    honest.clone()
                };
                let gpu = Gpu::open(gpu_of(role.rank)).expect("open the rank's GPU");
                let outcome = CudaCommunicator::init(
                    &format!("{}-geometry-{what}", role.rendezvous),
                    role.rank,
                    role.nranks,
                    gpu,
                    joining,
                );
                match outcome {
                    Err(EngineError::RendezvousProtocol { rank, reason, .. }) => {
                        assert_eq!(rank, 0, "rank {} ({what}): {reason}", role.rank);
                        assert!(
                            reason.contains(&value.to_string()),
                            "rank {} ({what}): the reason does not name {value}: {reason}",
                            role.rank
                        );
                    }
                    Err(other) => panic!(
                        "rank {} ({what}): expected rank 0's geometry refused, got {other}",
                        role.rank
                    ),
                    Ok(_) => panic!(
                        "rank {} ({what}): rank 0's staging sizes were taken",
                        role.rank
                    ),
                }
            }
        },
    );
}

/// Words of a legacy IPC handle as the CUDA communicator shares it.
const IPC_HANDLE_WORDS: usize = 8;

/// `buffer`'s legacy IPC handle as the CUDA communicator shares it (its 64
/// bytes as native-endian i64 words), made through the re-exported cudarc
/// as any caller could.
fn ipc_handle(gpu: &Gpu, buffer: &DeviceBuffer<u8>) -> [i64; IPC_HANDLE_WORDS] {
    use pcieipc::engine::cuda::cudarc::driver::sys;
    gpu.stream_handle()
        .context()
        .bind_to_thread()
        .expect("bind the GPU's context");
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: the buffer's address is the base of a cuMemAlloc'd block of
    // the context just bound; the driver fills the 64-byte handle.
    unsafe { sys::cuIpcGetMemHandle(&mut handle, buffer.address()) }
        .result()
        .expect("export the block");
    std::array::from_fn(|word| {
        i64::from_ne_bytes(std::array::from_fn(|byte| {
            handle.reserved[word * 8 + byte] as u8
        }))
    })
}

/// A peer that shares a staging block smaller than the agreed layout
/// (hostile, or broken) is named, with the sizes, by the rank that opens
/// it, instead of being taken for a pair without peer-to-peer (the ranks
/// would have gone through host memory, and a hostile peer could have had
/// them copy past its block).
///
/// Rank 1 plays the peer at the staging step rather than at `register`:
/// the public API is enough there (the control plane a CUDA communicator
/// joins, a `DeviceBuffer`, and the re-exported cudarc to export it), and
/// it is the init path the communicator cannot avoid. It shares 2 MiB, not
/// a few KiB: the driver carves small blocks out of 2 MiB ones and may map
/// those whole in the peer, so only a 2 MiB block opens as exactly its size
/// and the message can be checked for it.
#[test]
fn a_peer_whose_ipc_block_is_too_small_is_named() {
    const PEER: usize = 1;
    const SHARED_BYTES: usize = 2 << 20;
    run_ranks(
        "a_peer_whose_ipc_block_is_too_small_is_named",
        2,
        LIMIT,
        |role| {
            // One GPU for both: the handle then opens without peer-to-peer
            // between GPUs, so only its size can be refused.
            let gpu = Gpu::open(0).expect("open GPU 0");
            let rendezvous = format!("{}-undersized", role.rendezvous);
            let honest = options(AlgorithmChoice::Auto);
            if role.rank != PEER {
                match CudaCommunicator::init(&rendezvous, role.rank, role.nranks, gpu, honest) {
                    Err(EngineError::RendezvousProtocol { rank, reason, .. }) => {
                        assert_eq!(rank, PEER, "{reason}");
                        assert!(
                            reason.contains(&format!("{SHARED_BYTES} bytes")),
                            "the reason does not name the {SHARED_BYTES} bytes shared: {reason}"
                        );
                    }
                    Err(other) => {
                        panic!("expected rank {PEER}'s staging block refused, got {other}")
                    }
                    Ok(_) => panic!("init went on with rank {PEER}'s {SHARED_BYTES}-byte block"),
                }
                return;
            }
            // The control plane as `CudaCommunicator::init` joins it; its
            // backend area is sized by rank 0's request alone.
            let mut control =
                Communicator::init(&rendezvous, role.rank, role.nranks, honest.control)
                    .expect("join the control plane");
            // Rank 0's geometry, as many words as init broadcasts (chunk,
            // one-shot budget, window, hand-off, copy engines from, copy
            // chunk): a count that differs is refused as a mismatched call.
            let mut geometry = [0i64; 6];
            control
                .broadcast(&mut geometry, 0)
                .expect("rank 0's geometry");
            let block = DeviceBuffer::<u8>::zeroed(&gpu, SHARED_BYTES).expect("allocate");
            let handle = ipc_handle(&gpu, &block);
            let mut handles = [0i64; 2 * IPC_HANDLE_WORDS];
            // Then what rank 0 would do after the peer-to-peer check; it
            // refused the block and left instead. The block stays allocated
            // until then, so that rank 0 can open it.
            let went_on = control
                .all_gather(&handle, &mut handles)
                .and_then(|()| control.all_reduce_in_place(&mut [0i64], ReduceOp::Max));
            assert!(
                went_on.is_err(),
                "rank 0 went on past rank {PEER}'s {SHARED_BYTES}-byte staging block"
            );
            drop(block);
        },
    );
}

#[test]
fn a_thousand_communicators_leak_no_device_memory() {
    a_thousand_communicators(
        "a_thousand_communicators_leak_no_device_memory",
        options(AlgorithmChoice::Auto),
    );
}

#[test]
fn a_thousand_gpu_handoff_communicators_leak_nothing() {
    a_thousand_communicators(
        "a_thousand_gpu_handoff_communicators_leak_nothing",
        handoff_options(AlgorithmChoice::Auto),
    );
}

#[test]
fn a_thousand_host_memory_handoff_communicators_leak_nothing() {
    a_thousand_communicators(
        "a_thousand_host_memory_handoff_communicators_leak_nothing",
        host_memory_options(AlgorithmChoice::Auto),
    );
}

/// Descriptors, threads and shared-segment mappings of this process (the
/// GPU hand-off's watchdog owns a thread and an eventfd; through host
/// memory, its blocks pin the control plane's segment, which must be
/// unpinned and unmapped with it).
fn descriptors_and_threads() -> (usize, usize, usize) {
    let count = |dir: &str| std::fs::read_dir(dir).map_or(0, |entries| entries.count());
    let segments = std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .filter(|line| line.contains(SEGMENT_NAME))
        .count();
    (count("/proc/self/fd"), count("/proc/self/task"), segments)
}

/// 1,000 communicators created, used and dropped one after another by 2
/// ranks: free device memory, descriptors and threads as before.
fn a_thousand_communicators(test: &str, cuda_options: CudaOptions) {
    let Some(role) = role() else {
        let outputs = wait_ranks(spawn_ranks(test, 2, &[0, 1]), LIMIT);
        for (rank, output) in &outputs {
            assert!(output.status.success(), "{}", describe(*rank, output));
            // The measurements, for the README (the harness prints the test's
            // name on the same line, before them).
            let stdout = String::from_utf8_lossy(&output.stdout);
            for line in stdout
                .lines()
                .filter_map(|line| line.find("rank ").map(|at| &line[at..]))
            {
                println!("{line}");
            }
        }
        return;
    };
    {
        let gpu: Arc<Gpu> = Gpu::open(0).expect("open GPU 0");
        let mut barrier = Communicator::init(
            &format!("{}-barrier", role.rendezvous),
            role.rank,
            role.nranks,
            CommOptions::default(),
        )
        .unwrap();
        let meet = |barrier: &mut Communicator| {
            let mut word = [0i32];
            barrier
                .all_reduce_in_place(&mut word, ReduceOp::Sum)
                .unwrap();
        };
        let cycle = |i: usize| -> Duration {
            let comm = CudaCommunicator::init(
                &format!("{}-{i}", role.rendezvous),
                role.rank,
                role.nranks,
                gpu.clone(),
                cuda_options.clone(),
            )
            .unwrap();
            let mut comm = comm;
            let mut buffer = DeviceBuffer::<f32>::from_host(&gpu, &[1.0; 1000]).unwrap();
            comm.run(GpuCall::all_reduce_in_place(&mut buffer, ReduceOp::Sum))
                .unwrap();
            assert_eq!(buffer.to_host().unwrap()[999], role.nranks as f32);
            comm.init_time()
        };
        // The first communicator compiles kernels and sets up the driver's
        // IPC bookkeeping: memory counted from after it.
        cycle(0);
        meet(&mut barrier);
        let (before, _) = gpu.memory_info().unwrap();
        let handles_before = descriptors_and_threads();
        meet(&mut barrier);
        let mut init_times = Vec::new();
        for i in 1..=1000 {
            init_times.push(cycle(i));
        }
        meet(&mut barrier);
        let (after, total) = gpu.memory_info().unwrap();
        let handles_after = descriptors_and_threads();
        meet(&mut barrier);
        init_times.sort();
        println!(
            "rank {}: free before {before} B, after {after} B of {total} B; init median {:?}, max {:?}; context {:?}",
            role.rank,
            init_times[init_times.len() / 2],
            init_times[init_times.len() - 1],
            gpu.context_time()
        );
        assert!(
            after + (2 << 20) >= before,
            "free device memory fell from {before} to {after} B over 1,000 communicators"
        );
        assert_eq!(
            handles_after, handles_before,
            "(descriptors, threads, segment mappings) before and after 1,000 communicators"
        );
    }
}

fn handoff_options(algorithm: AlgorithmChoice) -> CudaOptions {
    CudaOptions {
        handoff: Handoff::Gpu,
        ..options(algorithm)
    }
}

/// The GPU hand-off through pinned shared host memory (peer-to-peer off).
fn host_memory_options(algorithm: AlgorithmChoice) -> CudaOptions {
    CudaOptions {
        peer_to_peer: PeerToPeer::Off,
        ..handoff_options(algorithm)
    }
}

/// Joins on the GPU hand-off with `options`, checking it took the data path
/// they ask for.
fn join_handed_off(role: &Role, suffix: &str, options: CudaOptions) -> CudaCommunicator {
    let through_host = options.peer_to_peer == PeerToPeer::Off;
    let comm = join(role, suffix, options);
    assert!(comm.hands_off_on_gpu(), "the GPU hand-off was forced");
    assert_eq!(
        matches!(comm.data_path(), DataPath::HostMapped { .. }),
        through_host,
        "data path {:?}",
        comm.data_path()
    );
    comm
}

/// Every dtype × op at the sizes of the acceptance list, in and out of
/// place, on the GPU hand-off: by the automatic choice, and with one-shot
/// (up to one window) and direct (two-shot) forced.
fn every_dtype_and_op_on_the_gpu_handoff(role: Role) {
    every_dtype_and_op_handed_off(role, handoff_options);
}

fn every_dtype_and_op_through_host_memory(role: Role) {
    every_dtype_and_op_handed_off(role, host_memory_options);
}

fn every_dtype_and_op_handed_off(role: Role, options: fn(AlgorithmChoice) -> CudaOptions) {
    let mut auto = join_handed_off(&role, "h-auto", options(AlgorithmChoice::Auto));
    let mut one_shot = join_handed_off(
        &role,
        "h-one-shot",
        options(AlgorithmChoice::Fixed(Algorithm::OneShot)),
    );
    let mut direct = join_handed_off(
        &role,
        "h-direct",
        options(AlgorithmChoice::Fixed(Algorithm::Direct)),
    );
    let window = one_shot.handoff_window().expect("the GPU hand-off");
    let mut failures = Vec::new();
    for dtype in DType::ALL {
        let element = dtype.size_bytes();
        let counts = [
            0,
            1,
            role.nranks - 1,
            role.nranks + 1,
            7919,
            (1 << 20) + 3,
            (256 << 20) / element,
        ];
        for op in ReduceOp::ALL {
            for &count in &counts {
                for (name, comm) in [("auto", &mut auto), ("direct", &mut direct)] {
                    if let Err(failure) = check_dtype(comm, dtype, count, op) {
                        failures.push(format!("{name}: {failure}"));
                    }
                }
                if count * element <= window {
                    if let Err(failure) = check_dtype(&mut one_shot, dtype, count, op) {
                        failures.push(format!("one-shot: {failure}"));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "rank {}: {} failures:\n{}",
        role.rank,
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn gpu_handoff_every_dtype_and_op_with_2_ranks() {
    run_ranks(
        "gpu_handoff_every_dtype_and_op_with_2_ranks",
        2,
        LIMIT,
        every_dtype_and_op_on_the_gpu_handoff,
    );
}

#[test]
fn host_memory_handoff_every_dtype_and_op_with_2_ranks() {
    run_ranks(
        "host_memory_handoff_every_dtype_and_op_with_2_ranks",
        2,
        LIMIT,
        every_dtype_and_op_through_host_memory,
    );
}

/// A grid asked for (`handoff_blocks`) holds for every rank at its
/// smallest: rank 0 asks for 2 blocks, the others for 5. With 2 blocks a
/// launch, through device and through host memory, calls one-shot and
/// direct (a block then carries many vectors) are exact, in and out of
/// place.
fn a_smaller_grid_is_agreed_and_exact(role: Role) {
    let asked = if role.rank == 0 { 2 } else { 5 };
    for options in [handoff_options, host_memory_options] {
        let mut comm = join_handed_off(
            &role,
            "grid",
            CudaOptions {
                handoff_blocks: Some(asked),
                ..options(AlgorithmChoice::Auto)
            },
        );
        assert_eq!(comm.handoff_blocks(), Some(2), "rank {}", role.rank);
        for count in [1, 5, 7919, (1 << 20) + 3, (33 << 20) / 4] {
            check_dtype(&mut comm, DType::F32, count, ReduceOp::Sum).unwrap();
        }
        check_dtype(&mut comm, DType::Bf16, 4099, ReduceOp::Max).unwrap();
    }
}

/// Rank 0's copy-engine settings hold for every rank (the others ask for
/// none): every two-shot launch through host memory goes by the copy
/// engines, in chunks of 4 KiB, so small calls take many chunks, the last
/// ones short or empty, and larger ones the most a launch has (63), every
/// dtype's tails included, in and out of place.
fn copy_engines_in_small_chunks_are_agreed_and_exact(role: Role) {
    let asked = (role.rank == 0).then_some((0, 4 << 10));
    let mut comm = join_handed_off(
        &role,
        "copy-chunks",
        CudaOptions {
            copy_engines_from: asked.map(|(from, _)| from),
            copy_chunk_bytes: asked.map(|(_, chunk)| chunk),
            ..host_memory_options(AlgorithmChoice::Fixed(Algorithm::Direct))
        },
    );
    let plan = comm.copy_engine_plan().expect("through host memory");
    assert_eq!(
        (plan.from_bytes, plan.chunk_bytes),
        (0, 4 << 10),
        "rank {}",
        role.rank
    );
    let mut failures = Vec::new();
    for dtype in DType::ALL {
        for count in [1, role.nranks + 1, 7919, (1 << 20) + 3] {
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                if let Err(failure) = check_dtype(&mut comm, dtype, count, op) {
                    failures.push(format!("{dtype:?} {op:?} {count}: {failure}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "rank {}: {failures:?}", role.rank);
}

#[test]
fn copy_engines_in_small_chunks_are_agreed_and_exact_with_2_ranks() {
    run_ranks(
        "copy_engines_in_small_chunks_are_agreed_and_exact_with_2_ranks",
        2,
        LIMIT,
        copy_engines_in_small_chunks_are_agreed_and_exact,
    );
}

#[test]
fn copy_engines_in_small_chunks_are_agreed_and_exact_with_3_ranks() {
    run_ranks(
        "copy_engines_in_small_chunks_are_agreed_and_exact_with_3_ranks",
        3,
        LIMIT,
        copy_engines_in_small_chunks_are_agreed_and_exact,
    );
}

#[test]
fn a_smaller_grid_is_agreed_and_exact_with_2_ranks() {
    run_ranks(
        "a_smaller_grid_is_agreed_and_exact_with_2_ranks",
        2,
        LIMIT,
        a_smaller_grid_is_agreed_and_exact,
    );
}

/// Every rank of a job through host memory gets the same list of its GPUs'
/// links, each measured once (by its lowest rank), with rates a PCIe link
/// carries, both directions at once no faster than each alone; the peer-to-
/// peer path measures nothing. What an all_reduce moves each way: the
/// message once on the two-shot kernel of 2 ranks.
fn host_links_measured(role: Role) {
    let mut comm = join_handed_off(&role, "links", host_memory_options(AlgorithmChoice::Auto));
    let links = comm
        .measure_host_links()
        .expect("measuring the links")
        .expect("through host memory, the links are measured");
    let expected_ranks: Vec<usize> = (0..role.nranks).filter(|&r| gpu_of(r) == 0).collect();
    assert_eq!(links.links[0].ranks, expected_ranks, "{links:?}");
    assert_eq!(
        links
            .links
            .iter()
            .map(|link| link.ranks.len())
            .sum::<usize>(),
        role.nranks,
        "{links:?}"
    );
    for link in &links.links {
        let rate = link.rate;
        // Gen3 x4 moves about 3.5 GB/s, Gen6 x16 about 110.
        for alone in [rate.to_gpu_gb_s, rate.from_gpu_gb_s] {
            assert!((1.0..150.0).contains(&alone), "{link:?}");
        }
        assert!(rate.both_to_gpu_gb_s <= rate.to_gpu_gb_s * 1.1, "{link:?}");
        assert!(
            rate.both_from_gpu_gb_s <= rate.from_gpu_gb_s * 1.1,
            "{link:?}"
        );
        assert!(rate.limit_gb_s() > 0.5, "{link:?}");
        assert!(link.pci_address.ends_with(".0"), "{link:?}");
    }
    // Every rank reads the same list: the lowest rank's view, gathered.
    let mut words: Vec<f64> = links
        .links
        .iter()
        .map(|link| link.rate.limit_gb_s())
        .collect();
    let mine = words.clone();
    comm.control()
        .all_reduce_in_place(&mut words, ReduceOp::Max)
        .unwrap();
    assert_eq!(
        words, mine,
        "rank {} read other links than rank 0",
        role.rank
    );
    let bytes = 4 << 20;
    assert_eq!(comm.algorithm_for::<f32>(bytes / 4), Algorithm::Direct);
    assert_eq!(
        comm.host_link_bytes::<f32>(bytes / 4),
        Some(bytes as u64 * 2 * (role.nranks as u64 - 1) / role.nranks as u64)
    );
    drop(comm);
    let mut peer_to_peer = join(&role, "links-p2p", options(AlgorithmChoice::Auto));
    if *peer_to_peer.data_path() == DataPath::PeerToPeer {
        assert!(peer_to_peer.measure_host_links().unwrap().is_none());
        assert_eq!(peer_to_peer.host_link_bytes::<f32>(1024), None);
    }
}

#[test]
fn host_links_are_measured_once_a_gpu_and_shared_with_2_ranks() {
    run_ranks(
        "host_links_are_measured_once_a_gpu_and_shared_with_2_ranks",
        2,
        LIMIT,
        host_links_measured,
    );
}

/// Rank `rank`'s input of call `call`: small integers, exact in f32.
fn call_input(rank: usize, call: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((rank * 7 + call * 3 + i) % 61) as f32)
        .collect()
}

fn call_expected(nranks: usize, call: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| {
            (0..nranks)
                .map(|rank| ((rank * 7 + call * 3 + i) % 61) as f32)
                .sum()
        })
        .collect()
}

/// Calls queued back to back on a stream of the caller's with no host wait
/// between them, then the same calls captured in a CUDA graph and replayed
/// with new inputs: every result checked.
fn stream_order_and_graph_replay(role: Role) {
    stream_order_and_graph_replay_with(role, handoff_options);
}

fn stream_order_and_graph_replay_through_host_memory(role: Role) {
    stream_order_and_graph_replay_with(role, host_memory_options);
}

fn stream_order_and_graph_replay_with(role: Role, options: fn(AlgorithmChoice) -> CudaOptions) {
    let mut comm = join_handed_off(&role, "h-stream", options(AlgorithmChoice::Auto));
    let gpu = comm.gpu().clone();
    let stream = gpu.new_stream().expect("a stream");
    // One-shot and two-shot sizes, mixed.
    let counts = [1usize, 4099, 3 << 20, 8, 1 << 20, 5];
    let mut outputs: Vec<DeviceBuffer<f32>> = counts
        .iter()
        .map(|&count| DeviceBuffer::zeroed(&gpu, count).unwrap())
        .collect();
    let upload = |round: usize| -> Vec<DeviceBuffer<f32>> {
        counts
            .iter()
            .enumerate()
            .map(|(call, &count)| {
                DeviceBuffer::from_host(&gpu, &call_input(role.rank, round * 10 + call, count))
                    .unwrap()
            })
            .collect()
    };
    let check = |outputs: &[DeviceBuffer<f32>], round: usize, what: &str| {
        for (call, output) in outputs.iter().enumerate() {
            let want = call_expected(role.nranks, round * 10 + call, counts[call]);
            assert!(
                output.to_host().unwrap() == want,
                "rank {}: {what}: call {call} ({} elements) wrong",
                role.rank,
                counts[call]
            );
        }
    };
    let inputs = upload(0);
    for (input, output) in inputs.iter().zip(outputs.iter_mut()) {
        comm.queue(GpuCall::all_reduce(input, output, ReduceOp::Sum).on_stream(&stream))
            .unwrap();
    }
    stream.synchronize().unwrap();
    assert!(comm.gpu_failure().is_none(), "{:?}", comm.gpu_failure());
    check(&outputs, 0, "stream-ordered");

    // The graph reads the input buffers it was captured with: new inputs are
    // written into them before each replay.
    let mut inputs = upload(1);
    stream
        .begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
        .unwrap();
    for (input, output) in inputs.iter().zip(outputs.iter_mut()) {
        comm.queue(GpuCall::all_reduce(input, output, ReduceOp::Sum).on_stream(&stream))
            .unwrap();
    }
    let graph = stream
        .end_capture(
            cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
        )
        .unwrap()
        .expect("a captured graph");
    for round in 1..=4 {
        for (call, input) in inputs.iter_mut().enumerate() {
            input
                .copy_from_host(&call_input(role.rank, round * 10 + call, counts[call]))
                .unwrap();
        }
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        assert!(comm.gpu_failure().is_none(), "{:?}", comm.gpu_failure());
        check(&outputs, round, &format!("graph replay {round}"));
    }
}

#[test]
fn gpu_handoff_stream_order_and_graph_replay_with_2_ranks() {
    run_ranks(
        "gpu_handoff_stream_order_and_graph_replay_with_2_ranks",
        2,
        LIMIT,
        stream_order_and_graph_replay,
    );
}

#[test]
fn host_memory_handoff_stream_order_and_graph_replay_with_2_ranks() {
    run_ranks(
        "host_memory_handoff_stream_order_and_graph_replay_with_2_ranks",
        2,
        LIMIT,
        stream_order_and_graph_replay_through_host_memory,
    );
}

/// On the GPU hand-off each call asked to stamps its end on the GPU's
/// clock: one stamp per call that launches (none for a call of no elements,
/// none past the slots asked for), in call order, each after the last launch
/// of its call (a call of three launches takes well over twice the time of
/// one of a third its size), results unchanged; asking again drops the
/// stamps so far, reading them stops the stamping. The host hand-off
/// refuses to stamp, saying what would.
fn calls_stamp_their_ends(role: Role) {
    let mut host_handoff = join(&role, "stamps-host", options(AlgorithmChoice::Auto));
    assert!(
        !host_handoff.hands_off_on_gpu(),
        "ranks sharing a GPU hand over on the host by default"
    );
    let refused = host_handoff.stamp_call_ends(4).unwrap_err().to_string();
    assert!(
        refused.contains("hands over on the host") && refused.contains("--handoff gpu"),
        "{refused}"
    );
    drop(host_handoff);

    for options in [handoff_options, host_memory_options] {
        let mut comm = join_handed_off(&role, "stamps", options(AlgorithmChoice::Auto));
        let gpu = comm.gpu().clone();
        // 9 MiB: one launch (by the copy engines through host memory); 33
        // MiB: three (the window holds 16 MiB for 2 ranks); 0: no launch.
        let counts = [
            2usize,
            2,
            7919,
            0,
            (1 << 20) + 3,
            (9 << 20) / 4,
            (33 << 20) / 4,
            2,
        ];
        let inputs: Vec<DeviceBuffer<f32>> = counts
            .iter()
            .enumerate()
            .map(|(call, &count)| {
                DeviceBuffer::from_host(&gpu, &call_input(role.rank, call, count)).unwrap()
            })
            .collect();
        let mut outputs: Vec<DeviceBuffer<f32>> = counts
            .iter()
            .map(|&count| DeviceBuffer::zeroed(&gpu, count).unwrap())
            .collect();
        let queue_all = |comm: &mut CudaCommunicator, outputs: &mut [DeviceBuffer<f32>]| {
            // Held until every call is queued, so no gap is the host's.
            let gate =
                StreamGate::hold(&gpu, &gpu.stream_handle(), Duration::from_secs(60)).unwrap();
            for (input, output) in inputs.iter().zip(outputs.iter_mut()) {
                comm.queue(GpuCall::all_reduce(input, output, ReduceOp::Sum))
                    .unwrap();
            }
            gate.open();
        };
        // Once unstamped (the kernels' first launches load them), then stamped.
        queue_all(&mut comm, &mut outputs);
        comm.wait_for_gpu().unwrap();
        assert!(
            comm.call_ends_ns().unwrap().is_empty(),
            "no stamps were asked for"
        );
        // Asked again before they are read, the stamps so far are dropped
        // (once their calls have run): only the later calls' are read.
        comm.stamp_call_ends(3).unwrap();
        queue_all(&mut comm, &mut outputs);
        comm.stamp_call_ends(6).unwrap();
        queue_all(&mut comm, &mut outputs);
        let ends = comm.call_ends_ns().unwrap();
        assert!(comm.gpu_failure().is_none(), "{:?}", comm.gpu_failure());
        for (call, output) in outputs.iter().enumerate() {
            assert!(
                output.to_host().unwrap() == call_expected(role.nranks, call, counts[call]),
                "rank {}: call {call} ({} elements) wrong with its end stamped",
                role.rank,
                counts[call]
            );
        }
        let path = comm.data_path().clone();
        assert_eq!(
            ends.len(),
            6,
            "rank {} ({path:?}): the six calls that launch, up to the slots: {ends:?}",
            role.rank
        );
        assert!(
            ends[0] > 0 && ends.windows(2).all(|pair| pair[1] > pair[0]),
            "rank {} ({path:?}): ends {ends:?}",
            role.rank
        );
        let (nine_mib, thirty_three_mib) = (ends[4] - ends[3], ends[5] - ends[4]);
        assert!(
            thirty_three_mib * 10 > nine_mib * 22,
            "rank {} ({path:?}): the 33 MiB call took {thirty_three_mib} ns, the 9 MiB call {nine_mib} ns: \
             stamped before its last launch ended?",
            role.rank
        );
        assert!(
            comm.call_ends_ns().unwrap().is_empty(),
            "reading the stamps stops them"
        );
    }
}

#[test]
fn calls_stamp_their_ends_with_2_ranks() {
    run_ranks(
        "calls_stamp_their_ends_with_2_ranks",
        2,
        LIMIT,
        calls_stamp_their_ends,
    );
}

#[test]
fn gpu_handoff_killed_rank_is_named_at_once() {
    killed_rank_is_named_at_once("gpu_handoff_killed_rank_is_named_at_once", handoff_options);
}

/// Through host memory a 4 MiB call goes by the copy engines, whose waits
/// are kernels of their own between the copies.
#[test]
fn host_memory_handoff_killed_rank_is_named_at_once() {
    killed_rank_is_named_at_once(
        "host_memory_handoff_killed_rank_is_named_at_once",
        host_memory_options,
    );
}

fn killed_rank_is_named_at_once(test: &str, options: fn(AlgorithmChoice) -> CudaOptions) {
    const VICTIM: usize = 1;
    // Far longer than the watchdog needs: a detection in time is its work.
    let timeout = Duration::from_secs(20);
    if let Some(role) = role() {
        let mut comm = join(
            &role,
            "h-killed",
            CudaOptions {
                handoff_timeout: timeout,
                ..options(AlgorithmChoice::Auto)
            },
        );
        let gpu = comm.gpu().clone();
        let mut buffer = DeviceBuffer::<f32>::zeroed(&gpu, 1 << 20).unwrap();
        if role.rank == VICTIM {
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(500));
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).expect("raise SIGKILL");
            });
        }
        let (error, waited) = loop {
            let started = Instant::now();
            if let Err(error) = comm.run(GpuCall::all_reduce_in_place(&mut buffer, ReduceOp::Sum)) {
                break (error, started.elapsed());
            }
        };
        assert!(
            waited < Duration::from_secs(5),
            "noticed after {waited:?} (the kernels' timeout is {timeout:?})"
        );
        match &error {
            EngineError::PeerDied { rank, .. } => assert_eq!(*rank, VICTIM),
            other => panic!(
                "rank {}: expected rank {VICTIM} named dead, got {other}",
                role.rank
            ),
        }
        // Refused from now on, at once, with the same error.
        let started = Instant::now();
        match comm.run(GpuCall::all_reduce_in_place(&mut buffer, ReduceOp::Sum)) {
            Err(EngineError::PeerDied { rank, .. }) => assert_eq!(rank, VICTIM),
            other => panic!("a later call: {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(comm);
        // The GPU is usable: a new (one-rank) communicator reduces.
        let mut alone = CudaCommunicator::init(
            &format!("{}-alone-{}", role.rendezvous, role.rank),
            0,
            1,
            gpu.clone(),
            options(AlgorithmChoice::Auto),
        )
        .unwrap();
        let mut ones = DeviceBuffer::<f32>::from_host(&gpu, &[1.0; 4096]).unwrap();
        alone
            .run(GpuCall::all_reduce_in_place(&mut ones, ReduceOp::Sum))
            .unwrap();
        assert_eq!(ones.to_host().unwrap(), vec![1.0; 4096]);
        return;
    }
    let outputs = wait_ranks(spawn_ranks(test, 2, &[0, 1]), LIMIT);
    assert_only_victim_killed(&outputs, VICTIM);
}

#[test]
fn gpu_handoff_silent_rank_is_named_at_the_timeout() {
    silent_rank_is_named_at_the_timeout(
        "gpu_handoff_silent_rank_is_named_at_the_timeout",
        handoff_options,
        1024,
    );
}

/// By the copy engines (4 MiB through host memory): one timeout ends the
/// call, not one per chunk's wait.
#[test]
fn host_memory_handoff_silent_rank_is_named_at_the_timeout() {
    silent_rank_is_named_at_the_timeout(
        "host_memory_handoff_silent_rank_is_named_at_the_timeout",
        host_memory_options,
        1 << 20,
    );
}

fn silent_rank_is_named_at_the_timeout(
    test: &str,
    options: fn(AlgorithmChoice) -> CudaOptions,
    count: usize,
) {
    const SILENT: usize = 1;
    let timeout = Duration::from_secs(2);
    run_ranks(test, 2, LIMIT, move |role| {
        let mut comm = join(
            &role,
            "h-silent",
            CudaOptions {
                handoff_timeout: timeout,
                ..options(AlgorithmChoice::Auto)
            },
        );
        if role.rank == SILENT {
            // Alive, but never calls: only the kernels' timeout can tell.
            std::thread::sleep(timeout * 3);
            return;
        }
        let gpu = comm.gpu().clone();
        let mut buffer = DeviceBuffer::<f32>::zeroed(&gpu, count).unwrap();
        let started = Instant::now();
        let error = comm
            .run(GpuCall::all_reduce_in_place(&mut buffer, ReduceOp::Sum))
            .expect_err("the silent rank never called");
        let waited = started.elapsed();
        assert!(
            waited >= timeout && waited < timeout * 3,
            "noticed after {waited:?} with a {timeout:?} timeout"
        );
        match error {
            EngineError::PeerUnresponsive { rank, .. } => assert_eq!(rank, SILENT),
            other => panic!("expected rank {SILENT} named unresponsive, got {other}"),
        }
    });
}

/// reduce_scatter, all_gather (out of place, and in place through the raw
/// call) and broadcast from every root on the GPU hand-off, every dtype,
/// at counts that take one launch and several, against the CPU reference.
fn other_collectives_on_the_gpu_handoff(role: Role) {
    other_collectives_handed_off(role, handoff_options);
}

fn other_collectives_through_host_memory(role: Role) {
    other_collectives_handed_off(role, host_memory_options);
}

fn other_collectives_handed_off(role: Role, options: fn(AlgorithmChoice) -> CudaOptions) {
    // 1 MiB windows: the counts below take one launch and several.
    const WINDOW: usize = 1 << 20;
    let mut comm = join_handed_off(
        &role,
        "h-others",
        CudaOptions {
            handoff_window: Some(WINDOW),
            ..options(AlgorithmChoice::Auto)
        },
    );
    let gpu = comm.gpu().clone();
    let (rank, nranks) = (role.rank, role.nranks);
    let window = comm.handoff_window().expect("the GPU hand-off");
    assert_eq!(window, WINDOW);
    let mut failures = Vec::new();
    // Exact small integers in every type: i (mod 7) + rank.
    let value = |r: usize, i: usize| ((i % 7) + r) as f64;
    for count in [0usize, 1, 7919, window / 4 + 3, 3 * window / 4 + 5] {
        // reduce_scatter, sum: rank r's output[i] = Σ_k value(k, r·count + i).
        let input: Vec<f32> = (0..nranks * count).map(|i| value(rank, i) as f32).collect();
        let input = DeviceBuffer::from_host(&gpu, &input).unwrap();
        let mut output = DeviceBuffer::<f32>::zeroed(&gpu, count).unwrap();
        comm.run(GpuCall::reduce_scatter(&input, &mut output, ReduceOp::Sum))
            .unwrap();
        let got = output.to_host().unwrap();
        if let Some(i) = (0..count).find(|&i| {
            got[i] != (0..nranks).map(|k| value(k, rank * count + i)).sum::<f64>() as f32
        }) {
            failures.push(format!(
                "reduce_scatter count {count}: element {i} is {}",
                got[i]
            ));
        }
        // all_gather: output[k·count + i] = value(k, i).
        let mine: Vec<i32> = (0..count).map(|i| value(rank, i) as i32).collect();
        let want: Vec<i32> = (0..nranks * count)
            .map(|j| value(j / count.max(1), j % count.max(1)) as i32)
            .collect();
        let input = DeviceBuffer::from_host(&gpu, &mine).unwrap();
        let mut output = DeviceBuffer::<i32>::zeroed(&gpu, nranks * count).unwrap();
        comm.run(GpuCall::all_gather(&input, &mut output)).unwrap();
        if output.to_host().unwrap() != want {
            failures.push(format!("all_gather count {count}: wrong"));
        }
        // In place: this rank's input already sits in its part of the output.
        let mut staged = vec![0i32; nranks * count];
        staged[rank * count..][..count].copy_from_slice(&mine);
        let in_place = DeviceBuffer::from_host(&gpu, &staged).unwrap();
        // SAFETY: `in_place` holds N·count i32s; this rank's part starts at
        // rank·count, and the wait below ends the call before it drops.
        let call = unsafe {
            GpuCall::from_raw(
                CallKind::AllGather,
                DType::I32,
                ReduceOp::Sum,
                count,
                in_place.address() + (rank * count * 4) as u64,
                in_place.address(),
                0,
            )
        };
        comm.queue(call).unwrap();
        comm.wait_for_gpu().unwrap();
        if in_place.to_host().unwrap() != want {
            failures.push(format!("all_gather in place, count {count}: wrong"));
        }
        // broadcast from every root, u8 and f64.
        for root in 0..nranks {
            let mut bytes = DeviceBuffer::from_host(
                &gpu,
                &(0..count)
                    .map(|i| (i * 3 + rank) as u8)
                    .collect::<Vec<u8>>(),
            )
            .unwrap();
            comm.run(GpuCall::broadcast(&mut bytes, root)).unwrap();
            if bytes.to_host().unwrap()
                != (0..count)
                    .map(|i| (i * 3 + root) as u8)
                    .collect::<Vec<u8>>()
            {
                failures.push(format!("broadcast u8 from {root}, count {count}: wrong"));
            }
            let mut wide = DeviceBuffer::from_host(
                &gpu,
                &(0..count)
                    .map(|i| value(rank, i) + 0.5)
                    .collect::<Vec<f64>>(),
            )
            .unwrap();
            comm.run(GpuCall::broadcast(&mut wide, root)).unwrap();
            if wide.to_host().unwrap()
                != (0..count)
                    .map(|i| value(root, i) + 0.5)
                    .collect::<Vec<f64>>()
            {
                failures.push(format!("broadcast f64 from {root}, count {count}: wrong"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "rank {rank}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let mut bytes = DeviceBuffer::<u8>::zeroed(&gpu, 4).unwrap();
    match comm.run(GpuCall::broadcast(&mut bytes, nranks)) {
        Err(EngineError::RootOutOfRange { root, .. }) => assert_eq!(root, nranks),
        other => panic!("root {nranks} of {nranks}: {other:?}"),
    }
}

#[test]
fn gpu_handoff_reduce_scatter_all_gather_broadcast_with_3_ranks() {
    run_ranks(
        "gpu_handoff_reduce_scatter_all_gather_broadcast_with_3_ranks",
        3,
        LIMIT,
        other_collectives_on_the_gpu_handoff,
    );
}

#[test]
fn host_memory_handoff_reduce_scatter_all_gather_broadcast_with_3_ranks() {
    run_ranks(
        "host_memory_handoff_reduce_scatter_all_gather_broadcast_with_3_ranks",
        3,
        LIMIT,
        other_collectives_through_host_memory,
    );
}

/// Each rank traces a GPU hand-off communicator (a kernel span per queued
/// call, placed on the host clock) and a host hand-off one (its waits for
/// the GPU), and reads its own trace file back.
fn traced_calls(role: Role) {
    let dir = std::env::temp_dir().join(format!("pcieipc-cuda-trace-{}", role.rendezvous));
    std::fs::create_dir_all(&dir).unwrap();
    let traced = |handoff: Handoff, name: &str| CudaOptions {
        control: CommOptions {
            trace: Some(dir.join(name)),
            ..options(AlgorithmChoice::Auto).control
        },
        handoff,
        ..options(AlgorithmChoice::Auto)
    };
    let read = |name: &str| -> Vec<serde_json::Value> {
        let file = pcieipc::trace::rank_file(&dir.join(name), role.rank);
        let trace: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        trace["traceEvents"].as_array().unwrap().clone()
    };
    const CALLS: usize = 5;
    let before = pcieipc::trace::monotonic_ns() as f64 / 1e3;
    {
        let mut comm = join_handed_off(&role, "t-gpu", traced(Handoff::Gpu, "gpu"));
        let gpu = comm.gpu().clone();
        let stream = gpu.new_stream().unwrap();
        let input = DeviceBuffer::from_host(&gpu, &vec![1.0f32; 1 << 20]).unwrap();
        let mut output = DeviceBuffer::<f32>::zeroed(&gpu, 1 << 20).unwrap();
        for _ in 0..CALLS {
            comm.queue(GpuCall::all_reduce(&input, &mut output, ReduceOp::Sum).on_stream(&stream))
                .unwrap();
        }
        stream.synchronize().unwrap();
    }
    let after = pcieipc::trace::monotonic_ns() as f64 / 1e3;
    let kernels: Vec<(f64, f64)> = read("gpu")
        .iter()
        .filter(|event| event["cat"] == "kernel")
        .map(|event| {
            assert_eq!(event["name"], "all_reduce");
            (
                event["ts"].as_f64().unwrap(),
                event["dur"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(kernels.len(), CALLS, "rank {}: {kernels:?}", role.rank);
    for (start, duration) in &kernels {
        assert!(*duration > 0.0, "a kernel span of {duration} µs");
        assert!(
            before <= *start && start + duration <= after,
            "rank {}: kernel span [{start}, +{duration}] outside [{before}, {after}]",
            role.rank
        );
    }
    assert!(
        kernels.windows(2).all(|pair| pair[0].0 < pair[1].0),
        "kernel spans in call order: {kernels:?}"
    );
    {
        let mut comm = join(&role, "t-host", traced(Handoff::Host, "host"));
        let gpu = comm.gpu().clone();
        let mut buffer = DeviceBuffer::from_host(&gpu, &vec![1.0f32; 4096]).unwrap();
        for _ in 0..3 {
            comm.run(GpuCall::all_reduce_in_place(&mut buffer, ReduceOp::Sum))
                .unwrap();
        }
    }
    let gpu_waits = read("host")
        .iter()
        .filter(|event| event["cat"] == "wait" && event["name"] == "GPU event")
        .count();
    assert!(
        gpu_waits >= 3,
        "rank {}: {gpu_waits} GPU event waits",
        role.rank
    );
}

#[test]
fn traced_calls_have_kernel_spans_and_gpu_waits() {
    run_ranks(
        "traced_calls_have_kernel_spans_and_gpu_waits",
        2,
        LIMIT,
        traced_calls,
    );
}

/// Through host memory, a traced call the copy engines move has a span per
/// copy, flag kernel and reduction (`gpu step`), each on the track of the
/// stream it ran on, as many as its chunks and meetings make, in queue
/// order on each track (a stream runs its work one after another), inside
/// the time of the calls.
fn traced_copy_engine_steps(role: Role) {
    let dir = std::env::temp_dir().join(format!("pcieipc-cuda-trace-{}", role.rendezvous));
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join("copies");
    let traced = CudaOptions {
        control: CommOptions {
            trace: Some(prefix.clone()),
            ..options(AlgorithmChoice::Auto).control
        },
        ..host_memory_options(AlgorithmChoice::Auto)
    };
    const CALLS: usize = 3;
    // 8 MiB: above the copy engines' threshold, two chunks a segment.
    const ELEMENTS: usize = 2 << 20;
    let before = pcieipc::trace::monotonic_ns() as f64 / 1e3;
    {
        let mut comm = join_handed_off(&role, "t-copies", traced);
        let gpu = comm.gpu().clone();
        let stream = gpu.new_stream().unwrap();
        let input = DeviceBuffer::from_host(&gpu, &vec![1.0f32; ELEMENTS]).unwrap();
        let mut output = DeviceBuffer::<f32>::zeroed(&gpu, ELEMENTS).unwrap();
        for _ in 0..CALLS {
            comm.queue(GpuCall::all_reduce(&input, &mut output, ReduceOp::Sum).on_stream(&stream))
                .unwrap();
        }
        stream.synchronize().unwrap();
        let sums = output.to_host().unwrap();
        assert!(sums.iter().all(|&sum| sum == role.nranks as f32));
    }
    let after = pcieipc::trace::monotonic_ns() as f64 / 1e3;
    let file = pcieipc::trace::rank_file(&prefix, role.rank);
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let track_name = |tid: &serde_json::Value| -> String {
        events
            .iter()
            .find(|e| e["ph"] == "M" && e["name"] == "thread_name" && &e["tid"] == tid)
            .map(|e| e["args"]["name"].as_str().unwrap().to_owned())
            .unwrap_or_else(|| panic!("rank {}: no name for track {tid}", role.rank))
    };
    let mut by_track: HashMap<String, Vec<(f64, f64, String)>> = HashMap::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for event in events.iter().filter(|e| e["cat"] == "gpu step") {
        let name = event["name"].as_str().unwrap().to_owned();
        let (start, duration) = (
            event["ts"].as_f64().unwrap(),
            event["dur"].as_f64().unwrap(),
        );
        assert!(
            before <= start && start + duration <= after && duration >= 0.0,
            "rank {}: {name} [{start}, +{duration}] outside [{before}, {after}]",
            role.rank
        );
        if name.contains("push") || name.contains("pull") || name.starts_with("results") {
            assert!(
                duration > 0.0,
                "rank {}: a copy of no time: {event}",
                role.rank
            );
            assert!(event["args"]["bytes"].as_i64().unwrap() > 0, "{event}");
            assert_eq!(event["args"]["peer"], (1 - role.rank) as i64, "{event}");
        }
        *counts.entry(name.clone()).or_default() += 1;
        by_track
            .entry(track_name(&event["tid"]))
            .or_default()
            .push((start, duration, name));
    }
    let launches = counts.get("meet").copied().unwrap_or(0) / 2;
    let chunks = counts.get("reduce").copied().unwrap_or(0);
    assert!(
        launches >= CALLS && chunks >= 2 * launches,
        "rank {}: {counts:?}",
        role.rank
    );
    for name in ["push", "pull", "results out", "results in"] {
        assert_eq!(
            counts.get(name),
            Some(&chunks),
            "rank {}: {counts:?}",
            role.rank
        );
    }
    for name in ["signal", "await"] {
        assert_eq!(
            counts.get(name),
            Some(&(2 * chunks)),
            "rank {}: {counts:?}",
            role.rank
        );
    }
    let mut tracks: Vec<&String> = by_track.keys().collect();
    tracks.sort();
    assert_eq!(
        tracks,
        ["copies from host", "copies to host"],
        "rank {}",
        role.rank
    );
    // A stream's steps one after another (timing events resolve about
    // half a microsecond).
    for (track, spans) in &mut by_track {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in spans.windows(2) {
            assert!(
                pair[1].0 >= pair[0].0 + pair[0].1 - 1.0,
                "rank {} {track}: {:?} overlaps {:?}",
                role.rank,
                pair[1],
                pair[0]
            );
        }
    }
    let pushes_first = by_track["copies to host"]
        .iter()
        .find(|span| span.2 != "meet")
        .map(|span| span.2.as_str());
    assert_eq!(pushes_first, Some("push"), "rank {}", role.rank);
}

#[test]
fn traced_host_memory_launches_have_a_span_per_copy_engine_step() {
    run_ranks(
        "traced_host_memory_launches_have_a_span_per_copy_engine_step",
        2,
        LIMIT,
        traced_copy_engine_steps,
    );
}

/// Ranks that make different calls on the GPU hand-off are told so at
/// once, with both calls, not left to wait out the timeout: through device
/// memory and through host memory.
fn mismatched_calls_handed_off(role: Role) {
    let timeout = Duration::from_secs(20);
    for (name, options) in [
        (
            "device",
            handoff_options as fn(AlgorithmChoice) -> CudaOptions,
        ),
        ("host", host_memory_options),
    ] {
        let mut comm = join_handed_off(
            &role,
            &format!("h-mismatch-{name}"),
            CudaOptions {
                handoff_timeout: timeout,
                ..options(AlgorithmChoice::Auto)
            },
        );
        let gpu = comm.gpu().clone();
        let count = 1000 + role.rank;
        let mut buffer = DeviceBuffer::<f32>::zeroed(&gpu, count).unwrap();
        let started = Instant::now();
        match comm.run(GpuCall::all_reduce_in_place(&mut buffer, ReduceOp::Sum)) {
            Err(EngineError::MismatchedCall {
                rank,
                call,
                peer,
                peer_call,
            }) => {
                assert_eq!((rank, peer), (role.rank, 1 - role.rank), "{name}");
                assert_eq!(call.count, count as u64, "{name}: our call");
                assert_eq!(peer_call.count, (1000 + 1 - role.rank) as u64, "{name}");
            }
            other => panic!(
                "rank {} ({name}): expected a mismatch, got {other:?}",
                role.rank
            ),
        }
        assert!(
            started.elapsed() < timeout / 4,
            "rank {} ({name}): the mismatch took {:?}",
            role.rank,
            started.elapsed()
        );
        // Every later call is refused with the same error.
        assert!(matches!(
            comm.run(GpuCall::all_reduce_in_place(&mut buffer, ReduceOp::Sum)),
            Err(EngineError::MismatchedCall { .. })
        ));
    }
}

#[test]
fn gpu_handoff_mismatched_calls_are_named_at_once() {
    run_ranks(
        "gpu_handoff_mismatched_calls_are_named_at_once",
        2,
        LIMIT,
        mismatched_calls_handed_off,
    );
}

/// A stream held by a gate runs nothing queued after it until the gate
/// opens, and a gate never opened opens itself once its time is up (a host
/// blocked queuing behind it cannot hold the stream for ever).
#[test]
fn a_stream_gate_holds_its_stream_until_opened_or_its_time_is_up() {
    let gpu = Gpu::open(0).expect("open GPU 0");
    let stream = gpu.stream_handle();
    let after = gpu.new_timing_event().expect("an event");

    let gate = StreamGate::hold(&gpu, &stream, Duration::from_secs(60)).expect("hold the stream");
    after.record(&stream).expect("record after the gate");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !after.is_complete(),
        "the stream ran past a gate that was not opened"
    );
    assert!(!gate.is_open());
    gate.open();
    let opened = Instant::now();
    after.synchronize().expect("wait for the stream");
    assert!(
        opened.elapsed() < Duration::from_secs(1),
        "the stream took {:?} to run once opened",
        opened.elapsed()
    );
    drop(gate);

    let held = Instant::now();
    let gate = StreamGate::hold(&gpu, &stream, Duration::from_millis(300)).expect("hold again");
    after.record(&stream).expect("record after the gate");
    after.synchronize().expect("wait for the stream");
    let waited = held.elapsed();
    assert!(
        (Duration::from_millis(300)..Duration::from_secs(10)).contains(&waited),
        "a gate held for at most 300 ms let the stream run after {waited:?}"
    );
    assert!(
        gate.is_open(),
        "the gate's time is up but it says it is shut"
    );
}
