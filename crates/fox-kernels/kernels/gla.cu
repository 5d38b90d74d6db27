// Gated linear attention with a per-channel forget gate (GLA, HGRN2's token mixer) and HGRN2's
// gates and lower bounds on the GPU: the twins of crate::gla and of the elementwise ops of
// foxlm's model/hgrn2/cpu.rs (layouts as documented there: q, k, g [B, T, H, K], v, o [B, T, H, V],
// states [B, H, K, V]). Activations are ET: this file is compiled twice (cuda/compile.rs), with
// ET = float and KN(name) = name_f32, then ET = u16 (bf16 bits, see elem.cuh) and KN(name) =
// name_bf16. Everything else (the gate's prefix sums, states, scores, partial sums) is f32, and
// all arithmetic is f32 on CUDA cores (version 1: no tensor cores). Deterministic: no atomics;
// every sum runs in a fixed order. The element-independent part below is compiled once.
//
// The chunked form, per (b, h) and chunk of L = 64 positions (G_i = Σ_{s ≤ i} g_s from the chunk's
// start, per channel; S_c the state entering chunk c):
//   o_i = scale · (Σ_c q_ic e^{G_ic} S_c[c, :] + Σ_{j ≤ i} A_ij v_j),  A_ij = Σ_c q_ic k_jc e^{G_ic − G_jc}
//   S_{c+1} = Diag(e^{G_L}) S_c + Σ_j (k_j ⊙ e^{G_L − G_j}) v_jᵀ
// Every exponent is ≤ 0. The products of A between different sub-chunks of 16 (i in sub-chunk I,
// j in J < I) factor through a reference point r inside the chunk, q_ic e^{G_ic − G_rc} times
// k_jc e^{G_rc − G_jc} with r the first position of I (both factors ≤ 1, so neither overflows),
// which makes them matrix products; within a sub-chunk A_ij takes e^{G_ic − G_jc} per element.
// Positions before a row's start (left padding) and past T read as q = k = v = g = 0: the state
// passes through them, and their outputs and gradients are written as 0.
//
// Forward (gla_fwd in cuda/gla.rs): gla_cumsum (G), gla_chunk_h (each chunk's own state), the
// state passing gla_scan_fwd (the one sequential step, one thread per state element),
// gla_scores (A), gla_fwd_o (o). Backward: the same states again, gla_chunk_h on (q, do) and the
// reverse passing gla_scan_bwd (dH_c, the gradient of the state leaving chunk c), gla_dscores
// (dA_ij = scale · do_i·v_j), gla_bwd_dv, gla_bwd_dqk (dq, dk and dg; see there). Version 3 (bf16)
// replaces gla_chunk_h + gla_scan_fwd by the walk gla_walk_tc_k* and the forward's gla_fwd_o by
// gla_fwd_o_w_k* (see there); opt-in, its forward's gla_scores by gla_scores_w_k* (tensor cores,
// bf16 A) read by gla_fwd_o_w16_k*.

#ifndef GLA_ONCE
#define GLA_ONCE
#define GLA_L 64      // chunk (crate::gla::CHUNK)
#define GLA_KT 32     // inner tile of the products
#define GLA_AHEAD 16  // chunks whose loads the state passing issues together
#define GLA_DECODE_KMAX 256
// Dynamic shared memory of gla_bwd_dqk (the host emulation declares its own).
#ifndef GLA_DSMEM
#define GLA_DSMEM(name) extern __shared__ float name[]
#endif

// The row of position t of (b, h) in a [B, T, H, ·] tensor.
__device__ __forceinline__ long gla_row(int b, int t, int T, int H, int h) { return ((long)b * T + t) * H + h; }

// The state passing (elem.cuh's chunk_pass), one thread per state element (row kc of (b, h)): x
// enters as x0[i] (or 0), chunk c decays it by e^{G_L,c}; out (if any) gets the last x, and
// without REV also slot nch. out may be x0 (each thread reads its element before it writes it).
template <bool REV>
__device__ __forceinline__ void gla_scan(float* slots, float* out, const float* x0, const float* G, int B, int T,
                                         int H, int K, int V, int nch) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long KV = (long)K * V;
    if (i >= (long)B * H * KV) return;
    long bh = i / KV, e = i % KV;
    int b = (int)(bh / H), h = (int)(bh % H), kc = (int)(e / V);
    float x = x0 ? x0[i] : 0.0f;
    float* p = slots + bh * (REV ? nch : nch + 1) * KV + e;
    x = chunk_pass<REV, GLA_AHEAD>(p, KV, x, nch, [&](int c) {
        return __expf(G[gla_row(b, min(c * GLA_L + GLA_L - 1, T - 1), T, H, h) * K + kc]);
    });
    if (!REV) p[(long)nch * KV] = x;
    if (out) out[i] = x;
}

// Forward: S_0 = init (or 0); slot c of hs [B, H, nch + 1, K, V] holds the chunk's own state and
// gets S_c (S_{c+1} = e^{G_L,c} S_c + that); slot nch and fin (if any) get the final state.
extern "C" __global__ void gla_scan_fwd(float* hs, float* fin, const float* init, const float* G, int B, int T,
                                        int H, int K, int V, int nch) {
    gla_scan<false>(hs, fin, init, G, B, T, H, K, V, nch);
}

// The reverse passing: slot c of dhs [B, H, nch, K, V] holds the chunk's own ΔdS_c = scale ·
// (q ⊙ e^G)ᵀ do and becomes dH_c, the gradient of the state leaving chunk c (dH_{nch−1} = dfin or
// 0; dH_{c−1} = e^{G_L,c} dH_c + ΔdS_c); dinit (if any) gets e^{G_L,0} dH_0 + ΔdS_0.
extern "C" __global__ void gla_scan_bwd(float* dhs, float* dinit, const float* dfin, const float* G, int B, int T,
                                        int H, int K, int V, int nch) {
    gla_scan<true>(dhs, dinit, dfin, G, B, T, H, K, V, nch);
}

// dst[j] = Σ_p part[p · width + j] for j < width, p in order (the lower bound's gradient row).
extern "C" __global__ void gla_colsum_set(float* dst, const float* part, int nparts, int width) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    float s = 0.0f;
    for (int p = 0; p < nparts; ++p) s += part[(long)p * width + j];
    dst[j] = s;
}

// The softmax over layers of column c of raw [L, d], in f64: its maximum m and the sum z of
// e^{raw − m}, so that p_l = e^{raw_l − m} / z.
__device__ __forceinline__ void hgrn2_softmax_norm(const float* raw, int L, int d, int c, double& m, double& z) {
    m = raw[c];
    for (int l = 1; l < L; ++l) m = fmax(m, (double)raw[(long)l * d + c]);
    z = 0.0;
    for (int l = 0; l < L; ++l) z += exp((double)raw[(long)l * d + c] - m);
}

// HGRN2's lower bounds, one thread per column c of raw [L, d] (in f64, as the CPU): p = the
// softmax over layers; lb[0] = 0, lb[l] = Σ_{1 ≤ j ≤ l} p_j.
extern "C" __global__ void hgrn2_lower_bounds_fwd(float* lb, const float* raw, int L, int d) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    double m, z;
    hgrn2_softmax_norm(raw, L, d, c, m, z);
    double sum = 0.0;
    lb[c] = 0.0f;
    for (int l = 1; l < L; ++l) {
        sum += exp((double)raw[(long)l * d + c] - m) / z;
        lb[(long)l * d + c] = (float)sum;
    }
}

// The lower bounds' backward: grad [L, d] += the softmax's backward of dp_j = Σ_{l ≥ j} dlb_l
// (j ≥ 1; dp_0 = 0), draw_j = p_j (dp_j − Σ_i p_i dp_i). Row 0 of dlb is not read.
extern "C" __global__ void hgrn2_lower_bounds_bwd(float* grad, const float* dlb, const float* raw, int L, int d) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    double m, z;
    hgrn2_softmax_norm(raw, L, d, c, m, z);
    // dot = Σ_j p_j dp_j, with dp_j the suffix sums (from the last layer down).
    double suffix = 0.0, dot = 0.0;
    for (int j = L - 1; j >= 1; --j) {
        suffix += (double)dlb[(long)j * d + c];
        dot += exp((double)raw[(long)j * d + c] - m) / z * suffix;
    }
    suffix = 0.0;
    for (int j = L - 1; j >= 0; --j) {
        if (j >= 1) suffix += (double)dlb[(long)j * d + c];
        const double p = exp((double)raw[(long)j * d + c] - m) / z, dp = j >= 1 ? suffix : 0.0;
        grad[(long)j * d + c] += (float)(p * (dp - dot));
    }
}
// G of chunk row r (clamped to the chunk's last real row: past T the prefix sums stay put),
// column kc of (b, h).
__device__ __forceinline__ float gla_g(const float* G, int b, int t0, int r, int len, int T, int H, int h, int K,
                                       int kc) {
    return G[gla_row(b, t0 + min(r, len - 1), T, H, h) * K + kc];
}

// Chunk c of (b, h) = bh: its first position t0, its len positions (fewer than L only at the end)
// and the row's start (left padding before it).
struct GlaChunk {
    int b, h, t0, len, first;
};
__device__ __forceinline__ GlaChunk gla_chunk(int c, int bh, int T, int H, const int* start) {
    const int b = bh / H, h = bh % H;
    const int t0 = c * GLA_L, len = min(GLA_L, T - t0);
    const int first = start ? start[b] : 0;
    return {b, h, t0, len, first};
}

// The block's tile of gla_chunk_h (either version): chunk c of (b, h), state rows k0.. and
// columns v0..; gl [64] = the chunk's last G of the tile's channels (0 past K), read by all threads.
struct GlaChunkTile {
    int c, bh, b, h, t0, len, first, tid, k0, v0;
};
__device__ __forceinline__ GlaChunkTile gla_chunk_h_tile(const float* G, float* gl, const int* start, int T, int H,
                                                         int K, int V) {
    const int nvb = (V + 63) / 64;
    const int kb = blockIdx.x / nvb, vb = blockIdx.x % nvb;
    const int c = blockIdx.y, bh = blockIdx.z;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x, k0 = kb * 64, v0 = vb * 64;
    if (tid < 64) gl[tid] = k0 + tid < K ? gla_g(G, b, t0, len - 1, len, T, H, h, K, k0 + tid) : 0.0f;
    __syncthreads();
    return {c, bh, b, h, t0, len, first, tid, k0, v0};
}

