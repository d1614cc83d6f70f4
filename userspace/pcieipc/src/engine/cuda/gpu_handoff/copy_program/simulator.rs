//! A model of what the GPU and the host memory do with every rank's
//! `program`, run under many interleavings. Each lane is a stream: its
//! steps run in order, one at a time. A wait holds its lane until the
//! record it refers to has run (the latest record of that event when the
//! wait was queued, as `cuStreamWaitEvent` takes it). A flag kernel reads
//! the rank's launch counter when it starts, which is a step of its own, so
//! the counter can move between a kernel's queueing and its start; an await
//! or a meeting then holds its lane until every peer's flag carries that
//! epoch. Copies and reductions run whole at one instant: any two that the
//! ordering does not separate run in both orders under some interleaving,
//! so one that reads a slot before it is written, or after the next
//! launch has overwritten it, shows.
//!
//! Between the copy engines' calls a job may make one-shot calls, whose
//! kernel (one block, `handoff_one_shot`) takes the next epoch and the
//! inboxes of its parity, parity 0 among them, which the copies use: the
//! meeting at a copy launch's start is for them, and its kernel leaves it
//! out where the counter still holds the epoch the last copy launch's end
//! meeting wrote (no one-shot kernel since) or no launch has run.
//!
//! The GPU takes streams' work through a few hardware queues
//! (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default, streams dealt to them in
//! turn), each in the order the host queued it, so work on two streams that
//! share one runs in that order: a flag kernel spinning at the head of a
//! queue holds up whatever was queued behind it on another stream. Jobs
//! run with a queue per lane, and with the lanes sharing two queues and
//! one.
//!
//! Each element carries the call it belongs to and the ranks whose parts
//! are summed in it; a reduction of parts of different calls, or an output
//! that is not every rank's part of its call when the caller's stream
//! reaches it, fails the run with what was found where.

use std::collections::{HashMap, VecDeque};

use super::{program, Address, Lane, Mark, Place, Step};
use crate::engine::cuda::call::GpuCall;
use crate::engine::cuda::gpu_handoff::plan::{self, CopyChunks};
use crate::engine::cuda::kernels::{CopyFlag, HandoffLaunch, HANDOFF_BLOCKS};
use crate::engine::{Algorithm, CallKind, DType, ReduceOp};

/// The flag slot of the launch's meetings (`handoff_copies.cu`).
const MEETING_SLOT: u32 = HANDOFF_BLOCKS as u32 - 1;
const LANES: [Lane; 3] = [Lane::Caller, Lane::ToHost, Lane::FromHost];
const ELEMENT: usize = 4;

/// One element: which call it is of, and whose parts it sums (a bit per
/// rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Unset,
    Parts { call: u32, ranks: u32 },
}

/// A queued step, as the model runs it.
#[derive(Clone, Copy, Debug)]
enum Queued {
    /// The caller writes call `call`'s input (its own part everywhere)
    /// and clears its output.
    Produce(u32),
    /// The caller reads call `call`'s output, its first `elements`: each
    /// must be the sum of every rank's part.
    Check { call: u32, elements: usize },
    /// A one-shot kernel of `elements` (one block) on the caller's stream,
    /// with its epoch once it has started and pushed.
    OneShot { elements: usize, epoch: Option<u64> },
    /// Record number `instance` of an event.
    Record(usize),
    /// Wait for a record (none: the event was never recorded, so the
    /// wait is over at once).
    Wait(Option<usize>),
    /// A step of the launch whose input and output start `base` bytes
    /// into the call's; a flag kernel's epoch once it has started.
    Launch {
        step: Step,
        base: u64,
        epoch: Option<u64>,
    },
}

struct Rank {
    /// The hardware queues, each in the order the host queued its work.
    queues: Vec<VecDeque<Queued>>,
    input: Vec<Value>,
    output: Vec<Value>,
    /// Per peer, a window of staged parts.
    staging: Vec<Vec<Value>>,
    /// The launch counter the flag kernels read (block 0's).
    epoch: u64,
    /// The epoch the last copy launch's end meeting wrote (0: none yet).
    copies_ended: u64,
    /// Meetings at a launch's start held, and left out.
    start_meetings: usize,
    start_meetings_left_out: usize,
    /// Which records have run.
    recorded: Vec<bool>,
}

/// Where a flag is: (phase, parity, the block's rank, the raising rank,
/// slot).
type FlagKey = (u32, u64, usize, usize, u32);

