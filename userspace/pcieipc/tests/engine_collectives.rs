//! Every collective, dtype and op against a sequential reference, with the
//! ranks as separate processes: N = 2, 3, 4, 7; counts 0, 1, N−1, N+1 and a
//! prime for every dtype × op, 1 MiB + 3 for a subset; ring and one-shot; in
//! place and out of place.

mod engine_support;

use std::time::Duration;

use engine_support::{run_ranks, Role};
use pcieipc::engine::{
    bf16, f16, Algorithm, AlgorithmChoice, ChunkPolicy, CommOptions, Communicator, Element,
    EngineError, ReduceOp, StreamingStores, SEGMENT_NAME,
};

const LIMIT: Duration = Duration::from_secs(120);
/// Every dtype × op at 1 MiB + 3 takes 30 s on 7 ranks alone on the 2-core
/// development VM: room for it to share the cores with another test.
const LARGE_LIMIT: Duration = Duration::from_secs(300);
const PRIME: usize = 1009;
const LARGE: usize = (1 << 20) + 3;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A uniform draw in [0, 1) for (rank, index, stream).
fn unit(rank: usize, index: usize, stream: u64) -> f64 {
    let bits = splitmix(splitmix(stream ^ (rank as u64) << 40) ^ index as u64);
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

trait TestElement: Element {
    /// Unit roundoff of a float type; `None` for integers, which must match exactly.
    const UNIT_ROUNDOFF: Option<f64>;
    fn from_f64(value: f64) -> Self;
    fn to_f64(self) -> f64;
    fn from_bits(bits: u64) -> Self;

    fn generate(rank: usize, index: usize, op: ReduceOp) -> Self {
        let stream = op as u64 * 131 + Self::DTYPE as u64;
        let u = unit(rank, index, stream);
        match (Self::UNIT_ROUNDOFF, op) {
            (None, _) => Self::from_bits(splitmix(u.to_bits())),
            (Some(_), ReduceOp::Sum | ReduceOp::Avg) => Self::from_f64(2.0 * u - 1.0),
            // Magnitudes in [0.5, 2) keep a 7-rank product in every type's range.
            (Some(_), ReduceOp::Prod) => {
                let sign = if index % 3 == rank % 3 { -1.0 } else { 1.0 };
                Self::from_f64(sign * (0.5 + 1.5 * u))
            }
            (Some(_), ReduceOp::Min | ReduceOp::Max) => Self::from_f64(200.0 * u - 100.0),
        }
    }
}

macro_rules! float_test_element {
    ($ty:ty, $roundoff:expr, $from:expr, $to:expr) => {
        impl TestElement for $ty {
            const UNIT_ROUNDOFF: Option<f64> = Some($roundoff);
            fn from_f64(value: f64) -> Self {
                $from(value)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn from_bits(_: u64) -> Self {
                unreachable!("floats are generated from values")
            }
        }
    };
}

float_test_element!(f32, 1.0 / (1u64 << 24) as f64, |v| v as f32, |v: f32| v
    as f64);
float_test_element!(f64, 1.0 / (1u64 << 53) as f64, |v| v, |v| v);
float_test_element!(f16, 1.0 / (1u64 << 11) as f64, f16::from_f64, |v: f16| v
    .to_f64());
float_test_element!(bf16, 1.0 / (1u64 << 8) as f64, bf16::from_f64, |v: bf16| v
    .to_f64());

macro_rules! int_test_element {
    ($ty:ty) => {
        impl TestElement for $ty {
            const UNIT_ROUNDOFF: Option<f64> = None;
            fn from_f64(value: f64) -> Self {
                value as $ty
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_bits(bits: u64) -> Self {
                bits as $ty
            }
        }
    };
}

int_test_element!(i32);
int_test_element!(i64);
int_test_element!(u8);

/// The sequential reference: element i folded over ranks 0..N in order, plus
/// the bound on how far a float result may be from it (0 for exact).
fn reference<T: TestElement>(nranks: usize, count: usize, op: ReduceOp) -> Vec<(T, f64, f64)> {
    (0..count)
        .map(|i| {
            let values: Vec<T> = (0..nranks).map(|rank| T::generate(rank, i, op)).collect();
            let fold = |f: fn(T, T) -> T| values[1..].iter().fold(values[0], |acc, v| f(acc, *v));
            let exact = match op {
                ReduceOp::Sum => fold(T::sum),
                ReduceOp::Avg => fold(T::sum).div_by_ranks(nranks),
                ReduceOp::Prod => fold(T::prod),
                ReduceOp::Min => fold(T::min),
                ReduceOp::Max => fold(T::max),
            };
            let Some(u) = T::UNIT_ROUNDOFF else {
                return (exact, 0.0, 0.0);
            };
            let wide: Vec<f64> = values.iter().map(|v| v.to_f64()).collect();
            let magnitude: f64 = wide.iter().map(|v| v.abs()).sum();
            let steps = (nranks + 1) as f64;
            match op {
                ReduceOp::Min | ReduceOp::Max => (exact, exact.to_f64(), 0.0),
                ReduceOp::Sum => (exact, wide.iter().sum(), 2.0 * steps * u * magnitude),
                ReduceOp::Avg => {
                    let mean = wide.iter().sum::<f64>() / nranks as f64;
                    (
                        exact,
                        mean,
                        2.0 * steps * u * magnitude / nranks as f64 + 2.0 * u * mean.abs(),
                    )
                }
                ReduceOp::Prod => {
                    let product: f64 = wide.iter().product();
                    (exact, product, 2.0 * steps * u * product.abs())
                }
            }
        })
        .collect()
}

fn assert_matches<T: TestElement>(got: &[T], expected: &[(T, f64, f64)], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (i, (value, (exact, wide, tolerance))) in got.iter().zip(expected).enumerate() {
        if T::UNIT_ROUNDOFF.is_none() || *tolerance == 0.0 {
            assert_eq!(value, exact, "{what}: element {i}");
        } else {
            let error = (value.to_f64() - wide).abs();
            assert!(
                error <= *tolerance,
                "{what}: element {i} = {value:?}, reference {wide}, error {error} > {tolerance}"
            );
        }
    }
}

fn check_all_reduce<T: TestElement>(comm: &mut Communicator, counts: &[usize], ops: &[ReduceOp]) {
    let (rank, nranks) = (comm.rank(), comm.nranks());
    for &op in ops {
        for &count in counts {
            let expected = reference::<T>(nranks, count, op);
            let input: Vec<T> = (0..count).map(|i| T::generate(rank, i, op)).collect();
            let what = format!(
                "all_reduce {} {op} count {count} on {nranks} ranks via {}",
                T::DTYPE,
                comm.algorithm_for::<T>(count)
            );
            let mut output = vec![T::from_f64(0.0); count];
            comm.all_reduce(&input, &mut output, op).expect(&what);
            assert_matches(&output, &expected, &format!("{what}, out of place"));
            let mut buffer = input.clone();
            comm.all_reduce_in_place(&mut buffer, op).expect(&what);
            assert_matches(&buffer, &expected, &format!("{what}, in place"));
        }
    }
}

fn check_every_dtype(comm: &mut Communicator, counts: &[usize], ops: &[ReduceOp]) {
    check_all_reduce::<f32>(comm, counts, ops);
    check_all_reduce::<f64>(comm, counts, ops);
    check_all_reduce::<f16>(comm, counts, ops);
    check_all_reduce::<bf16>(comm, counts, ops);
    check_all_reduce::<i32>(comm, counts, ops);
    check_all_reduce::<i64>(comm, counts, ops);
    check_all_reduce::<u8>(comm, counts, ops);
}

fn check_reduce_scatter<T: TestElement>(comm: &mut Communicator, per_rank: usize, op: ReduceOp) {
    let (rank, nranks) = (comm.rank(), comm.nranks());
    let expected = reference::<T>(nranks, per_rank * nranks, op);
    let input: Vec<T> = (0..per_rank * nranks)
        .map(|i| T::generate(rank, i, op))
        .collect();
    let mut output = vec![T::from_f64(0.0); per_rank];
    let what = format!(
        "reduce_scatter {} {op} {per_rank} per rank on {nranks} ranks",
        T::DTYPE
    );
    comm.reduce_scatter(&input, &mut output, op).expect(&what);
    assert_matches(
        &output,
        &expected[rank * per_rank..(rank + 1) * per_rank],
        &what,
    );
}

fn check_all_gather<T: TestElement>(comm: &mut Communicator, per_rank: usize) {
    let (rank, nranks) = (comm.rank(), comm.nranks());
    let input: Vec<T> = (0..per_rank)
        .map(|i| T::generate(rank, i, ReduceOp::Max))
        .collect();
    let mut output = vec![T::from_f64(0.0); per_rank * nranks];
    let what = format!(
        "all_gather {} {per_rank} per rank on {nranks} ranks",
        T::DTYPE
    );
    comm.all_gather(&input, &mut output).expect(&what);
    for from in 0..nranks {
        let sent: Vec<T> = (0..per_rank)
            .map(|i| T::generate(from, i, ReduceOp::Max))
            .collect();
        assert_eq!(
            &output[from * per_rank..(from + 1) * per_rank],
            &sent[..],
            "{what}: rank {from}'s part"
        );
    }
}

fn check_broadcast<T: TestElement>(comm: &mut Communicator, count: usize) {
    let (rank, nranks) = (comm.rank(), comm.nranks());
    for root in 0..nranks {
        let mut buffer: Vec<T> = (0..count)
            .map(|i| T::generate(rank, i, ReduceOp::Min))
            .collect();
        let what = format!(
            "broadcast {} count {count} from {root} on {nranks} ranks",
            T::DTYPE
        );
        comm.broadcast(&mut buffer, root).expect(&what);
        let sent: Vec<T> = (0..count)
            .map(|i| T::generate(root, i, ReduceOp::Min))
            .collect();
        assert_eq!(buffer, sent, "{what}");
    }
}

/// Small chunks and one-shot windows, so that small counts still cross many
/// chunk and window boundaries.
fn small_window_options() -> CommOptions {
    CommOptions {
        chunk_policy: ChunkPolicy::fixed(256),
        one_shot_read_budget: 2048,
        in_flight: 2,
        spin: Duration::from_micros(5),
        ..CommOptions::default()
    }
}

fn every_collective_small(role: Role) {
    let n = role.nranks;
    let mut comm =
        Communicator::init(&role.rendezvous, role.rank, n, small_window_options()).expect("init");
    let counts = [0, 1, n - 1, n + 1, PRIME];
    for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::Direct] {
        comm.set_algorithm(AlgorithmChoice::Fixed(algorithm));
        check_every_dtype(&mut comm, &counts, &ReduceOp::ALL);
    }
    for per_rank in [0, 1, 7, 300] {
        check_reduce_scatter::<f32>(&mut comm, per_rank, ReduceOp::Sum);
        check_reduce_scatter::<i64>(&mut comm, per_rank, ReduceOp::Prod);
        check_reduce_scatter::<bf16>(&mut comm, per_rank, ReduceOp::Avg);
        check_reduce_scatter::<u8>(&mut comm, per_rank, ReduceOp::Min);
        check_all_gather::<f64>(&mut comm, per_rank);
        check_all_gather::<u8>(&mut comm, per_rank);
    }
    for count in [0, 1, PRIME] {
        check_broadcast::<i32>(&mut comm, count);
        check_broadcast::<f16>(&mut comm, count);
    }
}

#[test]
fn every_collective_dtype_and_op_on_2_ranks() {
    run_ranks(
        "every_collective_dtype_and_op_on_2_ranks",
        2,
        LIMIT,
        every_collective_small,
    );
}

#[test]
fn every_collective_dtype_and_op_on_3_ranks() {
    run_ranks(
        "every_collective_dtype_and_op_on_3_ranks",
        3,
        LIMIT,
        every_collective_small,
    );
}

#[test]
fn every_collective_dtype_and_op_on_4_ranks() {
    run_ranks(
        "every_collective_dtype_and_op_on_4_ranks",
        4,
        LIMIT,
        every_collective_small,
    );
}

#[test]
fn every_collective_dtype_and_op_on_7_ranks() {
    run_ranks(
        "every_collective_dtype_and_op_on_7_ranks",
        7,
        LIMIT,
        every_collective_small,
    );
}

/// The ring with every raw slot filled by non-temporal stores (by default
/// only where the ranks' data outgrows the cache): chunks of 1000 bytes, so
/// the copies start and end off the stores' 32-byte alignment.
fn streaming_slot_fills(role: Role) {
    let n = role.nranks;
    let options = CommOptions {
        chunk_policy: ChunkPolicy::fixed(1000),
        streaming_stores: StreamingStores::From(0),
        algorithm: AlgorithmChoice::Fixed(Algorithm::Ring),
        ..small_window_options()
    };
    let mut comm = Communicator::init(&role.rendezvous, role.rank, n, options).expect("init");
    assert_eq!(comm.streaming_stores_from(), Some(0), "rank {}", role.rank);
    check_every_dtype(
        &mut comm,
        &[0, 1, n - 1, n + 1, PRIME, 9973],
        &ReduceOp::ALL,
    );
    for per_rank in [1, 7, 300, 4099] {
        check_reduce_scatter::<f32>(&mut comm, per_rank, ReduceOp::Sum);
        check_reduce_scatter::<u8>(&mut comm, per_rank, ReduceOp::Max);
        check_all_gather::<f16>(&mut comm, per_rank);
    }
}

#[test]
fn streaming_slot_fills_are_exact_on_2_ranks() {
    run_ranks(
        "streaming_slot_fills_are_exact_on_2_ranks",
        2,
        LIMIT,
        streaming_slot_fills,
    );
}

#[test]
fn streaming_slot_fills_are_exact_on_3_ranks() {
    run_ranks(
        "streaming_slot_fills_are_exact_on_3_ranks",
        3,
        LIMIT,
        streaming_slot_fills,
    );
}

/// The options with the direct algorithm chosen for 4 MiB to 16 MiB (off by
/// default: the ring measured ahead on the CPUs the project runs on).
fn direct_window_options() -> CommOptions {
    CommOptions {
        direct_messages: (4 << 20)..=(16 << 20),
        ..CommOptions::default()
    }
}

/// Every dtype × op at 1 MiB + 3 elements, with the direct window at 4–16 MiB
/// (so the size picks the algorithm: the ring with its default chunks for 1-
/// and 2-byte types, direct for 4- and 8-byte ones) and again forced onto the
/// ring, so both large paths see every dtype and op on every rank count.
fn large_every_dtype_and_op(role: Role) {
    let mut comm = Communicator::init(
        &role.rendezvous,
        role.rank,
        role.nranks,
        direct_window_options(),
    )
    .expect("init");
    assert_eq!(comm.algorithm_for::<u8>(LARGE), Algorithm::Ring);
    assert_eq!(comm.algorithm_for::<f32>(LARGE), Algorithm::Direct);
    for algorithm in [
        AlgorithmChoice::Auto,
        AlgorithmChoice::Fixed(Algorithm::Ring),
    ] {
        comm.set_algorithm(algorithm);
        check_every_dtype(&mut comm, &[LARGE], &ReduceOp::ALL);
    }
}

#[test]
fn large_all_reduce_on_2_ranks() {
    run_ranks(
        "large_all_reduce_on_2_ranks",
        2,
        LARGE_LIMIT,
        large_every_dtype_and_op,
    );
}

#[test]
fn large_all_reduce_on_3_ranks() {
    run_ranks(
        "large_all_reduce_on_3_ranks",
        3,
        LARGE_LIMIT,
        large_every_dtype_and_op,
    );
}

#[test]
fn large_all_reduce_on_4_ranks() {
    run_ranks(
        "large_all_reduce_on_4_ranks",
        4,
        LARGE_LIMIT,
        large_every_dtype_and_op,
    );
}

#[test]
fn large_all_reduce_on_7_ranks() {
    run_ranks(
        "large_all_reduce_on_7_ranks",
        7,
        LARGE_LIMIT,
        large_every_dtype_and_op,
    );
}

/// Single-copy reads are the path on this host: if the init probe (every
/// rank reading its predecessor's memory with process_vm_readv) silently
/// always fell back to the relay slots, this fails. It checks the
/// collectives that use them on the way: the ring's single-copy all-gather,
/// and the direct all_reduce picked from 4 MiB to 16 MiB where asked.
fn single_copy_chosen(role: Role) {
    let n = role.nranks;
    let options = CommOptions {
        // Every size, so that small counts take the path too.
        single_copy_messages: 0..=usize::MAX,
        ..small_window_options()
    };
    let mut comm = Communicator::init(&role.rendezvous, role.rank, n, options).expect("init");
    assert!(
        comm.single_copy(),
        "rank {} fell back to the relay slots: can ranks read each other's memory here \
         (Yama ptrace_scope, seccomp)?",
        role.rank
    );
    comm.set_algorithm(AlgorithmChoice::Fixed(Algorithm::Ring));
    check_all_reduce::<f32>(&mut comm, &[0, 1, n + 1, PRIME], &[ReduceOp::Sum]);
    check_all_reduce::<i64>(&mut comm, &[PRIME], &[ReduceOp::Prod, ReduceOp::Avg]);
    check_all_gather::<u8>(&mut comm, 300);
    check_reduce_scatter::<i32>(&mut comm, 300, ReduceOp::Max);
    let comm = Communicator::init(
        &format!("{}-default", role.rendezvous),
        role.rank,
        n,
        CommOptions::default(),
    )
    .expect("init with the default options");
    assert!(comm.single_copy(), "rank {}: default options", role.rank);
    let picks =
        [1 << 20, LARGE, 4 << 20, 8 << 20, 16 << 20].map(|count| comm.algorithm_for::<u8>(count));
    assert_eq!(
        picks,
        [Algorithm::Ring; 5],
        "rank {}: the default options send no size direct",
        role.rank
    );
    // One-shot while a rank reads at most 16 KiB of its peers: from 32 KiB
    // on 2 ranks the ring measured ahead (docs/engine.md, Choice).
    let one_shot_most = (16 << 10) / (n - 1);
    assert_eq!(
        [one_shot_most, one_shot_most + 1, 32 << 10].map(|count| comm.algorithm_for::<u8>(count)),
        [Algorithm::OneShot, Algorithm::Ring, Algorithm::Ring],
        "rank {}: {one_shot_most} bytes, one more, 32 KiB",
        role.rank
    );
    drop(comm);
    let mut comm = Communicator::init(
        &format!("{}-direct", role.rendezvous),
        role.rank,
        n,
        direct_window_options(),
    )
    .expect("init with the direct window");
    assert!(comm.single_copy(), "rank {}: direct window", role.rank);
    let picks =
        [1 << 20, LARGE, 4 << 20, 8 << 20, 16 << 20].map(|count| comm.algorithm_for::<u8>(count));
    assert_eq!(
        picks,
        [
            Algorithm::Ring,
            Algorithm::Ring,
            Algorithm::Direct,
            Algorithm::Direct,
            Algorithm::Direct
        ],
        "rank {}: 1 MiB, 1 MiB + 3, 4 MiB, 8 MiB, 16 MiB",
        role.rank
    );
    assert_eq!(comm.algorithm_for::<u8>((16 << 20) + 1), Algorithm::Ring);
    // 4 MiB + 12 bytes: direct.
    check_all_reduce::<f32>(&mut comm, &[LARGE], &[ReduceOp::Sum, ReduceOp::Avg]);
    check_all_reduce::<i64>(&mut comm, &[LARGE / 2], &[ReduceOp::Prod]);
    // 2 MiB + 6 bytes: the ring, with its single-copy all-gather.
    check_all_reduce::<f16>(&mut comm, &[LARGE], &[ReduceOp::Max]);
}

#[test]
fn single_copy_is_chosen_on_2_ranks() {
    run_ranks(
        "single_copy_is_chosen_on_2_ranks",
        2,
        LIMIT,
        single_copy_chosen,
    );
}

#[test]
fn single_copy_is_chosen_on_3_ranks() {
    run_ranks(
        "single_copy_is_chosen_on_3_ranks",
        3,
        LIMIT,
        single_copy_chosen,
    );
}

/// With `single_copy: false` on `declining` ranks (all or one), every rank
/// falls back to the two-copy relay path, and the results stay exact.
fn relay_fallback(role: Role, declining: &[usize]) {
    let n = role.nranks;
    let options = CommOptions {
        single_copy: !declining.contains(&role.rank),
        single_copy_messages: 0..=usize::MAX,
        ..small_window_options()
    };
    let mut comm = Communicator::init(&role.rendezvous, role.rank, n, options).expect("init");
    assert!(
        !comm.single_copy(),
        "rank {} reads its predecessor's memory though ranks {declining:?} declined",
        role.rank
    );
    comm.set_algorithm(AlgorithmChoice::Fixed(Algorithm::Ring));
    check_every_dtype(
        &mut comm,
        &[0, 1, n - 1, n + 1, PRIME],
        &[ReduceOp::Sum, ReduceOp::Max],
    );
    for per_rank in [0, 1, 300] {
        check_all_gather::<f64>(&mut comm, per_rank);
        check_reduce_scatter::<f32>(&mut comm, per_rank, ReduceOp::Sum);
    }
    let mut comm = Communicator::init(
        &format!("{}-default", role.rendezvous),
        role.rank,
        n,
        CommOptions {
            single_copy: !declining.contains(&role.rank),
            ..CommOptions::default()
        },
    )
    .expect("init with the default options");
    assert!(!comm.single_copy(), "rank {}: default options", role.rank);
    assert_eq!(comm.algorithm_for::<f32>(LARGE), Algorithm::Ring);
    check_all_reduce::<f32>(&mut comm, &[LARGE], &[ReduceOp::Sum]);
    check_all_reduce::<i32>(&mut comm, &[LARGE], &[ReduceOp::Max]);
    // Direct needs the reads: forcing it is a clear error on every rank,
    // before any rank touches another's memory.
    comm.set_algorithm(AlgorithmChoice::Fixed(Algorithm::Direct));
    let mut buffer = vec![1.0f32; 1000];
    match comm.all_reduce_in_place(&mut buffer, ReduceOp::Sum) {
        Err(EngineError::AlgorithmUnavailable {
            algorithm: Algorithm::Direct,
            ..
        }) => {}
        other => panic!(
            "rank {}: expected AlgorithmUnavailable, got {other:?}",
            role.rank
        ),
    }
    assert_eq!(buffer, vec![1.0f32; 1000]);
    comm.set_algorithm(AlgorithmChoice::Auto);
    check_all_reduce::<f32>(&mut comm, &[PRIME], &[ReduceOp::Sum]);
}

#[test]
fn relay_fallback_is_exact_on_2_ranks() {
    run_ranks("relay_fallback_is_exact_on_2_ranks", 2, LIMIT, |role| {
        relay_fallback(role, &[0, 1])
    });
}

#[test]
fn one_rank_declining_makes_all_fall_back_on_3_ranks() {
    run_ranks(
        "one_rank_declining_makes_all_fall_back_on_3_ranks",
        3,
        LIMIT,
        |role| relay_fallback(role, &[1]),
    );
}

/// Ranks that disagree on the message sizes for the single-copy paths would
/// expect addresses where data comes, or pick different algorithms: they
/// all fall back to the relay slots instead.
#[test]
fn differing_single_copy_sizes_fall_back_on_2_ranks() {
    run_ranks(
        "differing_single_copy_sizes_fall_back_on_2_ranks",
        2,
        LIMIT,
        |role| {
            let odd = |all: usize, some: usize| if role.rank == 0 { 0..=all } else { 0..=some };
            for (name, options) in [
                (
                    "ring all-gather",
                    CommOptions {
                        single_copy_messages: odd(usize::MAX, 1 << 20),
                        ..small_window_options()
                    },
                ),
                (
                    "direct",
                    CommOptions {
                        direct_messages: odd(usize::MAX, 1 << 20),
                        ..small_window_options()
                    },
                ),
            ] {
                let mut comm = Communicator::init(
                    &format!("{}-{}", role.rendezvous, name.replace(' ', "-")),
                    role.rank,
                    2,
                    options,
                )
                .expect("init");
                assert!(
                    !comm.single_copy(),
                    "rank {}: {name} sizes differ",
                    role.rank
                );
                assert_eq!(comm.algorithm_for::<i32>(PRIME), Algorithm::Ring);
                check_all_reduce::<i32>(&mut comm, &[PRIME], &[ReduceOp::Sum]);
                check_all_gather::<u8>(&mut comm, 300);
            }
        },
    );
}

#[test]
fn single_rank_is_a_copy() {
    let mut comm =
        Communicator::init("unused-single-rank", 0, 1, CommOptions::default()).expect("init");
    let input = [1.5f32, -2.0, 3.25];
    let mut output = [0.0f32; 3];
    comm.all_reduce(&input, &mut output, ReduceOp::Avg)
        .expect("all_reduce");
    assert_eq!(output, input);
    let mut gathered = [0.0f32; 3];
    comm.all_gather(&input, &mut gathered).expect("all_gather");
    assert_eq!(gathered, input);
    // Buffers of the wrong length are refused, naming both lengths, and
    // leave the output alone.
    let mut short = [7.0f32; 2];
    let refused =
        |result: Result<(), EngineError>, what: &str, got: usize, expected: usize| match result {
            Err(EngineError::BufferLength {
                what: named,
                got: g,
                expected: e,
            }) => assert_eq!((named.starts_with(what), g, e), (true, got, expected)),
            other => panic!("{what}: expected BufferLength, got {other:?}"),
        };
    refused(
        comm.all_reduce(&input, &mut short, ReduceOp::Sum),
        "all_reduce",
        2,
        3,
    );
    refused(
        comm.reduce_scatter(&input, &mut short, ReduceOp::Sum),
        "reduce_scatter",
        3,
        2,
    );
    refused(comm.all_gather(&input, &mut short), "all_gather", 2, 3);
    assert_eq!(short, [7.0f32; 2]);
}

/// Where the ranks of `test` started by this process (or, in a rank, by
/// its parent) write their traces.
fn trace_prefix(test: &str, test_process: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("pcieipc-{test}-{test_process}"))
}

/// Calls of each class in `slot_fills`: past the first probe after the
/// trials (call 76: 64 kept calls after call 11; call 69 where the early
/// trial decided, 64 after call 4).
const FILL_CALLS: usize = 80;

/// With the default options, FILL_CALLS ring all_reduce calls of 64 KiB
/// and as many of 2 MiB (where the all-gather reads single-copy), each out
/// of place and in place: every result exact, whichever way the slots were
/// filled, and the calls' fills as rank 0 decided them, per size
/// (engine/slot_fill.rs).
fn slot_fills(role: Role, test: &str) {
    let options = CommOptions {
        trace: Some(trace_prefix(test, std::os::unix::process::parent_id())),
        ..CommOptions::default()
    };
    let mut comm =
        Communicator::init(&role.rendezvous, role.rank, role.nranks, options).expect("init");
    assert!(
        comm.streaming_stores_from().is_some(),
        "rank {}: no last-level cache in sysfs, so no slot-fill choice to test",
        role.rank
    );
    comm.set_algorithm(AlgorithmChoice::Fixed(Algorithm::Ring));
    for count in [16 << 10, 512 << 10] {
        for _ in 0..FILL_CALLS {
            check_all_reduce::<f32>(&mut comm, &[count], &[ReduceOp::Sum]);
        }
    }
}

/// Each call's slot fill from rank `rank`'s trace, in call order, per
/// message size in elements.
fn fills_traced(prefix: &std::path::Path, rank: usize) -> Vec<(i64, Vec<String>)> {
    let file = format!("{}.rank{rank}.json", prefix.display());
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
    std::fs::remove_file(&file).expect("remove the trace");
    let trace: serde_json::Value = serde_json::from_str(&text).expect("trace JSON");
    let mut calls: Vec<(i64, i64, String)> = trace["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|event| event["cat"] == "call" && event["name"] == "all_reduce")
        .map(|event| {
            let args = &event["args"];
            let fill = args["slot_fill"]
                .as_str()
                .expect("a ring call names its fill");
            let count = args["count"].as_i64().expect("count");
            (
                args["call"].as_i64().expect("call number"),
                count,
                fill.to_string(),
            )
        })
        .collect();
    calls.sort();
    let mut by_count: Vec<(i64, Vec<String>)> = Vec::new();
    for (_, count, fill) in calls {
        match by_count.last_mut() {
            Some((last, fills)) if *last == count => fills.push(fill),
            _ => by_count.push((count, vec![fill])),
        }
    }
    by_count
}

fn check_slot_fills(test: &str, nranks: usize) {
    run_ranks(test, nranks, LIMIT, |role| slot_fills(role, test));
    if engine_support::role().is_some() {
        return;
    }
    let prefix = trace_prefix(test, std::process::id());
    let fills: Vec<_> = (0..nranks)
        .map(|rank| fills_traced(&prefix, rank))
        .collect();
    for (rank, theirs) in fills.iter().enumerate().skip(1) {
        assert_eq!(
            theirs, &fills[0],
            "rank {rank} filled its slots unlike rank 0"
        );
    }
    let counts: Vec<i64> = fills[0].iter().map(|(count, _)| *count).collect();
    assert_eq!(counts, [16 << 10, 512 << 10]);
    for (count, fills) in &fills[0] {
        assert_eq!(fills.len(), 2 * FILL_CALLS, "count {count}");
        // Out of place and in place alternate, each its own class of
        // FILL_CALLS calls: call 3 of a class tries the other fill (unlike
        // the call before). Where that early trial decided, calls 5 to 68
        // keep one fill and call 69, the first probe, tries the other;
        // otherwise calls 8 and 10 try it, and so does call 76, the first
        // probe after them (a slowing of the kept fill cannot bring a probe
        // sooner).
        for (placement, first) in [("out of place", 0), ("in place", 1)] {
            let class: Vec<&String> = fills.iter().skip(first).step_by(2).collect();
            let decided_early = class[8] == class[7];
            let tries = if decided_early {
                assert!(
                    class[5..69].iter().all(|fill| *fill == class[5]),
                    "count {count} {placement}: a probe within 64 calls of a decision: {class:?}"
                );
                vec![3, 69]
            } else {
                vec![3, 8, 10, 76]
            };
            for trial in tries {
                assert_ne!(
                    class[trial],
                    class[trial - 1],
                    "count {count} {placement}, call {trial}: {class:?}"
                );
            }
        }
        assert!(fills
            .iter()
            .all(|fill| fill == "cached" || fill == "bypass"));
        assert!(fills.iter().filter(|fill| *fill == "bypass").count() >= 2);
    }
}

/// Pages of this process's mappings of the shm segment that are present in
/// its page tables (bit 63 of each `/proc/self/pagemap` entry, readable
/// without privilege). A page a call faults in turns present, so comparing
/// two counts tells whether the calls between them faulted in the segment,
/// unlike the thread's fault count, which also counts code and stack pages
/// that a path taken for the first time touches (a futex sleep under load).
fn present_segment_pages() -> usize {
    use std::io::{Read, Seek, SeekFrom};
    const PRESENT: u64 = 1 << 63;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .expect("sysconf")
        .expect("a page size") as u64;
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let mut pagemap = std::fs::File::open("/proc/self/pagemap").expect("open /proc/self/pagemap");
    let mut present = 0;
    let mut segments = 0;
    for line in maps.lines().filter(|line| line.contains(SEGMENT_NAME)) {
        let range = line.split_whitespace().next().expect("an address range");
        let (start, end) = range.split_once('-').expect("start-end");
        let start = u64::from_str_radix(start, 16).expect("hex start");
        let end = u64::from_str_radix(end, 16).expect("hex end");
        let mut entries = vec![0u8; ((end - start) / page * 8) as usize];
        pagemap
            .seek(SeekFrom::Start(start / page * 8))
            .expect("seek /proc/self/pagemap");
        pagemap
            .read_exact(&mut entries)
            .expect("read /proc/self/pagemap");
        present += entries
            .chunks_exact(8)
            .filter(|entry| u64::from_ne_bytes((*entry).try_into().unwrap()) & PRESENT != 0)
            .count();
        segments += 1;
    }
    assert!(
        segments > 0,
        "no mapping of {SEGMENT_NAME} in /proc/self/maps"
    );
    present
}

/// A message size's first ring call backs every slot the size's calls
/// cycle through, so its later calls fault in no page of the segment: left
/// to the calls, the first five at 64 KiB each faulted in the next slot
/// (engine/comm/streams.rs, `StreamCounts::back`). 64 KiB and 256 KiB
/// (chunks through both streams) and 2 MiB (1 MiB chunks, two raw slots,
/// the all-gather read single-copy), out of place.
fn slots_backed_before_use(role: Role) {
    let mut comm = Communicator::init(
        &role.rendezvous,
        role.rank,
        role.nranks,
        CommOptions::default(),
    )
    .expect("init");
    comm.set_algorithm(AlgorithmChoice::Fixed(Algorithm::Ring));
    for count in [16 << 10, 64 << 10, 512 << 10] {
        let input: Vec<f32> = (0..count).map(|i| (i % 7) as f32).collect();
        let mut output = vec![0.0f32; count];
        comm.all_reduce(&input, &mut output, ReduceOp::Sum)
            .expect("first call");
        let present_before = present_segment_pages();
        for _ in 0..4 {
            comm.all_reduce(&input, &mut output, ReduceOp::Sum)
                .expect("later call");
        }
        let faulted = present_segment_pages() - present_before;
        assert_eq!(
            faulted,
            0,
            "rank {}: {} bytes: calls 2 to 5 faulted in {faulted} pages of the segment",
            role.rank,
            count * 4
        );
        let nranks = role.nranks as f32;
        assert!(
            (0..count).all(|i| output[i] == (i % 7) as f32 * nranks),
            "rank {}: {} bytes: wrong sum",
            role.rank,
            count * 4
        );
    }
}

#[test]
fn a_sizes_later_calls_take_no_page_fault_on_2_ranks() {
    run_ranks(
        "a_sizes_later_calls_take_no_page_fault_on_2_ranks",
        2,
        LIMIT,
        slots_backed_before_use,
    );
}

#[test]
fn a_sizes_later_calls_take_no_page_fault_on_3_ranks() {
    run_ranks(
        "a_sizes_later_calls_take_no_page_fault_on_3_ranks",
        3,
        LIMIT,
        slots_backed_before_use,
    );
}

#[test]
fn slot_fills_are_probed_and_agreed_on_2_ranks() {
    check_slot_fills("slot_fills_are_probed_and_agreed_on_2_ranks", 2);
}

#[test]
fn slot_fills_are_probed_and_agreed_on_3_ranks() {
    check_slot_fills("slot_fills_are_probed_and_agreed_on_3_ranks", 3);
}