// ---- Version 1's products (f32, for either activation type) ----
// acc[i][j] += Σ_{k < N} a[k][ty + 16i] · b[k][tx + 16j]: thread (ty, tx) of a 16 × 16 block
// holds a 4 × 4 tile of a 64 × 64 product whose operands sit in shared memory k-major.
template <int N, int PA, int PB>
__device__ __forceinline__ void gla_fma_tile(float (&acc)[4][4], const float (*a)[PA], const float (*b)[PB], int ty,
                                             int tx) {
#pragma unroll 8
    for (int kk = 0; kk < N; ++kk) {
        float x[4], w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            x[i] = a[kk][ty + 16 * i];
            w[i] = b[kk][tx + 16 * i];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] += x[i] * w[j];
    }
}
// Version 1's B tile of a state-shaped operand S [K, V] (a chunk's S_c or dH_c): bs[cc][vv] =
// S[c0 + cc, v0 + vv], 0 past K and V.
__device__ __forceinline__ void gla_state_tile(float (*bs)[64], const float* S, int c0, int v0, int K, int V,
                                               int tid) {
    for (int e = tid; e < GLA_KT * 64; e += 256) {
        const int cc = e / 64, vv = e % 64;
        bs[cc][vv] = c0 + cc < K && v0 + vv < V ? S[(long)(c0 + cc) * V + v0 + vv] : 0.0f;
    }
}
// A chunk's 64 × 64 scores from version 1's thread tiles (rows ty + 16a, columns tx + 16b), times
// scale, into out [64][64]: 0 above the diagonal.
__device__ __forceinline__ void gla_store_lower(float* out, const float (&acc)[4][4], float scale) {
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int bb = 0; bb < 4; ++bb) {
            const bool keep = bb < a || (bb == a && tx <= ty);
            out[(ty + 16 * a) * GLA_L + tx + 16 * bb] = keep ? scale * acc[a][bb] : 0.0f;
        }
}
// ---- Version 2's tensor-core products (bf16 operands, f32 sums), for bf16 activations ----
// A block's 8 warps share a 64 × 64 product: warp w the 16 rows from 16 (w % 4) and the 32 columns
// from 32 (w / 4), as four m16n8k16 tiles. Operands are bf16 tiles in shared memory with the
// inner (k) index contiguous: A as [m][k], B as [n][k], row stride GLA_TS halves (the 8-half pad
// puts the 32 lanes of a fragment load in 32 banks).
typedef unsigned int u32;
#define GLA_TS 72
#ifndef GLA_MMA_EMULATED
// c (16x8 f32) += a (16x16 bf16, row-major) · b (16x8 bf16, column-major).
__device__ __forceinline__ void gla_mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    mma_bf16_16816(c, a, b0, b1);
}
#endif
// acc[j] (mma's C layout: lane (g, t) = (lane / 4, lane % 4) holds rows m0 + g, m0 + g + 8 and
// columns n0 + 8j + 2t, + 1) += A[m0.., 0..kdim) · B[n0 + 8j.., 0..kdim)ᵀ.
__device__ __forceinline__ void gla_tc_gemm(float (&acc)[4][4], const u16* A, const u16* B, int kdim) {
    const int l = threadIdx.x & 31, g = l >> 2, t = l & 3, w = threadIdx.x >> 5;
    const int m0 = 16 * (w & 3), n0 = 32 * (w >> 2);
    for (int k0 = 0; k0 < kdim; k0 += 16) {
        const u16* pa = A + (m0 + g) * GLA_TS + k0 + 2 * t;
        const u32 a[4] = {*(const u32*)pa, *(const u32*)(pa + 8 * GLA_TS), *(const u32*)(pa + 8),
                          *(const u32*)(pa + 8 * GLA_TS + 8)};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u16* pb = B + (n0 + 8 * j + g) * GLA_TS + k0 + 2 * t;
            gla_mma(acc[j], a, *(const u32*)pb, *(const u32*)(pb + 8));
        }
    }
}
// The (row, column) of element e (0..15) of this lane's acc: acc[e / 4][e % 4].
__device__ __forceinline__ int gla_tc_row(int e) {
    const int l = threadIdx.x & 31;
    return 16 * ((threadIdx.x >> 5) & 3) + (l >> 2) + 8 * ((e & 3) >> 1);
}
__device__ __forceinline__ int gla_tc_col(int e) {
    const int l = threadIdx.x & 31;
    return 32 * (threadIdx.x >> 7) + 8 * (e >> 2) + 2 * (l & 3) + (e & 1);
}
// x rounded to bf16 into a shared tile.
__device__ __forceinline__ void gla_put(u16* tile, int i, float x) { st(tile, i, x); }

// ---- Version 3's state passing (bf16 activations): the walk on tensor cores ----
// Replaces gla_chunk_h_tc + gla_scan_fwd (which write every chunk's own state in f32, then read and
// rewrite it all in the scan): the rows of S evolve independently (the decay is diagonal), so a
// block takes KB rows (channels) of S and GLA_WV of its columns for one (b, h) and walks the
// chunks in order, warp w holding Sᵀ [16 value columns, KB channels] in f32 registers in the mma
// accumulator layout: S_{c+1}ᵀ = Sᵀ ⊙ e^{G_L} (per column) + Vᵀ K̃, K̃ = k ⊙ e^{G_L − G} (bf16,
// as gla_chunk_h_tc rounds it), one mma chain per warp with fragments by ldmatrix. The next chunk's
// two chunks' k, v and G tiles load by cp.async while this one computes (a ring of GLA_WSETS
// sets: the walk is one chain of dependent chunks, so a load has two chunks' time to land); K̃
// is made in place, so a
// chunk takes two block barriers. Writes S_c to slot c of hs as the scan does (f32 [K][V], for the
// backward), or with hs16 as bf16 Sᵀ [V][K] for gla_fwd_o_w (the forward rounds S_c to bf16 for
// its product anyway: half the bytes, and K contiguous is its B operand's layout); the final state
// to slot nch (in the same form) and to fin (f32). Grid (⌈V / GLA_WV⌉, ⌈K / KB⌉, B·H), GLA_WW
// warps; K and V multiples of 8 (rows of 16-byte copies; the wrapper falls back to version 2
// otherwise).
#define GLA_WW 4
#define GLA_WSETS 3
#define GLA_WV (16 * GLA_WW)
#ifndef FOX_HOST_EMU
// The walk's waits clobber memory (unlike cp_async_wait): no shared-memory read moves above them.
__device__ __forceinline__ void gla_cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void gla_cp_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
// Two f32 values as a bf16 pair (low half first), rounded to nearest even as st.
__device__ __forceinline__ u32 gla_bf2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#define GLA_WALK_SMEM                                        \
    extern __shared__ __align__(16) unsigned char gla_wsm_[]; \
    unsigned char* smem = gla_wsm_;
#else
inline void gla_cp_wait_all() { cp_async_wait<0>(); }
inline void gla_cp_wait_one() { cp_async_wait<1>(); }
inline u32 gla_bf2(float lo, float hi) {
    u16 a, b;
    st(&a, 0, lo);
    st(&b, 0, hi);
    return (u32)a | ((u32)b << 16);
}
#define GLA_WALK_SMEM unsigned char* smem = dyn_smem;
#endif

// Shared memory of the walk, bytes (cuda/gla.rs's walk_smem mirrors it): GLA_WSETS sets of k [64][KB],
// v [64][GLA_WV] (bf16) and G [64][KB] (f32), rows padded so that ldmatrix's 8 rows fall in
// distinct banks, then e^{G_L} [KB].
template <int KB>
struct GlaWalk {
    static constexpr int LK = KB + 8, LV = GLA_WV + 8, LG = KB + 4;
    static constexpr int TK = GLA_L * LK * 2, TV = GLA_L * LV * 2, TG = GLA_L * LG * 4;
    static constexpr int SET = TK + TV + TG;
    static constexpr int bytes = GLA_WSETS * SET + KB * 4;
};

