//! Runs a test's ranks as separate processes: the test binary re-executes
//! itself, filtered to the same test, with the rank in the environment. Forking
//! the multi-threaded harness would be unsound; a fresh exec is not.

#![allow(dead_code)] // Each test file uses a different subset.

use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const ROLE_VAR: &str = "PCIEIPC_ENGINE_TEST_ROLE";

/// Who this process is in a multi-process test.
#[derive(Clone, Debug)]
pub struct Role {
    pub rank: usize,
    pub nranks: usize,
    /// A rendezvous name unique to this run of this test.
    pub rendezvous: String,
}

/// `Some` in a rank process, `None` in the test's parent process.
pub fn role() -> Option<Role> {
    let value = std::env::var(ROLE_VAR).ok()?;
    let mut parts = value.splitn(3, ':');
    let rank = parts.next()?.parse().ok()?;
    let nranks = parts.next()?.parse().ok()?;
    let rendezvous = parts.next()?.to_owned();
    Some(Role {
        rank,
        nranks,
        rendezvous,
    })
}

/// Starts `ranks` (a subset of 0..nranks, to leave some out) of test `test`.
pub fn spawn_ranks(test: &str, nranks: usize, ranks: &[usize]) -> Vec<(usize, Child)> {
    let rendezvous = format!("test-{test}-{}", std::process::id());
    let exe = std::env::current_exe().expect("test binary path");
    ranks
        .iter()
        .map(|rank| {
            let child = Command::new(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE_VAR, format!("{rank}:{nranks}:{rendezvous}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn rank process");
            (*rank, child)
        })
        .collect()
}

/// Waits for every rank, killing all of them if any runs past `limit`.
pub fn wait_ranks(children: Vec<(usize, Child)>, limit: Duration) -> Vec<(usize, Output)> {
    let started = Instant::now();
    let mut children = children;
    loop {
        let all_done = children
            .iter_mut()
            .all(|(_, child)| child.try_wait().expect("wait for rank").is_some());
        if all_done {
            break;
        }
        if started.elapsed() > limit {
            for (_, child) in &mut children {
                let _ = child.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    children
        .into_iter()
        .map(|(rank, child)| (rank, child.wait_with_output().expect("collect rank output")))
        .collect()
}

pub fn describe(rank: usize, output: &Output) -> String {
    format!(
        "rank {rank}: {}\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Asserts every rank passed, showing every rank that did not: the first
/// to fail is often not the lowest (a peer then fails for its leaving).
pub fn assert_succeeded(outputs: &[(usize, Output)]) {
    let failed: Vec<String> = outputs
        .iter()
        .filter(|(_, output)| !output.status.success())
        .map(|(rank, output)| describe(*rank, output))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Runs `body` in each of `nranks` rank processes and asserts they all pass.
pub fn run_ranks(test: &str, nranks: usize, limit: Duration, body: impl FnOnce(Role)) {
    if let Some(role) = role() {
        body(role);
        return;
    }
    let ranks: Vec<usize> = (0..nranks).collect();
    let outputs = wait_ranks(spawn_ranks(test, nranks, &ranks), limit);
    assert_succeeded(&outputs);
}

pub fn killed_by_sigkill(status: &ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(9)
}

/// Asserts that `victim` was killed by SIGKILL and every other rank passed.
pub fn assert_only_victim_killed(outputs: &[(usize, Output)], victim: usize) {
    for (rank, output) in outputs {
        if *rank == victim {
            assert!(
                killed_by_sigkill(&output.status),
                "{}",
                describe(*rank, output)
            );
        } else {
            assert!(output.status.success(), "{}", describe(*rank, output));
        }
    }
}

/// Lines of /proc/self/maps and targets of /proc/self/fd that refer to the
/// engine's memfd segment.
pub fn segment_references() -> Vec<String> {
    let name = pcieipc::engine::SEGMENT_NAME;
    let mut found: Vec<String> = std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .filter(|line| line.contains(name))
        .map(str::to_owned)
        .collect();
    for entry in std::fs::read_dir("/proc/self/fd")
        .expect("list /proc/self/fd")
        .flatten()
    {
        if let Ok(target) = std::fs::read_link(entry.path()) {
            let target = target.to_string_lossy().into_owned();
            if target.contains(name) {
                found.push(target);
            }
        }
    }
    found
}

/// Entries of /dev/shm named like the engine's segment: the engine uses memfds
/// only, so there must never be any.
pub fn dev_shm_segments() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .expect("list /dev/shm")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(pcieipc::engine::SEGMENT_NAME))
        .collect()
}
