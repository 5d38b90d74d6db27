// The delta rule of DeltaNet and Gated DeltaNet (crate::delta_rule), chunked, and the layer's
// small ops (L2 norm, the decay, the swish gate). Compiled after elem.cuh.
//
// Per (batch row b, head h) with state S [K, V], chunks of L = 64 positions from position 0,
// G_i = Σ_{s ≤ i} g_s within the chunk, γ_i = e^{G_i}, D_ij = e^{G_i − G_j} (j ≤ i), S_0 the state
// entering the chunk (the WY form; see crate::delta_rule):
//
//   A_ij = β_i D_ij k_i·k_j (j < i),   T = (I + A)⁻¹,   W = T diag(βγ) K,   Ũ = T diag(β) V
//   U    = Ũ − W S_0
//   O    = scale · (diag(γ) Q S_0 + (D ∘ Q Kᵀ) U)
//   S_L  = γ_L S_0 + Kᵀ diag(e^{G_L − G}) U
//
// Left padding (t < start[b]) and the positions past T in the last chunk enter as q = k = v = 0,
// β = 0, g = 0: the state passes through them unchanged; their outputs and gradients are written
// as 0 (or not at all past T).
//
// Forward, three kernels: dr_prep (per chunk: G, A, T = (I + A)⁻¹ in f32 by 16x16 blocks, W and
// Ũ), dr_walk_fwd (the chunks in order with S in f32 registers, for bf16 per (b, h, 64 columns of
// V) on a warpgroup's wgmma (dr_walk_wg, sm_90a, K' ≥ 64) or per (b, h, 16 columns) on a warp each
// (dr_walk_tc), per (b, h, 32 columns) for f32; stores the state entering each chunk and turns Ũ
// into U), dr_out (per chunk: O). Each launch covers chunks c0.. of DrParams. For bf16 where one
// walk would leave most multiprocessors idle, the parallel walk replaces it (dr_walk_sum, then
// dr_walk_join, then dr_walk_tc over every segment at once; see dr_walk_tc); otherwise the host
// runs long sequences as segments, the walk of one beside dr_prep and dr_out of others. Backward: dr_prep and
// dr_walk_fwd again (keeping T), dr_dvl (per chunk: scale (D ∘ Q Kᵀ)ᵀ dO, the part of dU that does
// not depend on the state), dr_walk_bwd (the chunks in reverse: dS_L per chunk and dU), dr_grads
// (per chunk: every input's gradient from S_0, dS_L, U, dU and T).
//
// The block products run on a common 16x8-tile layout (DrAcc: each warp holds tiles of the output
// in registers). With bf16 activations the tiles are bf16 in shared memory and each 16x8x16 step is
// one mma.sync (f32 accumulation); with f32 activations the same tiles are f32 and the same steps
// are f32 FMAs, so T = f32 keeps f32 accuracy (the CPU check's precision). Scratch (W, U, the
// chunk states, T, dS) is stored in the activation type, dU and G in f32. No atomics: every sum
// has a fixed order, so results are the same bits run after run.

#define DR_L 64
#define DR_BV 32   // columns of V per block of the walks and per step of the chunk kernels
#define DR_NW 8    // warps per block of the chunk kernels and walks
#define DR_NT 256

typedef unsigned int u32;

struct DrParams {
    const void* q;      // [B, T, H, K]
    const void* k;      // [B, T, H, K]
    const void* v;      // [B, T, H, V]
    const void* beta;   // [B, T, H]
    const float* g;     // [B, T, H] log-decay, or null (DeltaNet)
    const int* start;   // [B] or null
    const float* init;  // [B, H, K, V] initial state or null
    float* fin;         // [B, H, K, V] final state or null (may be init); the decode step's state
    const float* dfin;  // backward: gradient of the final state or null
    float* dinit;       // backward: gradient of the initial state or null
    float* gc;          // [B·H, Tp] G per chunk
    void* w;            // [B·H, Tp, KP]
    void* u;            // [B·H, Tp, Vp]: Ũ, then U
    void* states;       // [B·H, nch, KP, Vp]: the state entering each chunk
    void* tm;           // [B·H, nch, 64, 64]: T
    void* dstates;      // [B·H, nch, KP, Vp]: the gradient of the state leaving each chunk
    float* du;          // [B·H, Tp, Vp]
    void* o;            // [B, T, H, V]
    const void* dout;   // [B, T, H, V]
    void* dq;
    void* dk;
    void* dv;
    void* dbeta;
    float* dg;  // or null
    // The parallel walk (dr_walk_sum, dr_walk_join, dr_walk_tc over segments): where each segment
    // ends from a zero state and from the identity, [nseg − 1][B·H][KP][Vp + KP] f32, and the state
    // entering each segment, [nseg][B, H, K, V] f32 (the first a copy of init, so that no block of
    // the walk reads init while the last segment's blocks write fin, which may be init).
    float* sums;
    float* entry;
    float scale;
    int B, T, H, K, V, Tp, nch, Vp;
    int vk, vv;  // q, k (and v, o, do) rows load by 16-byte copies: K (V) a multiple of 16 bytes, aligned
    // The chunks of this launch: the chunk kernels take chunk c0 + blockIdx.x, the forward walk
    // chunks c0..c1 from the state in init (its state after c1 into fin), so that the forward can
    // run as segments of chunks, the walk of one beside the chunk kernels of others.
    int c0, c1;
    // > 0: the walk's launch covers segments of seglen chunks from c0, segment blockIdx.z (the
    // parallel walk); 0: chunks c0..c1 in one.
    int seglen;
};

template <typename E>
struct DrPad;
template <>
struct DrPad<float> {
    static constexpr int v = 4;
};
template <>
struct DrPad<u16> {
    static constexpr int v = 8;
};

// Shared-memory layouts (bytes), mirrored by src/cuda/delta_rule.rs (smem_bytes). Row strides pad
// each tile so that the fragment loads of a warp fall in distinct banks.
template <typename E, int KP>
struct DrLayout {
    static constexpr int P = DrPad<E>::v, LK = KP + P, LL = DR_L + P, LV = DR_BV + P, LVF = DR_BV + 4;
    static constexpr int ES = (int)sizeof(E);
    static constexpr int TK = DR_L * LK * ES;  // [64][KP]
    static constexpr int TL = DR_L * LL * ES;  // [64][64]
    static constexpr int TV = DR_L * LV * ES;  // [64][BV]
    static constexpr int TS = KP * LV * ES;    // [KP][BV]
    static constexpr int DV = DR_L * LVF * 4;  // f32 [64][BV]
    static constexpr int F65 = DR_L * 65 * 4;  // f32 [64][65]
    static constexpr int ROWS = DR_L * 4;      // f32 [64]
    static constexpr int prep = TK + TV + 2 * TL + 2 * F65 + 2 * ROWS;
    static constexpr int walk_fwd = 2 * (2 * TK + TV + ROWS) + TS + TV;
    // The reverse walk's tiles of one chunk, twice where two sets fit 227 KB.
    static constexpr int WB_SET = 3 * TK + TV + DV + ROWS;
    static constexpr int NB_BWD = 2 * WB_SET + TS + 2 * TV <= 227 * 1024 ? 2 : 1;
    static constexpr int walk_bwd = NB_BWD * WB_SET + TS + 2 * TV;
    static constexpr int out = 2 * TK + TL + 2 * (TS + TV) + ROWS;
    static constexpr int dvl = 2 * TK + TL + TS + TV + ROWS;
    static constexpr int grads_b = 2 * TS + 7 * TV + DV > 3 * F65 + 2 * TL ? 2 * TS + 7 * TV + DV : 3 * F65 + 2 * TL;
    // sb, sG, sdG, sdb, stmp [64], part [8][64], red [256], sX [4]
    static constexpr int grads_small = (5 * DR_L + DR_NW * DR_L + DR_NT + 4) * 4;
    static constexpr int grads = 2 * TK + TL + grads_b + grads_small;
};

#ifndef FOX_HOST_EMU
#define DR_SMEM_DECL                                      \
    extern __shared__ __align__(16) unsigned char dr_smem_[]; \
    unsigned char* smem = dr_smem_;
