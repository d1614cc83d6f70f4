//! What one rank queues for a two-shot launch moved by the copy engines
//! (`copy_engines`), as a list of steps on named streams: the copies, the
//! flag kernels between them, the reductions and the events that order
//! the streams. Pure: `copy_engines` turns each step into a driver call,
//! and the tests run every rank's steps in a model of streams, events and
//! flags under many interleavings (`simulator`), so the order the copies
//! rely on is checked without a GPU.
//!
//! Per chunk of the launch (`plan::CopyChunks`), rank r:
//! - to the host (one stream): r's part of each owner's segment into that
//!   owner's inbox, then flag 0 of the chunk; later, once the chunk of r's
//!   own segment is reduced, the result into every peer's result slot, then
//!   flag 1;
//! - from the host (the other): wait for every peer's flag 0, their parts
//!   of r's segment into device staging, reduce into r's output; wait for
//!   every peer's flag 1, their results into r's output.
//!
//! So the chunk after a chunk is pushed while that one is pulled and
//! reduced: both directions of the link are busy. The copies take fixed
//! slots (the host cannot know the launch's parity, which the GPU counts),
//! so the ranks meet at the start and the end of a launch: no peer is still
//! reading a slot from the launch before, or about to read one of this.
//! The meeting's kernel leaves the start out where the GPU's counters say
//! the launch before was one of these (its end meeting came after every
//! peer's last read) or there was none (`handoff_copies.cu`).

use super::plan::CopyChunks;
use crate::engine::cuda::kernels::{CopyFlag, HandoffLaunch};

/// The streams a launch's steps run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lane {
    /// The caller's stream: the launch forks from it and joins back.
    Caller,
    /// Copies from device memory to the host, and the flags they raise.
    ToHost,
    /// The waits for the peers' flags, copies from the host into device
    /// memory, and the reductions.
    FromHost,
}

impl Lane {
    /// The name of the lane's track in a trace.
    pub(super) fn track(self) -> &'static str {
        match self {
            Lane::Caller => "caller's stream",
            Lane::ToHost => "copies to host",
            Lane::FromHost => "copies from host",
        }
    }
}

/// The events that order one lane after another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Mark {
    /// Recorded on the caller's stream: every lane starts after it.
    Forked,
    /// Chunk c of this rank's segment is reduced: its results may leave.
    Reduced(usize),
    /// The end of the to-host lane's work.
    ToHostDone,
    /// The end of the from-host lane's work.
    FromHostDone,
}

/// Memory a copy reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// The launch's input (`HandoffLaunch::src`).
    Input,
    /// The launch's output (`HandoffLaunch::dst`).
    Output,
    /// This rank's device staging for `peer`'s parts of its segment.
    Staging { peer: usize },
    /// `sender`'s inbox in `at`'s exchange block (host memory).
    Inbox { at: usize, sender: usize },
    /// `owner`'s result slot in `at`'s exchange block (host memory).
    Results { at: usize, owner: usize },
}

/// A byte offset into a place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Address {
    pub(super) place: Place,
    pub(super) offset: u64,
}

/// One thing queued on a lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Record `Mark` on the lane.
    Record(Lane, Mark),
    /// The lane waits for the latest record of `Mark`.
    Wait(Lane, Mark),
    /// A copy engine's copy of `bytes`.
    Copy {
        lane: Lane,
        to: Address,
        from: Address,
        bytes: usize,
    },
    /// A flag kernel (`handoff_copies.cu`; the meeting's `phase` says
    /// whether it is the launch's last).
    Flag {
        lane: Lane,
        flag: CopyFlag,
        phase: u32,
        slot: u32,
    },
    /// `elements` of the output at `offset` = the input there reduced with
    /// the peers' parts staged at `in_slot` of their staging.
    Reduce {
        lane: Lane,
        offset: u64,
        in_slot: u64,
        elements: usize,
    },
}

impl Step {
    /// The lane the step runs on.
    pub(super) fn lane(&self) -> Lane {
        match *self {
            Step::Record(lane, _) | Step::Wait(lane, _) => lane,
            Step::Copy { lane, .. } | Step::Flag { lane, .. } | Step::Reduce { lane, .. } => lane,
        }
    }

    /// What the step is, as a trace names it: a copy by what it moves (this
    /// rank's parts to their owners, `push`; the peers' parts of its
    /// segment in, `pull`; its reduced chunk to the peers, `results out`;
    /// the owners' results in, `results in`), a flag kernel by its flag, or
    /// `reduce`; none for the records and waits that order the lanes.
    pub(super) fn trace_name(&self) -> Option<&'static str> {
        match self {
            Step::Record(..) | Step::Wait(..) => None,
            Step::Copy { to, from, .. } => Some(copy_role(to.place, from.place).0),
            Step::Flag { flag, .. } => Some(match flag {
                CopyFlag::Signal => "signal",
                CopyFlag::Await => "await",
                CopyFlag::Meet => "meet",
            }),
            Step::Reduce { .. } => Some("reduce"),
        }
    }

    /// The peer at a copy's other end: whose exchange block slot it writes
    /// or reads.
    pub(super) fn peer(&self) -> Option<usize> {
        match self {
            Step::Copy { to, from, .. } => copy_role(to.place, from.place).1,
            _ => None,
        }
    }
}

