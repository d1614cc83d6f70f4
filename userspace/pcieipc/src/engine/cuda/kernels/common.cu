// The CUDA C of the reduce kernels and the GPU hand-off, compiled by NVRTC at
// run time once per (element type, reduction): kernels.rs prepends the
// #defines that specialise it (S storage type, C compute type, LD/ST the
// conversions, OP the reduction, DIV the average's division).
typedef unsigned long long u64;
struct h16 { unsigned short bits; };
struct b16 { unsigned short bits; };
__device__ __forceinline__ float up(h16 x) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits)); return f; }
__device__ __forceinline__ h16 down_h16(float f) { h16 x; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x.bits) : "f"(f)); return x; }
__device__ __forceinline__ float up(b16 x) { return __uint_as_float(((unsigned)x.bits) << 16); }
// Round to nearest even, NaN kept quiet: the half crate's bf16::from_f32.
__device__ __forceinline__ b16 down_b16(float f) {
    unsigned u = __float_as_uint(f);
    b16 x;
    if ((u & 0x7fffffffu) > 0x7f800000u) { x.bits = (unsigned short)((u >> 16) | 0x40u); return x; }
    u += 0x7fffu + ((u >> 16) & 1u);
    x.bits = (unsigned short)(u >> 16);
    return x;
}
__device__ __forceinline__ S apply(S a, S b, unsigned div) {
    S r = ST(OP(LD(a), LD(b)));
    if (div) r = ST(DIV(LD(r), div));
    return r;
}
#define VEC (16 / (int)sizeof(S))

// dst[i] (and dst2[i] when dst2 is not null) = a[i] op b[i], then / div when
// div is not 0. 16-byte loads and stores when every pointer is aligned.
extern "C" __global__ void reduce(S* dst, S* dst2, const S* a, const S* b, u64 n, unsigned div) {
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
    bool aligned = ((((u64)dst) | ((u64)dst2) | ((u64)a) | ((u64)b)) & 15) == 0;
    u64 nvec = aligned ? n / VEC : 0;
    for (u64 v = tid; v < nvec; v += stride) {
        uint4 va = ((const uint4*)a)[v], vb = ((const uint4*)b)[v], vr;
        const S* ea = (const S*)&va; const S* eb = (const S*)&vb; S* er = (S*)&vr;
        #pragma unroll
        for (int j = 0; j < VEC; j++) er[j] = apply(ea[j], eb[j], 0);
        if (div) {
            #pragma unroll
            for (int j = 0; j < VEC; j++) er[j] = ST(DIV(LD(er[j]), div));
        }
        ((uint4*)dst)[v] = vr;
        if (dst2) ((uint4*)dst2)[v] = vr;
    }
    for (u64 i = nvec * VEC + tid; i < n; i += stride) {
        S r = apply(a[i], b[i], div);
        dst[i] = r;
        if (dst2) dst2[i] = r;
    }
}

// dst[i] = p1[i] op p0[i], then op p2[i], ... in rank order (as the CPU
// engine's one-shot path), then / div when div is not 0.
extern "C" __global__ void one_shot(S* dst, const S* p0, const S* p1, const S* p2, const S* p3,
                                    const S* p4, const S* p5, const S* p6, const S* p7,
                                    unsigned nranks, u64 n, unsigned div) {
    const S* p[8] = {p0, p1, p2, p3, p4, p5, p6, p7};
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
    u64 bits = (u64)dst;
    for (unsigned k = 0; k < nranks; k++) bits |= (u64)p[k];
    u64 nvec = (bits & 15) == 0 ? n / VEC : 0;
    for (u64 v = tid; v < nvec; v += stride) {
        uint4 acc = ((const uint4*)p[0])[v];
        S* ea = (S*)&acc;
        for (unsigned k = 1; k < nranks; k++) {
            uint4 vk = ((const uint4*)p[k])[v];
            const S* ek = (const S*)&vk;
            #pragma unroll
            for (int j = 0; j < VEC; j++) ea[j] = apply(ek[j], ea[j], 0);
        }
        if (div) {
            #pragma unroll
            for (int j = 0; j < VEC; j++) ea[j] = ST(DIV(LD(ea[j]), div));
        }
        ((uint4*)dst)[v] = acc;
    }
    for (u64 i = nvec * VEC + tid; i < n; i += stride) {
        S r = p[0][i];
        for (unsigned k = 1; k < nranks; k++) r = apply(p[k][i], r, 0);
        if (div) r = ST(DIV(LD(r), div));
        dst[i] = r;
    }
}