template <int KB>
__device__ __forceinline__ void gla_walk(float* hs, float* fin, const float* init, const u16* k, const u16* v,
                                         const float* G, const int* start, int T, int H, int K, int V, int nch,
                                         int hs16) {
    typedef GlaWalk<KB> Lw;
    constexpr int NT = 32 * GLA_WW, LK = Lw::LK, LV = Lw::LV, LG = Lw::LG;
    GLA_WALK_SMEM
    auto Kb = [&](int i) { return (u16*)(smem + i * Lw::SET); };
    auto Vb = [&](int i) { return (u16*)(smem + i * Lw::SET + Lw::TK); };
    auto Gb = [&](int i) { return (float*)(smem + i * Lw::SET + Lw::TK + Lw::TV); };
    float* el = (float*)(smem + GLA_WSETS * Lw::SET);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, j8 = lane & 7,
              m4 = lane >> 3;
    const int bh = blockIdx.z, b = bh / H, h = bh % H, first = start ? start[b] : 0;
    const int v0 = blockIdx.x * GLA_WV, vw = v0 + 16 * warp, k0 = blockIdx.y * KB;
    const bool act = vw < V;
    const long KV = (long)K * V;
    float* hb = hs + (long)bh * (nch + 1) * KV;
    u16* hb16 = (u16*)hs + (long)bh * (nch + 1) * KV;
    // k and v rows are 0 at padding and past T, G's past T (unwritten there).
    auto issue = [&](int c, int bi) {
        const int t0 = c * GLA_L, len = min(GLA_L, T - t0);
        u16* ks = Kb(bi);
        u16* vs = Vb(bi);
        float* gs = Gb(bi);
        for (int i = threadIdx.x; i < GLA_L * (KB / 8); i += NT) {
            const int r = i / (KB / 8), cc = i % (KB / 8) * 8, tt = t0 + r;
            const bool ok = r < len && tt >= first && k0 + cc < K;
            cp_async16(ks + r * LK + cc, ok ? k + gla_row(b, tt, T, H, h) * K + k0 + cc : k, ok);
        }
        for (int i = threadIdx.x; i < GLA_L * (KB / 4); i += NT) {
            const int r = i / (KB / 4), cc = i % (KB / 4) * 4;
            const bool ok = r < len && k0 + cc < K;
            cp_async16(gs + r * LG + cc, ok ? G + gla_row(b, t0 + r, T, H, h) * K + k0 + cc : G, ok);
        }
        for (int i = threadIdx.x; i < GLA_L * (GLA_WV / 8); i += NT) {
            const int r = i / (GLA_WV / 8), cc = i % (GLA_WV / 8) * 8, tt = t0 + r;
            const bool ok = r < len && tt >= first && v0 + cc < V;
            cp_async16(vs + r * LV + cc, ok ? v + gla_row(b, tt, T, H, h) * V + v0 + cc : v, ok);
        }
        cp_async_commit();
    };
    // s[n][·]: Sᵀ rows (value columns) vw + g (0, 1) and vw + g + 8 (2, 3), channels k0 + 8n + 2t + {0, 1}.
    float s[KB / 8][4];
#pragma unroll
    for (int n = 0; n < KB / 8; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int kd = k0 + n * 8 + 2 * t + (r & 1), vc = vw + g + (r >> 1) * 8;
            s[n][r] = act && init && kd < K && vc < V ? init[(long)bh * KV + (long)kd * V + vc] : 0.0f;
        }
    // S out to slot c: f32 S [K][V], or bf16 Sᵀ [V][K] in channel pairs.
    auto put = [&](int c) {
#pragma unroll
        for (int n = 0; n < KB / 8; ++n)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const int kd = k0 + n * 8 + 2 * t, vc = vw + g + rr * 8;
                if (kd >= K || vc >= V) continue;
                if (hs16) {
                    *(u32*)(hb16 + (long)c * KV + (long)vc * K + kd) = gla_bf2(s[n][2 * rr], s[n][2 * rr + 1]);
                } else {
                    hb[(long)c * KV + (long)kd * V + vc] = s[n][2 * rr];
                    hb[(long)c * KV + (long)(kd + 1) * V + vc] = s[n][2 * rr + 1];
                }
            }
    };
    issue(0, 0);
    if (nch > 1) issue(1, 1);
    for (int c = 0; c < nch; ++c) {
        const int cur = c % GLA_WSETS, len = min(GLA_L, T - c * GLA_L);
        // This chunk's tiles have landed (every thread's copies; the next chunk's may still be in
        // flight), and after the barrier the set of chunk c − 1 is free for chunk c + 2.
        if (c + 1 < nch)
            gla_cp_wait_one();
        else
            gla_cp_wait_all();
        __syncthreads();
        if (c + 2 < nch) issue(c + 2, (c + 2) % GLA_WSETS);
        u16* ks = Kb(cur);
        const float* gs = Gb(cur);
        const float* gl = gs + (len - 1) * LG;
        // K̃ = k ⊙ e^{G_L − G} in place (every exponent ≤ 0; 0 where k is) and e^{G_L}.
        for (int i = threadIdx.x; i < GLA_L * (KB / 2); i += NT) {
            const int r = i / (KB / 2), cc = i % (KB / 2) * 2;
            u32* p = (u32*)(ks + r * LK + cc);
            const u32 w = *p;
            const float* gr = gs + r * LG + cc;
            *p = gla_bf2(__uint_as_float(w << 16) * __expf(gl[cc] - gr[0]),
                         __uint_as_float(w & 0xffff0000u) * __expf(gl[cc + 1] - gr[1]));
        }
        if (threadIdx.x < KB) el[threadIdx.x] = __expf(gl[threadIdx.x]);
        __syncthreads();
        if (!act) continue;
        put(c);
#pragma unroll
        for (int n = 0; n < KB / 8; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) s[n][r] *= el[n * 8 + 2 * t + (r & 1)];
        // Sᵀ += Vᵀ K̃: Vᵀ's A fragments from v [t][v] and K̃'s B fragments from [t][kc], both .trans.
        const u16* vs = Vb(cur);
#pragma unroll
        for (int kk = 0; kk < GLA_L / 16; ++kk) {
            u32 a[4];
            ldsm_x4_t(a, vs + (kk * 16 + (m4 >> 1) * 8 + j8) * LV + 16 * warp + (m4 & 1) * 8);
#pragma unroll
            for (int n2 = 0; n2 < KB / 16; ++n2) {
                u32 bb[4];
                ldsm_x4_t(bb, ks + (kk * 16 + (m4 & 1) * 8 + j8) * LK + n2 * 16 + (m4 >> 1) * 8);
                gla_mma(s[2 * n2], a, bb[0], bb[1]);
                gla_mma(s[2 * n2 + 1], a, bb[2], bb[3]);
            }
        }
    }
    if (!act) return;
    put(nch);
    if (fin)
#pragma unroll
        for (int n = 0; n < KB / 8; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int kd = k0 + n * 8 + 2 * t + (r & 1), vc = vw + g + (r >> 1) * 8;
                if (kd < K && vc < V) fin[(long)bh * KV + (long)kd * V + vc] = s[n][r];
            }
}
#define GLA_WALK_KERNEL(KB)                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * GLA_WW)                                                      \
        gla_walk_tc_k##KB(float* hs, float* fin, const float* init, const u16* k, const u16* v, const float* G,     \
                          const int* start, int T, int H, int K, int V, int nch, int hs16) {                       \
        gla_walk<KB>(hs, fin, init, k, v, G, start, T, H, K, V, nch, hs16);                                        \
    }
GLA_WALK_KERNEL(16)
GLA_WALK_KERNEL(32)
GLA_WALK_KERNEL(64)

// Version 3's output (bf16 activations): o[:, vb] = scale · ((q ⊙ e^G) S_c[:, vb] + A V[:, vb]) as
// gla_fwd_o_tc, with S_c read as the walk's bf16 Sᵀ [V][K]. The S_c and v tiles load by cp.async
// while the block makes q ⊙ e^G and A's bf16 tile (from gla_scores' f32 A by paired loads, or with
// A16 gla_scores_w's bf16 A, by cp.async with the others); fragments by
// ldmatrix (S_c's and A's untransposed, v's .trans), o out in bf16 pairs. K ≤ KP; K and V
// multiples of 8. Grid (⌈V/64⌉, chunks, B·H), 256 threads, GlaOutW<KP>::bytes of dynamic shared
// memory; the warps share the 64 × 64 output as gla_tc_gemm's.
template <int KP>
struct GlaOutW {
    static constexpr int LQ = KP + 8, LV = 64 + 8;
    static constexpr int TQ = GLA_L * LQ * 2, TS = 64 * LQ * 2, TV = GLA_L * LV * 2, TA = GLA_L * LV * 2;
    static constexpr int bytes = TQ + TS + TV + TA;
};
template <int KP, bool A16>
__device__ __forceinline__ void gla_fwd_o_w(u16* o, const u16* q, const u16* v, const float* G, const u16* hs16,
                                            const void* A, const int* start, int T, int H, int K, int V, int nch,
                                            float scale) {
    typedef GlaOutW<KP> Lo;
    constexpr int LQ = Lo::LQ, LV = Lo::LV;
    GLA_WALK_SMEM
    u16* qs = (u16*)smem;
    u16* ss = (u16*)(smem + Lo::TQ);
    u16* vs = (u16*)(smem + Lo::TQ + Lo::TS);
    u16* as_ = (u16*)(smem + Lo::TQ + Lo::TS + Lo::TV);
    const int vb = blockIdx.x, c = blockIdx.y, bh = blockIdx.z;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x, v0 = vb * 64;
    // Sᵀ rows v0.. (zero past V and past K) and v rows (zero at padding and past T).
    const u16* S = hs16 + ((long)bh * (nch + 1) + c) * K * V;
    for (int i = tid; i < 64 * (KP / 8); i += 256) {
        const int r = i / (KP / 8), cc = i % (KP / 8) * 8;
        const bool ok = v0 + r < V && cc < K;
        cp_async16(ss + r * LQ + cc, ok ? S + (long)(v0 + r) * K + cc : S, ok);
    }
    for (int i = tid; i < GLA_L * 8; i += 256) {
        const int r = i / 8, cc = i % 8 * 8, tt = t0 + r;
        const bool ok = r < len && tt >= first && v0 + cc < V;
        cp_async16(vs + r * LV + cc, ok ? v + gla_row(b, tt, T, H, h) * V + v0 + cc : v, ok);
    }
    const long a0 = ((long)bh * nch + c) * GLA_L * GLA_L;
    if (A16)
        for (int i = tid; i < GLA_L * 8; i += 256)
            cp_async16(as_ + i / 8 * LV + i % 8 * 8, (const u16*)A + a0 + i * 8, true);
    cp_async_commit();
    // q ⊙ e^G (0 at padding, past T and past K) and (f32 A) A, as bf16 pairs.
    for (int i = tid; i < GLA_L * (KP / 2); i += 256) {
        const int r = i / (KP / 2), cc = i % (KP / 2) * 2, tt = t0 + r;
        u32 w = 0;
        if (r < len && tt >= first && cc < K) {
            const long e = gla_row(b, tt, T, H, h) * K + cc;
            const u32 qq = *(const u32*)(q + e);
            const float2 gg = *(const float2*)(G + e);
            w = gla_bf2(__uint_as_float(qq << 16) * __expf(gg.x), __uint_as_float(qq & 0xffff0000u) * __expf(gg.y));
        }
        *(u32*)(qs + r * LQ + cc) = w;
    }
    if (!A16)
        for (int i = tid; i < GLA_L * 32; i += 256) {
            const int r = i / 32, cc = i % 32 * 2;
            const float2 x = *(const float2*)((const float*)A + a0 + r * GLA_L + cc);
            *(u32*)(as_ + r * LV + cc) = gla_bf2(x.x, x.y);
        }
    gla_cp_wait_all();
    __syncthreads();
    const int lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3, j8 = lane & 7, m4 = lane >> 3;
    const int r0 = 16 * (w & 3), n0 = 32 * (w >> 2);
    float acc[4][4] = {};
    // (q ⊙ e^G) S_c: A fragments from [t][kc], B from Sᵀ [v][kc] (both untransposed).
#pragma unroll
    for (int kk = 0; kk < KP / 16; ++kk) {
        u32 a[4];
        ldsm_x4(a, qs + (r0 + (m4 & 1) * 8 + j8) * LQ + kk * 16 + (m4 >> 1) * 8);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
            u32 bb[4];
            ldsm_x4(bb, ss + (n0 + 16 * jj + (m4 >> 1) * 8 + j8) * LQ + kk * 16 + (m4 & 1) * 8);
            gla_mma(acc[2 * jj], a, bb[0], bb[1]);
            gla_mma(acc[2 * jj + 1], a, bb[2], bb[3]);
        }
    }
    // A V: A's fragments from [i][j], v's from [j][v] (.trans).
