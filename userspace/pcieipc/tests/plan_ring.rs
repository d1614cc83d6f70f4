//! The ring planner against brute force (every Hamiltonian cycle) for up to
//! 9 members, on random matrices and on every fixture.

#[path = "../../../tests/fixtures/sysfs/generator.rs"]
mod generator;

use pcieipc::plan::{
    best_ring, bus_id_order_ring, exact_ring, heuristic_ring, pair_matrix, CostModel, PairMatrix,
    Ring, RingMethod, EXACT_LIMIT,
};
use pcieipc::probe::{HealthModel, PathClass, Topology};

/// Deterministic pseudo-random numbers (64-bit LCG), so failures reproduce.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// Every ring starting at member 0; the best by (bottleneck, then cost).
fn brute_force(matrix: &PairMatrix) -> Ring {
    fn permute(rest: &mut Vec<usize>, k: usize, matrix: &PairMatrix, best: &mut Option<Ring>) {
        if k == rest.len() {
            let mut order = vec![0];
            order.extend_from_slice(rest);
            let ring = Ring::evaluate(matrix, order, RingMethod::Exact);
            if best
                .as_ref()
                .is_none_or(|current| ring.is_better_than(current))
            {
                *best = Some(ring);
            }
            return;
        }
        for i in k..rest.len() {
            rest.swap(k, i);
            permute(rest, k + 1, matrix, best);
            rest.swap(k, i);
        }
    }
    let mut rest: Vec<usize> = (1..matrix.size).collect();
    let mut best = None;
    permute(&mut rest, 0, matrix, &mut best);
    best.unwrap()
}

fn assert_is_ring(ring: &Ring, size: usize) {
    assert_eq!(ring.order[0], 0);
    let mut members = ring.order.clone();
    members.sort_unstable();
    assert_eq!(members, (0..size).collect::<Vec<_>>());
}

fn assert_optimal(matrix: &PairMatrix, context: &str) {
    let exact = exact_ring(matrix).unwrap();
    let brute = brute_force(matrix);
    assert_is_ring(&exact, matrix.size);
    assert_eq!(exact.method, RingMethod::Exact);
    assert_eq!(
        exact.bottleneck_gbps, brute.bottleneck_gbps,
        "{context}: bottleneck"
    );
    assert!(
        (exact.total_cost_us - brute.total_cost_us).abs()
            <= 1e-9 * brute.total_cost_us.abs().max(1.0),
        "{context}: cost {} vs brute force {}",
        exact.total_cost_us,
        brute.total_cost_us
    );
    // The reported values are those of the returned order.
    let again = Ring::evaluate(matrix, exact.order.clone(), RingMethod::Exact);
    assert_eq!(
        (again.bottleneck_gbps, again.total_cost_us),
        (exact.bottleneck_gbps, exact.total_cost_us)
    );
}

/// Bandwidths from a few levels (so bottlenecks tie and the cost decides),
/// costs random; symmetric or not.
fn random_matrix(random: &mut Lcg, size: usize, symmetric: bool) -> PairMatrix {
    let mut values = vec![(0.0, 0.0); size * size];
    for from in 0..size {
        for to in 0..size {
            if from == to || (symmetric && to < from) {
                continue;
            }
            let value = (
                5.0 * (1 + random.below(4)) as f64,
                1.0 + random.below(1000) as f64 / 7.0,
            );
            values[from * size + to] = value;
            if symmetric {
                values[to * size + from] = value;
            }
        }
    }
    PairMatrix::from_fn(size, |from, to| values[from * size + to])
}

#[test]
fn exact_ring_matches_brute_force_on_random_matrices() {
    let mut random = Lcg(0x5eed);
    for size in 2..=9 {
        for trial in 0..12 {
            let symmetric = trial % 2 == 0;
            let matrix = random_matrix(&mut random, size, symmetric);
            assert_optimal(
                &matrix,
                &format!("size {size} trial {trial} symmetric {symmetric}"),
            );
        }
    }
}

#[test]
fn exact_ring_matches_brute_force_with_all_distinct_bandwidths() {
    let mut random = Lcg(42);
    for size in 3..=9 {
        let matrix =
            PairMatrix::from_fn(size, |_, _| (random.below(1_000_000) as f64 / 1000.0, 1.0));
        assert_optimal(&matrix, &format!("distinct, size {size}"));
    }
}

fn fixture_matrix(topology: &Topology) -> PairMatrix {
    pair_matrix(topology, &topology.gpus(), &CostModel::default())
}

#[test]
fn exact_ring_is_optimal_on_every_fixture() {
    let dgx8 = Topology::from_sysfs_root(&generator::fixture_root("dgx8"), HealthModel::default())
        .unwrap();
    assert_eq!(dgx8.gpus().len(), 8);
    assert_optimal(&fixture_matrix(&dgx8), "dgx8");

    let this_machine = Topology::from_sysfs_root(
        &generator::fixture_root("this-machine-virtio"),
        HealthModel::default(),
    )
    .unwrap();
    let matrix = fixture_matrix(&this_machine);
    assert_eq!(matrix.size, 0);
    assert!(
        exact_ring(&matrix).is_none()
            && best_ring(&matrix).is_none()
            && bus_id_order_ring(&matrix).is_none()
    );

    // A generated single-domain tree: 14 switches, 9 of them with a GPU.
    let scratch = generator::ScratchDir::new("nine-gpus").unwrap();
    let root = scratch.path.join("root");
    generator::write_tree(&root, &generator::large_tree(252, 9), 4096).unwrap();
    let topology = Topology::from_sysfs_root(&root, HealthModel::default()).unwrap();
    let gpus = topology.gpus();
    assert_eq!(gpus.len(), 9);
    assert_eq!(
        topology.path_between(gpus[0], gpus[1]).class,
        PathClass::Phb
    );
    assert_optimal(&fixture_matrix(&topology), "large_tree(252, 9)");
}

