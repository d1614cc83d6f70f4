//! The PCI tree as a guest sees it, in a form independent of bus numbers:
//! a function is named by the device.function numbers on the path from its
//! root port ("11.0/00.0/01.0/00.0"), so the tree a topology file asks for can
//! be compared with what the guest kernel enumerated.

use std::{
    fmt,
    path::{Path, PathBuf},
    str::FromStr,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    RootPort,
    SwitchUpstream,
    SwitchDownstream,
    #[default]
    Endpoint,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::RootPort => "root-port",
            Role::SwitchUpstream => "switch-upstream",
            Role::SwitchDownstream => "switch-downstream",
            Role::Endpoint => "endpoint",
        }
    }

    /// From the PCIe capability's device/port type (PCI_EXP_FLAGS_TYPE).
    fn from_pcie_port_type(port_type: u8) -> Role {
        match port_type {
            0x4 => Role::RootPort,
            0x5 => Role::SwitchUpstream,
            0x6 => Role::SwitchDownstream,
            _ => Role::Endpoint,
        }
    }
}

/// One function of the tree: path, vendor:device, role and, for ports, the
/// link's current and maximum speed (GT/s as sysfs prints the number) and width.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeLine {
    pub path: String,
    pub pci_id: String,
    pub role: Role,
    pub speed_gts: Option<String>,
    pub width: Option<u8>,
    pub max_speed_gts: Option<String>,
    pub max_width: Option<u8>,
}

impl fmt::Display for TreeLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.path, self.pci_id, self.role.name())?;
        if let Some(speed) = &self.speed_gts {
            write!(f, " speed={speed}")?;
        }
        if let Some(width) = self.width {
            write!(f, " width={width}")?;
        }
        if let Some(speed) = &self.max_speed_gts {
            write!(f, " max-speed={speed}")?;
        }
        if let Some(width) = self.max_width {
            write!(f, " max-width={width}")?;
        }
        Ok(())
    }
}

impl FromStr for TreeLine {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let mut words = line.split_whitespace();
        let (Some(path), Some(pci_id), Some(role)) = (words.next(), words.next(), words.next())
        else {
            return Err(format!(
                "tree line {line:?}: expected `PATH VENDOR:DEVICE ROLE [speed=S] [width=W]`"
            ));
        };
        let role = [
            Role::RootPort,
            Role::SwitchUpstream,
            Role::SwitchDownstream,
            Role::Endpoint,
        ]
        .into_iter()
        .find(|r| r.name() == role)
        .ok_or_else(|| format!("tree line {line:?}: unknown role {role:?}"))?;
        let mut tree_line = TreeLine {
            path: path.into(),
            pci_id: pci_id.into(),
            role,
            ..TreeLine::default()
        };
        let width = |v: &str| {
            v.parse()
                .map_err(|_| format!("tree line {line:?}: bad width {v:?}"))
        };
        for word in words {
            match word.split_once('=') {
                Some(("speed", v)) => tree_line.speed_gts = Some(v.into()),
                Some(("width", v)) => tree_line.width = Some(width(v)?),
                Some(("max-speed", v)) => tree_line.max_speed_gts = Some(v.into()),
                Some(("max-width", v)) => tree_line.max_width = Some(width(v)?),
                _ => return Err(format!("tree line {line:?}: unexpected {word:?}")),
            }
        }
        Ok(tree_line)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ScanError {
    pub path: PathBuf,
    pub message: String,
}

/// Reads the tree below every root port on bus 0 from a sysfs root
/// (`/sys` in the guest).
pub fn scan(sysfs: &Path) -> Result<Vec<TreeLine>, ScanError> {
    let host_bridge = sysfs.join("devices/pci0000:00");
    let mut lines = Vec::new();
    for entry in sorted_functions(&host_bridge)? {
        let line = read_function(&entry, &slot_of(&entry))?;
        if line.role == Role::RootPort {
            lines.push(line.clone());
            walk(&entry, &line.path, &mut lines)?;
        }
    }
    Ok(lines)
}

fn walk(dir: &Path, path: &str, lines: &mut Vec<TreeLine>) -> Result<(), ScanError> {
    for entry in sorted_functions(dir)? {
        let child_path = format!("{path}/{}", slot_of(&entry));
        lines.push(read_function(&entry, &child_path)?);
        walk(&entry, &child_path, lines)?;
    }
    Ok(())
}

/// Subdirectories named like a PCI function ("0000:02:01.0"), in order.
fn sorted_functions(dir: &Path) -> Result<Vec<PathBuf>, ScanError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ScanError {
        path: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut functions: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_function_name)
        })
        .collect();
    functions.sort();
    Ok(functions)
}

