//! Reading a peer's process memory with `process_vm_readv`: the ranks of
//! the shm transport share a host and a user, so a finished chunk can be
//! copied once, straight from where its owner keeps it.

use std::collections::BTreeSet;

/// The peers of each communicator of this process that lets them read it,
/// by the `Permission` that holds them.
static READERS: std::sync::Mutex<Vec<(u64, Vec<u32>)>> = std::sync::Mutex::new(Vec::new());
static NEXT_PERMISSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Who Yama lets read this process (ptrace_scope 1), besides its ancestors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ptracer {
    /// Nobody more (the process's default).
    Nobody,
    /// This process and its descendants.
    Pid(u32),
    /// Any process of the same user.
    Any,
}

/// The narrowest `Ptracer` that lets every one of `peers` read: one peer
/// itself; several, their nearest common ancestor (the launcher whose
/// descendants they are: torchrun, mpirun, `pcieipc bench`), since Yama
/// keeps one tracer per process and lets its descendants trace too; any
/// process when they have none short of init, or a parent cannot be read.
/// `parent_of` gives a process's parent pid.
fn ptracer_for(peers: &BTreeSet<u32>, parent_of: impl Fn(u32) -> Option<u32>) -> Ptracer {
    const MAX_DEPTH: usize = 64;
    let ancestry = |pid: u32| -> Option<Vec<u32>> {
        let mut chain = vec![pid];
        while let Some(&last) = chain.last().filter(|&&last| last > 1) {
            if chain.len() > MAX_DEPTH {
                return None;
            }
            chain.push(parent_of(last)?);
        }
        Some(chain)
    };
    let mut peers = peers.iter();
    let Some(&first) = peers.next() else {
        return Ptracer::Nobody;
    };
    let Some(mut common) = ancestry(first) else {
        return Ptracer::Any;
    };
    for &peer in peers {
        let Some(chain) = ancestry(peer) else {
            return Ptracer::Any;
        };
        common.retain(|pid| chain.contains(pid));
    }
    match common.first() {
        Some(&pid) if pid > 1 => Ptracer::Pid(pid),
        _ => Ptracer::Any,
    }
}

/// Process `pid`'s parent, from /proc/PID/stat (its fourth field, after
/// the command name in parentheses, which may itself hold any character).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

fn set_ptracer(ptracer: Ptracer) {
    let who = match ptracer {
        Ptracer::Nobody => 0,
        Ptracer::Pid(pid) => libc::c_ulong::from(pid),
        Ptracer::Any => libc::PR_SET_PTRACER_ANY as libc::c_ulong,
    };
    // SAFETY: PR_SET_PTRACER takes a pid, 0 or PR_SET_PTRACER_ANY and
    // touches no memory of ours. Without Yama it fails, and nothing needs
    // allowing or withdrawing.
    unsafe {
        libc::prctl(libc::PR_SET_PTRACER, who, 0, 0, 0);
    }
}

/// Sets the ptracer for the peers of every `Permission` that lives.
fn update_ptracer(readers: &[(u64, Vec<u32>)]) {
    let own = std::process::id();
    let peers: BTreeSet<u32> = readers
        .iter()
        .flat_map(|(_, peers)| peers.iter().copied())
        .filter(|&pid| pid != own)
        .collect();
    set_ptracer(ptracer_for(&peers, parent_of));
}

/// The peers of one communicator may read this process's memory under
/// Yama's ptrace_scope 1 while a `Permission` lives (with those of the
/// other communicators of the process); when the last one drops, nobody
/// may again (the process's default).
pub(super) struct Permission(u64);

impl Permission {
    pub(super) fn acquire(peers: &[u32]) -> Permission {
        let id = NEXT_PERMISSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut readers = READERS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        readers.push((id, peers.to_vec()));
        update_ptracer(&readers);
        Permission(id)
    }
}

impl Drop for Permission {
    fn drop(&mut self) {
        let mut readers = READERS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        readers.retain(|(id, _)| *id != self.0);
        update_ptracer(&readers);
    }
}

/// Whether some communicator of this process lets its peers read it.
#[cfg(test)]
pub(crate) fn allowed() -> bool {
    !READERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .is_empty()
}

/// Copies `local.len()` bytes at `remote` in process `pid` into `local`.
pub(super) fn read(pid: u32, remote: u64, local: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < local.len() {
        let local_iov = libc::iovec {
            iov_base: local[done..].as_mut_ptr().cast(),
            iov_len: local.len() - done,
        };
        let remote_iov = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: local.len() - done,
        };
        // SAFETY: the local iovec covers the rest of `local`, which we hold
        // mutably; the remote one is only read, by the kernel, which checks it.
        let read =
            unsafe { libc::process_vm_readv(pid as libc::pid_t, &local_iov, 1, &remote_iov, 1, 0) };
        match read {
            ..0 => return Err(std::io::Error::last_os_error()),
            0 => return Err(std::io::Error::from_raw_os_error(libc::EFAULT)),
            read => done += read as usize,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{CommOptions, Communicator};

    /// Two ranks as threads of this process: whether peers may read it
    /// while they live, and after they are dropped.
    fn permission_during_and_after(both_willing: bool) -> (bool, bool, bool) {
        let name = format!("ptracer-{}-{both_willing}", std::process::id());
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let name = name.clone();
                std::thread::spawn(move || {
                    let options = CommOptions {
                        single_copy: rank == 0 || both_willing,
                        ..CommOptions::default()
                    };
                    Communicator::init(&name, rank, 2, options).expect("init")
                })
            })
            .collect();
        let communicators: Vec<Communicator> =
            ranks.into_iter().map(|rank| rank.join().unwrap()).collect();
        let during = allowed();
        let agreed = communicators[0].single_copy();
        drop(communicators);
        (during, agreed, allowed())
    }

    #[test]
    fn the_ptracer_is_the_narrowest_that_lets_every_peer_read() {
        // 1 <- 10 (a shell) <- 100 (the launcher) <- 101, 102, 103 (ranks);
        // 1 <- 20 <- 200 (another job's rank); 300's parent cannot be read.
        let parents = [
            (10, 1),
            (100, 10),
            (101, 100),
            (102, 100),
            (103, 100),
            (20, 1),
            (200, 20),
        ];
        let parent_of = |pid: u32| parents.iter().find(|(p, _)| *p == pid).map(|(_, up)| *up);
        let ptracer = |peers: &[u32]| ptracer_for(&peers.iter().copied().collect(), parent_of);
        assert_eq!(ptracer(&[]), Ptracer::Nobody);
        assert_eq!(ptracer(&[102]), Ptracer::Pid(102));
        assert_eq!(ptracer(&[102, 103]), Ptracer::Pid(100));
        assert_eq!(ptracer(&[101, 102, 103]), Ptracer::Pid(100));
        // A rank that launched the others is their common ancestor itself.
        assert_eq!(ptracer(&[100, 103]), Ptracer::Pid(100));
        assert_eq!(ptracer(&[103, 200]), Ptracer::Any);
        assert_eq!(ptracer(&[103, 300]), Ptracer::Any);
    }

    #[test]
    fn a_parent_is_read_from_proc_stat() {
        let parent = parent_of(std::process::id()).expect("this process's parent");
        assert_eq!(parent, std::os::unix::process::parent_id());
    }

    #[test]
    fn peers_may_read_this_process_only_while_a_communicator_reads_peers() {
        assert_eq!(permission_during_and_after(true), (true, true, false));
        // One rank unwilling: the probe fails for all, and the rank that had
        // allowed reads withdraws them at once.
        assert_eq!(permission_during_and_after(false), (false, false, false));
    }
}
