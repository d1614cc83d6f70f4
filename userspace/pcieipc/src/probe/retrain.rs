//! Whether pcieipc may retrain a link, as the module decides it
//! (`kmod/fault.rs`): the port serves a device the module binds, or root
//! listed the device below in the module parameter `link_control` and no
//! mass-storage function hangs from the port. For the probe, which tells
//! the operator of each degraded link whether it can be retrained and, if
//! not, the line that would allow it.

use serde::Serialize;

use super::bdf::Bdf;
use super::link::Link;
use super::topology::Topology;
use crate::device::allow_line;

/// The driver name the module binds devices under.
const MODULE_DRIVER: &str = "pcieipc";
/// PCI base class of mass-storage controllers.
const STORAGE_BASE_CLASS: u32 = 0x01;

/// Whether a link can be retrained, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Retrainability {
    pub retrainable: bool,
    pub reason: String,
    /// The line that would allow it, where root can.
    pub allow: Option<String>,
}

/// What the module would answer for a retrain of `link` (the link above its
/// downstream device), with `allowed` the module parameter's list (`None`:
/// the module is not loaded).
pub fn retrainability(topology: &Topology, link: &Link, allowed: Option<&[Bdf]>) -> Retrainability {
    let device = topology.devices[link.downstream].bdf;
    let refused = |reason: String, allow: Option<String>| Retrainability {
        retrainable: false,
        reason,
        allow,
    };
    let Some(port) = link.upstream else {
        return refused(
            "no port above it is visible (a function on a root bus): nothing to retrain from"
                .to_string(),
            None,
        );
    };
    let Some(allowed) = allowed else {
        return refused(
            "pcieipc.ko is not loaded".to_string(),
            Some(format!("insmod pcieipc.ko link_control={device}")),
        );
    };
    let bound = topology.devices[port]
        .children
        .iter()
        .any(|&child| topology.devices[child].driver.as_deref() == Some(MODULE_DRIVER));
    if bound {
        return Retrainability {
            retrainable: true,
            reason: "its port serves a device pcieipc binds".to_string(),
            allow: None,
        };
    }
    if !allowed.contains(&device) {
        return refused(
            format!("pcieipc does not bind {device} and root has not listed it in link_control"),
            Some(allow_line(device)),
        );
    }
    if let Some(storage) = storage_below(topology, port) {
        return refused(
            format!(
                "mass-storage function {storage} hangs from port {}: never retrained",
                topology.devices[port].bdf
            ),
            None,
        );
    }
    Retrainability {
        retrainable: true,
        reason: format!("root listed {device} in link_control"),
        allow: None,
    }
}

/// The first mass-storage function below `port`, if any.
fn storage_below(topology: &Topology, port: usize) -> Option<Bdf> {
    let mut pending = topology.devices[port].children.clone();
    while let Some(index) = pending.pop() {
        let device = &topology.devices[index];
        if device
            .class_code
            .is_some_and(|class| class >> 16 == STORAGE_BASE_CLASS)
        {
            return Some(device.bdf);
        }
        pending.extend(device.children.iter().copied());
    }
    None
}