// stmatrix .trans: four 8x8 pieces, lane l giving the address of row l % 8 of piece l / 8; register
// i of lane l holds piece i's (row l / 4, columns 2 (l % 4) + {0, 1}), stored transposed (that
// element pair lands in rows 2 (l % 4) + {0, 1}, column l / 4).
__device__ __forceinline__ void stsm_x4_t(u16* p, const u32 (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(
                     (unsigned)__cvta_generic_to_shared(p)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
// Traps when the launch gave less dynamic shared memory than the layout needs.
__device__ __forceinline__ void dr_need_smem(int bytes) {
    unsigned n;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    if (n < (unsigned)bytes) __trap();
}
#else
#define DR_SMEM_DECL unsigned char* smem = dyn_smem;
inline void dr_need_smem(int bytes) {
    if (bytes > (int)sizeof(dyn_smem)) abort();
}
#endif

// c (the 16x8 tile at rows r0, columns c0 of this warp's layout) += A[r0.., 0..kdim) · B[0..kdim, c0..).
// A(r, k) is A[r·lda + k] (A[k·lda + r] when AT); B(k, n) is B[k·ldb + n] (B[n·ldb + k] when BT).
// Fragments by ldmatrix (.trans where the tile holds the operand's transpose): lane l points at row
// l % 8 of 8x8 piece l / 8 (tile strides are multiples of 16 bytes, column offsets of 8 elements).
template <bool AT, bool BT>
__device__ __forceinline__ void dr_tile(float (&c)[4], const u16* A, int lda, const u16* B, int ldb, int r0, int c0,
                                        int kdim) {
    const int lane = threadIdx.x & 31, j = lane & 7, m = (lane >> 3) & 3;
    // Piece m of A: rows r0 + 8 (m & 1), k k0 + 8 (m >> 1); of B: k k0 + 8 (m & 1), columns c0.
    const u16* pa = AT ? A + (j + (m >> 1) * 8) * lda + r0 + (m & 1) * 8 : A + (r0 + j + (m & 1) * 8) * lda + (m >> 1) * 8;
    const u16* pb = BT ? B + (c0 + j) * ldb + (m & 1) * 8 : B + (j + (m & 1) * 8) * ldb + c0;
    const int sa = AT ? 16 * lda : 16, sb = BT ? 16 : 16 * ldb;
    for (int k0 = 0; k0 < kdim; k0 += 16) {
        u32 a[4], b[2];
        if (AT)
            ldsm_x4_t(a, pa + (k0 / 16) * sa);
        else
            ldsm_x4(a, pa + (k0 / 16) * sa);
        if (BT)
            ldsm_x2(b, pb + (k0 / 16) * sb);
        else
            ldsm_x2_t(b, pb + (k0 / 16) * sb);
        mma_bf16_16816(c, a, b[0], b[1]);
    }
}

// The same tile in f32 on the CUDA cores: lane (g, t) owns rows g, g + 8 and columns 2t, 2t + 1.
template <bool AT, bool BT>
__device__ __forceinline__ void dr_tile(float (&c)[4], const float* A, int lda, const float* B, int ldb, int r0, int c0,
                                        int kdim) {
    const int lane = threadIdx.x & 31;
    const int ra = r0 + (lane >> 2), rb = ra + 8, ca = c0 + 2 * (lane & 3), cb = ca + 1;
#pragma unroll 4
    for (int k = 0; k < kdim; ++k) {
        const float a0 = AT ? A[k * lda + ra] : A[ra * lda + k];
        const float a1 = AT ? A[k * lda + rb] : A[rb * lda + k];
        const float b0 = BT ? B[ca * ldb + k] : B[k * ldb + ca];
        const float b1 = BT ? B[cb * ldb + k] : B[k * ldb + cb];
        c[0] = fmaf(a0, b0, c[0]);
        c[1] = fmaf(a0, b1, c[1]);
        c[2] = fmaf(a1, b0, c[2]);
        c[3] = fmaf(a1, b1, c[3]);
    }
}

// An M x N f32 block result spread over the block's warps in 16x8 tiles: warp w holds tiles
// w·TPW .. w·TPW + TPW − 1 in row-major tile order, all in one 16-row band; element r of tile i is
// (row(i, r), col(i, r)).
template <int M, int N>
struct DrAcc {
    static constexpr int CT = N / 8;
    static constexpr int TPW = (M / 16) * CT / DR_NW;
    static_assert(TPW >= 1 && (M / 16) * CT % DR_NW == 0 && CT % TPW == 0, "DrAcc: tiles do not divide");
    float c[TPW][4];
    __device__ __forceinline__ int tile(int i) const { return (int)(threadIdx.x >> 5) * TPW + i; }
    __device__ __forceinline__ int row(int i, int r) const {
        return tile(i) / CT * 16 + (int)((threadIdx.x & 31) >> 2) + (r >> 1) * 8;
    }
    __device__ __forceinline__ int col(int i, int r) const { return tile(i) % CT * 8 + 2 * (int)(threadIdx.x & 3) + (r & 1); }
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int i = 0; i < TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) c[i][r] = 0.f;
    }
    template <bool AT, bool BT, typename S>
    __device__ __forceinline__ void mma(const S* A, int lda, const S* B, int ldb, int kdim) {
#pragma unroll
        for (int i = 0; i < TPW; ++i) dr_tile<AT, BT>(c[i], A, lda, B, ldb, tile(i) / CT * 16, tile(i) % CT * 8, kdim);
    }
    // The tile = A · B, as mma from zero.
    template <bool AT, bool BT, typename S>
    __device__ __forceinline__ void product(const S* A, int lda, const S* B, int ldb, int kdim) {
        zero();
        mma<AT, BT>(A, lda, B, ldb, kdim);
    }
    __device__ __forceinline__ void scale(float s) {
#pragma unroll
        for (int i = 0; i < TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) c[i][r] *= s;
    }
    template <typename S>
    __device__ __forceinline__ void store(S* s, int lds) const {
#pragma unroll
        for (int i = 0; i < TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) st(s, (long long)row(i, r) * lds + col(i, r), c[i][r]);
    }
    // A state's [K, V] tile at columns v0.. of head bh from src, a [BH, K, V] state of p's (0 past
    // K or V, or everywhere when src is null); src by reference, read where the tile is.
    __device__ __forceinline__ void load_state(const DrParams& p, const float* const& src, int bh, int v0) {
#pragma unroll
        for (int i = 0; i < TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int kd = row(i, r), vc = v0 + col(i, r);
                c[i][r] = src && kd < p.K && vc < p.V ? src[((long long)bh * p.K + kd) * p.V + vc] : 0.f;
            }
    }
    // The tile into dst, a [BH, K, V] state of p's (the walk's final state or its gradient), where
    // dst is not null.
    __device__ __forceinline__ void save_state(const DrParams& p, float* const& dst, int bh, int v0) const {
        if (dst) {
#pragma unroll
            for (int i = 0; i < TPW; ++i)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int kd = row(i, r), vc = v0 + col(i, r);
                    if (kd < p.K && vc < p.V) dst[((long long)bh * p.K + kd) * p.V + vc] = c[i][r];
                }
        }
    }
    // The tile into shared memory s (row stride lds) and into a chunk's saved state g from row g0,
    // columns v0.. (row stride ldg): the walk's state at a chunk boundary, kept for the chunk.
    template <typename S>
    __device__ __forceinline__ void store_state(S* s, int lds, S* g, long long g0, int ldg, int v0) const {
#pragma unroll
        for (int i = 0; i < TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int kd = row(i, r), vc = col(i, r);
                st(s, kd * lds + vc, c[i][r]);
                st(g, (g0 + kd) * ldg + v0 + vc, c[i][r]);
            }
    }
};

// out[row] += mul(row) · Σ over the row's columns of v (values laid out as DrAcc<M, N>), for every
// row: lanes of a row sum by a fixed butterfly, the warps of a band through `part` in order. All
// threads call it.
template <int M, int N, typename F>
__device__ __forceinline__ void dr_rowsum(const float (&v)[DrAcc<M, N>::TPW][4], float* part, float* out, F mul) {
    typedef DrAcc<M, N> A;
    constexpr int WPR = A::CT / A::TPW;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, tile0 = w * A::TPW;
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int i = 0; i < A::TPW; ++i) {
        s0 += v[i][0] + v[i][1];
        s1 += v[i][2] + v[i][3];
    }
    s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
    s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
    if ((lane & 3) == 0) {
        const int row = tile0 / A::CT * 16 + (lane >> 2), j = tile0 % A::CT / A::TPW;
        part[j * M + row] = s0;
        part[j * M + row + 8] = s1;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < M; t += DR_NT) {
        float s = 0.f;
        for (int j = 0; j < WPR; ++j) s += part[j * M + t];
        out[t] += mul(t) * s;
    }
    __syncthreads();
}

// Head (b, h) of an input [B, T, H, dim]: rows t0..t0 + 63, columns c0..c0 + NC of the tile s
// [64][ld]; zero outside lo ≤ t < hi and past dim; row r times f(r).
template <int NC, int NT = DR_NT, typename E, typename F>
__device__ __forceinline__ void dr_load(E* s, int lds, const E* x, int dim, int c0, const DrParams& p, int b, int h, int t0,
                                        int lo, int hi, F f) {
    for (int i = threadIdx.x; i < DR_L * NC; i += NT) {
        const int r = i / NC, cc = i % NC, t = t0 + r, col = c0 + cc;
        float v = 0.f;
        if (t >= lo && t < hi && col < dim) v = ld(x, (((long long)b * p.T + t) * p.H + h) * dim + col) * f(r);
        st(s, (long long)r * lds + cc, v);
    }
}

__device__ __forceinline__ float dr_one(int) { return 1.f; }

struct DrBlock {
    int b, h, bh, lo, hi;
};

__device__ __forceinline__ DrBlock dr_block(const DrParams& p) {
    DrBlock k;
    k.bh = blockIdx.y;
    k.b = k.bh / p.H;
    k.h = k.bh % p.H;
    k.lo = p.start ? min(max(p.start[k.b], 0), p.T) : 0;
    k.hi = p.T;
    return k;
}

// dr_load of chunk t0 of head (b, h) as it is, by 16-byte asynchronous copies (zeros outside
// lo ≤ t < hi and past dim) where `vec`, else element by element now. The caller commits and waits.
template <int NC, int NT = DR_NT, typename E>
__device__ __forceinline__ void dr_in(E* s, int lds, const E* x, int dim, int c0, const DrParams& p, const DrBlock& k,
                                      int t0, int vec) {
    constexpr int CE = 16 / (int)sizeof(E), CH = NC / CE;
    if (vec) {
        for (int i = threadIdx.x; i < DR_L * CH; i += NT) {
            const int r = i / CH, cc = i % CH * CE, t = t0 + r, col = c0 + cc;
            const bool ok = t >= k.lo && t < k.hi && col < dim;
            cp_async16(s + r * lds + cc, ok ? x + (((long long)k.b * p.T + t) * p.H + k.h) * dim + col : x, ok);
        }
    } else {
        dr_load<NC, NT>(s, lds, x, dim, c0, p, k.b, k.h, t0, k.lo, k.hi, dr_one);
    }
}

// Rows row0..row0 + ROWS, columns c0..c0 + NC of a scratch matrix of `width` columns into s
// [ROWS][lds], by 16-byte asynchronous copies (the scratch's rows and column blocks are 16-byte
// aligned). The caller commits and waits.
template <int ROWS, int NC, int NT = DR_NT, typename E>
__device__ __forceinline__ void dr_scr(E* s, int lds, const E* x, long long row0, int width, int c0) {
    constexpr int CE = 16 / (int)sizeof(E), CH = NC / CE;
    for (int i = threadIdx.x; i < ROWS * CH; i += NT) {
        const int r = i / CH, cc = i % CH * CE;
        cp_async16(s + r * lds + cc, x + (row0 + r) * width + c0 + cc, true);
    }
}

// Two values at p[i], p[i + 1] (i even, p 4-byte aligned: the scratch's rows), rounded as st.
__device__ __forceinline__ void st2(float* p, long long i, float a, float b) {
    p[i] = a;
    p[i + 1] = b;
}
__device__ __forceinline__ void st2(u16* p, long long i, float a, float b);

// T = (I + A)⁻¹ for A [64][65] f32 strictly lower triangular, into Tf [64][65] (zero above the
// diagonal), with X [3][16][16] f32 of scratch. All threads call it; it begins and ends with a barrier.
__device__ __forceinline__ void dr_tril_inv(const float* Af, float* Tf, float* X) {
    const int tid = threadIdx.x;
    for (int i = tid; i < DR_L * DR_L; i += DR_NT) {
        const int r = i / DR_L, c = i % DR_L;
        if (r / 16 < c / 16) Tf[r * 65 + c] = 0.f;
    }
    if (tid < DR_L) {
        const int o = tid & ~15, c = tid & 15;
        for (int i = 0; i < c; ++i) Tf[(o + i) * 65 + o + c] = 0.f;
        Tf[(o + c) * 65 + o + c] = 1.f;
        for (int i = c + 1; i < 16; ++i) {
            float s = 0.f;
            for (int j = c; j < i; ++j) s += Af[(o + i) * 65 + o + j] * Tf[(o + j) * 65 + o + c];
            Tf[(o + i) * 65 + o + c] = -s;
        }
    }
    __syncthreads();
    for (int d = 1; d < 4; ++d) {
        const int n = (4 - d) * 256;
        for (int e = tid; e < n; e += DR_NT) {
            const int jb = e >> 8, r = (e >> 4) & 15, c = e & 15, ib = jb + d;
            float s = 0.f;
            for (int m = jb * 16; m < ib * 16; ++m) s += Af[(ib * 16 + r) * 65 + m] * Tf[m * 65 + jb * 16 + c];
            X[e] = s;
        }
        __syncthreads();
        for (int e = tid; e < n; e += DR_NT) {
            const int jb = e >> 8, r = (e >> 4) & 15, c = e & 15, ib = jb + d;
            float s = 0.f;
            for (int l = 0; l <= r; ++l) s += Tf[(ib * 16 + r) * 65 + ib * 16 + l] * X[(jb << 8) + (l << 4) + c];
            Tf[(ib * 16 + r) * 65 + jb * 16 + c] = -s;
        }
        __syncthreads();
    }
}