#pragma unroll
    for (int kk = 0; kk < GLA_L / 16; ++kk) {
        u32 a[4];
        ldsm_x4(a, as_ + (r0 + (m4 & 1) * 8 + j8) * LV + kk * 16 + (m4 >> 1) * 8);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
            u32 bb[4];
            ldsm_x4_t(bb, vs + (kk * 16 + (m4 & 1) * 8 + j8) * LV + n0 + 16 * jj + (m4 >> 1) * 8);
            gla_mma(acc[2 * jj], a, bb[0], bb[1]);
            gla_mma(acc[2 * jj + 1], a, bb[2], bb[3]);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const int r = r0 + g + 8 * rr, vv = v0 + n0 + 8 * j + 2 * t, tt = t0 + r;
            if (r >= len || vv >= V) continue;
            const bool real = tt >= first;
            *(u32*)(o + gla_row(b, tt, T, H, h) * V + vv) =
                gla_bf2(real ? scale * acc[j][2 * rr] : 0.0f, real ? scale * acc[j][2 * rr + 1] : 0.0f);
        }
}
#define GLA_OUT_W_KERNEL(KP)                                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        gla_fwd_o_w_k##KP(u16* o, const u16* q, const u16* v, const float* G, const u16* hs16, const float* A,     \
                          const int* start, int T, int H, int K, int V, int nch, float scale) {                   \
        gla_fwd_o_w<KP, false>(o, q, v, G, hs16, A, start, T, H, K, V, nch, scale);                               \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        gla_fwd_o_w16_k##KP(u16* o, const u16* q, const u16* v, const float* G, const u16* hs16, const u16* A16,  \
                            const int* start, int T, int H, int K, int V, int nch, float scale) {                 \
        gla_fwd_o_w<KP, true>(o, q, v, G, hs16, A16, start, T, H, K, V, nch, scale);                              \
    }
GLA_OUT_W_KERNEL(64)
GLA_OUT_W_KERNEL(128)

// Version 3's scores on tensor cores (bf16 activations; opt-in, not yet run on a GPU: cuda/gla.rs's
// uses_scores_tc): A [B, H, chunks, 64, 64] in bf16 for gla_fwd_o_w16 (the output kernel rounds
// A to bf16 for its product anyway), A_ij = Σ_c q_ic k_jc e^{G_ic − G_jc} for j ≤ i, else 0, as
// gla_scores. Between sub-chunks (i in a, j in b < a) on tensor cores through gla_scores'
// reference r = 16a: q̃ = q e^{G − G_r(row)} against kp_a = k e^{G_16a − G} (bf16 operands as
// version 2 rounds its others; every exponent ≤ 0), one warp per block (a, b). Within a sub-chunk
// on the CUDA cores in f32 with e^{G_i − G_j} per element: the lower triangle in 2 × 2 tiles, a
// tile's channels split over KP / 8 lanes (8 each, one 16-byte load per row) whose partial sums
// meet by shuffles in a fixed order. q, k (0 at padding, past T and past K) and G (rows clamped to
// the chunk's last real row, as gla_g) load by cp.async. K ≤ KP, K a multiple of 8. Grid (chunks,
// B·H), 256 threads, GlaScoresW<KP>::bytes of dynamic shared memory.
template <int KP>
struct GlaScoresW {
    static constexpr int LQ = KP + 8, LG = KP + 4;
    static constexpr int TQ = GLA_L * LQ * 2, TG = GLA_L * LG * 4, TP = 96 * LQ * 2;
    // q, k, G, q̃, then kp_1 (rows 0..15), kp_2 (0..31), kp_3 (0..47) one after the other.
    static constexpr int bytes = 3 * TQ + TG + TP;
};
template <int KP>
__device__ __forceinline__ void gla_scores_w(u16* A16, const u16* q, const u16* k, const float* G, const int* start,
                                             int T, int H, int K, int nch) {
    typedef GlaScoresW<KP> Ls;
    constexpr int LQ = Ls::LQ, LG = Ls::LG, LPT = KP / 8;
    GLA_WALK_SMEM
    u16* qs = (u16*)smem;
    u16* ks = (u16*)(smem + Ls::TQ);
    float* gs = (float*)(smem + 2 * Ls::TQ);
    u16* qt = (u16*)(smem + 2 * Ls::TQ + Ls::TG);
    u16* kp = (u16*)(smem + 3 * Ls::TQ + Ls::TG);
    const int c = blockIdx.x, bh = blockIdx.y;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x;
    for (int i = tid; i < GLA_L * (KP / 8); i += 256) {
        const int r = i / (KP / 8), cc = i % (KP / 8) * 8, tt = t0 + r;
        const bool ok = r < len && tt >= first && cc < K;
        const long e = gla_row(b, tt, T, H, h) * K + cc;
        cp_async16(qs + r * LQ + cc, ok ? q + e : q, ok);
        cp_async16(ks + r * LQ + cc, ok ? k + e : k, ok);
    }
    for (int i = tid; i < GLA_L * (KP / 4); i += 256) {
        const int r = i / (KP / 4), cc = i % (KP / 4) * 4;
        const bool ok = cc < K;
        cp_async16(gs + r * LG + cc, ok ? G + gla_row(b, t0 + min(r, len - 1), T, H, h) * K + cc : G, ok);
    }
    cp_async_commit();
    gla_cp_wait_all();
    __syncthreads();
    // q̃ for rows 16..63, and kp_a (rows j < 16a at row 8a(a − 1) + j of kp), as bf16 pairs.
    for (int i = tid; i < 144 * (KP / 2); i += 256) {
        const int p = i / (KP / 2), cc = i % (KP / 2) * 2;
        int r, ref;
        const u16* src;
        u16* dst;
        if (p < 48) {
            r = 16 + p;
            ref = r & ~15;
            src = qs;
            dst = qt + r * LQ;
        } else {
            const int pk = p - 48, a = pk < 16 ? 1 : pk < 48 ? 2 : 3;
            r = pk - 8 * a * (a - 1);
            ref = 16 * a;
            src = ks;
            dst = kp + pk * LQ;
        }
        const u32 w = *(const u32*)(src + r * LQ + cc);
        const float* gr = gs + r * LG + cc;
        const float* g0 = gs + ref * LG + cc;
        const float x0 = p < 48 ? gr[0] - g0[0] : g0[0] - gr[0], x1 = p < 48 ? gr[1] - g0[1] : g0[1] - gr[1];
        *(u32*)(dst + cc) = gla_bf2(__uint_as_float(w << 16) * __expf(x0), __uint_as_float(w & 0xffff0000u) * __expf(x1));
    }
    __syncthreads();
    u16* Ac = A16 + ((long)bh * nch + c) * GLA_L * GLA_L;
    const int lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3, j8 = lane & 7, m4 = lane >> 3;
    if (w < 6) {
        // Block (a, bb), bb < a: warp 0 → (1, 0), 1, 2 → (2, 0..1), 3..5 → (3, 0..2).
        const int a = w < 1 ? 1 : w < 3 ? 2 : 3, bb = w - a * (a - 1) / 2;
        const u16* kpa = kp + 8 * a * (a - 1) * LQ;
        float acc[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < KP / 16; ++kk) {
            u32 af[4], bf[4];
            ldsm_x4(af, qt + (16 * a + (m4 & 1) * 8 + j8) * LQ + kk * 16 + (m4 >> 1) * 8);
            ldsm_x4(bf, kpa + (16 * bb + (m4 >> 1) * 8 + j8) * LQ + kk * 16 + (m4 & 1) * 8);
            gla_mma(acc[0], af, bf[0], bf[1]);
            gla_mma(acc[1], af, bf[2], bf[3]);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr)
                *(u32*)(Ac + (16 * a + g + 8 * rr) * GLA_L + 16 * bb + 8 * n + 2 * t) =
                    gla_bf2(acc[n][2 * rr], acc[n][2 * rr + 1]);
    } else {
        // The blocks above the diagonal are 0: 6 blocks of 16 rows × 16 columns, 8 columns a store.
        for (int i = tid - 192; i < 6 * 16 * 2; i += 64) {
            const int blk = i / 32, row = i % 32 / 2, half = i % 2;
            const int a = blk < 3 ? 0 : blk < 5 ? 1 : 2, bb = a + 1 + blk - (a == 0 ? 0 : a == 1 ? 3 : 5);
            *(uint4*)(Ac + (16 * a + row) * GLA_L + 16 * bb + 8 * half) = uint4{0, 0, 0, 0};
        }
    }
    // Above the diagonal inside the diagonal blocks: 0 (pairs of columns 2J, 2J + 1 with J > row / 2).
    for (int i = tid; i < 4 * 16 * 8; i += 256) {
        const int a = i / 128, r = i / 8 % 16, J = i % 8;
        if (J > r / 2) *(u32*)(Ac + (16 * a + r) * GLA_L + 16 * a + 2 * J) = 0u;
    }
    // The diagonal blocks: tile (I, J), J ≤ I, of sub-chunk a holds rows 16a + 2I (+1), columns
    // 16a + 2J (+1); lane s of its LPT takes channels 8s..8s + 7.
    const int s = tid % LPT;
    for (int tile = tid / LPT; tile < 4 * 36; tile += 256 / LPT) {
        const int a = tile / 36, u = tile % 36;
        int I = 0;
        while ((I + 1) * (I + 2) / 2 <= u) ++I;
        const int J = u - I * (I + 1) / 2, i0 = 16 * a + 2 * I, j0 = 16 * a + 2 * J, cc = 8 * s;
        float acc[4] = {};
        const uint4 qv[2] = {*(const uint4*)(qs + i0 * LQ + cc), *(const uint4*)(qs + (i0 + 1) * LQ + cc)};
        const uint4 kv[2] = {*(const uint4*)(ks + j0 * LQ + cc), *(const uint4*)(ks + (j0 + 1) * LQ + cc)};
        float gi[2][8], gj[2][8];
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const float4 u = *(const float4*)(gs + (i0 + x) * LG + cc + 4 * hh);
                const float4 v4 = *(const float4*)(gs + (j0 + x) * LG + cc + 4 * hh);
                gi[x][4 * hh] = u.x, gi[x][4 * hh + 1] = u.y, gi[x][4 * hh + 2] = u.z, gi[x][4 * hh + 3] = u.w;
                gj[x][4 * hh] = v4.x, gj[x][4 * hh + 1] = v4.y, gj[x][4 * hh + 2] = v4.z, gj[x][4 * hh + 3] = v4.w;
            }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float qf[2], kf[2];
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                const u32 qw = (&qv[x].x)[e >> 1], kw = (&kv[x].x)[e >> 1];
                qf[x] = __uint_as_float(e & 1 ? qw & 0xffff0000u : qw << 16);
                kf[x] = __uint_as_float(e & 1 ? kw & 0xffff0000u : kw << 16);
            }
#pragma unroll
            for (int x = 0; x < 2; ++x)
