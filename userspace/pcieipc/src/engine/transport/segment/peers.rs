//! Peer liveness: the ranks share a host, so each watches the others'
//! processes through a pidfd each.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::engine::failure::Failure;

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The peers' processes, watched through a pidfd each.
#[derive(Default)]
pub(crate) struct PeerWatch {
    /// One per rank; `None` for this rank.
    pidfds: Vec<Option<OwnedFd>>,
    pids: Vec<u32>,
}

impl PeerWatch {
    /// Watches every rank of `pids` but `rank`; a peer that cannot be watched
    /// has already exited.
    pub(crate) fn open(rank: usize, pids: Vec<u32>) -> Result<PeerWatch, Failure> {
        let mut pidfds = Vec::with_capacity(pids.len());
        for (peer, pid) in pids.iter().enumerate() {
            if peer == rank {
                pidfds.push(None);
                continue;
            }
            let pidfd = pidfd_open(*pid).map_err(|_| Failure::PeerDied {
                rank: peer,
                pid: *pid,
            })?;
            pidfds.push(Some(pidfd));
        }
        Ok(PeerWatch { pidfds, pids })
    }

    pub(crate) fn pid(&self, rank: usize) -> u32 {
        self.pids[rank]
    }

    /// Every rank's pid (the kernel's, from the rendezvous).
    pub(crate) fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Sleeps until a peer's process exits (returning it) or `stop` becomes
    /// readable (returning `None`). Never spins.
    pub(crate) fn wait_for_exit(&self, stop: BorrowedFd<'_>) -> Option<(usize, u32)> {
        // With no timeout, nothing exited means poll failed: give up too.
        self.poll_exits(Some(stop), PollTimeout::NONE)?
            .first()
            .copied()
    }

    pub(crate) fn dead(&self) -> Vec<(usize, u32)> {
        self.poll_exits(None, PollTimeout::ZERO).unwrap_or_default()
    }

    /// Polls the peers' pidfds (one polls readable once its process has
    /// exited), and `stop` when given, for up to `timeout`: the exited peers
    /// with their pids, or `None` when `stop` became readable.
    fn poll_exits(
        &self,
        stop: Option<BorrowedFd<'_>>,
        timeout: PollTimeout,
    ) -> Option<Vec<(usize, u32)>> {
        let watched: Vec<(usize, &OwnedFd)> = self
            .pidfds
            .iter()
            .enumerate()
            .filter_map(|(peer, pidfd)| pidfd.as_ref().map(|pidfd| (peer, pidfd)))
            .collect();
        let mut fds: Vec<PollFd> = watched
            .iter()
            .map(|(_, pidfd)| PollFd::new(pidfd.as_fd(), PollFlags::POLLIN))
            .collect();
        fds.extend(stop.map(|stop| PollFd::new(stop, PollFlags::POLLIN)));
        let ready = loop {
            match poll(&mut fds, timeout) {
                Err(nix::errno::Errno::EINTR) => continue,
                result => break result.unwrap_or(0),
            }
        };
        if ready <= 0 {
            return Some(Vec::new());
        }
        let readable = |fd: &PollFd| fd.revents().is_some_and(|revents| !revents.is_empty());
        if stop.is_some() && fds.last().is_some_and(readable) {
            return None;
        }
        Some(
            fds.iter()
                .zip(&watched)
                .filter(|(fd, _)| readable(fd))
                .map(|(_, (peer, _))| (*peer, self.pids[*peer]))
                .collect(),
        )
    }
}
