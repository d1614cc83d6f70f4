//! Ring planning: the Hamiltonian cycle over ring members that maximises the
//! bottleneck bandwidth, ties broken by the lowest total cost. Exact up to
//! `EXACT_LIMIT` members (threshold search + Held–Karp over subsets), a
//! greedy + 2-opt heuristic beyond, and the bus-id-order ring a default NCCL
//! setup uses, for comparison.

use serde::Serialize;

use super::cost::PairMatrix;

/// Largest member count planned exactly: 2^15 subsets × 16 ends fit in a few
/// MiB and well under a second.
pub const EXACT_LIMIT: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RingMethod {
    /// Provably optimal.
    Exact,
    /// Greedy + 2-opt, beyond `EXACT_LIMIT` members.
    Heuristic,
    /// Members in PCI bus-id order, as a default NCCL setup orders them.
    BusIdOrder,
}

/// A ring: `order[i]` sends to `order[(i + 1) % n]`; it starts at member 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Ring {
    pub method: RingMethod,
    pub order: Vec<usize>,
    /// The lowest pair bandwidth along the ring (GB/s).
    pub bottleneck_gbps: f64,
    /// Sum of the pair costs along the ring (µs per chunk step).
    pub total_cost_us: f64,
}

impl Ring {
    /// Evaluates the ring `order` on `matrix`.
    pub fn evaluate(matrix: &PairMatrix, order: Vec<usize>, method: RingMethod) -> Ring {
        let (bottleneck_gbps, total_cost_us) = objective(matrix, &order);
        Ring {
            method,
            order,
            bottleneck_gbps,
            total_cost_us,
        }
    }

    /// Whether this ring is better than `other`: higher bottleneck, then lower cost.
    pub fn is_better_than(&self, other: &Ring) -> bool {
        better(
            (self.bottleneck_gbps, self.total_cost_us),
            (other.bottleneck_gbps, other.total_cost_us),
        )
    }
}

fn objective(matrix: &PairMatrix, order: &[usize]) -> (f64, f64) {
    let n = order.len();
    (0..n).fold((f64::INFINITY, 0.0), |(bottleneck, cost), i| {
        let (from, to) = (order[i], order[(i + 1) % n]);
        (
            bottleneck.min(matrix.bandwidth(from, to)),
            cost + matrix.cost(from, to),
        )
    })
}

