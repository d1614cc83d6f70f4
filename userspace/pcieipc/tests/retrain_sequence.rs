//! The module's retrain sequence (kmod/retrain_sequence.rs, the same file)
//! against a model of a downstream port's link registers that behaves as
//! hardware does where QEMU's ports do not: the link trains at the lower of
//! Target Link Speed and what both ends can do, a retrain sets Link
//! Bandwidth Management Status, Retrain Link reads as 0, training takes a
//! few polls, a port with the erratum trains only once Retrain Link is
//! cleared again, and any config access may fail.

#[allow(dead_code)]
#[path = "../../../kmod/retrain_sequence.rs"]
mod retrain_sequence;

use std::cell::{Cell, RefCell};

use retrain_sequence::{
    retrain_port_link, LinkRegister, RetrainPort, Training, LNKCTL2_TLS, LNKCTL_RL, LNKSTA_LBMS,
    LNKSTA_LT,
};

const SPEED: u16 = 0x000f;
const GEN1: u16 = 1;
const GEN4: u16 = 4;

/// One config access the sequence made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read(LinkRegister, u16),
    ClearAndSet(LinkRegister, u16, u16),
    ClearStatus(u16),
}

struct ModelPort {
    lnkctl: Cell<u16>,
    lnksta: Cell<u16>,
    lnkctl2: Cell<u16>,
    /// The fastest speed both ends of the link can do.
    capable: u16,
    /// Polls of Link Status a training shows Link Training for.
    training_polls: u32,
    /// Polls left of the training in progress.
    training_left: Cell<u32>,
    /// Retrain Link sticks until cleared, and training starts only then.
    erratum: bool,
    /// `expired` answers true from this call on.
    expires_after: u32,
    expired_calls: Cell<u32>,
    /// The access (counted from 0) that fails.
    fails_at: Option<usize>,
    log: RefCell<Vec<Access>>,
}

impl ModelPort {
    /// A port whose link runs at `speed` with Target Link Speed `tls`, both
    /// ends able to do Gen4.
    fn new(speed: u16, tls: u16) -> ModelPort {
        ModelPort {
            lnkctl: Cell::new(0),
            lnksta: Cell::new(speed | (16 << 4)),
            lnkctl2: Cell::new(tls),
            capable: GEN4,
            training_polls: 3,
            training_left: Cell::new(0),
            erratum: false,
            expires_after: 1000,
            expired_calls: Cell::new(0),
            fails_at: None,
            log: RefCell::new(Vec::new()),
        }
    }

    fn speed(&self) -> u16 {
        self.lnksta.get() & SPEED
    }

    fn tls(&self) -> u16 {
        self.lnkctl2.get() & LNKCTL2_TLS
    }

    fn start_training(&self) {
        self.lnksta.set(self.lnksta.get() | LNKSTA_LT);
        self.training_left.set(self.training_polls);
    }

    /// Logs `access`, and fails it if it is the one that fails.
    fn access(&self, access: Access) -> Result<(), ()> {
        let mut log = self.log.borrow_mut();
        log.push(access);
        if self.fails_at == Some(log.len() - 1) {
            return Err(());
        }
        Ok(())
    }

    fn writes(&self) -> Vec<Access> {
        self.log
            .borrow()
            .iter()
            .copied()
            .filter(|access| !matches!(access, Access::Read(..)))
            .collect()
    }
}

impl RetrainPort for ModelPort {
    type Error = ();

    fn read(&self, register: LinkRegister) -> Result<u16, ()> {
        let value = match register {
            LinkRegister::Control => self.lnkctl.get(),
            LinkRegister::Control2 => self.lnkctl2.get(),
            LinkRegister::Status => {
                let status = self.lnksta.get();
                let left = self.training_left.get();
                if status & LNKSTA_LT != 0 && left != u32::MAX {
                    if left <= 1 {
                        // Trained: at the lower of the target and capability;
                        // a retrain Retrain Link asked for sets LBMS.
                        let speed = self.tls().min(self.capable);
                        self.lnksta
                            .set((status & !(SPEED | LNKSTA_LT)) | speed | LNKSTA_LBMS);
                    }
                    self.training_left.set(left.saturating_sub(1));
                }
                status
            }
        };
        self.access(Access::Read(register, value))?;
        Ok(value)
    }

    fn clear_and_set(&self, register: LinkRegister, clear: u16, set: u16) -> Result<(), ()> {
        self.access(Access::ClearAndSet(register, clear, set))?;
        match register {
            LinkRegister::Control => {
                let value = (self.lnkctl.get() & !clear) | set;
                if self.erratum {
                    let was_set = self.lnkctl.get() & LNKCTL_RL != 0;
                    self.lnkctl.set(value);
                    if was_set && value & LNKCTL_RL == 0 {
                        self.start_training();
                    }
                } else {
                    // Retrain Link always reads 0; writing 1 starts training.
                    self.lnkctl.set(value & !LNKCTL_RL);
                    if value & LNKCTL_RL != 0 {
                        self.start_training();
                    }
                }
            }
            LinkRegister::Control2 => self.lnkctl2.set((self.lnkctl2.get() & !clear) | set),
            LinkRegister::Status => panic!("Link Status written as read-modify-write"),
        }
        Ok(())
    }