// ---- dr_prep: per chunk G, A, T = (I + A)⁻¹, W = T diag(βγ) K, Ũ = T diag(β) V ----
template <typename E, int KP>
__device__ __forceinline__ void dr_prep(const DrParams& p, int keep_t) {
    typedef DrLayout<E, KP> Lay;
    DR_SMEM_DECL
    dr_need_smem(Lay::prep);
    E* Ks = (E*)smem;
    E* Vs = (E*)(smem + Lay::TK);
    E* Tb = (E*)(smem + Lay::TK + Lay::TV);
    E* Tv = (E*)(smem + Lay::TK + Lay::TV + Lay::TL);
    float* Af = (float*)(smem + Lay::TK + Lay::TV + 2 * Lay::TL);
    float* Tf = Af + DR_L * 65;
    float* sb = Tf + DR_L * 65;
    float* sG = sb + DR_L;
    const DrBlock k = dr_block(p);
    const int c = p.c0 + blockIdx.x, t0 = c * DR_L, tid = threadIdx.x;
    // V's blocks of DR_BV columns alternate between Vs and the space of A (free once T is known).
    auto Vb = [&](int i) { return i ? (E*)Af : Vs; };
    dr_in<KP>(Ks, Lay::LK, (const E*)p.k, p.K, 0, p, k, t0, p.vk);
    dr_in<DR_BV>(Vs, Lay::LV, (const E*)p.v, p.V, 0, p, k, t0, p.vv);
    cp_async_commit();
    if (tid < DR_L) {
        const int t = t0 + tid;
        const bool ok = t >= k.lo && t < k.hi;
        const long long r = ((long long)k.b * p.T + t) * p.H + k.h;
        sb[tid] = ok ? ld((const E*)p.beta, r) : 0.f;
        sG[tid] = ok && p.g ? p.g[r] : 0.f;
    }
    __syncthreads();
    if (tid == 0) {
        float acc = 0.f;
        for (int i = 0; i < DR_L; ++i) {
            acc += sG[i];
            sG[i] = acc;
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    if (tid < DR_L) p.gc[(long long)k.bh * p.Tp + t0 + tid] = sG[tid];
    {
        DrAcc<DR_L, DR_L> kk;
        kk.template product<false, true>(Ks, Lay::LK, Ks, Lay::LK, KP);
#pragma unroll
        for (int i = 0; i < kk.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int ii = kk.row(i, r), j = kk.col(i, r);
                Af[ii * 65 + j] = j < ii ? sb[ii] * __expf(sG[ii] - sG[j]) * kk.c[i][r] : 0.f;
            }
    }
    __syncthreads();
    // T = (I + A)⁻¹ by 16x16 blocks: the four diagonal blocks by forward substitution (a thread per
    // column of each), then T_ij = −T_ii Σ_{j ≤ m < i} A_im T_mj one block diagonal at a time (three
    // blocks below the diagonal, then two, then one). X (the sums) in the space of Tv.
    dr_tril_inv(Af, Tf, (float*)Tv);
    // T diag(βγ) and T diag(β): W and Ũ from K and V as they are.
    E* tm = (E*)p.tm;
    const long long tbase = ((long long)k.bh * p.nch + c) * (DR_L * DR_L);
    for (int i = tid; i < DR_L * DR_L; i += DR_NT) {
        const int r = i / DR_L, cc = i % DR_L;
        const float v = Tf[r * 65 + cc];
        st(Tb, r * Lay::LL + cc, v * sb[cc] * __expf(sG[cc]));
        st(Tv, r * Lay::LL + cc, v * sb[cc]);
        if (keep_t) st(tm, tbase + i, v);
    }
    __syncthreads();
    const long long row0 = (long long)k.bh * p.Tp + t0;
    {
        DrAcc<DR_L, KP> w;
        w.template product<false, false>(Tb, Lay::LL, Ks, Lay::LK, DR_L);
        E* W = (E*)p.w;
#pragma unroll
        for (int i = 0; i < w.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; r += 2) st2(W, (row0 + w.row(i, r)) * KP + w.col(i, r), w.c[i][r], w.c[i][r + 1]);
    }
    E* U = (E*)p.u;
    for (int v0 = 0, it = 0; v0 < p.Vp; v0 += DR_BV, ++it) {
        const int cur = it & 1;
        cp_async_prefetch(v0 + DR_BV < p.Vp, [&] {
            dr_in<DR_BV>(Vb(cur ^ 1), Lay::LV, (const E*)p.v, p.V, v0 + DR_BV, p, k, t0, p.vv);
            cp_async_commit();
        });
        __syncthreads();
        DrAcc<DR_L, DR_BV> u;
        u.template product<false, false>(Tv, Lay::LL, Vb(cur), Lay::LV, DR_L);
#pragma unroll
        for (int i = 0; i < u.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; r += 2)
                st2(U, (row0 + u.row(i, r)) * p.Vp + v0 + u.col(i, r), u.c[i][r], u.c[i][r + 1]);
        __syncthreads();
    }
}

// ---- dr_walk_fwd: per (b, h, 32 columns of V), the chunks in order ----
// U = Ũ − W S_0 (stored over Ũ); S_L = γ_L S_0 + Kᵀ (diag(e^{G_L − G}) U). The next chunk's W, K, Ũ
// and G load (asynchronously) while this one computes.
template <typename E, int KP>
__device__ __forceinline__ void dr_walk_fwd(const DrParams& p) {
    typedef DrLayout<E, KP> Lay;
    DR_SMEM_DECL
    dr_need_smem(Lay::walk_fwd);
    // Two sets of W, K, Ũ and G tiles (set i at smem + i·SET).
    constexpr int SET = 2 * Lay::TK + Lay::TV + Lay::ROWS;
    auto Wb = [&](int i) { return (E*)(smem + i * SET); };
    auto Kb = [&](int i) { return (E*)(smem + i * SET + Lay::TK); };
    auto Ub = [&](int i) { return (E*)(smem + i * SET + 2 * Lay::TK); };
    auto Gb = [&](int i) { return (float*)(smem + i * SET + 2 * Lay::TK + Lay::TV); };
    unsigned char* rest = smem + 2 * SET;
    E* Ss = (E*)rest;
    E* Us = (E*)(rest + Lay::TS);
    const DrBlock k = dr_block(p);
    const int v0 = blockIdx.x * DR_BV;
    E* states = (E*)p.states;
    const E* W = (const E*)p.w;
    E* U = (E*)p.u;
    auto issue = [&](int c, int bi) {
        const long long row0 = (long long)k.bh * p.Tp + c * DR_L;
        dr_scr<DR_L, KP>(Wb(bi), Lay::LK, W, row0, KP, 0);
        dr_in<KP>(Kb(bi), Lay::LK, (const E*)p.k, p.K, 0, p, k, c * DR_L, p.vk);
        dr_scr<DR_L, DR_BV>(Ub(bi), Lay::LV, (const E*)U, row0, p.Vp, v0);
        if (threadIdx.x < DR_L / 4) cp_async16(Gb(bi) + 4 * threadIdx.x, p.gc + row0 + 4 * threadIdx.x, true);
        cp_async_commit();
    };
    DrAcc<KP, DR_BV> S;
    S.load_state(p, p.init, k.bh, v0);
    issue(p.c0, 0);
    for (int c = p.c0; c < p.c1; ++c) {
        const int cur = (c - p.c0) & 1;
        cp_async_prefetch(c + 1 < p.c1, [&] { issue(c + 1, cur ^ 1); });
        const long long row0 = (long long)k.bh * p.Tp + c * DR_L;
        const long long sbase = ((long long)k.bh * p.nch + c) * KP;
        S.store_state(Ss, Lay::LV, states, sbase, p.Vp, v0);
        __syncthreads();
        const float* sG = Gb(cur);
        const float gl = sG[DR_L - 1];
        DrAcc<DR_L, DR_BV> u;
        u.template product<false, false>(Wb(cur), Lay::LK, Ss, Lay::LV, KP);
#pragma unroll
        for (int i = 0; i < u.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int row = u.row(i, r), col = u.col(i, r);
                const float val = ld(Ub(cur), row * Lay::LV + col) - u.c[i][r];
                st(U, (row0 + row) * p.Vp + v0 + col, val);
                st(Us, row * Lay::LV + col, __expf(gl - sG[row]) * val);
            }
        __syncthreads();
        const float egl = __expf(gl);
        S.scale(egl);
        S.template mma<true, false>(Kb(cur), Lay::LK, Us, Lay::LV, DR_L);
        __syncthreads();
    }
    S.save_state(p, p.fin, k.bh, v0);
}

// Two f32 values as a bf16 pair (low half first), rounded to nearest even as st.
#ifndef FOX_HOST_EMU
__device__ __forceinline__ u32 dr_bf2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#else
inline u32 dr_bf2(float lo, float hi) {
    u16 a, b;
    st(&a, 0, lo);
    st(&b, 0, hi);
    return (u32)a | ((u32)b << 16);
}
#endif
// The walk's A fragments of (diag(e^{G_L − G}) U)ᵀ for its update Sᵀ += (…)ᵀ K: this lane's
// U accumulators u (four m16n8 tiles of chunk rows 16 kk.., 8 floats each, as both walks hold
// them), scaled by their rows' decays and rounded to bf16 pairs. t = lane % 4.
__device__ __forceinline__ void dr_decayed_a(u32 (&ua)[4][4], const float* u, const float* sG, float gl, int t) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const int p0 = kk * 16 + 2 * t;
        const float d00 = __expf(gl - sG[p0]), d01 = __expf(gl - sG[p0 + 1]);
        const float d10 = __expf(gl - sG[p0 + 8]), d11 = __expf(gl - sG[p0 + 9]);
        const float* x = u + 8 * kk;
        ua[kk][0] = dr_bf2(x[0] * d00, x[1] * d01);
        ua[kk][1] = dr_bf2(x[2] * d00, x[3] * d01);
        ua[kk][2] = dr_bf2(x[4] * d10, x[5] * d11);
        ua[kk][3] = dr_bf2(x[6] * d10, x[7] * d11);
    }
}
__device__ __forceinline__ void st2(u16* p, long long i, float a, float b) { *(u32*)(p + i) = dr_bf2(a, b); }
__device__ __forceinline__ float dr_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float dr_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// ---- dr_walk_tc: the state walk with bf16 activations, on tensor cores ----
// Per (b, h, DR_WV columns of V), DR_WW warps, warp w owning the 16 columns vw = v0 + 16w: it keeps
// Sᵀ [16, K'] in f32 registers in the mma accumulator layout, which is also the A operand layout of
// the next products (rounded to bf16), so the chain Uᵀ = Ũᵀ − Sᵀ Wᵀ, Sᵀ ← γ_L Sᵀ + (U')ᵀ K never
// leaves the warp: no barrier inside a chunk. W, K, Ũ and G of the next chunk load while this one
// computes (one barrier per chunk); the entering states go out through a per-warp staging tile
// and U through the warp's own columns of the Ũ tile it was just read from (stmatrix .trans), as
// 16-byte rows. Same scratch and the same roundings as dr_walk_fwd.
//
// The parallel walk. The columns of S never mix: per chunk S ← M S + Kᵀ diag(e^{G_L − G}) Ũ with
// M = γ_L I − Kᵀ diag(e^{G_L − G}) W, so over a segment of chunks S_out = P S_in + H, where H is the
// walk of the segment from S_in = 0 and P its walk from S_in = I with Ũ = 0 (K' more columns). With
// SUM, blockIdx.z is segment z of p.seglen chunks, the first ⌈V'/64⌉ blocks in x walk V's columns
// from 0 and the rest the identity's, and only where they end is stored (sums: H in columns 0..V',
// P in V'..V' + K'); dr_walk_join chains the segments; the walk proper (seglen > 0) then runs every
// segment at once from its entering state. Where one walk leaves most multiprocessors idle (B·H·V
// small against the GPU) this trades 3x the walk's products for a walk of 1/nseg of the chunks.
#define DR_WW 4
#define DR_WV (16 * DR_WW)

// The bf16 walks' Ũ tile of a chunk (rows row0.., columns v0..v0 + DR_WV of the scratch U, zeros
// past V') into Us [64][lu] where `load_u`, and its G into Gs [64], by 16-byte asynchronous copies
// from NT threads. The caller commits and waits.
template <int NT>
__device__ __forceinline__ void dr_walk_ug(u16* Us, int lu, float* Gs, const u16* U, const DrParams& p, long long row0,
                                           int v0, bool load_u) {
    if (load_u)
        for (int i = threadIdx.x; i < DR_L * (DR_WV / 8); i += NT) {
            const int r = i / (DR_WV / 8), cc = i % (DR_WV / 8) * 8;
            const bool ok = v0 + cc < p.Vp;
            cp_async16(Us + r * lu + cc, ok ? U + (row0 + r) * p.Vp + v0 + cc : U, ok);
        }
    if (threadIdx.x < DR_L / 4) cp_async16(Gs + 4 * threadIdx.x, p.gc + row0 + 4 * threadIdx.x, true);
}