/// What every rank shares: the exchange blocks in host memory.
struct Host {
    /// `[at][parity][sender]`, a window each.
    inboxes: Vec<[Vec<Vec<Value>>; 2]>,
    /// `[at][owner]`, a window each.
    results: Vec<Vec<Vec<Value>>>,
    flags: HashMap<FlagKey, u64>,
}

/// A job: `nranks` ranks making `calls` all_reduce calls of `count`
/// elements by the copy engines, in place or not, through slots of
/// `window` bytes in chunks of about `chunk_bytes`; before each, a one-shot
/// call by the kernels of that many elements when `kernel_call_before` is
/// some.
#[derive(Clone, Copy, Debug)]
struct Job {
    nranks: usize,
    count: usize,
    calls: u32,
    window: usize,
    chunk_bytes: usize,
    in_place: bool,
    kernel_call_before: Option<usize>,
    /// The hardware queues the lanes share (lane i takes queue i mod
    /// `queues`).
    queues: usize,
}

/// How a test changes what the ranks queue (the real program: none).
type Edit = fn(Vec<Step>) -> Vec<Step>;

/// A small random number source (xorshift64*), seeded per run.
struct Interleaving(u64);

impl Interleaving {
    fn pick(&mut self, among: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % among
    }
}

struct Model {
    job: Job,
    ranks: Vec<Rank>,
    host: Host,
}

impl Model {
    /// Every rank's calls queued, each launch's steps as `edit` leaves
    /// them.
    fn new(job: Job, edit: Edit) -> Model {
        let slot = job.window / ELEMENT;
        let launches = launches(job.count, job.nranks, job.window);
        let ranks = (0..job.nranks)
            .map(|rank| {
                let mut queues = vec![VecDeque::new(); job.queues];
                let mut latest: HashMap<Mark, usize> = HashMap::new();
                let mut records = 0;
                let mut numbers = 0..;
                for _ in 0..job.calls {
                    if let Some(elements) = job.kernel_call_before {
                        let number = numbers.next().expect("unbounded");
                        queues[0].extend([
                            Queued::Produce(number),
                            Queued::OneShot {
                                elements,
                                epoch: None,
                            },
                            Queued::Check {
                                call: number,
                                elements,
                            },
                        ]);
                    }
                    let number = numbers.next().expect("unbounded");
                    queues[0].push_back(Queued::Produce(number));
                    for launch in &launches {
                        let chunks = CopyChunks::of(launch, job.nranks, ELEMENT, job.chunk_bytes);
                        let steps = edit(program(launch, chunks, ELEMENT, rank, job.nranks));
                        for step in steps {
                            let queued = match step {
                                Step::Record(_, mark) => {
                                    latest.insert(mark, records);
                                    records += 1;
                                    Queued::Record(records - 1)
                                }
                                Step::Wait(_, mark) => Queued::Wait(latest.get(&mark).copied()),
                                Step::Copy { .. } | Step::Flag { .. } | Step::Reduce { .. } => {
                                    Queued::Launch {
                                        step,
                                        base: launch.src,
                                        epoch: None,
                                    }
                                }
                            };
                            queues[lane_index(step.lane()) % job.queues].push_back(queued);
                        }
                    }
                    queues[0].push_back(Queued::Check {
                        call: number,
                        elements: job.count,
                    });
                }
                Rank {
                    queues,
                    input: vec![Value::Unset; job.count],
                    output: vec![Value::Unset; job.count],
                    staging: vec![vec![Value::Unset; slot]; job.nranks],
                    epoch: 0,
                    copies_ended: 0,
                    start_meetings: 0,
                    start_meetings_left_out: 0,
                    recorded: vec![false; records],
                }
            })
            .collect();
        let windows = || vec![vec![Value::Unset; slot]; job.nranks];
        Model {
            job,
            ranks,
            host: Host {
                inboxes: (0..job.nranks).map(|_| [windows(), windows()]).collect(),
                results: (0..job.nranks).map(|_| windows()).collect(),
                flags: HashMap::new(),
            },
        }
    }

