// Mamba-2's SSD and its companions on the GPU: the twins of crate::ssd, crate::conv1d and
// crate::rms_norm_gated (layouts as documented there). Activations (xbc, y, dy, dxbc, the conv's
// input and output, the norm's x, z, y and their gradients) are ET: this file is compiled twice
// (cuda/compile.rs), with ET = float and KN(name) = name_f32, then ET = u16 (bf16 bits, see
// elem.cuh) and KN(name) = name_bf16. Everything else (dt, A, D, states, statistics, the conv's
// state, every partial sum) is f32, and all arithmetic is f32. Deterministic: no atomics; every
// sum runs in a fixed order. The element-independent part below is compiled once.

#ifndef SSD_ONCE
#define SSD_ONCE
#define SSD_L 64      // chunk length (crate::ssd::CHUNK)
#define SSD_NMAX 128  // largest state size N the forward's shared tiles hold
#define SSD_SROW 129  // state row stride in shared memory: 16 rows of one column fall in 16 banks

__device__ __forceinline__ float ssd_silu(float x) { return x / (1.0f + __expf(-x)); }

// The chunked SSD forward in three parallel steps (after ssd_cb_f32), per (b, h, chunk c):
//   1. ssd_chunk_state_f32: the chunk's own state ΔS_c = Σ_j e^{cum_L − cum_j} dt_j x_j B_jᵀ
//      [P, N] into states [B, H, nch, P, N], and its decay e^{cum_L} into decay [B, H, nch];
//   2. ssd_state_pass_f32: per state element, in chunk order, S_c (the state entering chunk c)
//      overwrites ΔS_c: S_{c+1} = decay_c · S_c + ΔS_c; the last one is the final state;
//   3. ssd_chunk_scan_f32: Y = M X + diag(e^cum) C S_cᵀ + D X, M_ij = (C Bᵀ)_ij e^{cum_i − cum_j}
//      dt_j for j ≤ i.
// Only step 2 is sequential, over T / 64 chunks with one thread per state element; steps 1 and 3
// run one block per chunk. Limits: P ≤ 64, N ≤ 128 (the shared tiles).

#define SSD_PMAX 64
#define SSD_AHEAD 16  // chunks whose loads the state passing issues together

// The chunk of block idx = (b·H + h)·nch + c: head h's group g, the chunk's first row t0 and
// length len, and the sequence's start st (its first real row).
struct SsdChunk {
    int c, bh, h, b, g, t0, len, st;
};
__device__ __forceinline__ SsdChunk ssd_chunk_at(int idx, int nch, int T, int H, int G, const int* start) {
    int c = idx % nch, bh = idx / nch, h = bh % H, b = bh / H;
    int g = h / (H / G);
    int t0 = c * SSD_L, len = min(SSD_L, T - t0);
    int st = start ? start[b] : 0;
    return {c, bh, h, b, g, t0, len, st};
}

// Zero a thread's tile of sums.
template <int R, int C>
__device__ __forceinline__ void ssd_zero(float (&acc)[R][C]) {
#pragma unroll
    for (int k = 0; k < R; ++k)
#pragma unroll
        for (int q = 0; q < C; ++q) acc[k][q] = 0.0f;
}

// One step of a thread's 4 × 4 tile of a product: acc[k][q] += a(k) · b(q), a's four loads first.
template <typename FA, typename FB>
__device__ __forceinline__ void ssd_tile_fma(float (&acc)[4][4], FA a, FB b) {
    float av[4], bv[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) av[k] = a(k);
#pragma unroll
    for (int q = 0; q < 4; ++q) bv[q] = b(q);
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[k][q] += av[k] * bv[q];
}

// One step of two R × C tiles of products side by side: d1[k][q] += a1(k) · b1(q) and
// d2[k][q] += a2(k) · b2(q), the b loads first, then the a loads, each pair together.
template <int R, int C, typename FA1, typename FB1, typename FA2, typename FB2>
__device__ __forceinline__ void ssd_tile_fma2(float (&d1)[R][C], float (&d2)[R][C], FA1 a1, FB1 b1, FA2 a2, FB2 b2) {
    float u1[C], u2[C], v1[R], v2[R];
#pragma unroll
    for (int q = 0; q < C; ++q) {
        u1[q] = b1(q);
        u2[q] = b2(q);
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
        v1[k] = a1(k);
        v2[k] = a2(k);
    }
#pragma unroll
    for (int k = 0; k < R; ++k)
#pragma unroll
        for (int q = 0; q < C; ++q) {
            d1[k][q] += v1[k] * u1[q];
            d2[k][q] += v2[k] * u2[q];
        }
}

// dst [P, N] (f32) = Σ_{j < len} X[j][p] · Bn[j][n]: a chunk's state-shaped product of two tiles
// in shared memory, rows [SSD_L][SSD_PMAX] and [SSD_L][SSD_NMAX]; a block of 256 threads, each
// rows p0 .. p0 + 7 and columns n = lane + 32 q.
__device__ __forceinline__ void ssd_state_tile(float* dst, const float* X, const float* Bn, int len, int P, int N,
                                               int tid) {
    const int lane = tid % 32, p0 = (tid / 32) * 8;
    float acc[8][4];
    ssd_zero(acc);
    for (int j = 0; j < len; ++j) {
        float bv[4], xv[8];
#pragma unroll
        for (int q = 0; q < 4; ++q) bv[q] = Bn[j * SSD_NMAX + lane + 32 * q];
#pragma unroll
        for (int k = 0; k < 8; ++k) xv[k] = X[j * SSD_PMAX + p0 + k];
#pragma unroll
        for (int k = 0; k < 8; ++k)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[k][q] += xv[k] * bv[q];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int p = p0 + k, n = lane + 32 * q;
            if (p < P && n < N) dst[(long)p * N + n] = acc[k][q];
        }
}

// dt (0 at padding and past the chunk's end) and cum, its inclusive prefix sum times A, for the
// chunk starting at t0 of (b, h); all 256 threads call it (warp 0 scans), then __syncthreads.
__device__ __forceinline__ void ssd_chunk_cum(float* dtm, float* cum, const float* dt, float a, int b, int h,
                                              int T, int H, int t0, int len, int st) {
    int tid = threadIdx.x;
    if (tid < 32) {
        float v[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            int r = 2 * tid + k;
            float d = 0.0f;
            if (r < len && t0 + r >= st) d = dt[((long)b * T + t0 + r) * H + h];
            dtm[r] = d;
            v[k] = d * a;
        }
        float s = v[0] + v[1];
        for (int o = 1; o < 32; o <<= 1) {
            float u = __shfl_up_sync(0xffffffffu, s, o);
            if (tid >= o) s += u;
        }
        float excl = s - (v[0] + v[1]);
        cum[2 * tid] = excl + v[0];
        cum[2 * tid + 1] = excl + v[0] + v[1];
    }
    __syncthreads();
}

// The state passing (elem.cuh's chunk_pass), one thread per state element e of (b, h): x enters
// as x0[i] (or 0), the chunk slots are [BH, nch, PN], out (if any) gets the last x.
template <bool REV>
__device__ __forceinline__ void ssd_pass(float* slots, float* out, const float* x0, const float* decay, int BH,
                                         int PN, int nch) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)BH * PN) return;
    long bh = i / PN, e = i % PN;
    float x = x0 ? x0[i] : 0.0f;
    float* p = slots + bh * nch * PN + e;
    const float* d = decay + bh * nch;
    x = chunk_pass<REV, SSD_AHEAD>(p, PN, x, nch, [&](int c) { return d[c]; });
    if (out) out[i] = x;
}

// Forward: S_0 = init (or 0); for each chunk c, S_c replaces ΔS_c in states and S_{c+1} =
// decay_c · S_c + ΔS_c; fin gets S_nch.
extern "C" __global__ void ssd_state_pass_f32(float* states, float* fin, const float* init, const float* decay,
                                              int BH, int PN, int nch) {
    ssd_pass<false>(states, fin, init, decay, BH, PN, nch);
}