template <int KP>
struct DrWalkTc {
    static constexpr int LK = KP + 8, LU = DR_WV + 8, LS = 24;
    static constexpr int TK = DR_L * LK * 2;  // W or K [64][K']
    static constexpr int TU = DR_L * LU * 2;  // Ũ [64][DR_WV]
    static constexpr int SET = 2 * TK + TU + DR_L * 4;
    static constexpr int STG = KP * LS * 2;  // per warp: S [K'][16]
    static constexpr int bytes = 2 * SET + DR_WW * STG;
    static constexpr int sum_bytes = 2 * SET;  // SUM stores nothing per chunk: no staging
};

template <int KP, bool SUM>
__device__ __forceinline__ void dr_walk_tc(const DrParams& p) {
    typedef DrWalkTc<KP> Lw;
    constexpr int NTW = 32 * DR_WW, LK = Lw::LK, LU = Lw::LU, LS = Lw::LS;
    DR_SMEM_DECL
    dr_need_smem(SUM ? Lw::sum_bytes : Lw::bytes);
    auto Wb = [&](int i) { return (u16*)(smem + i * Lw::SET); };
    auto Kb = [&](int i) { return (u16*)(smem + i * Lw::SET + Lw::TK); };
    auto Ub = [&](int i) { return (u16*)(smem + i * Lw::SET + 2 * Lw::TK); };
    auto Gb = [&](int i) { return (float*)(smem + i * Lw::SET + 2 * Lw::TK + Lw::TU); };
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, j8 = lane & 7,
              m4 = lane >> 3;
    u16* Sst = (u16*)(smem + 2 * Lw::SET + warp * Lw::STG);
    const DrBlock k = dr_block(p);
    // This launch's chunks, state in and state out.
    int c0 = p.c0, c1 = p.c1;
    const float* init = SUM ? nullptr : p.init;
    float* fin = SUM ? nullptr : p.fin;
    const int z = blockIdx.z;
    if (p.seglen > 0) {
        c0 = p.c0 + z * p.seglen;
        c1 = min(c0 + p.seglen, p.c1);
        if (!SUM) init = p.entry + (long long)z * p.B * p.H * p.K * p.V;
        if (!SUM && z + 1 < (int)gridDim.z) fin = nullptr;
    }
    // With SUM, blocks past V' walk the identity's columns (Ũ = 0).
    const int nvb = (p.Vp + DR_WV - 1) / DR_WV;
    const bool ident = SUM && (int)blockIdx.x >= nvb;
    const int v0 = (ident ? (int)blockIdx.x - nvb : (int)blockIdx.x) * DR_WV, vw = v0 + 16 * warp;
    const bool act = vw < (ident ? KP : p.Vp);
    u16* states = (u16*)p.states;
    const u16* W = (const u16*)p.w;
    u16* U = (u16*)p.u;
    auto issue = [&](int c, int bi) {
        const long long row0 = (long long)k.bh * p.Tp + c * DR_L;
        dr_scr<DR_L, KP, NTW>(Wb(bi), LK, W, row0, KP, 0);
        dr_in<KP, NTW>(Kb(bi), LK, (const u16*)p.k, p.K, 0, p, k, c * DR_L, p.vk);
        dr_walk_ug<NTW>(Ub(bi), LU, Gb(bi), U, p, row0, v0, !ident);
        cp_async_commit();
    };
    // s[n][·]: Sᵀ rows vw + g (0, 1) and vw + g + 8 (2, 3), columns 8n + 2t + {0, 1}.
    float s[KP / 8][4];
#pragma unroll
    for (int n = 0; n < KP / 8; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int kd = n * 8 + 2 * t + (r & 1), vc = vw + g + (r >> 1) * 8;
            s[n][r] = ident                                                  ? (float)(kd == vc)
                      : act && init && kd < p.K && vc < p.V ? init[((long long)k.bh * p.K + kd) * p.V + vc]
                                                              : 0.f;
        }
    issue(c0, 0);
    for (int c = c0; c < c1; ++c) {
        const int cur = (c - c0) & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (c + 1 < c1) issue(c + 1, cur ^ 1);
        if (!act) continue;
        const long long row0 = (long long)k.bh * p.Tp + c * DR_L;
        const long long sbase = ((long long)k.bh * p.nch + c) * KP;
        // Sᵀ as bf16 A fragments (k-steps of 16 columns of K); S out to `states`.
        u32 sa[KP / 16][4];
#pragma unroll
        for (int kk = 0; kk < KP / 16; ++kk) {
            sa[kk][0] = dr_bf2(s[2 * kk][0], s[2 * kk][1]);
            sa[kk][1] = dr_bf2(s[2 * kk][2], s[2 * kk][3]);
            sa[kk][2] = dr_bf2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            sa[kk][3] = dr_bf2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            if (!SUM) stsm_x4_t(Sst + (kk * 16 + (m4 >> 1) * 8 + j8) * LS + (m4 & 1) * 8, sa[kk]);
        }
        if (!SUM) {
            __syncwarp();
            for (int i = lane; i < KP * 2; i += 32) {
                const int r = i >> 1, h = i & 1;
                *(uint4*)(states + (sbase + r) * p.Vp + vw + h * 8) = *(const uint4*)(Sst + r * LS + h * 8);
            }
        }
        // Uᵀ = Ũᵀ − Sᵀ Wᵀ: u[n] holds rows vw + g (+ 8), chunk positions 8n + 2t + {0, 1}.
        float u[8][4];
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) u[n][r] = 0.f;
        const u16* Ws = Wb(cur);
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int k2 = 0; k2 < KP / 32; ++k2) {
                u32 b[4];
                ldsm_x4(b, Ws + (n * 8 + j8) * LK + k2 * 32 + m4 * 8);
                mma_bf16_16816(u[n], sa[2 * k2], b[0], b[1]);
                mma_bf16_16816(u[n], sa[2 * k2 + 1], b[2], b[3]);
            }
        // This warp's columns of Ũ, then of U (no other warp reads them; the tile is next written
        // by the copies issued after the next chunk's barrier).
        u16* Us = Ub(cur) + 16 * warp;
#pragma unroll
        for (int n2 = 0; n2 < 4; ++n2) {
            u32 r[4] = {0u, 0u, 0u, 0u};
            u16* at = Us + (n2 * 16 + (m4 >> 1) * 8 + j8) * LU + (m4 & 1) * 8;
            if (!ident) ldsm_x4_t(r, at);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float* x = u[2 * n2 + (i >> 1)] + 2 * (i & 1);
                x[0] = dr_lo(r[i]) - x[0];
                x[1] = dr_hi(r[i]) - x[1];
            }
            if (!SUM) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float* x = u[2 * n2 + (i >> 1)] + 2 * (i & 1);
                    r[i] = dr_bf2(x[0], x[1]);
                }
                stsm_x4_t(at, r);
            }
        }
        if (!SUM) {
            __syncwarp();
            for (int i = lane; i < DR_L * 2; i += 32) {
                const int r = i >> 1, h = i & 1;
                *(uint4*)(U + (row0 + r) * p.Vp + vw + h * 8) = *(const uint4*)(Us + r * LU + h * 8);
            }
        }
        // Sᵀ ← γ_L Sᵀ + (diag(e^{G_L − G}) U)ᵀ K.
        const float* sG = Gb(cur);
        const float gl = sG[DR_L - 1];
        u32 ua[4][4];
        dr_decayed_a(ua, &u[0][0], sG, gl, t);
        const float egl = __expf(gl);
#pragma unroll
        for (int n = 0; n < KP / 8; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) s[n][r] *= egl;
        const u16* Ks = Kb(cur);
#pragma unroll
        for (int n2 = 0; n2 < KP / 16; ++n2)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                u32 b[4];
                ldsm_x4_t(b, Ks + (kk * 16 + (m4 & 1) * 8 + j8) * LK + n2 * 16 + (m4 >> 1) * 8);
                mma_bf16_16816(s[2 * n2], ua[kk], b[0], b[1]);
                mma_bf16_16816(s[2 * n2 + 1], ua[kk], b[2], b[3]);
            }
    }
    if (SUM && act) {
        const int ld = p.Vp + KP, col0 = ident ? p.Vp : 0;
        float* out = p.sums + ((long long)z * p.B * p.H + k.bh) * KP * ld;
#pragma unroll
        for (int n = 0; n < KP / 8; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int kd = n * 8 + 2 * t + (r & 1), vc = vw + g + (r >> 1) * 8;
                out[(long long)kd * ld + col0 + vc] = s[n][r];
            }
    }
    if (act && fin) {
#pragma unroll
        for (int n = 0; n < KP / 8; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int kd = n * 8 + 2 * t + (r & 1), vc = vw + g + (r >> 1) * 8;
                if (kd < p.K && vc < p.V) fin[((long long)k.bh * p.K + kd) * p.V + vc] = s[n][r];
            }
    }
}

// ---- dr_walk_join: the states entering the parallel walk's segments ----
// Per (b, h, DR_JC columns of V), the segments in order: E_0 = init (0 when null), E_{z+1} =
// P_z E_z + H_z (P_z, H_z from sums, see dr_walk_tc), in f32 with sums over K in order; E_0 ..
// E_{nseg−1} out to entry. The identity's walk of padded rows (K ≤ k < K') is never read: E is 0
// there. A thread per two outputs (K'·DR_JC / 2 threads: 1024 at K' = 128), so that the chain of
// sums has warps enough to hide its latency; P_{z+1} loads while step z computes.
#define DR_JC 16
template <int KP>
struct DrJoin {
    static constexpr int LP = KP + 1, NT = KP * DR_JC / 2;
    static constexpr int bytes = (KP * LP + KP * DR_JC) * 4;  // P [K'][K' + 1], E [K'][DR_JC]
};

template <int KP>
__device__ __forceinline__ void dr_walk_join(const DrParams& p, int nseg) {
    typedef DrJoin<KP> Lj;
    constexpr int NT = Lj::NT, CG = DR_JC / 2;  // threads, pairs of columns a row
    constexpr int PER = KP * KP / NT;           // P's elements per thread
    DR_SMEM_DECL
    dr_need_smem(Lj::bytes);
    float* P = (float*)smem;
    float* E = P + KP * Lj::LP;
    const int bh = blockIdx.y, j0 = blockIdx.x * DR_JC, ld = p.Vp + KP, tid = threadIdx.x;
    const long long kv = (long long)p.K * p.V, bhkv = (long long)p.B * p.H * kv;
    // This thread's outputs: row r, columns c2, c2 + 1.
    const int r = tid / CG, c2 = 2 * (tid % CG);
    auto sums = [&](int z) { return p.sums + ((long long)z * p.B * p.H + bh) * KP * ld; };
    float pn[PER], hn[2];
    auto fetch = [&](int z) {
        // Element tid + j·NT of P is row tid / KP + j·(NT / KP), column tid % KP; H this thread's two.
        const float* S = sums(z);
        const float* src = S + (long long)(tid / KP) * ld + p.Vp + tid % KP;
        const int step = NT / KP * ld;
#pragma unroll
        for (int j = 0; j < PER; ++j) pn[j] = src[j * step];
#pragma unroll
        for (int o = 0; o < 2; ++o) hn[o] = j0 + c2 + o < p.Vp ? S[(long long)r * ld + j0 + c2 + o] : 0.f;
    };
    if (nseg > 1) fetch(0);
    float e[2];
#pragma unroll
    for (int o = 0; o < 2; ++o) {
        const int c = j0 + c2 + o;
        e[o] = p.init && r < p.K && c < p.V ? p.init[bh * kv + (long long)r * p.V + c] : 0.f;
        E[r * DR_JC + c2 + o] = e[o];
        if (r < p.K && c < p.V) p.entry[bh * kv + (long long)r * p.V + c] = e[o];
    }
    for (int z = 0; z + 1 < nseg; ++z) {
        float acc[2] = {hn[0], hn[1]};
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int i = tid + j * NT;
            P[(i / KP) * Lj::LP + i % KP] = pn[j];
        }
        __syncthreads();
        if (z + 2 < nseg) fetch(z + 1);
        const float* pr = P + r * Lj::LP;
#pragma unroll 4
        for (int kd = 0; kd < p.K; ++kd) {
            const float pk = pr[kd];
            const float2 x = *(const float2*)(E + kd * DR_JC + c2);
            acc[0] = fmaf(pk, x.x, acc[0]);
            acc[1] = fmaf(pk, x.y, acc[1]);
        }
        __syncthreads();
        float* out = p.entry + (z + 1) * bhkv + bh * kv;
#pragma unroll
        for (int o = 0; o < 2; ++o) {
            const int j = j0 + c2 + o;
            E[r * DR_JC + c2 + o] = r < p.K ? acc[o] : 0.f;
            if (r < p.K && j < p.V) out[(long long)r * p.V + j] = acc[o];
        }
    }
}