#pragma unroll
                for (int y = 0; y < 2; ++y) acc[2 * x + y] += qf[x] * kf[y] * __expf(gi[x][e] - gj[y][e]);
        }
#pragma unroll
        for (int off = LPT / 2; off > 0; off >>= 1)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], off);
        if (s == 0) {
            *(u32*)(Ac + i0 * GLA_L + j0) = gla_bf2(acc[0], J < I ? acc[1] : 0.0f);
            *(u32*)(Ac + (i0 + 1) * GLA_L + j0) = gla_bf2(acc[2], acc[3]);
        }
    }
}
#define GLA_SCORES_W_KERNEL(KP)                                                                                    \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        gla_scores_w_k##KP(u16* A16, const u16* q, const u16* k, const float* G, const int* start, int T, int H,    \
                           int K, int nch) {                                                                      \
        gla_scores_w<KP>(A16, q, k, G, start, T, H, K, nch);                                                      \
    }
GLA_SCORES_W_KERNEL(64)
GLA_SCORES_W_KERNEL(128)
#endif  // GLA_ONCE

// G [B, T, H, K] (f32) = the gate's inclusive prefix sums within each chunk, per channel; 0 at
// padding (padding comes first, so G stays 0 until a row's start) and left unwritten past T.
// Grid (⌈H·K / 256⌉, chunks, B); a thread per column, in position order.
extern "C" __global__ void KN(gla_cumsum)(float* G, const ET* g, const int* start, int T, int H, int K) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int c = blockIdx.y, b = blockIdx.z;
    if (col >= H * K) return;
    int t0 = c * GLA_L, t1 = min(T, t0 + GLA_L);
    int first = start ? start[b] : 0;
    long HK = (long)H * K;
    float s = 0.0f;
    for (int t = t0; t < t1; ++t) {
        long i = ((long)b * T + t) * HK + col;
        if (t >= first) s += ld(g, i);
        G[i] = s;
    }
}

// Element (r, cc) of gla_chunk_h's staged tiles (both versions): X̃ (mode 0: k e^{G_last - G};
// mode 1: scale · q e^G) and Y; zero past the chunk, before the row's start and past K or V.
__device__ __forceinline__ void gla_chunk_h_elem(const ET* x, const ET* y, const float* G, const float* gl, int b,
                                                 int h, int t0, int r, int cc, int len, int first, int T, int H,
                                                 int K, int V, int k0, int v0, int mode, float scale, float& xv,
                                                 float& yv) {
    const int t = t0 + r;
    const bool real = r < len && t >= first;
    xv = 0.0f;
    yv = 0.0f;
    if (real) {
        const long row = gla_row(b, t, T, H, h);
        if (k0 + cc < K) {
            const float gv = G[row * K + k0 + cc], xr = ld(x, row * K + k0 + cc);
            xv = mode == 0 ? xr * __expf(gl[cc] - gv) : scale * xr * __expf(gv);
        }
        if (v0 + cc < V) yv = ld(y, row * V + v0 + cc);
    }
}

// A block's 64 × 64 product, times scale, as the chunk's rows of out [B, T, H, V] from column
// v0: 0 at padding, nothing past the chunk or V. Version 1's thread tile holds rows ty + 16i and
// columns tx + 16j; version 2's (TC) element e sits at (gla_tc_row(e), gla_tc_col(e)).
template <bool TC>
__device__ __forceinline__ void gla_store_rows(ET* out, const float (&acc)[4][4], float scale, int b, int h, int t0,
                                               int len, int first, int T, int H, int V, int v0) {
    if constexpr (TC) {
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            const int r = gla_tc_row(e), vv = v0 + gla_tc_col(e), t = t0 + r;
            if (r < len && vv < V)
                st(out, gla_row(b, t, T, H, h) * V + vv, t >= first ? scale * acc[e >> 2][e & 3] : 0.0f);
        }
    } else {
        const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = ty + 16 * i, t = t0 + r;
            if (r >= len) continue;
            const bool real = t >= first;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int vv = tx + 16 * j + v0;
                if (vv < V) st(out, gla_row(b, t, T, H, h) * V + vv, real ? scale * acc[i][j] : 0.0f);
            }
        }
    }
}

// One chunk's own state product, out[kc, v] = Σ_t X_t[kc] Y_t[v] for a 64 × 64 tile (kb, vb):
// mode 0 (the forward's state): X = k ⊙ e^{G_L − G}, Y = v, into slot c of `out` [B, H, nslots,
// K, V]; mode 1 (the backward's ΔdS_c): X = scale · q ⊙ e^G, Y = do. Grid (⌈K/64⌉·⌈V/64⌉,
// chunks, B·H).
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_chunk_h)(float* out, int nslots, const ET* x, const ET* y, const float* G, const int* start, int T,
                    int H, int K, int V, int mode, float scale) {
    __shared__ float xs[GLA_L][64];
    __shared__ float ys[GLA_L][64];
    __shared__ float gl[64];
    const auto [c, bh, b, h, t0, len, first, tid, k0, v0] = gla_chunk_h_tile(G, gl, start, T, H, K, V);
    for (int e = tid; e < GLA_L * 64; e += 256) {
        const int r = e / 64, cc = e % 64;
        float xv, yv;
        gla_chunk_h_elem(x, y, G, gl, b, h, t0, r, cc, len, first, T, H, K, V, k0, v0, mode, scale, xv, yv);
        xs[r][cc] = xv;
        ys[r][cc] = yv;
    }
    __syncthreads();
    const int ty = tid / 16, tx = tid % 16;
    float acc[4][4] = {};
    gla_fma_tile<GLA_L>(acc, xs, ys, ty, tx);
    float* o = out + ((long)bh * nslots + c) * K * V;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int kc = k0 + ty + 16 * i, vv = v0 + tx + 16 * j;
            if (kc < K && vv < V) o[(long)kc * V + vv] = acc[i][j];
        }
}

// Version 2 of gla_chunk_h (tensor cores): the same product with X̃ᵀ [kc][t] and Yᵀ [v][t] staged
// as bf16.
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_chunk_h_tc)(float* out, int nslots, const ET* x, const ET* y, const float* G, const int* start, int T,
                       int H, int K, int V, int mode, float scale) {
    __shared__ u32 x32[64 * GLA_TS / 2], y32[64 * GLA_TS / 2];
    __shared__ float gl[64];
    u16* xt = (u16*)x32;
    u16* yt = (u16*)y32;
    const auto [c, bh, b, h, t0, len, first, tid, k0, v0] = gla_chunk_h_tile(G, gl, start, T, H, K, V);
    for (int e = tid; e < GLA_L * 64; e += 256) {
        const int r = e / 64, cc = e % 64;
        float xv, yv;
        gla_chunk_h_elem(x, y, G, gl, b, h, t0, r, cc, len, first, T, H, K, V, k0, v0, mode, scale, xv, yv);
        gla_put(xt, cc * GLA_TS + r, xv);
        gla_put(yt, cc * GLA_TS + r, yv);
    }
    __syncthreads();
    float acc[4][4] = {};
    gla_tc_gemm(acc, xt, yt, GLA_L);
    float* o = out + ((long)bh * nslots + c) * K * V;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
        const int kc = k0 + gla_tc_row(e), vv = v0 + gla_tc_col(e);
        if (kc < K && vv < V) o[(long)kc * V + vv] = acc[e >> 2][e & 3];
    }
}

// A [B, H, chunks, 64, 64] (row i, column j; 0 for j > i): A_ij = Σ_c q_ic k_jc e^{G_ic − G_jc}.
// Thread (ty, tx) holds A[ty + 16a][tx + 16b]: block (a, b) of sub-chunks. Off the diagonal (b < a)
// through the reference r = 16a: qs = q e^{G − G_r(row)}, kp[a − 1] = k e^{G_r(a) − G} for the rows
// j < 16a; on it, e^{G_i − G_j} per element. Grid (chunks, B·H), channels in tiles of 16.
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_scores)(float* A, const ET* q, const ET* k, const float* G, const int* start, int T, int H, int K,
                   int nch) {
    const int KT = 16;
    __shared__ float qr[GLA_L][KT + 1], kr[GLA_L][KT + 1], gs[GLA_L][KT + 1], qs[GLA_L][KT + 1];
    __shared__ float kp[3][48][KT + 1];
    const int c = blockIdx.x, bh = blockIdx.y;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    float acc[4][4] = {};
    for (int c0 = 0; c0 < K; c0 += KT) {
        __syncthreads();
        for (int e = tid; e < GLA_L * KT; e += 256) {
            const int r = e / KT, cc = e % KT, t = t0 + r;
            const bool in = c0 + cc < K, real = in && r < len && t >= first;
            const long row = gla_row(b, t, T, H, h);
            qr[r][cc] = real ? ld(q, row * K + c0 + cc) : 0.0f;
            kr[r][cc] = real ? ld(k, row * K + c0 + cc) : 0.0f;
            gs[r][cc] = in ? gla_g(G, b, t0, r, len, T, H, h, K, c0 + cc) : 0.0f;
        }
        __syncthreads();
        for (int e = tid; e < GLA_L * KT; e += 256) {
            const int r = e / KT, cc = e % KT;
            qs[r][cc] = qr[r][cc] * __expf(gs[r][cc] - gs[r & ~15][cc]);
            if (r < 48)
                for (int a = r / 16 + 1; a < 4; ++a) kp[a - 1][r][cc] = kr[r][cc] * __expf(gs[16 * a][cc] - gs[r][cc]);
        }
        __syncthreads();
        for (int cc = 0; cc < KT; ++cc) {
            float qa[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) qa[a] = qs[ty + 16 * a][cc];
#pragma unroll
            for (int a = 1; a < 4; ++a)
#pragma unroll
                for (int bb = 0; bb < a; ++bb) acc[a][bb] += qa[a] * kp[a - 1][tx + 16 * bb][cc];
            if (tx <= ty) {
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const int i = ty + 16 * a, j = tx + 16 * a;
                    acc[a][a] += qr[i][cc] * kr[j][cc] * __expf(gs[i][cc] - gs[j][cc]);
                }
            }
        }
    }
    gla_store_lower(A + ((long)bh * nch + c) * GLA_L * GLA_L, acc, 1.0f);
}

