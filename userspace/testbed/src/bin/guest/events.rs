//! Event readers: a `read()` blocked waiting for events sleeps without the
//! file's cursor lock, so `poll` on that file answers at once and a second
//! reader of the file sleeps interruptibly too.

use std::{
    os::fd::AsFd,
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use pcieipc::{
    device::{Device, DeviceKind},
    probe::Bdf,
};

use super::common::{bound, open, CheckResult};

/// What a blocked reader thread reports: its thread id, then its read.
enum Report {
    Started(i32),
    Read(Result<usize, nix::errno::Errno>),
}

/// Whether `device` has an event to read now.
fn readable(device: &Device, timeout_ms: u16) -> Result<bool, String> {
    let mut fds = [PollFd::new(device.as_fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::from(timeout_ms)).map_err(|e| format!("poll: {e}"))?;
    Ok(ready > 0)
}

/// The scheduler state of thread `tid` of this process ('S' sleeps
/// interruptibly, 'D' uninterruptibly).
fn thread_state(tid: i32) -> Result<char, String> {
    let path = format!("/proc/self/task/{tid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .ok_or_else(|| format!("{path}: no state in {stat:?}"))
}

/// `events-blocked-read`: two threads block in `read()` on one open file;
/// meanwhile poll must time out promptly (no event) and both readers must
/// sleep interruptibly. Two LINK_RETRAIN events (edu's link) release them.
pub fn blocked_read() -> CheckResult {
    let device = open()?;
    let edu = bound(&device, DeviceKind::Edu)?
        .into_iter()
        .next()
        .ok_or("no edu device bound")?;
    let bdf = edu
        .bdf
        .parse::<Bdf>()
        .map_err(|e| e.to_string())?
        .to_abi()
        .map_err(|e| e.to_string())?;
    let mut record = vec![0u8; size_of::<pcieipc_uapi::pcieipc_event>()];
    while readable(&device, 0)? {
        nix::unistd::read(device.as_fd(), &mut record).map_err(|e| format!("read: {e}"))?;
    }
    thread::scope(|scope| {
        let (reports, received) = mpsc::channel();
        for _ in 0..2 {
            let reports = reports.clone();
            let device = &device;
            scope.spawn(move || {
                let _ = reports.send(Report::Started(nix::unistd::gettid().as_raw()));
                let mut record = vec![0u8; size_of::<pcieipc_uapi::pcieipc_event>()];
                let _ = reports.send(Report::Read(nix::unistd::read(device.as_fd(), &mut record)));
            });
        }
        let mut tids = Vec::new();
        while tids.len() < 2 {
            match received.recv_timeout(Duration::from_secs(5)) {
                Ok(Report::Started(tid)) => tids.push(tid),
                Ok(Report::Read(r)) => {
                    return Err(format!("a reader returned with no event: {r:?}"))
                }
                Err(e) => return Err(format!("reader threads did not start: {e}")),
            }
        }
        thread::sleep(Duration::from_millis(300));
        let states = tids
            .iter()
            .map(|&tid| thread_state(tid))
            .collect::<Result<Vec<_>, _>>()?;
        println!("events: two readers blocked in read(), thread states {states:?}");
        // Poll in a thread of its own: on a module that sleeps with the
        // cursor lock it hangs until an event arrives.
        let (polled, poll_result) = mpsc::channel();
        let device_ref = &device;
        scope.spawn(move || {
            let start = Instant::now();
            let _ = polled.send((readable(device_ref, 100), start.elapsed()));
        });
        let poll_outcome = poll_result.recv_timeout(Duration::from_secs(2));
        println!("events: poll(100 ms) while readers block: {poll_outcome:?}");
        // Release every blocked thread, whatever the outcome.
        for _ in 0..2 {
            device
                .retrain(bdf, None, None)
                .map_err(|e| format!("retrain {}: {e}", edu.bdf))?;
        }
        let mut reads = Vec::new();
        while reads.len() < 2 {
            match received.recv_timeout(Duration::from_secs(10)) {
                Ok(Report::Read(r)) => reads.push(r),
                Ok(Report::Started(_)) => {}
                Err(e) => return Err(format!("readers not released by two events: {e}")),
            }
        }
        println!("events: after two LINK_RETRAIN events the readers returned {reads:?}");
        match poll_outcome {
            Ok((Ok(false), elapsed)) if elapsed < Duration::from_secs(1) => {}
            other => return Err(format!("poll must time out after 100 ms, got {other:?}")),
        }
        if states.iter().any(|&s| s != 'S') {
            return Err(format!(
                "blocked readers must sleep interruptibly ('S'), got {states:?}"
            ));
        }
        if reads.iter().any(|r| *r != Ok(record.len())) {
            return Err(format!("each reader must get one record, got {reads:?}"));
        }
        Ok(())
    })
}