// The forward walk of an activation type: on tensor cores for bf16, dr_walk_fwd for f32.
template <typename E, int KP>
struct DrWalk {
    static __device__ __forceinline__ void run(const DrParams& p) { dr_walk_fwd<E, KP>(p); }
};
template <int KP>
struct DrWalk<u16, KP> {
    static __device__ __forceinline__ void run(const DrParams& p) { dr_walk_tc<KP, false>(p); }
};

// ---- dr_walk_wg: the bf16 forward walk by warpgroup wgmma (sm_90a) ----
// Per (b, h, DR_WV = 64 columns of V) one warpgroup (DR_WW = 4 warps) holds Sᵀ [64, K'] as wgmma
// accumulators, warp w the rows vw = v0 + 16w (the layout of dr_walk_tc's warps, per 64-column
// atom of K'). Per chunk two batches of m64n64k16 instead of 128 mma.sync per warp:
//   Uᵀ = Ũᵀ − Sᵀ Wᵀ : A = Sᵀ rounded to bf16 in registers, B = W from shared memory (K-major),
//   Sᵀ ← γ_L Sᵀ + (diag(e^{G_L − G}) U)ᵀ K : A = those rows of Uᵀ in registers, B = K (N-major).
// W and K are stored in 128-byte-swizzle atoms of [64 rows][64 columns] (K' ≥ 64), the layout the
// descriptors address; Ũ, G, the staging of S and U and every rounding are dr_walk_tc's; S is
// staged while the first product runs, S and U go out while the second does. Correct (the check
// rows) but slower than dr_walk_tc at B = 2, T = 16384, H = 6, K = V = 128 (BENCHMARKS.md), so
// dr_walk_tc stays the default.
#ifndef FOX_HOST_EMU
__device__ __forceinline__ u32 dr_saddr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DR_HAVE_WG 1
// d (+)= A · B, m64n64k16, bf16 operands, f32 sums: A this warp's 16 rows as an mma.sync A fragment,
// B by descriptor, K-major (TB = 0) or N-major (TB = 1).
template <int TB>
__device__ __forceinline__ void dr_wgmma(float (&d)[32], const u32 (&a)[4], unsigned long long db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
        "%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}
__device__ __forceinline__ void dr_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void dr_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void dr_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// cp.async's writes made visible to wgmma's reads (the async proxy).
__device__ __forceinline__ void dr_fence_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#endif
#else
#define DR_HAVE_WG 1
inline u32 dr_saddr(const void* p) { return (u32)((const unsigned char*)p - dyn_smem); }
template <int TB>
inline void dr_wgmma(float (&d)[32], const u32 (&a)[4], unsigned long long db, int acc) {
    mock_wgmma_n64(d, a, db, TB, acc);
}
inline void dr_wg_fence() {}
inline void dr_wg_commit() {}
inline void dr_wg_wait() {}
inline void dr_fence_async() {}
#endif

#ifdef DR_HAVE_WG
// Shared-memory descriptor of a 128-byte-swizzle operand at byte address `sa`: 8-row groups 1024
// bytes apart, `lbo` between 64-column atoms.
__device__ __forceinline__ unsigned long long dr_desc(u32 sa, u32 lbo) {
    return (unsigned long long)((sa >> 4) & 0x3fff) | (unsigned long long)((lbo >> 4) & 0x3fff) << 16 |
           (unsigned long long)(1024 >> 4) << 32 | 1ull << 62;
}
// Element offset of 16-byte piece c of row r in a [64][K'] tile of 64-column atoms (1024-aligned).
__device__ __forceinline__ int dr_atom(int r, int c) { return (c >> 3) * (DR_L * 64) + r * 64 + (((c & 7) ^ (r & 7)) << 3); }

template <int KP>
struct DrWalkWg {
    static constexpr int NA = KP / 64, TA = DR_L * 128;  // atoms of W and K, bytes of an atom
    static constexpr int LU = DR_WV + 8, LS = 24;
    static constexpr int TU = DR_L * LU * 2;  // Ũ [64][DR_WV]
    static constexpr int SET = (2 * NA * TA + TU + DR_L * 4 + 1023) / 1024 * 1024;
    static constexpr int STG = (KP + DR_L) * LS * 2;  // per warp: S [K'][16], U [64][16]
    static constexpr int bytes = 1024 + 2 * SET + DR_WW * STG;  // 1024: room to align the sets
};

template <int KP>
__device__ __forceinline__ void dr_walk_wg(const DrParams& p) {
    typedef DrWalkWg<KP> Lw;
    constexpr int NA = Lw::NA, LU = Lw::LU, LS = Lw::LS, NTW = 32 * DR_WW;
    DR_SMEM_DECL
    dr_need_smem(Lw::bytes);
    unsigned char* base = smem + ((1024 - (dr_saddr(smem) & 1023)) & 1023);
    auto Wb = [&](int i) { return (u16*)(base + i * Lw::SET); };
    auto Kb = [&](int i) { return (u16*)(base + i * Lw::SET + NA * Lw::TA); };
    auto Ub = [&](int i) { return (u16*)(base + i * Lw::SET + 2 * NA * Lw::TA); };
    auto Gb = [&](int i) { return (float*)(base + i * Lw::SET + 2 * NA * Lw::TA + Lw::TU); };
    // The warp index through a shuffle, so that the compiler knows it is uniform across the warp.
    const int warp = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 5, 0), lane = threadIdx.x & 31, g = lane >> 2,
              t = lane & 3, j8 = lane & 7, m4 = lane >> 3;
    // This warp's staging tiles: S [K'][LS], then U [64][LS].
    u16* Sst = (u16*)(base + 2 * Lw::SET + warp * Lw::STG);
    u16* Ust = Sst + KP * LS;
    const DrBlock k = dr_block(p);
    const int v0 = blockIdx.x * DR_WV, vw = v0 + 16 * warp;
    const bool act = vw < p.Vp;  // the warps past V' compute on zeros and store nothing
    u16* states = (u16*)p.states;
    const u16* W = (const u16*)p.w;
    const u16* Kx = (const u16*)p.k;
    u16* U = (u16*)p.u;
    auto issue = [&](int c, int bi) {
        const long long row0 = (long long)k.bh * p.Tp + c * DR_L;
        u16* ws = Wb(bi);
        u16* ks = Kb(bi);
        for (int i = threadIdx.x; i < DR_L * (KP / 8); i += NTW) {
            const int r = i / (KP / 8), cc = i % (KP / 8);
            cp_async16(ws + dr_atom(r, cc), W + (row0 + r) * KP + cc * 8, true);
        }
        if (p.vk) {
            for (int i = threadIdx.x; i < DR_L * (KP / 8); i += NTW) {
                const int r = i / (KP / 8), cc = i % (KP / 8), tt = c * DR_L + r;
                const bool ok = tt >= k.lo && tt < k.hi && cc * 8 < p.K;
                cp_async16(ks + dr_atom(r, cc), ok ? Kx + (((long long)k.b * p.T + tt) * p.H + k.h) * p.K + cc * 8 : Kx,
                           ok);
            }
        } else {
            for (int i = threadIdx.x; i < DR_L * KP; i += NTW) {
                const int r = i / KP, col = i % KP, tt = c * DR_L + r;
                const bool ok = tt >= k.lo && tt < k.hi && col < p.K;
                st(ks, dr_atom(r, col >> 3) + (col & 7),
                   ok ? ld(Kx, (((long long)k.b * p.T + tt) * p.H + k.h) * p.K + col) : 0.f);
            }
        }
        dr_walk_ug<NTW>(Ub(bi), LU, Gb(bi), U, p, row0, v0, true);
        cp_async_commit();
    };
    // s[a][4n + r]: Sᵀ rows vw + g (r = 0, 1) and vw + g + 8 (r = 2, 3), columns 64a + 8n + 2t + (r & 1).
    float s[NA][32];
#pragma unroll
    for (int a = 0; a < NA; ++a)
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int kd = 64 * a + 8 * (i >> 2) + 2 * t + (i & 1), vc = vw + g + ((i >> 1) & 1) * 8;
            s[a][i] = act && p.init && kd < p.K && vc < p.V ? p.init[((long long)k.bh * p.K + kd) * p.V + vc] : 0.f;
        }
    issue(p.c0, 0);
    for (int c = p.c0; c < p.c1; ++c) {
        const int cur = (c - p.c0) & 1;
        // The last chunk's products are done (they read the set that the next loads overwrite).
        dr_wg_wait();
        cp_async_wait<0>();
        dr_fence_async();
        __syncthreads();
        if (c + 1 < p.c1) issue(c + 1, cur ^ 1);
        // Sᵀ as bf16 A fragments (k-steps of 16 columns of K').
        u32 sa[KP / 16][4];
#pragma unroll
        for (int kk = 0; kk < KP / 16; ++kk) {
            const float* x = s[kk >> 2] + 8 * (kk & 3);
            sa[kk][0] = dr_bf2(x[0], x[1]);
            sa[kk][1] = dr_bf2(x[2], x[3]);
            sa[kk][2] = dr_bf2(x[4], x[5]);
            sa[kk][3] = dr_bf2(x[6], x[7]);
        }
        // Uᵀ = Ũᵀ − Sᵀ Wᵀ: u[4n + r] holds rows vw + g (+ 8), chunk positions 8n + 2t + (r & 1).
        float u[32];
        const u32 w_s = dr_saddr(Wb(cur));
        dr_wg_fence();
#pragma unroll
        for (int kk = 0; kk < KP / 16; ++kk)
            dr_wgmma<0>(u, sa[kk], dr_desc(w_s + (kk >> 2) * Lw::TA + (kk & 3) * 32, 16), kk > 0);
        dr_wg_commit();
        // S staged meanwhile.
#pragma unroll
        for (int kk = 0; kk < KP / 16; ++kk) stsm_x4_t(Sst + (kk * 16 + (m4 >> 1) * 8 + j8) * LS + (m4 & 1) * 8, sa[kk]);
        dr_wg_wait();
        const u16* Us = Ub(cur);
#pragma unroll
        for (int n2 = 0; n2 < 4; ++n2) {
            u32 r[4];
            ldsm_x4_t(r, Us + (n2 * 16 + (m4 >> 1) * 8 + j8) * LU + 16 * warp + (m4 & 1) * 8);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float* x = u + 4 * (2 * n2 + (i >> 1)) + 2 * (i & 1);
                x[0] = dr_lo(r[i]) - x[0];
                x[1] = dr_hi(r[i]) - x[1];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float* x = u + 4 * (2 * n2 + (i >> 1)) + 2 * (i & 1);
                r[i] = dr_bf2(x[0], x[1]);
            }
            stsm_x4_t(Ust + (n2 * 16 + (m4 >> 1) * 8 + j8) * LS + (m4 & 1) * 8, r);
        }
        // Sᵀ ← γ_L Sᵀ + (diag(e^{G_L − G}) U)ᵀ K.
        const float* sG = Gb(cur);
        const float gl = sG[DR_L - 1];
        u32 ua[4][4];
        dr_decayed_a(ua, u, sG, gl, t);
        const float egl = __expf(gl);
#pragma unroll
        for (int a = 0; a < NA; ++a)