    /// Runs every rank's steps to the end, choosing the next among those
    /// that can run by `interleaving`: what went wrong, if anything.
    fn run(&mut self, interleaving: &mut Interleaving) -> Result<(), String> {
        loop {
            let ready: Vec<(usize, usize)> = (0..self.job.nranks)
                .flat_map(|rank| (0..self.job.queues).map(move |queue| (rank, queue)))
                .filter(|&(rank, queue)| self.can_run(rank, queue))
                .collect();
            if ready.is_empty() {
                let stuck: Vec<String> = (0..self.job.nranks)
                    .flat_map(|rank| (0..self.job.queues).map(move |queue| (rank, queue)))
                    .filter_map(|(rank, queue)| {
                        let head = self.ranks[rank].queues[queue].front()?;
                        Some(format!("rank {rank} queue {queue}: {head:?}"))
                    })
                    .collect();
                return match stuck.is_empty() {
                    true => Ok(()),
                    false => Err(format!(
                        "no queue can go on (the kernels' waits would time out): {}",
                        stuck.join("; ")
                    )),
                };
            }
            let (rank, queue) = ready[interleaving.pick(ready.len())];
            self.advance(rank, queue)?;
        }
    }

    /// Whether the head of `queue` of `rank` can take its next step.
    fn can_run(&self, rank: usize, queue: usize) -> bool {
        let state = &self.ranks[rank];
        match state.queues[queue].front() {
            None => false,
            Some(Queued::Wait(Some(instance))) => state.recorded[*instance],
            Some(Queued::OneShot {
                epoch: Some(epoch), ..
            }) => self.raised_by_every_peer(rank, 0, 0, *epoch),
            Some(Queued::Launch {
                step: Step::Flag {
                    flag, phase, slot, ..
                },
                epoch: Some(epoch),
                ..
            }) => match flag {
                CopyFlag::Signal => true,
                CopyFlag::Await => self.raised_by_every_peer(rank, *phase, *slot, *epoch),
                CopyFlag::Meet => self.raised_by_every_peer(rank, *phase, MEETING_SLOT, *epoch),
            },
            Some(_) => true,
        }
    }

    fn raised_by_every_peer(&self, rank: usize, phase: u32, slot: u32, epoch: u64) -> bool {
        self.peers(rank).all(|peer| {
            self.host
                .flags
                .get(&(phase, epoch & 1, rank, peer, slot))
                .is_some_and(|&raised| raised >= epoch)
        })
    }

    fn peers(&self, rank: usize) -> impl Iterator<Item = usize> {
        (0..self.job.nranks).filter(move |&peer| peer != rank)
    }

    fn raise(&mut self, rank: usize, phase: u32, slot: u32, epoch: u64) {
        for peer in self.peers(rank).collect::<Vec<_>>() {
            self.host
                .flags
                .insert((phase, epoch & 1, peer, rank, slot), epoch);
        }
    }

