//! The ivshmem ping-pong: 2 to 4 processes, one per ivshmem-doorbell device
//! of one shared region, pass a message around the circle. Member i waits on
//! its device's vector 0, checks the pattern in its slot of the shared
//! window, writes the next member's pattern into that member's slot and rings
//! the next member's doorbell. One trip around the circle is a round.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use pcieipc::device::{Device, DeviceKind, MappedWindow, WaitResult};

use super::common::{bound, open, shared_bar_size, CheckResult};

const SLOT: usize = 4096;
const MESSAGE: usize = 256;
const VECTOR: u16 = 0;
const WAIT_LIMIT: Duration = Duration::from_secs(10);

/// The message of `round` for member `to`: the round number, then bytes that
/// depend on both, so a stale or misplaced message is caught.
fn pattern(round: u64, to: usize) -> [u8; MESSAGE] {
    let mut message = [0u8; MESSAGE];
    message[..8].copy_from_slice(&round.to_le_bytes());
    for (k, byte) in message.iter_mut().enumerate().skip(8) {
        *byte = (round as usize).wrapping_mul(31).wrapping_add(to * 7 + k) as u8;
    }
    message
}

/// One member: waits for its message, checks it, passes the next one on.
struct Member {
    device: Device,
    index: u32,
    window: MappedWindow,
    /// The interrupt count of vector 0 before the first round.
    base: u64,
}

impl Member {
    fn new(position: usize) -> Result<Self, String> {
        let device = open()?;
        let devices = bound(&device, DeviceKind::Ivshmem)?;
        let me = devices.get(position).ok_or("no such member")?;
        let size = shared_bar_size(me)?;
        let window = device
            .map_bar(me.index, 2, 0, size)
            .map_err(|e| e.to_string())?;
        let base = device.counters(me.index).map_err(|e| e.to_string())?[VECTOR as usize];
        Ok(Member {
            index: me.index,
            device,
            window,
            base,
        })
    }

    /// Waits for the message of `round` and checks it.
    fn receive(&self, position: usize, round: u64) -> CheckResult {
        let last_seen = self.base + round;
        match self
            .device
            .wait(self.index, u32::from(VECTOR), last_seen, Some(WAIT_LIMIT))
            .map_err(|e| e.to_string())?
        {
            WaitResult::Interrupt(count) if count == last_seen + 1 => {}
            other => {
                return Err(format!(
                    "member {position} round {round}: wait gave {other:?}, expected count {}",
                    last_seen + 1
                ))
            }
        }
        let mut got = [0u8; MESSAGE];
        self.window.read(position * SLOT, &mut got);
        if got != pattern(round, position) {
            return Err(format!(
                "member {position} round {round}: wrong pattern in the shared window"
            ));
        }
        Ok(())
    }

    /// Writes the message of `round` for member `to` and rings its doorbell.
    fn send(&self, to: usize, peer: u16, round: u64) -> CheckResult {
        self.window.write(to * SLOT, &pattern(round, to));
        self.device
            .ring(self.index, peer, VECTOR)
            .map_err(|e| e.to_string())
    }
}

/// The peer ids of the members, in member order.
fn peers() -> Result<Vec<u16>, String> {
    let device = open()?;
    bound(&device, DeviceKind::Ivshmem)?
        .iter()
        .map(|d| {
            d.peer_id
                .map(|p| p as u16)
                .ok_or_else(|| format!("device {} has no peer id", d.index))
        })
        .collect()
}

/// `pcieipc-guest ping-pong-member`: member `position` (> 0) of a run.
pub fn member(position: usize, members: usize, rounds: u64) -> CheckResult {
    let all = peers()?;
    let peers = all.get(..members).ok_or("fewer devices than members")?;
    let member = Member::new(position)?;
    let next = (position + 1) % peers.len();
    // Tell the leader that the baseline is taken.
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    for round in 0..rounds {
        member.receive(position, round)?;
        member.send(next, peers[next], round)?;
    }
    Ok(())
}

/// `pcieipc-guest ping-pong`: the leader (member 0) of `members` processes.
pub fn run(members: usize, rounds: u64) -> CheckResult {
    let peers = peers()?;
    if !(2..=4).contains(&members) || members > peers.len() {
        return Err(format!(
            "{members} members asked, {} ivshmem-doorbell devices bound (2 to 4 needed)",
            peers.len()
        ));
    }
    let peers = &peers[..members];
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    for position in 1..members {
        let mut child = Command::new(&me)
            .args(["ping-pong-member", "--position", &position.to_string()])
            .args([
                "--members",
                &members.to_string(),
                "--rounds",
                &rounds.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or("no stdout")?)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            return Err(format!("member {position} did not start: {line:?}"));
        }
        children.push(child);
    }
    let leader = Member::new(0)?;
    let mut rtts = Vec::with_capacity(rounds as usize);
    let start = Instant::now();
    for round in 0..rounds {
        let sent = Instant::now();
        leader.send(1, peers[1], round)?;
        leader.receive(0, round)?;
        rtts.push(sent.elapsed());
    }
    let total = start.elapsed();
    for (position, mut child) in children.into_iter().enumerate() {
        let status = child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("member {} failed: {status}", position + 1));
        }
    }
    rtts.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "ping-pong: {members} processes on {members} ivshmem-doorbell devices, {rounds} round trips \
         verified in {:.2} s: RTT mean {:.1} us, p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        total.as_secs_f64(),
        us(total) / rounds as f64,
        us(rtts[rtts.len() / 2]),
        us(rtts[rtts.len() * 99 / 100]),
        us(rtts[rtts.len() - 1]),
    );
    Ok(())
}
