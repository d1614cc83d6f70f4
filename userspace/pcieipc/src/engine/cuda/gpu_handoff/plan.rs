//! What a call on the GPU hand-off launches, from `schedule`: the algorithm
//! (`schedule::select` under the hand-off's limits), the window-sized pieces
//! the call is launched in (`schedule::clip`), and the two-shot segments
//! each rank owns (`schedule::Direct`, cut in the kernels' 16-byte vectors),
//! passed to the kernels as arguments; the grid a launch takes; and, through
//! host memory, which launches the copy engines move and in what chunks.
//! Pure arithmetic: no GPU.

use crate::engine::cuda::call::GpuCall;
use std::ops::Range;

use crate::engine::cuda::kernels::{
    HandoffKernel, HandoffLaunch, SegmentsArg, HANDOFF_BLOCKS, HANDOFF_MAX_RANKS,
};
use crate::engine::cuda::options::DEFAULT_ONE_SHOT_READ_BYTES;
use crate::engine::schedule::{self, clip, Direct, Limits};
use crate::engine::{Algorithm, AlgorithmChoice, CallKind, ReduceOp};

/// The kernels' vector: copies and reductions move whole 16-byte vectors
/// where every pointer is aligned, so a segment that starts on a vector
/// boundary of the buffer keeps them.
const VECTOR_BYTES: usize = 16;

/// Bytes of a launch's message that each block of its grid takes at least.
/// One pass of a block moves 32 KiB (512 threads, 4 vectors of 16 bytes
/// each), and every block raises and awaits its own flags at every peer, so
/// a small message spread over many blocks pays for many flag round trips:
/// through host memory, where each is a PCIe round trip, an 8-byte call
/// took 52 µs in 64 blocks and 15.5 µs in one (one H200, two ranks under
/// MPS).
const BYTES_PER_BLOCK: usize = 32 << 10;

/// Through host memory, by default a two-shot launch of at least this many
/// bytes moves by the copy engines (`copy_engines`); smaller ones by the
/// kernels' loads and stores, which start sooner: on one H200 (two ranks
/// under MPS) the kernels moved 2 MiB at 0.46 of the link's limit and the
/// copy engines 0.38, 4 MiB both about half, 8 MiB and more the copy engines
/// faster (`CudaOptions::copy_engines_from`).
pub(crate) const DEFAULT_COPY_ENGINES_FROM: usize = 4 << 20;

/// Through host memory, by default all_reduce goes one-shot while its
/// message times N − 1 is at most this (`CudaOptions::one_shot_read_budget`
/// unset; 256 KiB elsewhere). One-shot moves the same bytes through the
/// link as two-shot for 2 ranks, in one phase of PCIe round trips instead
/// of two: on H100s, 2 ranks under MPS, alternating with two-shot (three
/// runs), 512 KiB ran 1.09–1.22 times and 1 MiB 1.00–1.13 times as fast,
/// 2 MiB 0.92–0.95 (docs/results.md, Through host memory). With more ranks
/// each GPU reads N − 1 messages back, so the budget is of reads, as
/// elsewhere (measured with 2 ranks only).
const DEFAULT_THROUGH_HOST_ONE_SHOT_READ_BYTES: usize = 1 << 20;

/// The hand-off's one-shot budget per message (`limits`' `one_shot_bytes`)
/// for rank 0's `CudaOptions::one_shot_read_budget`: as set, or the path's
/// default read budget shared among the N − 1 peers a rank reads (in whole
/// vectors).
pub(super) fn one_shot_bytes(budget: Option<usize>, through_host: bool, nranks: usize) -> usize {
    budget.unwrap_or_else(|| {
        if through_host {
            (DEFAULT_THROUGH_HOST_ONE_SHOT_READ_BYTES / nranks.saturating_sub(1).max(1))
                .next_multiple_of(VECTOR_BYTES)
        } else {
            DEFAULT_ONE_SHOT_READ_BYTES
        }
    })
}

/// Bytes of a copy engines' chunk of one rank's segment, about, by default
/// (`CudaOptions::copy_chunk_bytes`): the copies of one chunk overlap the
/// reduction and the copies the other way of the chunks beside it, but
/// every chunk's flag kernels stall its streams for a while. On one H200,
/// two ranks, 64 MiB calls: 0.32 of the link's limit in chunks of 256 KiB,
/// 0.47 in 512 KiB, 0.69 in 1 MiB, 0.80 in 2 MiB, 0.85 in 4 MiB.
pub(crate) const DEFAULT_COPY_CHUNK_BYTES: usize = 4 << 20;

