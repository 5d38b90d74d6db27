// Shared helpers for the Forgetting Attention kernels (compiled at run time by NVRTC).
//
// No CUDA headers: NVRTC compiles this file alone. Half-precision values travel as raw 16-bit
// words (u16) and are converted with PTX `cvt`, so bf16 and fp16 share one code path that
// differs only in the mma instruction and the conversions.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)

// Everything a Forgetting Attention launch needs, passed by value as one struct.
// Element strides; D is contiguous. q/k/v are [B, H, T, D] views with arbitrary strides,
// o/dout/dq/dk/dv are contiguous [B, T, H, D]. With grouped-query attention k, v, dk, dv have
// Hkv heads (query head h reads k/v head kv_head(h)); c, lse, delta, dcq, dck stay per query
// head, as the gate is.
struct AttnParams {
    const u16* q;
    const u16* k;
    const u16* v;
    long long q_sb, q_sh, q_st;
    long long k_sb, k_sh, k_st;
    long long v_sb, v_sh, v_st;
    u16* o;            // forward output [B, tq, H, D]
    float* lse;        // [B, H, tq], natural log; -inf for rows that see no key
    const float* cq;   // [B, H, tq]
    const float* ck;   // [B, H, tk]
    const int* start;  // visibility: see row_start
    const float* prune;  // ACP threshold per (b, h) in natural-log units, or null
    u64* counters;     // [2]: key tiles visited, pruned (or null)
    // backward
    const u16* o_in;   // [B, tq, H, D]
    const u16* dout;   // [B, tq, H, D]
    const float* lse_in;
    float* delta;      // [B, H, tq]
    u16* dq;           // [B, tq, H, D]
    u16* dk;           // [B, tk, H, D]
    u16* dv;           // [B, tk, H, D]
    float* dcq;        // [B, H, tq]
    float* dck;        // [B, H, tk]
    // decode split-K scratch
    float* part_o;     // [splits, B*H, 16, D]
    float* part_ml;    // [splits, B*H, 16, 2]
    int B, H, tq, tk, q_pos0;
    int start_mode;    // 0: every key; 1: start[b] (left padding); 2: start[b*tq + r] (packed)
    int splits;
    float scale;
    int Hkv;           // k/v heads, a divisor of H (H: multi-head attention)
    int window;        // sliding window w > 0: position i sees keys i - w < j <= i; 0: off
    // decode: q_pos0 read from the device when set (a captured CUDA graph replays every step)
    const int* q_pos0_dev;
    // decode: one arrival counter per (b, h), zero between launches (the last split re-arms it)
    unsigned* sem;
};

// The k/v head that query head h reads.
__device__ __forceinline__ int kv_head(const AttnParams& p, int h) { return h / (p.H / p.Hkv); }

// First key of query row r's document (padding or packing). Non-decreasing in r (checked on
// the host).
__device__ __forceinline__ int doc_start(const AttnParams& p, int b, int r) {
    if (p.start_mode == 0) return 0;
    if (p.start_mode == 1) return p.start[b];
    return p.start[b * p.tq + r];
}
// A key start s of the query at position pos, raised by the sliding window.
__device__ __forceinline__ int window_start(const AttnParams& p, int pos, int s) {
    return p.window > 0 ? max(s, pos - p.window + 1) : s;
}
// First key query row r of batch row b may see: the document start, raised by the window. Still
// non-decreasing in r, so every tile bound and skip derived from it (key tiles of a query block,
// query tiles of a key block, ACP's prefix) holds with a window as it does for documents. A row
// is padding iff its position is before its start (the window never moves a start past the row).
__device__ __forceinline__ int row_start(const AttnParams& p, int b, int r) {
    return window_start(p, p.q_pos0 + r, doc_start(p, b, r));
}

// The dk/dv passes' mask: whether key j is hidden from query row i (padding rows past tq, keys
// after the row's position or before its start); `st` points at the row's packed-document start
// (staged per query tile), read only when start_mode is 2. KeyMask holds what is the same for
// every score of a batch row, so that a tile's scores test it without branches.
struct KeyMask {
    int tq, q_pos0, window;
    int base;     // the rows' start unless packed: 0, or start[b] (left padding)
    bool packed;  // start_mode 2: each row's start from `st`
    __device__ __forceinline__ bool hides(int i, int j, const int* st) const {
        const int pos = i < tq ? q_pos0 + i : -1;
        int s = packed ? *st : base;
        if (window > 0) s = max(s, pos - window + 1);
        return j > pos || j < s;
    }
};
__device__ __forceinline__ KeyMask key_mask(const AttnParams& p, int b) {
    return KeyMask{p.tq, p.q_pos0, p.window, p.start_mode == 1 ? p.start[b] : 0, p.start_mode == 2};
}
__device__ __forceinline__ bool key_hidden(const AttnParams& p, int b, int i, int j, const int* st) {
    return key_mask(p, b).hides(i, j, st);
}

