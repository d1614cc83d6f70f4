//! How the ring writes the chunks it posts in its slots below the
//! streaming threshold (`cache_bypass`): plain stores, or non-temporal ones
//! into both the raw and the relay slots, chosen by measuring the calls.
//!
//! Why measured and not fixed: the rate at which one core reads lines that
//! another core has just written (still dirty in the writer's cache) depends
//! on where the two cores are, and on a VM the host moves the vCPUs. On the
//! 2-vCPU AMD EPYC VM, a 256 KiB all_reduce with plain fills ran at about 11
//! GB/s most of the time and fell to about 1.6 for seconds at a time; with
//! both slots filled past the cache, the successor reads from memory and the
//! same calls ran at 4–7.5 GB/s out of place in either state (docs/engine.md,
//! Slot fills chosen by measurement). Neither fixed choice holds in both
//! states, so each class of call (kind, power-of-two size, in place or
//! not) starts on the fill its nearest decided size keeps, tries both fills
//! on its first calls (`EARLY_TRIALS`) and keeps the faster, and where
//! neither was clearly so tries them again once its first calls have
//! warmed the caches (`TRIALS`), keeping the other only where it is clearly
//! faster. After that a call
//! runs on the other fill (a probe) when the kept
//! fill's recent calls have slowed clearly past what they took when it was
//! last confirmed (the host moved the vCPUs), and otherwise after a run of
//! kept calls that doubles from 64 to `PROBE_EVERY` while probes lose,
//! which finds the other fill grown faster; the class moves when the probe
//! took clearly less time than the kept fill's recent calls. Probes thin out
//! because a probe on the slower fill is one slow call: with one call in 64
//! they were the p99 of 512 KiB calls on the EPYC (5× the median), and
//! p99.7 is the tail this project promises. Probes alone
//! took tens of calls to leave a slow start: on the EPYC, out-of-place 256
//! KiB calls ran at ~200 µs on plain fills until the 64th call's probe,
//! where the other fill ran them at ~60.
//!
//! Rank 0 chooses, from its own call times, as it chooses the chunk, and the
//! call's descriptor carries the choice to the others (`bypass_slots`). Ranks
//! that each chose for themselves could fill apart and stay apart: a probe
//! flips both, so what each measures is the mixed fill.

use crate::engine::call::CallKind;

/// How one ring call writes its slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotFill {
    /// Plain stores: the successor reads the chunk from this core's cache.
    Cached,
    /// Non-temporal stores into the raw slots, plain into the relay slots:
    /// the ranks' data outgrows the last-level cache (`cache_bypass`).
    RawBypass,
    /// Non-temporal stores into both: the successor reads from memory.
    Bypass,
}

impl SlotFill {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SlotFill::Cached => "cached",
            SlotFill::RawBypass => "raw-bypass",
            SlotFill::Bypass => "bypass",
        }
    }

    pub(crate) fn raw_bypasses(self) -> bool {
        self != SlotFill::Cached
    }

    pub(crate) fn relay_bypasses(self) -> bool {
        self == SlotFill::Bypass
    }
}