// o[:, vb] = scale · ((q ⊙ e^G) S_c[:, vb] + A V[:, vb]) for a tile of 64 value columns; 0 at
// padding. Grid (⌈V/64⌉, chunks, B·H).
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_fwd_o)(ET* o, const ET* q, const ET* v, const float* G, const float* hs, const float* A,
                  const int* start, int T, int H, int K, int V, int nch, float scale) {
    __shared__ float as[GLA_KT][GLA_L + 1];
    __shared__ float bs[GLA_KT][64];
    const int vb = blockIdx.x, c = blockIdx.y, bh = blockIdx.z;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, v0 = vb * 64;
    const float* S = hs + ((long)bh * (nch + 1) + c) * K * V;
    float acc[4][4] = {};
    for (int c0 = 0; c0 < K; c0 += GLA_KT) {
        __syncthreads();
        for (int e = tid; e < GLA_L * GLA_KT; e += 256) {
            const int r = e / GLA_KT, cc = e % GLA_KT, t = t0 + r;
            const bool real = c0 + cc < K && r < len && t >= first;
            const long i = gla_row(b, t, T, H, h) * K + c0 + cc;
            as[cc][r] = real ? ld(q, i) * __expf(G[i]) : 0.0f;
        }
        gla_state_tile(bs, S, c0, v0, K, V, tid);
        __syncthreads();
        gla_fma_tile<GLA_KT>(acc, as, bs, ty, tx);
    }
    const float* Ac = A + ((long)bh * nch + c) * GLA_L * GLA_L;
    for (int j0 = 0; j0 < GLA_L; j0 += GLA_KT) {
        __syncthreads();
        for (int e = tid; e < GLA_L * GLA_KT; e += 256) {
            const int r = e / GLA_KT, jj = e % GLA_KT;
            as[jj][r] = Ac[r * GLA_L + j0 + jj];
        }
        for (int e = tid; e < GLA_KT * 64; e += 256) {
            const int jj = e / 64, vv = e % 64, t = t0 + j0 + jj;
            const bool real = v0 + vv < V && j0 + jj < len && t >= first;
            bs[jj][vv] = real ? ld(v, gla_row(b, t, T, H, h) * V + v0 + vv) : 0.0f;
        }
        __syncthreads();
        gla_fma_tile<GLA_KT>(acc, as, bs, ty, tx);
    }
    gla_store_rows<false>(o, acc, scale, b, h, t0, len, first, T, H, V, v0);
}

// Version 2 of gla_fwd_o (tensor cores): q ⊙ e^G [t][c] against S_cᵀ [v][c], then A [t][j]
// against Vᵀ [v][j], bf16 operands in shared memory, f32 sums.
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_fwd_o_tc)(ET* o, const ET* q, const ET* v, const float* G, const float* hs, const float* A,
                     const int* start, int T, int H, int K, int V, int nch, float scale) {
    __shared__ u32 a32[64 * GLA_TS / 2], b32[64 * GLA_TS / 2];
    u16* as_ = (u16*)a32;
    u16* bs = (u16*)b32;
    const int vb = blockIdx.x, c = blockIdx.y, bh = blockIdx.z;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x, v0 = vb * 64;
    const float* S = hs + ((long)bh * (nch + 1) + c) * K * V;
    float acc[4][4] = {};
    for (int c0 = 0; c0 < K; c0 += 64) {
        __syncthreads();
        for (int e = tid; e < GLA_L * 64; e += 256) {
            const int r = e / 64, cc = e % 64, t = t0 + r;
            const bool real = c0 + cc < K && r < len && t >= first;
            const long i = gla_row(b, t, T, H, h) * K + c0 + cc;
            gla_put(as_, r * GLA_TS + cc, real ? ld(q, i) * __expf(G[i]) : 0.0f);
            // S_c[c0 + r, v0 + cc] as B [v][c].
            const bool in = c0 + r < K && v0 + cc < V;
            gla_put(bs, cc * GLA_TS + r, in ? S[(long)(c0 + r) * V + v0 + cc] : 0.0f);
        }
        __syncthreads();
        gla_tc_gemm(acc, as_, bs, 64);
    }
    const float* Ac = A + ((long)bh * nch + c) * GLA_L * GLA_L;
    __syncthreads();
    for (int e = tid; e < GLA_L * 64; e += 256) {
        const int r = e / 64, cc = e % 64, t = t0 + r;
        gla_put(as_, r * GLA_TS + cc, Ac[r * GLA_L + cc]);
        // v[position r, column v0 + cc] as B [v][j].
        const bool real = v0 + cc < V && r < len && t >= first;
        gla_put(bs, cc * GLA_TS + r, real ? ld(v, gla_row(b, t, T, H, h) * V + v0 + cc) : 0.0f);
    }
    __syncthreads();
    gla_tc_gemm(acc, as_, bs, GLA_L);
    gla_store_rows<true>(o, acc, scale, b, h, t0, len, first, T, H, V, v0);
}

// dA [B, H, chunks, 64, 64] = scale · do_i·v_j for j ≤ i (0 above the diagonal and at padding).
// Grid (chunks, B·H).
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_dscores)(float* dA, const ET* dout, const ET* v, const int* start, int T, int H, int V, int nch,
                    float scale) {
    __shared__ float as[GLA_KT][GLA_L + 1];
    __shared__ float bs[GLA_KT][GLA_L + 1];
    const int c = blockIdx.x, bh = blockIdx.y;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    float acc[4][4] = {};
    for (int c0 = 0; c0 < V; c0 += GLA_KT) {
        __syncthreads();
        for (int e = tid; e < GLA_L * GLA_KT; e += 256) {
            const int r = e / GLA_KT, cc = e % GLA_KT, t = t0 + r;
            const bool real = c0 + cc < V && r < len && t >= first;
            const long i = gla_row(b, t, T, H, h) * V + c0 + cc;
            as[cc][r] = real ? ld(dout, i) : 0.0f;
            bs[cc][r] = real ? ld(v, i) : 0.0f;
        }
        __syncthreads();
        gla_fma_tile<GLA_KT>(acc, as, bs, ty, tx);
    }
    gla_store_lower(dA + ((long)bh * nch + c) * GLA_L * GLA_L, acc, scale);
}

// Version 2 of gla_dscores (tensor cores): do [i][v] against v [j][v], bf16 operands, f32 sums.
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_dscores_tc)(float* dA, const ET* dout, const ET* v, const int* start, int T, int H, int V, int nch,
                       float scale) {
    __shared__ u32 a32[64 * GLA_TS / 2], b32[64 * GLA_TS / 2];
    u16* as_ = (u16*)a32;
    u16* bs = (u16*)b32;
    const int c = blockIdx.x, bh = blockIdx.y;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x;
    float acc[4][4] = {};
    for (int c0 = 0; c0 < V; c0 += 64) {
        __syncthreads();
        for (int e = tid; e < GLA_L * 64; e += 256) {
            const int r = e / 64, cc = e % 64, t = t0 + r;
            const bool real = c0 + cc < V && r < len && t >= first;
            const long i = gla_row(b, t, T, H, h) * V + c0 + cc;
            gla_put(as_, r * GLA_TS + cc, real ? ld(dout, i) : 0.0f);
            gla_put(bs, r * GLA_TS + cc, real ? ld(v, i) : 0.0f);
        }
        __syncthreads();
        gla_tc_gemm(acc, as_, bs, 64);
    }
    float* out = dA + ((long)bh * nch + c) * GLA_L * GLA_L;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
        const int i = gla_tc_row(e), j = gla_tc_col(e);
        out[i * GLA_L + j] = j <= i ? scale * acc[e >> 2][e & 3] : 0.0f;
    }
}

// dv[:, vb] = scale · Aᵀ do[:, vb] + (k ⊙ e^{G_L − G}) dH_c[:, vb] for a tile of 64 value
// columns; 0 at padding. Grid (⌈V/64⌉, chunks, B·H).
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_bwd_dv)(ET* dv, const ET* k, const ET* dout, const float* G, const float* A, const float* dhs,
                   const int* start, int T, int H, int K, int V, int nch, float scale) {
    __shared__ float as[GLA_KT][GLA_L + 1];
    __shared__ float bs[GLA_KT][64];
    __shared__ float gl[GLA_KT];
    const int vb = blockIdx.x, c = blockIdx.y, bh = blockIdx.z;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, v0 = vb * 64;
    float acc[4][4] = {};
    // Σ_i A_ij do_i (A's rows i are the inner index).
    const float* Ac = A + ((long)bh * nch + c) * GLA_L * GLA_L;
    for (int i0 = 0; i0 < GLA_L; i0 += GLA_KT) {
        __syncthreads();
        for (int e = tid; e < GLA_KT * GLA_L; e += 256) {
            const int ii = e / GLA_L, j = e % GLA_L;
            as[ii][j] = Ac[(i0 + ii) * GLA_L + j];
        }
        for (int e = tid; e < GLA_KT * 64; e += 256) {
            const int ii = e / 64, vv = e % 64, t = t0 + i0 + ii;
            const bool real = v0 + vv < V && i0 + ii < len && t >= first;
            bs[ii][vv] = real ? ld(dout, gla_row(b, t, T, H, h) * V + v0 + vv) : 0.0f;
        }
        __syncthreads();
        gla_fma_tile<GLA_KT>(acc, as, bs, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] *= scale;
    // Σ_c k̃_jc dH_c[c, v].
    const float* D = dhs + ((long)bh * nch + c) * K * V;
    for (int c0 = 0; c0 < K; c0 += GLA_KT) {
        __syncthreads();
        if (tid < GLA_KT) gl[tid] = c0 + tid < K ? gla_g(G, b, t0, len - 1, len, T, H, h, K, c0 + tid) : 0.0f;
        __syncthreads();
        for (int e = tid; e < GLA_L * GLA_KT; e += 256) {
            const int r = e / GLA_KT, cc = e % GLA_KT, t = t0 + r;
            const bool real = c0 + cc < K && r < len && t >= first;
            const long i = gla_row(b, t, T, H, h) * K + c0 + cc;
            as[cc][r] = real ? ld(k, i) * __expf(gl[cc] - G[i]) : 0.0f;
        }
        gla_state_tile(bs, D, c0, v0, K, V, tid);
        __syncthreads();
        gla_fma_tile<GLA_KT>(acc, as, bs, ty, tx);
    }
    gla_store_rows<false>(dv, acc, 1.0f, b, h, t0, len, first, T, H, V, v0);
}

// Version 2 of gla_bwd_dv (tensor cores): Aᵀ [j][i] against doᵀ [v][i], then (k ⊙ e^{G_L − G})
// [j][c] against dH_cᵀ [v][c], bf16 operands, f32 sums.
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_bwd_dv_tc)(ET* dv, const ET* k, const ET* dout, const float* G, const float* A, const float* dhs,
                      const int* start, int T, int H, int K, int V, int nch, float scale) {
    __shared__ u32 a32[64 * GLA_TS / 2], b32[64 * GLA_TS / 2];
    __shared__ float gl[64];
    u16* as_ = (u16*)a32;
    u16* bs = (u16*)b32;
    const int vb = blockIdx.x, c = blockIdx.y, bh = blockIdx.z;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x, v0 = vb * 64;
    const float* Ac = A + ((long)bh * nch + c) * GLA_L * GLA_L;
    for (int e = tid; e < GLA_L * 64; e += 256) {
        const int i = e / 64, j = e % 64, t = t0 + i;
        gla_put(as_, j * GLA_TS + i, Ac[i * GLA_L + j]);
        // do[position i, column v0 + j] as B [v][i].
        const bool real = v0 + j < V && i < len && t >= first;
        gla_put(bs, j * GLA_TS + i, real ? ld(dout, gla_row(b, t, T, H, h) * V + v0 + j) : 0.0f);
    }
    __syncthreads();
    float acc[4][4] = {};
    gla_tc_gemm(acc, as_, bs, GLA_L);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] *= scale;
    const float* D = dhs + ((long)bh * nch + c) * K * V;
    for (int c0 = 0; c0 < K; c0 += 64) {
        __syncthreads();
        if (tid < 64) gl[tid] = c0 + tid < K ? gla_g(G, b, t0, len - 1, len, T, H, h, K, c0 + tid) : 0.0f;
        __syncthreads();
        for (int e = tid; e < GLA_L * 64; e += 256) {
            const int r = e / 64, cc = e % 64, t = t0 + r;
            const bool real = c0 + cc < K && r < len && t >= first;
            const long i = gla_row(b, t, T, H, h) * K + c0 + cc;
            gla_put(as_, r * GLA_TS + cc, real ? ld(k, i) * __expf(gl[cc] - G[i]) : 0.0f);
            // dH_c[c0 + r, v0 + cc] as B [v][c].
            const bool in = c0 + r < K && v0 + cc < V;
            gla_put(bs, cc * GLA_TS + r, in ? D[(long)(c0 + r) * V + v0 + cc] : 0.0f);
        }
        __syncthreads();
        gla_tc_gemm(acc, as_, bs, 64);
    }
    gla_store_rows<true>(dv, acc, 1.0f, b, h, t0, len, first, T, H, V, v0);
}