__device__ __forceinline__ u32 smem_u32(const void* ptr) {
    return (u32)__cvta_generic_to_shared(ptr);
}

// 16-byte asynchronous copy global -> shared; zero-fills when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    int sz = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(sz));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    int sz = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(sz));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* ptr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(ptr)));
}
__device__ __forceinline__ void ldsm_x4_t(u32& r0, u32& r1, u32& r2, u32& r3, const void* ptr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(ptr)));
}


// u32 shared-address variants (hot loops).
__device__ __forceinline__ void ldsm_x4a(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4a_t(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// Per-thread ldmatrix addresses into swizzled [rows, D] tiles, precomputed once so that the hot
// loops issue ldmatrix with a constant offset and no index arithmetic. A lane supplies row
// R0 + (lane & 7) + 8*hi8 and 16-byte chunk C + hi1 (R0 a multiple of 8, C even); its physical
// chunk is (C + hi1) ^ (lane & 7) = (C & ~7) + ((C & 7) ^ y) with y = hi1 ^ (lane & 7), so the
// four possible values of (C & 7) give four per-thread offsets.
//   p1: hi8 = lane >> 4, hi1 = (lane >> 3) & 1  -- B operands read from row-major [n][k] tiles
//   p2: hi8 = (lane >> 3) & 1, hi1 = lane >> 4  -- A operands, and B operands read transposed
template <int D>
struct Ldsm {
    u32 o1[4], o2[4];
    __device__ __forceinline__ void init() {
        const int lane = threadIdx.x & 31, r7 = lane & 7;
        const int y1 = ((lane >> 3) & 1) ^ r7, y2 = (lane >> 4) ^ r7;
        const u32 row1 = (u32)((r7 + 8 * (lane >> 4)) * D * 2);
        const u32 row2 = (u32)((r7 + 8 * ((lane >> 3) & 1)) * D * 2);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            o1[m] = row1 + (u32)(((2 * m) ^ y1) << 4);
            o2[m] = row2 + (u32)(((2 * m) ^ y2) << 4);
        }
    }
    __device__ __forceinline__ u32 p1(u32 base, int r0, int c) const {
        return base + (u32)(r0 * D * 2 + ((c & ~7) << 4)) + o1[(c & 7) >> 1];
    }
    __device__ __forceinline__ u32 p2(u32 base, int r0, int c) const {
        return base + (u32)(r0 * D * 2 + ((c & ~7) << 4)) + o2[(c & 7) >> 1];
    }
};

// D(16x8, f32) += A(16x16) * B(16x8), A row-major, B column-major.
template <bool BF>
__device__ __forceinline__ void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if constexpr (BF) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two floats -> one 32-bit word of two halves; `lo` lands in the low 16 bits (smaller column).
template <bool BF>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if constexpr (BF) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

template <bool BF>
__device__ __forceinline__ float to_f32(u16 x) {
    if constexpr (BF) {
        return __uint_as_float(((u32)x) << 16);
    } else {
        float f;
        asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(x));
        return f;
    }
}

