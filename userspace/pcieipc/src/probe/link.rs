//! PCIe link speeds and the per-link view the rest of the library reads.

use serde::{Serialize, Serializer};

/// A PCIe link speed (one per generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkSpeed {
    Gt2_5,
    Gt5,
    Gt8,
    Gt16,
    Gt32,
    Gt64,
}

impl LinkSpeed {
    /// Decodes the speed encoding used by LnkCap, LnkSta and LnkCtl2
    /// (1 = 2.5 GT/s ... 6 = 64 GT/s).
    pub fn from_encoding(code: u8) -> Option<LinkSpeed> {
        match code {
            1 => Some(LinkSpeed::Gt2_5),
            2 => Some(LinkSpeed::Gt5),
            3 => Some(LinkSpeed::Gt8),
            4 => Some(LinkSpeed::Gt16),
            5 => Some(LinkSpeed::Gt32),
            6 => Some(LinkSpeed::Gt64),
            _ => None,
        }
    }

    pub fn gigatransfers_per_second(self) -> f64 {
        match self {
            LinkSpeed::Gt2_5 => 2.5,
            LinkSpeed::Gt5 => 5.0,
            LinkSpeed::Gt8 => 8.0,
            LinkSpeed::Gt16 => 16.0,
            LinkSpeed::Gt32 => 32.0,
            LinkSpeed::Gt64 => 64.0,
        }
    }

    /// Usable bytes per second per lane and direction, in GB/s, after line
    /// encoding: 8b/10b up to 5 GT/s, 128b/130b from 8 GT/s, 242/256 FLITs at
    /// 64 GT/s.
    pub fn lane_gigabytes_per_second(self) -> f64 {
        let efficiency = match self {
            LinkSpeed::Gt2_5 | LinkSpeed::Gt5 => 8.0 / 10.0,
            LinkSpeed::Gt8 | LinkSpeed::Gt16 | LinkSpeed::Gt32 => 128.0 / 130.0,
            LinkSpeed::Gt64 => 242.0 / 256.0,
        };
        self.gigatransfers_per_second() * efficiency / 8.0
    }
}

impl Serialize for LinkSpeed {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.gigatransfers_per_second())
    }
}

/// Whether a link runs at what both of its ends can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkState {
    /// Current speed and width equal the capability of both ends.
    Full,
    /// A GPU link at full width but lower speed: GPUs lower the speed when idle,
    /// so this is expected until the GPU is loaded.
    IdleDownshiftLikely,
    /// Below capability in width, or in speed on a non-GPU link.
    Degraded,
    /// A speed or width of the link was not readable.
    Unknown,
}

/// One physical link: the one between a device (endpoint or switch upstream
/// port) and the port above it (root port or switch downstream port), or an
/// endpoint's own link when the port above it is not visible (a GPU on a
/// VM's root bus: the hypervisor hides the host's root port, but the GPU's
/// own LnkSta still tells how its link trained).
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// Index (in `Topology::devices`) of the device below the link.
    pub downstream: usize,
    /// Index of the port above the link; `None` when it is not visible and
    /// the link is known from the device below alone.
    pub upstream: Option<usize>,
    pub current_speed: Option<LinkSpeed>,
    pub current_width: Option<u8>,
    /// The lower of the two ends' maximum speeds.
    pub max_speed: Option<LinkSpeed>,
    /// The lower of the two ends' maximum widths.
    pub max_width: Option<u8>,
    /// Target speed from LnkCtl2 of the port above (config space only); a link
    /// at a target set below its capability is not degraded.
    pub target_speed: Option<LinkSpeed>,
    pub state: LinkState,
    /// The lower health score of the two ends, when either has one.
    pub health: Option<f64>,
}

impl Link {
    /// Bandwidth per direction in GB/s at the current speed and width.
    pub fn current_bandwidth_gbps(&self) -> Option<f64> {
        Some(self.current_speed?.lane_gigabytes_per_second() * f64::from(self.current_width?))
    }

    /// Bandwidth per direction in GB/s that a transfer will see: the current
    /// one, except that an idle-downshifted GPU link retrains to its maximum
    /// speed under load.
    pub fn effective_bandwidth_gbps(&self) -> Option<f64> {
        match self.state {
            LinkState::IdleDownshiftLikely => {
                Some(self.max_speed?.lane_gigabytes_per_second() * f64::from(self.current_width?))
            }
            _ => self.current_bandwidth_gbps(),
        }
    }