#[test]
fn pair_classes_between_domains_follow_numa_nodes() {
    // Four domains alternate NUMA nodes 0, 1, 0, 1.
    let scratch = generator::ScratchDir::new("domains").unwrap();
    let root = scratch.path.join("root");
    generator::write_tree(&root, &generator::large_tree(1000, 40), 64).unwrap();
    let topology = Topology::from_sysfs_root(&root, HealthModel::default()).unwrap();
    let gpus = topology.gpus();
    assert_eq!(gpus.len(), 40);
    let domain_of = |gpu: usize| topology.devices[gpu].bdf.domain;
    let first_in = |domain: u32| {
        gpus.iter()
            .copied()
            .find(|&gpu| domain_of(gpu) == domain)
            .unwrap()
    };
    assert_eq!(
        topology.path_between(first_in(0), first_in(2)).class,
        PathClass::Node
    );
    assert_eq!(
        topology.path_between(first_in(0), first_in(1)).class,
        PathClass::Sys
    );
    // Beyond 16 GPUs the planner switches to the heuristic.
    let matrix = fixture_matrix(&topology);
    let ring = best_ring(&matrix).unwrap();
    assert_eq!(ring.method, RingMethod::Heuristic);
    assert_is_ring(&ring, 40);
    // Each domain's GPUs are visited in one run: the ring crosses domains 4 times at most.
    let crossings = (0..40)
        .filter(|&i| domain_of(gpus[ring.order[i]]) != domain_of(gpus[ring.order[(i + 1) % 40]]))
        .count();
    assert!(
        crossings <= 4,
        "{crossings} domain crossings: {:?}",
        ring.order
    );
}

#[test]
fn heuristic_finds_the_clustered_optimum_and_never_loses_to_bus_order() {
    // 4 clusters of 6: fast inside, slow between. The optimum visits each
    // cluster in one run: 20 fast edges and 4 slow ones.
    let cluster = |member: usize| member / 6;
    let matrix = PairMatrix::from_fn(24, |from, to| {
        if cluster(from) == cluster(to) {
            (30.0, 10.0)
        } else {
            (10.0, 50.0)
        }
    });
    let ring = heuristic_ring(&matrix);
    assert_is_ring(&ring, 24);
    assert_eq!(ring.method, RingMethod::Heuristic);
    assert_eq!(ring.bottleneck_gbps, 10.0);
    assert_eq!(ring.total_cost_us, 20.0 * 10.0 + 4.0 * 50.0);

    let mut random = Lcg(7);
    for size in [17, 20, 32] {
        let matrix = random_matrix(&mut random, size, true);
        let heuristic = heuristic_ring(&matrix);
        assert_is_ring(&heuristic, size);
        let bus_order = bus_id_order_ring(&matrix).unwrap();
        assert!(!bus_order.is_better_than(&heuristic), "size {size}");
    }
}

#[test]
fn exact_limit_and_small_rings() {
    let mut random = Lcg(99);
    let sixteen = random_matrix(&mut random, EXACT_LIMIT, true);
    let exact = best_ring(&sixteen).unwrap();
    assert_eq!(exact.method, RingMethod::Exact);
    assert_is_ring(&exact, EXACT_LIMIT);
    assert!(!heuristic_ring(&sixteen).is_better_than(&exact));
    let seventeen = random_matrix(&mut random, EXACT_LIMIT + 1, true);
    assert!(exact_ring(&seventeen).is_none());

    let two = PairMatrix::from_fn(2, |from, _| if from == 0 { (8.0, 1.0) } else { (6.0, 2.0) });
    let ring = exact_ring(&two).unwrap();
    assert_eq!(
        (ring.order.clone(), ring.bottleneck_gbps, ring.total_cost_us),
        (vec![0, 1], 6.0, 3.0)
    );
    assert!(exact_ring(&PairMatrix::from_fn(1, |_, _| (1.0, 1.0))).is_none());

    let bus_order = bus_id_order_ring(&two).unwrap();
    assert_eq!(
        (bus_order.method, bus_order.order),
        (RingMethod::BusIdOrder, vec![0, 1])
    );
}

#[test]
fn zero_bandwidth_pairs_still_form_rings() {
    // A pair through a link of health 0 has bandwidth 0 and infinite cost.
    let matrix = PairMatrix::from_fn(5, |from, to| {
        if from.min(to) == 0 && from.max(to) == 1 {
            (0.0, f64::INFINITY)
        } else {
            (0.0, 1.0)
        }
    });
    let exact = exact_ring(&matrix).unwrap();
    assert_is_ring(&exact, 5);
    assert_eq!(exact.bottleneck_gbps, 0.0);
    // The ring avoids the infinite pair: four unit steps and one more.
    assert_eq!(exact.total_cost_us, 5.0);
    let all_infinite = PairMatrix::from_fn(4, |_, _| (0.0, f64::INFINITY));
    assert_is_ring(&exact_ring(&all_infinite).unwrap(), 4);
}
