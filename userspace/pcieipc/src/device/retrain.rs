//! What a link retrain asks for, how it went, and why it was refused.

use pcieipc_uapi as uapi;

use crate::events::Link;
use crate::probe::bdf::Bdf;

/// The speed a retrain trains to, for that retrain only (the port's Target
/// Link Speed is put back after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSpeed {
    /// A speed generation, 1 (2.5 GT/s) to 6 (64 GT/s).
    Generation(u8),
    /// The highest speed both ends support: a link that trained down (or a
    /// port left set lower) trains back to its capability.
    UpToCapability,
}

impl TargetSpeed {
    pub(super) fn to_abi(self) -> u8 {
        match self {
            TargetSpeed::Generation(generation) => generation,
            TargetSpeed::UpToCapability => uapi::PCIEIPC_LINK_SPEED_MAX as u8,
        }
    }
}

impl std::str::FromStr for TargetSpeed {
    type Err = String;

    /// `1`..`6` or `max`.
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "max" => Ok(TargetSpeed::UpToCapability),
            _ => match text.parse::<u8>() {
                Ok(generation @ 1..=6) => Ok(TargetSpeed::Generation(generation)),
                _ => Err(format!(
                    "'{text}' is not a speed generation: 1 (2.5 GT/s) to 6 (64 GT/s), or max"
                )),
            },
        }
    }
}

/// Why the module refused to retrain a link (`pcieipc_link_refusal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetrainRefusal {
    /// pcieipc binds no device below the port and root did not list the
    /// function in the module parameter `link_control`.
    NotAllowed,
    /// A mass-storage function is at or below the port: never retrained.
    Storage { function: Bdf },
    /// The kernel's bandwidth controller sets the port's speed: a target
    /// speed goes through its cooling device.
    BandwidthController { port: Bdf },
}

impl RetrainRefusal {
    pub(super) fn from_abi(refused: u32, refused_bdf: Bdf) -> Option<Self> {
        match refused {
            uapi::PCIEIPC_LINK_REFUSED_NOT_ALLOWED => Some(RetrainRefusal::NotAllowed),
            uapi::PCIEIPC_LINK_REFUSED_STORAGE => Some(RetrainRefusal::Storage {
                function: refused_bdf,
            }),
            uapi::PCIEIPC_LINK_REFUSED_BANDWIDTH_CONTROLLER => {
                Some(RetrainRefusal::BandwidthController { port: refused_bdf })
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for RetrainRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetrainRefusal::NotAllowed => write!(
                f,
                "pcieipc does not bind it and root has not allowed its link to be retrained \
                 (module parameter link_control)"
            ),
            RetrainRefusal::Storage { function } => write!(
                f,
                "mass-storage function {function} hangs from the same port: its link is never \
                 taken down, listed in link_control or not"
            ),
            RetrainRefusal::BandwidthController { port } => write!(
                f,
                "the kernel's bandwidth controller sets port {port}'s speed: a target speed goes \
                 through its cooling device PCIe_Port_Link_Speed_{port}"
            ),
        }
    }
}

/// What a retrain returns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Retrain {
    pub before: Link,
    pub after: Link,
    pub elapsed_us: u32,
    /// False when Link Training did not end within the timeout.
    pub completed: bool,
}
