//! Lays a topology out as QEMU devices: bus, slot address and chassis/slot
//! numbers for every port, the `-device` arguments, and the tree the guest
//! must see (in the form `tree::TreeLine` compares).

use crate::{
    topology::{EndpointKind, LinkSpeed, Port, Topology},
    tree::{Role, TreeLine},
};

/// Root ports sit on pcie.0 from this slot on, so their addresses are fixed
/// and a guest test can name them (00:10.0, 00:11.0, ...).
pub const FIRST_ROOT_PORT_SLOT: u8 = 0x10;

/// QEMU's PCI ids of the ports it emulates.
const ROOT_PORT_ID: &str = "1b36:000c";
const SWITCH_UPSTREAM_ID: &str = "104c:8232";
const SWITCH_DOWNSTREAM_ID: &str = "104c:8233";

/// The `-device` argument values of the fabric, in an order QEMU accepts
/// (a bus before what sits on it), and the tree the guest should see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fabric {
    pub devices: Vec<String>,
    pub expected_tree: Vec<TreeLine>,
    /// (endpoint id, region id) for every ivshmem-doorbell: each needs a
    /// `-chardev socket` to its region's server named `chardev_id(endpoint)`.
    pub ivshmem: Vec<(String, String)>,
}

pub fn chardev_id(endpoint: &str) -> String {
    format!("{endpoint}-ivshmem")
}

pub fn lay_out(topology: &Topology) -> Fabric {
    let mut fabric = Fabric {
        devices: Vec::new(),
        expected_tree: Vec::new(),
        ivshmem: Vec::new(),
    };
    let mut chassis = 0u32;
    for (index, port) in topology.root_ports.iter().enumerate() {
        chassis += 1;
        let slot = FIRST_ROOT_PORT_SLOT + index as u8;
        let path = format!("{slot:02x}.0");
        fabric.devices.push(format!(
            "pcie-root-port,id={},bus=pcie.0,addr={slot:#x}.0,chassis={chassis},slot={chassis}{}",
            port.id,
            link_props(port)
        ));
        let carries_switch = topology.switches.iter().any(|s| s.parent == port.id);
        fabric
            .expected_tree
            .push(root_port_line(&path, port, carries_switch));
        below_port(topology, &port.id, &path, &mut chassis, &mut fabric);
    }
    fabric
}

/// Adds whatever sits on port `port_id` (guest path `path`).
fn below_port(
    topology: &Topology,
    port_id: &str,
    path: &str,
    chassis: &mut u32,
    fabric: &mut Fabric,
) {
    let child_path = format!("{path}/00.0");
    if let Some(switch) = topology.switches.iter().find(|s| s.parent == port_id) {
        fabric.devices.push(format!(
            "x3130-upstream,id={},bus={port_id},addr=0x0.0",
            switch.id
        ));
        fabric.expected_tree.push(TreeLine {
            path: child_path.clone(),
            pci_id: SWITCH_UPSTREAM_ID.into(),
            role: Role::SwitchUpstream,
            ..TreeLine::default()
        });
        for (index, port) in switch.downstream.iter().enumerate() {
            *chassis += 1;
            fabric.devices.push(format!(
                "xio3130-downstream,id={},bus={},addr={index:#x}.0,chassis={chassis},slot={chassis}",
                port.id, switch.id
            ));
            let port_path = format!("{child_path}/{index:02x}.0");
            fabric.expected_tree.push(TreeLine {
                path: port_path.clone(),
                pci_id: SWITCH_DOWNSTREAM_ID.into(),
                role: Role::SwitchDownstream,
                ..TreeLine::default()
            });
            below_port(topology, &port.id, &port_path, chassis, fabric);
        }
    }
    if let Some(endpoint) = topology.endpoints.iter().find(|e| e.parent == port_id) {
        let extra = match endpoint.kind {
            EndpointKind::IvshmemDoorbell => {
                let region_id = endpoint.region.as_deref().unwrap_or_default();
                let vectors = topology.region(region_id).map_or(1, |r| r.vectors);
                fabric
                    .ivshmem
                    .push((endpoint.id.clone(), region_id.to_string()));
                format!(",chardev={},vectors={vectors}", chardev_id(&endpoint.id))
            }
            // edu at QEMU's defaults (its DMA reaches 28 bits).
            EndpointKind::Edu | EndpointKind::PciTestdev | EndpointKind::Ahci => String::new(),
            // No network backend: the NIC's registers and interrupt are all
            // the tests use.
            EndpointKind::E1000 => ",mac=52:54:00:12:34:56".to_string(),
        };
        fabric.devices.push(format!(
            "{},id={},bus={port_id},addr=0x0.0{extra}",
            endpoint.kind.qemu_device(),
            endpoint.id
        ));
        fabric.expected_tree.push(TreeLine {
            path: child_path,
            pci_id: endpoint.kind.pci_id().into(),
            role: Role::Endpoint,
            ..TreeLine::default()
        });
    }
}

