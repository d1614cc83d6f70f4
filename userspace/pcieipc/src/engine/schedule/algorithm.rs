//! Which algorithm moves an all_reduce.
//!
//! The ring moves 2(N-1)/N of the buffer per rank and is bandwidth-optimal, but
//! its 2(N-1) dependent steps cost latency. The one-shot path has every rank
//! publish its whole buffer and reduce all N of them itself: one step, (N-1)
//! buffers read, the right trade for small messages. The direct algorithm
//! moves what the ring moves, but straight between the ranks' own buffers
//! (where the transport lets ranks read each other's memory): each rank reduces its
//! own segment from every peer's input, then copies every other segment from
//! its owner, with no relay copies and three meetings per call.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Algorithm {
    /// Reduce-scatter then all-gather around the ring, pipelined in chunks.
    Ring = 1,
    /// Every rank reads every peer's whole buffer and reduces locally.
    OneShot = 2,
    /// Rank r reduces segment r itself, reading it straight from every peer's
    /// input, then reads every other segment straight from its owner's
    /// output: the ring's traffic with no relay hops and three meetings per
    /// call, where the transport lets ranks read each other's memory.
    Direct = 3,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::OneShot => "one-shot",
            Algorithm::Direct => "direct",
        }
    }

    pub fn from_wire(code: u8) -> Option<Algorithm> {
        [Algorithm::Ring, Algorithm::OneShot, Algorithm::Direct]
            .into_iter()
            .find(|algorithm| *algorithm as u8 == code)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the communicator picks the all_reduce algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlgorithmChoice {
    /// By message size, rank count and transport: see [`select`].
    Auto,
    /// Always this one (tests and benchmarks force each path).
    Fixed(Algorithm),
}

/// A name that is not `auto`, `ring`, `one-shot` or `direct`.
#[derive(Debug, thiserror::Error)]
#[error("unknown algorithm {0:?} (auto, ring, one-shot, direct)")]
pub struct UnknownAlgorithm(pub String);

impl FromStr for AlgorithmChoice {
    type Err = UnknownAlgorithm;
    fn from_str(name: &str) -> Result<AlgorithmChoice, UnknownAlgorithm> {
        match name {
            "auto" => Ok(AlgorithmChoice::Auto),
            "ring" => Ok(AlgorithmChoice::Fixed(Algorithm::Ring)),
            "one-shot" | "oneshot" => Ok(AlgorithmChoice::Fixed(Algorithm::OneShot)),
            "direct" => Ok(AlgorithmChoice::Fixed(Algorithm::Direct)),
            _ => Err(UnknownAlgorithm(name.to_owned())),
        }
    }
}

/// What bounds the automatic choice on one communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The most bytes a rank reads from its peers on the one-shot path,
    /// (N−1)·bytes, so the crossover shrinks as ranks are added.
    pub one_shot_read_budget: usize,
    /// The most ranks the one-shot path serves (a kernel's fixed source
    /// table); more ranks always take the ring.
    pub one_shot_max_ranks: usize,
    /// The message sizes sent direct: `Some` only where the transport lets
    /// every rank read its peers' buffers and the ranks agreed on it.
    pub direct_messages: Option<RangeInclusive<usize>>,
}

/// The algorithm an all_reduce of `bytes` over `nranks` ranks takes.
pub fn select(choice: AlgorithmChoice, bytes: usize, nranks: usize, limits: &Limits) -> Algorithm {
    if nranks > limits.one_shot_max_ranks {
        return match choice {
            AlgorithmChoice::Fixed(Algorithm::OneShot) | AlgorithmChoice::Auto => Algorithm::Ring,
            AlgorithmChoice::Fixed(algorithm) => algorithm,
        };
    }
    match choice {
        AlgorithmChoice::Fixed(algorithm) => algorithm,
        AlgorithmChoice::Auto => {
            let peers = nranks.saturating_sub(1).max(1);
            if bytes.saturating_mul(peers) <= limits.one_shot_read_budget {
                Algorithm::OneShot
            } else if limits
                .direct_messages
                .as_ref()
                .is_some_and(|direct| direct.contains(&bytes))
            {
                Algorithm::Direct
            } else {
                Algorithm::Ring
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(budget: usize, max_ranks: usize, direct: Option<RangeInclusive<usize>>) -> Limits {
        Limits {
            one_shot_read_budget: budget,
            one_shot_max_ranks: max_ranks,
            direct_messages: direct,
        }
    }

    #[test]
    fn auto_picks_by_size_ranks_and_what_the_transport_allows() {
        use Algorithm::{Direct, OneShot, Ring};
        let host = limits(64 << 10, usize::MAX, None);
        let peer_reads = limits(64 << 10, usize::MAX, Some((4 << 20)..=(16 << 20)));
        let gpu = limits(256 << 10, 8, None);
        // (bytes, nranks, limits, expected)
        let table = [
            (8, 2, &host, OneShot),
            (64 << 10, 2, &host, OneShot),
            ((64 << 10) + 1, 2, &host, Ring),
            // Eight ranks read seven peers: the crossover is a seventh as large.
            (9362, 8, &host, OneShot),
            (9363, 8, &host, Ring),
            (0, 1, &limits(0, usize::MAX, None), OneShot),
            (4 << 20, 2, &host, Ring),
            ((4 << 20) - 1, 2, &peer_reads, Ring),
            (4 << 20, 2, &peer_reads, Direct),
            (16 << 20, 4, &peer_reads, Direct),
            ((16 << 20) + 1, 4, &peer_reads, Ring),
            (8, 2, &peer_reads, OneShot),
            (8, 8, &gpu, OneShot),
            (8, 9, &gpu, Ring),
        ];
        for (bytes, nranks, limits, expected) in table {
            let picked = select(AlgorithmChoice::Auto, bytes, nranks, limits);
            assert_eq!(
                picked, expected,
                "{bytes} bytes, {nranks} ranks, {limits:?}"
            );
        }
    }

    #[test]
    fn fixed_choice_overrides_size_but_not_the_one_shot_rank_bound() {
        let host = limits(1 << 30, usize::MAX, None);
        let ring = AlgorithmChoice::Fixed(Algorithm::Ring);
        assert_eq!(select(ring, 8, 2, &host), Algorithm::Ring);
        let direct = AlgorithmChoice::Fixed(Algorithm::Direct);
        assert_eq!(select(direct, 8, 2, &host), Algorithm::Direct);
        let one_shot = AlgorithmChoice::Fixed(Algorithm::OneShot);
        assert_eq!(
            select(one_shot, 1 << 30, 8, &limits(0, 8, None)),
            Algorithm::OneShot
        );
        assert_eq!(
            select(one_shot, 8, 9, &limits(1 << 30, 8, None)),
            Algorithm::Ring
        );
        assert_eq!(
            "one-shot".parse::<AlgorithmChoice>().unwrap(),
            AlgorithmChoice::Fixed(Algorithm::OneShot)
        );
        assert_eq!(
            "direct".parse::<AlgorithmChoice>().unwrap(),
            AlgorithmChoice::Fixed(Algorithm::Direct)
        );
        assert!("tree".parse::<AlgorithmChoice>().is_err());
    }

    #[test]
    fn wire_codes_round_trip() {
        for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::Direct] {
            assert_eq!(Algorithm::from_wire(algorithm as u8), Some(algorithm));
        }
        assert_eq!(Algorithm::from_wire(0), None);
        assert_eq!(Algorithm::from_wire(4), None);
    }
}