/// Chunks of a segment at least (where it has that many vectors), whatever
/// the chunk size: a segment in one chunk overlaps nothing, its copies up,
/// its reduction and its copies down one after the other. On H100s, two
/// ranks under MPS, 8 MiB calls (4 MiB segments), three runs: 0.62-0.69 of
/// the link's limit in one chunk of 4 MiB, 0.66-0.82 in two of 2 MiB; four
/// of 1 MiB no better than two.
const MIN_COPY_CHUNKS: usize = 2;

/// Chunks of one copy-engine launch at most: flag slots 0 to 62 (the last
/// of the 64 is the launch's meetings, `handoff_copies.cu`).
pub(super) const MAX_COPY_CHUNKS: usize = HANDOFF_BLOCKS - 1;

/// The grid of a kernel launch: a block per `BYTES_PER_BLOCK` of its
/// message, between one and `blocks` (the grid the ranks agreed on).
pub(super) fn grid(launch: &HandoffLaunch, element: usize, blocks: u32) -> u32 {
    (launch.elements * element)
        .div_ceil(BYTES_PER_BLOCK)
        .clamp(1, blocks.max(1) as usize) as u32
}

/// Whether `launch`, through host memory, goes by the copy engines: a
/// two-shot launch of at least `from_bytes`.
pub(super) fn by_copy_engines(launch: &HandoffLaunch, element: usize, from_bytes: usize) -> bool {
    launch.kernel == HandoffKernel::TwoShot && launch.elements * element >= from_bytes
}

/// How the copy engines cut a two-shot launch: `count` chunks of every
/// rank's segment, each `elements` long (whole vectors; a segment's last
/// chunks may be shorter or empty): about the chunk size each, and at least
/// `MIN_COPY_CHUNKS`. Every rank computes the same from the same launch, so
/// their flags agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CopyChunks {
    pub(super) count: usize,
    pub(super) elements: usize,
}

impl CopyChunks {
    /// The chunks of `launch` (two-shot) among `nranks` ranks, elements of
    /// `element` bytes, each at most about `chunk_bytes`.
    pub(super) fn of(
        launch: &HandoffLaunch,
        nranks: usize,
        element: usize,
        chunk_bytes: usize,
    ) -> CopyChunks {
        let vector = (VECTOR_BYTES / element).max(1);
        let longest = (0..nranks)
            .map(|rank| launch.segments.start[rank + 1] - launch.segments.start[rank])
            .max()
            .unwrap_or(0) as usize;
        let vectors = longest.div_ceil(vector).max(1);
        let count = (longest * element)
            .div_ceil(chunk_bytes)
            .max(MIN_COPY_CHUNKS.min(vectors))
            .clamp(1, MAX_COPY_CHUNKS);
        let elements = longest.div_ceil(count).div_ceil(vector).max(1) * vector;
        CopyChunks { count, elements }
    }

    /// Chunk `index` of `rank`'s segment of `launch`, in elements of the
    /// launch.
    pub(super) fn chunk(&self, launch: &HandoffLaunch, rank: usize, index: usize) -> Range<usize> {
        let segment =
            launch.segments.start[rank] as usize..launch.segments.start[rank + 1] as usize;
        clip(&segment, index, self.elements)
    }
}

/// What bounds the hand-off's automatic all_reduce choice: one-shot while
/// the message fits the one-shot budget (`one_shot_bytes`) and one window,
/// direct (two-shot) above: the hand-off has no ring. Each rank pushes a
/// one-shot message to every peer at once, so the budget is per peer: the
/// read budget is N − 1 times it.
pub(super) fn limits(one_shot_bytes: usize, window: usize, nranks: usize) -> Limits {
    Limits {
        one_shot_read_budget: one_shot_bytes.min(window) * nranks.saturating_sub(1).max(1),
        one_shot_max_ranks: HANDOFF_MAX_RANKS,
        direct_messages: Some(0..=usize::MAX),
    }
}

/// The algorithm a call of `kind` and `bytes` takes among `nranks` ranks:
/// for all_reduce `schedule::select`'s choice, for reduce_scatter and
/// all_gather the two-shot kernel's phases (direct), for broadcast one push
/// (one-shot).
pub(super) fn algorithm(
    kind: CallKind,
    bytes: usize,
    nranks: usize,
    choice: AlgorithmChoice,
    limits: &Limits,
) -> Algorithm {
    match kind {
        CallKind::AllReduce => schedule::select(choice, bytes, nranks, limits),
        CallKind::ReduceScatter | CallKind::AllGather => Algorithm::Direct,
        CallKind::Broadcast => Algorithm::OneShot,
    }
}