#pragma unroll
            for (int i = 0; i < 32; ++i) s[a][i] *= egl;
        const u32 k_s = dr_saddr(Kb(cur));
        dr_wg_fence();
#pragma unroll
        for (int a = 0; a < NA; ++a)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) dr_wgmma<1>(s[a], ua[kk], dr_desc(k_s + a * Lw::TA + kk * 2048, Lw::TA), 1);
        dr_wg_commit();
        // The staged S (entering chunk c) and U out to the scratch while the product runs.
        __syncwarp();
        const long long row0 = (long long)k.bh * p.Tp + c * DR_L;
        const long long sbase = ((long long)k.bh * p.nch + c) * KP;
        for (int i = lane; i < (KP + DR_L) * 2; i += 32) {
            const int r = (i >> 1) % (KP + DR_L), h = i & 1;
            const int vc = vw + h * 8;
            if (vc >= p.Vp) continue;
            const uint4 x = *(const uint4*)(Sst + r * LS + h * 8);
            if (r < KP)
                *(uint4*)(states + (sbase + r) * p.Vp + vc) = x;
            else
                *(uint4*)(U + (row0 + r - KP) * p.Vp + vc) = x;
        }
    }
    dr_wg_wait();
    if (act && p.fin) {
#pragma unroll
        for (int a = 0; a < NA; ++a)
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const int kd = 64 * a + 8 * (i >> 2) + 2 * t + (i & 1), vc = vw + g + ((i >> 1) & 1) * 8;
                if (kd < p.K && vc < p.V) p.fin[((long long)k.bh * p.K + kd) * p.V + vc] = s[a][i];
            }
    }
}
#endif

// M = D ∘ Q Kᵀ (j ≤ i) into Ms (E) from Qs, Ks and G in sG. The caller has waited for them.
template <typename E, int KP>
__device__ __forceinline__ void dr_m_of(const E* Qs, const E* Ks, E* Ms, const float* sG) {
    typedef DrLayout<E, KP> Lay;
    DrAcc<DR_L, DR_L> m;
    m.template product<false, true>(Qs, Lay::LK, Ks, Lay::LK, KP);
#pragma unroll
    for (int i = 0; i < m.TPW; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int ii = m.row(i, r), j = m.col(i, r);
            st(Ms, ii * Lay::LL + j, j <= ii ? __expf(sG[ii] - sG[j]) * m.c[i][r] : 0.f);
        }
}

// M = D ∘ Q Kᵀ (j ≤ i) of chunk c into Ms (E), with Q and K loaded into Qs, Ks and G into sG.
template <typename E, int KP>
__device__ __forceinline__ void dr_chunk_m(const DrParams& p, const DrBlock& k, int t0, E* Qs, E* Ks, E* Ms, float* sG) {
    typedef DrLayout<E, KP> Lay;
    dr_in<KP>(Qs, Lay::LK, (const E*)p.q, p.K, 0, p, k, t0, p.vk);
    dr_in<KP>(Ks, Lay::LK, (const E*)p.k, p.K, 0, p, k, t0, p.vk);
    cp_async_commit();
    if (threadIdx.x < DR_L) sG[threadIdx.x] = p.gc[(long long)k.bh * p.Tp + t0 + threadIdx.x];
    cp_async_wait<0>();
    __syncthreads();
    dr_m_of<E, KP>(Qs, Ks, Ms, sG);
}

// ---- dr_out: O = scale (diag(γ) Q S_0 + M U) per chunk ----
// Q and K, then S and U block by block of V (two sets: the next block loads while this one computes).
template <typename E, int KP>
__device__ __forceinline__ void dr_out(const DrParams& p) {
    typedef DrLayout<E, KP> Lay;
    DR_SMEM_DECL
    dr_need_smem(Lay::out);
    E* Qs = (E*)smem;
    E* Ks = (E*)(smem + Lay::TK);
    E* Ms = (E*)(smem + 2 * Lay::TK);
    unsigned char* sets = smem + 2 * Lay::TK + Lay::TL;
    auto Sb = [&](int i) { return (E*)(sets + i * (Lay::TS + Lay::TV)); };
    auto Ub = [&](int i) { return (E*)(sets + i * (Lay::TS + Lay::TV) + Lay::TS); };
    float* sG = (float*)(sets + 2 * (Lay::TS + Lay::TV));
    const DrBlock k = dr_block(p);
    const int c = p.c0 + blockIdx.x, t0 = c * DR_L;
    const long long row0 = (long long)k.bh * p.Tp + t0;
    const long long sbase = ((long long)k.bh * p.nch + c) * KP;
    auto issue = [&](int v0, int bi) {
        dr_scr<KP, DR_BV>(Sb(bi), Lay::LV, (const E*)p.states, sbase, p.Vp, v0);
        dr_scr<DR_L, DR_BV>(Ub(bi), Lay::LV, (const E*)p.u, row0, p.Vp, v0);
        cp_async_commit();
    };
    dr_in<KP>(Qs, Lay::LK, (const E*)p.q, p.K, 0, p, k, t0, p.vk);
    dr_in<KP>(Ks, Lay::LK, (const E*)p.k, p.K, 0, p, k, t0, p.vk);
    cp_async_commit();
    issue(0, 0);
    if (threadIdx.x < DR_L) sG[threadIdx.x] = p.gc[row0 + threadIdx.x];
    cp_async_wait<1>();
    __syncthreads();
    dr_m_of<E, KP>(Qs, Ks, Ms, sG);
    E* O = (E*)p.o;
    for (int v0 = 0, it = 0; v0 < p.Vp; v0 += DR_BV, ++it) {
        const int cur = it & 1;
        cp_async_prefetch(v0 + DR_BV < p.Vp, [&] { issue(v0 + DR_BV, cur ^ 1); });
        __syncthreads();
        DrAcc<DR_L, DR_BV> o;
        o.template product<false, false>(Qs, Lay::LK, Sb(cur), Lay::LV, KP);
#pragma unroll
        for (int i = 0; i < o.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) o.c[i][r] *= __expf(sG[o.row(i, r)]);
        o.template mma<false, false>(Ms, Lay::LL, Ub(cur), Lay::LV, DR_L);
#pragma unroll
        for (int i = 0; i < o.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int t = t0 + o.row(i, r), col = v0 + o.col(i, r);
                if (t < p.T && col < p.V)
                    st(O, (((long long)k.b * p.T + t) * p.H + k.h) * p.V + col, t >= k.lo ? p.scale * o.c[i][r] : 0.f);
            }
        __syncthreads();
    }
}

// ---- dr_dvl: dU's state-free part, scale Mᵀ dO, per chunk (f32 into du) ----
template <typename E, int KP>
__device__ __forceinline__ void dr_dvl(const DrParams& p) {
    typedef DrLayout<E, KP> Lay;
    DR_SMEM_DECL
    dr_need_smem(Lay::dvl);
    E* Qs = (E*)smem;
    E* Ks = (E*)(smem + Lay::TK);
    E* Ms = (E*)(smem + 2 * Lay::TK);
    E* Os = (E*)(smem + 2 * Lay::TK + Lay::TL + Lay::TS);
    float* sG = (float*)(smem + 2 * Lay::TK + Lay::TL + Lay::TS + Lay::TV);
    const DrBlock k = dr_block(p);
    const int c = p.c0 + blockIdx.x, t0 = c * DR_L;
    dr_chunk_m<E, KP>(p, k, t0, Qs, Ks, Ms, sG);
    const long long row0 = (long long)k.bh * p.Tp + t0;
    for (int v0 = 0; v0 < p.Vp; v0 += DR_BV) {
        dr_in<DR_BV>(Os, Lay::LV, (const E*)p.dout, p.V, v0, p, k, t0, p.vv);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        DrAcc<DR_L, DR_BV> d;
        d.template product<true, false>(Ms, Lay::LL, Os, Lay::LV, DR_L);
#pragma unroll
        for (int i = 0; i < d.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) p.du[(row0 + d.row(i, r)) * p.Vp + v0 + d.col(i, r)] = p.scale * d.c[i][r];
        __syncthreads();
    }
}

