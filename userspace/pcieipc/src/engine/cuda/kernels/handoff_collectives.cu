// The GPU hand-off's reduce-scatter, all-gather and broadcast kernels,
// compiled after common.cu (whose hand-off section they use).
// reduce_scatter: out[i] = op over every rank's in[rank * stride + i], in
// rank order, i < n. Segment s of the input goes to owner s's inbox.
extern "C" __global__ void __launch_bounds__(512) handoff_reduce_scatter(S* out, const S* in, u64 n, u64 stride, unsigned div, unsigned root, Segments seg, Exchange x) {
    u64 epoch = begin(x);
    unsigned parity = epoch & 1;
    u64 start, end;
    share(n, &start, &end);
    for (unsigned owner = 0; owner < x.nranks; owner++) {
        if (owner == x.rank) continue;
        copy_share(inbox(x, owner, parity, x.rank), (const char*)(in + owner * stride), start, end);
        signal(x, epoch, owner, 0);
    }
    if (!await_peers(x, epoch, 0)) return;
    reduce_share(out, in + x.rank * stride, x, parity, start, end, div);
    finish(x, epoch);
}

// all_gather: out[r * stride + i] = rank r's in[i], i < n. Each rank pushes
// its input into every peer's result slot (in place when in is its own
// part of out).
extern "C" __global__ void __launch_bounds__(512) handoff_all_gather(S* out, const S* in, u64 n, u64 stride, unsigned div, unsigned root, Segments seg, Exchange x) {
    u64 epoch = begin(x);
    unsigned parity = epoch & 1;
    u64 start, end;
    share(n, &start, &end);
    for (unsigned peer = 0; peer < x.nranks; peer++) {
        if (peer == x.rank) continue;
        copy_share(results(x, peer, parity, x.rank), (const char*)in, start, end);
        signal(x, epoch, peer, 1);
    }
    S* own = out + x.rank * stride;
    if (own != in) copy_share((char*)own, (const char*)in, start, end);
    if (!await_peers(x, epoch, 1)) return;
    for (unsigned owner = 0; owner < x.nranks; owner++) {
        if (owner == x.rank) continue;
        copy_share((char*)(out + owner * stride), results(x, x.rank, parity, owner), start, end);
    }
    finish(x, epoch);
}

// broadcast: every rank's out = root's in, n elements. The root pushes into
// every peer's inbox. Every rank also tells every other that it has started
// this launch, and waits to hear the same: a rank's next launches rewrite
// peers' slots only once those peers are done with the launch before this one
// (the root alone waiting for nobody would break that).
extern "C" __global__ void __launch_bounds__(512) handoff_broadcast(S* out, const S* in, u64 n, u64 stride, unsigned div, unsigned root, Segments seg, Exchange x) {
    u64 epoch = begin(x);
    unsigned parity = epoch & 1;
    u64 start, end;
    share(n, &start, &end);
    for (unsigned peer = 0; peer < x.nranks; peer++) {
        if (peer != x.rank) signal(x, epoch, peer, 1);
    }
    if (x.rank == root) {
        for (unsigned peer = 0; peer < x.nranks; peer++) {
            if (peer == x.rank) continue;
            copy_share(inbox(x, peer, parity, root), (const char*)in, start, end);
            signal(x, epoch, peer, 0);
        }
        if (out != in) copy_share((char*)out, (const char*)in, start, end);
    } else {
        if (!await_peers(x, epoch, 0, root)) return;
        copy_share((char*)out, inbox(x, x.rank, parity, root), start, end);
    }
    if (!await_peers(x, epoch, 1)) return;
    finish(x, epoch);
}
