//! Which algorithm moves an all_reduce.
//!
//! The ring moves 2(N-1)/N of the buffer per rank and is bandwidth-optimal, but
//! its 2(N-1) dependent steps cost latency. The one-shot path has every rank
//! publish its whole buffer and reduce all N of them itself: one step, (N-1)
//! buffers read, the right trade for small messages. The direct algorithm
//! moves what the ring moves, but straight between the ranks' own buffers
//! (shm, where ranks may read each other's memory): each rank reduces its
//! own segment from every peer's input, then copies every other segment from
//! its owner, with no relay copies and three meetings per call.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Algorithm {
    /// Reduce-scatter then all-gather around the ring, pipelined in chunks.
    Ring = 1,
    /// Every rank reads every peer's whole buffer and reduces locally.
    OneShot = 2,
    /// Rank r reduces segment r itself, reading it straight from every peer's
    /// input (`process_vm_readv`), and writes the result straight into every
    /// peer's output (`process_vm_writev`): the ring's traffic with no relay
    /// hops and two meetings per call (shm, where peers may read each other).
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

    pub(crate) fn from_wire(code: u8) -> Option<Algorithm> {
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
    /// By message size and rank count: see [`AlgorithmChoice::pick`].
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

impl AlgorithmChoice {
    /// `one_shot_read_budget` bounds the bytes one rank reads from its peers on
    /// the one-shot path, (N-1)·bytes, so the crossover shrinks as ranks are added.
    pub fn pick(self, bytes: usize, nranks: usize, one_shot_read_budget: usize) -> Algorithm {
        match self {
            AlgorithmChoice::Fixed(algorithm) => algorithm,
            AlgorithmChoice::Auto => {
                let peers = nranks.saturating_sub(1).max(1);
                if bytes.saturating_mul(peers) <= one_shot_read_budget {
                    Algorithm::OneShot
                } else {
                    Algorithm::Ring
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_one_shot_below_the_budget_and_ring_above() {
        let auto = AlgorithmChoice::Auto;
        assert_eq!(auto.pick(8, 2, 64 << 10), Algorithm::OneShot);
        assert_eq!(auto.pick(64 << 10, 2, 64 << 10), Algorithm::OneShot);
        assert_eq!(auto.pick((64 << 10) + 1, 2, 64 << 10), Algorithm::Ring);
        // Eight ranks read seven peers: the crossover is a seventh as large.
        assert_eq!(auto.pick(9362, 8, 64 << 10), Algorithm::OneShot);
        assert_eq!(auto.pick(9363, 8, 64 << 10), Algorithm::Ring);
        assert_eq!(auto.pick(0, 1, 0), Algorithm::OneShot);
    }

    #[test]
    fn fixed_choice_overrides_size() {
        let ring = AlgorithmChoice::Fixed(Algorithm::Ring);
        assert_eq!(ring.pick(8, 2, 1 << 30), Algorithm::Ring);
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
}