// ---- GPU-side hand-off (gpu_handoff/): one launch per window, ranks meet on the
// GPU through flags in each other's exchange blocks, never on the host.
//
// A rank's exchange block (device memory, or pinned host memory when there is
// no peer-to-peer): flags [phase 2][parity 2][sender HMAX][block HBLOCKS]
// (u64 epochs), then inboxes [parity][sender][window], then results
// [parity][owner][window]. A sender
// writes its data into the receiver's block, then, after a system-scope fence,
// stores the launch's epoch into its flag there with release semantics; the
// receiver polls its own flags with acquire loads. Each block counts its
// launches in its own counter (in the rank's device memory, not a kernel
// argument, so a replayed CUDA graph counts on): every rank makes the same launches in the
// same order, so the epochs agree, and no flag is ever reset; the two parities
// let launch k+1 run while a slow peer still reads launch k.
#define HMAX 8
#define HBLOCKS 64
#define FLAG_BYTES (2 * 2 * HMAX * HBLOCKS * 8)
// After the flags, the call each flag came with: two words per flag.
#define HEADER_BYTES (FLAG_BYTES * 3)
// Vectors a thread loads before it stores any: through host memory every
// load is a PCIe round trip, so the loads in flight set the bandwidth.
#define UNROLL 4

__device__ __forceinline__ u64 globaltimer() {
    u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
__device__ __forceinline__ void store_release(u64* flag, u64 value) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(flag), "l"(value) : "memory");
}
__device__ __forceinline__ u64 load_acquire(const u64* flag) {
    u64 v; asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory"); return v;
}
__device__ __forceinline__ u64* flag_at(u64 block_base, unsigned phase, unsigned parity, unsigned sender, unsigned block) {
    return (u64*)(block_base) + ((phase * 2 + parity) * HMAX + sender) * HBLOCKS + block;
}
// The call a flag came with (two words), written before the flag.
__device__ __forceinline__ u64* call_at(u64 block_base, unsigned phase, unsigned parity, unsigned sender, unsigned block) {
    return (u64*)(block_base + FLAG_BYTES) + (((phase * 2 + parity) * HMAX + sender) * HBLOCKS + block) * 2;
}

// Where each rank's segment of a two-shot launch starts, in elements, then
// the launch's n: rank r's segment is [start[r], start[r + 1]). The host
// takes the bounds from its schedule (whole vectors: gpu_handoff/plan.rs)
// and passes them; no kernel computes segment bounds.
struct Segments {
    u64 start[HMAX + 1];
};

// seg.start[k] for a k known only at run time, read with constant indices:
// a kernel parameter indexed by a register is copied to local memory first,
// in every thread of every launch.
__device__ __forceinline__ u64 seg_at(const Segments& seg, unsigned k) {
    u64 value = 0;
#pragma unroll
    for (unsigned i = 0; i <= HMAX; i++) {
        if (i == k) value = seg.start[i];
    }
    return value;
}

struct Exchange {
    u64 base[HMAX];      // each rank's exchange block as mapped here (own included)
    u64 window;          // bytes of one inbox or result slot
    unsigned rank, nranks;
    u64 timeout_ns;
    volatile unsigned* error;  // host-mapped: 0, or what failed (gpu_handoff/report.rs)
    volatile u64* epochs;      // [HBLOCKS] launch counters, this rank's device memory,
                               // then the last copy-engine launch's (handoff_copies.cu)
    u64 call[2];               // this call's descriptor, carried by every flag
    volatile u64* calls;       // host-mapped: a mismatch's calls, the peer's then ours
    u64* call_end;             // device memory: the call's end on the GPU's clock, or null
};

