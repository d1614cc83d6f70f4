// SPDX-License-Identifier: GPL-2.0

//! Link status and retraining of the link above any PCI function.

use kernel::{
    prelude::*,
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

use crate::{
    pci_function::{regs, PciFunction},
    retrain_sequence::{self, retrain_port_link, LinkRegister, RetrainPort, Training},
    uapi,
};

/// The kernel's own retrain waits up to 1 s for Link Training to clear.
const DEFAULT_RETRAIN_TIMEOUT_MS: u32 = 1000;
/// Largest retrain timeout a caller may ask for.
const MAX_RETRAIN_TIMEOUT_MS: u32 = 10_000;

/// The link registers of one function, if it is PCI Express.
fn link_regs(function: &PciFunction) -> uapi::pcieipc_link_regs {
    if !function.is_pcie() {
        return uapi::pcieipc_link_regs::default();
    }
    uapi::pcieipc_link_regs {
        lnkcap: function.pcie_read32(regs::PCI_EXP_LNKCAP).unwrap_or(0),
        lnkctl: function.pcie_read16(regs::PCI_EXP_LNKCTL).unwrap_or(0),
        lnksta: function.pcie_read16(regs::PCI_EXP_LNKSTA).unwrap_or(0),
        lnkctl2: function.pcie_read16(regs::PCI_EXP_LNKCTL2).unwrap_or(0),
        present: 1,
    }
}

/// Link speed generation of a LnkCap/LnkSta/LnkCtl2 speed field (1 = 2.5 GT/s).
fn generation(field: u32) -> u8 {
    (field & 0xf) as u8
}

fn width(field: u32) -> u8 {
    (field & 0x3f) as u8
}

/// The status of the link above `function`: its own registers and its
/// upstream port's, decoded from the port's side (the downstream-facing end
/// is where LnkSta and Retrain Link live).
pub(crate) fn status(function: &PciFunction) -> uapi::pcieipc_link_status {
    let port = function.upstream_bridge().filter(PciFunction::is_pcie);
    let device = link_regs(function);
    let port_regs = port.as_ref().map(link_regs).unwrap_or_default();
    let mut status = uapi::pcieipc_link_status {
        argsz: size_of::<uapi::pcieipc_link_status>() as u32,
        bdf: function.bdf(),
        upstream_bdf: port
            .as_ref()
            .map_or(uapi::PCIEIPC_BDF_NONE, PciFunction::bdf),
        device,
        port: port_regs,
        ..Default::default()
    };
    // The end whose LnkSta describes the link: the port if there is one,
    // else the function itself (a root port reports its own link below).
    let (near, far) = if port_regs.present != 0 {
        (port_regs, device)
    } else {
        (device, port_regs)
    };
    if near.present == 0 {
        return status;
    }
    status.cur_speed = generation(u32::from(near.lnksta));
    status.cur_width = width(u32::from(near.lnksta >> 4));
    // A Link Capabilities of zero (some emulated switch ports) says nothing:
    // the maximum comes from the ends that report one.
    let caps = [near, far].map(|end| (end.present != 0 && end.lnkcap != 0).then_some(end.lnkcap));
    let lowest = |field: fn(u32) -> u8| {
        caps.iter()
            .flatten()
            .map(|&cap| field(cap))
            .min()
            .unwrap_or(0)
    };
    let max_speed = lowest(generation);
    let max_width = lowest(|cap| width(cap >> 4));
    status.max_speed = max_speed;
    status.max_width = max_width;
    status.target_speed = generation(u32::from(near.lnkctl2));
    let target = if status.target_speed != 0 {
        status.target_speed.min(max_speed)
    } else {
        max_speed
    };
    if max_speed != 0 && (status.cur_speed < target || status.cur_width < max_width) {
        status.state |= uapi::PCIEIPC_LINK_DEGRADED;
    }
    if near.lnksta & regs::PCI_EXP_LNKSTA_LT != 0 {
        status.state |= uapi::PCIEIPC_LINK_TRAINING;
    }
    if near.lnksta & regs::PCI_EXP_LNKSTA_DLLLA != 0 {
        status.state |= uapi::PCIEIPC_LINK_DLL_ACTIVE;
    }
    status
}

/// What a retrain did.
pub(crate) struct Retrain {
    pub(crate) before: uapi::pcieipc_link_status,
    pub(crate) after: uapi::pcieipc_link_status,
    pub(crate) elapsed_us: u32,
    /// `Err(ETIMEDOUT)` when training did not end in time.
    pub(crate) outcome: Result,
}

/// The port whose Link Control retrains the link above `function`.
pub(crate) fn retrain_port(function: &PciFunction) -> Result<PciFunction> {
    function
        .upstream_bridge()
        .filter(PciFunction::is_downstream_port)
        .ok_or(EOPNOTSUPP)
}

/// Retrains the link above `function` from its upstream port
/// (`retrain_sequence` says how), at `target_speed` (0: as the port's Target
/// Link Speed is set; PCIEIPC_LINK_SPEED_MAX: up to what both ends can do),
/// within `timeout_ms` (0: the kernel's 1 s).
pub(crate) fn retrain(
    function: &PciFunction,
    target_speed: u8,
    timeout_ms: u32,
) -> Result<Retrain> {
    let port = retrain_port(function)?;
    let timeout_ms = match timeout_ms {
        0 => DEFAULT_RETRAIN_TIMEOUT_MS,
        ms if ms > MAX_RETRAIN_TIMEOUT_MS => return Err(EINVAL),
        ms => ms,
    };
    let before = status(function);
    let target_speed = if u32::from(target_speed) == uapi::PCIEIPC_LINK_SPEED_MAX {
        // Up to what both ends can do: a link that trained down (or whose
        // port was left set lower) trains back to its capability.
        before.max_speed
    } else {
        target_speed
    };
    if target_speed != 0 {
        let port_max = generation(port.pcie_read32(regs::PCI_EXP_LNKCAP)?);
        if target_speed > port_max {
            return Err(EINVAL);
        }
    }
    let timed = TimedPort {
        port: &port,
        start: Instant::<Monotonic>::now(),
        limit: Delta::from_millis(i64::from(timeout_ms)),
    };
    let outcome = retrain_port_link(&timed, target_speed).map(|training| match training {
        Training::Done => Ok(()),
        Training::TimedOut => Err(ETIMEDOUT),
    });
    let start = timed.start;
    let elapsed_us = start
        .elapsed()
        .as_micros_ceil()
        .clamp(0, i64::from(u32::MAX)) as u32;
    Ok(Retrain {
        before,
        after: status(function),
        elapsed_us,
        outcome: outcome?,
    })
}

// The sequence's own register bits (it builds in userspace too) are the
// kernel's.
const _: () = assert!(
    retrain_sequence::LNKCTL_RL == regs::PCI_EXP_LNKCTL_RL
        && retrain_sequence::LNKSTA_LT == regs::PCI_EXP_LNKSTA_LT
        && retrain_sequence::LNKSTA_LBMS == regs::PCI_EXP_LNKSTA_LBMS
        && retrain_sequence::LNKCTL2_TLS == regs::PCI_EXP_LNKCTL2_TLS
);

/// A port and the time a retrain of its link may take.
struct TimedPort<'a> {
    port: &'a PciFunction,
    start: Instant<Monotonic>,
    limit: Delta,
}

impl RetrainPort for TimedPort<'_> {
    type Error = Error;

    fn read(&self, register: LinkRegister) -> Result<u16> {
        self.port.pcie_read16(match register {
            LinkRegister::Control => regs::PCI_EXP_LNKCTL,
            LinkRegister::Status => regs::PCI_EXP_LNKSTA,
            LinkRegister::Control2 => regs::PCI_EXP_LNKCTL2,
        })
    }

    fn clear_and_set(&self, register: LinkRegister, clear: u16, set: u16) -> Result {
        match register {
            LinkRegister::Control => self.port.link_control_clear_and_set(clear, set),
            LinkRegister::Control2 => self.port.link_control2_clear_and_set(clear, set),
            // Link Status has no bits to set.
            LinkRegister::Status => Err(EINVAL),
        }
    }

    fn clear_status(&self, bits: u16) -> Result {
        self.port.link_status_clear(bits)
    }

    fn needs_retrain_bit_cleared(&self) -> bool {
        self.port.needs_retrain_bit_cleared()
    }

    fn expired(&self) -> bool {
        self.start.elapsed() > self.limit
    }

    fn pause(&self) {
        fsleep(Delta::from_millis(1));
    }
}
