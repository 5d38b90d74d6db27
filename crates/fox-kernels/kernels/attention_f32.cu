// Forgetting Attention in f32, forward and backward: the GPU twin of the CPU reference
// (crates/fox-kernels/src/attention.rs) for `--dtype f32`, where the model is checked against the
// CPU within 1e-3. Simple rather than fast: one warp per query row (forward, dq) or key row
// (dk, dv), O(T^2 D) work, no atomics, so results are deterministic.
//
// Layouts: q, o, dout, dq are [B, T, H, D] contiguous, k, v, dk, dv [B, T, Hkv, D] (grouped-query
// attention: query head h reads k/v head h / (H / Hkv)); c (the gate prefix sums, cq = ck), lse,
// delta and dc are [B, H, T]. Head dims up to 256 (8 elements per lane).
//
// Which keys row r sees, exactly as the CPU decides: causal (j <= r), visibility (j >= start[b];
// rows r < start[b] are padding and output 0), the sliding window (j > r - window), and ACP: the CPU walks key tiles of 64 for blocks
// of 32 query rows and skips a leading tile when c[r0] - c[last key of tile] < delta (r0 the
// block's first row) and the tile ends before r0. `first_key` replays that walk, so every entry
// the CPU skips is skipped here and no other.

#define NEG_INF __int_as_float(0xff800000)
#define MAXD 256
#define PER_LANE (MAXD / 32)
#define WARPS 4
#define BLOCK_Q 32
#define BLOCK_K 64

struct F32Params {
    const float* q;
    const float* k;
    const float* v;
    const float* c;
    const int* start;    // [B] left-padding starts, or null
    const float* prune;  // [B*H] ACP thresholds, or null
    float* o;            // forward output
    float* lse;          // forward output; backward input
    const float* o_in;   // backward inputs
    const float* dout;
    float* delta;        // [B, H, T] scratch written by the dq pass, read by the dk/dv pass
    float* dq;
    float* dk;
    float* dv;
    float* dc;           // [B, H, T]: dcq (dq pass) + dck (dk/dv pass)
    int b, h, t, d;
    float scale;
    int hkv;     // k/v heads, a divisor of h
    int window;  // sliding window w > 0 (keys r - w < j <= r), 0: off
    int pad_;
    // decoding against a cache (fox32_fwd_cached): keys and values [B, Hkv, cap, D], the gate
    // sums ck [B, H, cap]; query row r of the chunk (t rows, gate sums c) sits at q_pos0 + r
    const float* ck;
    int q_pos0, cap, pad2_, pad3_;
};

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ int row_start(const F32Params& p, int b) {
    return p.start ? max(p.start[b], 0) : 0;
}

// First key row r sees: its padding start raised by the window.
__device__ __forceinline__ int key_start(const F32Params& p, int b, int r) {
    const int s = row_start(p, b);
    return p.window > 0 ? max(s, r - p.window + 1) : s;
}

// The first key the CPU's tiled forward visits for query row r of (b, h): its block's start key
// (the block's first row's, rounded down to a tile) advanced past the tiles ACP prunes.
__device__ int first_key(const F32Params& p, int b, int bh, int r) {
    const int r0 = r / BLOCK_Q * BLOCK_Q;
    const int end = min(r0 + BLOCK_Q, p.t);
    int first = key_start(p, b, r0) / BLOCK_K * BLOCK_K;
    if (p.prune) {
        const float delta = p.prune[bh];
        const float* c = p.c + (long long)bh * p.t;
        const float ci0 = c[r0];
        while (first + BLOCK_K <= end) {
            const int j1 = first + BLOCK_K - 1;
            if (ci0 - c[j1] < delta && j1 < r0) first += BLOCK_K;
            else break;
        }
    }
    return first;
}