// This block's epoch for this launch: its counter plus one (thread 0 reads
// it; `finish` stores it back once the block is done).
__device__ __forceinline__ u64 begin(const Exchange& x) {
    __shared__ u64 epoch;
    if (threadIdx.x == 0) epoch = x.epochs[blockIdx.x] + 1;
    __syncthreads();
    return epoch;
}
// Where the call's end is asked for (a per-call clock: gpu_handoff/
// call_ends.rs), the GPU's time now, the latest of every block and launch
// of the call kept.
__device__ __forceinline__ void stamp_call_end(const Exchange& x) {
    if (x.call_end) atomicMax(x.call_end, globaltimer());
}
// A launch may take fewer blocks than HBLOCKS (a small message takes few):
// its first block also moves the counters of the blocks it did not run, so
// that every block of a later launch starts from the same epoch, and with it
// the same parity of the slots. The call's end is stamped once every thread
// of the block is done.
__device__ __forceinline__ void finish(const Exchange& x, u64 epoch) {
    if (x.call_end) __syncthreads();
    if (threadIdx.x == 0) {
        x.epochs[blockIdx.x] = epoch;
        if (blockIdx.x == 0) {
            for (unsigned b = gridDim.x; b < HBLOCKS; b++) x.epochs[b] = epoch;
        }
        stamp_call_end(x);
    }
}

__device__ __forceinline__ char* inbox(const Exchange& x, unsigned at, unsigned parity, unsigned sender) {
    return (char*)x.base[at] + HEADER_BYTES + ((u64)parity * x.nranks + sender) * x.window;
}
__device__ __forceinline__ char* results(const Exchange& x, unsigned at, unsigned parity, unsigned owner) {
    return (char*)x.base[at] + HEADER_BYTES + ((u64)(2 + parity) * x.nranks + owner) * x.window;
}

// This block's share [start, end) of n elements, in whole 16-byte vectors.
__device__ __forceinline__ void share(u64 n, u64* start, u64* end) {
    u64 vectors = (n + VEC - 1) / VEC, per = (vectors + gridDim.x - 1) / gridDim.x;
    *start = min(n, (u64)blockIdx.x * per * VEC);
    *end = min(n, *start + per * VEC);
}

__device__ __forceinline__ void copy_share(char* dst, const char* src, u64 start, u64 end) {
    u64 bytes_start = start * sizeof(S), bytes_end = end * sizeof(S);
    bool aligned = ((((u64)dst) | ((u64)src)) & 15) == 0;
    u64 i = bytes_start + threadIdx.x * 16;
    if (aligned) {
        for (; i + 16 <= bytes_end; i += UNROLL * blockDim.x * 16) {
            uint4 v[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                u64 at = i + u * blockDim.x * 16;
                if (at + 16 <= bytes_end) v[u] = *(const uint4*)(src + at);
            }
            #pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                u64 at = i + u * blockDim.x * 16;
                if (at + 16 <= bytes_end) *(uint4*)(dst + at) = v[u];
            }
        }
        i = bytes_start + ((bytes_end - bytes_start) / 16) * 16 + threadIdx.x;
    } else {
        i = bytes_start + threadIdx.x;
    }
    for (; i < bytes_end; i += blockDim.x) dst[i] = src[i];
}

// One thread raises flag `slot` of `phase` in rank `at`'s block, with this
// call's descriptor beside it, after a system-scope fence.
__device__ __forceinline__ void raise_flag(const Exchange& x, u64 epoch, unsigned at, unsigned phase, unsigned slot) {
    volatile u64* call = call_at(x.base[at], phase, epoch & 1, x.rank, slot);
    call[0] = x.call[0];
    call[1] = x.call[1];
    __threadfence_system();
    store_release(flag_at(x.base[at], phase, epoch & 1, x.rank, slot), epoch);
}