// dst[j] += Σ_p part[p · part_stride + j] for j < width, p in order: pass 2 of the column sums.
extern "C" __global__ void ssd_colsum_acc_f32(float* dst, const float* part, int nparts, int width,
                                              long part_stride) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    float s = 0.0f;
    for (int p = 0; p < nparts; ++p) s += part[(long)p * part_stride + j];
    dst[j] += s;
}

// ------------------------------------------------------------------------------------------------
// The chunked SSD backward (after the forward's ssd_cb_f32, ssd_chunk_state_f32 and
// ssd_state_pass_f32 have left S_c, the state entering each chunk, in `states`):
//   1. ssd_chunk_dstate_f32: ΔG_c = (diag(e^cum) dY_c)ᵀ C_c [P, N] into gbuf [B, H, nch, P, N];
//   2. ssd_state_pass_rev_f32: in reverse chunk order, gbuf[c] becomes dS_c, the gradient of the
//      state leaving chunk c (dS_{nch−1} = dfinal), dS_{c−1} = decay_c · dS_c + ΔG_c; the last
//      one is d(init);
//   3. ssd_chunk_bwd_f32: every gradient of chunk c from S_c and dS_c (formulas in crate::ssd);
//      dB, dC per head into [B, H, T, N], dA and dD per chunk into [B, H, nch];
//   4. ssd_bc_reduce_f32, ssd_head_reduce_f32: the sums over a group's heads and over chunks,
//      in order.

#define SSD_XROW 65  // row stride of the x and dy tiles: a column of 16 rows falls in 16 banks


// Step 2 above: gbuf[c] (ΔG_c) becomes dS_c, from the last chunk; dinit (if any) gets d(init).
extern "C" __global__ void ssd_state_pass_rev_f32(float* gbuf, float* dinit, const float* dfinal, const float* decay,
                                                  int BH, int PN, int nch) {
    ssd_pass<true>(gbuf, dinit, dfinal, decay, BH, PN, nch);
}

// Sum of v over the 16 lanes of a half-warp, in a fixed tree (every lane gets it).
__device__ __forceinline__ float ssd_half_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block's 256 threads in a fixed tree; `red` holds 256 floats.
__device__ __forceinline__ float ssd_block_sum(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    float s = red[0];
    __syncthreads();
    return s;
}

// dA[h] += Σ_b Σ_c dapart[b, h, c], dD likewise, in order.
extern "C" __global__ void ssd_head_reduce_f32(float* da, float* dd, const float* dapart, const float* ddpart, int B,
                                               int H, int nch) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    float sa = 0.0f, sd = 0.0f;
    for (int b = 0; b < B; ++b)
        for (int c = 0; c < nch; ++c) {
            sa += dapart[((long)b * H + h) * nch + c];
            sd += ddpart[((long)b * H + h) * nch + c];
        }
    da[h] += sa;
    dd[h] += sd;
}
// A = −exp(A_log) per head (the SSD's decay rate).
extern "C" __global__ void ssd_neg_exp_f32(float* a, const float* a_log, int H) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < H) a[h] = -expf(a_log[h]);
}

// dst[i] += x[i] · y[i]: dA_log = dA · A, since A = −exp(A_log).
extern "C" __global__ void ssd_mul_acc_f32(float* dst, const float* x, const float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += x[i] * y[i];
}


// ---- The short convolution (conv1d), on vectors of V channels by runs of rows ----
// One thread takes V consecutive channels (one 16- or 8-byte load per row where the layout allows
// it, else V = 1) over a run of SSD_CONV_R consecutive rows of one sequence, and keeps those rows'
// inputs, plus a halo of MW − 1 rows, in registers: each input is read once per run instead of
// once per tap, and the run's loads are all in flight together. A block is 32 channel vectors
// (threadIdx.x % 32) by 8 runs (threadIdx.x / 32); blockIdx.z is the batch row. MW is W (≤ 8)
// rounded up to 4 or 8; taps at lags W..MW − 1 are skipped, so every sum is the taps' in order.
#define SSD_CONV_R 8      // rows per run of the forward
#define SSD_CONV_BR 4     // rows per run of the backward (its registers: 202 per thread at 8)
#define SSD_CONV_RUNS 8   // runs per block
#define SSD_CONV_LOOPS 8  // backward: runs per thread, so one partial dw per 256 rows of a block

// V elements of type E as raw 32-bit words (a bf16 pair per word).
template <class E, int V>
struct SsdRaw {
    unsigned w[(V * (int)sizeof(E) + 3) / 4];
};

template <class E, int V>
__device__ __forceinline__ void ssd_raw_ld(SsdRaw<E, V>& r, const E* p) {
    constexpr int NB = V * (int)sizeof(E);
    if constexpr (NB == 16) {
        const uint4 u = *(const uint4*)p;
        r.w[0] = u.x, r.w[1] = u.y, r.w[2] = u.z, r.w[3] = u.w;
    } else if constexpr (NB == 8) {
        const uint2 u = *(const uint2*)p;
        r.w[0] = u.x, r.w[1] = u.y;
    } else if constexpr (NB == 4) {
        r.w[0] = *(const unsigned*)p;
    } else {
        r.w[0] = *(const u16*)p;
    }
}

template <class E, int V>
__device__ __forceinline__ float ssd_raw_at(const SsdRaw<E, V>& r, int j) {
    if constexpr (sizeof(E) == 4) {
        return __uint_as_float(r.w[j]);
    } else {
        return __uint_as_float((j & 1) ? (r.w[j >> 1] & 0xffff0000u) : (r.w[j >> 1] << 16));
    }
}

// Stores V floats rounded to E (as st) in one vector store, packed in registers (a local array
// reinterpreted as a vector would live in local memory).
template <class E, int V>
__device__ __forceinline__ void ssd_vec_st(E* p, const float* v) {
    if constexpr (sizeof(E) == 2 && V == 1) {
        st(p, 0, v[0]);
    } else {
        SsdRaw<E, V> r;
        if constexpr (sizeof(E) == 4) {
#pragma unroll
            for (int j = 0; j < V; ++j) r.w[j] = __float_as_uint(v[j]);
        } else {
#pragma unroll
            for (int j = 0; j < V / 2; ++j) {
                E lo, hi;
                st(&lo, 0, v[2 * j]);
                st(&hi, 0, v[2 * j + 1]);
                r.w[j] = (unsigned)lo | ((unsigned)hi << 16);
            }
        }
        constexpr int NB = V * (int)sizeof(E);
        if constexpr (NB == 16) {
            *(uint4*)p = make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]);
        } else if constexpr (NB == 8) {
            *(uint2*)p = make_uint2(r.w[0], r.w[1]);
        } else {
            *(unsigned*)p = r.w[0];
        }
    }
}

// The input at (b, pos, c + v) as the forward reads it: x (raw, loaded where pos ≥ max(start, 0)),
// 0 before start, `prev` [B, W − 1, C] before position 0 (where start is 0).
template <class E, int V>
__device__ __forceinline__ float ssd_conv_x(const SsdRaw<E, V>& in, int v, int pos, int s, const float* prev, int b,
                                            int c, int C, int W) {
    if (pos >= 0) return pos >= s ? ssd_raw_at(in, v) : 0.0f;
    return (s == 0 && prev && W - 1 + pos >= 0) ? prev[((long)b * (W - 1) + (W - 1 + pos)) * C + c + v] : 0.0f;
}

// Loads the raw inputs of rows first .. first + N − 1 (zero where the input is not x).
template <class E, int V, int N>
__device__ __forceinline__ void ssd_conv_rows(SsdRaw<E, V> (&in)[N], const E* x, long xs, int b, int first, int s,
                                              int T, int c) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int pos = first + i;
#pragma unroll
        for (int k = 0; k < (int)(sizeof(in[i].w) / 4); ++k) in[i].w[k] = 0u;
        if (pos >= s && pos >= 0 && pos < T) ssd_raw_ld(in[i], x + ((long)b * T + pos) * xs + c);
    }
}

