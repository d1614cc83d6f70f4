// SPDX-License-Identifier: GPL-2.0

//! The register sequence of a link retrain, written against `RetrainPort`
//! and `core` alone, so that the same file runs in userspace against a model
//! of a port's config space (userspace/pcieipc/tests/retrain_sequence.rs
//! includes it). QEMU's ports ignore Target Link Speed and never set Link
//! Bandwidth Management Status, so a guest cannot fail what the sequence
//! does with them; the model can.
//!
//! It follows `pcie_retrain_link()` (which modules cannot call): wait for a
//! training in progress to end (so the new parameters are used), optionally
//! set the target speed, set Retrain Link (and clear it again on ports with
//! the erratum the kernel's quirks mark), wait for Link Training to clear,
//! clear LBMS (which the retrain set). A target speed the caller gave is for
//! this retrain only: the port's Target Link Speed is put back afterwards,
//! even when the retrain failed, so a later retrain (the kernel's or ours)
//! trains to the speed it had.

/// Link Control: Retrain Link.
pub(crate) const LNKCTL_RL: u16 = 0x0020;
/// Link Status: Link Training.
pub(crate) const LNKSTA_LT: u16 = 0x0800;
/// Link Status: Link Bandwidth Management Status (write one to clear).
pub(crate) const LNKSTA_LBMS: u16 = 0x4000;
/// Link Control 2: Target Link Speed.
pub(crate) const LNKCTL2_TLS: u16 = 0x000f;

/// The registers of a port's PCI Express capability that a retrain uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinkRegister {
    Control,
    Status,
    Control2,
}

/// What a retrain needs of a downstream port: config access (with the
/// kernel's lock for Link Control and Link Control 2 in the module) and the
/// time the caller allows.
pub(crate) trait RetrainPort {
    type Error;
    fn read(&self, register: LinkRegister) -> Result<u16, Self::Error>;
    /// Clears `clear`, then sets `set`, in Link Control or Link Control 2.
    fn clear_and_set(
        &self,
        register: LinkRegister,
        clear: u16,
        set: u16,
    ) -> Result<(), Self::Error>;
    /// Writes `bits` to Link Status, whose writable bits are write-one-to-clear.
    fn clear_status(&self, bits: u16) -> Result<(), Self::Error>;
    /// Whether the port has the erratum that needs Retrain Link cleared by hand.
    fn needs_retrain_bit_cleared(&self) -> bool;
    /// Whether the time the caller allows for the retrain has passed.
    fn expired(&self) -> bool;
    /// Waits a little before Link Training is read again.
    fn pause(&self);
}

/// How training ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Training {
    Done,
    /// Link Training was still set when the time ran out.
    TimedOut,
}

/// Polls Link Training until it is clear, or the time runs out.
fn wait_training_done<P: RetrainPort>(port: &P) -> Result<Training, P::Error> {
    loop {
        if port.read(LinkRegister::Status)? & LNKSTA_LT == 0 {
            return Ok(Training::Done);
        }
        if port.expired() {
            return Ok(Training::TimedOut);
        }
        port.pause();
    }
}

/// Retrains the link below `port`, at `target_speed` (the LnkCtl2 encoding;
/// 0: as Target Link Speed is set). `Err` when a config access failed.
pub(crate) fn retrain_port_link<P: RetrainPort>(
    port: &P,
    target_speed: u8,
) -> Result<Training, P::Error> {
    if wait_training_done(port)? == Training::TimedOut {
        return Ok(Training::TimedOut);
    }
    let original_tls = port.read(LinkRegister::Control2)? & LNKCTL2_TLS;
    let set_tls = target_speed != 0 && u16::from(target_speed) != original_tls;
    if set_tls {
        port.clear_and_set(LinkRegister::Control2, LNKCTL2_TLS, u16::from(target_speed))?;
    }
    let trained = port
        .clear_and_set(LinkRegister::Control, 0, LNKCTL_RL)
        .and_then(|()| {
            if port.needs_retrain_bit_cleared() {
                port.clear_and_set(LinkRegister::Control, LNKCTL_RL, 0)
            } else {
                Ok(())
            }
        })
        .and_then(|()| wait_training_done(port));
    // Undo what this retrain changed even when it failed.
    let lbms = port.clear_status(LNKSTA_LBMS);
    let tls = if set_tls {
        port.clear_and_set(LinkRegister::Control2, LNKCTL2_TLS, original_tls)
    } else {
        Ok(())
    };
    let trained = trained?;
    lbms?;
    tls?;
    Ok(trained)
}