// ---- dr_walk_bwd: per (b, h, 32 columns of V), the chunks in reverse ----
// dU = scale Mᵀ dO + diag(e^{G_L − G}) K dS_L; dS_0 = γ_L dS_L + Qᵀ diag(scale γ) dO − Wᵀ dU. With NB = 2
// the next chunk's tiles load while this one computes (NB = 1 where two sets of tiles do not fit).
template <typename E, int KP>
__device__ __forceinline__ void dr_walk_bwd(const DrParams& p) {
    typedef DrLayout<E, KP> Lay;
    constexpr int NB = Lay::NB_BWD;
    DR_SMEM_DECL
    dr_need_smem(Lay::walk_bwd);
    // NB sets of K, Q, W, dO, du and G tiles (set i at smem + i·WB_SET).
    constexpr int SET = Lay::WB_SET;
    auto Kb = [&](int i) { return (E*)(smem + i * SET); };
    auto Qb = [&](int i) { return (E*)(smem + i * SET + Lay::TK); };
    auto Wb = [&](int i) { return (E*)(smem + i * SET + 2 * Lay::TK); };
    auto Ob = [&](int i) { return (E*)(smem + i * SET + 3 * Lay::TK); };
    auto Db = [&](int i) { return (float*)(smem + i * SET + 3 * Lay::TK + Lay::TV); };
    auto Gb = [&](int i) { return (float*)(smem + i * SET + 3 * Lay::TK + Lay::TV + Lay::DV); };
    unsigned char* rest = smem + NB * Lay::WB_SET;
    E* dSs = (E*)rest;
    E* dUn = (E*)(rest + Lay::TS);
    E* dOt = (E*)(rest + Lay::TS + Lay::TV);
    const DrBlock k = dr_block(p);
    const int v0 = blockIdx.x * DR_BV, tid = threadIdx.x;
    E* dstates = (E*)p.dstates;
    const E* W = (const E*)p.w;
    auto issue = [&](int c, int bi) {
        const long long row0 = (long long)k.bh * p.Tp + c * DR_L;
        dr_in<KP>(Kb(bi), Lay::LK, (const E*)p.k, p.K, 0, p, k, c * DR_L, p.vk);
        dr_in<KP>(Qb(bi), Lay::LK, (const E*)p.q, p.K, 0, p, k, c * DR_L, p.vk);
        dr_scr<DR_L, KP>(Wb(bi), Lay::LK, W, row0, KP, 0);
        dr_in<DR_BV>(Ob(bi), Lay::LV, (const E*)p.dout, p.V, v0, p, k, c * DR_L, p.vv);
        dr_scr<DR_L, DR_BV>(Db(bi), Lay::LVF, (const float*)p.du, row0, p.Vp, v0);
        if (threadIdx.x < DR_L / 4) cp_async16(Gb(bi) + 4 * threadIdx.x, p.gc + row0 + 4 * threadIdx.x, true);
        cp_async_commit();
    };
    DrAcc<KP, DR_BV> dS;
    dS.load_state(p, p.dfin, k.bh, v0);
    issue(p.nch - 1, 0);
    for (int j = 0; j < p.nch; ++j) {
        const int c = p.nch - 1 - j, cur = NB == 2 ? (j & 1) : 0;
        if (NB == 2 && c > 0) {
            issue(c - 1, cur ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        const long long row0 = (long long)k.bh * p.Tp + c * DR_L;
        const long long sbase = ((long long)k.bh * p.nch + c) * KP;
        dS.store_state(dSs, Lay::LV, dstates, sbase, p.Vp, v0);
        __syncthreads();
        const float* sG = Gb(cur);
        const float gl = sG[DR_L - 1];
        DrAcc<DR_L, DR_BV> du;
        du.template product<false, false>(Kb(cur), Lay::LK, dSs, Lay::LV, KP);
#pragma unroll
        for (int i = 0; i < du.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int row = du.row(i, r), col = du.col(i, r);
                const float val = Db(cur)[row * Lay::LVF + col] + __expf(gl - sG[row]) * du.c[i][r];
                p.du[(row0 + row) * p.Vp + v0 + col] = val;
                st(dUn, row * Lay::LV + col, -val);
            }
        for (int i = tid; i < DR_L * DR_BV; i += DR_NT) {
            const int r = i / DR_BV, cc = i % DR_BV;
            st(dOt, r * Lay::LV + cc, ld(Ob(cur), r * Lay::LV + cc) * p.scale * __expf(sG[r]));
        }
        __syncthreads();
        const float egl = __expf(gl);
        dS.scale(egl);
        dS.template mma<true, false>(Qb(cur), Lay::LK, dOt, Lay::LV, DR_L);
        dS.template mma<true, false>(Wb(cur), Lay::LK, dUn, Lay::LV, DR_L);
        __syncthreads();
        if (NB == 1 && c > 0) issue(c - 1, 0);
    }
    dS.save_state(p, p.dinit, k.bh, v0);
}

// ---- dr_grads: every input's gradient of chunk c ----
// From U = T R, R = diag(β)(V − diag(γ) K S_0): dR = Tᵀ dU, dV = diag(β) dR, dA = −dR Uᵀ (j < i);
// from O: dQ = scale diag(γ) dO S_0ᵀ + dMD K, dK += dMDᵀ Q with dMD = scale (dO Uᵀ) ∘ D; from S_L:
// dK += diag(e^{G_L − G}) U dS_Lᵀ; from A: dK += (dKK + dKKᵀ) K with dKK = dA ∘ β_i D ∘ (j < i);
// dβ and dG from each, dg the reverse prefix sum of dG.
template <typename E, int KP>
__device__ __forceinline__ void dr_grads(const DrParams& p) {
    typedef DrLayout<E, KP> Lay;
    constexpr int LK = Lay::LK, LL = Lay::LL, LV = Lay::LV;
    DR_SMEM_DECL
    dr_need_smem(Lay::grads);
    E* Qs = (E*)smem;
    E* Ks = (E*)(smem + Lay::TK);
    E* Te = (E*)(smem + 2 * Lay::TK);
    unsigned char* rb = smem + 2 * Lay::TK + Lay::TL;
    // Per block of V.
    E* Ss = (E*)rb;
    E* dSs = (E*)(rb + Lay::TS);
    E* Us = (E*)(rb + 2 * Lay::TS);
    E* Ut = (E*)(rb + 2 * Lay::TS + Lay::TV);
    E* dOs = (E*)(rb + 2 * Lay::TS + 2 * Lay::TV);
    E* dUs = (E*)(rb + 2 * Lay::TS + 3 * Lay::TV);
    E* dRs = (E*)(rb + 2 * Lay::TS + 4 * Lay::TV);
    E* dRn = (E*)(rb + 2 * Lay::TS + 5 * Lay::TV);
    E* Vs = (E*)(rb + 2 * Lay::TS + 6 * Lay::TV);
    float* Df = (float*)(rb + 2 * Lay::TS + 7 * Lay::TV);
    // After the blocks of V, in the same space.
    float* F1 = (float*)rb;
    float* F2 = F1 + DR_L * 65;
    float* F3 = F2 + DR_L * 65;
    E* dMDs = (E*)(rb + 3 * Lay::F65);
    E* Zs = (E*)(rb + 3 * Lay::F65 + Lay::TL);
    float* sb = (float*)(rb + Lay::grads_b);
    float* sG = sb + DR_L;
    float* sdG = sG + DR_L;
    float* sdb = sdG + DR_L;
    float* stmp = sdb + DR_L;
    float* part = stmp + DR_L;
    float* red = part + DR_NW * DR_L;
    float* sX = red + DR_NT;

    const DrBlock k = dr_block(p);
    const int c = p.c0 + blockIdx.x, t0 = c * DR_L, tid = threadIdx.x;
    const long long row0 = (long long)k.bh * p.Tp + t0;
    const long long sbase = ((long long)k.bh * p.nch + c) * KP;
    dr_in<KP>(Qs, LK, (const E*)p.q, p.K, 0, p, k, t0, p.vk);
    dr_in<KP>(Ks, LK, (const E*)p.k, p.K, 0, p, k, t0, p.vk);
    dr_scr<DR_L, DR_L>(Te, LL, (const E*)p.tm, ((long long)k.bh * p.nch + c) * DR_L, DR_L, 0);
    cp_async_commit();
    if (tid < DR_L) {
        const int t = t0 + tid;
        const bool ok = t >= k.lo && t < k.hi;
        sb[tid] = ok ? ld((const E*)p.beta, ((long long)k.b * p.T + t) * p.H + k.h) : 0.f;
        sG[tid] = p.gc[row0 + tid];
        sdG[tid] = 0.f;
        sdb[tid] = 0.f;
    }
    if (tid == 0) sX[0] = 0.f;
    const float gl = p.gc[row0 + DR_L - 1], egl = __expf(gl);
    DrAcc<DR_L, DR_L> dM, dA;
    DrAcc<DR_L, KP> dQ, dK;
    dM.zero();
    dA.zero();
    dQ.zero();
    dK.zero();
    typedef DrAcc<DR_L, DR_BV> AV;
    for (int v0 = 0; v0 < p.Vp; v0 += DR_BV) {
        dr_scr<KP, DR_BV>(Ss, LV, (const E*)p.states, sbase, p.Vp, v0);
        dr_scr<KP, DR_BV>(dSs, LV, (const E*)p.dstates, sbase, p.Vp, v0);
        dr_scr<DR_L, DR_BV>(Us, LV, (const E*)p.u, row0, p.Vp, v0);
        dr_scr<DR_L, DR_BV>(Df, Lay::LVF, (const float*)p.du, row0, p.Vp, v0);
        dr_in<DR_BV>(dOs, LV, (const E*)p.dout, p.V, v0, p, k, t0, p.vv);
        dr_in<DR_BV>(Vs, LV, (const E*)p.v, p.V, v0, p, k, t0, p.vv);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        for (int i = tid; i < DR_L * DR_BV; i += DR_NT) {
            const int r = i / DR_BV, cc = i % DR_BV;
            st(dUs, r * LV + cc, Df[r * Lay::LVF + cc]);
            st(Ut, r * LV + cc, ld(Us, r * LV + cc) * __expf(gl - sG[r]));
        }
        __syncthreads();
        dM.template mma<false, true>(dOs, LV, Us, LV, DR_BV);
        dQ.template mma<false, true>(dOs, LV, Ss, LV, DR_BV);
        float vals[AV::TPW][4], vals2[AV::TPW][4];
        {
            // dG_i += scale γ_i dO_i · (S_0ᵀ q_i)
            AV qs;
            qs.template product<false, false>(Qs, LK, Ss, LV, KP);
#pragma unroll
            for (int i = 0; i < AV::TPW; ++i)
#pragma unroll
                for (int r = 0; r < 4; ++r) vals[i][r] = ld(dOs, qs.row(i, r) * LV + qs.col(i, r)) * qs.c[i][r];
            dr_rowsum<DR_L, DR_BV>(vals, part, sdG, [&](int t) { return p.scale * __expf(sG[t]); });
        }
        {
            AV ks, dr;
            ks.template product<false, false>(Ks, LK, Ss, LV, KP);
            dr.template product<true, false>(Te, LL, dUs, LV, DR_L);
            E* dV = (E*)p.dv;
#pragma unroll
            for (int i = 0; i < AV::TPW; ++i)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int row = dr.row(i, r), col = dr.col(i, r), t = t0 + row, gcol = v0 + col;
                    const float d = dr.c[i][r], kv = ks.c[i][r], gam = __expf(sG[row]), be = sb[row];
                    const float vv = ld(Vs, row * LV + col);
                    if (t < p.T && gcol < p.V) st(dV, (((long long)k.b * p.T + t) * p.H + k.h) * p.V + gcol, be * d);
                    vals[i][r] = d * (vv - gam * kv);
                    vals2[i][r] = -be * gam * d * kv;
                    st(dRs, row * LV + col, -be * gam * d);
                    st(dRn, row * LV + col, -d);
                }
            dr_rowsum<DR_L, DR_BV>(vals, part, sdb, dr_one);
            dr_rowsum<DR_L, DR_BV>(vals2, part, sdG, dr_one);
        }
        {
            // dG_j −= e^{G_L − G_j} k_j·(dS_L u_j); dG_L += the same, and γ_L ⟨dS_L, S_0⟩.
            AV kds;
            kds.template product<false, false>(Ks, LK, dSs, LV, KP);
#pragma unroll
            for (int i = 0; i < AV::TPW; ++i)
#pragma unroll
                for (int r = 0; r < 4; ++r) vals[i][r] = -ld(Ut, kds.row(i, r) * LV + kds.col(i, r)) * kds.c[i][r];
            if (tid < DR_L) stmp[tid] = 0.f;
            dr_rowsum<DR_L, DR_BV>(vals, part, stmp, dr_one);
            float s = 0.f;
            for (int i = tid; i < KP * DR_BV; i += DR_NT) {
                const int r = i / DR_BV, cc = i % DR_BV;
                s += ld(Ss, r * LV + cc) * ld(dSs, r * LV + cc);
            }
            red[tid] = s;
            if (tid < DR_L) sdG[tid] += stmp[tid];
            __syncthreads();
            if (tid == 0) {
                float a = 0.f, e = 0.f;
                for (int i = 0; i < DR_NT; ++i) a += red[i];
                for (int i = 0; i < DR_L; ++i) e += stmp[i];
                sX[0] += egl * a - e;
            }
        }
        __syncthreads();
        dK.template mma<false, true>(dRs, LV, Ss, LV, DR_BV);
        dK.template mma<false, true>(Ut, LV, dSs, LV, DR_BV);
        dA.template mma<false, true>(dRn, LV, Us, LV, DR_BV);
        __syncthreads();
    }
    // The L x L terms, in the space of the blocks of V.
    {
        DrAcc<DR_L, DR_L> qk;
        qk.template product<false, true>(Qs, LK, Ks, LK, KP);
#pragma unroll
        for (int i = 0; i < qk.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int ii = qk.row(i, r), j = qk.col(i, r);
                const float d = j <= ii ? p.scale * dM.c[i][r] * __expf(sG[ii] - sG[j]) : 0.f;
                st(dMDs, ii * LL + j, d);
                F1[ii * 65 + j] = d * qk.c[i][r];
            }
    }
    {
        DrAcc<DR_L, DR_L> kk;
        kk.template product<false, true>(Ks, LK, Ks, LK, KP);
        float vb[DrAcc<DR_L, DR_L>::TPW][4];
#pragma unroll
        for (int i = 0; i < kk.TPW; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int ii = kk.row(i, r), j = kk.col(i, r);
                float f = 0.f, z = 0.f, gb = 0.f;
                if (j < ii) {
                    const float dec = __expf(sG[ii] - sG[j]), da = dA.c[i][r];
                    f = da * sb[ii] * dec * kk.c[i][r];
                    gb = da * dec * kk.c[i][r];
                    z = da * sb[ii] * dec;
                }
                F2[ii * 65 + j] = f;
                F3[ii * 65 + j] = z;
                vb[i][r] = gb;
            }
        dr_rowsum<DR_L, DR_L>(vb, part, sdb, dr_one);
    }
    if (tid < DR_L) {
        float s = 0.f;
        for (int j = 0; j < DR_L; ++j) s += F1[tid * 65 + j] + F2[tid * 65 + j] - F1[j * 65 + tid] - F2[j * 65 + tid];
        sdG[tid] += s;
    }
    for (int i = tid; i < DR_L * DR_L; i += DR_NT) {
        const int r = i / DR_L, cc = i % DR_L;
        st(Zs, r * LL + cc, F3[r * 65 + cc] + F3[cc * 65 + r]);
    }
#pragma unroll
    for (int i = 0; i < dQ.TPW; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) dQ.c[i][r] *= p.scale * __expf(sG[dQ.row(i, r)]);
    __syncthreads();
    dQ.template mma<false, false>(dMDs, LL, Ks, LK, DR_L);
    dK.template mma<false, false>(Zs, LL, Ks, LK, DR_L);
    dK.template mma<true, false>(dMDs, LL, Qs, LK, DR_L);
    E* dq = (E*)p.dq;
    E* dk = (E*)p.dk;
#pragma unroll
    for (int i = 0; i < dQ.TPW; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int t = t0 + dQ.row(i, r), col = dQ.col(i, r);
            if (t < p.T && col < p.K) {
                const long long o = (((long long)k.b * p.T + t) * p.H + k.h) * p.K + col;
                const bool real = t >= k.lo;
                st(dq, o, real ? dQ.c[i][r] : 0.f);
                st(dk, o, real ? dK.c[i][r] : 0.f);
            }
        }
    if (tid < DR_L) {
        const int t = t0 + tid;
        if (t < p.T) st((E*)p.dbeta, ((long long)k.b * p.T + t) * p.H + k.h, t >= k.lo ? sdb[tid] : 0.f);
    }
    if (tid == 0 && p.dg) {
        sdG[DR_L - 1] += sX[0];
        float acc = 0.f;
        for (int i = DR_L - 1; i >= 0; --i) {
            acc += sdG[i];
            const int t = t0 + i;
            if (t < p.T) p.dg[((long long)k.b * p.T + t) * p.H + k.h] = t >= k.lo ? acc : 0.f;
        }
    }
}

// ---- The decode step: one position per row, S [B, H, K, V] (p.fin) in place ----
// One thread per column v of S; a row padded at this position (start[b] > 0) keeps its state, o = 0.
template <typename E>
__device__ __forceinline__ void dr_decode(const DrParams& p) {
    __shared__ float sq[256], sk[256];
    const int bh = blockIdx.y, b = bh / p.H, vc = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = threadIdx.x; i < p.K; i += blockDim.x) {
        sq[i] = ld((const E*)p.q, (long long)bh * p.K + i);
        sk[i] = ld((const E*)p.k, (long long)bh * p.K + i);
    }
    __syncthreads();
    if (vc >= p.V) return;
    E* O = (E*)p.o;
    if (p.start && p.start[b] > 0) {
        st(O, (long long)bh * p.V + vc, 0.f);
        return;
    }
    float* S = p.fin + (long long)bh * p.K * p.V + vc;
    const float alpha = p.g ? __expf(p.g[bh]) : 1.f, beta = ld((const E*)p.beta, bh);
    float sk_ = 0.f;
    for (int kd = 0; kd < p.K; ++kd) sk_ += S[(long long)kd * p.V] * sk[kd];
    const float u = beta * (ld((const E*)p.v, (long long)bh * p.V + vc) - alpha * sk_);
    float o = 0.f;
    for (int kd = 0; kd < p.K; ++kd) {
        const float s = alpha * S[(long long)kd * p.V] + sk[kd] * u;
        S[(long long)kd * p.V] = s;
        o += sq[kd] * s;
    }
    st(O, (long long)bh * p.V + vc, p.scale * o);
}