fn better(a: (f64, f64), b: (f64, f64)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// The best ring: exact up to `EXACT_LIMIT` members, heuristic beyond.
/// `None` with fewer than two members (no ring to plan).
pub fn best_ring(matrix: &PairMatrix) -> Option<Ring> {
    if matrix.size <= EXACT_LIMIT {
        exact_ring(matrix)
    } else {
        Some(heuristic_ring(matrix))
    }
}

/// The ring in member order (members are in bus-id order), as NCCL's default.
pub fn bus_id_order_ring(matrix: &PairMatrix) -> Option<Ring> {
    (matrix.size >= 2)
        .then(|| Ring::evaluate(matrix, (0..matrix.size).collect(), RingMethod::BusIdOrder))
}

/// The optimal ring, exactly. `None` with fewer than two or more than
/// `EXACT_LIMIT` members.
///
/// The bottleneck of any ring is one of the pair bandwidths, so the search
/// finds by bisection the highest bandwidth `t` for which the pairs with
/// bandwidth ≥ `t` still hold a Hamiltonian cycle (a subset DP over paths
/// from member 0), then minimises the total cost over those pairs with
/// Held–Karp.
pub fn exact_ring(matrix: &PairMatrix) -> Option<Ring> {
    let n = matrix.size;
    if !(2..=EXACT_LIMIT).contains(&n) {
        return None;
    }
    let mut thresholds: Vec<f64> = (0..n)
        .flat_map(|from| {
            (0..n)
                .filter(move |&to| to != from)
                .map(move |to| (from, to))
        })
        .map(|(from, to)| matrix.bandwidth(from, to))
        .collect();
    thresholds.sort_by(|a, b| b.total_cmp(a));
    thresholds.dedup();
    // thresholds is descending; feasibility only grows as the threshold falls,
    // and the lowest threshold admits every pair (a complete graph).
    let (mut low, mut high) = (0, thresholds.len() - 1);
    while low < high {
        let middle = low + (high - low) / 2;
        if has_cycle_at_least(matrix, thresholds[middle]) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    let threshold = thresholds[low];
    let order = cheapest_cycle_at_least(matrix, threshold)?;
    Some(Ring::evaluate(matrix, order, RingMethod::Exact))
}

/// Bitmask of the members 1..n that `from` may send to at `threshold`.
/// Bit k stands for member k + 1 (member 0 is the fixed start).
fn successors(matrix: &PairMatrix, threshold: f64) -> Vec<u32> {
    (0..matrix.size)
        .map(|from| {
            (1..matrix.size)
                .filter(|&to| to != from && matrix.bandwidth(from, to) >= threshold)
                .fold(0u32, |mask, to| mask | 1 << (to - 1))
        })
        .collect()
}

/// Whether a Hamiltonian cycle uses only pairs with bandwidth ≥ `threshold`.
/// `ends[mask]`: the members a path from member 0 through exactly `mask` can end at.
fn has_cycle_at_least(matrix: &PairMatrix, threshold: f64) -> bool {
    let n = matrix.size;
    let full = (1u32 << (n - 1)) - 1;
    let next = successors(matrix, threshold);
    let mut ends = vec![0u32; 1 << (n - 1)];
    for k in bits(next[0]) {
        ends[1 << k] |= 1 << k;
    }
    for mask in 1..=full {
        let reachable = ends[mask as usize];
        for end in bits(reachable) {
            for k in bits(next[end + 1] & !mask) {
                ends[(mask | 1 << k) as usize] |= 1 << k;
            }
        }
    }
    bits(ends[full as usize]).any(|end| matrix.bandwidth(end + 1, 0) >= threshold)
}

/// Held–Karp: the cheapest Hamiltonian cycle over pairs with bandwidth ≥
/// `threshold`, starting at member 0.
fn cheapest_cycle_at_least(matrix: &PairMatrix, threshold: f64) -> Option<Vec<usize>> {
    // `previous` marks reached states apart from their cost, so that pairs of
    // infinite cost (zero bandwidth: a link with health 0) still form rings.
    const UNREACHED: u8 = u8::MAX;
    const FROM_START: u8 = u8::MAX - 1;
    let n = matrix.size;
    let m = n - 1;
    let full = (1usize << m) - 1;
    let next = successors(matrix, threshold);
    // cost[mask * m + k]: cheapest path 0 -> ... -> member k+1 visiting `mask`.
    let mut cost = vec![f64::INFINITY; (full + 1) * m];
    let mut previous = vec![UNREACHED; (full + 1) * m];
    for k in bits(next[0]) {
        cost[(1 << k) * m + k] = matrix.cost(0, k + 1);
        previous[(1 << k) * m + k] = FROM_START;
    }
    for mask in 1..=full {
        for end in bits(mask as u32) {
            if previous[mask * m + end] == UNREACHED {
                continue;
            }
            let here = cost[mask * m + end];
            for k in bits(next[end + 1] & !(mask as u32)) {
                let state = (mask | 1 << k) * m + k;
                let candidate = here + matrix.cost(end + 1, k + 1);
                if previous[state] == UNREACHED || candidate < cost[state] {
                    cost[state] = candidate;
                    previous[state] = end as u8;
                }
            }
        }
    }
    let last = (0..m)
        .filter(|&end| matrix.bandwidth(end + 1, 0) >= threshold)
        .filter(|&end| previous[full * m + end] != UNREACHED)
        .min_by(|&a, &b| {
            (cost[full * m + a] + matrix.cost(a + 1, 0))
                .total_cmp(&(cost[full * m + b] + matrix.cost(b + 1, 0)))
        })?;
    let mut order = Vec::with_capacity(n);
    let (mut mask, mut end) = (full, last);
    loop {
        order.push(end + 1);
        let before = previous[mask * m + end];
        mask &= !(1 << end);
        if before == FROM_START {
            break;
        }
        end = usize::from(before);
    }
    order.push(0);
    order.reverse();
    Some(order)
}

/// Indices of the set bits of `mask`, lowest first.
fn bits(mut mask: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let bit = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            bit
        })
    })
}

/// Greedy nearest neighbour from member 0 (widest pair first, then cheapest),
/// improved by 2-opt moves until none helps.
pub fn heuristic_ring(matrix: &PairMatrix) -> Ring {
    let n = matrix.size;
    let mut order = vec![0];
    let mut left: Vec<usize> = (1..n).collect();
    while !left.is_empty() {
        let from = *order.last().unwrap_or(&0);
        let (position, _) = left
            .iter()
            .enumerate()
            .max_by(|(_, &a), (_, &b)| {
                matrix
                    .bandwidth(from, a)
                    .total_cmp(&matrix.bandwidth(from, b))
                    .then(matrix.cost(from, b).total_cmp(&matrix.cost(from, a)))
            })
            .unwrap_or((0, &0));
        order.push(left.swap_remove(position));
    }
    let mut best = objective(matrix, &order);
    let mut improved = true;
    while improved {
        improved = false;
        for i in 1..n.saturating_sub(1) {
            for j in i + 1..n {
                order[i..=j].reverse();
                let candidate = objective(matrix, &order);
                if better(candidate, best) {
                    best = candidate;
                    improved = true;
                } else {
                    order[i..=j].reverse();
                }
            }
        }
    }
    Ring::evaluate(matrix, order, RingMethod::Heuristic)
}
