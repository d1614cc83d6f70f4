//! Chunk size from the link the data crosses.
//!
//! A chunk is the unit that is written to a peer's window and signalled; smaller
//! chunks cost more signals, larger ones hold more data in flight when a link
//! replays TLPs. The policy takes plain link facts so that the probe library (or
//! a config file) can feed it; the communicator re-plans between operations when
//! [`super::Communicator::set_link`] is called after a link or AER event.

/// What the engine needs to know about the link under a ring hop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkFacts {
    /// Negotiated link speed in GT/s (2.5, 5, 8, 16, 32, 64).
    pub speed_gt_s: f32,
    /// Negotiated link width in lanes.
    pub width: u8,
    /// Correctable and non-fatal AER errors counted on the link since the last
    /// plan: a rising count means replays, which favour smaller chunks.
    pub recent_aer_errors: u64,
}

/// The chunk size for each link condition, in bytes. The defaults are the
/// project's design values for PCIe; `host_memory` is the shm transport's,
/// chosen by `scripts/bench-vs-mpi.sh` (see docs/engine.md for the measurement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPolicy {
    /// A healthy Gen3 x16 or faster link.
    pub healthy: usize,
    /// A link whose AER error count is rising.
    pub aer_errors: usize,
    /// A link degraded to Gen3 (8 GT/s) with 8 lanes or fewer.
    pub degraded: usize,
    /// A Gen2 (5 GT/s) or slower link.
    pub slow: usize,
    /// No link at all: the ranks share host memory.
    pub host_memory: usize,
    /// `recent_aer_errors` at or above this counts as rising.
    pub aer_error_threshold: u64,
}

impl Default for ChunkPolicy {
    fn default() -> ChunkPolicy {
        ChunkPolicy {
            healthy: 1 << 20,
            aer_errors: 256 << 10,
            degraded: 512 << 10,
            slow: 64 << 10,
            host_memory: 32 << 10,
            aer_error_threshold: 1,
        }
    }
}

impl ChunkPolicy {
    /// A policy that uses one size whatever the link.
    pub fn fixed(bytes: usize) -> ChunkPolicy {
        ChunkPolicy {
            healthy: bytes,
            aer_errors: bytes,
            degraded: bytes,
            slow: bytes,
            host_memory: bytes,
            aer_error_threshold: 1,
        }
    }

    /// The chunk size for data crossing `link` (`None`: host memory). A slow
    /// link wins over errors, since its small fixed chunk is already the floor.
    pub fn chunk_bytes(&self, link: Option<&LinkFacts>) -> usize {
        match link {
            None => self.host_memory,
            Some(link) if link.speed_gt_s <= 5.0 => self.slow,
            Some(link) if link.recent_aer_errors >= self.aer_error_threshold => self.aer_errors,
            Some(link) if link.speed_gt_s <= 8.0 && link.width <= 8 => self.degraded,
            Some(_) => self.healthy,
        }
    }

    /// The largest chunk this policy can ask for: the transport sizes its slots by it.
    pub fn max_chunk_bytes(&self) -> usize {
        [
            self.healthy,
            self.aer_errors,
            self.degraded,
            self.slow,
            self.host_memory,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(speed_gt_s: f32, width: u8, recent_aer_errors: u64) -> LinkFacts {
        LinkFacts {
            speed_gt_s,
            width,
            recent_aer_errors,
        }
    }

    #[test]
    fn default_policy_follows_the_design_table() {
        let policy = ChunkPolicy::default();
        assert_eq!(policy.chunk_bytes(Some(&link(16.0, 16, 0))), 1 << 20);
        assert_eq!(policy.chunk_bytes(Some(&link(32.0, 16, 0))), 1 << 20);
        assert_eq!(policy.chunk_bytes(Some(&link(16.0, 16, 3))), 256 << 10);
        assert_eq!(policy.chunk_bytes(Some(&link(8.0, 8, 0))), 512 << 10);
        assert_eq!(policy.chunk_bytes(Some(&link(8.0, 16, 0))), 1 << 20);
        assert_eq!(policy.chunk_bytes(Some(&link(5.0, 16, 0))), 64 << 10);
        assert_eq!(policy.chunk_bytes(Some(&link(5.0, 4, 9))), 64 << 10);
        assert_eq!(policy.chunk_bytes(Some(&link(2.5, 1, 0))), 64 << 10);
        assert_eq!(policy.chunk_bytes(None), 32 << 10);
        assert_eq!(policy.max_chunk_bytes(), 1 << 20);
    }

    #[test]
    fn fixed_policy_ignores_the_link() {
        let policy = ChunkPolicy::fixed(4096);
        assert_eq!(policy.chunk_bytes(Some(&link(2.5, 1, 100))), 4096);
        assert_eq!(policy.chunk_bytes(None), 4096);
        assert_eq!(policy.max_chunk_bytes(), 4096);
    }
}
