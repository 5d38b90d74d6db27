// ---- the decode megakernel ----------------------------------------------------------------------
// A whole batch-1 bf16 decode step of an attention model (every layer attention + SwiGLU MLP) in
// one launch: one 256-thread block per SM, all resident, the layers' stages separated by grid-wide
// barriers. At batch 1 the fused step's nine launches a layer are latency, not bytes; here a
// stage's weights are prefetched into L2 (cp.async.bulk.prefetch) a stage or more ahead, so the
// memory streams them while the blocks wait at barriers. Stages of layer l:
//   1. x -> RMSNorm (every block, into shared memory) -> the stacked input projections p (f32),
//      rows spread over all warps of the grid;                                         [barrier]
//   2. decode_in (decode.cu) of head h on block h, which then raises the head's flag;
//   3. attention of the one query over the cache, each head's keys split over S blocks (after
//      the head's flag), each split's partial (o, max, sum) to memory;                  [barrier]
//   4. every block merges the splits and applies the output norm and gate (decode_out's
//      formulas) into z, then o_proj: h = x + o_proj(z);                                [barrier]
//   5. RMSNorm(h) (every block) -> gate_proj with SwiGLU into u;                        [barrier]
//   6. down_proj: x = h + down_proj(u).                                                 [barrier]
// then the final norm into `final_out` (the head and the sampler stay separate kernels). Values
// are rounded to bf16 where the fused step stores them, so the two agree to the order of sums.
// Data written in this launch by other blocks is read after a barrier or flag (acquire), never
// before; the weights and the cache's earlier positions are read-only here.

#define MEGA_THREADS 256
#define MEGA_WARPS (MEGA_THREADS / 32)
#define MEGA_MAXL 32
// Stamps a block records (room for): the start, then arrival and departure at each of the 5L barriers.
#define MEGA_STAMPS (2 + 2 * (5 * MEGA_MAXL + 1))
#define LOG2E_F 1.4426950408889634f
#define MEGA_NEG_INF __int_as_float(0xff800000)

// One layer's weights (static: uploaded once), as `MegaLayer` in backend/cuda/mega.rs.
struct MegaLayer {
    const u16* w_in;    // stacked input projections [width, d]
    const u16* w_o;     // o_proj [d, H·D]
    const u16* w_gu;    // gate_proj [2I, d]: gate rows, then up rows
    const u16* w_down;  // down_proj [d, I]
    const float* norm1;  // mixer norm [d]
    const float* norm2;  // MLP norm [d]
    const float* q_norm;  // [qn_groups, D] or null
    const float* k_norm;
    const float* fgate_bias;  // [H] or null
    const float* out_norm;    // [H·D] or null
    int width, q_off, k_off, ks_off, v_off, vs_off, f_off, og_off, qn_groups, kn_groups;
};

// A step's arguments, as `MegaStep` in backend/cuda/mega.rs.
struct MegaStep {
    const MegaLayer* layers;
    const u16* emb;  // [vocab, d]
    const int* ids;  // [1]
    const float* final_norm;
    u16* x;  // [d] the residual stream between layers
    u16* h;  // [d] after the attention's residual
    u16* u;  // [I] SwiGLU output
    float* p;  // [widest] stacked projections' output
    u16* q;  // [H·D]
    float* c;  // [H]
    u16* final_out;  // [d]
    float* part;  // [H, S, D + 2] the splits' partial outputs, max and sum (log2 units)
    unsigned* flags;  // [L, H] decode_in done (re-armed after the attention's barrier)
    unsigned* bar;  // [2] barrier count and generation
    const int* positions;
    const int* lenp;
    u64* stamps;  // [grid, MEGA_STAMPS] %globaltimer at each barrier (null: not recorded)
    double rope_base;
    int len, L, d, H, D, I, vocab, cap, splits;
    float eps, out_eps, qk_eps, scale;
    u64 kc[MEGA_MAXL], vc[MEGA_MAXL], cc[MEGA_MAXL], ksh[MEGA_MAXL], vsh[MEGA_MAXL];
};