    fn clear_status(&self, bits: u16) -> Result<(), ()> {
        self.access(Access::ClearStatus(bits))?;
        self.lnksta.set(self.lnksta.get() & !(bits & LNKSTA_LBMS));
        Ok(())
    }

    fn needs_retrain_bit_cleared(&self) -> bool {
        self.erratum
    }

    fn expired(&self) -> bool {
        let calls = self.expired_calls.get() + 1;
        self.expired_calls.set(calls);
        calls > self.expires_after
    }

    fn pause(&self) {}
}

#[test]
fn trains_at_the_speed_asked_and_puts_target_link_speed_back() {
    let port = ModelPort::new(GEN4, GEN4);
    assert_eq!(retrain_port_link(&port, GEN1 as u8), Ok(Training::Done));
    assert_eq!(port.speed(), GEN1, "the link trained at the speed asked");
    assert_eq!(port.tls(), GEN4, "Target Link Speed as it was");
    assert_eq!(port.lnksta.get() & LNKSTA_LBMS, 0, "LBMS cleared");
    assert_eq!(port.lnksta.get() & LNKSTA_LT, 0);
}

#[test]
fn without_a_speed_the_link_trains_to_its_target_and_lnkctl2_is_not_written() {
    // Trained down to Gen1 with Target Link Speed at Gen4: back to Gen4.
    let port = ModelPort::new(GEN1, GEN4);
    assert_eq!(retrain_port_link(&port, 0), Ok(Training::Done));
    assert_eq!(port.speed(), GEN4);
    assert_eq!(
        port.writes(),
        [
            Access::ClearAndSet(LinkRegister::Control, 0, LNKCTL_RL),
            Access::ClearStatus(LNKSTA_LBMS),
        ]
    );
    // The same with the speed Target Link Speed already has.
    let port = ModelPort::new(GEN1, GEN4);
    assert_eq!(retrain_port_link(&port, GEN4 as u8), Ok(Training::Done));
    assert!(!port
        .writes()
        .iter()
        .any(|access| matches!(access, Access::ClearAndSet(LinkRegister::Control2, ..))));
}

#[test]
fn a_training_in_progress_ends_before_retrain_link_is_set() {
    let port = ModelPort::new(GEN4, GEN4);
    port.start_training();
    assert_eq!(retrain_port_link(&port, GEN1 as u8), Ok(Training::Done));
    let log = port.log.borrow();
    let first_write = log
        .iter()
        .position(|access| !matches!(access, Access::Read(..)))
        .unwrap();
    // The status read just before the first write showed training over.
    let last_status = log[..first_write]
        .iter()
        .rev()
        .find_map(|access| match access {
            Access::Read(LinkRegister::Status, value) => Some(*value),
            _ => None,
        })
        .unwrap();
    assert_eq!(last_status & LNKSTA_LT, 0, "{log:?}");
    assert_eq!(port.speed(), GEN1);
}

#[test]
fn a_port_with_the_erratum_gets_retrain_link_cleared_and_trains() {
    let port = ModelPort {
        erratum: true,
        ..ModelPort::new(GEN4, GEN4)
    };
    assert_eq!(retrain_port_link(&port, GEN1 as u8), Ok(Training::Done));
    assert_eq!(port.speed(), GEN1);
    assert_eq!(port.lnkctl.get() & LNKCTL_RL, 0, "Retrain Link left set");
    assert_eq!(port.tls(), GEN4);
}

#[test]
fn a_training_that_never_ends_times_out_and_still_undoes_its_changes() {
    let port = ModelPort {
        training_polls: u32::MAX,
        expires_after: 5,
        ..ModelPort::new(GEN4, GEN4)
    };
    // LBMS from an earlier change of the link: cleared all the same.
    port.lnksta.set(port.lnksta.get() | LNKSTA_LBMS);
    assert_eq!(retrain_port_link(&port, GEN1 as u8), Ok(Training::TimedOut));
    assert_eq!(port.tls(), GEN4);
    assert_eq!(port.lnksta.get() & LNKSTA_LBMS, 0);
}

#[test]
fn a_failed_config_access_still_puts_target_link_speed_back() {
    // Accesses: read LnkSta, read LnkCtl2, write LnkCtl2, write LnkCtl (fails).
    let port = ModelPort {
        fails_at: Some(3),
        ..ModelPort::new(GEN4, GEN4)
    };
    assert_eq!(retrain_port_link(&port, GEN1 as u8), Err(()));
    assert!(matches!(
        port.log.borrow()[3],
        Access::ClearAndSet(LinkRegister::Control, 0, LNKCTL_RL)
    ));
    assert_eq!(port.tls(), GEN4);
    assert!(port.writes().contains(&Access::ClearStatus(LNKSTA_LBMS)));
    // LnkCtl2 unreadable: nothing is written at all.
    let port = ModelPort {
        fails_at: Some(1),
        ..ModelPort::new(GEN4, GEN4)
    };
    assert_eq!(retrain_port_link(&port, GEN1 as u8), Err(()));
    assert!(port.writes().is_empty());
}
