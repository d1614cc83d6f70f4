//! Chunk size from the link the data crosses.
//!
//! A chunk is the unit that is written to a peer's window and signalled; smaller
//! chunks cost more signals, larger ones hold more data in flight when a link
//! replays TLPs. The policy takes plain link facts so that the probe library,
//! the module's events (the pcieipc transport) or a config file can feed it,
//! and the message size, which decides in host memory. Every rank publishes its
//! link; the rank that decides a call's chunk takes the smallest chunk any
//! rank's link asks for (see docs/engine.md).

use crate::probe::{LinkState, Topology};

/// How long an AER error counts as recent: long enough that a link that
/// keeps erring stays on the smaller chunk, short enough that a link that
/// recovered gets its healthy chunk back.
pub const AER_MEMORY: std::time::Duration = std::time::Duration::from_secs(60);

/// The AER errors a link had within [`AER_MEMORY`]: what
/// `LinkFacts::recent_aer_errors` counts.
#[derive(Debug, Default)]
pub(crate) struct RecentErrors(std::collections::VecDeque<std::time::Instant>);

impl RecentErrors {
    pub(crate) fn record(&mut self) {
        self.0.push_back(std::time::Instant::now());
    }

    /// The errors still recent now.
    pub(crate) fn count(&mut self) -> u64 {
        let now = std::time::Instant::now();
        while self
            .0
            .front()
            .is_some_and(|at| now.duration_since(*at) > AER_MEMORY)
        {
            self.0.pop_front();
        }
        self.0.len() as u64
    }
}

/// What the engine needs to know about the link under a ring hop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkFacts {
    /// Negotiated link speed in GT/s (2.5, 5, 8, 16, 32, 64).
    pub speed_gt_s: f32,
    /// Negotiated link width in lanes.
    pub width: u8,
    /// AER errors reported on the link recently (the pcieipc transport counts
    /// those of the last minute): a rising count means replays, which favour
    /// smaller chunks.
    pub recent_aer_errors: u64,
    /// The rank's GPU reaches its peers over NVLink (directly or through
    /// NVSwitches): ring traffic does not cross the PCIe link described
    /// above, so that link's speed and errors do not shrink the chunk.
    pub over_nvlink: bool,
}

impl LinkFacts {
    /// What the probe knows of the path from `device` up to its host bridge,
    /// as the facts of one link: the path's bottleneck by effective bandwidth
    /// (an idle-downshifted GPU link at the speed it retrains to under load,
    /// not the idle speed), its speed and width, and as recent AER errors the
    /// number of links on the path whose health the probe's model calls
    /// sub-healthy (sysfs counts errors since boot, so this is the probe's
    /// judgement, not a rate); and whether NVML shows the device reaching
    /// peers over NVLink. `None` when no link on the path has a known speed
    /// and width.
    pub fn of_device(topology: &Topology, device: usize) -> Option<LinkFacts> {
        let links = topology.links_to_root(device);
        let (bottleneck, _) = topology.bottleneck(&links)?;
        let link = &topology.links[bottleneck];
        let speed = match link.state {
            LinkState::IdleDownshiftLikely => link.max_speed,
            _ => link.current_speed,
        }?;
        let sub_healthy = links
            .iter()
            .filter(|&&link| {
                topology.links[link]
                    .health
                    .is_some_and(|score| topology.health_model.is_sub_healthy(score))
            })
            .count();
        Some(LinkFacts {
            speed_gt_s: speed.gigatransfers_per_second() as f32,
            width: link.current_width?,
            recent_aer_errors: sub_healthy as u64,
            over_nvlink: topology.nvlinks.reaches_peers(topology.devices[device].bdf),
        })
    }
}

/// `LinkFacts` as one word of a rank's control block; 0 is no link.
const LINK_PRESENT: u64 = 1 << 63;
const LINK_OVER_NVLINK: u64 = 1 << 62;
const LINK_AER_MAX: u64 = (1 << 22) - 1;