__device__ __forceinline__ void red_release_add(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Every block of the grid waits here for all the others: a count that the last arrival re-arms
// and a generation it advances (both persist from launch to launch, so a CUDA graph can replay).
// The arrival is a release and the wait an acquire: what a block wrote before the barrier is
// visible to every block after it. With `stamps`, thread 0 records its arrival and departure.
__device__ __forceinline__ u64 mega_now() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned atom_add_acq_rel(unsigned* p, unsigned v) {
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ void grid_sync(unsigned* bar, u64* stamps, int& k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        if (stamps != nullptr) stamps[k] = mega_now();
        const unsigned g = ld_acquire(bar + 1);
        if (atom_add_acq_rel(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            red_release_add(bar + 1, 1u);
        } else {
            while (ld_acquire(bar + 1) == g) {
            }
        }
        if (stamps != nullptr) stamps[k + 1] = mega_now();
    }
    k += 2;
    __syncthreads();
}

// Starts moving `bytes` (a multiple of 16, 16-byte aligned) towards L2 without waiting.
// (A no-op before sm_90, so that this module still compiles for the other kernels there.)
__device__ __forceinline__ void prefetch_l2(const void* p, long long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    while (bytes > 0) {
        const unsigned n = (unsigned)min(bytes, (long long)(1 << 20));
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
        p = (const char*)p + n;
        bytes -= n;
    }
#endif
}

// This warp's rows [r0, r1) of `rows` spread over every warp of the grid.
__device__ __forceinline__ void warp_rows(int rows, int& r0, int& r1) {
    const int gw = blockIdx.x * MEGA_WARPS + (threadIdx.x >> 5), nw = gridDim.x * MEGA_WARPS;
    const int per = (rows + nw - 1) / nw;
    r0 = min(gw * per, rows);
    r1 = min(r0 + per, rows);
}

// Lane 0 of each warp prefetches its rows of w [rows, K] (and with `glu`, the matching rows
// `rows` further on, gate_proj's up half).
__device__ __forceinline__ void prefetch_rows(const u16* w, int rows, int K, bool glu) {
    if ((threadIdx.x & 31) != 0) return;
    int r0, r1;
    warp_rows(rows, r0, r1);
    if (r1 <= r0) return;
    prefetch_l2(w + (long long)r0 * K, (long long)(r1 - r0) * K * 2);
    if (glu) prefetch_l2(w + (long long)(rows + r0) * K, (long long)(r1 - r0) * K * 2);
}

__device__ __forceinline__ float mega_warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float bf_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float dot8(uint4 w, const float* v) {
    const float4 a = *(const float4*)v, b = *(const float4*)(v + 4);
    float s = bf_lo(w.x) * a.x;
    s += bf_hi(w.x) * a.y;
    s += bf_lo(w.y) * a.z;
    s += bf_hi(w.y) * a.w;
    s += bf_lo(w.z) * b.x;
    s += bf_hi(w.z) * b.y;
    s += bf_lo(w.w) * b.z;
    s += bf_hi(w.w) * b.w;
    return s;
}

// y_r = w[r, :] . v for this warp's rows of `rows` (with GLU: gate row r and up row rows + r
// together), `emit(r, y)` / `emit(r, gate, up)` in lane 0. The warp's first R·C loads of weights
// are issued before `before()` (the barrier and the input vector's load, which the weights do
// not depend on), so their latency overlaps the wait; every thread of the block calls `before`
// once.
template <bool GLU, int R, int C, class B, class F>
__device__ __forceinline__ void gemv_stage_rc(const u16* w, int rows, int K, B before, const float* v, F emit) {
    const int lane = threadIdx.x & 31;
    int r0, r1;
    warp_rows(rows, r0, r1);
    constexpr int G = GLU ? R / 2 : R;  // outputs per round
    auto row_ptrs = [&](int r, const u16* (&rp)[R]) {
#pragma unroll
        for (int k = 0; k < G; ++k) {
            const bool on = r + k < r1;
            if constexpr (GLU) {
                rp[2 * k] = on ? w + (long long)(r + k) * K : nullptr;
                rp[2 * k + 1] = on ? w + (long long)(rows + r + k) * K : nullptr;
            } else {
                rp[k] = on ? w + (long long)(r + k) * K : nullptr;
            }
        }
    };
    auto load = [&](const u16* const (&rp)[R], int base, uint4 (&wv)[R][C]) {
#pragma unroll
        for (int q = 0; q < R; ++q)
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int k = base + (c * 32 + lane) * 8;
                if (rp[q] != nullptr && k < K) wv[q][c] = __ldg((const uint4*)(rp[q] + k));
                else wv[q][c] = make_uint4(0u, 0u, 0u, 0u);
            }
    };
    uint4 first[R][C];
    {
        const u16* rp[R];
        row_ptrs(r0, rp);
        load(rp, 0, first);
    }
    before();
    for (int r = r0; r < r1; r += G) {
        const u16* rp[R];
        row_ptrs(r, rp);
        float acc[R];
#pragma unroll
        for (int q = 0; q < R; ++q) acc[q] = 0.f;
        for (int base = 0; base < K; base += 32 * 8 * C) {
            uint4 wv[R][C];
            if (r == r0 && base == 0) {
#pragma unroll
                for (int q = 0; q < R; ++q)
#pragma unroll
                    for (int c = 0; c < C; ++c) wv[q][c] = first[q][c];
            } else {
                load(rp, base, wv);
            }
#pragma unroll
            for (int q = 0; q < R; ++q)
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    const int k = base + (c * 32 + lane) * 8;
                    if (k < K) acc[q] += dot8(wv[q][c], v + k);
                }
        }
        float y[R];
#pragma unroll
        for (int q = 0; q < R; ++q) y[q] = mega_warp_sum(acc[q]);
        if (lane == 0) {
#pragma unroll
            for (int k = 0; k < G; ++k) {
                if (r + k >= r1) break;
                if constexpr (GLU) emit(r + k, y[2 * k], y[2 * k + 1]);
                else emit(r + k, y[k]);
            }
        }
    }
}