// The weights by lag (wr[j][v] = w[c + v, W − 1 − j], 0 past W) and the bias.
template <class E, int V, int MW>
__device__ __forceinline__ void ssd_conv_weights(float (&wr)[MW][V], float (&bb)[V], const E* w, const float* bias,
                                                 int c, int W) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
        bb[v] = bias ? bias[c + v] : 0.0f;
#pragma unroll
        for (int j = 0; j < MW; ++j) wr[j][v] = j < W ? ld(w, (long)(c + v) * W + (W - 1 - j)) : 0.0f;
    }
}

// Forward: out [B, T, C] = SiLU?(bias + Σ_k w[c, k] · input(t − W + 1 + k)), 0 before start.
template <class E, int V, int MW>
__device__ __forceinline__ void ssd_conv_fwd_run(E* __restrict__ out, const E* __restrict__ x, long xs,
                                                 const E* __restrict__ w, const float* __restrict__ bias,
                                                 const int* __restrict__ start, const float* __restrict__ prev,
                                                 int T, int C, int W, int silu) {
    const int c = (blockIdx.x * 32 + (threadIdx.x & 31)) * V;
    const int b = blockIdx.z;
    const int t0 = (blockIdx.y * SSD_CONV_RUNS + (threadIdx.x >> 5)) * SSD_CONV_R;
    if (c >= C || t0 >= T) return;
    const int s = start ? start[b] : 0;
    float wr[MW][V], bb[V];
    ssd_conv_weights<E, V, MW>(wr, bb, w, bias, c, W);
    constexpr int NI = SSD_CONV_R + MW - 1;  // rows t0 − MW + 1 .. t0 + R − 1
    SsdRaw<E, V> in[NI];
    ssd_conv_rows<E, V, NI>(in, x, xs, b, t0 - (MW - 1), s, T, c);
#pragma unroll
    for (int r = 0; r < SSD_CONV_R; ++r) {
        const int t = t0 + r;
        if (t >= T) break;
        float o[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
            float acc = bb[v];
#pragma unroll
            for (int j = MW - 1; j >= 0; --j)
                if (j < W) acc += wr[j][v] * ssd_conv_x(in[r + MW - 1 - j], v, t - j, s, prev, b, c, C, W);
            o[v] = t < s ? 0.0f : (silu ? ssd_silu(acc) : acc);
        }
        ssd_vec_st<E, V>(out + ((long)b * T + t) * C + c, o);
    }
}

// Backward, fused: g = dout · SiLU'(pre) (pre recomputed) over the run and a halo of MW − 1 rows
// after it, then dx(t) = Σ_k w[k] · g(t + W − 1 − k) (rows of stride xs, 0 at padding), and the
// run's dw[c, k] = Σ_t g(t) · input(t − W + 1 + k) and db = Σ_t g(t) summed over the thread's
// SSD_CONV_LOOPS runs, then over the block's 8 runs in order into part [blocks, C·W + C] (block
// b · gridDim.y + blockIdx.y; dw at c·W + k, db at C·W + c).
template <class E, int V, int MW>
__device__ __forceinline__ void ssd_conv_bwd_run(E* __restrict__ dx, float* __restrict__ part,
                                                 const E* __restrict__ dout, const E* __restrict__ x, long xs,
                                                 const E* __restrict__ w, const float* __restrict__ bias,
                                                 const int* __restrict__ start, const float* __restrict__ prev,
                                                 int T, int C, int W, int silu, float* red) {
    constexpr int NR = (MW + 1) * V;  // partial sums per thread in red [runs, 32, NR]
    const int lane = threadIdx.x & 31, run = threadIdx.x >> 5;
    const int c = (blockIdx.x * 32 + lane) * V;
    const int b = blockIdx.z;
    const int s = start ? start[b] : 0;
    float dw[MW][V], db[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
        db[v] = 0.0f;
#pragma unroll
        for (int j = 0; j < MW; ++j) dw[j][v] = 0.0f;
    }
    if (c < C) {
        float wr[MW][V], bb[V];
        ssd_conv_weights<E, V, MW>(wr, bb, w, bias, c, W);
#pragma unroll 1
        for (int l = 0; l < SSD_CONV_LOOPS; ++l) {
            const int t0 = ((blockIdx.y * SSD_CONV_LOOPS + l) * SSD_CONV_RUNS + run) * SSD_CONV_BR;
            if (t0 >= T) break;
            constexpr int NG = SSD_CONV_BR + MW - 1;  // g at rows t0 .. t0 + R + MW − 2
            constexpr int NX = NG + MW - 1;          // inputs at rows t0 − MW + 1 ..
            SsdRaw<E, V> in[NX], dy[NG];
            ssd_conv_rows<E, V, NX>(in, x, xs, b, t0 - (MW - 1), s, T, c);
            ssd_conv_rows<E, V, NG>(dy, dout, C, b, t0, s, T, c);
            float g[NG][V];
#pragma unroll
            for (int i = 0; i < NG; ++i) {
                const int u = t0 + i;
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    const float d = ssd_raw_at(dy[i], v);  // 0 at padding and past T
                    if (silu && u >= s && u < T) {
                        float pre = bb[v];
#pragma unroll
                        for (int j = MW - 1; j >= 0; --j)
                            if (j < W) pre += wr[j][v] * ssd_conv_x(in[i + MW - 1 - j], v, u - j, s, prev, b, c, C, W);
                        const float sg = 1.0f / (1.0f + __expf(-pre));
                        g[i][v] = d * sg * (1.0f + pre * (1.0f - sg));
                    } else {
                        g[i][v] = d;
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < SSD_CONV_BR; ++r) {
                const int t = t0 + r;
                if (t >= T) break;
                float o[V];
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    float acc = 0.0f;
#pragma unroll
                    for (int j = MW - 1; j >= 0; --j)
                        if (j < W) acc += wr[j][v] * g[r + j][v];
                    o[v] = t < s ? 0.0f : acc;
                    db[v] += g[r][v];
#pragma unroll
                    for (int j = 0; j < MW; ++j)
                        if (j < W) dw[j][v] += g[r][v] * ssd_conv_x(in[r + MW - 1 - j], v, t - j, s, prev, b, c, C, W);
                }
                ssd_vec_st<E, V>(dx + ((long)b * T + t) * xs + c, o);
            }
        }
    }
#pragma unroll
    for (int v = 0; v < V; ++v) {
#pragma unroll
        for (int j = 0; j < MW; ++j) red[(run * 32 + lane) * NR + j * V + v] = dw[j][v];
        red[(run * 32 + lane) * NR + MW * V + v] = db[v];
    }
    __syncthreads();
    if (run != 0 || c >= C) return;
    float* p = part + ((long)b * gridDim.y + blockIdx.y) * ((long)C * W + C);
#pragma unroll
    for (int e = 0; e < NR; ++e) {
        const int j = e / V, v = e % V;
        if (j < MW && j >= W) continue;
        float sum = 0.0f;
        for (int k = 0; k < SSD_CONV_RUNS; ++k) sum += red[(k * 32 + lane) * NR + e];
        if (j < MW)
            p[(long)(c + v) * W + (W - 1 - j)] = sum;
        else
            p[(long)C * W + c + v] = sum;
    }
}

// ---- Gated RMSNorm, on vectors of V elements (16 bytes where the layout allows it, else 1) ----