// Thread 0 raises this block's flag of `phase` in rank `at`'s block, after
// every thread's writes of the block (bar.sync, then raise_flag's fence).
__device__ __forceinline__ void signal(const Exchange& x, u64 epoch, unsigned at, unsigned phase) {
    __syncthreads();
    if (threadIdx.x == 0) raise_flag(x, epoch, at, phase, blockIdx.x);
}

// One thread: waits until `peer` raised flag `slot` of `phase` here; false
// (the error word set, unless another block set it first) when it has
// not within the timeout, or raised it for another call than ours (the
// peer's flag slot of this parity cannot hold a later launch's: a peer
// starts launch k + 2 only after our flags of k + 1, raised once this
// launch has ended).
__device__ bool await_flag(const Exchange& x, u64 epoch, unsigned phase, unsigned peer, unsigned slot) {
    u64 started = globaltimer();
    const u64* flag = flag_at(x.base[x.rank], phase, epoch & 1, peer, slot);
    for (unsigned polls = 1; load_acquire(flag) < epoch; polls++) {
        // Another block's failure ends this wait too (the error word is host
        // memory: read it now and then, not on every poll).
        if (polls % 256 == 0 && *x.error != 0) return false;
        if (globaltimer() - started > x.timeout_ns) {
            *x.error = 0x10000u | (phase << 8) | peer;
            __threadfence_system();
            return false;
        }
        __nanosleep(64);
    }
    // Ordered after the flag by its acquire load.
    const volatile u64* call = call_at(x.base[x.rank], phase, epoch & 1, peer, slot);
    u64 head = call[0], count = call[1];
    if (head != x.call[0] || count != x.call[1]) {
        // Blocks that find the same mismatch write the same words.
        x.calls[0] = head;
        x.calls[1] = count;
        x.calls[2] = x.call[0];
        x.calls[3] = x.call[1];
        __threadfence_system();
        *x.error = 0x30000u | (phase << 8) | peer;
        __threadfence_system();
        return false;
    }
    return true;
}

// Waits until `peer` (or, with peer = HMAX, every peer) raised this block's
// flag of `phase` here; false when one has not (see await_one).
__device__ bool await_peers(const Exchange& x, u64 epoch, unsigned phase, unsigned peer = HMAX) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        ok = 1;
        for (unsigned k = 0; k < x.nranks && ok; k++) {
            if (k == x.rank || (peer != HMAX && k != peer)) continue;
            ok = await_flag(x, epoch, phase, k, blockIdx.x);
        }
    }
    __syncthreads();
    return ok != 0;
}

// out[i] = op over src[0..nranks][i] in rank order (as `one_shot`) for this
// block's share [start, end), then / div when div is not 0. 16-byte loads
// when every pointer is aligned (`share` starts on a whole vector): through
// host memory each load is a PCIe round trip, so the bytes in flight per
// thread count.
__device__ __forceinline__ void reduce_sources(S* out, const S* const* src, unsigned nranks, u64 start, u64 end, unsigned div) {
    u64 bits = (u64)out;
    for (unsigned k = 0; k < nranks; k++) bits |= (u64)src[k];
    u64 tail = start;
    if ((bits & 15) == 0) {
        // UNROLL vectors per thread per pass, their loads issued together.
        u64 vend = end / VEC;
        for (u64 v0 = start / VEC + threadIdx.x; v0 < vend; v0 += UNROLL * blockDim.x) {
            uint4 acc[UNROLL], vk[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                u64 v = v0 + u * blockDim.x;
                if (v < vend) acc[u] = ((const uint4*)src[0])[v];
            }
            for (unsigned k = 1; k < nranks; k++) {
                #pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    u64 v = v0 + u * blockDim.x;
                    if (v < vend) vk[u] = ((const uint4*)src[k])[v];
                }
                #pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    S* ea = (S*)&acc[u];
                    const S* ek = (const S*)&vk[u];
                    #pragma unroll
                    for (int j = 0; j < VEC; j++) ea[j] = apply(ek[j], ea[j], 0);
                }
            }
            #pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                u64 v = v0 + u * blockDim.x;
                if (v >= vend) break;
                S* ea = (S*)&acc[u];
                if (div) {
                    #pragma unroll
                    for (int j = 0; j < VEC; j++) ea[j] = ST(DIV(LD(ea[j]), div));
                }
                ((uint4*)out)[v] = acc[u];
            }
        }
        tail = max(start, vend * VEC);
    }
    for (u64 i = tail + threadIdx.x; i < end; i += blockDim.x) {
        S r = src[0][i];
        for (unsigned k = 1; k < nranks; k++) r = apply(src[k][i], r, 0);
        if (div) r = ST(DIV(LD(r), div));
        out[i] = r;
    }
}