// R and C by the row length, at most 16 loads of 16 bytes in flight per lane.
template <bool GLU, class B, class F>
__device__ __forceinline__ void gemv_stage(const u16* w, int rows, int K, B before, const float* v, F emit) {
    if (K <= 1024) gemv_stage_rc<GLU, 4, 4>(w, rows, K, before, v, emit);
    else gemv_stage_rc<GLU, 2, 8>(w, rows, K, before, v, emit);
}

// Sum over the block, returned to every thread.
__device__ __forceinline__ float mega_block_sum(float v, float* sh) { return block_total<MEGA_WARPS>(v, sh); }

// dst = src (n bf16 values written in this launch: read through L2).
__device__ __forceinline__ void load_vec(float* dst, const u16* src, int n) {
    for (int i = threadIdx.x; i < n; i += MEGA_THREADS) dst[i] = __uint_as_float(((unsigned)__ldcg(src + i)) << 16);
    __syncthreads();
}

// y = RMSNorm(x) · w rounded to bf16 (x already bf16 values), as ops.cu's norm_row.
__device__ __forceinline__ void norm_vec(float* y, const float* x, const float* w, int n, float eps, float* red) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += MEGA_THREADS) ss += x[i] * x[i];
    const float s = 1.f / sqrtf(mega_block_sum(ss, red) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += MEGA_THREADS) y[i] = round_to<u16>(x[i] * s * w[i]);
    __syncthreads();
}

// The keys of split s of n: [j0, j1).
__device__ __forceinline__ void split_keys(int n, int S, int s, int& j0, int& j1) {
    const int per = (n + S - 1) / S;
    j0 = min(s * per, n);
    j1 = min(j0 + per, n);
}