__device__ __forceinline__ float dot_row(const float* __restrict__ a, const float* __restrict__ b, int d) {
    float s = 0.f;
    for (int i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
}

// One query row's online softmax over keys first..last (inclusive): k, v rows `kstride` apart,
// scores scale·q·k_j + ci − cj[j]; the row's output goes to orow[0..d) and its lse to *lse.
__device__ void attend_row(const F32Params& p, const float* q, const float* kb, const float* vb, long long kstride,
                           const float* cj, float ci, int first, int last, float* orow, float* lse) {
    const int lane = threadIdx.x % 32, d = p.d;
    float m = NEG_INF, l = 0.f;
    float acc[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.f;
    for (int j0 = first; j0 <= last; j0 += 32) {
        const int j = j0 + lane;
        float s = NEG_INF;
        if (j <= last) s = p.scale * dot_row(q, kb + j * kstride, d) + (ci - cj[j]);
        const float mnew = fmaxf(m, warp_max(s));  // finite: key j0 <= last is in the chunk
        const float corr = expf(m - mnew);
        const float e = (j <= last) ? expf(s - mnew) : 0.f;
        l = l * corr + warp_sum(e);
        const int n = min(32, last - j0 + 1);
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) acc[i] *= corr;
        for (int jj = 0; jj < n; ++jj) {
            const float ej = __shfl_sync(0xffffffffu, e, jj);
            const float* vr = vb + (j0 + jj) * kstride;
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) {
                const int c = lane + 32 * i;
                if (c < d) acc[i] += ej * vr[c];
            }
        }
        m = mnew;
    }
    const float inv = 1.f / l;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int c = lane + 32 * i;
        if (c < d) orow[c] = acc[i] * inv;
    }
    if (lane == 0) *lse = m + logf(l);
}

// Query row r of head bh = b·H + h (g = bh·T + r): its offset in q, o, dout and dq, and the rows of
// its k/v head (key j at kb, vb + j·kstride).
struct QueryRow {
    int r, bh, b;
    long long rowoff, kstride;
    const float* kb;
    const float* vb;
};
__device__ __forceinline__ QueryRow query_row(const F32Params& p, long long g) {
    const int r = (int)(g % p.t), bh = (int)(g / p.t), b = bh / p.h, hh = bh % p.h;
    const int d = p.d;
    const long long rowoff = (((long long)b * p.t + r) * p.h + hh) * d;
    const int hk = hh / (p.h / p.hkv);
    const long long kstride = (long long)p.hkv * d;  // between consecutive positions
    const float* kb = p.k + ((long long)b * p.t * p.hkv + hk) * d;
    const float* vb = p.v + ((long long)b * p.t * p.hkv + hk) * d;
    return {r, bh, b, rowoff, kstride, kb, vb};
}

// A padding row (before its start) sees no key: zero output, lse -inf.
__device__ __forceinline__ void padding_row(const F32Params& p, int d, long long rowoff, long long g, int lane) {
    for (int i = lane; i < d; i += 32) p.o[rowoff + i] = 0.f;
    if (lane == 0) p.lse[g] = NEG_INF;
}

