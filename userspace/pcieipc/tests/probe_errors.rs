//! Bad, missing and unprivileged inputs: unknown where the kernel gives
//! nothing, a typed error carrying the path where a file does not parse.

#[path = "../../../tests/fixtures/sysfs/generator.rs"]
mod generator;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use pcieipc::plan::CostModel;
use pcieipc::probe::attributes::ParseError;
use pcieipc::probe::{
    DeviceKind, FindingKind, HealthModel, LinkSpeed, LinkState, PeerRoute, ProbeError, ProbeReport,
    Topology,
};

const GPU0_DIR: &str =
    "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:00.0/0000:05:00.0";

fn dgx8_copy(name: &str, config_len: usize) -> generator::ScratchDir {
    let scratch = generator::ScratchDir::new(name).unwrap();
    generator::write_tree(
        &scratch.path.join("root"),
        &generator::dgx_eight_gpu(),
        config_len,
    )
    .unwrap();
    scratch
}

fn probe(root: &Path) -> Result<Topology, ProbeError> {
    Topology::from_sysfs_root(root, HealthModel::default())
}

#[test]
fn malformed_attribute_is_reported_with_its_path() {
    // Link attributes are read when config space stops at the header (unprivileged).
    for (file, text, config_len) in [
        ("current_link_speed", "fast\n", 64),
        ("max_link_width", "wide\n", 64),
        ("aer_dev_correctable", "RxErr 1\n", 4096),
        ("class", "VGA\n", 4096),
        ("resource", "0x0 0x1\n", 4096),
    ] {
        let scratch = dgx8_copy("malformed", config_len);
        let root = scratch.path.join("root");
        let path = root.join(GPU0_DIR).join(file);
        fs::write(&path, text).unwrap();
        match probe(&root) {
            Err(ProbeError::Malformed {
                path: reported,
                source: ParseError::Unexpected { found, .. },
            }) => {
                assert_eq!(reported, path);
                assert_eq!(found, text.trim());
            }
            other => panic!(
                "{file}: expected a malformed-file error, got {:?}",
                other.map(|_| "a topology")
            ),
        }
        let message = probe(&root).unwrap_err().to_string();
        assert!(
            message.starts_with(&path.display().to_string()),
            "{message}"
        );
    }
}

#[test]
fn missing_and_unreadable_attributes_are_unknown() {
    let scratch = dgx8_copy("missing", 4096);
    let root = scratch.path.join("root");
    let gpu0 = root.join(GPU0_DIR);
    for file in [
        "current_link_speed",
        "current_link_width",
        "max_link_speed",
        "max_link_width",
        "numa_node",
    ] {
        fs::remove_file(gpu0.join(file)).unwrap();
    }
    // A directory where a file should be cannot be read: unknown, no crash.
    fs::remove_file(gpu0.join("aer_dev_correctable")).unwrap();
    fs::create_dir(gpu0.join("aer_dev_correctable")).unwrap();
    // Without sysfs attributes the config space still gives the link...
    let topology = probe(&root).unwrap();
    let gpu = topology.find("0000:05:00.0".parse().unwrap()).unwrap();
    assert_eq!(topology.link_above(gpu).unwrap().state, LinkState::Full);
    assert_eq!(topology.devices[gpu].numa_node, None);
    assert!(topology.devices[gpu].aer.correctable.is_none());
    assert!(topology.devices[gpu].aer.nonfatal.is_some());

    // ...and without either, the GPU's own end is unknown; the DSP above
    // still reports the link.
    fs::write(gpu0.join("config"), [0u8; 0]).unwrap();
    let topology = probe(&root).unwrap();
    let device = &topology.devices[gpu];
    assert_eq!(device.config_bytes_readable, 0);
    assert_eq!(device.link_end, Default::default());
    assert_eq!(topology.link_above(gpu).unwrap().state, LinkState::Full);

    // With the port's attributes and config gone too, the link is unknown.
    let port = root.join(GPU0_DIR).parent().unwrap().to_path_buf();
    for file in [
        "current_link_speed",
        "current_link_width",
        "max_link_speed",
        "max_link_width",
        "config",
    ] {
        fs::remove_file(port.join(file)).unwrap();
    }
    let topology = probe(&root).unwrap();
    assert_eq!(topology.link_above(gpu).unwrap().state, LinkState::Unknown);
    assert!(topology
        .link_above(gpu)
        .unwrap()
        .effective_bandwidth_gbps()
        .is_none());
    let gpu1 = topology.find("0000:06:00.0".parse().unwrap()).unwrap();
    let path = topology.path_between(gpu, gpu1);
    assert_eq!(path.unknown_links, 1);
    assert!(path.bottleneck.is_some());
    ProbeReport::new(&topology, &CostModel::default());
}