/// The longest run of kept calls between two probes, whatever the kept
/// fill's times: 0.1% of the calls, below the 0.3% that p99.7 leaves, so
/// that probes on the slower fill are not the tail. On the EPYC VM, one
/// probe in 1,024 calls instead of one in 64 took the p99 of 512 KiB
/// in-place calls from 63–65 µs to 46–53. The run starts at `PROBE_GAP`
/// after a class's trials and after every move, and doubles after every
/// probe that loses: a class that has just decided is checked as often as
/// before, one that has held for a thousand calls rarely.
const PROBE_EVERY: u32 = 1024;
/// The next call probes when the kept fill's typical time has grown past
/// this multiple of its time when last confirmed (the inverse of
/// `PROBE_WINS_BELOW`: a change a probe could act on), and at least
/// `PROBE_GAP` calls have run since the last probe. The host's state
/// changes show in the kept fill's own times, so the class follows them
/// within `RECENT_CALLS` / 2 calls instead of waiting for the next periodic
/// probe.
const DRIFT_ABOVE: f64 = 1.25;
/// The fewest calls on the kept fill between two probes: a host whose
/// state swings back and forth every few calls gets no more probes than
/// one in this many.
const PROBE_GAP: u32 = 64;
/// A class's calls in this range alternate the fills, the other first, and
/// after them the class keeps the faster; two calls of each, a fill's better
/// one its time, so one stalled call does not decide. Not from call 0: a
/// size's first calls bring its data into the caches (call 0 backs its slots
/// too), up to 5 calls at 512 KiB to 8 MiB on the 2-vCPU and 16-vCPU Xeons,
/// and trials among them measured the warming more than the fills;
/// non-temporal trials also kept the caches colder, which put off the
/// steady rate by several calls.
const TRIALS: std::ops::Range<u32> = 8..12;
/// The calls tried first: the other fill on call 3, the kept one on call
/// 4; from call 5 the class keeps the faster of the two. Where it took
/// less than `DECISIVE_BELOW` of the other's time that is the decision and
/// the class skips `TRIALS`; otherwise `TRIALS` check it. Keeping the
/// faster even inside the margin: a 2 MiB class that started on
/// non-temporal fills (its nearest decided size's), where plain ones ran it
/// at 0.7 of their time, ran calls 5 to 11 at 1.4 times its steady time
/// until `TRIALS` moved it. On the 2-vCPU EPYC VM of family 25 model 1,
/// 300 alternating cold starts of 64 KiB to 4 MiB (two runs), calls to
/// steady at 2 MiB: median 9 before, 6 after, 75th percentile 9–11
/// before, 6–8 after; at 512 KiB and 1 MiB the 75th percentile 5–6
/// before, 3–5 after; other sizes level. On that VM type plain fills ran 128
/// KiB to 1 MiB at 3–5 times non-temporal ones, so a class that started on
/// plain fills ran its calls 1 to 7 at that, and every class ran its two
/// trials of the slower fill among nccl-tests' timed calls (`-w 5` times
/// calls 5 to 24) at 3–8 times the steady time each; calls 3 and 4 are
/// still inside the warm-up such a run leaves untimed. Not calls 1 and 2:
/// there a 2 MiB class's call 1 still ran at about twice call 2's time
/// while the caches warmed, which read as the kept fill decisively faster
/// in 7 of 10 traced runs, where its later trials found the other fill
/// faster (the class kept the slower fill for 64 calls). One call of each,
/// not two: two of each put the first call at the steady rate a call or
/// two later. So one stalled call would decide here, where `TRIALS` do not
/// let it, but for `STALLED_ABOVE`.
const EARLY_TRIALS: std::ops::Range<u32> = 3..5;
/// How far apart the fills' early trial calls must be to decide without
/// `TRIALS`. The margin is wide because the first calls still warm the
/// caches (the kept fill's call is the later, so the warming favours it);
/// the fills differ by 3–5× where the EPYC VM makes plain fills slow, by
/// up to about 1.8× where plain fills are the faster.
const DECISIVE_BELOW: f64 = 0.6;
/// Early trials further apart than this many times are a stall, not the
/// fills' difference, and do not decide (`TRIALS`, best of two calls each,
/// do). The fills differed by at most 5–6× in any state of the EPYC VMs
/// (128 KiB: 83–158 µs plain against 25–32 non-temporal); a vCPU preempted
/// for the 1–5 ms seen there makes a 25–100 µs call 10 to 200 times
/// slower, and decided on it, a class kept the stalled call's other fill
/// until its first periodic probe.
const STALLED_ABOVE: f64 = 10.0;
/// A probe wins when it took less than this share of the kept fill's
/// typical time. The two states differ by 2–7× on the EPYC VM and the fills
/// by about 1.8× where plain stores are the faster, so a margin this wide
/// does not flip on noise; a probe that a stall (a vCPU preempted) slowed
/// only keeps the fill as it is.
const PROBE_WINS_BELOW: f64 = 0.8;
/// How many of the kept fill's latest calls its typical time (their median)
/// is taken over.
const RECENT_CALLS: usize = 8;
/// Classes: three ring collectives times every power-of-two size of a `usize`.
const SIZE_CLASSES: usize = usize::BITS as usize + 1;