fn link_props(port: &Port) -> String {
    let mut props = String::new();
    if let Some(speed) = port.speed {
        props += &format!(",x-speed={}", speed.qemu_value());
    }
    if let Some(width) = port.width {
        props += &format!(",x-width={width}");
    }
    props
}

/// A root port's expected line: its capability is what the file sets; its
/// link trains to the lower of its own and its partner's capability. QEMU's
/// endpoints here are conventional PCI (no link of their own: the port keeps
/// its setting), while QEMU's switch upstream port is a 2.5 GT/s x1 device.
fn root_port_line(path: &str, port: &Port, carries_switch: bool) -> TreeLine {
    let (speed, width) = if carries_switch {
        (port.speed.map(|_| LinkSpeed::Gen1), port.width.map(|_| 1))
    } else {
        (port.speed, port.width)
    };
    TreeLine {
        path: path.to_string(),
        pci_id: ROOT_PORT_ID.into(),
        role: Role::RootPort,
        speed_gts: speed.map(|s| s.sysfs_gts().to_string()),
        width,
        max_speed_gts: port.speed.map(|s| s.sysfs_gts().to_string()),
        max_width: port.width,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lays_out_root_ports_switch_and_endpoints() {
        let fabric = lay_out(&Topology::parse(crate::topology::tests::FABRIC).unwrap());
        assert_eq!(
            fabric.devices,
            [
                "pcie-root-port,id=rp1,bus=pcie.0,addr=0x10.0,chassis=1,slot=1,x-speed=2_5,x-width=1",
                "edu,id=edu0,bus=rp1,addr=0x0.0",
                "pcie-root-port,id=rp2,bus=pcie.0,addr=0x11.0,chassis=2,slot=2,x-speed=16,x-width=16",
                "x3130-upstream,id=sw1,bus=rp2,addr=0x0.0",
                "xio3130-downstream,id=dp1,bus=sw1,addr=0x0.0,chassis=3,slot=3",
                "ivshmem-doorbell,id=ivs0,bus=dp1,addr=0x0.0,chardev=ivs0-ivshmem,vectors=2",
                "xio3130-downstream,id=dp2,bus=sw1,addr=0x1.0,chassis=4,slot=4",
            ]
        );
        let lines: Vec<String> = fabric
            .expected_tree
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            lines,
            [
                "10.0 1b36:000c root-port speed=2.5 width=1 max-speed=2.5 max-width=1",
                "10.0/00.0 1234:11e8 endpoint",
                // Trained down to QEMU's 2.5 GT/s x1 switch upstream port.
                "11.0 1b36:000c root-port speed=2.5 width=1 max-speed=16.0 max-width=16",
                "11.0/00.0 104c:8232 switch-upstream",
                "11.0/00.0/00.0 104c:8233 switch-downstream",
                "11.0/00.0/00.0/00.0 1af4:1110 endpoint",
                "11.0/00.0/01.0 104c:8233 switch-downstream",
            ]
        );
        assert_eq!(fabric.ivshmem, [("ivs0".to_string(), "shm".to_string())]);
    }
}
