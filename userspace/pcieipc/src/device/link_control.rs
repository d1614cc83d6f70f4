//! Root's per-device opt-in to link control of devices another driver owns:
//! the module parameter `link_control` (a comma-separated list of PCI
//! addresses, `kmod/link_control.rs`), read and written through sysfs; and
//! the kernel's own way to set a port's speed where its bandwidth
//! controller owns it, the `PCIe_Port_Link_Speed_<port>` cooling device.
//!
//! The list is checked here with the module's rules before it is written,
//! so that a bad entry is named with the command that gave it; the module
//! checks again (EINVAL, the reason in the kernel log).

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use crate::probe::bdf::Bdf;

/// The parameter, below the sysfs root.
pub const LINK_CONTROL_PARAMETER: &str = "sys/module/pcieipc/parameters/link_control";

/// As many devices as the module keeps (`MAX_DEVICES` in kmod/link_control.rs).
const MAX_DEVICES: usize = 64;

/// Where the kernel lists its thermal cooling devices, below the sysfs root.
const COOLING_DEVICES: &str = "sys/class/thermal";

/// The line that allows the link above `bdf` to be retrained.
pub fn allow_line(bdf: Bdf) -> String {
    format!(
        "pcieipc link allow {bdf} (as root: adds it to /{LINK_CONTROL_PARAMETER}; at load: \
         insmod pcieipc.ko link_control={bdf}, or `options pcieipc link_control={bdf}` in \
         /etc/modprobe.d/)"
    )
}

/// Why a list is not one the module takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowListError {
    #[error("'{entry}' is not a PCI address (DDDD:BB:DD.F or BB:DD.F, hexadecimal)")]
    Malformed { entry: String },
    #[error("'{entry}': PCI domains above 0xffff are not supported by the module")]
    DomainTooLarge { entry: String },
    #[error("'{entry}' is listed twice")]
    Duplicate { entry: String },
    #[error("{count} devices: the module keeps at most {MAX_DEVICES}")]
    TooMany { count: usize },
}

/// The list `text` gives, with the module's rules: comma-separated, blanks
/// around entries and a trailing newline ignored, empty for none.
pub fn parse_allow_list(text: &str) -> Result<Vec<Bdf>, AllowListError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut list = Vec::new();
    for entry in text.split(',').map(str::trim) {
        let bdf = parse_entry(entry)?;
        if list.contains(&bdf) {
            return Err(AllowListError::Duplicate {
                entry: entry.to_string(),
            });
        }
        list.push(bdf);
    }
    check_count(list.len())?;
    Ok(list)
}

fn check_count(count: usize) -> Result<(), AllowListError> {
    if count > MAX_DEVICES {
        return Err(AllowListError::TooMany { count });
    }
    Ok(())
}

fn parse_entry(entry: &str) -> Result<Bdf, AllowListError> {
    let bdf = entry
        .parse::<Bdf>()
        .map_err(|_| AllowListError::Malformed {
            entry: entry.to_string(),
        })?;
    if bdf.to_abi().is_err() {
        return Err(AllowListError::DomainTooLarge {
            entry: entry.to_string(),
        });
    }
    Ok(bdf)
}

/// Why the list could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LinkControlError {
    #[error("{path}: not there: is pcieipc.ko loaded? (`insmod pcieipc.ko`)")]
    NotLoaded { path: PathBuf },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    List {
        path: PathBuf,
        #[source]
        source: AllowListError,
    },
    #[error("{path}: the module refused the list (`dmesg` says why)")]
    Refused {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{bdf}: no cooling device {name} under {dir} to set the port's speed through")]
    NoCoolingDevice {
        bdf: Bdf,
        name: String,
        dir: PathBuf,
    },
    #[error("{path}: '{text}' is not a cooling state")]
    CoolingState { path: PathBuf, text: String },
}

/// The module's link control parameter and the kernel's speed cooling
/// devices, below a sysfs root (`/` on a live machine, a fixture in tests).
pub struct LinkControl {
    root: PathBuf,
}

impl LinkControl {
    pub fn new(root: &Path) -> Self {
        LinkControl {
            root: root.to_path_buf(),
        }
    }

    fn parameter(&self) -> PathBuf {
        self.root.join(LINK_CONTROL_PARAMETER)
    }