// Forward of row blockIdx.x (256 threads): y = (x ⊙ silu(z)) · rstd · w, rstd = 1 / √(mean + eps);
// the sum of squares by warp shuffles, then the 8 warps' sums in order (red [8]).
template <class E, int V>
__device__ __forceinline__ void ssd_norm_gated_fwd_row(E* __restrict__ y, float* __restrict__ rstd,
                                                       const E* __restrict__ x, const E* __restrict__ z, long zs,
                                                       const float* __restrict__ w, int dim, float eps, float* red) {
    const long r = blockIdx.x;
    const E* xr = x + r * dim;
    const E* zr = z + r * zs;
    float ss = 0.0f;
    for (int k = threadIdx.x * V; k < dim; k += 256 * V) {
        SsdRaw<E, V> xv, zv;
        ssd_raw_ld(xv, xr + k);
        ssd_raw_ld(zv, zr + k);
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const float g = ssd_raw_at(xv, v) * ssd_silu(ssd_raw_at(zv, v));
            ss += g * g;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) tot += red[i];
    const float s = rsqrtf(tot / dim + eps);
    if (threadIdx.x == 0) rstd[r] = s;
    for (int k = threadIdx.x * V; k < dim; k += 256 * V) {
        SsdRaw<E, V> xv, zv;
        ssd_raw_ld(xv, xr + k);
        ssd_raw_ld(zv, zr + k);
        float o[V];
#pragma unroll
        for (int v = 0; v < V; ++v) o[v] = ssd_raw_at(xv, v) * ssd_silu(ssd_raw_at(zv, v)) * s * w[k + v];
        ssd_vec_st<E, V>(y + r * dim + k, o);
    }
}

// Backward of rows r0 + warp, r0 + warp + 8, .. < r1 by one warp each (the row's sum by a shuffle
// tree); the warp adds its share of dw into its own slice pw [dim] of shared memory.
template <class E, int V>
__device__ __forceinline__ void ssd_norm_gated_bwd_rows(E* __restrict__ dx, E* __restrict__ dz, float* pw,
                                                        const E* __restrict__ dy, const E* __restrict__ x,
                                                        const E* __restrict__ z, long zs,
                                                        const float* __restrict__ rstd,
                                                        const float* __restrict__ w, int dim, int r0, int r1) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = r0 + warp; r < r1; r += 8) {
        const E* xr = x + (long)r * dim;
        const E* zr = z + (long)r * zs;
        const E* dyr = dy + (long)r * dim;
        const float s = rstd[r];
        float m = 0.0f;
        for (int k = lane * V; k < dim; k += 32 * V) {
            SsdRaw<E, V> xv, zv, dv;
            ssd_raw_ld(xv, xr + k);
            ssd_raw_ld(zv, zr + k);
            ssd_raw_ld(dv, dyr + k);
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const float n = ssd_raw_at(xv, v) * ssd_silu(ssd_raw_at(zv, v)) * s, d = ssd_raw_at(dv, v);
                m += w[k + v] * d * n;
                pw[k + v] += d * n;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);
        const float mean = m / dim;
        for (int k = lane * V; k < dim; k += 32 * V) {
            SsdRaw<E, V> xv, zv, dv;
            ssd_raw_ld(xv, xr + k);
            ssd_raw_ld(zv, zr + k);
            ssd_raw_ld(dv, dyr + k);
            float ox[V], oz[V];
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const float xk = ssd_raw_at(xv, v), zk = ssd_raw_at(zv, v);
                const float sg = 1.0f / (1.0f + __expf(-zk));
                const float gv = xk * zk * sg;
                const float dg = s * (w[k + v] * ssd_raw_at(dv, v) - gv * s * mean);
                ox[v] = dg * zk * sg;
                oz[v] = dg * xk * sg * (1.0f + zk * (1.0f - sg));
            }
            ssd_vec_st<E, V>(dx + (long)r * dim + k, ox);
            ssd_vec_st<E, V>(dz + (long)r * zs + k, oz);
        }
    }
}

// The dynamic shared memory of ssd_chunk_state and ssd_chunk_dstate: the chunk's rows of the
// state product's operands, x [L][PMAX] (X weighted, or e^cum dY) and bc [L][NMAX] (B, or C), then
// the chunk's cum and dt [L] each.
struct SsdStateSmem {
    float *x, *bc, *cum, *dtm;
};
__device__ __forceinline__ SsdStateSmem ssd_state_smem(float* sm) {
    float* bc = sm + SSD_L * SSD_PMAX;
    float* cum = bc + SSD_L * SSD_NMAX;
    return {sm, bc, cum, cum + SSD_L};
}
#endif  // SSD_ONCE

// ---- per element type ET ----

// Causal depthwise conv1d (+SiLU) forward (see ssd_conv_fwd_run): grid (⌈C / 32V⌉, ⌈T / 64⌉, B).
// x rows of stride x_stride; w [C, W]; bias [C], start [B] (positions before start[b] are 0 in and
// out) and prev [B, W − 1, C] (inputs before position 0, read where start[b] is 0) or null.
// Kernels by vector (vec: V = 4 channels, x, its stride, out and C aligned to 4 elements; one:
// V = 1; 8 bf16 channels per thread took 146 registers, one block per SM) and by taps (w4: W ≤ 4; w8: W ≤ 8), each its own so that none takes the registers of the
// widest.
#define SSD_CONV_FWD(NAME, V, MW)                                                                               \
    extern "C" __global__ void __launch_bounds__(256)                                                           \
        KN(NAME)(ET* out, const ET* x, long x_stride, const ET* w, const float* bias, const int* start,         \
                 const float* prev, int B, int T, int C, int W, int silu) {                                     \
        ssd_conv_fwd_run<ET, V, MW>(out, x, x_stride, w, bias, start, prev, T, C, W, silu);                     \
    }
SSD_CONV_FWD(ssd_conv1d_fwd_vec_w4, 4, 4)
SSD_CONV_FWD(ssd_conv1d_fwd_vec_w8, 4, 8)
SSD_CONV_FWD(ssd_conv1d_fwd_one_w4, 1, 4)
SSD_CONV_FWD(ssd_conv1d_fwd_one_w8, 1, 8)
#undef SSD_CONV_FWD

// C Bᵀ of every (batch row, group, chunk): cb [B, G, nch, L, L], one block of 256 threads per
// chunk, each thread 16 entries (row (tid / 64) * 16 + k, column tid % 64), k-sum in order over N.
extern "C" __global__ void __launch_bounds__(256) KN(ssd_cb)(float* cb, const ET* xbc, long stride, int B,
                                                              int T, int H, int P, int N, int G, int nch) {
    __shared__ float cs[SSD_L][33];
    __shared__ float bs[SSD_L][33];
    int idx = blockIdx.x;
    int c = idx % nch, g = (idx / nch) % G, b = idx / (nch * G);
    int t0 = c * SSD_L, len = min(SSD_L, T - t0);
    int tid = threadIdx.x, col = tid % SSD_L, r0 = (tid / SSD_L) * 16;
    long bo = (long)H * P + (long)g * N, co = bo + (long)G * N;
    float acc[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) acc[k] = 0.0f;
    for (int n0 = 0; n0 < N; n0 += 32) {
        __syncthreads();
        for (int e = tid; e < SSD_L * 32; e += 256) {
            int r = e / 32, n = e % 32;
            float cv = 0.0f, bv = 0.0f;
            if (r < len && n0 + n < N) {
                const ET* row = xbc + ((long)b * T + t0 + r) * stride;
                cv = ld(row, co + n0 + n);
                bv = ld(row, bo + n0 + n);
            }
            cs[r][n] = cv;
            bs[r][n] = bv;
        }
        __syncthreads();
        for (int n = 0; n < 32; ++n) {
            float bv = bs[col][n];
#pragma unroll
            for (int k = 0; k < 16; ++k) acc[k] += cs[r0 + k][n] * bv;
        }
    }
    float* dst = cb + (long)idx * SSD_L * SSD_L;
#pragma unroll
    for (int k = 0; k < 16; ++k) dst[(r0 + k) * SSD_L + col] = acc[k];
}