#[test]
fn unprivileged_config_reads_leave_extended_capabilities_unknown() {
    let scratch = dgx8_copy("unprivileged", 64);
    let topology = probe(&scratch.path.join("root")).unwrap();
    for device in &topology.devices {
        assert_eq!(device.config_bytes_readable, 64);
        assert!(
            device.pci_express.is_none() && device.acs.is_none() && device.resizable_bars.is_none()
        );
    }
    // Port types are inferred from the bridge classes and the tree.
    let kind = |text: &str| topology.devices[topology.find(text.parse().unwrap()).unwrap()].kind;
    assert_eq!(kind("0000:80:01.0"), DeviceKind::RootPort);
    assert_eq!(kind("0000:81:00.0"), DeviceKind::SwitchUpstreamPort);
    assert_eq!(kind("0000:82:01.0"), DeviceKind::SwitchDownstreamPort);
    assert_eq!(kind("0000:83:00.0"), DeviceKind::SwitchUpstreamPort);
    assert_eq!(kind("0000:84:00.0"), DeviceKind::SwitchDownstreamPort);
    // Links come from the sysfs attributes, without a target speed.
    let switch = topology.find("0000:08:00.0".parse().unwrap()).unwrap();
    let link = topology.link_above(switch).unwrap();
    assert_eq!((link.state, link.target_speed), (LinkState::Degraded, None));
    // The NVMe drives print the older "16 GT/s" format.
    let nvme = topology.find("0000:0c:00.0".parse().unwrap()).unwrap();
    let link = topology.link_above(nvme).unwrap();
    assert_eq!(
        (
            link.current_speed,
            link.current_width,
            link.max_speed,
            link.max_width,
            link.state
        ),
        (
            Some(LinkSpeed::Gt16),
            Some(4),
            Some(LinkSpeed::Gt16),
            Some(4),
            LinkState::Full
        )
    );
    let gpu7 = topology.find("0000:8b:00.0".parse().unwrap()).unwrap();
    assert_eq!(
        topology.link_above(gpu7).unwrap().state,
        LinkState::IdleDownshiftLikely
    );

    let report = ProbeReport::new(&topology, &CostModel::default());
    assert!(report
        .findings
        .iter()
        .all(|finding| finding.kind != FindingKind::AcsRedirect));
    let unknown = report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::AcsUnknown)
        .count();
    // The ingress ports of the three switches where GPU pairs turn around per socket.
    assert_eq!(unknown, 12);
    let pair = report
        .gpu_pairs
        .iter()
        .find(|pair| (pair.a, pair.b) == (4, 5))
        .unwrap();
    assert_eq!(pair.p2p_route, PeerRoute::AcsUnknown);
    let finding = report
        .findings
        .iter()
        .find(|finding| finding.kind == FindingKind::AcsUnknown)
        .unwrap();
    assert!(
        finding
            .evidence
            .contains("config readable to 64 bytes (unprivileged)"),
        "{}",
        finding.evidence
    );
}

#[test]
fn wrong_root_and_bad_device_links_are_errors_with_paths() {
    let scratch = generator::ScratchDir::new("bad-root").unwrap();
    match probe(&scratch.path) {
        Err(ProbeError::ListDevices { path, .. }) => {
            assert_eq!(path, scratch.path.join("sys/bus/pci/devices"))
        }
        other => panic!(
            "expected a listing error, got {:?}",
            other.map(|_| "a topology")
        ),
    }

    let scratch = dgx8_copy("bad-link", 4096);
    let root = scratch.path.join("root");
    let link = root.join("sys/bus/pci/devices/0000:99:00.0");
    symlink("../../../../../elsewhere/0000:99:00.0", &link).unwrap();
    match probe(&root) {
        Err(ProbeError::DeviceLink { path, .. }) => assert_eq!(path, link),
        other => panic!(
            "expected a device-link error, got {:?}",
            other.map(|_| "a topology")
        ),
    }
    fs::remove_file(&link).unwrap();
    symlink("../../../devices/virtual/0000:99:00.0", &link).unwrap();
    assert!(matches!(probe(&root), Err(ProbeError::DeviceLink { .. })));
    fs::remove_file(&link).unwrap();
    fs::create_dir_all(root.join("sys/bus/pci/devices/not-a-bdf")).unwrap();
    match probe(&root) {
        Err(ProbeError::Malformed { path, .. }) => assert!(path.ends_with("not-a-bdf")),
        other => panic!(
            "expected a malformed name, got {:?}",
            other.map(|_| "a topology")
        ),
    }
}
