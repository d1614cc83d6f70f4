//! Topology files: the PCIe fabric a testbed VM is started with.
//! The format is documented in docs/topology-format.md.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use pcieipc_ivshmem_server::{parse_size, MIN_SHM_SIZE};
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("{path}: cannot read the topology file: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: malformed topology file: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// Link speed of a port, in GT/s, as QEMU's `x-speed` property knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum LinkSpeed {
    #[serde(rename = "2.5")]
    Gen1,
    #[serde(rename = "5")]
    Gen2,
    #[serde(rename = "8")]
    Gen3,
    #[serde(rename = "16")]
    Gen4,
    #[serde(rename = "32")]
    Gen5,
    #[serde(rename = "64")]
    Gen6,
}

impl LinkSpeed {
    /// The value of QEMU's `x-speed` property.
    pub fn qemu_value(self) -> &'static str {
        match self {
            LinkSpeed::Gen1 => "2_5",
            LinkSpeed::Gen2 => "5",
            LinkSpeed::Gen3 => "8",
            LinkSpeed::Gen4 => "16",
            LinkSpeed::Gen5 => "32",
            LinkSpeed::Gen6 => "64",
        }
    }

    /// The number of GT/s as the kernel's sysfs prints it ("2.5", "16.0").
    pub fn sysfs_gts(self) -> &'static str {
        match self {
            LinkSpeed::Gen1 => "2.5",
            LinkSpeed::Gen2 => "5.0",
            LinkSpeed::Gen3 => "8.0",
            LinkSpeed::Gen4 => "16.0",
            LinkSpeed::Gen5 => "32.0",
            LinkSpeed::Gen6 => "64.0",
        }
    }
}