    /// Takes the next step of the head of `queue` of `rank` (it can run).
    fn advance(&mut self, rank: usize, queue: usize) -> Result<(), String> {
        let head = *self.ranks[rank].queues[queue]
            .front()
            .expect("a ready queue");
        match head {
            Queued::Produce(number) => {
                let state = &mut self.ranks[rank];
                let own = Value::Parts {
                    call: number,
                    ranks: 1 << rank,
                };
                state.input.fill(own);
                if !self.job.in_place {
                    state.output.fill(Value::Unset);
                }
            }
            Queued::Check {
                call: number,
                elements,
            } => {
                let everyone = (1 << self.job.nranks) - 1;
                let expected = Value::Parts {
                    call: number,
                    ranks: everyone,
                };
                let output = &self.buffer(rank, Place::Output)[..elements];
                if let Some(at) = output.iter().position(|&value| value != expected) {
                    return Err(format!(
                        "rank {rank}, call {number}: element {at} of the output is {:?}",
                        output[at]
                    ));
                }
            }
            Queued::Record(instance) => self.ranks[rank].recorded[instance] = true,
            Queued::OneShot {
                elements,
                epoch: None,
            } => {
                // The kernel starts: its epoch, then its input into every
                // peer's inbox of that parity, then its flag there.
                let epoch = self.ranks[rank].epoch + 1;
                let parity = (epoch & 1) as usize;
                let mine = self.ranks[rank].input[..elements].to_vec();
                for peer in self.peers(rank).collect::<Vec<_>>() {
                    self.host.inboxes[peer][parity][rank][..elements].copy_from_slice(&mine);
                }
                self.raise(rank, 0, 0, epoch);
                if let Some(Queued::OneShot { epoch: started, .. }) =
                    self.ranks[rank].queues[queue].front_mut()
                {
                    *started = Some(epoch);
                }
                return Ok(());
            }
            Queued::OneShot {
                elements,
                epoch: Some(epoch),
            } => {
                // Every peer's flag is up: reduce the inbox, count the launch.
                self.check_not_ahead(rank, 0, 0, epoch)?;
                let parity = (epoch & 1) as usize;
                for at in 0..elements {
                    let mut sum = self.ranks[rank].input[at];
                    for peer in self.peers(rank).collect::<Vec<_>>() {
                        let part = self.host.inboxes[rank][parity][peer][at];
                        sum = add(rank, at, sum, part, peer)?;
                    }
                    self.buffer(rank, Place::Output)[at] = sum;
                }
                self.ranks[rank].epoch = epoch;
            }
            Queued::Wait(_) => {}
            Queued::Launch {
                step: Step::Flag { flag, phase, .. },
                epoch: None,
                ..
            } => {
                // The kernel starts: it reads the counter; a meeting raises
                // its flags at once, unless it is a start meeting right after
                // a copy launch or before any launch, which ends at once.
                let state = &mut self.ranks[rank];
                let epoch = state.epoch + 1;
                match (flag, phase) {
                    (CopyFlag::Meet, 0) if state.epoch == state.copies_ended => {
                        state.start_meetings_left_out += 1;
                        state.queues[queue].pop_front();
                        return Ok(());
                    }
                    (CopyFlag::Meet, _) => {
                        state.start_meetings += usize::from(phase == 0);
                        self.raise(rank, phase, MEETING_SLOT, epoch);
                    }
                    _ => {}
                }
                if let Some(Queued::Launch { epoch: started, .. }) =
                    self.ranks[rank].queues[queue].front_mut()
                {
                    *started = Some(epoch);
                }
                return Ok(());
            }
            Queued::Launch { step, base, epoch } => self.launch_step(rank, step, base, epoch)?,
        }
        self.ranks[rank].queues[queue].pop_front();
        Ok(())
    }

    fn launch_step(
        &mut self,
        rank: usize,
        step: Step,
        base: u64,
        epoch: Option<u64>,
    ) -> Result<(), String> {
        match step {
            Step::Flag {
                flag, phase, slot, ..
            } => {
                let epoch = epoch.expect("started");
                match flag {
                    CopyFlag::Signal => self.raise(rank, phase, slot, epoch),
                    CopyFlag::Await => self.check_not_ahead(rank, phase, slot, epoch)?,
                    CopyFlag::Meet => {
                        self.check_not_ahead(rank, phase, MEETING_SLOT, epoch)?;
                        // The meeting at the end moves the counter on.
                        if phase == 1 {
                            self.ranks[rank].epoch = epoch;
                            self.ranks[rank].copies_ended = epoch;
                        }
                    }
                }
            }
            Step::Copy {
                to, from, bytes, ..
            } => {
                let values = self.read(rank, from, base, bytes / ELEMENT).to_vec();
                let at = self.index(to, base);
                self.buffer(rank, to.place)[at..at + values.len()].copy_from_slice(&values);
            }
            Step::Reduce {
                offset,
                in_slot,
                elements,
                ..
            } => {
                let at = ((base + offset) as usize) / ELEMENT;
                let staged = in_slot as usize / ELEMENT;
                for i in 0..elements {
                    let mut sum = self.buffer(rank, Place::Input)[at + i];
                    for peer in self.peers(rank).collect::<Vec<_>>() {
                        let part = self.ranks[rank].staging[peer][staged + i];
                        sum = add(rank, at + i, sum, part, peer)?;
                    }
                    self.buffer(rank, Place::Output)[at + i] = sum;
                }
            }
            Step::Record(..) | Step::Wait(..) => unreachable!("queued as their own"),
        }
        Ok(())
    }

    /// A flag of a later launch of the same parity than the one awaited:
    /// the kernel would find another call's descriptor beside it.
    fn check_not_ahead(
        &self,
        rank: usize,
        phase: u32,
        slot: u32,
        epoch: u64,
    ) -> Result<(), String> {
        for peer in self.peers(rank) {
            let raised = self.host.flags[&(phase, epoch & 1, rank, peer, slot)];
            if raised != epoch {
                return Err(format!(
                    "rank {rank} awaited flag {slot} of phase {phase} for launch {epoch}, \
                     rank {peer} had raised it for launch {raised}"
                ));
            }
        }
        Ok(())
    }

