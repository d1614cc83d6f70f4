// The GPU hand-off's all_reduce through pinned host memory by the copy
// engines (gpu_handoff/copy_engines.rs), compiled after common.cu. The copy
// engines move the data between device memory and the exchange blocks;
// these kernels raise and await the flags between those copies (one thread
// each) and reduce in device memory. Chunk c's pushes raise flag slot c of
// phase 0 at their owner, chunk c's reduced results slot c of phase 1; the
// launch's two meetings, at its start and at its end, the last slot of
// phases 0 and 1. Every kernel of a launch takes its epoch from the first
// block's counter; the meeting at the end moves every block's counter to it
// (the copies take fixed slots, so ranks meet around them instead of
// alternating parities: a peer still reading a slot from the launch before,
// or about to read one of this launch, has not met us yet), and writes it
// into the word after the counters, COPIES_ENDED.
#define MEETING_SLOT (HBLOCKS - 1)
#define COPIES_ENDED HBLOCKS

__device__ __forceinline__ u64 copies_epoch(const Exchange& x) { return x.epochs[0] + 1; }

// Raises flag `slot` of `phase` at every peer: the copies queued before this
// kernel on its stream have landed.
extern "C" __global__ void handoff_copies_signal(Exchange x, unsigned phase, unsigned slot) {
    u64 epoch = copies_epoch(x);
    for (unsigned peer = 0; peer < x.nranks; peer++) {
        if (peer != x.rank) raise_flag(x, epoch, peer, phase, slot);
    }
}

// Waits until every peer raised flag `slot` of `phase` here: the copies
// queued after this kernel on its stream read what the peers pushed. Once a
// wait has failed (the error word set), returns at once: one timeout ends
// the launch, not one per chunk.
extern "C" __global__ void handoff_copies_await(Exchange x, unsigned phase, unsigned slot) {
    if (*x.error != 0) return;
    u64 epoch = copies_epoch(x);
    for (unsigned peer = 0; peer < x.nranks; peer++) {
        if (peer != x.rank && !await_flag(x, epoch, phase, peer, slot)) return;
    }
}

// Tells every peer this rank has reached the meeting of `phase` (0: the
// launch's start, 1: its end) and waits to hear the same from each; at the
// end (`last`), moves every block's counter to the launch's epoch and
// stamps the call's end (every copy and flag of the launch is behind it).
// The meeting at the start is for a kernels' launch before, whose peers may
// still read the slots of its parity: right after a copy-engine launch (block
// 0's counter still at that launch's end) every peer has met us at its end,
// after its last read, and at the first launch no slot was ever written, so
// it is left out, the same on every rank (every rank makes the same launches).
extern "C" __global__ void handoff_copies_meet(Exchange x, unsigned phase, unsigned last) {
    if (!last && x.epochs[0] == x.epochs[COPIES_ENDED]) return;
    u64 epoch = copies_epoch(x);
    for (unsigned peer = 0; peer < x.nranks; peer++) {
        if (peer != x.rank) raise_flag(x, epoch, peer, phase, MEETING_SLOT);
    }
    if (*x.error != 0) return;
    for (unsigned peer = 0; peer < x.nranks; peer++) {
        if (peer != x.rank && !await_flag(x, epoch, phase, peer, MEETING_SLOT)) return;
    }
    if (last) {
        for (unsigned b = 0; b < HBLOCKS; b++) x.epochs[b] = epoch;
        x.epochs[COPIES_ENDED] = epoch;
        stamp_call_end(x);
    }
}

// out[i] = op over every rank's contribution in rank order, n elements:
// this rank's own is `mine`, peer k's the copy engines brought to
// `staged + k * x.window` (device memory).
extern "C" __global__ void __launch_bounds__(512) handoff_copies_reduce(S* out, const S* mine, u64 staged, u64 n, unsigned div, Exchange x) {
    const S* src[HMAX];
    for (unsigned k = 0; k < x.nranks; k++) {
        src[k] = k == x.rank ? mine : (const S*)(staged + k * x.window);
    }
    u64 start, end;
    share(n, &start, &end);
    reduce_sources(out, src, x.nranks, start, end, div);
}
