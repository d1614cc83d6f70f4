//! The AER → action matrix (docs/fault-path.md): what the communicator does
//! about an error reported on a rank's link, as a pure function of the error
//! bits and their severities. Transports only report faults; the
//! communicator takes the action this decides, whatever the transport.

use std::fmt;

use crate::device::Device;
use crate::events::{AerError, Link, Severity};
use crate::probe::bdf::Bdf;

/// Uncorrectable Error Status bit 5: the link went down without warning. The
/// device is unreachable whatever severity the severity register gives it.
pub const SURPRISE_DOWN_BIT: u8 = 5;

/// An error reported on the link under a rank's device, or the device lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The function that reported it (the device, or the port above it).
    pub bdf: String,
    /// The error bits, with severity and mask as the registers read.
    pub errors: Vec<AerError>,
    /// How the device was lost, if it was.
    pub lost: Option<Loss>,
    /// The rank whose device it is, where it is a peer's (the transport
    /// sees a peer's device lost in the module's event stream: the peer
    /// cannot tell the others through memory that went with it).
    pub peer: Option<usize>,
}

impl Fault {
    /// An error of this rank's device or link.
    pub fn error(bdf: String, errors: Vec<AerError>) -> Fault {
        Fault {
            bdf,
            errors,
            lost: None,
            peer: None,
        }
    }
}

/// How a device was lost: the ranks cannot go on without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Removed (hot-unplugged, unbound: `DEVICE_GONE`), or its config space
    /// reads all ones.
    Removed,
    /// The kernel gave it up after an error (permanent failure).
    GivenUp,
}

impl Loss {
    /// The end of the kernel's recovery a loss is.
    pub fn recovery(self) -> Recovery {
        match self {
            Loss::Removed => Recovery::Gone,
            Loss::GivenUp => Recovery::Failed,
        }
    }
}

/// What the ranks do about a fault, mildest first: the worst error of a
/// fault decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultAction {
    /// Correctable: the link retried and the data arrived. The next calls
    /// take the erring link's smaller chunk; the call in flight goes on.
    SmallerChunk,
    /// Non-fatal uncorrectable: the rank stops before its next call until
    /// the kernel's recovery ends (the driver's `resume`), then the next
    /// calls take the smaller chunk. A recovery that fails or does not end
    /// in time turns it into `Fail`.
    AwaitRecovery,
    /// Fatal uncorrectable, Surprise Down, or the device gone: every rank
    /// fails, naming the device, the bits and the kernel's recovery result.
    Fail,
}

impl FaultAction {
    pub fn name(self) -> &'static str {
        match self {
            FaultAction::SmallerChunk => "smaller chunk",
            FaultAction::AwaitRecovery => "await recovery",
            FaultAction::Fail => "fail",
        }
    }
}

/// The action one error bit calls for; `None` for a masked bit, which the
/// port logs but does not report.
pub fn error_action(error: &AerError) -> Option<FaultAction> {
    if error.masked {
        return None;
    }
    Some(match error.severity {
        Severity::Correctable => FaultAction::SmallerChunk,
        Severity::NonFatal if error.bit == SURPRISE_DOWN_BIT => FaultAction::Fail,
        Severity::NonFatal => FaultAction::AwaitRecovery,
        Severity::Fatal => FaultAction::Fail,
    })
}

/// The action a fault calls for: the worst of its errors', `Fail` for a
/// device lost, `None` when every bit is masked.
pub fn action(fault: &Fault) -> Option<FaultAction> {
    if fault.lost.is_some() {
        return Some(FaultAction::Fail);
    }
    fault.errors.iter().filter_map(error_action).max()
}

/// The action matrix's opt-in retrain (`CommOptions::retrain_degraded`)
/// of the link above `bdf`, after the kernel recovered it from a non-fatal
/// error: the link after, or `None` where it is not degraded. A failure
/// (the module not loaded, root has not allowed the device: the error says
/// how) leaves the link as it was, and is said: the job asked for it.
pub(crate) fn retrain_if_degraded(device: &Device, bdf: Bdf) -> Option<Link> {
    let abi = match bdf.to_abi() {
        Ok(abi) => abi,
        Err(error) => {
            eprintln!("pcieipc: retraining the degraded link above {bdf}: {error}");
            return None;
        }
    };
    device.retrain_if_degraded(abi).unwrap_or_else(|error| {
        eprintln!("pcieipc: retraining the degraded link above {bdf}: {error}");
        None
    })
}