    fn index(&self, at: Address, base: u64) -> usize {
        let offset = match at.place {
            Place::Input | Place::Output => base + at.offset,
            _ => at.offset,
        };
        assert_eq!(offset as usize % ELEMENT, 0, "{at:?}");
        offset as usize / ELEMENT
    }

    fn read(&mut self, rank: usize, from: Address, base: u64, elements: usize) -> &[Value] {
        let at = self.index(from, base);
        &self.buffer(rank, from.place)[at..at + elements]
    }

    /// The memory `place` names, as `rank` addresses it.
    fn buffer(&mut self, rank: usize, place: Place) -> &mut Vec<Value> {
        let in_place = self.job.in_place;
        match place {
            Place::Input => &mut self.ranks[rank].input,
            Place::Output if in_place => &mut self.ranks[rank].input,
            Place::Output => &mut self.ranks[rank].output,
            Place::Staging { peer } => &mut self.ranks[rank].staging[peer],
            Place::Inbox { at, sender } => &mut self.host.inboxes[at][0][sender],
            Place::Results { at, owner } => &mut self.host.results[at][owner],
        }
    }
}

/// `sum` (element `at` of `rank`'s call) with the `part` `peer` sent:
/// parts of one call from other ranks, or what was found.
fn add(rank: usize, at: usize, sum: Value, part: Value, peer: usize) -> Result<Value, String> {
    match (sum, part) {
        (
            Value::Parts { call, ranks },
            Value::Parts {
                call: other,
                ranks: theirs,
            },
        ) if call == other && ranks & theirs == 0 => Ok(Value::Parts {
            call,
            ranks: ranks | theirs,
        }),
        _ => Err(format!(
            "rank {rank} reduced {sum:?} with {part:?} from rank {peer} (element {at} of the call)"
        )),
    }
}

fn lane_index(lane: Lane) -> usize {
    LANES.iter().position(|&each| each == lane).expect("a lane")
}

/// Jobs that cover what the ordering must hold for: 2 to 4 ranks, calls of
/// one launch and of several (the last shorter), one chunk a segment and
/// several (the last shorter, some empty), calls of one element (every
/// segment but one empty), in place and not, with one-shot calls by the
/// kernels between them and without; each with a hardware queue per lane,
/// and with every lane in one.
fn jobs() -> Vec<Job> {
    let mut jobs = Vec::new();
    for nranks in 2..=4 {
        let window = 96;
        let per_launch = nranks * window / ELEMENT;
        for (count, chunk_bytes) in [
            (per_launch, window),
            (per_launch, 32),
            (2 * per_launch + 13, 32),
            (per_launch - 9, 48),
            (1, 32),
        ] {
            for in_place in [false, true] {
                for kernel_call_before in [None, Some(count.min(5))] {
                    for queues in [LANES.len(), 1] {
                        jobs.push(Job {
                            nranks,
                            count,
                            calls: 3,
                            window,
                            chunk_bytes,
                            in_place,
                            kernel_call_before,
                            queues,
                        });
                    }
                }
            }
        }
    }
    jobs
}