extern "C" __global__ void __launch_bounds__(256)
    KN(ssd_chunk_state)(float* states, float* decay, const ET* xbc, long stride, const float* dt,
                        const float* A, const int* start, int B, int T, int H, int P, int N, int G, int nch) {
    extern __shared__ float sm[];
    const auto [Xw, Bs, cum, dtm] = ssd_state_smem(sm);
    int idx = blockIdx.x;
    const auto [c, bh, h, b, g, t0, len, st] = ssd_chunk_at(idx, nch, T, H, G, start);
    int tid = threadIdx.x;
    ssd_chunk_cum(dtm, cum, dt, A[h], b, h, T, H, t0, len, st);
    float last = cum[len - 1];
    long rowbase = ((long)b * T + t0) * stride;
    for (int i = tid; i < SSD_L * SSD_NMAX; i += 256) {
        int r = i / SSD_NMAX, n = i % SSD_NMAX;
        Bs[i] = (r < len && n < N) ? ld(xbc, rowbase + (long)r * stride + (long)H * P + (long)g * N + n) : 0.0f;
    }
    for (int i = tid; i < SSD_L * SSD_PMAX; i += 256) {
        int r = i / SSD_PMAX, p = i % SSD_PMAX;
        float v = 0.0f;
        if (r < len && p < P) v = __expf(last - cum[r]) * dtm[r] * ld(xbc, rowbase + (long)r * stride + (long)h * P + p);
        Xw[i] = v;
    }
    __syncthreads();
    ssd_state_tile(states + (long)idx * P * N, Xw, Bs, len, P, N, tid);
    if (tid == 0) decay[idx] = __expf(last);
}

extern "C" __global__ void __launch_bounds__(256)
    KN(ssd_chunk_scan)(ET* y, const ET* xbc, long stride, const float* dt, const float* A, const float* D,
                       const int* start, const float* cb, const float* states, int B, int T, int H, int P,
                       int N, int G, int nch) {
    extern __shared__ float sm[];
    float* M = sm;                               // [L][L + 1]
    float* Xs = M + SSD_L * (SSD_L + 1);         // [L][PMAX]
    float* Cs = Xs + SSD_L * SSD_PMAX;           // [L][NMAX]
    float* S = Cs + SSD_L * SSD_NMAX;            // [PMAX][SROW]
    float* cum = S + SSD_PMAX * SSD_SROW;        // [L]
    float* dtm = cum + SSD_L;                    // [L]
    int idx = blockIdx.x;
    const auto [c, bh, h, b, g, t0, len, st] = ssd_chunk_at(idx, nch, T, H, G, start);
    int tid = threadIdx.x;
    long HP = (long)H * P;
    long rowbase = ((long)b * T + t0) * stride;
    const float* sc = states + (long)idx * P * N;
    for (int i = tid; i < SSD_L * SSD_NMAX; i += 256) {
        int r = i / SSD_NMAX, n = i % SSD_NMAX;
        Cs[i] = (r < len && n < N) ? ld(xbc, rowbase + (long)r * stride + HP + (long)G * N + (long)g * N + n) : 0.0f;
    }
    for (int i = tid; i < SSD_L * SSD_PMAX; i += 256) {
        int r = i / SSD_PMAX, p = i % SSD_PMAX;
        Xs[i] = (r < len && p < P) ? ld(xbc, rowbase + (long)r * stride + (long)h * P + p) : 0.0f;
    }
    for (int i = tid; i < SSD_PMAX * SSD_NMAX; i += 256) {
        int p = i / SSD_NMAX, n = i % SSD_NMAX;
        S[p * SSD_SROW + n] = (p < P && n < N) ? sc[(long)p * N + n] : 0.0f;
    }
    ssd_chunk_cum(dtm, cum, dt, A[h], b, h, T, H, t0, len, st);
    const float* cbc = cb + (((long)b * G + g) * nch + c) * SSD_L * SSD_L;
    for (int i = tid; i < SSD_L * SSD_L; i += 256) {
        int r = i / SSD_L, j = i % SSD_L;
        float v = 0.0f;
        if (j <= r && r < len) v = cbc[i] * __expf(cum[r] - cum[j]) * dtm[j];
        M[r * (SSD_L + 1) + j] = v;
    }
    __syncthreads();
    // Thread tile: rows r0 .. r0 + 3, columns p = pl + 16 q.
    int pl = tid % 16, r0 = (tid / 16) * 4;
    float acc[4][4], acc2[4][4];
    ssd_zero(acc);
    ssd_zero(acc2);
    // M is lower-triangular: rows up to r0 + 3 need j ≤ r0 + 3.
    int jend = min(r0 + 4, SSD_L);
    for (int j = 0; j < jend; ++j) {
        ssd_tile_fma(acc, [&](int k) { return M[(r0 + k) * (SSD_L + 1) + j]; },
                     [&](int q) { return Xs[j * SSD_PMAX + pl + 16 * q]; });
    }
    for (int n = 0; n < N; ++n) {
        ssd_tile_fma(acc2, [&](int k) { return Cs[(r0 + k) * SSD_NMAX + n]; },
                     [&](int q) { return S[(pl + 16 * q) * SSD_SROW + n]; });
    }
    float dskip = D[h];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        int r = r0 + k;
        if (r >= len) continue;
        int t = t0 + r;
        float e = __expf(cum[r]);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int p = pl + 16 * q;
            if (p >= P) continue;
            float o = 0.0f;
            if (t >= st) o = acc[k][q] + e * acc2[k][q] + dskip * Xs[r * SSD_PMAX + p];
            ::st(y, ((long)b * T + t) * HP + (long)h * P + p, o);
        }
    }
}

// One decoding step: state [B, H, P, N] updated in place, y [B, H·P]; xbc [B, stride], dt [B, H].
// Blocks of 256 threads on a grid (B·H, ⌈P / 8⌉): warp w of block (bh, j) handles row p = 8j + w,
// its lanes split N and reduce y with a fixed shuffle tree (8 rows per block, so that a batch of
// one still fills the GPU). start [B] or null: a row with start[b] > 0 is padding. With a_log set,
// A holds A_log and the kernel takes A = −exp(A_log) itself (one launch fewer per decode step).
// Launched with programmatic dependent launch.
extern "C" __global__ void __launch_bounds__(256)
    KN(ssd_decode)(float* state, ET* y, const ET* xbc, long stride, const float* dt, const float* A,
                   const float* D, const int* start, int H, int P, int N, int G, int a_log) {
    pdl_trigger_next();
    int bh = blockIdx.x, h = bh % H, b = bh / H;
    int g = h / (H / G);
    int lane = threadIdx.x % 32, p = blockIdx.y * 8 + threadIdx.x / 32;
    if (p >= P) return;
    const ET* row = xbc + (long)b * stride;
    const ET* x = row + (long)h * P;
    const ET* bv = row + (long)H * P + (long)g * N;
    const ET* cv = bv + (long)G * N;
    pdl_wait_prev();
    float a = a_log ? -expf(A[h]) : A[h];
    const float dskip = D[h];
    bool pad = start && start[b] > 0;
    float dtv = dt[bh], decay = __expf(dtv * a);
    float* s = state + ((long)bh * P + p) * N;
    float xv = dtv * ld(x, p);
    float acc = 0.0f;
    if (!pad) {
        // N ≤ 128: at most 4 columns per lane, all loaded before any store.
        float sv[4], bn[4], cn[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int n = lane + 32 * k;
            const bool in = n < N;
            sv[k] = in ? s[n] : 0.0f;
            bn[k] = in ? ld(bv, n) : 0.0f;
            cn[k] = in ? ld(cv, n) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int n = lane + 32 * k;
            if (n < N) {
                float v = decay * sv[k] + xv * bn[k];
                s[n] = v;
                acc += v * cn[k];
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) st(y, (long)bh * P + p, pad ? 0.0f : acc + dskip * ld(x, p));
}

// The inputs of a Mamba-2 decode step (one position per row), in one launch: the convolution of
// xBC (columns conv_off.. of zxbcdt's rows, stride `stride`) continuing its state [B, W − 1, C]
// (advanced in place: each thread reads its column before writing it) with SiLU, into xbc [B, C];
// dt [B, H] = softplus(dt_raw + dt_bias) from columns dt_off... Threads 0..B·C convolve, the next
// B·H take dt. A row with start[b] > 0 is padding: its xbc 0 and its conv state kept (as
// crate::conv1d::conv1d_decode_step).
extern "C" __global__ void KN(ssd_decode_inputs)(ET* xbc, float* conv_state, float* dt, const ET* zxbcdt,
                                                 long stride, long conv_off, long dt_off, const ET* w,
                                                 const float* bias, const float* dt_bias, const int* start,
                                                 int B, int C, int W, int H) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long)B * C) {
        int c = (int)(i % C), b = (int)(i / C);
        bool pad = start && start[b] > 0;
        if (pad) {
            st(xbc, i, 0.0f);
            return;
        }
        float* sc = conv_state + (long)b * (W - 1) * C + c;
        float x = ld(zxbcdt, (long)b * stride + conv_off + c);
        float acc = bias ? bias[c] : 0.0f;
        for (int k = 0; k < W - 1; ++k) acc += ld(w, c * W + k) * sc[(long)k * C];
        acc += ld(w, c * W + W - 1) * x;
        for (int k = 0; k + 1 < W - 1; ++k) sc[(long)k * C] = sc[(long)(k + 1) * C];
        if (W > 1) sc[(long)(W - 2) * C] = x;
        st(xbc, i, ssd_silu(acc));
        return;
    }
    i -= (long)B * C;
    if (i < (long)B * H) {
        int k = (int)(i % H), b = (int)(i / H);
        dt[i] = softplus_(ld(zxbcdt, (long)b * stride + dt_off + k) + dt_bias[k]);
    }
}

