//! Reading peers' memory, where the transport has peer reads: agreeing at
//! init that every rank may, and reads that tell a peer that is leaving or
//! dead from one whose buffer can never be read.

use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use super::peers::Peers;
use crate::engine::dtype::{bytes_of_mut, Element};
use crate::engine::error::EngineError;
use crate::engine::failure::Failure;
use crate::engine::transport::Signal;

/// How long a read of a live peer's memory may keep failing before the peer's
/// buffer counts as unreadable: long enough for a peer that is tearing down
/// (its buffers freed a moment before its communicator) to show as departed
/// or dead first.
const UNREADABLE_GRACE: Duration = Duration::from_millis(20);

impl Peers {
    /// Decides, with every other rank, whether ranks read finished data
    /// straight from each other's memory. Each rank publishes a probe word
    /// (its own address in its process), reads its predecessor's back, and
    /// posts whether that worked; peer reads are on only if they worked for
    /// every rank and every rank asks for the same message sizes. A host
    /// that forbids them (Yama's ptrace_scope 2 or 3, a container's seccomp
    /// policy), a rank started with `single_copy: false`, or a transport
    /// without peer reads makes every rank use the relay slots.
    pub(crate) fn agree_on_peer_reads(
        &mut self,
        willing: bool,
        single_copy_messages: &RangeInclusive<usize>,
        direct_messages: &RangeInclusive<usize>,
    ) -> Result<bool, EngineError> {
        if self.nranks == 1 || !self.transport.capabilities().peer_reads {
            return Ok(false);
        }
        let messages = [
            *single_copy_messages.start() as u64,
            *single_copy_messages.end() as u64,
            *direct_messages.start() as u64,
            *direct_messages.end() as u64,
        ];
        let willing = willing && self.transport.publish_probe(messages);
        self.transport
            .store(self.rank, Signal::Probed, if willing { 1 } else { 3 });
        let predecessor = self.predecessor();
        let mut able = false;
        if willing {
            self.wait_for(predecessor, predecessor, Signal::Probed, 1)?;
            let (address, _) = self.transport.probe(predecessor);
            if self.transport.load(predecessor, Signal::Probed) != 3 && address != 0 {
                let mut word = [0u8; 8];
                able = self
                    .transport
                    .read_peer(predecessor, address, &mut word)
                    .is_ok()
                    && u64::from_ne_bytes(word) == address;
            }
        }
        self.transport
            .store(self.rank, Signal::Probed, if able { 2 } else { 3 });
        let mut everyone = able;
        let rank = self.rank;
        for peer in (0..self.nranks).filter(|peer| *peer != rank) {
            self.wait_for(peer, peer, Signal::Probed, 2)?;
            everyone &= self.transport.load(peer, Signal::Probed) == 2
                && self.transport.probe(peer).1 == messages;
        }
        if !everyone {
            self.transport.end_peer_reads();
        }
        Ok(everyone)
    }

    /// Reads `output.len()` elements at `address` in `owner`'s process into
    /// `output`. The owner keeps that memory as it is until we say we are
    /// done with it (the ring's all-gather: by acknowledging the message that
    /// named it; direct: by posting the call's next round). A read that fails
    /// usually means the owner is exiting (`ESRCH` once its memory is gone):
    /// the liveness checks then name it, as they do for any wait. A live
    /// owner whose memory still cannot be read after `UNREADABLE_GRACE`
    /// (`EFAULT`: a buffer in a device mapping, which the kernel will not
    /// pin) fails the job at once with `PeerMemoryUnreadable`, instead of
    /// after `peer_timeout` as an unresponsive peer it is not.
    pub(crate) fn read_peer<T: Element>(
        &self,
        owner: usize,
        address: u64,
        output: &mut [T],
    ) -> Result<(), EngineError> {
        let bytes = bytes_of_mut(output);
        let transport = &self.transport;
        let Err(mut error) = transport.read_peer(owner, address, bytes) else {
            return Ok(());
        };
        let started = Instant::now();
        loop {
            if let Some(failure) = transport.failure() {
                return Err(failure.into());
            }
            if let Some((rank, pid)) = transport
                .dead_peers()
                .into_iter()
                .find(|(rank, _)| !transport.departed(*rank))
            {
                return Err(transport.abort(Failure::PeerDied { rank, pid }).into());
            }
            if transport.departed(owner) {
                return Err(transport.abort(Failure::PeerLeft { rank: owner }).into());
            }
            let waited = started.elapsed();
            let errno = error.raw_os_error().unwrap_or(0);
            if errno != libc::ESRCH && waited >= UNREADABLE_GRACE {
                return Err(transport
                    .abort(Failure::PeerMemoryUnreadable {
                        rank: self.rank,
                        owner,
                        errno,
                    })
                    .into());
            }
            if waited >= self.policy.peer_timeout {
                return Err(transport
                    .abort(Failure::PeerUnresponsive {
                        rank: owner,
                        waited,
                    })
                    .into());
            }
            std::thread::sleep(Duration::from_millis(1));
            match transport.read_peer(owner, address, bytes) {
                Ok(()) => return Ok(()),
                Err(again) => error = again,
            }
        }
    }
}