impl LinkFacts {
    /// The word a rank publishes for its link: speed (f32 bits), width, the
    /// AER count (saturated at 2^22 − 1, far above any threshold) and the
    /// NVLink flag.
    pub(crate) fn to_word(link: Option<&LinkFacts>) -> u64 {
        link.map_or(0, |link| {
            LINK_PRESENT
                | if link.over_nvlink {
                    LINK_OVER_NVLINK
                } else {
                    0
                }
                | link.recent_aer_errors.min(LINK_AER_MAX) << 40
                | u64::from(link.width) << 32
                | u64::from(link.speed_gt_s.to_bits())
        })
    }

    pub(crate) fn from_word(word: u64) -> Option<LinkFacts> {
        (word & LINK_PRESENT != 0).then(|| LinkFacts {
            speed_gt_s: f32::from_bits(word as u32),
            width: (word >> 32) as u8,
            recent_aer_errors: (word >> 40) & LINK_AER_MAX,
            over_nvlink: word & LINK_OVER_NVLINK != 0,
        })
    }
}

/// Host memory's chunk for messages of at most `up_to_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeStep {
    pub up_to_bytes: usize,
    pub chunk_bytes: usize,
}

/// The chunk size for each link condition, in bytes. The defaults are the
/// project's design values for PCIe; `host_memory` is the shm transport's, by
/// message size, measured with `pcieipc bench --chunk-bytes` and
/// `scripts/bench-vs-mpi.sh` (docs/engine.md has the measurement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPolicy {
    /// A healthy Gen3 x16 or faster link, or NVLink.
    pub healthy: usize,
    /// A link whose AER error count is rising.
    pub aer_errors: usize,
    /// A link degraded to Gen3 (8 GT/s) with 8 lanes or fewer.
    pub degraded: usize,
    /// A Gen2 (5 GT/s) or slower link.
    pub slow: usize,
    /// No link at all: the ranks share host memory. The first step that holds
    /// the message applies; messages above the last step take its chunk.
    pub host_memory: [SizeStep; HOST_MEMORY_STEPS],
    /// `recent_aer_errors` at or above this counts as rising.
    pub aer_error_threshold: u64,
}

/// How many message-size steps the host-memory chunk has.
pub const HOST_MEMORY_STEPS: usize = 3;

impl Default for ChunkPolicy {
    fn default() -> ChunkPolicy {
        ChunkPolicy {
            healthy: 1 << 20,
            aer_errors: 256 << 10,
            degraded: 512 << 10,
            slow: 64 << 10,
            // Measured on the 2-core development VM, 2 ranks (docs/engine.md):
            // up to 1 MiB the best chunks were 128–512 KiB; from 2 to 16 MiB,
            // where the all-gather reads single-copy, 1 MiB (8 MiB in place:
            // 8.0 GB/s against 6.8 at 512 KiB); above, through the relay
            // slots, 512 KiB (16 MiB: 6.0 / 6.7 GB/s against 4.1 / 5.0 at 32 KiB).
            host_memory: [
                SizeStep {
                    up_to_bytes: 1 << 20,
                    chunk_bytes: 256 << 10,
                },
                SizeStep {
                    up_to_bytes: 16 << 20,
                    chunk_bytes: 1 << 20,
                },
                SizeStep {
                    up_to_bytes: usize::MAX,
                    chunk_bytes: 512 << 10,
                },
            ],
            aer_error_threshold: 1,
        }
    }
}

impl ChunkPolicy {
    /// A policy that uses one size whatever the link and message.
    pub fn fixed(bytes: usize) -> ChunkPolicy {
        ChunkPolicy {
            healthy: bytes,
            aer_errors: bytes,
            degraded: bytes,
            slow: bytes,
            host_memory: [SizeStep {
                up_to_bytes: usize::MAX,
                chunk_bytes: bytes,
            }; HOST_MEMORY_STEPS],
            aer_error_threshold: 1,
        }
    }

    /// The chunk size for a message of `message_bytes` crossing `link`
    /// (`None`: host memory). NVLink takes the healthy chunk whatever the
    /// PCIe link; otherwise a slow link wins over errors, since its small
    /// fixed chunk is already the floor.
    pub fn chunk_bytes(&self, link: Option<&LinkFacts>, message_bytes: usize) -> usize {
        match link {
            None => {
                self.host_memory
                    .iter()
                    .find(|step| message_bytes <= step.up_to_bytes)
                    .unwrap_or(&self.host_memory[HOST_MEMORY_STEPS - 1])
                    .chunk_bytes
            }
            Some(link) if link.over_nvlink => self.healthy,
            Some(link) if link.speed_gt_s <= 5.0 => self.slow,
            Some(link) if link.recent_aer_errors >= self.aer_error_threshold => self.aer_errors,
            Some(link) if link.speed_gt_s <= 8.0 && link.width <= 8 => self.degraded,
            Some(_) => self.healthy,
        }
    }