/// The first run of `job` among `runs` interleavings that went wrong.
fn first_failure(job: Job, edit: Edit, runs: u64) -> Option<String> {
    (1..=runs).find_map(|seed| {
        let mut model = Model::new(job, edit);
        let mut interleaving = Interleaving(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        model
            .run(&mut interleaving)
            .err()
            .map(|error| format!("{job:?}, interleaving {seed}: {error}"))
    })
}

fn unchanged(steps: Vec<Step>) -> Vec<Step> {
    steps
}

#[test]
fn every_interleaving_tried_sums_every_call_with_no_stale_part() {
    for job in jobs() {
        if let Some(failure) = first_failure(job, unchanged, 200) {
            panic!("{failure}");
        }
    }
    // Many chunks: several launches of one call, each chunk a vector.
    let job = Job {
        nranks: 3,
        count: 3 * 512 / ELEMENT * 2,
        calls: 2,
        window: 512,
        chunk_bytes: 16,
        in_place: false,
        kernel_call_before: None,
        queues: 2,
    };
    let chunks = |launch| CopyChunks::of(launch, job.nranks, ELEMENT, job.chunk_bytes).count;
    let launches = launches(job.count, job.nranks, job.window);
    assert_eq!(launches.len(), 2);
    assert!(launches.iter().all(|launch| chunks(launch) == 512 / 16));
    assert_eq!(first_failure(job, unchanged, 50), None);
}

/// The meeting at a launch's start is held after a one-shot call and left
/// out after a launch by the copy engines and before the first launch: in
/// calls of three launches each, all nine left out on every rank where the
/// calls follow each other, one in three held where a one-shot call comes
/// before each.
#[test]
fn a_launch_meets_at_its_start_only_after_a_kernels_launch() {
    for (kernel_call_before, held, left_out) in [(None, 0, 9), (Some(5), 3, 6)] {
        let job = Job {
            nranks: 2,
            count: 2 * (2 * 96 / ELEMENT) + 13,
            calls: 3,
            window: 96,
            chunk_bytes: 32,
            in_place: false,
            kernel_call_before,
            queues: LANES.len(),
        };
        assert_eq!(launches(job.count, job.nranks, job.window).len(), 3);
        for seed in 1..=20u64 {
            let mut model = Model::new(job, unchanged);
            let mut interleaving = Interleaving(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            model.run(&mut interleaving).expect("the job runs");
            for (rank, state) in model.ranks.iter().enumerate() {
                assert_eq!(
                    (state.start_meetings, state.start_meetings_left_out),
                    (held, left_out),
                    "rank {rank}, one-shot calls before: {kernel_call_before:?}, seed {seed}"
                );
            }
        }
    }
}

/// The two-shot launches of an all_reduce of `count` f32s among `nranks`
/// through slots of `window` bytes, the call's buffers at address 0: each
/// launch's `src` is its byte offset in the model's input.
fn launches(count: usize, nranks: usize, window: usize) -> Vec<HandoffLaunch> {
    // SAFETY: the addresses are offsets into the model's buffers, never
    // dereferenced.
    let call = unsafe {
        GpuCall::from_raw(
            CallKind::AllReduce,
            DType::F32,
            ReduceOp::Sum,
            count,
            0,
            0,
            0,
        )
    };
    plan::launches(&call, Algorithm::Direct, nranks, window)
}

/// `steps` without those `unwanted` says.
fn dropping(steps: Vec<Step>, unwanted: fn(&Step) -> bool) -> Vec<Step> {
    steps.into_iter().filter(|step| !unwanted(step)).collect()
}

/// The model finds each of these broken orders (so the test above can
/// fail): each is a step the program has for a reason, left out or moved.
#[test]
fn the_model_finds_a_program_that_leaves_out_an_ordering_step() {
    fn without_the_last_meeting(steps: Vec<Step>) -> Vec<Step> {
        dropping(steps, |step| {
            matches!(
                step,
                Step::Flag {
                    flag: CopyFlag::Meet,
                    phase: 1,
                    ..
                }
            )
        })
    }
    fn results_before_their_reduction(steps: Vec<Step>) -> Vec<Step> {
        dropping(steps, |step| {
            matches!(step, Step::Wait(Lane::ToHost, Mark::Reduced(_)))
        })
    }
    fn caller_not_joined(steps: Vec<Step>) -> Vec<Step> {
        dropping(steps, |step| {
            matches!(step, Step::Wait(Lane::Caller, Mark::FromHostDone))
        })
    }
    fn flag_before_its_pushes(mut steps: Vec<Step>) -> Vec<Step> {
        let first_push = steps
            .iter()
            .position(|step| {
                matches!(
                    step,
                    Step::Copy {
                        lane: Lane::ToHost,
                        ..
                    }
                )
            })
            .expect("a push");
        let its_flag = steps
            .iter()
            .position(|step| {
                matches!(
                    step,
                    Step::Flag {
                        flag: CopyFlag::Signal,
                        ..
                    }
                )
            })
            .expect("a flag");
        let flag = steps.remove(its_flag);
        steps.insert(first_push, flag);
        steps
    }
    fn without_the_first_meeting(steps: Vec<Step>) -> Vec<Step> {
        dropping(steps, |step| {
            matches!(
                step,
                Step::Flag {
                    flag: CopyFlag::Meet,
                    phase: 0,
                    ..
                }
            )
        })
    }
    fn no_fork(steps: Vec<Step>) -> Vec<Step> {
        dropping(steps, |step| matches!(step, Step::Wait(_, Mark::Forked)))
    }
    let job = Job {
        nranks: 2,
        count: 2 * 96 / ELEMENT + 5,
        calls: 3,
        window: 96,
        chunk_bytes: 32,
        in_place: false,
        kernel_call_before: Some(7),
        queues: LANES.len(),
    };
    for (name, edit) in [
        (
            "without the meeting at the end",
            without_the_last_meeting as Edit,
        ),
        (
            "without the meeting at the start",
            without_the_first_meeting,
        ),
        (
            "results pushed before their reduction",
            results_before_their_reduction,
        ),
        ("the caller's stream not joined", caller_not_joined),
        ("a flag raised before its pushes", flag_before_its_pushes),
        ("the lanes not forked from the caller", no_fork),
    ] {
        assert!(
            first_failure(job, edit, 200).is_some(),
            "{name}: no interleaving of 200 went wrong"
        );
    }
    // The awaits of the peers' flags queued before this rank's own pushes
    // and flags: the same order on every stream, so with a queue per lane
    // nothing changes, but where the lanes share a hardware queue an await
    // spinning at its head holds up the flags every peer's await waits for.
    fn awaits_before_pushes(mut steps: Vec<Step>) -> Vec<Step> {
        let position = |steps: &[Step], wanted: fn(&Step) -> bool| {
            steps.iter().position(wanted).expect("the step")
        };
        let first_push = position(&steps, |step| {
            matches!(
                step,
                Step::Copy {
                    lane: Lane::ToHost,
                    ..
                }
            )
        });
        let awaits = position(&steps, |step| {
            matches!(
                step,
                Step::Flag {
                    flag: CopyFlag::Await,
                    ..
                }
            )
        });
        let results = position(&steps, |step| {
            matches!(step, Step::Wait(Lane::ToHost, Mark::Reduced(_)))
        });
        let moved: Vec<Step> = steps.drain(awaits..results).collect();
        steps.splice(first_push..first_push, moved);
        steps
    }
    assert_eq!(first_failure(job, awaits_before_pushes, 200), None);
    let failure = first_failure(Job { queues: 1, ..job }, awaits_before_pushes, 20);
    assert!(
        failure
            .as_deref()
            .is_some_and(|failure| failure.contains("no queue can go on")),
        "{failure:?}"
    );
}

/// A trace names every step that moves data or a flag, as many of each as
/// the launch has chunks and peers, and none of the records and waits; each
/// copy names the peer at its other end.
#[test]
fn a_trace_names_each_copy_flag_and_reduction_of_a_launch() {
    for nranks in 2..=4 {
        let window = 96;
        let launch = launches(nranks * window / ELEMENT, nranks, window)[0];
        let chunks = CopyChunks::of(&launch, nranks, ELEMENT, 32);
        assert!(chunks.count >= 2, "{chunks:?}");
        for rank in 0..nranks {
            let mut named: HashMap<&str, usize> = HashMap::new();
            let mut copies_with: HashMap<(&str, usize), usize> = HashMap::new();
            for step in program(&launch, chunks, ELEMENT, rank, nranks) {
                if let (Some(name), Some(peer)) = (step.trace_name(), step.peer()) {
                    *copies_with.entry((name, peer)).or_default() += 1;
                }
                match step.trace_name() {
                    Some(name) => *named.entry(name).or_default() += 1,
                    None => assert!(
                        matches!(step, Step::Record(..) | Step::Wait(..)),
                        "{step:?}"
                    ),
                }
            }
            let per_peer = (nranks - 1) * chunks.count;
            let expected = HashMap::from([
                ("push", per_peer),
                ("pull", per_peer),
                ("results out", per_peer),
                ("results in", per_peer),
                ("signal", 2 * chunks.count),
                ("await", 2 * chunks.count),
                ("reduce", chunks.count),
                ("meet", 2),
            ]);
            assert_eq!(named, expected, "rank {rank} of {nranks}");
            // Each copy's peer: every other rank, a chunk's worth of each kind.
            for name in ["push", "pull", "results out", "results in"] {
                for peer in (0..nranks).filter(|&peer| peer != rank) {
                    assert_eq!(
                        copies_with.get(&(name, peer)),
                        Some(&chunks.count),
                        "rank {rank} of {nranks}: {copies_with:?}"
                    );
                }
            }
            assert_eq!(copies_with.len(), 4 * (nranks - 1), "{copies_with:?}");
        }
    }
}