/// How the kernel's recovery of a device ended, as far as a rank waited.
/// `Recovered` and `Answering` let the ranks go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// The driver's `resume` came: the device works again.
    Recovered,
    /// A device bound to another driver answers config reads again with its
    /// link up: all that is visible of its recovery outside its driver.
    Answering,
    /// The kernel gave the device up (permanent failure, `disconnect`).
    Failed,
    /// The device is gone (removed, or its config space reads all ones).
    Gone,
    /// No end of the recovery within the wait, in milliseconds.
    Unfinished { waited_ms: u32 },
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recovery::Recovered => f.write_str("recovered (resume)"),
            Recovery::Answering => f.write_str("answering again (config reads, link up)"),
            Recovery::Failed => f.write_str("failed (permanent failure)"),
            Recovery::Gone => f.write_str("device gone"),
            Recovery::Unfinished { waited_ms } => {
                write!(f, "not finished after {waited_ms} ms")
            }
        }
    }
}

/// A fault as the ranks' shared failure record carries it: the unmasked
/// bits of each register and which uncorrectable ones were fatal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultBits {
    pub uncorrectable: u32,
    pub fatal: u32,
    pub correctable: u32,
}

impl FaultBits {
    pub fn of(errors: &[AerError]) -> FaultBits {
        let mut bits = FaultBits {
            uncorrectable: 0,
            fatal: 0,
            correctable: 0,
        };
        for error in errors.iter().filter(|e| !e.masked && e.bit < 32) {
            let mask = 1u32 << error.bit;
            match error.severity {
                Severity::Correctable => bits.correctable |= mask,
                Severity::NonFatal => bits.uncorrectable |= mask,
                Severity::Fatal => {
                    bits.uncorrectable |= mask;
                    bits.fatal |= mask;
                }
            }
        }
        bits
    }

    pub fn errors(self) -> Vec<AerError> {
        let mut errors = crate::events::decode_status(self.fatal, Severity::Fatal);
        errors.extend(crate::events::decode_status(
            self.uncorrectable & !self.fatal,
            Severity::NonFatal,
        ));
        errors.extend(crate::events::decode_status(
            self.correctable,
            Severity::Correctable,
        ));
        errors
    }
}

impl fmt::Display for FaultBits {
    /// `Malformed TLP [18] fatal, Bad TLP [6] correctable`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errors = self.errors();
        if errors.is_empty() {
            return f.write_str("no error bits");
        }
        for (index, error) in errors.iter().enumerate() {
            let severity = match error.severity {
                Severity::Correctable => "correctable",
                Severity::NonFatal => "non-fatal",
                Severity::Fatal => "fatal",
            };
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} [{}] {severity}", error.name, error.bit)?;
        }
        Ok(())
    }
}

/// A fault one rank acted on, and what it cost that rank.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRecord {
    /// The call during which (`in_call`) or before which the rank acted.
    pub call: u64,
    pub in_call: bool,
    pub bdf: String,
    pub bits: FaultBits,
    pub lost: Option<Loss>,
    /// The rank whose device it was, where a peer's.
    pub peer: Option<usize>,
    pub action: FaultAction,
    /// How the kernel's recovery ended, where the action waited for it.
    pub recovery: Option<Recovery>,
    /// The link's facts after the opt-in retrain of a link left degraded
    /// (`CommOptions::retrain_degraded`), where it ran.
    pub retrained: Option<crate::engine::chunk::LinkFacts>,
    /// How long the rank spent on it before going on (or failing).
    pub stall: std::time::Duration,
}