    /// The largest chunk this policy can ask for: the transport sizes its slots by it.
    pub fn max_chunk_bytes(&self) -> usize {
        let links = [self.healthy, self.aer_errors, self.degraded, self.slow];
        let host_memory = self.host_memory.map(|step| step.chunk_bytes);
        links.into_iter().chain(host_memory).max().unwrap_or(0)
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
            over_nvlink: false,
        }
    }

    fn nvlink(pcie: LinkFacts) -> LinkFacts {
        LinkFacts {
            over_nvlink: true,
            ..pcie
        }
    }

    #[test]
    fn default_policy_follows_the_design_table() {
        let policy = ChunkPolicy::default();
        // The link's chunk whatever the message size.
        for message in [1 << 10, 1 << 30] {
            let chunk = |link: LinkFacts| policy.chunk_bytes(Some(&link), message);
            assert_eq!(chunk(link(16.0, 16, 0)), 1 << 20);
            assert_eq!(chunk(link(32.0, 16, 0)), 1 << 20);
            assert_eq!(chunk(link(16.0, 16, 3)), 256 << 10);
            assert_eq!(chunk(link(8.0, 8, 0)), 512 << 10);
            assert_eq!(chunk(link(8.0, 16, 0)), 1 << 20);
            assert_eq!(chunk(link(5.0, 16, 0)), 64 << 10);
            assert_eq!(chunk(link(5.0, 4, 9)), 64 << 10);
            assert_eq!(chunk(link(2.5, 1, 0)), 64 << 10);
            // Over NVLink the PCIe link's speed and errors do not count.
            assert_eq!(chunk(nvlink(link(2.5, 1, 0))), 1 << 20);
            assert_eq!(chunk(nvlink(link(16.0, 16, 3))), 1 << 20);
        }
        assert_eq!(policy.max_chunk_bytes(), 1 << 20);
    }

    #[test]
    fn host_memory_chunk_grows_with_the_message() {
        let policy = ChunkPolicy::default();
        assert_eq!(policy.chunk_bytes(None, 0), 256 << 10);
        assert_eq!(policy.chunk_bytes(None, 1 << 20), 256 << 10);
        assert_eq!(policy.chunk_bytes(None, (1 << 20) + 1), 1 << 20);
        assert_eq!(policy.chunk_bytes(None, 16 << 20), 1 << 20);
        assert_eq!(policy.chunk_bytes(None, (16 << 20) + 1), 512 << 10);
        assert_eq!(policy.chunk_bytes(None, usize::MAX), 512 << 10);
    }

    #[test]
    fn link_words_round_trip_and_zero_is_no_link() {
        assert_eq!(LinkFacts::to_word(None), 0);
        assert_eq!(LinkFacts::from_word(0), None);
        for facts in [
            link(16.0, 16, 0),
            link(2.5, 1, 7),
            link(64.0, 32, u64::MAX),
            nvlink(link(32.0, 16, 5)),
        ] {
            let back = LinkFacts::from_word(LinkFacts::to_word(Some(&facts))).unwrap();
            assert_eq!(back.speed_gt_s, facts.speed_gt_s);
            assert_eq!(back.width, facts.width);
            assert_eq!(
                back.recent_aer_errors,
                facts.recent_aer_errors.min(LINK_AER_MAX)
            );
            assert_eq!(back.over_nvlink, facts.over_nvlink);
        }
    }

    #[test]
    fn fixed_policy_ignores_the_link() {
        let policy = ChunkPolicy::fixed(4096);
        assert_eq!(policy.chunk_bytes(Some(&link(2.5, 1, 100)), 1 << 20), 4096);
        assert_eq!(policy.chunk_bytes(None, 1 << 30), 4096);
        assert_eq!(policy.chunk_bytes(None, 8), 4096);
        assert_eq!(policy.max_chunk_bytes(), 4096);
    }
}