// ---- forward: one warp per (b, h, query row), online softmax over chunks of 32 keys ----------
// Each lane scores one key of the chunk (q from shared memory); the weighted sum of v rows is
// then accumulated with lanes across D.
extern "C" __global__ void __launch_bounds__(WARPS * 32) fox32_fwd(const F32Params p) {
    __shared__ float qs[WARPS][MAXD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long g = (long long)blockIdx.x * WARPS + warp;  // (b*H + h)*T + r
    if (g >= (long long)p.b * p.h * p.t) return;
    const auto [r, bh, b, rowoff, kstride, kb, vb] = query_row(p, g);
    const int d = p.d;
    const int st = row_start(p, b);
    if (r < st) {
        padding_row(p, d, rowoff, g, lane);
        return;
    }
    for (int i = lane; i < d; i += 32) qs[warp][i] = p.q[rowoff + i];
    __syncwarp();
    const float* cb = p.c + (long long)bh * p.t;
    const float ci = cb[r];
    const int first = max(first_key(p, b, bh, r), key_start(p, b, r));
    attend_row(p, qs[warp], kb, vb, kstride, cb, ci, first, r, p.o + rowoff, p.lse + g);
}

// ---- backward pass 1: one warp per query row: delta = dO.O, dq, dcq (written to dc) ---------
extern "C" __global__ void __launch_bounds__(WARPS * 32) fox32_bwd_dq(const F32Params p) {
    __shared__ float qs[WARPS][MAXD];
    __shared__ float dos[WARPS][MAXD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long g = (long long)blockIdx.x * WARPS + warp;
    if (g >= (long long)p.b * p.h * p.t) return;
    const auto [r, bh, b, rowoff, kstride, kb, vb] = query_row(p, g);
    const int d = p.d;
    const int st = row_start(p, b);
    if (r < st) {
        for (int i = lane; i < d; i += 32) p.dq[rowoff + i] = 0.f;
        if (lane == 0) {
            p.delta[g] = 0.f;
            p.dc[g] = 0.f;
        }
        return;
    }
    float part = 0.f;
    for (int i = lane; i < d; i += 32) {
        const float q = p.q[rowoff + i], dO = p.dout[rowoff + i];
        qs[warp][i] = q;
        dos[warp][i] = dO;
        part += p.o_in[rowoff + i] * dO;
    }
    const float delta = warp_sum(part);
    if (lane == 0) p.delta[g] = delta;
    __syncwarp();
    const float* cb = p.c + (long long)bh * p.t;
    const float ci = cb[r], lse = p.lse[g];
    const int first = max(first_key(p, b, bh, r), key_start(p, b, r));
    float dq[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) dq[i] = 0.f;
    float dci = 0.f;
    for (int j0 = first; j0 <= r; j0 += 32) {
        const int j = j0 + lane;
        float ds = 0.f;
        if (j <= r) {
            const float s = p.scale * dot_row(qs[warp], kb + j * kstride, d) + (ci - cb[j]);
            const float pr = expf(s - lse);
            ds = pr * (dot_row(dos[warp], vb + j * kstride, d) - delta);
        }
        dci += warp_sum(ds);
        const int n = min(32, r - j0 + 1);
        for (int jj = 0; jj < n; ++jj) {
            const float dsj = __shfl_sync(0xffffffffu, ds, jj) * p.scale;
            const float* kr = kb + (j0 + jj) * kstride;
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) {
                const int c = lane + 32 * i;
                if (c < d) dq[i] += dsj * kr[c];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int c = lane + 32 * i;
        if (c < d) p.dq[rowoff + c] = dq[i];
    }
    if (lane == 0) p.dc[g] = dci;
}

// ---- backward pass 2: one warp per key row j of a k/v head: dk, dv, and dc += dck = -sum_i dS_ij --
// Each lane takes one query row of a chunk of 32 (j <= r < j + window), recomputing its
// probability from lse; a query row counts only if the CPU's forward visits key j for it
// (first_key). With grouped-query attention the warp walks the group's query heads in order:
// dk, dv are their sum, dc is per query head.
extern "C" __global__ void __launch_bounds__(WARPS * 32) fox32_bwd_dkdv(const F32Params p) {
    __shared__ float ks[WARPS][MAXD];
    __shared__ float vs[WARPS][MAXD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long g = (long long)blockIdx.x * WARPS + warp;  // (b*Hkv + hk)*T + j
    if (g >= (long long)p.b * p.hkv * p.t) return;
    const int j = (int)(g % p.t), bk = (int)(g / p.t), b = bk / p.hkv, hk = bk % p.hkv;
    const int d = p.d, group = p.h / p.hkv;
    const long long rowoff = (((long long)b * p.t + j) * p.hkv + hk) * d;
    const long long qstride = (long long)p.h * d;
    const int st = row_start(p, b);
    if (j < st) {
        for (int i = lane; i < d; i += 32) {
            p.dk[rowoff + i] = 0.f;
            p.dv[rowoff + i] = 0.f;
        }
        return;  // dc of each query head was set to 0 by the dq pass (padded row)
    }
    for (int i = lane; i < d; i += 32) {
        ks[warp][i] = p.k[rowoff + i];
        vs[warp][i] = p.v[rowoff + i];
    }
    __syncwarp();
    // query rows that may see key j: r < j + window
    const int rend = p.window > 0 ? min(p.t, j + p.window) : p.t;
    float dk[PER_LANE], dv[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) dk[i] = dv[i] = 0.f;
    for (int hh = hk * group; hh < (hk + 1) * group; ++hh) {
        const int bh = b * p.h + hh;
        const long long base = ((long long)b * p.t * p.h + hh) * d;
        const float* qb = p.q + base;
        const float* dob = p.dout + base;
        const float* cb = p.c + (long long)bh * p.t;
        const float* lseb = p.lse + (long long)bh * p.t;
        const float* deltab = p.delta + (long long)bh * p.t;
        const float cj = cb[j];
        float dcj = 0.f;
        for (int r0 = j; r0 < rend; r0 += 32) {
            const int r = r0 + lane;
            float pr = 0.f, ds = 0.f;
            const bool sees = r < rend && j >= first_key(p, b, bh, r);  // r >= j >= st already
            if (sees) {
                const float s = p.scale * dot_row(qb + r * qstride, ks[warp], d) + (cb[r] - cj);
                pr = expf(s - lseb[r]);
                ds = pr * (dot_row(dob + r * qstride, vs[warp], d) - deltab[r]);
            }
            const unsigned mask = __ballot_sync(0xffffffffu, sees);
            dcj -= warp_sum(ds);
            for (int rr = 0; rr < 32; ++rr) {
                if (!(mask >> rr & 1u)) continue;
                const float prr = __shfl_sync(0xffffffffu, pr, rr);
                const float dsr = __shfl_sync(0xffffffffu, ds, rr) * p.scale;
                const float* qr = qb + (r0 + rr) * qstride;
                const float* dor = dob + (r0 + rr) * qstride;
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) {
                    const int c = lane + 32 * i;
                    if (c < d) {
                        dv[i] += prr * dor[c];
                        dk[i] += dsr * qr[c];
                    }
                }
            }
        }
        if (lane == 0) p.dc[(long long)bh * p.t + j] += dcj;
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int c = lane + 32 * i;
        if (c < d) {
            p.dk[rowoff + c] = dk[i];
            p.dv[rowoff + c] = dv[i];
        }
    }
}

// ---- forward against the decode cache: one warp per (b, h, query row) of a chunk ------------
// The chunk's t query rows sit at positions q_pos0 .. q_pos0 + t - 1 of the cached sequence (the
// chunk's own keys are already in the cache), and the window counts from those positions. ACP
// replays the CPU's walk with the same offsets.
__device__ int first_key_cached(const F32Params& p, int b, int bh, int r) {
    const int r0 = r / BLOCK_Q * BLOCK_Q;
    const int end = p.q_pos0 + min(r0 + BLOCK_Q, p.t);
    int first = key_start(p, b, p.q_pos0 + r0) / BLOCK_K * BLOCK_K;
    if (p.prune) {
        const float delta = p.prune[bh];
        const float ci0 = p.c[(long long)bh * p.t + r0];
        const float* ck = p.ck + (long long)bh * p.cap;
        while (first + BLOCK_K <= end) {
            const int j1 = first + BLOCK_K - 1;
            if (ci0 - ck[j1] < delta && j1 < p.q_pos0 + r0) first += BLOCK_K;
            else break;
        }
    }
    return first;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) fox32_fwd_cached(const F32Params p) {
    __shared__ float qs[WARPS][MAXD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long g = (long long)blockIdx.x * WARPS + warp;  // (b*H + h)*t + r
    if (g >= (long long)p.b * p.h * p.t) return;
    const int r = (int)(g % p.t), bh = (int)(g / p.t), b = bh / p.h, hh = bh % p.h;
    const int d = p.d;
    const int pos = p.q_pos0 + r;
    const long long rowoff = (((long long)b * p.t + r) * p.h + hh) * d;
    const long long kvh = (long long)b * p.hkv + hh / (p.h / p.hkv);  // the k/v head (b, h) reads
    const float* kb = p.k + kvh * p.cap * d;
    const float* vb = p.v + kvh * p.cap * d;
    const int st = row_start(p, b);
    if (pos < st) {
        padding_row(p, d, rowoff, g, lane);
        return;
    }
    for (int i = lane; i < d; i += 32) qs[warp][i] = p.q[rowoff + i];
    __syncwarp();
    const float* cb = p.ck + (long long)bh * p.cap;
    const float ci = p.c[(long long)bh * p.t + r];
    const int first = max(first_key_cached(p, b, bh, r), key_start(p, b, pos));
    attend_row(p, qs[warp], kb, vb, d, cb, ci, first, pos, p.o + rowoff, p.lse + g);
}
