//! The ring: reduce-scatter then all-gather, each segment passed once round
//! the ring per phase, pipelined in chunks.
//!
//! Segment s of the buffer is reduced along the ring so that rank s ends up
//! owning it (reduce-scatter: at step k rank r sends segment r−1−k), then each
//! segment travels once more round the ring (all-gather: at step k rank r
//! sends segment r−k). reduce_scatter and all_gather are the two halves alone.

use std::ops::Range;

use super::partition::{clip, part};

/// Which ring collective, and so which segments each step moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingKind {
    AllReduce,
    ReduceScatter,
    AllGather,
}

/// What a rank does with the chunk it receives at a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepRole {
    /// Reduces it with its own contribution and forwards the partial result.
    Accumulate,
    /// Reduces it with its own contribution into its output: the segment is
    /// finished (and forwarded, if the all-gather follows).
    Finish,
    /// Copies the finished segment into its output (and forwards it).
    Gather,
}

/// The ring schedule of one call over `nranks` ranks. `per_rank` counts
/// elements as the call does: the whole buffer for all_reduce, one rank's
/// share for reduce_scatter and all_gather.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    pub kind: RingKind,
    pub nranks: usize,
    pub per_rank: usize,
}

impl Ring {
    /// Steps each chunk makes round the ring: 2(N−1) for all_reduce, N−1 for
    /// the halves.
    pub fn steps(&self) -> usize {
        let hops = self.nranks.saturating_sub(1);
        match self.kind {
            RingKind::AllReduce => 2 * hops,
            RingKind::ReduceScatter | RingKind::AllGather => hops,
        }
    }

    pub fn successor(&self, rank: usize) -> usize {
        (rank + 1) % self.nranks
    }

    pub fn predecessor(&self, rank: usize) -> usize {
        (rank + self.nranks - 1) % self.nranks
    }

    /// Elements of the whole message the call moves.
    pub fn message_elements(&self) -> usize {
        match self.kind {
            RingKind::AllReduce => self.per_rank,
            RingKind::ReduceScatter | RingKind::AllGather => self.per_rank * self.nranks,
        }
    }

    /// Segment `s` in the index space of the whole N-segment message.
    pub fn segment(&self, s: usize) -> Range<usize> {
        match self.kind {
            RingKind::AllReduce => part(self.per_rank, self.nranks, s),
            RingKind::ReduceScatter | RingKind::AllGather => {
                s * self.per_rank..(s + 1) * self.per_rank
            }
        }
    }

    /// Where segment `s` lives in a rank's input (all_gather's input holds
    /// one segment only).
    pub fn input_range(&self, s: usize) -> Range<usize> {
        match self.kind {
            RingKind::AllGather => 0..self.per_rank,
            _ => self.segment(s),
        }
    }

    /// Where segment `s` lives in a rank's output (reduce_scatter's output
    /// holds one segment only).
    pub fn output_range(&self, s: usize) -> Range<usize> {
        match self.kind {
            RingKind::ReduceScatter => 0..self.per_rank,
            _ => self.segment(s),
        }
    }

    /// The segment `rank` sends at step `k`.
    pub fn sent_segment(&self, rank: usize, k: usize) -> usize {
        let n = self.nranks;
        let back = match self.kind {
            RingKind::AllReduce if k < n - 1 => 1 + k,
            RingKind::AllReduce => k - (n - 1),
            RingKind::ReduceScatter => 1 + k,
            RingKind::AllGather => k,
        };
        (rank + n * 2 - back % n) % n
    }

    /// The segment `rank` receives at step `k`: its predecessor's.
    pub fn received_segment(&self, rank: usize, k: usize) -> usize {
        self.sent_segment(self.predecessor(rank), k)
    }

    /// The last reduce-scatter step, after which every rank owns one finished
    /// segment; `None` for all_gather.
    pub fn last_reduce(&self) -> Option<usize> {
        match self.kind {
            RingKind::AllReduce | RingKind::ReduceScatter => Some(self.nranks.saturating_sub(2)),
            RingKind::AllGather => None,
        }
    }