/// A copy between `to` and `from` as a trace names it, and the peer whose
/// slot in host memory it touches (every copy of a program has one end in
/// host memory).
fn copy_role(to: Place, from: Place) -> (&'static str, Option<usize>) {
    match (to, from) {
        (Place::Inbox { at, .. }, _) => ("push", Some(at)),
        (Place::Results { at, .. }, _) => ("results out", Some(at)),
        (_, Place::Inbox { sender, .. }) => ("pull", Some(sender)),
        (_, Place::Results { owner, .. }) => ("results in", Some(owner)),
        _ => ("copy", None),
    }
}

/// One launch's geometry, as the copies address it.
struct Geometry<'a> {
    launch: &'a HandoffLaunch,
    chunks: CopyChunks,
    element: usize,
    rank: usize,
    nranks: usize,
}

impl Geometry<'_> {
    /// Chunk `index` of `rank`'s segment: its byte offset in the launch's
    /// buffers, its byte offset in that segment's slot, and its bytes.
    fn chunk(&self, rank: usize, index: usize) -> (u64, u64, usize) {
        let range = self.chunks.chunk(self.launch, rank, index);
        let in_segment = range.start - self.launch.segments.start[rank] as usize;
        (
            (range.start * self.element) as u64,
            (in_segment * self.element) as u64,
            range.len() * self.element,
        )
    }

    fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nranks).filter(|&peer| peer != self.rank)
    }
}

/// The steps `rank` of `nranks` queues for `launch` (two-shot) cut in
/// `chunks`, elements of `element` bytes, in the order it queues them.
pub(super) fn program(
    launch: &HandoffLaunch,
    chunks: CopyChunks,
    element: usize,
    rank: usize,
    nranks: usize,
) -> Vec<Step> {
    use Lane::{Caller, FromHost, ToHost};
    let geometry = Geometry {
        launch,
        chunks,
        element,
        rank,
        nranks,
    };
    let copy = |lane, to: (Place, u64), from: (Place, u64), bytes| Step::Copy {
        lane,
        to: Address {
            place: to.0,
            offset: to.1,
        },
        from: Address {
            place: from.0,
            offset: from.1,
        },
        bytes,
    };
    let flag = |lane, flag, phase, slot: usize| Step::Flag {
        lane,
        flag,
        phase,
        slot: slot as u32,
    };
    let mut steps = vec![
        Step::Record(Caller, Mark::Forked),
        Step::Wait(ToHost, Mark::Forked),
        Step::Wait(FromHost, Mark::Forked),
        flag(ToHost, CopyFlag::Meet, 0, 0),
    ];
    let count = chunks.count;
    // Pushes: r's part of each owner's segment into the owner's inbox.
    for index in 0..count {
        for owner in geometry.peers() {
            let (offset, in_slot, bytes) = geometry.chunk(owner, index);
            let inbox = Place::Inbox {
                at: owner,
                sender: rank,
            };
            steps.push(copy(
                ToHost,
                (inbox, in_slot),
                (Place::Input, offset),
                bytes,
            ));
        }
        steps.push(flag(ToHost, CopyFlag::Signal, 0, index));
    }
    // Pulls and reductions of r's own segment.
    for index in 0..count {
        steps.push(flag(FromHost, CopyFlag::Await, 0, index));
        let (offset, in_slot, bytes) = geometry.chunk(rank, index);
        for peer in geometry.peers() {
            let inbox = Place::Inbox {
                at: rank,
                sender: peer,
            };
            let staging = Place::Staging { peer };
            steps.push(copy(FromHost, (staging, in_slot), (inbox, in_slot), bytes));
        }
        steps.push(Step::Reduce {
            lane: FromHost,
            offset,
            in_slot,
            elements: bytes / element,
        });
        steps.push(Step::Record(FromHost, Mark::Reduced(index)));
    }
    // Results out, as each chunk is reduced.
    for index in 0..count {
        steps.push(Step::Wait(ToHost, Mark::Reduced(index)));
        let (offset, in_slot, bytes) = geometry.chunk(rank, index);
        for peer in geometry.peers() {
            let slot = Place::Results {
                at: peer,
                owner: rank,
            };
            steps.push(copy(
                ToHost,
                (slot, in_slot),
                (Place::Output, offset),
                bytes,
            ));
        }
        steps.push(flag(ToHost, CopyFlag::Signal, 1, index));
    }
    // The owners' results in.
    for index in 0..count {
        steps.push(flag(FromHost, CopyFlag::Await, 1, index));
        for owner in geometry.peers() {
            let (offset, in_slot, bytes) = geometry.chunk(owner, index);
            let slot = Place::Results { at: rank, owner };
            steps.push(copy(
                FromHost,
                (Place::Output, offset),
                (slot, in_slot),
                bytes,
            ));
        }
    }
    steps.extend([
        flag(FromHost, CopyFlag::Meet, 1, 0),
        Step::Record(ToHost, Mark::ToHostDone),
        Step::Record(FromHost, Mark::FromHostDone),
        Step::Wait(Caller, Mark::ToHostDone),
        Step::Wait(Caller, Mark::FromHostDone),
    ]);
    steps.retain(|step| !matches!(step, Step::Copy { bytes: 0, .. }));
    steps
}

#[cfg(test)]
mod simulator;