#[derive(Clone, Copy, Default)]
struct Class {
    /// Whether the kept fill is `Bypass` (otherwise `Cached`).
    bypass: bool,
    /// Calls of this class so far.
    calls: u32,
    /// The best times of the kept and the other fill in the trials under
    /// way (ns).
    kept_best: Option<u64>,
    other_best: Option<u64>,
    /// The early trials were decisive: `TRIALS` are skipped.
    decided_early: bool,
    /// The kept fill's latest call times (ns), `filled` of them, the next
    /// written at `next`.
    recent: [u64; RECENT_CALLS],
    filled: usize,
    next: usize,
    /// The kept fill's typical time when it was last confirmed (its recent
    /// calls first filled after a decision, a probe lost, or they ran
    /// faster since): what drift is measured against.
    confirmed: Option<u64>,
    /// The kept fill has drifted: the next call probes.
    drifted: bool,
    /// Calls on the kept fill since the last probe or trial (saturating).
    since_probe: u32,
    /// Kept calls from one periodic probe to the next: `PROBE_GAP` at
    /// first, doubled by every lost probe up to `PROBE_EVERY` (0 before the
    /// first trial: read as `PROBE_GAP`).
    probe_interval: u32,
}

impl Class {
    fn kept(&self) -> SlotFill {
        if self.bypass {
            SlotFill::Bypass
        } else {
            SlotFill::Cached
        }
    }

    /// The trials the next call is one of (`EARLY_TRIALS`, or `TRIALS`
    /// where the early ones did not decide), if any.
    fn trials(&self) -> Option<std::ops::Range<u32>> {
        if EARLY_TRIALS.contains(&self.calls) {
            Some(EARLY_TRIALS)
        } else if TRIALS.contains(&self.calls) && !self.decided_early {
            Some(TRIALS)
        } else {
            None
        }
    }

    /// Whether the class has chosen by its own trials.
    fn decided(&self) -> bool {
        self.decided_early || self.calls >= TRIALS.end
    }

    /// Whether the next call runs on the fill not kept: every other trial
    /// (the first included), or a probe (drift, or the periodic one).
    fn is_probe(&self) -> bool {
        if let Some(trials) = self.trials() {
            return (self.calls - trials.start).is_multiple_of(2);
        }
        self.drifted || self.since_probe >= self.probe_interval.max(PROBE_GAP)
    }

    /// After the last call of `trials`. Early trials keep the faster fill
    /// of the two, and are the decision where the faster took less than
    /// `DECISIVE_BELOW` of the slower's time but not less than
    /// `1 / STALLED_ABOVE` of it; `TRIALS` keep the other fill only where
    /// its better call took less than `PROBE_WINS_BELOW` of the kept fill's.
    fn end_trials(&mut self, trials: std::ops::Range<u32>) {
        let (Some(other), Some(kept)) = (self.other_best.take(), self.kept_best.take()) else {
            return;
        };
        let below = |nanos: u64, of: u64, share: f64| (nanos as f64) < of as f64 * share;
        let moves = if trials == EARLY_TRIALS {
            let (faster, slower) = (other.min(kept), other.max(kept));
            self.decided_early = below(faster, slower, DECISIVE_BELOW)
                && !below(faster, slower, 1.0 / STALLED_ABOVE);
            other < kept
        } else {
            below(other, kept, PROBE_WINS_BELOW)
        };
        if moves {
            self.flip(other);
        }
    }

    fn flip(&mut self, nanos: u64) {
        self.bypass = !self.bypass;
        self.filled = 0;
        self.next = 0;
        self.confirmed = None;
        self.probe_interval = PROBE_GAP;
        self.remember(nanos);
    }

    /// After a probe that did not win: the kept fill's present times are
    /// its new reference, so that a host slower for both fills is not
    /// probed again and again, and the next periodic probe comes later.
    fn confirm(&mut self) {
        self.confirmed = self.typical_nanos();
        self.probe_interval = (self.probe_interval.max(PROBE_GAP) * 2).min(PROBE_EVERY);
    }

    fn typical_nanos(&self) -> Option<u64> {
        let mut recent = self.recent;
        let recent = &mut recent[..self.filled];
        recent.sort_unstable();
        recent.get(recent.len() / 2).copied()
    }

    fn remember(&mut self, nanos: u64) {
        self.recent[self.next] = nanos;
        self.next = (self.next + 1) % RECENT_CALLS;
        self.filled = (self.filled + 1).min(RECENT_CALLS);
    }

