// SPDX-License-Identifier: GPL-2.0

//! The event log behind `read()` on /dev/pcieipc: a ring of the newest
//! events, one cursor per open file, and an explicit overflow record for a
//! reader that fell behind (never a silent gap).

use kernel::{
    new_mutex, new_poll_condvar,
    prelude::*,
    sync::{poll::PollCondVar, Mutex},
    time::{ClockSource, Monotonic},
};

use crate::uapi::{self, pcieipc_event};

const CAPACITY: usize = uapi::PCIEIPC_EVENT_RING_CAPACITY as usize;

struct Ring {
    /// Event `seq` lives in slot `seq % CAPACITY`.
    slots: KVec<pcieipc_event>,
    next_seq: u64,
}

impl Ring {
    fn oldest_seq(&self) -> u64 {
        self.next_seq.saturating_sub(CAPACITY as u64)
    }
}

#[pin_data]
pub(crate) struct EventLog {
    #[pin]
    ring: Mutex<Ring>,
    /// Signalled on every new event; readers and pollers wait on it.
    #[pin]
    readable: PollCondVar,
}

/// Monotonic time in nanoseconds (CLOCK_MONOTONIC, as the header says).
fn now_ns() -> u64 {
    Monotonic::ktime_get() as u64
}

impl EventLog {
    pub(crate) fn new() -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            ring <- new_mutex!(Ring {
                slots: KVec::with_capacity(CAPACITY, GFP_KERNEL)?,
                next_seq: 0,
            }),
            readable <- new_poll_condvar!("pcieipc_events"),
        })
    }

    /// Appends an event (its `seq` and `timestamp_ns` are set here) and wakes
    /// readers. Overwrites the oldest event once the ring is full.
    pub(crate) fn emit(&self, mut event: pcieipc_event) {
        let mut ring = self.ring.lock();
        event.seq = ring.next_seq;
        event.timestamp_ns = now_ns();
        let slot = (event.seq % CAPACITY as u64) as usize;
        if ring.slots.len() < CAPACITY {
            // The ring's capacity was reserved at creation: no allocation.
            if ring.slots.push_within_capacity(event).is_err() {
                return;
            }
        } else {
            ring.slots[slot] = event;
        }
        ring.next_seq += 1;
        drop(ring);
        self.readable.notify_all();
    }

    /// Where a new reader starts: the oldest event kept.
    pub(crate) fn first_cursor(&self) -> u64 {
        self.ring.lock().oldest_seq()
    }

    /// Events emitted since load: the `seq` of the next one.
    pub(crate) fn emitted(&self) -> u64 {
        self.ring.lock().next_seq
    }

    /// Whether a reader at `cursor` has something to read.
    pub(crate) fn readable_at(&self, cursor: u64) -> bool {
        cursor < self.ring.lock().next_seq
    }

    pub(crate) fn poll_condvar(&self) -> &PollCondVar {
        &self.readable
    }

    /// Sleeps until a reader at `cursor` has something to read; a signal
    /// gives ERESTARTSYS. The caller holds no lock of its own meanwhile (its
    /// cursor may move: it takes with `take` and waits again if another
    /// reader of the file got there first).
    pub(crate) fn wait_readable(&self, cursor: u64) -> Result {
        let mut ring = self.ring.lock();
        while cursor >= ring.next_seq {
            if self.readable.wait_interruptible(&mut ring) {
                return Err(ERESTARTSYS);
            }
        }
        Ok(())
    }

    /// Takes up to `max` (>= 1) records for the reader at `cursor` and
    /// advances it, or EAGAIN when there is none (never blocks). A reader
    /// whose cursor fell out of the ring first gets an OVERFLOW record with
    /// the number of events it lost.
    pub(crate) fn take(&self, cursor: &mut u64, max: usize) -> Result<KVec<pcieipc_event>> {
        let ring = self.ring.lock();
        if *cursor >= ring.next_seq {
            return Err(EAGAIN);
        }
        let mut out = KVec::with_capacity(max.min(CAPACITY + 1), GFP_KERNEL)?;
        let oldest = ring.oldest_seq();
        if *cursor < oldest {
            out.push(
                pcieipc_event {
                    seq: *cursor,
                    timestamp_ns: now_ns(),
                    kind: uapi::PCIEIPC_EVENT_OVERFLOW,
                    bdf: uapi::PCIEIPC_BDF_NONE,
                    lost: oldest - *cursor,
                    ..Default::default()
                },
                GFP_KERNEL,
            )?;
            *cursor = oldest;
        }
        while out.len() < max && *cursor < ring.next_seq {
            out.push(ring.slots[(*cursor % CAPACITY as u64) as usize], GFP_KERNEL)?;
            *cursor += 1;
        }
        Ok(out)
    }
}
