//! A reader that goes away (`pcieipc bench | head -1`) ends the command
//! quietly: no panic, no backtrace, the shell's SIGPIPE status, and no rank
//! left running.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn bench_ends_quietly_when_its_reader_goes_away() {
    // Sizes up to 256 MiB: the sweep is far from done when the reader leaves.
    let mut bench = Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .args(["bench", "--nranks", "2", "-b", "8", "-e", "256M", "-c", "0"])
        .args(["--bind-to", "none"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting pcieipc bench");
    let launcher = bench.id();
    let mut table = BufReader::new(bench.stdout.take().unwrap());
    let mut first = String::new();
    table.read_line(&mut first).expect("reading the header");
    assert!(first.starts_with("# pcieipc bench:"), "{first:?}");
    drop(table);
    let started = Instant::now();
    let output = bench.wait_with_output().expect("waiting for pcieipc bench");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the sweep went on after its reader left: {:?}",
        started.elapsed()
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert_eq!(output.status.code(), Some(141), "{stderr}");
    // No rank outlives the launcher: its ranks are the processes that joined
    // its rendezvous, named after it.
    let rendezvous = format!("bench-{launcher}");
    let ranks_left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let cmdline = std::fs::read(entry.ok()?.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline
                .split(' ')
                .any(|arg| arg == rendezvous)
                .then_some(cmdline)
        })
        .collect();
    assert!(ranks_left.is_empty(), "ranks left running: {ranks_left:?}");
}
