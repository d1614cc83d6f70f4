//! Benchmark (not a test): the probe of a 1,000-device synthetic sysfs tree
//! (read, tree, links, doctor) and the exact ring for 16 GPUs. Prints the
//! median of several runs of each; scripts/bench-probe.sh runs it.

#[path = "../../../tests/fixtures/sysfs/generator.rs"]
mod generator;

use std::time::{Duration, Instant};

use pcieipc::plan::{exact_ring, PairMatrix, EXACT_LIMIT};
use pcieipc::probe::{diagnose, HealthModel, Topology};

/// "median (fastest) ms": the fastest run shows the cost without
/// preemption when other work shares the CPUs.
fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let ms = |duration: Duration| duration.as_secs_f64() * 1e3;
    format!(
        "{:.2} ms (fastest {:.2} ms)",
        ms(samples[samples.len() / 2]),
        ms(samples[0])
    )
}

fn main() {
    let scratch = generator::ScratchDir::new("bench").expect("scratch directory");
    let root = scratch.path.join("root");
    let devices = generator::large_tree(1000, 16);
    generator::write_tree(&root, &devices, 4096).expect("writing the synthetic tree");

    // The first run warms the page and dentry caches, as on a live system
    // where sysfs is in memory.
    let warm = Topology::from_sysfs_root(&root, HealthModel::default()).expect("probe");
    assert_eq!((warm.devices.len(), warm.gpus().len()), (1000, 16));
    let probe_times: Vec<Duration> = (0..21)
        .map(|_| {
            let start = Instant::now();
            let topology = Topology::from_sysfs_root(&root, HealthModel::default()).expect("probe");
            let findings = diagnose(&topology);
            std::hint::black_box(findings);
            start.elapsed()
        })
        .collect();

    // All pair bandwidths distinct: the most thresholds to search.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let matrix = PairMatrix::from_fn(EXACT_LIMIT, |_, _| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state % 1_000_000) as f64 / 1000.0, (state % 997) as f64)
    });
    let ring_times: Vec<Duration> = (0..7)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(exact_ring(&matrix).expect("ring"));
            start.elapsed()
        })
        .collect();

    println!(
        "probe of a 1,000-device tree (16 GPUs), median of 21: {}",
        summary(probe_times)
    );
    println!(
        "exact ring for 16 GPUs, median of 7: {}",
        summary(ring_times)
    );
}