fn is_function_name(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

/// "0000:02:01.0" -> "01.0".
fn slot_of(function_dir: &Path) -> String {
    let name = function_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name[8..].to_string()
}

fn read_function(dir: &Path, path: &str) -> Result<TreeLine, ScanError> {
    let read = |attr: &str| -> Result<String, ScanError> {
        let file = dir.join(attr);
        std::fs::read_to_string(&file)
            .map(|s| s.trim().to_string())
            .map_err(|e| ScanError {
                path: file,
                message: e.to_string(),
            })
    };
    let hex = |attr: &str| -> Result<u32, ScanError> {
        let text = read(attr)?;
        u32::from_str_radix(text.trim_start_matches("0x"), 16).map_err(|_| ScanError {
            path: dir.join(attr),
            message: format!("not a hex number: {text:?}"),
        })
    };
    let vendor = hex("vendor")?;
    let device = hex("device")?;
    let config = std::fs::read(dir.join("config")).map_err(|e| ScanError {
        path: dir.join("config"),
        message: e.to_string(),
    })?;
    let role = pcie_port_type(&config).map_or(Role::Endpoint, Role::from_pcie_port_type);
    let is_port = matches!(role, Role::RootPort | Role::SwitchDownstream);
    let link_attr = |attr: &str| if is_port { read(attr).ok() } else { None };
    // "16.0 GT/s PCIe" -> "16.0"
    let gts =
        |text: Option<String>| text.and_then(|s| s.split_whitespace().next().map(String::from));
    let lanes = |text: Option<String>| text.and_then(|s| s.parse().ok());
    Ok(TreeLine {
        path: path.to_string(),
        pci_id: format!("{vendor:04x}:{device:04x}"),
        role,
        speed_gts: gts(link_attr("current_link_speed")),
        width: lanes(link_attr("current_link_width")),
        max_speed_gts: gts(link_attr("max_link_speed")),
        max_width: lanes(link_attr("max_link_width")),
    })
}

/// The device/port type of the PCI Express capability, if the function has one.
fn pcie_port_type(config: &[u8]) -> Option<u8> {
    const CAP_LIST_BIT: u8 = 0x10;
    const CAP_ID_EXP: u8 = 0x10;
    if config.len() < 0x40 || config[0x06] & CAP_LIST_BIT == 0 {
        return None;
    }
    let mut offset = config[0x34] as usize & !3;
    for _ in 0..48 {
        if offset < 0x40 || offset + 4 > config.len() {
            return None;
        }
        if config[offset] == CAP_ID_EXP {
            return Some((config[offset + 2] >> 4) & 0xf);
        }
        offset = config[offset + 1] as usize & !3;
    }
    None
}

/// Differences between the expected tree and the scanned one, as readable
/// lines; empty when they agree. Link speeds and widths are compared only
/// where the expected line names them.
pub fn compare(expected: &[TreeLine], actual: &[TreeLine]) -> Vec<String> {
    let mut problems = Vec::new();
    for want in expected {
        match actual.iter().find(|a| a.path == want.path) {
            None => problems.push(format!("missing: {want}")),
            Some(got) => {
                let link_ok = [
                    (&want.speed_gts, &got.speed_gts),
                    (&want.max_speed_gts, &got.max_speed_gts),
                ]
                .iter()
                .all(|(w, g)| w.is_none() || w == g)
                    && [(want.width, got.width), (want.max_width, got.max_width)]
                        .iter()
                        .all(|(w, g)| w.is_none() || w == g);
                if got.pci_id != want.pci_id || got.role != want.role || !link_ok {
                    problems.push(format!("expected {want}, found {got}"));
                }
            }
        }
    }
    for got in actual {
        if !expected.iter().any(|w| w.path == got.path) {
            problems.push(format!("unexpected: {got}"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config space with a PCIe capability of the given port type at 0x40.
    fn config(port_type: u8) -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[0x06] = 0x10;
        c[0x34] = 0x40;
        c[0x40] = 0x10;
        c[0x42] = port_type << 4 | 2;
        c
    }

    fn function(
        dir: &Path,
        vendor: u16,
        device: u16,
        port_type: Option<u8>,
        link: Option<(&str, &str)>,
    ) {
        function_with_max(dir, vendor, device, port_type, link, link)
    }

    fn function_with_max(
        dir: &Path,
        vendor: u16,
        device: u16,
        port_type: Option<u8>,
        link: Option<(&str, &str)>,
        max: Option<(&str, &str)>,
    ) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("vendor"), format!("{vendor:#06x}\n")).unwrap();
        std::fs::write(dir.join("device"), format!("{device:#06x}\n")).unwrap();
        std::fs::write(dir.join("config"), port_type.map_or(vec![0u8; 64], config)).unwrap();
        if let Some((speed, width)) = link {
            std::fs::write(dir.join("current_link_speed"), format!("{speed}\n")).unwrap();
            std::fs::write(dir.join("current_link_width"), format!("{width}\n")).unwrap();
        }
        if let Some((speed, width)) = max {
            std::fs::write(dir.join("max_link_speed"), format!("{speed}\n")).unwrap();
            std::fs::write(dir.join("max_link_width"), format!("{width}\n")).unwrap();
        }
    }

    #[test]
    fn scans_a_sysfs_tree_and_compares_it() {
        let root = std::env::temp_dir().join(format!("pcieipc-tree-{}", std::process::id()));
        let bus0 = root.join("devices/pci0000:00");
        function(&bus0.join("0000:00:00.0"), 0x8086, 0x29c0, None, None);
        let rp = bus0.join("0000:00:10.0");
        function(&rp, 0x1b36, 0x000c, Some(4), Some(("2.5 GT/s PCIe", "1")));
        function(&rp.join("0000:01:00.0"), 0x1234, 0x11e8, None, None);
        let rp2 = bus0.join("0000:00:11.0");
        function_with_max(
            &rp2,
            0x1b36,
            0x000c,
            Some(4),
            Some(("2.5 GT/s PCIe", "1")),
            Some(("16.0 GT/s PCIe", "16")),
        );
        let up = rp2.join("0000:02:00.0");
        function(&up, 0x104c, 0x8232, Some(5), Some(("2.5 GT/s PCIe", "1")));
        function(
            &up.join("0000:03:01.0"),
            0x104c,
            0x8233,
            Some(6),
            Some(("8.0 GT/s PCIe", "4")),
        );

        let lines = scan(&root).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        let text: Vec<String> = lines.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "10.0 1b36:000c root-port speed=2.5 width=1 max-speed=2.5 max-width=1",
                "10.0/00.0 1234:11e8 endpoint",
                "11.0 1b36:000c root-port speed=2.5 width=1 max-speed=16.0 max-width=16",
                "11.0/00.0 104c:8232 switch-upstream",
                "11.0/00.0/01.0 104c:8233 switch-downstream speed=8.0 width=4 max-speed=8.0 max-width=4",
            ]
        );

        let expected: Vec<TreeLine> = [
            "10.0 1b36:000c root-port speed=2.5 width=1",
            "10.0/00.0 1234:11e8 endpoint",
            "11.0 1b36:000c root-port max-speed=16.0 max-width=16",
            "11.0/00.0 104c:8232 switch-upstream",
            "11.0/00.0/01.0 104c:8233 switch-downstream speed=8.0 width=4",
        ]
        .iter()
        .map(|l| l.parse().unwrap())
        .collect();
        assert_eq!(compare(&expected, &lines), Vec::<String>::new());

        let mut wrong = expected.clone();
        wrong[0].width = Some(4);
        wrong.pop();
        wrong.push(
            "11.0/00.0/02.0 104c:8233 switch-downstream"
                .parse()
                .unwrap(),
        );
        assert_eq!(
            compare(&wrong, &lines),
            [
                "expected 10.0 1b36:000c root-port speed=2.5 width=4, \
                 found 10.0 1b36:000c root-port speed=2.5 width=1 max-speed=2.5 max-width=1",
                "missing: 11.0/00.0/02.0 104c:8233 switch-downstream",
                "unexpected: 11.0/00.0/01.0 104c:8233 switch-downstream speed=8.0 width=4 max-speed=8.0 max-width=4",
            ]
        );
    }

    #[test]
    fn refuses_malformed_lines() {
        assert!("10.0 1b36:000c".parse::<TreeLine>().is_err());
        assert!("10.0 1b36:000c bridge"
            .parse::<TreeLine>()
            .unwrap_err()
            .contains("unknown role"));
        assert!("10.0 1b36:000c root-port width=x"
            .parse::<TreeLine>()
            .unwrap_err()
            .contains("bad width"));
    }
}