// ---- The small ops ----

// y = x / √(Σ x² + 1e-6) per row of `dim` (fla's l2norm), 1/√(…) into rstd: one warp per row.
template <typename E>
__device__ __forceinline__ void dr_l2norm_fwd(E* y, float* rstd, const E* x, int rows, int dim) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const long long o = (long long)row * dim;
    float s = 0.f;
    for (int c = lane; c < dim; c += 32) {
        const float v = ld(x, o + c);
        s += v * v;
    }
    for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    const float r = 1.f / sqrtf(s + 1e-6f);
    if (lane == 0) rstd[row] = r;
    for (int c = lane; c < dim; c += 32) st(y, o + c, ld(x, o + c) * r);
}

// dx = rstd · (dy − y (y·dy)).
template <typename E>
__device__ __forceinline__ void dr_l2norm_bwd(E* dx, const E* dy, const E* y, const float* rstd, int rows, int dim) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const long long o = (long long)row * dim;
    float s = 0.f;
    for (int c = lane; c < dim; c += 32) s += ld(y, o + c) * ld(dy, o + c);
    for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    const float r = rstd[row];
    for (int c = lane; c < dim; c += 32) st(dx, o + c, r * (ld(dy, o + c) - ld(y, o + c) * s));
}


// g [rows, H] = −exp(A_log) · softplus(a + dt_bias): one thread per value.
template <typename E>
__device__ __forceinline__ void dr_decay_fwd(float* g, const E* a, const float* a_log, const float* bias, int rows, int H) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * H) return;
    const int h = (int)(i % H);
    g[i] = softplus_(ld(a, i) + bias[h]) * -expf(a_log[h]);
}

// da = dg · A · σ(a + dt_bias) (A = −exp(A_log)); the terms of dt_bias's gradient (da) and of
// A_log's (dg · softplus(a + dt_bias)) into tb and tl [rows, H], summed by dr_decay_reduce.
template <typename E>
__device__ __forceinline__ void dr_decay_bwd(E* da, float* tb, float* tl, const float* dg, const E* a, const float* a_log,
                                             const float* bias, int rows, int H) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * H) return;
    const int h = (int)(i % H);
    const float x = ld(a, i) + bias[h], d = dg[i];
    const float v = d * -expf(a_log[h]) * (x > 20.f ? 1.f : sigmoid_gate(x));
    st(da, i, v);
    tb[i] = v;
    tl[i] = d * softplus_(x);
}

// dt_bias[h] += Σ_r tb[r, h]; A_log[h] += A_h · Σ_r tl[r, h]: one block per head, each thread a
// strided run of rows in order, then a fixed tree.
__device__ __forceinline__ void dr_decay_reduce_impl(float* dbias, float* da_log, const float* tb, const float* tl,
                                                const float* a_log, int rows, int H) {
    __shared__ float s1[256], s2[256];
    const int h = blockIdx.x, tid = threadIdx.x;
    float x = 0.f, y = 0.f;
    for (int r = tid; r < rows; r += 256) {
        x += tb[(long long)r * H + h];
        y += tl[(long long)r * H + h];
    }
    s1[tid] = x;
    s2[tid] = y;
    __syncthreads();
    for (int m = 128; m > 0; m >>= 1) {
        if (tid < m) {
            s1[tid] += s1[tid + m];
            s2[tid] += s2[tid + m];
        }
        __syncthreads();
    }
    if (tid == 0) {
        dbias[h] += s1[0];
        da_log[h] += s2[0] * -expf(a_log[h]);
    }
}

// y = x · SiLU(gate); its backward: dx = dy · SiLU(gate), dgate = dy · x · σ(gate)(1 + gate(1 − σ(gate))).
template <typename E>
__device__ __forceinline__ void dr_swish_fwd(E* y, const E* x, const E* gate, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = ld(gate, i);
    st(y, i, ld(x, i) * (g * sigmoid_gate(g)));
}

template <typename E>
__device__ __forceinline__ void dr_swish_bwd(E* dx, E* dgate, const E* dy, const E* x, const E* gate, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = ld(gate, i), s = sigmoid_gate(g), d = ld(dy, i);
    st(dx, i, d * g * s);
    st(dgate, i, d * ld(x, i) * s * (1.f + g * (1.f - s)));
}

#define DR_CHUNK_KERNELS(NAME, E, KP)                                                                           \
    extern "C" __global__ void __launch_bounds__(DR_NT) dr_prep_k##KP##_##NAME(DrParams p, int keep_t) {       \
        dr_prep<E, KP>(p, keep_t);                                                                             \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(DR_NT) dr_walk_fwd_k##KP##_##NAME(DrParams p) {               \
        DrWalk<E, KP>::run(p);                                                                                 \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(DR_NT) dr_out_k##KP##_##NAME(DrParams p) { dr_out<E, KP>(p); } \
    extern "C" __global__ void __launch_bounds__(DR_NT) dr_dvl_k##KP##_##NAME(DrParams p) { dr_dvl<E, KP>(p); } \
    extern "C" __global__ void __launch_bounds__(DR_NT) dr_walk_bwd_k##KP##_##NAME(DrParams p) {               \
        dr_walk_bwd<E, KP>(p);                                                                                 \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(DR_NT, 1) dr_grads_k##KP##_##NAME(DrParams p) {               \
        dr_grads<E, KP>(p);                                                                                    \
    }

#define DR_KERNELS(NAME, E)                                                                                     \
    DR_CHUNK_KERNELS(NAME, E, 32)                                                                              \
    DR_CHUNK_KERNELS(NAME, E, 64)                                                                              \
    DR_CHUNK_KERNELS(NAME, E, 128)                                                                             \
    extern "C" __global__ void dr_decode_##NAME(DrParams p) { dr_decode<E>(p); }                              \
    extern "C" __global__ void dr_l2norm_fwd_##NAME(E* y, float* rstd, const E* x, int rows, int dim) {       \
        dr_l2norm_fwd<E>(y, rstd, x, rows, dim);                                                               \
    }                                                                                                          \
    extern "C" __global__ void dr_l2norm_bwd_##NAME(E* dx, const E* dy, const E* y, const float* rstd, int rows, \
                                                    int dim) {                                                 \
        dr_l2norm_bwd<E>(dx, dy, y, rstd, rows, dim);                                                          \
    }                                                                                                          \
    extern "C" __global__ void dr_decay_fwd_##NAME(float* g, const E* a, const float* a_log, const float* bias, \
                                                   int rows, int H) {                                          \
        dr_decay_fwd<E>(g, a, a_log, bias, rows, H);                                                           \
    }                                                                                                          \
    extern "C" __global__ void dr_decay_bwd_##NAME(E* da, float* tb, float* tl, const float* dg, const E* a,   \
                                                   const float* a_log, const float* bias, int rows, int H) {   \
        dr_decay_bwd<E>(da, tb, tl, dg, a, a_log, bias, rows, H);                                              \
    }                                                                                                          \
    extern "C" __global__ void dr_swish_fwd_##NAME(E* y, const E* x, const E* gate, long long n) {            \
        dr_swish_fwd<E>(y, x, gate, n);                                                                        \
    }                                                                                                          \
    extern "C" __global__ void dr_swish_bwd_##NAME(E* dx, E* dgate, const E* dy, const E* x, const E* gate,    \
                                                   long long n) {                                              \
        dr_swish_bwd<E>(dx, dgate, dy, x, gate, n);                                                            \
    }

DR_KERNELS(f32, float)
DR_KERNELS(bf16, u16)

// The parallel walk's segment sums (bf16) and their join (f32, any activation type).
#define DR_SCAN_KERNELS(KP)                                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * DR_WW) dr_walk_sum_k##KP##_bf16(DrParams p) {          \
        dr_walk_tc<KP, true>(p);                                                                               \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(DrJoin<KP>::NT) dr_walk_join_k##KP(DrParams p, int nseg) {   \
        dr_walk_join<KP>(p, nseg);                                                                             \
    }
DR_SCAN_KERNELS(32)
DR_SCAN_KERNELS(64)
DR_SCAN_KERNELS(128)

// The bf16 forward walk by wgmma (K' of 64 and 128; sm_90a).
#ifdef DR_HAVE_WG
extern "C" __global__ void __launch_bounds__(32 * DR_WW) dr_walk_wg_k64_bf16(DrParams p) { dr_walk_wg<64>(p); }
extern "C" __global__ void __launch_bounds__(32 * DR_WW) dr_walk_wg_k128_bf16(DrParams p) { dr_walk_wg<128>(p); }
#endif

extern "C" __global__ void dr_decay_reduce(float* dbias, float* da_log, const float* tb, const float* tl,
                                           const float* a_log, int rows, int H) {
    dr_decay_reduce_impl(dbias, da_log, tb, tl, a_log, rows, H);
}