// Shared memory of gla_bwd_dqk, in floats: dA, q, k, G [64][65] each, then a region for the state
// products' tiles (4 × [32][65]) that the intra-chunk terms reuse for kp / qp (3 × [48][65]),
// then G_L and the final-term sums [64] each.
#define GLA_P 65
#define GLA_DQK_REGION (3 * 48 * GLA_P)
#define GLA_DQK_SMEM_FLOATS (4 * GLA_L * GLA_P + GLA_DQK_REGION + 2 * 64)

// dq, dk and dg for a tile of 64 channels (kb) of chunk c, from S_c (hs slot c), S_{c+1} (slot
// c + 1), dH_c (dhs slot c) and dA:
//   dq_i = scale (do_i S_cᵀ) ⊙ e^{G_i} + Σ_{j ≤ i} dA_ij k_j ⊙ e^{G_i − G_j}
//   dk_j = (v_j dH_cᵀ) ⊙ e^{G_L − G_j} + Σ_{i ≥ j} dA_ij q_i ⊙ e^{G_i − G_j}
//   dG_i = q_i ⊙ dq_i − k_i ⊙ dk_i, plus at the chunk's end Σ_v S_{c+1}[:, v] ⊙ dH_c[:, v] (the
//   gradient of the chunk-local prefix sums: each of them appears only as these exponents); dg
//   is dG's reverse prefix sum within the chunk.
// The off-diagonal sub-chunk blocks factor through a reference point: for dq, r = 16a (the
// first row of the query's sub-chunk a, as in gla_scores); for dk, r = 16a + 15 (the last row of
// the key's sub-chunk a). Grid (⌈K/64⌉, chunks, B·H), 256 threads, dynamic shared memory of
// GLA_DQK_SMEM_FLOATS floats.
template <bool TC>
__device__ __forceinline__ void gla_bwd_dqk_impl(ET* dq, ET* dk, ET* dg, const ET* q, const ET* k, const ET* v,
                                                 const ET* dout, const float* G, const float* hs, const float* dhs,
                                                 const float* dA, const int* start, int T, int H, int K, int V,
                                                 int nch, float scale) {
    GLA_DSMEM(sm);
    float(*das)[GLA_P] = (float(*)[GLA_P])sm;
    float(*qr)[GLA_P] = (float(*)[GLA_P])(sm + GLA_L * GLA_P);
    float(*kr)[GLA_P] = (float(*)[GLA_P])(sm + 2 * GLA_L * GLA_P);
    float(*gs)[GLA_P] = (float(*)[GLA_P])(sm + 3 * GLA_L * GLA_P);
    float* region = sm + 4 * GLA_L * GLA_P;
    float* gl = region + GLA_DQK_REGION;
    float* fterm = gl + 64;
    float(*t_do)[GLA_P] = (float(*)[GLA_P])region;  // [32][65] each: do, v, S_c, dH_c transposed
    float(*t_v)[GLA_P] = (float(*)[GLA_P])(region + GLA_KT * GLA_P);
    float(*t_s)[GLA_P] = (float(*)[GLA_P])(region + 2 * GLA_KT * GLA_P);
    float(*t_h)[GLA_P] = (float(*)[GLA_P])(region + 3 * GLA_KT * GLA_P);
    float(*kp)[48][GLA_P] = (float(*)[48][GLA_P])region;  // [3][48][65], then qp in the same place

    const int kb = blockIdx.x, c = blockIdx.y, bh = blockIdx.z;
    const auto [b, h, t0, len, first] = gla_chunk(c, bh, T, H, start);
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, k0 = kb * 64;
    const float* S0 = hs + ((long)bh * (nch + 1) + c) * K * V;
    const float* S1 = S0 + (long)K * V;
    const float* D = dhs + ((long)bh * nch + c) * K * V;

    // q, k (0 at padding, past T and past K) and G of the tile; dA.
    for (int e = tid; e < GLA_L * 64; e += 256) {
        const int r = e / 64, cc = e % 64, t = t0 + r;
        const bool in = k0 + cc < K, real = in && r < len && t >= first;
        const long i = gla_row(b, t, T, H, h) * K + k0 + cc;
        qr[r][cc] = real ? ld(q, i) : 0.0f;
        kr[r][cc] = real ? ld(k, i) : 0.0f;
        gs[r][cc] = in ? gla_g(G, b, t0, r, len, T, H, h, K, k0 + cc) : 0.0f;
        das[r][cc] = dA[((long)bh * nch + c) * GLA_L * GLA_L + e];
    }
    // The end-of-chunk term Σ_v S_{c+1}[kc, v] dH_c[kc, v]: four threads per channel, their
    // strided partial sums combined in a fixed order.
    {
        const int cc = tid / 4, part = tid % 4, kc = k0 + cc;
        float s = 0.0f;
        if (kc < K)
            for (int vv = part; vv < V; vv += 4) s += S1[(long)kc * V + vv] * D[(long)kc * V + vv];
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (part == 0) fterm[cc] = s;
    }
    if (tid < 64) gl[tid] = k0 + tid < K ? gla_g(G, b, t0, len - 1, len, T, H, h, K, k0 + tid) : 0.0f;

    // The state terms: aq = do S_cᵀ, ak = v dH_cᵀ over the value columns.
    float aq[4][4] = {}, ak[4][4] = {};
    if (TC) {
        // Version 2: do, v [t][v] and S_c, dH_c [kc][v] as bf16 tiles, 64 value columns at a time;
        // the products through shared memory into this thread's elements.
        u16* s_do = (u16*)region;
        u16* s_s = s_do + 64 * GLA_TS;
        u16* s_v = s_s + 64 * GLA_TS;
        u16* s_h = s_v + 64 * GLA_TS;
        float fq[4][4] = {}, fk[4][4] = {};
        for (int v0 = 0; v0 < V; v0 += 64) {
            __syncthreads();
            for (int e = tid; e < GLA_L * 64; e += 256) {
                const int r = e / 64, vv = e % 64, t = t0 + r;
                const bool real = v0 + vv < V && r < len && t >= first;
                const long i = gla_row(b, t, T, H, h) * V + v0 + vv;
                gla_put(s_do, r * GLA_TS + vv, real ? ld(dout, i) : 0.0f);
                gla_put(s_v, r * GLA_TS + vv, real ? ld(v, i) : 0.0f);
                const bool in = v0 + vv < V && k0 + r < K;
                gla_put(s_s, r * GLA_TS + vv, in ? S0[(long)(k0 + r) * V + v0 + vv] : 0.0f);
                gla_put(s_h, r * GLA_TS + vv, in ? D[(long)(k0 + r) * V + v0 + vv] : 0.0f);
            }
            __syncthreads();
            gla_tc_gemm(fq, s_do, s_s, 64);
            gla_tc_gemm(fk, s_v, s_h, 64);
        }
        __syncthreads();
        float(*sq)[GLA_P] = (float(*)[GLA_P])region;
        float(*sk)[GLA_P] = (float(*)[GLA_P])(region + GLA_L * GLA_P);
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            sq[gla_tc_row(e)][gla_tc_col(e)] = fq[e >> 2][e & 3];
            sk[gla_tc_row(e)][gla_tc_col(e)] = fk[e >> 2][e & 3];
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int bb = 0; bb < 4; ++bb) {
                aq[a][bb] = sq[ty + 16 * a][tx + 16 * bb];
                ak[a][bb] = sk[ty + 16 * a][tx + 16 * bb];
            }
    }
    for (int v0 = 0; v0 < (TC ? 0 : V); v0 += GLA_KT) {
        __syncthreads();
        for (int e = tid; e < GLA_L * GLA_KT; e += 256) {
            const int r = e / GLA_KT, vv = e % GLA_KT, t = t0 + r;
            const bool real = v0 + vv < V && r < len && t >= first;
            const long i = gla_row(b, t, T, H, h) * V + v0 + vv;
            t_do[vv][r] = real ? ld(dout, i) : 0.0f;
            t_v[vv][r] = real ? ld(v, i) : 0.0f;
            const bool in = v0 + vv < V && k0 + r < K;
            t_s[vv][r] = in ? S0[(long)(k0 + r) * V + v0 + vv] : 0.0f;
            t_h[vv][r] = in ? D[(long)(k0 + r) * V + v0 + vv] : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < GLA_KT; ++kk) {
            float a1[4], w1[4], a2[4], w2[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a1[i] = t_do[kk][ty + 16 * i];
                w1[i] = t_s[kk][tx + 16 * i];
                a2[i] = t_v[kk][ty + 16 * i];
                w2[i] = t_h[kk][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    aq[i][j] += a1[i] * w1[j];
                    ak[i][j] += a2[i] * w2[j];
                }
        }
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int bb = 0; bb < 4; ++bb) {
            const int i = ty + 16 * a, cc = tx + 16 * bb;
            aq[a][bb] *= scale * __expf(gs[i][cc]);
            ak[a][bb] *= __expf(gl[cc] - gs[i][cc]);
        }

    // dq's intra-chunk term. kp[a − 1][j] = k_j e^{G_16a − G_j} for j < 16a.
    for (int e = tid; e < 48 * 64; e += 256) {
        const int r = e / 64, cc = e % 64;
        for (int a = r / 16 + 1; a < 4; ++a) kp[a - 1][r][cc] = kr[r][cc] * __expf(gs[16 * a][cc] - gs[r][cc]);
    }
    __syncthreads();
#pragma unroll
    for (int a = 1; a < 4; ++a) {
        float t4[4] = {};
        const int i = ty + 16 * a;
        for (int j = 0; j < 16 * a; ++j) {
            const float d = das[i][j];
#pragma unroll
            for (int bb = 0; bb < 4; ++bb) t4[bb] += d * kp[a - 1][j][tx + 16 * bb];
        }
#pragma unroll
        for (int bb = 0; bb < 4; ++bb) {
            const int cc = tx + 16 * bb;
            aq[a][bb] += t4[bb] * __expf(gs[i][cc] - gs[16 * a][cc]);
        }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const int i = ty + 16 * a;
#pragma unroll
        for (int bb = 0; bb < 4; ++bb) {
            const int cc = tx + 16 * bb;
            float s = 0.0f;
            for (int j = 16 * a; j <= i; ++j) s += das[i][j] * kr[j][cc] * __expf(gs[i][cc] - gs[j][cc]);
            aq[a][bb] += s;
        }
    }
    __syncthreads();
    // dk's intra-chunk term. qp[a][i − 16(a + 1)] = q_i e^{G_i − G_{16a+15}} for i ≥ 16(a + 1).
    for (int e = tid; e < 48 * 64; e += 256) {
        const int r = e / 64, cc = e % 64, i = 16 + r;
        for (int a = 0; 16 * (a + 1) <= i; ++a)
            kp[a][i - 16 * (a + 1)][cc] = qr[i][cc] * __expf(gs[i][cc] - gs[16 * a + 15][cc]);
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        float t4[4] = {};
        const int j = ty + 16 * a;
        for (int i = 16 * (a + 1); i < GLA_L; ++i) {
            const float d = das[i][j];
#pragma unroll
            for (int bb = 0; bb < 4; ++bb) t4[bb] += d * kp[a][i - 16 * (a + 1)][tx + 16 * bb];
        }
#pragma unroll
        for (int bb = 0; bb < 4; ++bb) {
            const int cc = tx + 16 * bb;
            ak[a][bb] += t4[bb] * __expf(gs[16 * a + 15][cc] - gs[j][cc]);
        }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const int j = ty + 16 * a;
#pragma unroll
        for (int bb = 0; bb < 4; ++bb) {
            const int cc = tx + 16 * bb;
            float s = 0.0f;
            for (int i = j; i < 16 * a + 16; ++i) s += das[i][j] * qr[i][cc] * __expf(gs[i][cc] - gs[j][cc]);
            ak[a][bb] += s;
        }
    }
    // dq, dk out; dG = q dq − k dk into das (free now), then its reverse prefix sums.
    __syncthreads();
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const int r = ty + 16 * a, t = t0 + r;
        const bool real = r < len && t >= first;
#pragma unroll
        for (int bb = 0; bb < 4; ++bb) {
            const int cc = tx + 16 * bb;
            das[r][cc] = qr[r][cc] * aq[a][bb] - kr[r][cc] * ak[a][bb];
            if (r < len && k0 + cc < K) {
                const long i = gla_row(b, t, T, H, h) * K + k0 + cc;
                st(dq, i, real ? aq[a][bb] : 0.0f);
                st(dk, i, real ? ak[a][bb] : 0.0f);
            }
        }
    }
    __syncthreads();
    if (tid < 64) {
        float s = fterm[tid];
        for (int r = GLA_L - 1; r >= 0; --r) {
            s += das[r][tid];
            das[r][tid] = s;
        }
    }
    __syncthreads();
    for (int e = tid; e < GLA_L * 64; e += 256) {
        const int r = e / 64, cc = e % 64, t = t0 + r;
        if (r < len && k0 + cc < K) st(dg, gla_row(b, t, T, H, h) * K + k0 + cc, t >= first ? das[r][cc] : 0.0f);
    }
}