impl fmt::Display for FaultRecord {
    /// `in call 12: 0000:00:11.0 Bad TLP [6] correctable: smaller chunk,
    /// stall 4 us`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = if self.in_call { "in" } else { "before" };
        write!(f, "{when} call {}: ", self.call)?;
        if let Some(peer) = self.peer {
            write!(f, "rank {peer}'s ")?;
        }
        write!(f, "{} {}", self.bdf, self.bits)?;
        match self.lost {
            Some(Loss::Removed) => f.write_str(", device removed")?,
            Some(Loss::GivenUp) => f.write_str(", device given up")?,
            None => {}
        }
        write!(f, ": {}", self.action.name())?;
        if let Some(recovery) = self.recovery {
            write!(f, ", recovery {recovery}")?;
        }
        if let Some(link) = self.retrained {
            write!(f, ", retrained: {} GT/s x{}", link.speed_gt_s, link.width)?;
        }
        write!(f, ", stall {} us", self.stall.as_micros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{aer_error_at, CORRECTABLE, UNCORRECTABLE};

    fn fault(errors: Vec<AerError>) -> Fault {
        Fault::error("0000:02:00.0".into(), errors)
    }

    /// The matrix of docs/fault-path.md, row by row: every bit the spec
    /// names, at each severity the severity register can give it.
    #[test]
    fn every_bit_and_severity_follows_the_table() {
        for bit in CORRECTABLE {
            let error = aer_error_at(bit.bit, Severity::Correctable, false);
            assert_eq!(
                action(&fault(vec![error])),
                Some(FaultAction::SmallerChunk),
                "{}",
                bit.name
            );
        }
        for bit in UNCORRECTABLE {
            let non_fatal = aer_error_at(bit.bit, Severity::NonFatal, false);
            let fatal = aer_error_at(bit.bit, Severity::Fatal, false);
            let expected_non_fatal = if bit.bit == SURPRISE_DOWN_BIT {
                FaultAction::Fail
            } else {
                FaultAction::AwaitRecovery
            };
            assert_eq!(
                action(&fault(vec![non_fatal])),
                Some(expected_non_fatal),
                "{}",
                bit.name
            );
            assert_eq!(
                action(&fault(vec![fatal])),
                Some(FaultAction::Fail),
                "{}",
                bit.name
            );
        }
    }

    #[test]
    fn masked_bits_call_for_nothing() {
        for severity in [Severity::Correctable, Severity::NonFatal, Severity::Fatal] {
            assert_eq!(action(&fault(vec![aer_error_at(18, severity, true)])), None);
        }
        assert_eq!(action(&fault(Vec::new())), None);
    }

    #[test]
    fn the_worst_error_decides() {
        let bad_tlp = aer_error_at(6, Severity::Correctable, false);
        let timeout = aer_error_at(14, Severity::NonFatal, false);
        let malformed = aer_error_at(18, Severity::Fatal, false);
        let masked_fatal = aer_error_at(4, Severity::Fatal, true);
        assert_eq!(
            action(&fault(vec![bad_tlp.clone(), timeout.clone()])),
            Some(FaultAction::AwaitRecovery)
        );
        assert_eq!(
            action(&fault(vec![timeout.clone(), malformed, bad_tlp.clone()])),
            Some(FaultAction::Fail)
        );
        assert_eq!(
            action(&fault(vec![bad_tlp, masked_fatal])),
            Some(FaultAction::SmallerChunk)
        );
        for loss in [Loss::Removed, Loss::GivenUp] {
            let lost = Fault {
                lost: Some(loss),
                ..fault(vec![timeout.clone()])
            };
            assert_eq!(action(&lost), Some(FaultAction::Fail));
        }
    }

    #[test]
    fn fault_bits_keep_the_unmasked_errors_and_their_severity() {
        let errors = vec![
            aer_error_at(18, Severity::Fatal, false),
            aer_error_at(14, Severity::NonFatal, false),
            aer_error_at(4, Severity::Fatal, true),
            aer_error_at(6, Severity::Correctable, false),
        ];
        let bits = FaultBits::of(&errors);
        assert_eq!(
            bits,
            FaultBits {
                uncorrectable: 1 << 18 | 1 << 14,
                fatal: 1 << 18,
                correctable: 1 << 6,
            }
        );
        assert_eq!(
            bits.to_string(),
            "Malformed TLP [18] fatal, Completion Timeout [14] non-fatal, Bad TLP [6] correctable"
        );
        let kept: Vec<AerError> = errors.into_iter().filter(|e| !e.masked).collect();
        let mut back = bits.errors();
        back.sort_by_key(|e| (e.severity != Severity::Fatal, e.bit));
        let mut want = kept;
        want.sort_by_key(|e| (e.severity != Severity::Fatal, e.bit));
        assert_eq!(back, want);
    }
}