// x rounded to the 16-bit type: its bits, and its value widened again.
template <bool BF>
__device__ __forceinline__ u16 to_half(float x) {
    return (u16)(pack2<BF>(x, 0.f) & 0xffffu);
}
template <bool BF>
__device__ __forceinline__ float round_half(float x) {
    return to_f32<BF>(to_half<BF>(x));
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Swizzled offset (in elements) of 16-byte chunk `ch` of row `row` in a [rows, D] tile:
// the chunk index is XORed with row % 8 so that ldmatrix's eight rows hit eight bank groups.
template <int D>
__device__ __forceinline__ int swz(int row, int ch) {
    return row * D + ((ch ^ (row & 7)) << 3);
}

// Copy rows [row0, row0 + R) of a strided [T, D] matrix (base points at row 0) into a swizzled
// shared tile; rows for which ok(row) is false are zero-filled.
template <int D, int R, int NTHREADS, class F>
__device__ __forceinline__ void load_tile(u16* s, const u16* base, long long st, int row0, F ok) {
    constexpr int C = D / 8;
#pragma unroll
    for (int i0 = 0; i0 < R * C; i0 += NTHREADS) {
        const int i = i0 + (int)threadIdx.x;
        if (R * C % NTHREADS != 0 && i >= R * C) break;
        const int r = i / C, c = i % C;
        const int gr = row0 + r;
        const bool valid = ok(gr);
        const u16* src = valid ? base + (long long)gr * st + c * 8 : base;
        cp_async16(s + swz<D>(r, c), src, valid);
    }
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}
// The maximum of a score row across its quad: row half rr (row g, or g + 8) of this thread's NT
// tiles in mma.sync's C layout, S[4 nt + e] = tile nt's element e.
template <int NT>
__device__ __forceinline__ float row_max(const float* S, int rr) {
    float mx = NEG_INF;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(S[4 * nt + 2 * rr], S[4 * nt + 2 * rr + 1]));
    return quad_max(mx);
}
// The online softmax's probabilities of that row half in place, e^{S − muse} (in log2 units), and
// this thread's part of their sum.
template <int NT>
__device__ __forceinline__ float row_exp_sum(float* S, int rr, float muse) {
    float rs = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const float p0 = fast_exp2(S[4 * nt + 2 * rr] - muse);
        const float p1 = fast_exp2(S[4 * nt + 2 * rr + 1] - muse);
        S[4 * nt + 2 * rr] = p0;
        S[4 * nt + 2 * rr + 1] = p1;
        rs += p0 + p1;
    }
    return rs;
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

// The key tiles of width BK a block of query rows [r0, rlast] must visit: tiles jbase + i*BK for
// i in [first, ntiles). Keys before the block's first row's start are invisible to every row of
// the block (starts are non-decreasing); ACP skips the prefix of tiles whose largest bias
// c_{r0} - c_{tile's last key} is below the threshold, found by binary search since the bias
// bound is monotone along the tiles of one document.
template <int BK>
__device__ __forceinline__ void key_tiles(const AttnParams& p, int b, int bh, int r0, int rlast, int& jbase,
                                          int& first, int& ntiles) {
    const int kstart = row_start(p, b, r0);
    const int kend = min(p.q_pos0 + rlast + 1, p.tk);
    jbase = (kstart / BK) * BK;
    ntiles = kend > kstart ? (kend - jbase + BK - 1) / BK : 0;
    first = 0;
    if (p.prune != nullptr && ntiles > 0) {
        const float delta = p.prune[bh];
        const float ci0 = p.cq[(long long)bh * p.tq + r0];
        const int pos0 = p.q_pos0 + r0;
        int lo = 0, hi = ntiles;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            const int jl = jbase + mid * BK + BK - 1;
            const bool pruned = jl < pos0 && (ci0 - p.ck[(long long)bh * p.tk + jl]) < delta;
            if (pruned) lo = mid + 1;
            else hi = mid;
        }
        first = lo;
    }
}

// The profile's counters, when asked for: the key tiles a query block visits and those pruned
// before its first.
__device__ __forceinline__ void count_tiles(const AttnParams& p, int first, int ntiles) {
    if (p.counters == nullptr) return;
    atomicAdd(&p.counters[0], (u64)(ntiles - first));
    atomicAdd(&p.counters[1], (u64)first);
}

// Whether a dk/dv pass's query tile of bqb rows from rq needs the key mask against keys j0..jlast:
// it reaches the diagonal, a row of it starts after the block's first key, or it runs past tq.
__device__ __forceinline__ bool dkdv_tile_masked(const AttnParams& p, int b, int rq, int bqb, int j0, int jlast) {
    const int rql = min(rq + bqb, p.tq) - 1;
    return (p.q_pos0 + rq < jlast) || (row_start(p, b, rql) > j0) || (rq + bqb > p.tq);
}

// The dk/dv passes' query tiles of BQB rows for the key block ending at jlast, for query head bh:
// [qfirst, returned end). A tile stops seeing the block when its first row's key start is past
// the block (a later document, or the window has moved on) or ACP prunes it; both are monotone
// in the tile index, so the end is found by binary search.
__device__ __forceinline__ int dkdv_query_end(const AttnParams& p, int b, int bh, int qfirst, int bqb, int jlast) {
    const int nqb = (p.tq + bqb - 1) / bqb;
    const float delta = p.prune != nullptr ? p.prune[bh] : 0.f;
    const float cjl = p.ck[(long long)bh * p.tk + jlast];
    int lo = qfirst, hi = nqb;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        const int rq = mid * bqb;
        bool stop = row_start(p, b, rq) > jlast;
        if (!stop && p.prune != nullptr)
            stop = jlast < p.q_pos0 + rq && (p.cq[(long long)bh * p.tq + rq] - cjl) < delta;
        if (stop) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}