    /// What the receiver of step `k`'s chunk does with it.
    pub fn role(&self, k: usize) -> StepRole {
        match self.last_reduce() {
            Some(last) if k < last => StepRole::Accumulate,
            Some(last) if k == last => StepRole::Finish,
            _ => StepRole::Gather,
        }
    }

    /// Whether the receiver of step `k` sends the result on as step k + 1.
    pub fn forwards(&self, k: usize) -> bool {
        k + 1 < self.steps()
    }

    /// Chunks of `chunk_elements` the longest segment splits into (at least
    /// one, so that empty calls still meet).
    pub fn chunks(&self, chunk_elements: usize) -> usize {
        self.longest_segment().div_ceil(chunk_elements).max(1)
    }

    /// Elements of the longest of the N segments.
    pub fn longest_segment(&self) -> usize {
        (0..self.nranks)
            .map(|s| self.segment(s).len())
            .max()
            .unwrap_or(0)
    }

    /// Chunk `chunk` of segment `s` of the message.
    pub fn chunk(&self, s: usize, chunk: usize, chunk_elements: usize) -> Range<usize> {
        clip(&self.segment(s), chunk, chunk_elements)
    }

    /// Pipelining with `lag` chunks of slack per step: the message of (step
    /// k, chunk c) is sent in iteration c + k·lag and received in the
    /// successor's iteration c + (k+1)·lag, so a rank that is briefly late
    /// does not stall its neighbours until they run `lag` chunks ahead of it
    /// at every step. Iterations run from 0 to `iterations` (exclusive).
    pub fn iterations(&self, chunks: usize, lag: usize) -> usize {
        chunks + self.steps() * lag
    }