    /// After a kept call outside the trials: the reference follows the kept
    /// fill down (from the warming calls before the trials on), and a rise
    /// past `DRIFT_ABOVE` asks for a probe.
    fn watch_drift(&mut self) {
        if self.filled < RECENT_CALLS {
            return;
        }
        let Some(typical) = self.typical_nanos() else {
            return;
        };
        match self.confirmed {
            Some(confirmed) if typical > confirmed => {
                self.drifted = typical as f64 > confirmed as f64 * DRIFT_ABOVE
                    && self.since_probe >= PROBE_GAP;
            }
            _ => self.confirmed = Some(typical),
        }
    }
}

/// The measured choice between plain and non-temporal slot fills, per
/// class of call.
pub(crate) struct FillChooser {
    classes: Vec<Class>,
}

/// A class of ring call: which collective, the power of two its message
/// size rounds up to, and whether it runs in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallClass(usize);

/// Collectives (all_reduce and broadcast share one) times in place or not.
const KINDS: usize = 3 * 2;

impl CallClass {
    pub(crate) fn new(kind: CallKind, message_bytes: usize, in_place: bool) -> CallClass {
        let kind_index = match kind {
            CallKind::AllReduce | CallKind::Broadcast => 0,
            CallKind::ReduceScatter => 1,
            CallKind::AllGather => 2,
        };
        let kind_index = 2 * kind_index + usize::from(in_place);
        let log2_ceil = (usize::BITS - message_bytes.saturating_sub(1).leading_zeros()) as usize;
        CallClass(kind_index * SIZE_CLASSES + log2_ceil)
    }
}

impl FillChooser {
    pub(crate) fn new() -> FillChooser {
        FillChooser {
            classes: vec![Class::default(); KINDS * SIZE_CLASSES],
        }
    }

    /// The fill for the next call of `class`: the kept one, or the other on
    /// a probe. A class's first call keeps what its nearest decided class
    /// keeps (`nearest_decided`).
    pub(crate) fn choose(&mut self, class: CallClass) -> SlotFill {
        if self.classes[class.0].calls == 0 {
            self.classes[class.0].bypass = self.nearest_decided(class);
        }
        let state = &self.classes[class.0];
        match (state.is_probe(), state.kept()) {
            (false, kept) => kept,
            (true, SlotFill::Cached) => SlotFill::Bypass,
            (true, _) => SlotFill::Cached,
        }
    }

    /// Whether the class of the same collective and placement nearest in
    /// size to `class` among those past their trials keeps `Bypass` (the
    /// smaller of two as near; `Cached` where none is). Which fill is faster
    /// follows where the host has put the two vCPUs, the same for every
    /// size, so a new size starts on what the sizes beside it measured
    /// instead of on plain stores: on the 2-vCPU EPYC VM, in a state where
    /// plain fills ran a 256 KiB all_reduce at 126 µs and non-temporal ones
    /// at 28, each new size ran its calls 6 to 12 at 126 until its trials
    /// moved it (calls to steady at 256 KiB, median and 90th percentile:
    /// 9 and 14 before, 6 and 8 after). Its own trials still decide.
    fn nearest_decided(&self, class: CallClass) -> bool {
        let (kind, size) = (class.0 / SIZE_CLASSES, class.0 % SIZE_CLASSES);
        let decided = |size: usize| {
            let state = &self.classes[kind * SIZE_CLASSES + size];
            state.decided().then_some(state.bypass)
        };
        (1..SIZE_CLASSES)
            .find_map(|distance| {
                let smaller = size.checked_sub(distance).and_then(decided);
                let larger = Some(size + distance)
                    .filter(|&size| size < SIZE_CLASSES)
                    .and_then(decided);
                smaller.or(larger)
            })
            .unwrap_or(false)
    }