// Gated RMSNorm forward (ssd_norm_gated_fwd_row): one block of 256 threads per row. x, y [rows,
// dim]; z rows of stride z_stride. vec: 16-byte vectors (x, y, z, z_stride and dim aligned to
// them), else one element per thread. A block, not a warp, per row: a decode step's single row
// would otherwise get 32 threads (docs/kernel-notes.md). Launched with
// programmatic dependent launch.
extern "C" __global__ void __launch_bounds__(256)
    KN(ssd_rms_norm_gated_fwd)(ET* y, float* rstd, const ET* x, const ET* z, long z_stride, const float* w, int dim,
                               float eps, int vec) {
    __shared__ float red[8];
    pdl_trigger_next();
    pdl_wait_prev();
    if (vec) ssd_norm_gated_fwd_row<ET, 16 / (int)sizeof(ET)>(y, rstd, x, z, z_stride, w, dim, eps, red);
    else ssd_norm_gated_fwd_row<ET, 1>(y, rstd, x, z, z_stride, w, dim, eps, red);
}


// conv1d backward in one pass (see ssd_conv_bwd_run): grid (⌈C / 32V⌉, ⌈T / 256⌉, B); dx in x's
// layout (rows of stride x_stride), the partial sums of dweight and dbias into part. Kernels as
// the forward's, with vec: V = 2 channels (x, dx, their stride, dout and C aligned to 2 elements;
// 4 took 202 registers per thread).
#define SSD_CONV_BWD(NAME, V, MW)                                                                               \
    extern "C" __global__ void __launch_bounds__(256, 2)                                                        \
        KN(NAME)(ET* dx, float* part, const ET* dout, const ET* x, long x_stride, const ET* w, const float* bias, \
                 const int* start, const float* prev, int B, int T, int C, int W, int silu) {                   \
        __shared__ float red[SSD_CONV_RUNS * 32 * (MW + 1) * V];                                                \
        ssd_conv_bwd_run<ET, V, MW>(dx, part, dout, x, x_stride, w, bias, start, prev, T, C, W, silu, red);     \
    }
SSD_CONV_BWD(ssd_conv1d_bwd_vec_w4, 2, 4)
SSD_CONV_BWD(ssd_conv1d_bwd_vec_w8, 2, 8)
SSD_CONV_BWD(ssd_conv1d_bwd_one_w4, 1, 4)
SSD_CONV_BWD(ssd_conv1d_bwd_one_w8, 1, 8)
#undef SSD_CONV_BWD

// Gated RMSNorm backward: one block of 256 threads (8 warps) per rows_per_block rows
// (ssd_norm_gated_bwd_rows); the block then adds its 8 warps' slices of dw, in order, into part
// [blocks, dim]. dx [rows, dim]; dz rows of stride z_stride. vec as the forward's.
extern "C" __global__ void __launch_bounds__(256)
    KN(ssd_rms_norm_gated_bwd)(ET* dx, ET* dz, float* part, const ET* dy, const ET* x, const ET* z,
                               long z_stride, const float* rstd, const float* w, int dim, int rows,
                               int rows_per_block, int vec) {
    extern __shared__ float pws[];
    const int warp = threadIdx.x >> 5;
    float* pw = pws + (long)warp * dim;
    for (int k = threadIdx.x & 31; k < dim; k += 32) pw[k] = 0.0f;
    __syncwarp();
    const int r0 = blockIdx.x * rows_per_block, r1 = min(rows, r0 + rows_per_block);
    if (vec) ssd_norm_gated_bwd_rows<ET, 16 / (int)sizeof(ET)>(dx, dz, pw, dy, x, z, z_stride, rstd, w, dim, r0, r1);
    else ssd_norm_gated_bwd_rows<ET, 1>(dx, dz, pw, dy, x, z, z_stride, rstd, w, dim, r0, r1);
    __syncthreads();
    for (int k = threadIdx.x; k < dim; k += 256) {
        float acc = 0.0f;
        for (int v = 0; v < 8; ++v) acc += pws[(long)v * dim + k];
        part[(long)blockIdx.x * dim + k] = acc;
    }
}
extern "C" __global__ void __launch_bounds__(256)
    KN(ssd_chunk_dstate)(float* gbuf, const ET* dy, const ET* xbc, long stride, const float* dt,
                         const float* A, const int* start, int B, int T, int H, int P, int N, int G, int nch) {
    extern __shared__ float sm[];
    const auto [Ye, Cs, cum, dtm] = ssd_state_smem(sm);
    int idx = blockIdx.x;
    const auto [c, bh, h, b, g, t0, len, st] = ssd_chunk_at(idx, nch, T, H, G, start);
    int tid = threadIdx.x;
    ssd_chunk_cum(dtm, cum, dt, A[h], b, h, T, H, t0, len, st);
    long rowbase = ((long)b * T + t0) * stride;
    long HP = (long)H * P;
    for (int i = tid; i < SSD_L * SSD_NMAX; i += 256) {
        int r = i / SSD_NMAX, n = i % SSD_NMAX;
        Cs[i] = (r < len && n < N) ? ld(xbc, rowbase + (long)r * stride + HP + (long)G * N + (long)g * N + n) : 0.0f;
    }
    for (int i = tid; i < SSD_L * SSD_PMAX; i += 256) {
        int r = i / SSD_PMAX, p = i % SSD_PMAX;
        float v = 0.0f;
        if (r < len && p < P && t0 + r >= st) v = __expf(cum[r]) * ld(dy, ((long)b * T + t0 + r) * HP + (long)h * P + p);
        Ye[i] = v;
    }
    __syncthreads();
    ssd_state_tile(gbuf + (long)idx * P * N, Ye, Cs, len, P, N, tid);
}