    /// What a machine without AER counters says of this link's health: 1 for
    /// a link that trained as expected (an idle-downshifted GPU link
    /// included), for a degraded one the share of its expected bandwidth it
    /// runs at, since training down is the one sign of signal trouble such a
    /// machine gives; `None` when the state is unknown.
    pub fn state_score(&self) -> Option<f64> {
        match self.state {
            LinkState::Full | LinkState::IdleDownshiftLikely => Some(1.0),
            LinkState::Unknown => None,
            LinkState::Degraded => {
                let max_speed = self.max_speed?;
                let expected_speed = self
                    .target_speed
                    .map_or(max_speed, |target| target.min(max_speed));
                let expected =
                    expected_speed.lane_gigabytes_per_second() * f64::from(self.max_width?);
                Some((self.current_bandwidth_gbps()? / expected).clamp(0.0, 1.0))
            }
        }
    }
}

/// Classifies a link from its current values and capability. `is_gpu_link`:
/// the device below the link is a GPU, which downshifts its speed when idle.
pub fn classify_link(
    current_speed: Option<LinkSpeed>,
    current_width: Option<u8>,
    max_speed: Option<LinkSpeed>,
    max_width: Option<u8>,
    target_speed: Option<LinkSpeed>,
    is_gpu_link: bool,
) -> LinkState {
    let (Some(speed), Some(width), Some(max_speed), Some(max_width)) =
        (current_speed, current_width, max_speed, max_width)
    else {
        return LinkState::Unknown;
    };
    // LnkCtl2 defaults to the port's own maximum, which can exceed the other
    // end's: the speed to expect is the lower of capability and target.
    let expected_speed = target_speed.map_or(max_speed, |target| target.min(max_speed));
    let speed_low = speed < expected_speed;
    let width_low = width < max_width;
    match (speed_low, width_low) {
        (false, false) => LinkState::Full,
        (true, false) if is_gpu_link => LinkState::IdleDownshiftLikely,
        _ => LinkState::Degraded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_bandwidth_follows_line_encoding() {
        assert_eq!(LinkSpeed::Gt2_5.lane_gigabytes_per_second(), 0.25);
        assert_eq!(LinkSpeed::Gt5.lane_gigabytes_per_second(), 0.5);
        assert!((LinkSpeed::Gt16.lane_gigabytes_per_second() * 16.0 - 31.5077).abs() < 1e-3);
        assert!((LinkSpeed::Gt64.lane_gigabytes_per_second() - 7.5625).abs() < 1e-9);
    }

    #[test]
    fn classifies_gpu_speed_drop_as_idle_and_width_drop_as_degraded() {
        use LinkSpeed::*;
        let full = Some(16);
        assert_eq!(
            classify_link(Some(Gt16), full, Some(Gt16), full, None, true),
            LinkState::Full
        );
        assert_eq!(
            classify_link(Some(Gt2_5), full, Some(Gt16), full, None, true),
            LinkState::IdleDownshiftLikely
        );
        assert_eq!(
            classify_link(Some(Gt2_5), full, Some(Gt16), full, None, false),
            LinkState::Degraded
        );
        assert_eq!(
            classify_link(Some(Gt16), Some(8), Some(Gt16), full, None, true),
            LinkState::Degraded
        );
        assert_eq!(
            classify_link(Some(Gt2_5), Some(8), Some(Gt16), full, None, true),
            LinkState::Degraded
        );
        assert_eq!(
            classify_link(None, full, Some(Gt16), full, None, true),
            LinkState::Unknown
        );
    }

    #[test]
    fn expects_the_lower_of_capability_and_target_speed() {
        use LinkSpeed::*;
        // Gen5 port above a Gen4 device: target 32 GT/s, link capable of 16.
        assert_eq!(
            classify_link(
                Some(Gt16),
                Some(16),
                Some(Gt16),
                Some(16),
                Some(Gt32),
                false
            ),
            LinkState::Full
        );
        // Target set to 8 GT/s on a 16 GT/s link running at 5 GT/s.
        assert_eq!(
            classify_link(Some(Gt5), Some(16), Some(Gt16), Some(16), Some(Gt8), false),
            LinkState::Degraded
        );
        assert_eq!(
            classify_link(Some(Gt8), Some(16), Some(Gt16), Some(16), Some(Gt8), false),
            LinkState::Full
        );
    }
}