extern "C" __global__ void __launch_bounds__(256)
    KN(gla_bwd_dqk)(ET* dq, ET* dk, ET* dg, const ET* q, const ET* k, const ET* v, const ET* dout, const float* G,
                    const float* hs, const float* dhs, const float* dA, const int* start, int T, int H, int K, int V,
                    int nch, float scale) {
    gla_bwd_dqk_impl<false>(dq, dk, dg, q, k, v, dout, G, hs, dhs, dA, start, T, H, K, V, nch, scale);
}
// Version 2: the state terms on tensor cores (bf16 operands, f32 sums), the rest as version 1.
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_bwd_dqk_tc)(ET* dq, ET* dk, ET* dg, const ET* q, const ET* k, const ET* v, const ET* dout,
                       const float* G, const float* hs, const float* dhs, const float* dA, const int* start, int T,
                       int H, int K, int V, int nch, float scale) {
    gla_bwd_dqk_impl<true>(dq, dk, dg, q, k, v, dout, G, hs, dhs, dA, start, T, H, K, V, nch, scale);
}

// One decoding step per (b, h) (q, k, g [B, H, K], v, o [B, H, V]; state [B, H, K, V] in place):
// S = Diag(e^g) S + k vᵀ, o = scale Sᵀ q. A row whose start is past its one position is padding:
// o = 0, state unchanged. A block takes 32 value columns of one (b, h) (grid (B·H, ⌈V/32⌉)): a
// warp's lanes a row's 32 columns, the 8 warps every 8th row, their partial o added in warp
// order. K ≤ GLA_DECODE_KMAX.
extern "C" __global__ void __launch_bounds__(256)
    KN(gla_decode)(float* S, ET* o, const ET* q, const ET* k, const ET* v, const ET* g, const int* start, int H,
                   int K, int V, float scale) {
    __shared__ float qs[GLA_DECODE_KMAX], ks[GLA_DECODE_KMAX], ds[GLA_DECODE_KMAX];
    __shared__ float part[8][32];
    const int bh = blockIdx.x, b = bh / H, tid = threadIdx.x, lane = tid % 32, w = tid / 32;
    const int vv = blockIdx.y * 32 + lane;
    const bool pad = start && start[b] > 0;
    for (int c = tid; c < K; c += 256) {
        const long i = (long)bh * K + c;
        qs[c] = ld(q, i);
        ks[c] = ld(k, i);
        ds[c] = __expf(ld(g, i));
    }
    __syncthreads();
    float acc = 0.0f;
    if (!pad && vv < V) {
        float* Sb = S + (long)bh * K * V + vv;
        const float x = ld(v, (long)bh * V + vv);
#pragma unroll 4
        for (int c = w; c < K; c += 8) {
            const float s = Sb[(long)c * V] * ds[c] + ks[c] * x;
            Sb[(long)c * V] = s;
            acc += qs[c] * s;
        }
    }
    part[w][lane] = acc;
    __syncthreads();
    if (w == 0 && vv < V) {
        float s = 0.0f;
#pragma unroll
        for (int p = 0; p < 8; ++p) s += part[p][lane];
        st(o, (long)bh * V + vv, pad ? 0.0f : scale * s);
    }
}

// HGRN2's gates, elementwise over n values of rows of d (lb: the layer's row of the lower bounds,
// or null in an unbounded layer): q = silu(q_in); g = logsigmoid(f), bounded logaddexp(ln lb,
// ln(1 − lb) + logsigmoid(f)); k = 1 − e^g.
extern "C" __global__ void KN(hgrn2_gates_fwd)(ET* q, ET* k, ET* g, const ET* q_in, const ET* f, const float* lb,
                                               long n, int d) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float x = ld(q_in, i);
        st(q, i, x * sigmoid_gate(x));
        const float ls = log_sigmoidf_(ld(f, i));
        float gv = ls;
        if (lb) {
            const float l = lb[i % d], a = logf(l), c = log1pf(-l) + ls;
            gv = fmaxf(a, c) + log1pf(expf(-fabsf(a - c)));
        }
        st(g, i, gv);
        st(k, i, -expm1f(gv));
    }
}

// The gates' backward over rows of d: a thread per column, rows_per_part rows of it (grid
// (⌈d/256⌉, parts)). dq_in = dq σ(x)(1 + x(1 − σ(x))); the gate's total gradient dgt = dg − dk e^g;
// df = dgt (1 − σ(f)), bounded dgt (1 − lb) σ(1 − σ) e^{−g}; in a bounded layer also the part's
// sum of dgt (1 − σ) e^{−g} (the lower bound's gradient) into part [parts, d].
extern "C" __global__ void KN(hgrn2_gates_bwd)(ET* dq_in, ET* df, float* part, const ET* dq, const ET* dk,
                                               const ET* dg, const ET* q_in, const ET* f, const ET* g,
                                               const float* lb, long rows, int d, int rows_per_part) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    const long r0 = (long)blockIdx.y * rows_per_part, r1 = min(rows, r0 + rows_per_part);
    const float l = lb ? lb[c] : 0.0f;
    float acc = 0.0f;
    for (long r = r0; r < r1; ++r) {
        const long i = r * d + c;
        const float x = ld(q_in, i), s = sigmoid_gate(x);
        st(dq_in, i, ld(dq, i) * s * (1.0f + x * (1.0f - s)));
        const float gv = ld(g, i), sf = sigmoid_gate(ld(f, i));
        const float dgt = ld(dg, i) - ld(dk, i) * expf(gv);
        if (lb) {
            const float inv = expf(-gv);
            acc += dgt * (1.0f - sf) * inv;
            st(df, i, dgt * (1.0f - l) * sf * (1.0f - sf) * inv);
        } else {
            st(df, i, dgt * (1.0f - sf));
        }
    }
    if (part) part[(long)blockIdx.y * d + c] = acc;
}