/// The launches that carry `call`, moved by `algorithm` among `nranks`
/// ranks through slots of `window` bytes, in order: one per window-sized
/// piece (for two-shot, N windows of whole vectors, each rank's segment of
/// the piece in one window).
pub(super) fn launches(
    call: &GpuCall,
    algorithm: Algorithm,
    nranks: usize,
    window: usize,
) -> Vec<HandoffLaunch> {
    let element = call.dtype.size_bytes();
    let vector = VECTOR_BYTES / element;
    let (kernel, piece, stride) = match (call.kind, algorithm) {
        (CallKind::AllReduce, Algorithm::OneShot) => (HandoffKernel::OneShot, window / element, 0),
        (CallKind::AllReduce, Algorithm::Direct) => (
            HandoffKernel::TwoShot,
            window / VECTOR_BYTES * nranks * vector,
            0,
        ),
        (CallKind::AllReduce, Algorithm::Ring) => {
            unreachable!("init keeps the ring on the host hand-off")
        }
        (CallKind::ReduceScatter, _) => {
            (HandoffKernel::ReduceScatter, window / element, call.count)
        }
        (CallKind::AllGather, _) => (HandoffKernel::AllGather, window / element, call.count),
        (CallKind::Broadcast, _) => (HandoffKernel::Broadcast, window / element, 0),
    };
    let divide_by = if call.op == ReduceOp::Avg {
        nranks as u32
    } else {
        0
    };
    let whole = 0..call.count;
    (0..call.count.div_ceil(piece))
        .map(|index| {
            let range = clip(&whole, index, piece);
            let offset = (range.start * element) as u64;
            HandoffLaunch {
                kernel,
                dst: call.output + offset,
                src: call.input + offset,
                elements: range.len(),
                stride,
                segments: match kernel {
                    HandoffKernel::TwoShot => segments(range.len(), nranks, vector),
                    _ => SegmentsArg::default(),
                },
                divide_by,
                root: call.root as u32,
            }
        })
        .collect()
}