extern "C" __global__ void __launch_bounds__(256)
    KN(ssd_chunk_bwd)(ET* dxbc, float* dbh, float* dch, float* ddt, float* dapart, float* ddpart, const ET* dy,
                      const ET* xbc, long stride, const float* dt, const float* A, const float* D,
                      const int* start, const float* cb, const float* states, const float* gbuf, int B, int T,
                      int H, int P, int N, int G, int nch) {
    extern __shared__ float sm[];
    float* Xs = sm;                              // [L][XROW]
    float* Ys = Xs + SSD_L * SSD_XROW;           // [L][XROW] dy (0 at padding)
    float* Bs = Ys + SSD_L * SSD_XROW;           // [L][NMAX]
    float* Cs = Bs + SSD_L * SSD_NMAX;           // [L][NMAX]
    float* S0 = Cs + SSD_L * SSD_NMAX;           // [PMAX][SROW] state entering
    float* dS = S0 + SSD_PMAX * SSD_SROW;        // [PMAX][SROW] gradient of the state leaving
    float* Mm = dS + SSD_PMAX * SSD_SROW;        // [L][L + 1]: M, later dG
    float* T2 = Mm + SSD_L * (SSD_L + 1);        // [L][L + 1]: dM ∘ CB ∘ E
    float* cum = T2 + SSD_L * (SSD_L + 1);       // [L]
    float* dtm = cum + SSD_L;                    // [L]
    float* wv = dtm + SSD_L;                     // [L]
    float* rowA = wv + SSD_L;                    // [L] e^cum_i dY_i · (C_i S0ᵀ)
    float* dwv = rowA + SSD_L;                   // [L] x_j · U_j
    float* red = dwv + SSD_L;                    // [256]
    int idx = blockIdx.x;
    const auto [c, bh, h, b, g, t0, len, st] = ssd_chunk_at(idx, nch, T, H, G, start);
    int tid = threadIdx.x;
    long HP = (long)H * P;
    long rowbase = ((long)b * T + t0) * stride;
    const float* s0 = states + (long)idx * P * N;
    const float* ds = gbuf + (long)idx * P * N;
    for (int i = tid; i < SSD_L * SSD_NMAX; i += 256) {
        int r = i / SSD_NMAX, n = i % SSD_NMAX;
        float bv = 0.0f, cv = 0.0f;
        if (r < len && n < N) {
            const ET* row = xbc + rowbase + (long)r * stride + HP + (long)g * N;
            bv = ld(row, n);
            cv = ld(row, (long)G * N + n);
        }
        Bs[i] = bv;
        Cs[i] = cv;
    }
    for (int i = tid; i < SSD_L * SSD_PMAX; i += 256) {
        int r = i / SSD_PMAX, p = i % SSD_PMAX;
        bool ok = r < len && p < P;
        Xs[r * SSD_XROW + p] = ok ? ld(xbc, rowbase + (long)r * stride + (long)h * P + p) : 0.0f;
        Ys[r * SSD_XROW + p] = (ok && t0 + r >= st) ? ld(dy, ((long)b * T + t0 + r) * HP + (long)h * P + p) : 0.0f;
    }
    for (int i = tid; i < SSD_PMAX * SSD_NMAX; i += 256) {
        int p = i / SSD_NMAX, n = i % SSD_NMAX;
        bool ok = p < P && n < N;
        S0[p * SSD_SROW + n] = ok ? s0[(long)p * N + n] : 0.0f;
        dS[p * SSD_SROW + n] = ok ? ds[(long)p * N + n] : 0.0f;
    }
    ssd_chunk_cum(dtm, cum, dt, A[h], b, h, T, H, t0, len, st);
    float last = cum[len - 1];
    const float* cbc = cb + (((long)b * G + g) * nch + c) * SSD_L * SSD_L;
    for (int i = tid; i < SSD_L * SSD_L; i += 256) {
        int r = i / SSD_L, j = i % SSD_L;
        float v = 0.0f;
        if (j <= r && r < len) v = cbc[i] * __expf(cum[r] - cum[j]) * dtm[j];
        Mm[r * (SSD_L + 1) + j] = v;
    }
    if (tid < SSD_L) wv[tid] = tid < len ? __expf(last - cum[tid]) * dtm[tid] : 0.0f;
    __syncthreads();

    // Tiles of [L, P]: rows r0 .. r0 + 3, columns p = pl + 16 q.
    int pl = tid % 16, r0 = (tid / 16) * 4;
    float dx[4][4], t1[4][4];
    // dX = Mᵀ dY (i ≥ j), U = B dSᵀ, and yint = C S0ᵀ for dcum.
    ssd_zero(dx);
    ssd_zero(t1);
    for (int i = r0; i < SSD_L; ++i) {
        ssd_tile_fma(dx, [&](int k) { return Mm[i * (SSD_L + 1) + r0 + k]; },
                     [&](int q) { return Ys[i * SSD_XROW + pl + 16 * q]; });
    }
    for (int n = 0; n < N; ++n) {
        ssd_tile_fma(t1, [&](int k) { return Bs[(r0 + k) * SSD_NMAX + n]; },
                     [&](int q) { return dS[(pl + 16 * q) * SSD_SROW + n]; });
    }
    float dskip = D[h];
    float ddp = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        int j = r0 + k;
        float dwp = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int p = pl + 16 * q;
            float xv = Xs[j * SSD_XROW + p], yv = Ys[j * SSD_XROW + p];
            dwp += xv * t1[k][q];
            dx[k][q] += wv[j] * t1[k][q] + dskip * yv;
            ddp += xv * yv;
        }
        dwp = ssd_half_sum(dwp);
        if (pl == 0) dwv[j] = dwp;
        if (j < len && pl < P) {
            // dx of the rows of this chunk (0 at padding: there dY, dt and so every term are 0).
            ET* dxr = dxbc + rowbase + (long)j * stride + (long)h * P;
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (pl + 16 * q < P) ::st(dxr, pl + 16 * q, dx[k][q]);
        }
    }
    // yint = C S0ᵀ, dotted with dY for rowA.
    ssd_zero(t1);
    for (int n = 0; n < N; ++n) {
        ssd_tile_fma(t1, [&](int k) { return Cs[(r0 + k) * SSD_NMAX + n]; },
                     [&](int q) { return S0[(pl + 16 * q) * SSD_SROW + n]; });
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        int r = r0 + k;
        float a = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) a += Ys[r * SSD_XROW + pl + 16 * q] * t1[k][q];
        a = ssd_half_sum(a);
        if (pl == 0) rowA[r] = __expf(cum[r]) * a;
    }
    // dM = dY Xᵀ on rows i = r0.., columns j = pl + 16 q; T2 = dM ∘ CB ∘ E, dG = T2 / CB · dt.
    float dmt[4][4];
    ssd_zero(dmt);
    for (int p = 0; p < SSD_PMAX; ++p) {
        ssd_tile_fma(dmt, [&](int k) { return Ys[(r0 + k) * SSD_XROW + p]; },
                     [&](int q) { return Xs[(pl + 16 * q) * SSD_XROW + p]; });
    }
    __syncthreads();  // every read of M (as Mm) is done: it becomes dG
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        int i = r0 + k;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int j = pl + 16 * q;
            float t2 = 0.0f, dg = 0.0f;
            if (j <= i && i < len) {
                float e = __expf(cum[i] - cum[j]);
                t2 = dmt[k][q] * cbc[i * SSD_L + j] * e;
                dg = dmt[k][q] * e * dtm[j];
            }
            T2[i * (SSD_L + 1) + j] = t2;
            Mm[i * (SSD_L + 1) + j] = dg;
        }
    }
    __syncthreads();
    // dC = dG B + diag(e^cum) dY S0, dB = dGᵀ C + diag(w) X dS: rows rr .. rr + 7, n = lane + 32 q.
    {
        int lane = tid % 32, rr = (tid / 32) * 8;
        float dcv[8][4], dbv[8][4];
        ssd_zero(dcv);
        ssd_zero(dbv);
        for (int j = 0; j < SSD_L; ++j)
            ssd_tile_fma2(
                dcv, dbv,  // dG B, dGᵀ C
                [=](int k) { return Mm[(rr + k) * (SSD_L + 1) + j]; },
                [=](int q) { return Bs[j * SSD_NMAX + lane + 32 * q]; },
                [=](int k) { return Mm[j * (SSD_L + 1) + rr + k]; },
                [=](int q) { return Cs[j * SSD_NMAX + lane + 32 * q]; });
        float ec[8], wr[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            ec[k] = __expf(cum[rr + k]);
            wr[k] = wv[rr + k];
        }
        for (int p = 0; p < SSD_PMAX; ++p)
            ssd_tile_fma2(
                dcv, dbv,  // diag(e^cum) dY S0, diag(w) X dS
                [=](int k) { return ec[k] * Ys[(rr + k) * SSD_XROW + p]; },
                [=](int q) { return S0[p * SSD_SROW + lane + 32 * q]; },
                [=](int k) { return wr[k] * Xs[(rr + k) * SSD_XROW + p]; },
                [=](int q) { return dS[p * SSD_SROW + lane + 32 * q]; });
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            int r = rr + k;
            if (r >= len) continue;
            long o = ((long)bh * T + t0 + r) * N;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                int n = lane + 32 * q;
                if (n < N) {
                    dch[o + n] = dcv[k][q];
                    dbh[o + n] = dbv[k][q];
                }
            }
        }
    }
    // e^{cum_L} <dS, S0> and Σ x·dy (dD), each by a fixed tree.
    float sd = 0.0f;
    for (int i = tid; i < SSD_PMAX * SSD_NMAX; i += 256) {
        int p = i / SSD_NMAX, n = i % SSD_NMAX;
        sd += dS[p * SSD_SROW + n] * S0[p * SSD_SROW + n];
    }
    float sdot = ssd_block_sum(sd, red);
    float ddsum = ssd_block_sum(ddp, red);
    // dcum, then d(dt·A) by a reverse prefix sum in thread 0; ddt and dA's share.
    if (tid < SSD_L) {
        int i = tid;
        float rq = 0.0f, cs = 0.0f;
        for (int j = 0; j < SSD_L; ++j) {
            rq += T2[i * (SSD_L + 1) + j] * dtm[j];
            cs += T2[j * (SSD_L + 1) + i];
        }
        float dc = rq - dtm[i] * cs + rowA[i] - dwv[i] * wv[i];
        // red is free again: keep dcum in red[0..64), the intra ddt in red[64..128).
        red[i] = dc;
        red[SSD_L + i] = cs + dwv[i] * __expf(last - cum[i]);
    }
    __syncthreads();
    if (tid == 0) {
        float tail = __expf(last) * sdot;
        for (int j = 0; j < len; ++j) tail += dwv[j] * wv[j];
        red[len - 1] += tail;
        float a = A[h], acc = 0.0f, da = 0.0f;
        for (int s = len - 1; s >= 0; --s) {
            acc += red[s];
            red[SSD_L + s] += a * acc;
            da += dtm[s] * acc;
        }
        dapart[idx] = da;
        ddpart[idx] = ddsum;
    }
    __syncthreads();
    if (tid < len) {
        int t = t0 + tid;
        ddt[((long)b * T + t) * H + h] = t < st ? 0.0f : red[SSD_L + tid];
    }
}