    /// The devices root allowed now.
    pub fn allowed(&self) -> Result<Vec<Bdf>, LinkControlError> {
        let path = self.parameter();
        let text = std::fs::read_to_string(&path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                LinkControlError::NotLoaded { path: path.clone() }
            } else {
                LinkControlError::Io {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        parse_allow_list(&text).map_err(|source| LinkControlError::List { path, source })
    }

    /// Replaces the list with `list` (checked first, then written in one
    /// write: the module takes all of it or none).
    pub fn set_allowed(&self, list: &[Bdf]) -> Result<(), LinkControlError> {
        let path = self.parameter();
        let text = list
            .iter()
            .map(Bdf::to_string)
            .collect::<Vec<_>>()
            .join(",");
        // The same rules as reading it back, so nothing is written that the
        // module would refuse for a reason this could name.
        parse_allow_list(&text).map_err(|source| LinkControlError::List {
            path: path.clone(),
            source,
        })?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::NotFound => LinkControlError::NotLoaded { path: path.clone() },
                _ => LinkControlError::Io {
                    path: path.clone(),
                    source,
                },
            })?;
        file.write_all(format!("{text}\n").as_bytes())
            .map_err(|source| match source.raw_os_error() {
                Some(libc::EINVAL) => LinkControlError::Refused {
                    path: path.clone(),
                    source,
                },
                _ => LinkControlError::Io {
                    path: path.clone(),
                    source,
                },
            })
    }

    /// The cooling device through which the kernel's bandwidth controller
    /// sets `port`'s link speed, if it registered one.
    fn cooling_device(&self, port: Bdf) -> Result<PathBuf, LinkControlError> {
        let dir = self.root.join(COOLING_DEVICES);
        let name = format!("PCIe_Port_Link_Speed_{port}");
        let entries = std::fs::read_dir(&dir).map_err(|source| LinkControlError::Io {
            path: dir.clone(),
            source,
        })?;
        entries
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("cooling_device"))
            })
            .find(|path| std::fs::read_to_string(path.join("type")).is_ok_and(|t| t.trim() == name))
            .ok_or(LinkControlError::NoCoolingDevice {
                bdf: port,
                name,
                dir,
            })
    }

    /// Sets `port`'s link speed through the kernel's bandwidth controller
    /// (its cooling device: state 0 is the highest speed, each state one
    /// generation lower), which serialises it with the kernel's own changes
    /// and retrains the link. The speed stays set until changed again, as a
    /// thermal throttle's does. Returns the cooling state written.
    pub fn set_port_speed(
        &self,
        port: Bdf,
        speed: super::retrain::TargetSpeed,
    ) -> Result<u64, LinkControlError> {
        let device = self.cooling_device(port)?;
        let read_state = |name: &str| {
            let path = device.join(name);
            let text = std::fs::read_to_string(&path).map_err(|source| LinkControlError::Io {
                path: path.clone(),
                source,
            })?;
            text.trim()
                .parse::<u64>()
                .map_err(|_| LinkControlError::CoolingState {
                    path,
                    text: text.trim().to_string(),
                })
        };
        let max_state = read_state("max_state")?;
        let state = cooling_state(max_state, speed);
        let path = device.join("cur_state");
        std::fs::write(&path, format!("{state}\n"))
            .map_err(|source| LinkControlError::Io { path, source })?;
        Ok(state)
    }
}

