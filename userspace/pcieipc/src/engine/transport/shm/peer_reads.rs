//! Reading a peer's process memory with `process_vm_readv`: the ranks of
//! the shm transport share a host and a user, so a finished chunk can be
//! copied once, straight from where its owner keeps it.

/// How many communicators of this process let their peers read it.
static HOLDERS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);

fn set_ptracer(who: libc::c_ulong) {
    // SAFETY: PR_SET_PTRACER takes a pid, 0 or PR_SET_PTRACER_ANY and
    // touches no memory of ours. Without Yama it fails, and nothing needs
    // allowing or withdrawing.
    unsafe {
        libc::prctl(libc::PR_SET_PTRACER, who, 0, 0, 0);
    }
}

/// Any process of ours may read this one's memory under Yama's
/// ptrace_scope 1 while a `Permission` lives; when the last one of the
/// process drops, nobody may again (the process's default).
pub(super) struct Permission(());

impl Permission {
    pub(super) fn acquire() -> Permission {
        let mut holders = HOLDERS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if *holders == 0 {
            set_ptracer(libc::PR_SET_PTRACER_ANY as libc::c_ulong);
        }
        *holders += 1;
        Permission(())
    }
}

impl Drop for Permission {
    fn drop(&mut self) {
        let mut holders = HOLDERS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *holders -= 1;
        if *holders == 0 {
            set_ptracer(0);
        }
    }
}

/// Whether some communicator of this process lets its peers read it.
#[cfg(test)]
pub(crate) fn allowed() -> bool {
    *HOLDERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        > 0
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
    fn peers_may_read_this_process_only_while_a_communicator_reads_peers() {
        assert_eq!(permission_during_and_after(true), (true, true, false));
        // One rank unwilling: the probe fails for all, and the rank that had
        // allowed reads withdraws them at once.
        assert_eq!(permission_during_and_after(false), (false, false, false));
    }
}