/// Where each rank's segment of `count` elements starts (`Direct`'s
/// segments in whole vectors of `vector` elements), then `count`.
fn segments(count: usize, nranks: usize, vector: usize) -> SegmentsArg {
    let direct = Direct { count, nranks };
    SegmentsArg {
        start: std::array::from_fn(|rank| {
            if rank < nranks {
                direct.owned_aligned(rank, vector).start as u64
            } else {
                count as u64
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DType;

    const ONE_SHOT_BYTES: usize = 256 << 10;

    #[test]
    fn through_host_memory_the_default_one_shot_budget_is_1_mib_of_reads() {
        let auto = |bytes, nranks, through_host| {
            let per_message = one_shot_bytes(None, through_host, nranks);
            let limits = limits(per_message, 32 << 20, nranks);
            algorithm(
                CallKind::AllReduce,
                bytes,
                nranks,
                AlgorithmChoice::Auto,
                &limits,
            )
        };
        // 2 ranks through host: one-shot up to 1 MiB, two-shot above.
        assert_eq!(auto(1 << 20, 2, true), Algorithm::OneShot);
        assert_eq!(auto((1 << 20) + 16, 2, true), Algorithm::Direct);
        // Peer to peer: 256 KiB, as the host hand-off's staging.
        assert_eq!(auto(256 << 10, 2, false), Algorithm::OneShot);
        assert_eq!(auto((256 << 10) + 16, 2, false), Algorithm::Direct);
        // 4 ranks through host read 3 messages: 1 MiB / 3 each, in vectors.
        assert_eq!(one_shot_bytes(None, true, 4), 349_536);
        assert_eq!(auto(349_536, 4, true), Algorithm::OneShot);
        assert_eq!(auto(349_552, 4, true), Algorithm::Direct);
        // A budget set by rank 0 holds on either path, per message.
        assert_eq!(one_shot_bytes(Some(4 << 20), true, 2), 4 << 20);
        assert_eq!(one_shot_bytes(Some(64 << 10), false, 4), 64 << 10);
    }

    #[test]
    fn auto_takes_one_shot_within_the_budget_and_a_window_and_direct_above() {
        for nranks in 1..=HANDOFF_MAX_RANKS {
            for window in [64 << 10, 1 << 20, 32 << 20] {
                let limits = limits(ONE_SHOT_BYTES, window, nranks);
                let largest = ONE_SHOT_BYTES.min(window);
                for bytes in [0, 8, largest - 1, largest, largest + 1, 256 << 20] {
                    let expected = if bytes <= largest {
                        Algorithm::OneShot
                    } else {
                        Algorithm::Direct
                    };
                    let picked = algorithm(
                        CallKind::AllReduce,
                        bytes,
                        nranks,
                        AlgorithmChoice::Auto,
                        &limits,
                    );
                    assert_eq!(
                        picked, expected,
                        "{bytes} B, {nranks} ranks, window {window}"
                    );
                }
                for forced in [Algorithm::OneShot, Algorithm::Direct] {
                    let picked = algorithm(
                        CallKind::AllReduce,
                        256 << 20,
                        nranks,
                        AlgorithmChoice::Fixed(forced),
                        &limits,
                    );
                    assert_eq!(picked, forced);
                }
            }
        }
        let limits = limits(ONE_SHOT_BYTES, 1 << 20, 2);
        let other = |kind| algorithm(kind, 8, 2, AlgorithmChoice::Auto, &limits);
        assert_eq!(other(CallKind::ReduceScatter), Algorithm::Direct);
        assert_eq!(other(CallKind::AllGather), Algorithm::Direct);
        assert_eq!(other(CallKind::Broadcast), Algorithm::OneShot);
    }

    fn all_reduce(dtype: DType, count: usize) -> GpuCall<'static> {
        // SAFETY: the addresses are never used: only the plan is computed.
        unsafe {
            GpuCall::from_raw(
                CallKind::AllReduce,
                dtype,
                ReduceOp::Avg,
                count,
                0x1000_0000,
                0x2000_0000,
                0,
            )
        }
    }

    #[test]
    fn two_shot_segments_tile_each_piece_in_whole_vectors_within_a_window() {
        let window = 4096;
        for dtype in DType::ALL {
            let element = dtype.size_bytes();
            let vector = VECTOR_BYTES / element;
            for nranks in 1..=HANDOFF_MAX_RANKS {
                for count in [1, 5, 37, 4099, nranks * window / element * 3 + 7] {
                    let call = all_reduce(dtype, count);
                    let launches = launches(&call, Algorithm::Direct, nranks, window);
                    let mut covered = 0;
                    for launch in &launches {
                        assert_eq!(launch.kernel, HandoffKernel::TwoShot);
                        assert_eq!(launch.src, 0x1000_0000 + (covered * element) as u64);
                        assert_eq!(launch.dst, 0x2000_0000 + (covered * element) as u64);
                        assert_eq!(launch.divide_by, nranks as u32);
                        // Pieces after the first start on a vector.
                        assert_eq!(covered % vector, 0);
                        let start = &launch.segments.start;
                        assert_eq!(start[0], 0);
                        assert_eq!(start[nranks], launch.elements as u64);
                        for rank in 0..nranks {
                            let (from, to) = (start[rank] as usize, start[rank + 1] as usize);
                            assert!(from <= to, "{dtype:?} {nranks} ranks {count}: {start:?}");
                            assert!(to == launch.elements || to % vector == 0, "{start:?}");
                            assert!((to - from) * element <= window, "{start:?}");
                        }
                        covered += launch.elements;
                    }
                    assert_eq!(covered, count, "{dtype:?} {nranks} ranks");
                }
            }
        }
    }

    #[test]
    fn other_calls_go_in_window_sized_pieces_with_their_stride() {
        let window = 1 << 20;
        // SAFETY: the addresses are never used.
        let call = unsafe {
            GpuCall::from_raw(
                CallKind::AllGather,
                DType::I32,
                ReduceOp::Max,
                3 * window / 4 + 5,
                0,
                0,
                0,
            )
        };
        let launches = launches(&call, Algorithm::Direct, 3, window);
        let sizes: Vec<_> = launches.iter().map(|launch| launch.elements).collect();
        assert_eq!(sizes, [window / 4, window / 4, window / 4, 5]);
        assert!(launches
            .iter()
            .all(|launch| launch.stride == 3 * window / 4 + 5
                && launch.divide_by == 0
                && launch.kernel == HandoffKernel::AllGather));
        let one_shot = launches_of_count(7919);
        assert_eq!(one_shot.len(), 1);
        assert_eq!(one_shot[0].segments, SegmentsArg::default());
        assert!(launches_of_count(0).is_empty());
    }

    #[test]
    fn a_small_message_takes_few_blocks_and_a_large_one_the_agreed_grid() {
        let launch = |bytes: usize| HandoffLaunch {
            kernel: HandoffKernel::OneShot,
            dst: 0,
            src: 0,
            elements: bytes / 4,
            stride: 0,
            segments: SegmentsArg::default(),
            divide_by: 0,
            root: 0,
        };
        assert_eq!(grid(&launch(8), 4, 64), 1);
        assert_eq!(grid(&launch(BYTES_PER_BLOCK), 4, 64), 1);
        assert_eq!(grid(&launch(BYTES_PER_BLOCK + 4), 4, 64), 2);
        assert_eq!(grid(&launch(1 << 20), 4, 64), 32);
        assert_eq!(grid(&launch(1 << 20), 4, 8), 8);
        assert_eq!(grid(&launch(4 << 20), 4, 64), 64);
    }

    #[test]
    fn copy_chunks_cover_every_segment_in_order_within_the_flag_slots() {
        for dtype in DType::ALL {
            let element = dtype.size_bytes();
            let vector = VECTOR_BYTES / element;
            for nranks in 1..=HANDOFF_MAX_RANKS {
                let window = 16 << 20;
                for count in [1, 37, (1 << 20) / element + 3, nranks * window / element] {
                    let call = all_reduce(dtype, count);
                    for launch in launches(&call, Algorithm::Direct, nranks, window) {
                        let chunks =
                            CopyChunks::of(&launch, nranks, element, DEFAULT_COPY_CHUNK_BYTES);
                        assert!((1..=MAX_COPY_CHUNKS).contains(&chunks.count), "{chunks:?}");
                        assert_eq!(chunks.elements % vector, 0, "{chunks:?}");
                        for rank in 0..nranks {
                            let segment = launch.segments.start[rank] as usize
                                ..launch.segments.start[rank + 1] as usize;
                            let mut next = segment.start;
                            for index in 0..chunks.count {
                                let chunk = chunks.chunk(&launch, rank, index);
                                assert_eq!(chunk.start, next.min(segment.end));
                                assert!(chunk.len() <= chunks.elements);
                                next = chunk.end;
                            }
                            assert_eq!(next, segment.end, "{dtype:?} {nranks} {count} {chunks:?}");
                        }
                    }
                }
            }
        }
        // Every segment in two chunks at least, as long as it has two
        // vectors: 8 MiB among two ranks in two chunks of 2 MiB, not one of 4.
        let two_shot_of = |bytes: usize| {
            launches(
                &all_reduce(DType::F32, bytes / 4),
                Algorithm::Direct,
                2,
                16 << 20,
            )[0]
        };
        let chunks_of = |bytes| CopyChunks::of(&two_shot_of(bytes), 2, 4, DEFAULT_COPY_CHUNK_BYTES);
        assert_eq!(
            chunks_of(8 << 20),
            CopyChunks {
                count: 2,
                elements: (2 << 20) / 4
            }
        );
        assert_eq!(
            chunks_of(16 << 20),
            CopyChunks {
                count: 2,
                elements: (4 << 20) / 4
            }
        );
        assert_eq!(
            chunks_of(24 << 20),
            CopyChunks {
                count: 3,
                elements: (4 << 20) / 4
            }
        );
        assert_eq!(chunks_of(2 * VECTOR_BYTES).count, 1);
        assert_eq!(chunks_of(4 * VECTOR_BYTES).count, 2);
        // Through host memory only two-shot launches of the threshold or
        // more go by the copy engines.
        let two_shot = |count| {
            launches(
                &all_reduce(DType::F32, count),
                Algorithm::Direct,
                2,
                16 << 20,
            )[0]
        };
        let from = DEFAULT_COPY_ENGINES_FROM;
        assert!(!by_copy_engines(&two_shot(from / 4 - 4), 4, from));
        assert!(by_copy_engines(&two_shot(from / 4), 4, from));
        assert!(by_copy_engines(&two_shot(1), 4, 0));
        assert!(!by_copy_engines(&two_shot(64 << 20), 4, usize::MAX));
        assert!(!by_copy_engines(&launches_of_count(1 << 20)[0], 4, from));
    }

    fn launches_of_count(count: usize) -> Vec<HandoffLaunch> {
        launches(
            &all_reduce(DType::F32, count),
            Algorithm::OneShot,
            2,
            1 << 20,
        )
    }
}