/// The cooling state for `speed` on a port whose highest speed is state 0
/// and whose lowest (2.5 GT/s, generation 1) is `max_state`.
fn cooling_state(max_state: u64, speed: super::retrain::TargetSpeed) -> u64 {
    match speed {
        super::retrain::TargetSpeed::UpToCapability => 0,
        super::retrain::TargetSpeed::Generation(generation) => {
            max_state.saturating_sub(u64::from(generation).saturating_sub(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::TargetSpeed;

    fn bdf(text: &str) -> Bdf {
        text.parse().unwrap()
    }

    #[test]
    fn lists_parse_with_the_modules_rules() {
        assert_eq!(parse_allow_list("\n"), Ok(vec![]));
        assert_eq!(
            parse_allow_list("0000:3b:00.0, 5e:00.0\n"),
            Ok(vec![bdf("0000:3b:00.0"), bdf("0000:5e:00.0")])
        );
        assert_eq!(
            parse_allow_list("0000:3b:00.0,0000:3b:00.0"),
            Err(AllowListError::Duplicate {
                entry: "0000:3b:00.0".into()
            })
        );
        assert_eq!(
            parse_allow_list("0000:3b:00.0,3b:00.0"),
            Err(AllowListError::Duplicate {
                entry: "3b:00.0".into()
            })
        );
        assert_eq!(
            parse_allow_list("10000:01:00.0"),
            Err(AllowListError::DomainTooLarge {
                entry: "10000:01:00.0".into()
            })
        );
        for bad in [
            "0000:3b:20.0",
            "0000:3b:00.8",
            "0000:100:00.0",
            "gpu0",
            "0000:3b:00.0,",
        ] {
            assert!(
                matches!(parse_allow_list(bad), Err(AllowListError::Malformed { .. })),
                "{bad}"
            );
        }
        let many = (0..65)
            .map(|bus| format!("0000:{bus:02x}:00.0"))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            parse_allow_list(&many),
            Err(AllowListError::TooMany { count: 65 })
        );
        // A 4 KiB list of one address repeated is named by its first repeat.
        let long = vec!["0000:3b:00.0"; 320].join(",");
        assert!(long.len() > 4000);
        assert!(matches!(
            parse_allow_list(&long),
            Err(AllowListError::Duplicate { .. })
        ));
    }

    #[test]
    fn cooling_states_count_down_from_the_highest_speed() {
        // A Gen5 port: states 0 (32 GT/s) .. 4 (2.5 GT/s).
        assert_eq!(cooling_state(4, TargetSpeed::UpToCapability), 0);
        assert_eq!(cooling_state(4, TargetSpeed::Generation(5)), 0);
        assert_eq!(cooling_state(4, TargetSpeed::Generation(3)), 2);
        assert_eq!(cooling_state(4, TargetSpeed::Generation(1)), 4);
        // Above the port's highest speed: its highest.
        assert_eq!(cooling_state(2, TargetSpeed::Generation(6)), 0);
    }

    /// A sysfs root of the test's own, removed when dropped.
    struct Fixture(PathBuf);

    impl Fixture {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn fixture(name: &str) -> (Fixture, LinkControl) {
        let dir = Fixture(std::env::temp_dir().join(format!(
            "pcieipc-link-control-{name}-{}",
            std::process::id()
        )));
        let _ = std::fs::remove_dir_all(dir.path());
        std::fs::create_dir_all(dir.path()).unwrap();
        let control = LinkControl::new(dir.path());
        (dir, control)
    }

    #[test]
    fn the_parameter_is_read_and_replaced_whole() {
        let (dir, control) = fixture("parameter");
        assert!(matches!(
            control.allowed(),
            Err(LinkControlError::NotLoaded { .. })
        ));
        let parameter = dir.path().join(LINK_CONTROL_PARAMETER);
        std::fs::create_dir_all(parameter.parent().unwrap()).unwrap();
        std::fs::write(&parameter, "\n").unwrap();
        assert_eq!(control.allowed().unwrap(), vec![]);
        control
            .set_allowed(&[bdf("0000:3b:00.0"), bdf("0000:5e:00.0")])
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(&parameter).unwrap(),
            "0000:3b:00.0,0000:5e:00.0\n"
        );
        assert_eq!(
            control.allowed().unwrap(),
            vec![bdf("0000:3b:00.0"), bdf("0000:5e:00.0")]
        );
        let refused = control
            .set_allowed(&[bdf("0000:3b:00.0"), bdf("0000:3b:00.0")])
            .unwrap_err();
        assert!(
            matches!(
                refused,
                LinkControlError::List {
                    source: AllowListError::Duplicate { .. },
                    ..
                }
            ),
            "{refused:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&parameter).unwrap(),
            "0000:3b:00.0,0000:5e:00.0\n"
        );
    }

    #[test]
    fn a_port_speed_goes_through_its_cooling_device() {
        let (dir, control) = fixture("cooling");
        let thermal = dir.path().join(COOLING_DEVICES);
        for (n, kind, max) in [
            (0, "Processor", "3"),
            (1, "PCIe_Port_Link_Speed_0000:00:01.0", "4"),
            (2, "PCIe_Port_Link_Speed_0000:00:1c.0", "2"),
        ] {
            let device = thermal.join(format!("cooling_device{n}"));
            std::fs::create_dir_all(&device).unwrap();
            std::fs::write(device.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(device.join("max_state"), format!("{max}\n")).unwrap();
            std::fs::write(device.join("cur_state"), "0\n").unwrap();
        }
        assert_eq!(
            control
                .set_port_speed(bdf("0000:00:01.0"), TargetSpeed::Generation(3))
                .unwrap(),
            2
        );
        assert_eq!(
            std::fs::read_to_string(thermal.join("cooling_device1/cur_state")).unwrap(),
            "2\n"
        );
        assert_eq!(
            std::fs::read_to_string(thermal.join("cooling_device2/cur_state")).unwrap(),
            "0\n"
        );
        control
            .set_port_speed(bdf("0000:00:01.0"), TargetSpeed::UpToCapability)
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(thermal.join("cooling_device1/cur_state")).unwrap(),
            "0\n"
        );
        let missing = control
            .set_port_speed(bdf("0000:00:02.0"), TargetSpeed::UpToCapability)
            .unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("no cooling device PCIe_Port_Link_Speed_0000:00:02.0"),
            "{missing}"
        );
    }
}