// Stage 3 for (head h, split s): the query of decode_in against keys [j0, j1) of the cache, a
// group of D / 8 lanes per key (16 bytes each), online softmax per group, then the groups merged
// in shared memory into the split's partial (o, max, sum) in log2 units.
__device__ void mega_attend(const MegaStep& m, int l, int h, int s, float* sh) {
    const int D = m.D, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int lpk = D / 8, gpw = 32 / lpk, ng = MEGA_WARPS * gpw;
    const int g = warp * gpw + lane / lpk, sub = lane % lpk;
    const int len = cached_len(m.lenp, m.len);
    int j0, j1;
    split_keys(len + 1, m.splits, s, j0, j1);
    // the head's decode_in is done (flag raised by its block, reset by the merging split)
    if (threadIdx.x == 0)
        while (ld_acquire(m.flags + l * m.H + h) == 0u) {
        }
    __syncthreads();
    const u16* kc = (const u16*)m.kc[l] + (long long)h * m.cap * D + sub * 8;
    const u16* vc = (const u16*)m.vc[l] + (long long)h * m.cap * D + sub * 8;
    const float* cc = (const float*)m.cc[l] + (long long)h * m.cap;
    float q[8], acc[8];
    {
        const uint4 qw = __ldcg((const uint4*)(m.q + (long long)h * D + sub * 8));
        q[0] = bf_lo(qw.x), q[1] = bf_hi(qw.x), q[2] = bf_lo(qw.y), q[3] = bf_hi(qw.y);
        q[4] = bf_lo(qw.z), q[5] = bf_hi(qw.z), q[6] = bf_lo(qw.w), q[7] = bf_hi(qw.w);
    }
    const float cq = __ldcg(m.c + h), scale_log2 = m.scale * LOG2E_F;
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = 0.f;
    float mx = MEGA_NEG_INF, sum = 0.f;
    // the warp's rounds are uniform (shuffles within groups); a group past j1 masks its key
#pragma unroll 2
    for (int jb = j0 + warp * gpw; jb < j1; jb += ng) {
        const int j = jb + lane / lpk;
        const bool on = j < j1;
        // the position written in this launch (j = len) through L2, the rest as read-only data
        uint4 kw = make_uint4(0u, 0u, 0u, 0u), vw = kw;
        float ck = 0.f;
        if (on) {
            if (j == len) {
                kw = __ldcg((const uint4*)(kc + (long long)j * D));
                vw = __ldcg((const uint4*)(vc + (long long)j * D));
                ck = __ldcg(cc + j);
            } else {
                kw = __ldg((const uint4*)(kc + (long long)j * D));
                vw = __ldg((const uint4*)(vc + (long long)j * D));
                ck = __ldg(cc + j);
            }
        }
        float dot = bf_lo(kw.x) * q[0] + bf_hi(kw.x) * q[1] + bf_lo(kw.y) * q[2] + bf_hi(kw.y) * q[3] +
                    bf_lo(kw.z) * q[4] + bf_hi(kw.z) * q[5] + bf_lo(kw.w) * q[6] + bf_hi(kw.w) * q[7];
        for (int o = lpk / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (!on) continue;
        const float x = dot * scale_log2 + (cq - ck) * LOG2E_F;
        const float mn = fmaxf(mx, x);
        const float corr = exp2f(mx - mn), pj = exp2f(x - mn);
        sum = sum * corr + pj;
        const float v[8] = {bf_lo(vw.x), bf_hi(vw.x), bf_lo(vw.y), bf_hi(vw.y),
                            bf_lo(vw.z), bf_hi(vw.z), bf_lo(vw.w), bf_hi(vw.w)};
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] = acc[k] * corr + pj * v[k];
        mx = mn;
    }
    // merge the groups: sO [ng][D], sM, sL [ng]
    float* sO = sh;
    float* sM = sO + ng * D;
    float* sL = sM + ng;
#pragma unroll
    for (int k = 0; k < 8; ++k) sO[g * D + sub * 8 + k] = acc[k];
    if (sub == 0) {
        sM[g] = mx;
        sL[g] = sum;
    }
    __syncthreads();
    float* part = m.part + ((long long)h * m.splits + s) * (D + 2);
    for (int d = threadIdx.x; d < D; d += MEGA_THREADS) {
        float M = MEGA_NEG_INF;
        for (int k = 0; k < ng; ++k) M = fmaxf(M, sM[k]);
        const float Mu = M == MEGA_NEG_INF ? 0.f : M;
        float L = 0.f, o = 0.f;
        for (int k = 0; k < ng; ++k) {
            const float wt = exp2f(sM[k] - Mu);
            L += sL[k] * wt;
            o += sO[k * D + d] * wt;
        }
        part[d] = o;
        if (d == 0) {
            part[D] = M;
            part[D + 1] = L;
        }
    }
}