/// Widths QEMU's `x-width` accepts.
const LINK_WIDTHS: [u8; 7] = [1, 2, 4, 8, 12, 16, 32];

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Port {
    pub id: String,
    pub speed: Option<LinkSpeed>,
    pub width: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Switch {
    pub id: String,
    /// The root port or downstream port the switch's upstream port sits on.
    pub parent: String,
    pub downstream: Vec<Port>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndpointKind {
    /// QEMU's ivshmem-doorbell (1af4:1110): MSI-X doorbells over a shared region.
    IvshmemDoorbell,
    /// QEMU's edu (1234:11e8): MSI and a DMA engine over a 4 KiB window.
    Edu,
    /// QEMU's pci-testdev (1b36:0005).
    PciTestdev,
    /// QEMU's e1000 (8086:100e): a conventional NIC whose only interrupt is
    /// level-triggered INTx, raised through its registers in BAR0.
    E1000,
    /// QEMU's ahci (8086:2922): a SATA controller, class mass storage, with
    /// no drive attached; the guest has no driver for it.
    Ahci,
}

impl EndpointKind {
    pub fn qemu_device(self) -> &'static str {
        match self {
            EndpointKind::IvshmemDoorbell => "ivshmem-doorbell",
            EndpointKind::Edu => "edu",
            EndpointKind::PciTestdev => "pci-testdev",
            EndpointKind::E1000 => "e1000",
            EndpointKind::Ahci => "ahci",
        }
    }

    /// PCI vendor:device as the guest sees it.
    pub fn pci_id(self) -> &'static str {
        match self {
            EndpointKind::IvshmemDoorbell => "1af4:1110",
            EndpointKind::Edu => "1234:11e8",
            EndpointKind::PciTestdev => "1b36:0005",
            EndpointKind::E1000 => "8086:100e",
            EndpointKind::Ahci => "8086:2922",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub id: String,
    pub kind: EndpointKind,
    /// The root port or downstream port the endpoint sits on.
    pub parent: String,
    /// ivshmem-doorbell only: the shared region (and so the server) it joins.
    pub region: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    pub id: String,
    /// Bytes, with an optional K/M/G suffix (binary); a power of two.
    pub size: String,
    /// Doorbell vectors of each device in the region.
    #[serde(default = "default_vectors")]
    pub vectors: u16,
}

fn default_vectors() -> u16 {
    1
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Vm {
    pub memory_mib: Option<u32>,
    pub timeout_s: Option<u64>,
    /// Appended to the guest kernel's command line (`pci=nomsi`, say).
    pub kernel_args: Option<String>,
}

/// A parsed and checked topology file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    #[serde(default)]
    pub vm: Vm,
    #[serde(default, rename = "root_port")]
    pub root_ports: Vec<Port>,
    #[serde(default, rename = "switch")]
    pub switches: Vec<Switch>,
    #[serde(default, rename = "endpoint")]
    pub endpoints: Vec<Endpoint>,
    #[serde(default, rename = "region")]
    pub regions: Vec<Region>,
}

impl Topology {
    pub fn load(path: &Path) -> Result<Self, TopologyError> {
        let text = std::fs::read_to_string(path).map_err(|source| TopologyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|err| match err {
            ParseError::Syntax(message) => TopologyError::Parse {
                path: path.to_path_buf(),
                message,
            },
            ParseError::Invalid(message) => TopologyError::Invalid {
                path: path.to_path_buf(),
                message,
            },
        })
    }

    /// Parses and checks topology text.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let topology: Topology =
            toml::from_str(text).map_err(|e| ParseError::Syntax(e.to_string()))?;
        topology.check().map_err(ParseError::Invalid)?;
        Ok(topology)
    }

    fn check(&self) -> Result<(), String> {
        if let Some(args) = &self.vm.kernel_args {
            if !args.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
                return Err(format!(
                    "kernel_args {args:?}: printable ASCII and spaces only"
                ));
            }
        }
        if self.root_ports.is_empty() {
            return Err("no [[root_port]]: a topology needs at least one root port".into());
        }
        let mut kinds: HashMap<&str, &str> = HashMap::new();
        let claim = |id: &'_ str, what: &'static str| -> Result<(), String> {
            if id.is_empty()
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(format!(
                    "{what} id {id:?}: use letters, digits, '-' and '_'"
                ));
            }
            Ok(())
        };
        let ports = self.root_ports.iter().map(|p| (p, "root port")).chain(
            self.switches
                .iter()
                .flat_map(|s| s.downstream.iter().map(|p| (p, "downstream port"))),
        );
        for (port, what) in ports {
            claim(&port.id, what)?;
            if kinds.insert(&port.id, what).is_some() {
                return Err(format!("id {:?} is used twice", port.id));
            }
            if let Some(width) = port.width {
                if !LINK_WIDTHS.contains(&width) {
                    return Err(format!(
                        "{what} {:?}: width {width} is not one of {LINK_WIDTHS:?}",
                        port.id
                    ));
                }
            }
        }
        for port in self.switches.iter().flat_map(|s| &s.downstream) {
            if port.speed.is_some() || port.width.is_some() {
                return Err(format!(
                    "downstream port {:?}: QEMU's switch ports (xio3130-downstream) have no link speed or width \
                     settings; set them on root ports",
                    port.id
                ));
            }
        }
        for switch in &self.switches {
            claim(&switch.id, "switch")?;
            if kinds.insert(&switch.id, "switch").is_some() {
                return Err(format!("id {:?} is used twice", switch.id));
            }
            if switch.downstream.is_empty() {
                return Err(format!(
                    "switch {:?} has no [[switch.downstream]] port",
                    switch.id
                ));
            }
            if switch.downstream.len() > 32 {
                return Err(format!(
                    "switch {:?} has more than 32 downstream ports",
                    switch.id
                ));
            }
        }
        for endpoint in &self.endpoints {
            claim(&endpoint.id, "endpoint")?;
            if kinds.insert(&endpoint.id, "endpoint").is_some() {
                return Err(format!("id {:?} is used twice", endpoint.id));
            }
        }
        let mut regions = BTreeMap::new();
        for region in &self.regions {
            claim(&region.id, "region")?;
            if regions.insert(region.id.as_str(), region).is_some() {
                return Err(format!("region id {:?} is used twice", region.id));
            }
            let size =
                parse_size(&region.size).map_err(|e| format!("region {:?}: {e}", region.id))?;
            if size < MIN_SHM_SIZE {
                return Err(format!(
                    "region {:?}: size {size} is below {MIN_SHM_SIZE} bytes",
                    region.id
                ));
            }
            if !size.is_power_of_two() {
                return Err(format!(
                    "region {:?}: size {size} is not a power of two (ivshmem needs one)",
                    region.id
                ));
            }
            if region.vectors == 0 {
                return Err(format!(
                    "region {:?}: vectors must be at least 1",
                    region.id
                ));
            }
        }
        // Every port carries one device below it: a link has two ends.
        let mut occupied: HashMap<&str, &str> = HashMap::new();
        let children = self
            .switches
            .iter()
            .map(|s| (s.id.as_str(), s.parent.as_str()))
            .chain(
                self.endpoints
                    .iter()
                    .map(|e| (e.id.as_str(), e.parent.as_str())),
            );
        for (child, parent) in children {
            match kinds.get(parent) {
                Some(&"root port") | Some(&"downstream port") => {}
                Some(other) => {
                    return Err(format!(
                        "{child:?} sits on {parent:?}, which is a {other}, not a port"
                    ))
                }
                None => {
                    return Err(format!(
                        "{child:?} sits on {parent:?}, which is not defined"
                    ))
                }
            }
            if let Some(first) = occupied.insert(parent, child) {
                return Err(format!(
                    "port {parent:?} carries both {first:?} and {child:?}: one device per port"
                ));
            }
        }
        // Switches must hang off the root, not off themselves.
        for switch in &self.switches {
            let mut seen = vec![switch.id.as_str()];
            let mut parent = switch.parent.as_str();
            while let Some(owner) = self
                .switches
                .iter()
                .find(|s| s.downstream.iter().any(|p| p.id == parent))
            {
                if seen.contains(&owner.id.as_str()) {
                    return Err(format!("switch {:?} is part of a loop", switch.id));
                }
                seen.push(&owner.id);
                parent = &owner.parent;
            }
        }
        for endpoint in &self.endpoints {
            match (endpoint.kind, &endpoint.region) {
                (EndpointKind::IvshmemDoorbell, Some(region))
                    if !regions.contains_key(region.as_str()) =>
                {
                    return Err(format!(
                        "endpoint {:?}: region {region:?} is not defined",
                        endpoint.id
                    ))
                }
                (EndpointKind::IvshmemDoorbell, None) => {
                    return Err(format!(
                        "endpoint {:?}: an ivshmem-doorbell needs `region = \"...\"`",
                        endpoint.id
                    ))
                }
                (kind, Some(_)) if kind != EndpointKind::IvshmemDoorbell => {
                    return Err(format!(
                        "endpoint {:?}: only ivshmem-doorbell takes a region",
                        endpoint.id
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub fn region(&self, id: &str) -> Option<&Region> {
        self.regions.iter().find(|r| r.id == id)
    }
}

/// Why topology text was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    Syntax(String),
    Invalid(String),
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fabric with every kind of element; the fabric layout tests use it too.
    pub(crate) const FABRIC: &str = r#"
        [[root_port]]
        id = "rp1"
        speed = "2.5"
        width = 1
        [[root_port]]
        id = "rp2"
        speed = "16"
        width = 16
        [[switch]]
        id = "sw1"
        parent = "rp2"
        downstream = [{ id = "dp1" }, { id = "dp2" }]
        [[endpoint]]
        id = "edu0"
        kind = "edu"
        parent = "rp1"
        [[endpoint]]
        id = "ivs0"
        kind = "ivshmem-doorbell"
        parent = "dp1"
        region = "shm"
        [[region]]
        id = "shm"
        size = "1M"
        vectors = 2
    "#;

    #[test]
    fn parses_a_fabric_with_a_switch() {
        let t = Topology::parse(FABRIC).unwrap();
        assert_eq!(t.root_ports[0].speed, Some(LinkSpeed::Gen1));
        assert_eq!(t.root_ports[1].width, Some(16));
        assert_eq!(t.switches[0].downstream[1].id, "dp2");
        assert_eq!(t.endpoints[1].kind, EndpointKind::IvshmemDoorbell);
        assert_eq!(t.region("shm").unwrap().vectors, 2);
    }

    fn invalid(text: &str) -> String {
        match Topology::parse(text) {
            Err(ParseError::Invalid(m)) | Err(ParseError::Syntax(m)) => m,
            Ok(_) => panic!("accepted: {text}"),
        }
    }

    #[test]
    fn refuses_bad_fabrics_with_the_reason() {
        assert!(invalid("").contains("at least one root port"));
        let control = format!("[vm]\nkernel_args = \"pci=nomsi\\ninit=/bin/sh\"\n{FABRIC}");
        assert!(invalid(&control).contains("printable ASCII"));
        let args = Topology::parse(&format!("[vm]\nkernel_args = \"pci=nomsi\"\n{FABRIC}"));
        assert_eq!(args.unwrap().vm.kernel_args.as_deref(), Some("pci=nomsi"));
        let unknown_kind = FABRIC.replace("kind = \"edu\"", "kind = \"nvme\"");
        assert!(
            invalid(&unknown_kind).contains("unknown variant `nvme`"),
            "{}",
            invalid(&unknown_kind)
        );
        assert!(invalid(&FABRIC.replace("speed = \"2.5\"", "speed = \"3\""))
            .contains("unknown variant `3`"));
        assert!(invalid(&FABRIC.replace("width = 1\n", "width = 3\n")).contains("width 3"));
        assert!(
            invalid(&FABRIC.replace("parent = \"rp1\"", "parent = \"rp9\""))
                .contains("\"rp9\", which is not defined")
        );
        assert!(
            invalid(&FABRIC.replace("parent = \"rp1\"", "parent = \"rp2\""))
                .contains("carries both")
        );
        assert!(
            invalid(&FABRIC.replace("parent = \"rp1\"", "parent = \"sw1\"")).contains("not a port")
        );
        assert!(invalid(&FABRIC.replace("size = \"1M\"", "size = \"3M\"")).contains("power of two"));
        assert!(
            invalid(&FABRIC.replace("region = \"shm\"", "region = \"other\""))
                .contains("\"other\" is not defined")
        );
        assert!(invalid(&FABRIC.replace("id = \"edu0\"", "id = \"rp1\"")).contains("used twice"));
        assert!(invalid(&format!("{FABRIC}\nspede = 1")).contains("unknown field `spede`"));
        assert!(
            invalid(&FABRIC.replace("{ id = \"dp2\" }", "{ id = \"dp2\", width = 4 }"))
                .contains("no link speed or width")
        );
        assert!(matches!(
            Topology::parse("[[root_port]\nid="),
            Err(ParseError::Syntax(_))
        ));
        assert!(invalid(&FABRIC.replace("size = \"1M\"", "size = \"1K\"")).contains("below 4096"));
    }
}