    /// Records that the call `choose` was last asked about for `class`
    /// took `nanos`.
    pub(crate) fn record(&mut self, class: CallClass, nanos: u64) {
        let state = &mut self.classes[class.0];
        let best = |best: Option<u64>| Some(best.map_or(nanos, |best| best.min(nanos)));
        if let Some(trials) = state.trials() {
            if state.is_probe() {
                state.other_best = best(state.other_best);
                state.since_probe = 0;
            } else {
                state.kept_best = best(state.kept_best);
                state.remember(nanos);
            }
            if state.calls == trials.end - 1 {
                state.end_trials(trials);
            }
        } else if state.is_probe() {
            let wins = state
                .typical_nanos()
                .is_some_and(|typical| (nanos as f64) < typical as f64 * PROBE_WINS_BELOW);
            if wins {
                state.flip(nanos);
            } else {
                state.confirm();
            }
            state.drifted = false;
            state.since_probe = 0;
        } else {
            state.since_probe = state.since_probe.saturating_add(1);
            state.remember(nanos);
            state.watch_drift();
        }
        state.calls = state.calls.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLASS: fn() -> CallClass = || CallClass::new(CallKind::AllReduce, 256 << 10, false);

    /// Runs `calls` calls of one class, each taking what `nanos` says for
    /// its fill, and returns the fills used.
    fn run(
        chooser: &mut FillChooser,
        calls: u32,
        nanos: impl Fn(u32, SlotFill) -> u64,
    ) -> Vec<SlotFill> {
        run_class(chooser, CLASS(), calls, nanos)
    }

    /// `run` for calls of `class`.
    fn run_class(
        chooser: &mut FillChooser,
        class: CallClass,
        calls: u32,
        nanos: impl Fn(u32, SlotFill) -> u64,
    ) -> Vec<SlotFill> {
        (0..calls)
            .map(|call| {
                let fill = chooser.choose(class);
                chooser.record(class, nanos(call, fill));
                fill
            })
            .collect()
    }

    /// The positions in `fills` of the calls that ran on `fill`.
    fn calls_on(fills: &[SlotFill], fill: SlotFill) -> Vec<usize> {
        (0..fills.len())
            .filter(|&call| fills[call] == fill)
            .collect()
    }

    fn fast_cache(_: u32, fill: SlotFill) -> u64 {
        match fill {
            SlotFill::Cached => 22_000,
            _ => 40_000,
        }
    }

    fn slow_cache(_: u32, fill: SlotFill) -> u64 {
        match fill {
            SlotFill::Cached => 160_000,
            _ => 40_000,
        }
    }

    /// Plain fills faster, but not by the early trials' margin.
    fn faster_cache(_: u32, fill: SlotFill) -> u64 {
        match fill {
            SlotFill::Cached => 30_000,
            _ => 40_000,
        }
    }

    /// The calls of a class that probe while every probe loses and nothing
    /// drifts, up to `calls`: the early trial's one, the trials' two unless
    /// the early trials `decided`, then after runs of kept calls doubling
    /// from `PROBE_GAP` to `PROBE_EVERY`.
    fn periodic_probes(decided: bool, calls: u32) -> Vec<u32> {
        let mut probes = vec![EARLY_TRIALS.start];
        let mut next = EARLY_TRIALS.end + PROBE_GAP;
        if !decided {
            probes.extend([TRIALS.start, TRIALS.start + 2]);
            next = TRIALS.end + PROBE_GAP;
        }
        let mut run = PROBE_GAP;
        while next < calls {
            probes.push(next);
            run = (2 * run).min(PROBE_EVERY);
            next += 1 + run;
        }
        probes
    }

    #[test]
    fn keeps_plain_stores_while_they_are_faster_probing_ever_more_rarely() {
        // Clearly faster (0.55 of bypass's time): decided by the early
        // trial, so no trials on calls 8 and 10.
        let decided = periodic_probes(true, 4 * PROBE_EVERY);
        assert_eq!(decided, [3, 69, 198, 455, 968, 1993, 3018, 4043]);
        // Faster by less (0.75): the trials decide.
        let undecided = periodic_probes(false, 4 * PROBE_EVERY);
        assert_eq!(undecided, [3, 8, 10, 76, 205, 462, 975, 2000, 3025, 4050]);
        for (times, probes) in [
            (fast_cache as fn(u32, SlotFill) -> u64, decided),
            (faster_cache, undecided),
        ] {
            let mut chooser = FillChooser::new();
            let fills = run(&mut chooser, 4 * PROBE_EVERY, times);
            for (call, fill) in fills.iter().enumerate() {
                let call = call as u32;
                let expected = if probes.contains(&call) {
                    SlotFill::Bypass
                } else {
                    SlotFill::Cached
                };
                assert_eq!(*fill, expected, "call {call}");
            }
        }
    }

    #[test]
    fn a_class_whose_plain_fills_are_slow_moves_to_bypass_after_its_trials() {
        use SlotFill::{Bypass, Cached};
        let mut chooser = FillChooser::new();
        // The first calls (first touches, cold caches) are slow whatever
        // their fill: the early trials do not decide, the trials do.
        let fills = run(&mut chooser, 12, |call, fill| match call {
            0 => 3_000_000,
            1..=7 => 900_000,
            _ => slow_cache(call, fill),
        });
        assert_eq!(
            fills[..8],
            [Cached, Cached, Cached, Bypass, Cached, Cached, Cached, Cached]
        );
        assert_eq!(fills[8..], [Bypass, Cached, Bypass, Cached]);
        let fills = run(&mut chooser, PROBE_GAP, slow_cache);
        assert!(fills.iter().all(|fill| *fill == Bypass), "{fills:?}");
        // One stalled trial call does not decide: the other trial counts.
        let mut chooser = FillChooser::new();
        run(&mut chooser, 12, |call, fill| match call {
            1..=7 => 900_000,
            8 => 9_000_000,
            _ => slow_cache(call, fill),
        });
        assert_eq!(chooser.choose(CLASS()), Bypass);
        // Where plain fills are faster, the class stays on them.
        let mut chooser = FillChooser::new();
        run(&mut chooser, 12, faster_cache);
        assert_eq!(chooser.choose(CLASS()), Cached);
    }

    #[test]
    fn a_class_decides_on_its_first_calls_when_one_fill_is_clearly_faster() {
        use SlotFill::{Bypass, Cached};
        // Plain fills 4 times slower: bypass from call 5, and no trial of
        // plain fills before the first periodic probe.
        let mut chooser = FillChooser::new();
        let fills = run(&mut chooser, 5 + PROBE_GAP + 1, slow_cache);
        assert_eq!(fills[..5], [Cached, Cached, Cached, Bypass, Cached]);
        assert_eq!(
            calls_on(&fills, Cached),
            [0, 1, 2, 4, 5 + PROBE_GAP as usize]
        );
        // Decided early, the class is a decided size for the others.
        let larger = CallClass::new(CallKind::AllReduce, 1 << 20, false);
        assert_eq!(chooser.choose(larger), Bypass);
        // Faster, but just inside the margin: the class keeps bypass from
        // call 5, and the trials, plain stores first, do not move it.
        let mut chooser = FillChooser::new();
        let fills = run(&mut chooser, 13, |_, fill| match fill {
            Cached => 40_000,
            _ => 25_000,
        });
        assert_eq!(calls_on(&fills, Cached), [0, 1, 2, 4, 8, 10]);
        assert_eq!(chooser.choose(CLASS()), Bypass);
        // Faster only by the fills' first calls' noise: the trials move it
        // back.
        let mut chooser = FillChooser::new();
        let fills = run(&mut chooser, 13, |call, fill| match (call, fill) {
            (4, _) => 41_000,
            (_, Cached) => 30_000,
            _ => 40_000,
        });
        assert_eq!(calls_on(&fills, Bypass), [3, 5, 6, 7, 9, 11]);
        assert_eq!(chooser.choose(CLASS()), Cached);
    }

    #[test]
    fn early_trials_far_apart_are_a_stall_and_do_not_decide() {
        use SlotFill::{Bypass, Cached};
        // Call 4, on plain stores, stalls for 3 ms: the class tries bypass
        // (faster than the stall) from call 5, the trials find plain stores
        // faster, and it keeps them from call 12 instead of from the first
        // periodic probe.
        let mut chooser = FillChooser::new();
        let fills = run(&mut chooser, 12 + PROBE_GAP, |call, fill| {
            match (call, fill) {
                (4, _) => 3_000_000,
                (_, Cached) => 22_000,
                _ => 40_000,
            }
        });
        assert_eq!(calls_on(&fills, Bypass), [3, 5, 6, 7, 9, 11]);
        // A difference of 9 times, inside the stall margin, decides.
        let mut chooser = FillChooser::new();
        let fills = run(&mut chooser, 12, |_, fill| match fill {
            Cached => 9 * 40_000,
            _ => 40_000,
        });
        assert_eq!(calls_on(&fills, Cached), [0, 1, 2, 4]);
    }

    #[test]
    fn a_new_size_starts_on_the_fill_its_nearest_decided_size_keeps() {
        use SlotFill::{Bypass, Cached};
        let all_reduce =
            |bytes: usize, in_place| CallClass::new(CallKind::AllReduce, bytes, in_place);
        let mut chooser = FillChooser::new();
        // 64 KiB decides on bypass in its trials (plain fills slow, but
        // not by the early trials' margin).
        let slower_cache = |_, fill| match fill {
            Cached => 60_000,
            _ => 40_000,
        };
        run_class(&mut chooser, all_reduce(64 << 10, false), 12, slower_cache);
        // 256 KiB starts there, and its trials try plain stores.
        let fills = run_class(&mut chooser, all_reduce(256 << 10, false), 12, slower_cache);
        assert_eq!(calls_on(&fills, Cached), [3, 8, 10]);
        // Not another placement's or collective's: those start on plain
        // stores until a class of their own has decided.
        assert_eq!(chooser.choose(all_reduce(256 << 10, true)), Cached);
        assert_eq!(
            chooser.choose(CallClass::new(CallKind::AllGather, 256 << 10, false)),
            Cached
        );
        // Its own trials still decide: 1 MiB, where plain fills are faster,
        // starts on bypass and keeps plain stores from call 5.
        let fills = run_class(&mut chooser, all_reduce(1 << 20, false), 12, faster_cache);
        assert_eq!(calls_on(&fills, Bypass), [0, 1, 2, 4, 8, 10]);
        assert_eq!(chooser.choose(all_reduce(1 << 20, false)), Cached);
        // The nearest decided size: 4 MiB is nearer 1 MiB (plain) than 64 KiB
        // (bypass); 512 KiB lies between 256 KiB (bypass) and 1 MiB (plain),
        // as near to both, and takes the smaller's.
        assert_eq!(chooser.choose(all_reduce(4 << 20, false)), Cached);
        assert_eq!(chooser.choose(all_reduce(512 << 10, false)), Bypass);
        // A class that has begun keeps its own course: 256 KiB in place,
        // once past its first call, is not moved by what others decide.
        run_class(&mut chooser, all_reduce(256 << 10, true), 1, faster_cache);
        run_class(&mut chooser, all_reduce(128 << 10, true), 12, slow_cache);
        // Its calls 1 to 7: plain stores but for the early trial, call 3.
        let fills = run_class(&mut chooser, all_reduce(256 << 10, true), 7, faster_cache);
        assert_eq!(calls_on(&fills, Bypass), [3 - 1]);
    }

    #[test]
    fn moves_to_bypass_when_cached_reads_slow_down_and_back_when_they_recover() {
        use SlotFill::{Bypass, Cached};
        let mut chooser = FillChooser::new();
        // Past the trials and the first periodic probe (call 76), by more
        // than PROBE_GAP calls.
        run(&mut chooser, 150, faster_cache);
        // The host moves the vCPUs: once the median of the kept fill's
        // recent calls has slowed (4 of 8), the next call (154) probes,
        // finds bypass faster and keeps it.
        let fills = run(&mut chooser, 6, slow_cache);
        assert_eq!(fills, [Cached, Cached, Cached, Cached, Bypass, Bypass]);
        // While it lasts, bypass stays; periodic probes try plain stores
        // after runs of 64, 128, 256, 512 and 1024 kept calls (calls 219,
        // 348, 605, 1118 and 2143).
        let fills = run(&mut chooser, 2 * PROBE_EVERY, slow_cache);
        let probes = calls_on(&fills, Cached);
        assert_eq!(probes, [219, 348, 605, 1118, 2143].map(|call| call - 156));
        assert_eq!(chooser.choose(CLASS()), Bypass);
        // Back in the fast state bypass runs as before, so only the next
        // periodic probe (call 3168) finds plain stores faster again.
        let fills = run(&mut chooser, PROBE_EVERY, fast_cache);
        let first_cached = fills.iter().position(|fill| *fill == Cached);
        assert_eq!(first_cached, Some(3168 - 2204));
        assert!(
            fills[3168 - 2204..].iter().all(|fill| *fill == Cached),
            "{fills:?}"
        );
    }

    #[test]
    fn a_host_slower_for_both_fills_is_probed_once_per_change() {
        use SlotFill::{Bypass, Cached};
        let mut chooser = FillChooser::new();
        run(&mut chooser, 180, faster_cache);
        // Both fills 2.3 times slower: one probe (call 184, the fifth slow
        // one), lost; plain stores stay and are not probed again before
        // the next periodic probe (call 441).
        let slower = |_, fill| match fill {
            Cached => 69_000,
            _ => 92_000,
        };
        let fills = run(&mut chooser, 200, slower);
        let probes = calls_on(&fills, Bypass);
        assert_eq!(probes, [4]);
        // Slower again at once: drift shows after 4 calls, but the probe
        // waits until PROBE_GAP kept calls have run since the last one.
        let mut chooser = FillChooser::new();
        run(&mut chooser, 180, faster_cache);
        let fills = run(&mut chooser, 5 + 10, slower);
        assert_eq!(fills.iter().filter(|fill| **fill == Bypass).count(), 1);
        let slowest = |_, fill| match fill {
            Cached => 90_000,
            _ => 160_000,
        };
        let fills = run(&mut chooser, 100, slowest);
        let probes = calls_on(&fills, Bypass);
        // The last probe was call 184 of the class and this run starts at
        // 195.
        assert_eq!(probes, [184 + PROBE_GAP as usize + 1 - 195]);
    }

    #[test]
    fn a_probe_must_win_clearly_and_a_stalled_one_changes_nothing() {
        let mut chooser = FillChooser::new();
        // Bypass 10% faster on the early trials: the class keeps it. Then
        // plain stores 10% faster: within the margin, bypass stays.
        run(&mut chooser, 12, |_, fill| match fill {
            SlotFill::Cached => 40_000,
            _ => 36_000,
        });
        run(&mut chooser, 3 * PROBE_EVERY, |_, fill| match fill {
            SlotFill::Cached => 36_000,
            _ => 40_000,
        });
        assert_eq!(chooser.choose(CLASS()), SlotFill::Bypass);
        // A kept call stalled for milliseconds just before the first
        // periodic probe moves neither the median nor the reference.
        let mut chooser = FillChooser::new();
        let stalled = TRIALS.end + PROBE_GAP - 1;
        run(
            &mut chooser,
            2 * PROBE_GAP + TRIALS.end,
            |call, fill| match (call, fill) {
                (call, _) if call == stalled => 3_000_000,
                (_, SlotFill::Cached) => 30_000,
                _ => 40_000,
            },
        );
        assert_eq!(chooser.choose(CLASS()), SlotFill::Cached);
    }

    #[test]
    fn classes_choose_apart() {
        let small = CallClass::new(CallKind::AllReduce, 64 << 10, false);
        let large = CallClass::new(CallKind::AllReduce, 1 << 20, false);
        assert_ne!(small, large);
        assert_ne!(
            small,
            CallClass::new(CallKind::ReduceScatter, 64 << 10, false)
        );
        assert_ne!(small, CallClass::new(CallKind::AllReduce, 64 << 10, true));
        assert_ne!(
            CallClass::new(CallKind::AllGather, usize::MAX, true),
            CallClass::new(CallKind::AllGather, usize::MAX, false)
        );
        assert_eq!(
            CallClass::new(CallKind::AllReduce, (32 << 10) + 1, false),
            small
        );
        let mut chooser = FillChooser::new();
        for _ in 0..2 * PROBE_EVERY {
            for (class, times) in [
                (small, slow_cache as fn(u32, SlotFill) -> u64),
                (large, fast_cache),
            ] {
                let fill = chooser.choose(class);
                chooser.record(class, times(0, fill));
            }
        }
        assert_eq!(chooser.choose(small), SlotFill::Bypass);
        assert_eq!(chooser.choose(large), SlotFill::Cached);
    }

    #[test]
    fn fill_kinds_name_their_slots() {
        assert!(!SlotFill::Cached.raw_bypasses() && !SlotFill::Cached.relay_bypasses());
        assert!(SlotFill::RawBypass.raw_bypasses() && !SlotFill::RawBypass.relay_bypasses());
        assert!(SlotFill::Bypass.raw_bypasses() && SlotFill::Bypass.relay_bypasses());
    }
}
