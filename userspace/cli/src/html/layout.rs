//! Where each box of the PCIe tree goes in the page: top down, host bridges
//! on top, one box per function, leaves side by side in bus-id order and
//! every bridge centred over its children, so that a switch's ports sit
//! together and the GPUs behind one link share a subtree.

use std::collections::HashMap;

use pcieipc::probe::ProbeReport;

pub(super) const NODE_WIDTH: f64 = 104.0;
pub(super) const NODE_HEIGHT: f64 = 38.0;
/// Between the centres of neighbouring leaves.
const SLOT: f64 = 112.0;
/// Between depths: room for the link labels and the degraded marks.
const LEVEL: f64 = 88.0;
pub(super) const MARGIN: f64 = 20.0;
/// Added between the trees of two host bridges.
const HOST_BRIDGE_GAP: f64 = SLOT / 2.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Point {
    pub x: f64,
    pub y: f64,
}

/// Box centres, indexed like the report's `host_bridges` and `devices`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TreeLayout {
    pub host_bridges: Vec<Point>,
    pub devices: Vec<Point>,
    pub width: f64,
    pub height: f64,
}

/// A node of the tree being laid out.
#[derive(Clone, Copy)]
enum Node {
    HostBridge(usize),
    Device(usize),
}

struct Placer {
    /// Devices below each host bridge and each device, in bus-id order.
    bridge_children: Vec<Vec<usize>>,
    device_children: Vec<Vec<usize>>,
    layout: TreeLayout,
    next_leaf_x: f64,
}

impl Placer {
    /// Places `node` and its subtree; returns its x.
    fn place(&mut self, node: Node, depth: usize) -> f64 {
        let children = match node {
            Node::HostBridge(index) => self.bridge_children[index].clone(),
            Node::Device(index) => self.device_children[index].clone(),
        };
        let xs: Vec<f64> = children
            .iter()
            .map(|&child| self.place(Node::Device(child), depth + 1))
            .collect();
        let x = match (xs.first(), xs.last()) {
            (Some(first), Some(last)) => (first + last) / 2.0,
            _ => {
                let x = self.next_leaf_x;
                self.next_leaf_x += SLOT;
                x
            }
        };
        let centre = Point {
            x,
            y: MARGIN + NODE_HEIGHT / 2.0 + depth as f64 * LEVEL,
        };
        match node {
            Node::HostBridge(index) => self.layout.host_bridges[index] = centre,
            Node::Device(index) => self.layout.devices[index] = centre,
        }
        x
    }
}

pub(super) fn layout_tree(report: &ProbeReport) -> TreeLayout {
    let index_of: HashMap<_, _> = report
        .devices
        .iter()
        .enumerate()
        .map(|(index, device)| (device.bdf, index))
        .collect();
    let bridge_of: HashMap<&str, usize> = report
        .host_bridges
        .iter()
        .enumerate()
        .map(|(index, bridge)| (bridge.name.as_str(), index))
        .collect();
    let mut bridge_children = vec![Vec::new(); report.host_bridges.len()];
    let mut device_children = vec![Vec::new(); report.devices.len()];
    for (index, device) in report.devices.iter().enumerate() {
        match device.parent.and_then(|parent| index_of.get(&parent)) {
            Some(&parent) => device_children[parent].push(index),
            None => {
                if let Some(&bridge) = bridge_of.get(device.host_bridge.as_str()) {
                    bridge_children[bridge].push(index);
                }
            }
        }
    }
    let origin = Point { x: 0.0, y: 0.0 };
    let mut placer = Placer {
        bridge_children,
        device_children,
        layout: TreeLayout {
            host_bridges: vec![origin; report.host_bridges.len()],
            devices: vec![origin; report.devices.len()],
            width: 0.0,
            height: 0.0,
        },
        next_leaf_x: MARGIN + NODE_WIDTH / 2.0,
    };
    for bridge in 0..report.host_bridges.len() {
        placer.place(Node::HostBridge(bridge), 0);
        placer.next_leaf_x += HOST_BRIDGE_GAP;
    }
    let mut layout = placer.layout;
    let centres = || layout.host_bridges.iter().chain(&layout.devices);
    let right = centres().map(|point| point.x).fold(0.0, f64::max);
    let bottom = centres().map(|point| point.y).fold(0.0, f64::max);
    layout.width = right + NODE_WIDTH / 2.0 + MARGIN;
    layout.height = bottom + NODE_HEIGHT / 2.0 + MARGIN;
    layout
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::dgx8_report;
    use super::*;

    #[test]
    fn boxes_do_not_overlap_and_bridges_sit_over_their_children() {
        let report = dgx8_report();
        let layout = layout_tree(&report);
        let boxes: Vec<Point> = layout
            .host_bridges
            .iter()
            .chain(&layout.devices)
            .copied()
            .collect();
        for (i, a) in boxes.iter().enumerate() {
            for b in &boxes[i + 1..] {
                let apart = (a.x - b.x).abs() >= NODE_WIDTH || (a.y - b.y).abs() >= NODE_HEIGHT;
                assert!(apart, "boxes at {a:?} and {b:?} overlap");
            }
            assert!(a.x - NODE_WIDTH / 2.0 >= MARGIN && a.x + NODE_WIDTH / 2.0 <= layout.width);
            assert!(a.y + NODE_HEIGHT / 2.0 <= layout.height);
        }
        let index_of = |bdf: &str| {
            report
                .devices
                .iter()
                .position(|device| device.bdf.to_string() == bdf)
                .unwrap()
        };
        // The level-2 switch of GPU2 and GPU3: its upstream port is centred
        // over its two downstream ports, one level above them, and each GPU
        // sits right below its port.
        let upstream = layout.devices[index_of("0000:08:00.0")];
        let left = layout.devices[index_of("0000:09:00.0")];
        let right = layout.devices[index_of("0000:09:01.0")];
        assert_eq!(upstream.x, (left.x + right.x) / 2.0);
        assert_eq!(left.y - upstream.y, LEVEL);
        assert_eq!(right.x - left.x, SLOT);
        assert_eq!(layout.devices[index_of("0000:0a:00.0")].x, left.x);
        // Host bridges on top, the second socket's tree right of the first's.
        assert_eq!(layout.host_bridges[0].y, MARGIN + NODE_HEIGHT / 2.0);
        assert!(layout.host_bridges[1].x > layout.devices[index_of("0000:0c:00.0")].x);
        // Depth 6 is the deepest (the GPUs): seven levels.
        assert_eq!(layout.height, MARGIN + NODE_HEIGHT + 6.0 * LEVEL + MARGIN);
    }
}