// After the attention's barrier every block merges each head's splits into o (rounded to bf16 as
// the fused step stores it), then applies decode_out's output norm and gate, into v (o_proj's
// input): a warp per head, up to 8 channels a lane. Merging in every block costs one parallel
// read of the partials; merging in the last split to finish cost a dependent round trip for its
// count, one for the partials and decode_out's before the barrier.
__device__ void mega_heads_out(const MegaStep& m, const MegaLayer& ly, float* v) {
    const int D = m.D, S = m.splits, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int h = warp; h < m.H; h += MEGA_WARPS) {
        const float* part = m.part + (long long)h * S * (D + 2);
        float M = MEGA_NEG_INF, L = 0.f, acc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll 4
        for (int s = 0; s < S; ++s) {
            const float* ps = part + (long long)s * (D + 2);
            const float ms = __ldcg(ps + D), ls = __ldcg(ps + D + 1);
            float os[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) os[i] = lane + 32 * i < D ? __ldcg(ps + lane + 32 * i) : 0.f;
            if (ms == MEGA_NEG_INF) continue;  // a split without keys
            const float mn = fmaxf(M, ms), a = exp2f(M - mn), b = exp2f(ms - mn);
            L = L * a + ls * b;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] = acc[i] * a + os[i] * b;
            M = mn;
        }
        float o[8], ss = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            o[i] = round_to<u16>(L > 0.f ? acc[i] / L : 0.f);
            ss += o[i] * o[i];
        }
        if (ly.out_norm != nullptr) {
            const float r = 1.f / sqrtf(mega_warp_sum(ss) / (float)D + m.out_eps);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int d = lane + 32 * i;
                if (d < D) o[i] = round_to<u16>(o[i] * r * ly.out_norm[(long long)h * D + d]);
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int d = lane + 32 * i;
            if (d >= D) continue;
            float x = o[i];
            if (ly.og_off >= 0) x *= sigmoid_gate(round_to<u16>(__ldcg(m.p + ly.og_off + (long long)h * D + d)));
            v[h * D + d] = round_to<u16>(x);
        }
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(MEGA_THREADS, 1) fox_decode_mega_bf16(const MegaStep m) {
    extern __shared__ __align__(16) float smem[];
    __shared__ float red[MEGA_WARPS];
    const int d = m.d, I = m.I, HD = m.H * m.D;
    const int vmax = max(max(d, I), HD);
    float* xs = smem;         // [d] the residual stream x
    float* hs = xs + d;       // [d] h
    float* vin = hs + d;      // [vmax] the stage's input vector
    float* att = vin + vmax;  // the attention's scratch
    const int len = cached_len(m.lenp, m.len);
    const int units = m.H * m.splits;
    u64* stamps = m.stamps != nullptr ? m.stamps + (long long)blockIdx.x * MEGA_STAMPS : nullptr;
    int k = 1;  // the next stamp (0: the kernel's start)
    if (stamps != nullptr && threadIdx.x == 0) stamps[0] = mega_now();
    auto prefetch_cache = [&](int l) {
        if (threadIdx.x != 0) return;
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            const int h = u / m.splits, s = u % m.splits;
            int j0, j1;
            split_keys(len + 1, m.splits, s, j0, j1);
            j1 = min(j1, len);  // the cached positions (len is this step's)
            if (j1 <= j0) continue;
            const long long at = ((long long)h * m.cap + j0) * m.D, n = (long long)(j1 - j0) * m.D * 2;
            prefetch_l2((const u16*)m.kc[l] + at, n);
            prefetch_l2((const u16*)m.vc[l] + at, n);
        }
    };
    prefetch_rows(m.layers[0].w_in, m.layers[0].width, d, false);
    prefetch_cache(0);
    for (int l = 0; l < m.L; ++l) {
        const MegaLayer& ly = m.layers[l];
        // 1. the stacked input projections of RMSNorm(x), x the embedding or the last layer's
        prefetch_rows(ly.w_o, d, HD, false);
        float* p = m.p;
        gemv_stage<false>(
            ly.w_in, ly.width, d,
            [&] {
                if (l == 0) {
                    const int id = __ldg(m.ids);
                    const bool ok = id >= 0 && id < m.vocab;
                    for (int i = threadIdx.x; i < d; i += MEGA_THREADS)
                        xs[i] = ok ? __uint_as_float(((unsigned)__ldg(m.emb + (long long)id * d + i)) << 16) : 0.f;
                    __syncthreads();
                } else {
                    grid_sync(m.bar, stamps, k);
                    load_vec(xs, m.x, d);
                }
                norm_vec(vin, xs, ly.norm1, d, m.eps, red);
            },
            vin, [&](int r, float y) { p[r] = y; });
        grid_sync(m.bar, stamps, k);
        // 2. decode_in of head h on block h
        for (int h = blockIdx.x; h < m.H; h += gridDim.x) {
            DecodeIn di;
            di.p = m.p;
            di.q = m.q;
            di.c = m.c;
            di.kc = (void*)m.kc[l];
            di.vc = (void*)m.vc[l];
            di.cc = (float*)m.cc[l];
            di.k_shift = (void*)m.ksh[l];
            di.v_shift = (void*)m.vsh[l];
            di.q_norm = ly.q_norm;
            di.k_norm = ly.k_norm;
            di.fgate_bias = ly.fgate_bias;
            di.positions = m.positions;
            di.lenp = m.lenp;
            di.rope_base = m.rope_base;
            di.ldp = ly.width;
            di.q_off = ly.q_off;
            di.k_off = ly.k_off;
            di.ks_off = ly.ks_off;
            di.v_off = ly.v_off;
            di.vs_off = ly.vs_off;
            di.f_off = ly.f_off;
            di.B = 1;
            di.H = m.H;
            di.D = m.D;
            di.cap = m.cap;
            di.len = m.len;
            di.qn_groups = ly.qn_groups;
            di.kn_groups = ly.kn_groups;
            di.qk_eps = m.qk_eps;
            decode_in<u16>(di, h);
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) st_release(m.flags + l * m.H + h, 1u);
        }
        // 3. attention, split over blocks
        prefetch_rows(ly.w_gu, I, d, true);
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            const int h = u / m.splits, s = u % m.splits;
            mega_attend(m, l, h, s, att);
            __syncthreads();
        }
        // 4. h = x + o_proj(z), z the merged splits after the output norm and gate
        prefetch_rows(ly.w_down, d, I, false);
        u16* hg = m.h;
        gemv_stage<false>(
            ly.w_o, d, HD,
            [&] {
                grid_sync(m.bar, stamps, k);
                // every wait for this layer's decode_in is over: re-arm its flags
                if (blockIdx.x == 0)
                    for (int h = threadIdx.x; h < m.H; h += MEGA_THREADS) m.flags[l * m.H + h] = 0u;
                mega_heads_out(m, ly, vin);
            },
            vin, [&](int r, float y) { st(hg, r, xs[r] + round_to<u16>(y)); });
        // 5. u = SwiGLU(gate_proj(RMSNorm(h)))
        if (l + 1 < m.L) {
            prefetch_rows(m.layers[l + 1].w_in, m.layers[l + 1].width, d, false);
            prefetch_cache(l + 1);
        }
        u16* ug = m.u;
        gemv_stage<true>(
            ly.w_gu, I, d,
            [&] {
                grid_sync(m.bar, stamps, k);
                load_vec(hs, m.h, d);
                norm_vec(vin, hs, ly.norm2, d, m.eps, red);
            },
            vin, [&](int r, float g, float up) {
                const float gr = round_to<u16>(g), ur = round_to<u16>(up);
                st(ug, r, gr * sigmoid_gate(gr) * ur);
            });
        // 6. x = h + down_proj(u)
        u16* xg = m.x;
        gemv_stage<false>(
            ly.w_down, d, I,
            [&] {
                grid_sync(m.bar, stamps, k);
                load_vec(vin, m.u, I);
            },
            vin, [&](int r, float y) { st(xg, r, hs[r] + round_to<u16>(y)); });
    }
    // the final norm (block 0)
    grid_sync(m.bar, stamps, k);
    if (blockIdx.x == 0) {
        load_vec(xs, m.x, d);
        norm_vec(vin, xs, m.final_norm, d, m.eps, red);
        for (int i = threadIdx.x; i < d; i += MEGA_THREADS) st(m.final_out, i, vin[i]);
    }
}
