//! A thread asleep on the peers' pidfds: a peer whose process exits has its
//! rank written into the failure report, which every waiting kernel block
//! reads now and then, so the kernels end at once instead of at their
//! timeout and the communicator reports `PeerDied`.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use nix::sys::eventfd::{EfdFlags, EventFd};

use super::report::FailureReport;
use crate::engine::transport::PeerWatch;

pub(super) struct Watchdog {
    stop: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub(super) fn start(watch: PeerWatch, report: Arc<FailureReport>) -> std::io::Result<Watchdog> {
        let stop = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)?;
        let wake = stop.as_fd().try_clone_to_owned()?;
        let thread = std::thread::Builder::new()
            .name("pcieipc-watchdog".into())
            .spawn(move || {
                if let Some((peer, _pid)) = watch.wait_for_exit(wake.as_fd()) {
                    report.peer_exited(peer);
                }
            })?;
        Ok(Watchdog {
            stop: stop.into(),
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // An eventfd counter of 1 makes it readable: the thread wakes and ends.
        let _ = nix::unistd::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