// reduce_sources for this block's share, this rank's own contribution
// `mine`, each peer's in its inbox slot here.
__device__ __forceinline__ void reduce_share(S* out, const S* mine, const Exchange& x, unsigned parity, u64 start, u64 end, unsigned div) {
    const S* src[HMAX];
    for (unsigned k = 0; k < x.nranks; k++) {
        src[k] = k == x.rank ? mine : (const S*)inbox(x, x.rank, parity, k);
    }
    reduce_sources(out, src, x.nranks, start, end, div);
}

// out[i] = op over every rank's in[i] in rank order (as `one_shot`):
// each rank pushes its input into every peer's inbox, then reduces its own
// inbox. For messages up to one window.
// Every hand-off kernel takes (out, in, n, stride, div, root, seg, x); each
// uses what it needs of them.
extern "C" __global__ void __launch_bounds__(512) handoff_one_shot(S* out, const S* in, u64 n, u64 stride, unsigned div, unsigned root, Segments seg, Exchange x) {
    u64 epoch = begin(x);
    unsigned parity = epoch & 1;
    u64 start, end;
    share(n, &start, &end);
    for (unsigned peer = 0; peer < x.nranks; peer++) {
        if (peer == x.rank) continue;
        copy_share(inbox(x, peer, parity, x.rank), (const char*)in, start, end);
        signal(x, epoch, peer, 0);
    }
    if (!await_peers(x, epoch, 0)) return;
    reduce_share(out, in, x, parity, start, end, div);
    finish(x, epoch);
}

// Two-shot: rank s owns segment s, [seg.start[s], seg.start[s + 1]). Each
// rank pushes segment s of its input into owner s's inbox; the owner reduces
// its segment (rank order), writes it to its output and pushes it into every
// peer's results; each rank copies the others' results into its output. For
// segments up to one window.
extern "C" __global__ void __launch_bounds__(512) handoff_two_shot(S* out, const S* in, u64 n, u64 stride, unsigned div, unsigned root, Segments seg, Exchange x) {
    u64 epoch = begin(x);
    unsigned parity = epoch & 1;
    for (unsigned owner = 0; owner < x.nranks; owner++) {
        if (owner == x.rank) continue;
        u64 base = seg_at(seg, owner), len = seg_at(seg, owner + 1) - base;
        u64 start, end;
        share(len, &start, &end);
        copy_share(inbox(x, owner, parity, x.rank), (const char*)(in + base), start, end);
        signal(x, epoch, owner, 0);
    }
    if (!await_peers(x, epoch, 0)) return;
    u64 mine = seg_at(seg, x.rank), len = seg_at(seg, x.rank + 1) - mine;
    u64 start, end;
    share(len, &start, &end);
    S* reduced = out + mine;
    reduce_share(reduced, in + mine, x, parity, start, end, div);
    __syncthreads();
    for (unsigned peer = 0; peer < x.nranks; peer++) {
        if (peer == x.rank) continue;
        copy_share(results(x, peer, parity, x.rank), (const char*)reduced, start, end);
        signal(x, epoch, peer, 1);
    }
    if (!await_peers(x, epoch, 1)) return;
    for (unsigned owner = 0; owner < x.nranks; owner++) {
        if (owner == x.rank) continue;
        u64 base = seg_at(seg, owner), len = seg_at(seg, owner + 1) - base;
        u64 start, end;
        share(len, &start, &end);
        copy_share((char*)(out + base), results(x, x.rank, parity, owner), start, end);
    }
    finish(x, epoch);
}