// dB, dC of each (b, t, group, n): the sum over the group's heads in head order, into dxbc.
extern "C" __global__ void KN(ssd_bc_reduce)(ET* dxbc, long stride, const float* dbh, const float* dch, int B,
                                             int T, int H, int P, int N, int G) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * T * G * N) return;
    int n = (int)(i % N);
    long r = i / N;
    int g = (int)(r % G);
    long bt = r / G;
    int t = (int)(bt % T), b = (int)(bt / T);
    int hpg = H / G;
    float sb = 0.0f, sc = 0.0f;
    for (int h = g * hpg; h < (g + 1) * hpg; ++h) {
        long o = (((long)b * H + h) * T + t) * N + n;
        sb += dbh[o];
        sc += dch[o];
    }
    ET* row = dxbc + bt * stride + (long)H * P;
    st(row, (long)g * N + n, sb);
    st(row, (long)G * N + (long)g * N + n, sc);
}

// dt [rows, H] = softplus(raw + bias), raw rows of stride `stride`: one thread per value. dt in
// f32 (Mamba-2's, ssd_dt_fwd) or in ET (Mamba's δ, which its scan reads: ssd_dt_fwd_act).
template <typename O>
__device__ __forceinline__ void ssd_dt_fwd_impl(O* dt, const ET* raw, long stride, const float* bias, int rows, int H) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows * H) return;
    int k = (int)(i % H);
    long r = i / H;
    st(dt, i, softplus_(ld(raw, r * stride + k) + bias[k]));
}
extern "C" __global__ void KN(ssd_dt_fwd)(float* dt, const ET* raw, long stride, const float* bias, int rows, int H) {
    ssd_dt_fwd_impl(dt, raw, stride, bias, rows, H);
}
extern "C" __global__ void KN(ssd_dt_fwd_act)(ET* dt, const ET* raw, long stride, const float* bias, int rows, int H) {
    ssd_dt_fwd_impl(dt, raw, stride, bias, rows, H);
}

// dt's backward: draw (H columns of rows of stride `stride`) = ddt · sigmoid(raw + bias) (1 above
// 20); thread (part, k) walks rows part·rows_per_part .. in order and writes its share of dbias
// into part[part · H + k] (summed in order by ssd_colsum_acc_f32). ddt f32 (ssd_dt_bwd) or ET
// (ssd_dt_bwd_act).
template <typename G>
__device__ __forceinline__ void ssd_dt_bwd_impl(ET* draw, float* part, const G* ddt, const ET* raw, long stride,
                                                const float* bias, int rows, int H, int rows_per_part) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    int chunk = blockIdx.y;
    if (k >= H) return;
    float acc = 0.0f;
    long r0 = (long)chunk * rows_per_part, r1 = min((long)rows, r0 + rows_per_part);
    for (long r = r0; r < r1; ++r) {
        float v = ld(raw, r * stride + k) + bias[k];
        float g = ld(ddt, r * H + k) * (v > 20.0f ? 1.0f : 1.0f / (1.0f + expf(-v)));
        st(draw, r * stride + k, g);
        acc += g;
    }
    part[(long)chunk * H + k] = acc;
}
extern "C" __global__ void KN(ssd_dt_bwd)(ET* draw, float* part, const float* ddt, const ET* raw, long stride,
                                          const float* bias, int rows, int H, int rows_per_part) {
    ssd_dt_bwd_impl(draw, part, ddt, raw, stride, bias, rows, H, rows_per_part);
}
extern "C" __global__ void KN(ssd_dt_bwd_act)(ET* draw, float* part, const ET* ddt, const ET* raw, long stride,
                                              const float* bias, int rows, int H, int rows_per_part) {
    ssd_dt_bwd_impl(draw, part, ddt, raw, stride, bias, rows, H, rows_per_part);
}

// dst[r, 0..cols) = src[r, 0..cols) for r < rows, rows of strides dst_stride and src_stride: a
// block of columns out of (or into) a wider matrix. One thread per value.
extern "C" __global__ void KN(ssd_copy_cols)(ET* dst, long dst_stride, const ET* src, long src_stride, int rows,
                                             int cols) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows * cols) return;
    long r = i / cols;
    int c = (int)(i % cols);
    dst[r * dst_stride + c] = src[r * src_stride + c];
}

// The convolution's state after a chunk of T positions (x rows of stride x_stride): the last W − 1
// inputs of each row, oldest first, from `state` itself where T < W − 1 (its previous inputs), 0
// where padding. One thread per (b, c) reads its column before writing it, so it runs in place.
extern "C" __global__ void KN(ssd_conv_state)(float* state, const ET* x, long x_stride, const int* start, int B,
                                              int T, int C, int W) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * C) return;
    int c = (int)(i % C), b = (int)(i / C);
    int s = start ? start[b] : 0;
    float old[8], nw[8];  // W ≤ 8
    for (int k = 0; k < W - 1; ++k) old[k] = state[((long)b * (W - 1) + k) * C + c];
    for (int k = 0; k < W - 1; ++k) {
        int pos = T - (W - 1) + k;
        float v = 0.0f;
        if (pos >= 0) {
            if (pos >= s) v = ld(x, ((long)b * T + pos) * x_stride + c);
        } else if (s == 0) {
            v = old[W - 1 + pos];
        }
        nw[k] = v;
    }
    for (int k = 0; k < W - 1; ++k) state[((long)b * (W - 1) + k) * C + c] = nw[k];
}
