//! `pcieipc bench --link-of`: the chunk of each call follows the link that the
//! probe finds above the named function (the dgx8 fixture), the smallest any
//! rank's link asks for, and bad values are refused before any rank starts.

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/sysfs/dgx8"
    );
    Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .args(["bench", "--nranks", "2", "-n", "2", "-w", "1", "--json"])
        .args(["--sysfs-root", fixture])
        .args(args)
        .output()
        .expect("run pcieipc bench")
}

/// The chunk of the in-place and out-of-place calls at each size.
fn chunks(output: &Output) -> Vec<(u64, u64, u64)> {
    assert!(
        output.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    assert_eq!(report["wrong"], 0);
    report["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|row| {
            (
                row["size_bytes"].as_u64().unwrap(),
                row["out_of_place"]["chunk_bytes"].as_u64().unwrap(),
                row["in_place"]["chunk_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn chunk_follows_the_probed_link() {
    let sizes = ["-b", "256K", "-e", "64M", "-f", "256"];
    // Host memory's table by message size: 256 KiB, then 512 KiB above 16 MiB.
    let host = chunks(&bench(&sizes));
    assert_eq!(
        host,
        [
            (256 << 10, 256 << 10, 256 << 10),
            (64 << 20, 512 << 10, 512 << 10)
        ]
    );
    // A healthy Gen4 x16 path: 1 MiB at every size.
    let healthy = chunks(&bench(
        &[&sizes[..], &["--link-of", "0000:05:00.0"]].concat(),
    ));
    assert_eq!(
        healthy,
        [(256 << 10, 1 << 20, 1 << 20), (64 << 20, 1 << 20, 1 << 20)]
    );
    // The sub-healthy GPU (AER counters): 256 KiB.
    let sub_healthy = chunks(&bench(
        &[&sizes[..], &["--link-of", "0000:8a:00.0"]].concat(),
    ));
    assert_eq!(
        sub_healthy,
        [
            (256 << 10, 256 << 10, 256 << 10),
            (64 << 20, 256 << 10, 256 << 10)
        ]
    );
    // One rank healthy, one sub-healthy: the smaller chunk for both.
    let mixed = chunks(&bench(
        &[&sizes[..], &["--link-of", "0000:05:00.0,0000:8a:00.0"]].concat(),
    ));
    assert_eq!(mixed, sub_healthy);
}

#[test]
fn bad_link_of_is_refused_with_a_reason() {
    let refused = |args: &[&str], reason: &str| {
        let output = bench(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
        assert!(
            output.stdout.is_empty(),
            "{args:?} ran: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    };
    refused(
        &["--link-of", "0000:99:00.0"],
        "no PCI function 0000:99:00.0",
    );
    refused(
        &["--link-of", "0000:05:00.0,0000:06:00.0,0000:0a:00.0"],
        "3 functions for 2 ranks",
    );
    refused(
        &["--link-of", "0000:05:00.0", "--transport", "pcieipc"],
        "--link-of is for transports without link events: the pcieipc transport",
    );
    refused(&["--link-of", "05:00"], "--link-of");
}
