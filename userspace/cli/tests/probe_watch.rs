//! `pcieipc probe --watch` on a copy of the dgx8 fixture whose GPU0
//! `aer_dev_correctable` the test rewrites while the watch runs: the GPU
//! turns sub-healthy from the new errors alone (not its lifetime totals) and
//! healthy again once they have left the window.

use std::fs;
use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

const GPU0: &str = "0000:05:00.0";
const GPU0_DIR: &str =
    "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:00.0/0000:05:00.0";
/// The fixture's GPU with 90,000 correctable and 3 non-fatal errors.
const GPU6: &str = "0000:8a:00.0";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/sysfs")
        .join(name)
}

/// A copy of a fixture (its device links included) that the test may rewrite.
struct FixtureCopy {
    root: PathBuf,
}

impl FixtureCopy {
    fn new(name: &str, test: &str) -> FixtureCopy {
        let root =
            std::env::temp_dir().join(format!("pcieipc-watch-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let status = Command::new("cp")
            .arg("-a")
            .arg(fixture(name))
            .arg(&root)
            .status()
            .expect("run cp");
        assert!(status.success(), "copying the {name} fixture");
        FixtureCopy { root }
    }

    /// Gives GPU0 `count` correctable errors (receiver errors), written to
    /// a new file renamed over the old so the watch never reads half of it.
    fn set_gpu0_correctable(&self, count: u64) {
        let path = self.root.join(GPU0_DIR).join("aer_dev_correctable");
        let text = format!(
            "RxErr {count}\nBadTLP 0\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR {count}\n"
        );
        let staged = path.with_extension("staged");
        fs::write(&staged, text).unwrap();
        fs::rename(&staged, &path).unwrap();
    }
}

impl Drop for FixtureCopy {
    fn drop(&mut self) {
        // Best effort: a leftover temp dir must not mask a test failure.
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// Starts a watch of `root` with 37 correctable errors scoring 0.63.
fn start_watch(root: &Path, extra: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .args(["probe", "--watch", "--correctable-scale", "100"])
        .arg("--sysfs-root")
        .arg(root)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run pcieipc probe --watch");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

fn device<'a>(sample: &'a serde_json::Value, bdf: &str) -> &'a serde_json::Value {
    sample["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|device| device["bdf"] == bdf)
        .unwrap_or_else(|| panic!("{bdf} in {sample}"))
}

#[test]
fn json_lines_follow_errors_through_the_window() {
    let copy = FixtureCopy::new("dgx8", "json");
    let args = [
        "--json",
        "--interval",
        "0.25",
        "--window",
        "1",
        "--count",
        "16",
    ];
    let (mut child, mut lines) = start_watch(&copy.root, &args);
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    copy.set_gpu0_correctable(37);
    let mut samples = vec![first];
    for line in lines {
        samples.push(serde_json::from_str(&line.unwrap()).unwrap());
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(samples.len(), 16);
    for (index, sample) in samples.iter().enumerate() {
        assert_eq!(sample["sample"], index as u64 + 1);
        assert_eq!(sample["window_s"], 1.0);
        assert_eq!(sample["aer_reported"], true);
        // 90,000 lifetime errors, none new: healthy in the window.
        assert_eq!(device(sample, GPU6)["health"], 1.0);
    }
    let first = &samples[0];
    assert_eq!(first["changes"], serde_json::json!([]));
    assert_eq!(device(first, GPU0)["health"], 1.0);
    assert_eq!(device(first, GPU0)["health_basis"], "aer_counters");
    assert_eq!(
        device(first, GPU0)["link"],
        serde_json::json!({"current_speed_gts": 16.0, "current_width": 16, "state": "full", "state_score": 1.0})
    );

    let gpu0_health = |sample: &serde_json::Value| device(sample, GPU0)["health"].as_f64().unwrap();
    let burst = samples
        .iter()
        .position(|sample| gpu0_health(sample) < 1.0)
        .expect("a sample with GPU0's new errors");
    let seen = &samples[burst];
    assert!((gpu0_health(seen) - 0.63).abs() < 1e-9, "{seen}");
    assert_eq!(device(seen, GPU0)["sub_healthy"], true);
    assert_eq!(
        device(seen, GPU0)["window_errors"],
        serde_json::json!({"correctable": 37, "nonfatal": 0, "fatal": 0})
    );
    let changes = seen["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{seen}");
    assert_eq!(changes[0]["bdf"], GPU0);
    assert_eq!(changes[0]["kind"], "health");
    assert_eq!(changes[0]["from"], 1.0);
    assert!((changes[0]["to"].as_f64().unwrap() - 0.63).abs() < 1e-9);

    let healed = burst
        + samples[burst..]
            .iter()
            .position(|sample| gpu0_health(sample) == 1.0)
            .expect("GPU0 healthy again once its errors left the window");
    // The errors seen at one sample count while that sample is less than
    // the window (1 s) old.
    let age = |index: usize| {
        samples[index]["elapsed_s"].as_f64().unwrap()
            - samples[burst]["elapsed_s"].as_f64().unwrap()
    };
    assert!(
        age(healed - 1) < 1.0 && age(healed) >= 1.0,
        "{burst} {healed}"
    );
    let changes = samples[healed]["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0]["kind"], "health");
    assert_eq!(changes[0]["to"], 1.0);
    assert!(samples[healed..]
        .iter()
        .all(|sample| gpu0_health(sample) == 1.0));
}

#[test]
fn text_marks_the_changes() {
    let copy = FixtureCopy::new("dgx8", "text");
    let args = ["--interval", "0.25", "--window", "0.75", "--count", "12"];
    let (mut child, mut lines) = start_watch(&copy.root, &args);
    let header = lines.next().unwrap().unwrap();
    assert_eq!(
        header,
        format!(
            "Watching PCI devices under {}: a sample every 0.25 s, health from the AER errors of the last 0.75 s (not lifetime totals)",
            copy.root.display()
        )
    );
    // The first sample lists every device with a score or a link, the last
    // being the NVMe drive of the second socket.
    let mut listing = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let last = line.contains("0000:8c:00.0");
        listing.push(line);
        if last {
            break;
        }
    }
    copy.set_gpu0_correctable(37);
    let changes: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(child.wait().unwrap().success());
    for expected in [
        "    0.0 s  0000:05:00.0  health 1.0000  16.0 GT/s x16 (full)",
        "    0.0 s  0000:08:00.0  health 1.0000  16.0 GT/s x8 (DEGRADED)",
        "    0.0 s  0000:8a:00.0  health 1.0000  16.0 GT/s x16 (full)",
        "    0.0 s  0000:8b:00.0  health 1.0000  2.5 GT/s x16 (idle downshift likely)",
    ] {
        assert!(
            listing.iter().any(|line| line == expected),
            "{expected:?} in {listing:#?}"
        );
    }
    assert_eq!(changes.len(), 2, "{changes:#?}");
    let sick = changes[0].split_once(" s  ").unwrap().1;
    assert!(
        sick.starts_with("0000:05:00.0  health 1.0000 -> 0.6300 (+37 correctable in ")
            && sick.ends_with(" s) SUB-HEALTHY"),
        "{sick:?}"
    );
    let healed = changes[1].split_once(" s  ").unwrap().1;
    assert!(
        healed.starts_with("0000:05:00.0  health 0.6300 -> 1.0000 (no AER errors in "),
        "{healed:?}"
    );
}

#[test]
fn without_aer_counters_the_link_alone_is_watched() {
    let output = Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .args(["probe", "--watch", "--count", "2", "--interval", "0.1"])
        .arg("--sysfs-root")
        .arg(fixture("h200-1gpu-vm"))
        .output()
        .expect("run pcieipc probe --watch");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[1..],
        [
            "AER: not reported by this kernel/VM (no aer_dev_* files): watching link state only",
            "    0.0 s  0000:00:06.0  health 1.0000 (link state; AER not reported)  32.0 GT/s x16 (full)",
        ]
    );
}

#[test]
fn window_shorter_than_interval_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .args(["probe", "--watch", "--interval", "2", "--window", "1"])
        .arg("--sysfs-root")
        .arg(fixture("dgx8"))
        .output()
        .expect("run pcieipc probe --watch");
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "pcieipc: error: --window (1 s) must be at least --interval (2 s): a window counts the errors seen at the samples within it\n"
    );
}