    /// The chunk a rank receives at step `k` in `iteration`, if any.
    pub fn received_chunk(
        &self,
        iteration: usize,
        k: usize,
        lag: usize,
        chunks: usize,
    ) -> Option<usize> {
        iteration
            .checked_sub((k + 1) * lag)
            .filter(|chunk| *chunk < chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [RingKind; 3] = [
        RingKind::AllReduce,
        RingKind::ReduceScatter,
        RingKind::AllGather,
    ];

    #[test]
    fn sent_segments_on_four_ranks() {
        // (kind, rank, segment sent at each step)
        let table: [(RingKind, usize, &[usize]); 6] = [
            (RingKind::AllReduce, 0, &[3, 2, 1, 0, 3, 2]),
            (RingKind::AllReduce, 2, &[1, 0, 3, 2, 1, 0]),
            (RingKind::ReduceScatter, 0, &[3, 2, 1]),
            (RingKind::ReduceScatter, 1, &[0, 3, 2]),
            (RingKind::AllGather, 0, &[0, 3, 2]),
            (RingKind::AllGather, 3, &[3, 2, 1]),
        ];
        for (kind, rank, expected) in table {
            let ring = Ring {
                kind,
                nranks: 4,
                per_rank: 100,
            };
            let sent: Vec<usize> = (0..ring.steps())
                .map(|k| ring.sent_segment(rank, k))
                .collect();
            assert_eq!(sent, expected, "{kind:?} rank {rank}");
        }
    }

    #[test]
    fn roles_by_step() {
        use StepRole::{Accumulate, Finish, Gather};
        let table: [(RingKind, usize, &[StepRole]); 5] = [
            (RingKind::AllReduce, 2, &[Finish, Gather]),
            (
                RingKind::AllReduce,
                4,
                &[Accumulate, Accumulate, Finish, Gather, Gather, Gather],
            ),
            (RingKind::ReduceScatter, 3, &[Accumulate, Finish]),
            (RingKind::AllGather, 3, &[Gather, Gather]),
            (RingKind::AllReduce, 1, &[]),
        ];
        for (kind, nranks, expected) in table {
            let ring = Ring {
                kind,
                nranks,
                per_rank: 10,
            };
            let roles: Vec<StepRole> = (0..ring.steps()).map(|k| ring.role(k)).collect();
            assert_eq!(roles, expected, "{kind:?} on {nranks}");
        }
    }

    /// Runs the schedule on sets of contributions (bit r: rank r's) and
    /// checks that each rank ends with what its collective promises, that a
    /// forwarded chunk is the segment the sender's next step sends, and that
    /// each step's own contribution comes from the segment received.
    #[test]
    fn every_rank_ends_with_every_contribution() {
        for kind in KINDS {
            for nranks in 2..=8 {
                let ring = Ring {
                    kind,
                    nranks,
                    per_rank: 64,
                };
                let all = (1u32 << nranks) - 1;
                let steps = ring.steps();
                // sent[r][k]: the set rank r sends at step k.
                let mut sent = vec![vec![0u32; steps]; nranks];
                let mut output = vec![vec![0u32; nranks]; nranks];
                for (r, first) in sent.iter_mut().enumerate() {
                    first[0] = 1 << r;
                }
                if kind == RingKind::AllGather {
                    for (r, out) in output.iter_mut().enumerate() {
                        out[r] = 1 << r;
                    }
                }
                for k in 0..steps {
                    for r in 0..nranks {
                        let incoming = sent[ring.predecessor(r)][k];
                        let s = ring.received_segment(r, k);
                        let result = match ring.role(k) {
                            StepRole::Accumulate | StepRole::Finish => {
                                assert_eq!(
                                    incoming & (1 << r),
                                    0,
                                    "{kind:?}/{nranks}: rank {r} counted twice"
                                );
                                incoming | 1 << r
                            }
                            StepRole::Gather => incoming,
                        };
                        if ring.role(k) != StepRole::Accumulate {
                            output[r][s] = result;
                        }
                        if ring.forwards(k) {
                            assert_eq!(
                                ring.sent_segment(r, k + 1),
                                s,
                                "{kind:?}/{nranks} step {k}"
                            );
                            sent[r][k + 1] = result;
                        }
                    }
                }
                for (r, out) in output.iter().enumerate() {
                    match kind {
                        RingKind::AllReduce => {
                            assert!(out.iter().all(|set| *set == all), "{nranks}: {out:?}")
                        }
                        RingKind::ReduceScatter => assert_eq!(out[r], all, "{nranks}: rank {r}"),
                        RingKind::AllGather => {
                            for (s, set) in out.iter().enumerate() {
                                assert_eq!(*set, 1 << s, "{nranks}: rank {r} segment {s}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ranges_of_the_halves_hold_one_segment() {
        let scatter = Ring {
            kind: RingKind::ReduceScatter,
            nranks: 3,
            per_rank: 5,
        };
        assert_eq!(scatter.segment(2), 10..15);
        assert_eq!(scatter.input_range(2), 10..15);
        assert_eq!(scatter.output_range(2), 0..5);
        assert_eq!(scatter.message_elements(), 15);
        let gather = Ring {
            kind: RingKind::AllGather,
            ..scatter
        };
        assert_eq!(gather.input_range(2), 0..5);
        assert_eq!(gather.output_range(2), 10..15);
        let reduce = Ring {
            kind: RingKind::AllReduce,
            nranks: 3,
            per_rank: 7,
        };
        assert_eq!(reduce.segment(0), 0..3);
        assert_eq!(reduce.output_range(2), 5..7);
        assert_eq!(reduce.message_elements(), 7);
    }

    #[test]
    fn pipeline_runs_each_chunk_once_per_step_in_order() {
        let ring = Ring {
            kind: RingKind::AllReduce,
            nranks: 3,
            per_rank: 1000,
        };
        assert_eq!(ring.chunks(100), 4); // segments of 334
        assert_eq!(ring.chunks(1000), 1);
        assert_eq!(
            Ring {
                per_rank: 0,
                ..ring
            }
            .chunks(100),
            1
        );
        for lag in [1, 2, 4] {
            let chunks = 5;
            for k in 0..ring.steps() {
                let seen: Vec<usize> = (0..ring.iterations(chunks, lag))
                    .filter_map(|i| ring.received_chunk(i, k, lag, chunks))
                    .collect();
                assert_eq!(seen, (0..chunks).collect::<Vec<_>>(), "lag {lag} step {k}");
                // Received one lag after the sender's step sent it.
                let first = (0..ring.iterations(chunks, lag))
                    .find(|i| ring.received_chunk(*i, k, lag, chunks) == Some(0));
                assert_eq!(first, Some((k + 1) * lag));
            }
        }
        assert_eq!(ring.chunk(2, 3, 100), 967..1000);
    }
}
