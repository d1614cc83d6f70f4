//! The QEMU PCIe testbed: boots the testbed kernel on a PCIe fabric described
//! by a topology file (docs/topology-format.md), with an initramfs holding
//! busybox, the module and the guest programs; serves the guest's requests to
//! the host (AER injection, hot-unplug over QMP); runs a guest script under a
//! time limit and returns its exit status and the guest kernel's log verdict.

pub mod fabric;
pub mod initramfs;
pub mod qmp;
pub mod run;
pub mod topology;
pub mod tree;
