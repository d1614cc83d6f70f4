//! WAIT's timing contract: the timeout, signals, and that a blocked wait
//! costs no CPU.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use nix::sys::{
    resource::{getrusage, UsageWho},
    signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal},
};
use pcieipc::device::{DeviceKind, WaitResult};

use super::common::{bound, open, CheckResult};

/// The device, vector and current count of a vector nobody rings.
fn quiet_vector() -> Result<(pcieipc::device::Device, u32, u32, u64), String> {
    let device = open()?;
    let target = bound(&device, DeviceKind::Ivshmem)?
        .into_iter()
        .next()
        .ok_or("no ivshmem-doorbell device bound")?;
    // The last vector of the first device: the ping-pong rings vector 0, the
    // other checks ring the second device.
    let vector = target
        .num_vectors
        .checked_sub(1)
        .ok_or("device without vectors")?;
    let count = device.counters(target.index).map_err(|e| e.to_string())?[vector as usize];
    Ok((device, target.index, vector, count))
}

/// `wait-timeout`: a wait of `timeout_ms` ends with ETIMEDOUT after
/// `timeout_ms` ± 50%; a zero timeout does not block.
pub fn timeout(timeout_ms: u64) -> CheckResult {
    let (device, index, vector, count) = quiet_vector()?;
    let start = Instant::now();
    let result = device
        .wait(
            index,
            vector,
            count,
            Some(Duration::from_millis(timeout_ms)),
        )
        .map_err(|e| e.to_string())?;
    let elapsed = start.elapsed();
    println!(
        "wait-timeout: {timeout_ms} ms asked, {:?} after {:.1} ms",
        result,
        elapsed.as_secs_f64() * 1e3
    );
    if result != WaitResult::TimedOut {
        return Err(format!("expected ETIMEDOUT, got {result:?}"));
    }
    let low = Duration::from_millis(timeout_ms / 2);
    let high = Duration::from_millis(timeout_ms * 3 / 2);
    if elapsed < low || elapsed > high {
        return Err(format!("{elapsed:?} is outside {low:?}..{high:?}"));
    }
    let start = Instant::now();
    let result = device
        .wait(index, vector, count, Some(Duration::ZERO))
        .map_err(|e| e.to_string())?;
    let elapsed = start.elapsed();
    println!(
        "wait-timeout: 0 ms asked, {result:?} after {:.3} ms",
        elapsed.as_secs_f64() * 1e3
    );
    if result != WaitResult::TimedOut || elapsed > Duration::from_millis(50) {
        return Err(format!("a zero timeout gave {result:?} after {elapsed:?}"));
    }
    Ok(())
}

extern "C" fn ignore_signal(_: i32) {}

/// `wait-eintr`: a signal (with a handler, no SA_RESTART) ends a wait
/// without a limit with EINTR, soon after it is sent.
pub fn eintr() -> CheckResult {
    let (device, index, vector, count) = quiet_vector()?;
    let action = SigAction::new(
        SigHandler::Handler(ignore_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler does nothing, which is async-signal-safe.
    unsafe { sigaction(Signal::SIGUSR1, &action) }.map_err(|e| e.to_string())?;
    // Another process sends it: this process has one thread, so the signal
    // reaches the waiting one.
    let delay = Duration::from_millis(300);
    let mut sender = Command::new("sh")
        .arg("-c")
        .arg(format!("sleep 0.3; kill -USR1 {}", std::process::id()))
        .spawn()
        .map_err(|e| format!("sh: {e}"))?;
    let start = Instant::now();
    let result = device
        .wait(index, vector, count, None)
        .map_err(|e| e.to_string())?;
    let elapsed = start.elapsed();
    let status = sender.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the signal sender failed: {status}"));
    }
    println!(
        "wait-eintr: {result:?} after {:.1} ms (signal sent at 300 ms)",
        elapsed.as_secs_f64() * 1e3
    );
    if result != WaitResult::Interrupted {
        return Err(format!("expected EINTR, got {result:?}"));
    }
    if elapsed < delay || elapsed > delay + Duration::from_secs(1) {
        return Err(format!(
            "woke after {elapsed:?}, the signal came at {delay:?}"
        ));
    }
    Ok(())
}

/// CPU time (user + system) of this process so far.
fn cpu_time() -> Result<Duration, String> {
    let usage = getrusage(UsageWho::RUSAGE_SELF).map_err(|e| e.to_string())?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    Ok(tv(usage.user_time()) + tv(usage.system_time()))
}

/// `cpu-time-child`: one side of `cpu-time`: blocks in a wait of `ms`, or
/// spins reading the counters for `ms`; prints its CPU time in microseconds.
pub fn cpu_time_child(spin: bool, ms: u64) -> CheckResult {
    let (device, index, vector, count) = quiet_vector()?;
    let limit = Duration::from_millis(ms);
    let before = cpu_time()?;
    if spin {
        // A reader that polls instead of sleeping: what WAIT replaces.
        let start = Instant::now();
        while start.elapsed() < limit {
            let counts = device.counters(index).map_err(|e| e.to_string())?;
            if counts[vector as usize] > count {
                return Err("the quiet vector was rung".into());
            }
        }
    } else {
        let result = device
            .wait(index, vector, count, Some(limit))
            .map_err(|e| e.to_string())?;
        if result != WaitResult::TimedOut {
            return Err(format!("expected ETIMEDOUT, got {result:?}"));
        }
    }
    println!("{}", (cpu_time()? - before).as_micros());
    Ok(())
}

/// `cpu-time`: a process blocked in a 2-second wait and a spinning reader
/// run over the same 2 seconds; the waiter's CPU time must be under 5% of
/// the spinner's.
pub fn cpu_time_compare(ms: u64) -> CheckResult {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let spawn = |mode: &str| {
        Command::new(&me)
            .args(["cpu-time-child", mode, "--ms", &ms.to_string()])
            .output()
    };
    let (waiter, spinner) = std::thread::scope(|s| {
        let waiter = s.spawn(|| spawn("wait"));
        let spinner = s.spawn(|| spawn("spin"));
        (waiter.join(), spinner.join())
    });
    let micros = |out: std::thread::Result<std::io::Result<std::process::Output>>, name: &str| {
        let out = out
            .map_err(|_| format!("{name}: thread panicked"))?
            .map_err(|e| format!("{name}: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() {
            return Err(format!(
                "{name}: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        text.parse::<u64>()
            .map_err(|e| format!("{name}: {text:?}: {e}"))
    };
    let waiter_us = micros(waiter, "waiter")?;
    let spinner_us = micros(spinner, "spinner")?;
    let percent = waiter_us as f64 * 100.0 / spinner_us.max(1) as f64;
    println!(
        "cpu-time: over {ms} ms, the blocked waiter used {waiter_us} us of CPU, the spinning reader \
         {spinner_us} us: {percent:.2}%"
    );
    if percent >= 5.0 {
        return Err(format!("{percent:.2}% is not under 5%"));
    }
    Ok(())
}
