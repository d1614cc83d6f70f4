//! `pcieipc probe` on the H200 fixtures: a GPU's own link under a hidden
//! port, AER not reported, and NVLink from recorded NVML answers.

use std::process::{Command, Output};

fn fixture(name: &str) -> String {
    format!(
        "{}/../../tests/fixtures/sysfs/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn probe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .arg("probe")
        .args(args)
        .output()
        .expect("run pcieipc probe")
}

fn text_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

#[test]
fn one_h200_vm_shows_its_gpu_link_and_says_what_is_missing() {
    let root = fixture("h200-1gpu-vm");
    let nvml = format!("{root}/nvml.json");
    let text = text_of(&probe(&["--sysfs-root", &root, "--nvml-fixture", &nvml]));
    for expected in [
        "\\-[0000:00:06.0] 3D controller: NVIDIA 0x2335 <GPU0>  32.0 GT/s x16  health 1.0000 (link state; AER not reported)",
        "AER: not reported by this kernel/VM (no aer_dev_* files)",
        "GPU0  0000:00:06.0  NUMA ?  bottleneck to root 63.02 GB/s (link above 0000:00:06.0)  health 1.0000 (link state; AER not reported)",
        "NVLink: not supported by this GPU/driver (driver 580.159.04)",
    ] {
        assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    }
    assert!(!text.contains("health ?"), "{text}");
    assert!(!text.contains("unknown"), "{text}");
}

#[test]
fn two_h200_pair_is_nv18_and_the_ring_runs_at_nvlink_bandwidth() {
    let root = fixture("h200-2gpu-vm");
    let nvml = format!("{root}/nvml.json");
    let text = text_of(&probe(&["--sysfs-root", &root, "--nvml-fixture", &nvml]));
    for expected in [
        "NVLink: 18 active: 18 to GPU1 (0000:00:07.0) (NVLink 4.0, 25.0 GB/s each)",
        "NVLink: active (driver 580.159.04)",
        "  GPU0                 X      NV18 450.0",
        "optimal       GPU0 -> GPU1 -> GPU0  bottleneck 450.00 GB/s",
    ] {
        assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    }
    let json = probe(&["--sysfs-root", &root, "--nvml-fixture", &nvml, "--json"]);
    let report: serde_json::Value = serde_json::from_str(&text_of(&json)).unwrap();
    assert_eq!(report["schema_version"], 2);
    assert_eq!(report["gpu_pairs"][0]["class"], "NV18");
    assert_eq!(report["gpu_pairs"][0]["pcie_class"], "PHB");
    assert_eq!(report["ring"]["best"]["bottleneck_gbps"], 450.0);
    assert_eq!(report["aer_reported"], false);
    assert_eq!(
        report["devices"][6]["link"]["upstream_port"],
        serde_json::Value::Null
    );
    assert_eq!(report["devices"][6]["health_basis"], "link_state");

    // A copied tree without its NVML answers: NVLink not read, PCIe only.
    let text = text_of(&probe(&["--sysfs-root", &root]));
    assert!(
        text.contains(
            "NVLink: not read (a copied sysfs tree: give its NVML answers with --nvml-fixture)"
        ),
        "{text}"
    );
    assert!(
        text.contains("  GPU0                 X     PHB 2h 63.0"),
        "{text}"
    );
}

#[test]
fn unreadable_nvml_fixture_is_an_error_naming_the_file() {
    let root = fixture("h200-1gpu-vm");
    let missing = format!("{root}/no-such-nvml.json");
    let output = probe(&["--sysfs-root", &root, "--nvml-fixture", &missing]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{missing}: cannot read NVML answers")),
        "{stderr}"
    );
    // Not NVML answers: a sysfs attribute file.
    let wrong = format!("{root}/sys/devices/pci0000:00/0000:00:06.0/class");
    let output = probe(&["--sysfs-root", &root, "--nvml-fixture", &wrong]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{wrong}: not a file of NVML answers")),
        "{stderr}"
    );
}
