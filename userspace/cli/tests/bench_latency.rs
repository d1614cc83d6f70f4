//! `pcieipc bench --latency` and `--latency-plot`: the per-call table, the
//! plot with a peer's calls beside pcieipc's, and what is refused before any
//! rank starts.

use std::path::PathBuf;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .args(["bench", "--nranks", "2"])
        .args(args)
        .output()
        .expect("run pcieipc bench")
}

/// A directory of this test's own under the target directory.
fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

#[test]
fn the_table_and_the_plot_show_each_size_beside_the_peer() {
    let dir = scratch("latency_plot");
    let peer = dir.join("mpi.txt");
    // bench/mpi_allreduce --latency's form: the table, then per-call lines
    // (8 B only: 4 KiB has no peer to draw beside it).
    std::fs::write(
        &peer,
        "#       size   oop time\ncalls 8 oop 0.5 0.5 0.7 9.0\ncalls 8 ip 0.5 0.6\n\
         8 0.5 0.1 0.5 0.1\n",
    )
    .unwrap();
    let svg = dir.join("latency.svg");
    let output = bench(&[
        "-b",
        "8",
        "-e",
        "4K",
        "-f",
        "512",
        "-n",
        "400",
        "-w",
        "10",
        "--latency",
        "--latency-plot",
        svg.to_str().unwrap(),
        "--latency-peer",
        peer.to_str().unwrap(),
        "--latency-peer-name",
        "NCCL all_reduce",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Four rows, each of 400 calls, each p50 <= p90 <= p99 <= p99.7 <= max.
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .skip_while(|line| !line.starts_with("# Per-call latency"))
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for (row, (size, placement)) in
        rows.iter()
            .zip([("8", "out"), ("8", "in"), ("4096", "out"), ("4096", "in")])
    {
        assert_eq!((row[0], row[1]), (size, placement), "{stdout}");
        let numbers: Vec<f64> = row[row.len() - 8..]
            .iter()
            .map(|field| field.parse().expect("a number"))
            .collect();
        assert_eq!(numbers[0], 400.0, "{row:?}");
        assert!(numbers[1] > 0.0, "{row:?}");
        assert!(
            numbers[1..6].windows(2).all(|pair| pair[0] <= pair[1]),
            "{row:?}"
        );
    }
    let svg = std::fs::read_to_string(&svg).expect("the plot");
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    // pcieipc at both sizes and placements, the peer at 8 B in both: six
    // distributions, each with its maximum's dot; the peer's 9 us call there.
    assert_eq!(svg.matches("<circle").count(), 6, "{svg}");
    assert!(svg.contains("NCCL all_reduce") && svg.contains("max 9.00 µs · sd"));
    assert!(
        !svg.contains("MPI_Allreduce"),
        "the peer's name is the one given"
    );
    assert!(svg.contains("out of place") && svg.contains("in place"));
}

#[test]
fn a_peer_file_that_is_not_one_is_refused_before_the_ranks_start() {
    let dir = scratch("latency_bad_peer");
    let peer = dir.join("table-only.txt");
    std::fs::write(&peer, "#       size   oop time\n8 0.5 0.1 0.5 0.1\n").unwrap();
    let svg = dir.join("never.svg");
    let output = bench(&[
        "-b",
        "8",
        "-e",
        "8",
        "--latency-plot",
        svg.to_str().unwrap(),
        "--latency-peer",
        peer.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(peer.to_str().unwrap()) && stderr.contains("no \"calls\" lines"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty() && !svg.exists());
    let missing = dir.join("missing.txt");
    let output = bench(&[
        "--latency-plot",
        svg.to_str().unwrap(),
        "--latency-peer",
        missing.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("missing.txt"),
        "{stderr}"
    );
    // A plot with no directory to go to is refused before any call.
    let nowhere = dir.join("no-such-directory").join("plot.svg");
    let output = bench(&["--latency-plot", nowhere.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success()
            && stderr.contains("no-such-directory")
            && output.stdout.is_empty(),
        "{stderr}"
    );
}

#[test]
fn latency_is_refused_where_calls_are_not_timed_one_by_one() {
    for args in [
        &["-G", "--latency"][..],
        &["--cold-start", "--latency"][..],
        &["--latency-peer", "x.txt"][..],
    ] {
        let output = bench(args);
        assert!(!output.status.success(), "{args:?} was taken");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}
