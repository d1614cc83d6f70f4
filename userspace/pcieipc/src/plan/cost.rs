//! The cost model over GPU pairs: bandwidth and cost of sending one ring
//! chunk from each GPU to each other, from the probed path.

use serde::Serialize;

use crate::probe::doctor::{peer_acs, PeerRoute};
use crate::probe::topology::{PathClass, Topology};

/// Turns a probed path into a pair bandwidth and cost. Path bandwidth is the
/// bottleneck link's effective bandwidth, scaled by how much of it P2P keeps
/// when it crosses a root complex (the defaults are conservative figures for
/// P2P through CPUs, which is usually slower than through a switch), and by
/// the lowest health score on the path (a proxy for replay overhead).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostModel {
    /// Fraction kept through one host bridge (PHB, or ACS redirected).
    pub host_bridge_factor: f64,
    /// Fraction kept between host bridges of one NUMA node (NODE).
    pub cross_host_bridge_factor: f64,
    /// Fraction kept across NUMA nodes (SYS).
    pub cross_numa_factor: f64,
    /// Bandwidth (GB/s) assumed for a path with no known link speed.
    pub unknown_link_gbps: f64,
    /// Bandwidth (GB/s) assumed per NVLink link of unknown version.
    pub unknown_nvlink_link_gbps: f64,
    /// Latency added per link traversed (PCIe, or NVLink to a GPU or a
    /// switch), in microseconds.
    pub hop_latency_us: f64,
    /// The chunk whose transfer time is the pair cost.
    pub chunk_bytes: u64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            host_bridge_factor: 0.8,
            cross_host_bridge_factor: 0.6,
            cross_numa_factor: 0.4,
            // Gen3 x16, the most common GPU link of servers that hide link speeds.
            unknown_link_gbps: 15.75,
            // One NVLink 1.0 link, the slowest there is.
            unknown_nvlink_link_gbps: 20.0,
            hop_latency_us: 0.15,
            chunk_bytes: 1 << 20,
        }
    }
}

impl CostModel {
    /// Transfer time in microseconds of one chunk over `hops` links at
    /// `bandwidth_gbps`.
    pub fn cost_us(&self, bandwidth_gbps: f64, hops: usize) -> f64 {
        self.chunk_bytes as f64 / (bandwidth_gbps * 1e3) + hops as f64 * self.hop_latency_us
    }
}

/// Directed bandwidth and cost between every two ring members.
#[derive(Debug, Clone, PartialEq)]
pub struct PairMatrix {
    pub size: usize,
    /// Row-major, `size * size`; the diagonal is unused.
    pub bandwidth_gbps: Vec<f64>,
    pub cost_us: Vec<f64>,
}

impl PairMatrix {
    /// Fills the matrix from `pair(from, to) -> (bandwidth, cost)`.
    pub fn from_fn(size: usize, mut pair: impl FnMut(usize, usize) -> (f64, f64)) -> PairMatrix {
        let mut bandwidth_gbps = vec![0.0; size * size];
        let mut cost_us = vec![0.0; size * size];
        for from in 0..size {
            for to in 0..size {
                if from != to {
                    let (bandwidth, cost) = pair(from, to);
                    bandwidth_gbps[from * size + to] = bandwidth;
                    cost_us[from * size + to] = cost;
                }
            }
        }
        PairMatrix {
            size,
            bandwidth_gbps,
            cost_us,
        }
    }

    pub fn bandwidth(&self, from: usize, to: usize) -> f64 {
        self.bandwidth_gbps[from * self.size + to]
    }

    pub fn cost(&self, from: usize, to: usize) -> f64 {
        self.cost_us[from * self.size + to]
    }
}

/// Bandwidth and cost of the P2P path between two devices of the topology:
/// over NVLink when the pair has it (P2P then does not touch PCIe, so
/// neither the PCIe links nor their health count), else over PCIe.
pub fn pair_cost(topology: &Topology, a: usize, b: usize, model: &CostModel) -> (f64, f64) {
    let path = topology.path_between(a, b);
    if let Some(nvlink) = path.nvlink {
        let bandwidth = nvlink
            .bandwidth_gbps
            .unwrap_or(f64::from(nvlink.links) * model.unknown_nvlink_link_gbps);
        return (bandwidth, model.cost_us(bandwidth, nvlink.hops()));
    }
    let acs = peer_acs(topology, &path);
    let mut links = path.links.clone();
    let mut hops = path.hops();
    let mut class = path.class;
    if acs.route == PeerRoute::AcsRedirected {
        // Redirected traffic climbs from the switch to the root complex and
        // back down: the links above the switch are crossed twice.
        if let Some(common) = path.common_bridge {
            let above = topology.links_to_root(common);
            hops += 2 * above.len();
            links.extend(above);
        }
        class = class.max(PathClass::Phb);
    }
    let bottleneck = topology
        .bottleneck(&links)
        .map_or(model.unknown_link_gbps, |(_, bandwidth)| bandwidth);
    let factor = match class {
        PathClass::Pix | PathClass::Pxb => 1.0,
        PathClass::Phb => model.host_bridge_factor,
        PathClass::Node => model.cross_host_bridge_factor,
        PathClass::Sys => model.cross_numa_factor,
    };
    let bandwidth = bottleneck * factor * path.health.unwrap_or(1.0);
    (bandwidth, model.cost_us(bandwidth, hops))
}

/// The pair matrix of `members` (device indices, ring order is by position).
pub fn pair_matrix(topology: &Topology, members: &[usize], model: &CostModel) -> PairMatrix {
    let mut pairs = vec![(0.0, 0.0); members.len() * members.len()];
    for from in 0..members.len() {
        for to in from + 1..members.len() {
            // PCIe and NVLink are full duplex and symmetric: one path serves both directions.
            let pair = pair_cost(topology, members[from], members[to], model);
            pairs[from * members.len() + to] = pair;
            pairs[to * members.len() + from] = pair;
        }
    }
    PairMatrix::from_fn(members.len(), |from, to| pairs[from * members.len() + to])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_transfer_time_plus_hop_latency() {
        let model = CostModel::default();
        // 1 MiB at 10 GB/s = 104.8576 us, plus 2 hops.
        assert!((model.cost_us(10.0, 2) - (104.8576 + 0.3)).abs() < 1e-9);
    }

    #[test]
    fn matrix_from_fn_leaves_the_diagonal_empty() {
        let matrix = PairMatrix::from_fn(3, |from, to| ((from * 3 + to) as f64, 1.0));
        assert_eq!(matrix.bandwidth(1, 2), 5.0);
        assert_eq!(matrix.bandwidth(2, 1), 7.0);
        assert_eq!(matrix.bandwidth(1, 1), 0.0);
        assert_eq!(matrix.cost(0, 2), 1.0);
    }
}
