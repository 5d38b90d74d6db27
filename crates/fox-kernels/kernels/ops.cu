// The small operations of the FoX training step (included after common.cuh): norms, KV-shift,
// RoPE, gates, SwiGLU, residuals, casts, embedding, cross-entropy, AdamW, sums of squares.
//
// Every T-kernel exists as <name>_f32 and <name>_bf16 (OPS_FOR at the end). Arithmetic is f32
// inside every kernel; statistics, gate values, losses, parameter gradients and optimizer state
// are f32. Reductions are deterministic: fixed-order warp shuffles, shared-memory sums in a fixed
// order, and cross-row sums in two passes over fixed-size per-block partials (no float atomics).
// Flat indices are 64-bit: logits chunks and embedding tables pass 2^31 elements easily.

typedef long long i64;

// bf16 as its raw 16 bits (no CUDA headers under NVRTC).
struct bf16 {
    u16 x;
};

// Round to nearest even, as cvt.rn.bf16.f32 and the host's half::bf16::from_f32 do; NaN stays a
// (quiet) NaN. Plain integer code: the file has no inline PTX of its own.
__device__ __forceinline__ u16 f32_to_bf16(float v) {
    const u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float ld(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, i64 i) { return __uint_as_float(((u32)p[i].x) << 16); }
__device__ __forceinline__ void st(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, i64 i, float v) { p[i].x = f32_to_bf16(v); }

// Four consecutive elements from index i (a multiple of 4; buffers are 256-byte aligned).
__device__ __forceinline__ void ld4(const float* p, i64 i, float* o) {
    const float4 v = *(const float4*)(p + i);
    o[0] = v.x;
    o[1] = v.y;
    o[2] = v.z;
    o[3] = v.w;
}
__device__ __forceinline__ void ld4(const bf16* p, i64 i, float* o) {
    const uint2 w = *(const uint2*)(p + i);
    o[0] = bf16_lo(w.x);
    o[1] = bf16_hi(w.x);
    o[2] = bf16_lo(w.y);
    o[3] = bf16_hi(w.y);
}
__device__ __forceinline__ void st4(float* p, i64 i, const float* v) {
    *(float4*)(p + i) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void st4(bf16* p, i64 i, const float* v) {
    uint2 w;
    w.x = pack2<true>(v[0], v[1]);
    w.y = pack2<true>(v[2], v[3]);
    *(uint2*)(p + i) = w;
}
// w elements (4 or 1) from index i.
template <class T>
__device__ __forceinline__ void ldv(const T* p, i64 i, int w, float* o) {
    if (w == 4) ld4(p, i, o);
    else o[0] = ld(p, i);
}
template <class T>
__device__ __forceinline__ void stv(T* p, i64 i, int w, const float* v) {
    if (w == 4) st4(p, i, v);
    else st(p, i, v[0]);
}

// Elementwise launch shape: each thread owns 4 consecutive elements; the last partial group is
// done one element at a time. body(i, w) handles elements [i, i + w).
template <class F>
__device__ __forceinline__ void vec4(i64 n, F body) {
    const i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 4 <= n) {
        body(i, 4);
    } else {
        for (i64 j = i; j < n; ++j) body(j, 1);
    }
}

// out = f(x) elementwise, through vec4.
template <class O, class I, class F>
__device__ __forceinline__ void map1(O* out, const I* x, i64 n, F f) {
    vec4(n, [&](i64 i, int w) {
        float v[4];
        ldv(x, i, w, v);
        for (int k = 0; k < w; ++k) v[k] = f(v[k]);
        stv(out, i, w, v);
    });
}
// out = f(a, b) elementwise, through vec4.
template <class T, class F>
__device__ __forceinline__ void map2(T* out, const T* a, const T* b, i64 n, F f) {
    vec4(n, [&](i64 i, int w) {
        float u[4], v[4];
        ldv(a, i, w, u);
        ldv(b, i, w, v);
        for (int k = 0; k < w; ++k) u[k] = f(u[k], v[k]);
        stv(out, i, w, u);
    });
}

// One thread per element.
__device__ __forceinline__ i64 flat_index() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }

// A warp's walk over a row of n elements (the row start 4-element aligned): f(c, w) for 4-wide
// chunks at c = 4*lane + 128k when n % 4 == 0 (16-byte / 8-byte loads), else single elements.
template <class F>
__device__ __forceinline__ void row_chunks(int n, F f) {
    const int lane = threadIdx.x & 31;
    if ((n & 3) == 0) {
        for (int c = 4 * lane; c < n; c += 128) f(c, 4);
    } else {
        for (int c = lane; c < n; c += 32) f(c, 1);
    }
}


template <class V>
__device__ __forceinline__ V warp_sum(V x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); the result is valid in thread 0.
// Fixed order: butterfly within warps, then warp 0..n-1 in order.
template <class V>
__device__ __forceinline__ V block_sum(V x) {
    __shared__ V s_part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_sum(x);
    if (lane == 0) s_part[warp] = x;
    __syncthreads();
    V s = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < nw; ++w) s += s_part[w];
    return s;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm (as crate::rmsnorm). One warp per row, 8 rows per block; for a few rows (decode steps) a
// 256-thread block per row instead (WIDE: a row of 768 is then one load per thread, not six
// dependent ones). Row r uses weight row r % groups (groups = len(w) / dim). With `b`, the row is
// first h = a + b (a residual add and the next norm in one pass), stored in T and read back, so y
// and rstd are bitwise those of add then the norm alone.

// A block's walk over a row of n elements: 4-wide chunks at c = 4*tid + 4*blockDim*k when
// n % 4 == 0, else single elements.
template <class F>
__device__ __forceinline__ void wide_chunks(int n, F f) {
    if ((n & 3) == 0) {
        for (int c = 4 * threadIdx.x; c < n; c += 4 * blockDim.x) f(c, 4);
    } else {
        for (int c = threadIdx.x; c < n; c += blockDim.x) f(c, 1);
    }
}

template <bool WIDE, class F>
__device__ __forceinline__ void norm_chunks(int n, F f) {
    if (WIDE) wide_chunks(n, f);
    else row_chunks(n, f);
}

template <class T, bool WIDE>
__device__ __forceinline__ void norm_row(T* y, float* rstd, T* h, const T* a, const T* b, const float* w, i64 r,
                                         int dim, int groups, float eps) {
    __shared__ float s_bcast;
    if (WIDE) {
        pdl_trigger_next();
        pdl_wait_prev();
    }
    const i64 o = r * dim;
    const T* x = b != nullptr ? h : a;
    float ss = 0.f;
    norm_chunks<WIDE>(dim, [&](int c, int n) {
        float v[4];
        ldv(a, o + c, n, v);
        if (b != nullptr) {
            float u[4];
            ldv(b, o + c, n, u);
            for (int k = 0; k < n; ++k) v[k] = v[k] + u[k];
            stv(h, o + c, n, v);
            ldv(h, o + c, n, v);
        }
        for (int k = 0; k < n; ++k) ss += v[k] * v[k];
    });
    float s;
    if (WIDE) {
        ss = block_sum(ss);
        if (threadIdx.x == 0) s_bcast = 1.f / sqrtf(ss / (float)dim + eps);
        __syncthreads();
        s = s_bcast;
    } else {
        s = 1.f / sqrtf(warp_sum(ss) / (float)dim + eps);
    }
    if ((WIDE ? threadIdx.x : threadIdx.x & 31) == 0) rstd[r] = s;
    const float* wr = w + (r % groups) * dim;
    norm_chunks<WIDE>(dim, [&](int c, int n) {
        float v[4];
        ldv(x, o + c, n, v);
        for (int k = 0; k < n; ++k) v[k] = v[k] * s * wr[c + k];
        stv(y, o + c, n, v);
    });
}

template <class T>
__device__ __forceinline__ void rms_fwd_impl(T* y, float* rstd, const T* x, const float* w, int rows, int dim,
                                             int groups, float eps) {
    const i64 r = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r < rows) norm_row<T, false>(y, rstd, nullptr, x, nullptr, w, r, dim, groups, eps);
}

template <class T>
__device__ __forceinline__ void add_rms_fwd_impl(T* h, T* y, float* rstd, const T* a, const T* b, const float* w,
                                                 int rows, int dim, float eps) {
    const i64 r = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r < rows) norm_row<T, false>(y, rstd, h, a, b, w, r, dim, 1, eps);
}

// y[r, o] = x[r, :] . w[o, :] for a few rows r < rows <= GEMV_ROWS (a decode step's Linear, where a
// GEMM would leave most of the GPU idle). A block of 8 warps takes 8 / ks outputs; the ks warps of
// an output split its row (16-byte loads, `in` a multiple of 16 / sizeof(T)) and their f32 sums
// are added in warp order. With GLU (SwiGLU's gate_proj, out = 2I), a block takes gate rows and
// the matching up rows, and also writes h = silu(gate) * up: y and h bitwise as this kernel
// without GLU followed by swiglu_fwd.
#define GEMV_ROWS 4
__device__ __forceinline__ void ld16(const float* p, float* o) { ld4(p, 0, o); }
__device__ __forceinline__ void ld16(const bf16* p, float* o) {
    const uint4 v = *(const uint4*)p;
    o[0] = bf16_lo(v.x);
    o[1] = bf16_hi(v.x);
    o[2] = bf16_lo(v.y);
    o[3] = bf16_hi(v.y);
    o[4] = bf16_lo(v.z);
    o[5] = bf16_hi(v.z);
    o[6] = bf16_lo(v.w);
    o[7] = bf16_hi(v.w);
}
// Mamba-2's decode-step inputs after in_proj (STEP: a decode step's in_proj, one position per row
// r = batch row b): the thread that stores output column j of row b also takes, from that stored
// (rounded) value, the convolution of column j when j is one of xBC's C columns (continuing its
// state [B, W − 1, C], advanced in place; SiLU; into xbc [B, C]; a row with start[b] > 0 is
// padding: xbc 0, state kept) or dt when j is one of dt_raw's H columns (softplus(dt_raw +
// dt_bias) into dt [B, H]): kernels/ssd.cu's ssd_decode_inputs in the same formulas and order, so
// bitwise equal to in_proj's GEMV followed by it. Each column belongs to one thread: the state
// needs no ordering between blocks.
struct StepIn {
    void* xbc;
    float* conv_state;
    float* dt;
    const void* cw;
    const float* cb;
    const float* dt_bias;
    const int* start;
    int conv_off, C, W, dt_off, H;
};

// A value as a store into T leaves it (f32_to_bf16's rounding), without the store and load.
__device__ __forceinline__ float as_stored(const float*, float v) { return v; }
__device__ __forceinline__ float as_stored(const bf16*, float v) { return __uint_as_float((u32)f32_to_bf16(v) << 16); }

// What the thread of column j of row b reads for its step before its value is known: the conv
// column's taps, bias and state (W ≤ 8) or dt's bias. The weights are read before the kernel's
// wait for the one before it, the state after it.
struct StepPre {
    float w[8], s[7], bias;
    bool conv, dt, pad;
};

template <class T>
__device__ __forceinline__ void step_in_weights(const StepIn& m, int b, i64 j, StepPre& q) {
    q.conv = j >= m.conv_off && j < m.conv_off + m.C;
    q.dt = j >= m.dt_off && j < m.dt_off + m.H;
    q.pad = m.start && m.start[b] > 0;
    if (q.conv) {
        const int c = (int)(j - m.conv_off);
        const T* w = (const T*)m.cw;
#pragma unroll
        for (int k = 0; k < 8; ++k) q.w[k] = k < m.W ? ld(w, (i64)c * m.W + k) : 0.0f;
        q.bias = m.cb ? m.cb[c] : 0.0f;
    } else if (q.dt) {
        q.bias = m.dt_bias[j - m.dt_off];
    }
}

__device__ __forceinline__ void step_in_state(const StepIn& m, int b, i64 j, StepPre& q) {
    if (!q.conv || q.pad) return;
    const float* sc = m.conv_state + (i64)b * (m.W - 1) * m.C + (j - m.conv_off);
#pragma unroll
    for (int k = 0; k < 7; ++k) q.s[k] = k < m.W - 1 ? sc[(i64)k * m.C] : 0.0f;
}

// The step of column j from its stored value x: the sums in the order of ssd_decode_inputs.
template <class T>
__device__ __forceinline__ void step_in_column(const StepIn& m, int b, i64 j, float x, const StepPre& q) {
    if (q.conv) {
        const int c = (int)(j - m.conv_off);
        T* xbc = (T*)m.xbc;
        if (q.pad) {
            st(xbc, (i64)b * m.C + c, 0.0f);
            return;
        }
        float* sc = m.conv_state + (i64)b * (m.W - 1) * m.C + c;
        float acc = q.bias;
#pragma unroll
        for (int k = 0; k < 7; ++k)
            if (k < m.W - 1) acc += q.w[k] * q.s[k];
#pragma unroll
        for (int k = 0; k < 8; ++k)
            if (k == m.W - 1) acc += q.w[k] * x;
#pragma unroll
        for (int k = 0; k < 6; ++k)
            if (k + 1 < m.W - 1) sc[(i64)k * m.C] = q.s[k + 1];
        if (m.W > 1) sc[(i64)(m.W - 2) * m.C] = x;
        st(xbc, (i64)b * m.C + c, acc / (1.0f + __expf(-acc)));
    } else if (q.dt) {
        const float v = x + q.bias;
        m.dt[(i64)b * m.H + (j - m.dt_off)] = softplus_(v);
    }
}

template <class T, class Y, bool GLU, bool STEP = false>
__device__ __forceinline__ void gemv_impl(Y* y, T* h, const T* x, const T* w, int rows, int in, int out, int ks,
                                          StepIn step = {}) {
    constexpr int S = 16 / sizeof(T);
    __shared__ float red[8][GEMV_ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, per_block = 8 / ks;
    const int part = warp % ks, slot = warp / ks;
    // GLU: slots [0, per_block / 2) are gate rows, the rest the up rows I further on.
    const int half = per_block / 2, inter = out / 2;
    const i64 o = GLU ? (i64)blockIdx.x * half + slot % half + (slot >= half ? inter : 0)
                      : (i64)blockIdx.x * per_block + slot;
    const bool on = GLU ? (i64)blockIdx.x * half + slot % half < inter : o < out;
    float acc[GEMV_ROWS] = {0.f, 0.f, 0.f, 0.f};
    // The weights depend on no earlier kernel: the first chunk is fetched before the wait.
    pdl_trigger_next();
    const T* wr = w + o * in;
    const int c0 = (part * 32 + lane) * S;
    float w0[S];
    if (on && c0 < in) ld16(wr + c0, w0);
    // STEP: the column this thread stores at the end (ol, r as below), and its step's inputs.
    StepPre pre;
    const int sol = threadIdx.x / GEMV_ROWS, sr = threadIdx.x % GEMV_ROWS;
    const i64 so = (i64)blockIdx.x * per_block + sol;
    const bool stepper = STEP && sol < per_block && so < out && sr < rows;
    if (stepper) step_in_weights<T>(step, sr, so, pre);
    pdl_wait_prev();
    if (stepper) step_in_state(step, sr, so, pre);
    if (on) {
#pragma unroll 2
        for (int c = c0; c < in; c += ks * 32 * S) {
            float wv[S], xv[S];
            if (c == c0) {
#pragma unroll
                for (int k = 0; k < S; ++k) wv[k] = w0[k];
            } else {
                ld16(wr + c, wv);
            }
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) {
                if (r < rows) {
                    ld16(x + (i64)r * in + c, xv);
#pragma unroll
                    for (int k = 0; k < S; ++k) acc[r] += wv[k] * xv[k];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) {
        acc[r] = warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = acc[r];
    }
    __syncthreads();
    const int ol = threadIdx.x / GEMV_ROWS, r = threadIdx.x % GEMV_ROWS;
    if (r >= rows) return;
    auto total = [&](int sl) {
        float s = 0.f;
        for (int q = 0; q < ks; ++q) s += red[sl * ks + q][r];
        return s;
    };
    if (GLU) {
        const i64 i = (i64)blockIdx.x * half + ol;
        if (ol < half && i < inter) {
            st(y, (i64)r * out + i, total(ol));
            st(y, (i64)r * out + inter + i, total(ol + half));
            const float g = ld(y, (i64)r * out + i), u = ld(y, (i64)r * out + inter + i);
            st(h, (i64)r * inter + i, g * sigmoid_gate(g) * u);
        }
    } else {
        const i64 oo = (i64)blockIdx.x * per_block + ol;
        if (ol < per_block && oo < out) {
            const float v = total(ol);
            st(y, (i64)r * out + oo, v);
            if (STEP) step_in_column<T>(step, r, oo, as_stored(y, v), pre);
        }
    }
}
#define GEMV_KERNEL(NAME, T, Y, SW)                                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        NAME(Y* y, T* h, const T* x, const T* w, int rows, int in, int out, int ks) {                             \
        gemv_impl<T, Y, SW>(y, h, x, w, rows, in, out, ks);                                                        \
    }
GEMV_KERNEL(gemv_f32_f32, float, float, false)
GEMV_KERNEL(gemv_bf16_bf16, bf16, bf16, false)
GEMV_KERNEL(gemv_bf16_f32, bf16, float, false)
GEMV_KERNEL(gemv_glu_f32, float, float, true)
GEMV_KERNEL(gemv_glu_bf16, bf16, bf16, true)
#define GEMV_STEP_KERNEL(NAME, T)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        NAME(T* y, const T* x, const T* w, int rows, int in, int out, int ks, T* xbc, float* conv_state, float* dt, \
             const T* cw, const float* cb, const float* dt_bias, const int* start, int conv_off, int C, int W,      \
             int dt_off, int H) {                                                                                  \
        gemv_impl<T, T, false, true>(y, nullptr, x, w, rows, in, out, ks,                                          \
                                     StepIn{xbc, conv_state, dt, cw, cb, dt_bias, start, conv_off, C, W, dt_off, H}); \
    }
GEMV_STEP_KERNEL(gemv_step_in_f32, float)
GEMV_STEP_KERNEL(gemv_step_in_bf16, bf16)

// dx = rstd (w dy - x^ mean(w dy x^)), x^ = x rstd; overwritten or added (accumulate).
template <class T>
__device__ __forceinline__ void rms_bwd_dx_impl(T* dx, int accumulate, const T* dy, const T* x, const float* rstd,
                                                const float* w, int rows, int dim, int groups) {
    const i64 r = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) return;
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    const float* wr = w + (r % groups) * dim;
    const float s = rstd[r];
    float dot = 0.f;
    row_chunks(dim, [&](int c, int n) {
        float g[4], v[4];
        ldv(dyr, c, n, g);
        ldv(xr, c, n, v);
        for (int k = 0; k < n; ++k) dot += wr[c + k] * g[k] * (v[k] * s);
    });
    dot = warp_sum(dot);
    const float mean = dot / (float)dim;
    T* dxr = dx + r * dim;
    row_chunks(dim, [&](int c, int n) {
        float g[4], v[4], o[4];
        ldv(dyr, c, n, g);
        ldv(xr, c, n, v);
        if (accumulate) ldv(dxr, c, n, o);
        for (int k = 0; k < n; ++k) {
            const float d = s * (wr[c + k] * g[k] - v[k] * s * mean);
            o[k] = accumulate ? o[k] + d : d;
        }
        stv(dxr, c, n, o);
    });
}

// RMSNorm's backward in one pass over dy and x: dx as rms_bwd_dx_impl (the same arithmetic in the
// same order, so the same bits) and the weight gradient's column sums (pass 1 of a column sum,
// whose pass 2 is colsum_final), which otherwise read dy and x again. The input is viewed as
// super-rows of W = groups*dim (row r = k*groups + g is super-row k's g-th row, weight row g); block
// p takes super-rows [p*R, p*R + R), its warp w super-rows p*R + w, p*R + w + 8, ..., each whole.
// A warp walks a super-row in 128-wide chunks (4 channels a lane, chunk i at columns 128 i + 4
// lane), so each lane keeps the dw sums of its 4 W/128 columns in registers: W % 128 == 0, W <=
// 128*RMS_BWD_CHUNKS, and a row is either whole chunks (dim % 128 == 0) or dim/4 lanes of one (128
// % dim == 0, dim % 4 == 0; its sums then run over those lanes alone). The warps' sums are added in
// warp order through shared memory into part[p, :].
#define RMS_BWD_CHUNKS 12
template <class T>
__device__ __forceinline__ void rms_bwd_fused_impl(float* part, T* dx, int accumulate, const T* dy, const T* x,
                                                   const float* rstd, const float* w, int rows, int dim, int groups,
                                                   int R) {
    __shared__ float red[128 * RMS_BWD_CHUNKS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int W = groups * dim, nch = W / 128;
    const int SR = (rows + groups - 1) / groups;
    const int k0 = blockIdx.x * R, k1 = min(k0 + R, SR);
    // dim >= 128: chunks per row; else lanes per row (seg) and rows per chunk.
    const bool whole = dim >= 128;
    const int cpr = whole ? dim / 128 : 1, seg = whole ? 32 : dim / 4, rpc = whole ? 1 : 128 / dim;
    float acc[4 * RMS_BWD_CHUNKS];
#pragma unroll
    for (int i = 0; i < 4 * RMS_BWD_CHUNKS; ++i) acc[i] = 0.f;
    for (int k = k0 + warp; k < k1; k += 8) {
        const i64 base = (i64)k * W;
        // Sweep 1: each chunk's row statistics (rstd, mean of w dy x^) for this lane.
        float sv[RMS_BWD_CHUNKS], mv[RMS_BWD_CHUNKS];
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < RMS_BWD_CHUNKS; ++i) {
            if (i >= nch) break;
            const int g = whole ? i / cpr : i * rpc + (lane / seg);
            const i64 r = (i64)k * groups + g;
            const bool valid = r < rows;
            const float s = valid ? rstd[r] : 0.f;
            sv[i] = valid ? s : -1.f;
            if (!whole || i % cpr == 0) dot = 0.f;
            const int c = 128 * i + 4 * lane;
            if (valid) {
                float gg[4], v[4];
                ld4(dy, base + c, gg);
                ld4(x, base + c, v);
                for (int q = 0; q < 4; ++q) dot += w[c + q] * gg[q] * (v[q] * s);
            }
            if (whole) {
                if (i % cpr == cpr - 1) {
                    // Every lane of the warp reaches this with the same i (a uniform branch).
                    const float mean = warp_sum(dot) / (float)dim;
#pragma unroll
                    for (int i2 = 0; i2 < RMS_BWD_CHUNKS; ++i2)
                        if (i2 / cpr == i / cpr) mv[i2] = mean;
                }
            } else {
                float d2 = dot;
                for (int off = seg / 2; off > 0; off >>= 1) d2 += __shfl_xor_sync(0xffffffffu, d2, off);
                mv[i] = d2 / (float)dim;
            }
        }
        // Sweep 2: dx, and dy x^ into the lane's column sums.
#pragma unroll
        for (int i = 0; i < RMS_BWD_CHUNKS; ++i) {
            if (i >= nch) break;
            if (sv[i] < 0.f) continue;
            const float s = sv[i], mean = mv[i];
            const int c = 128 * i + 4 * lane;
            float gg[4], v[4], o[4];
            ld4(dy, base + c, gg);
            ld4(x, base + c, v);
            if (accumulate) ld4(dx, base + c, o);
            for (int q = 0; q < 4; ++q) {
                const float d = s * (w[c + q] * gg[q] - v[q] * s * mean);
                o[q] = accumulate ? o[q] + d : d;
                acc[4 * i + q] += gg[q] * (v[q] * s);
            }
            st4(dx, base + c, o);
        }
    }
    // The warps' column sums in warp order (0 + warp 0 + warp 1 + ...), as colsum_part_impl adds
    // its 8 row lanes.
    for (int wi = 0; wi < 8; ++wi) {
        if (warp == wi) {
#pragma unroll
            for (int i = 0; i < RMS_BWD_CHUNKS; ++i) {
                if (i >= nch) break;
                for (int q = 0; q < 4; ++q) {
                    const int j = 128 * i + 4 * lane + q;
                    red[j] = (wi == 0 ? 0.f : red[j]) + acc[4 * i + q];
                }
            }
        }
        __syncthreads();
    }
    for (int j = threadIdx.x; j < W; j += blockDim.x) part[(i64)blockIdx.x * W + j] = red[j];
}

// Column sums, pass 1: the [SR, W] matrix of values val(k, j) is cut into chunks of R rows;
// block (bx, p) sums columns [32 bx, 32 bx + 32) over the rows of chunk p into part[p, j].
// Block: 256 threads = 32 columns x 8 row lanes; each warp reads 32 consecutive columns of a row.
template <class F>
__device__ __forceinline__ void colsum_part_impl(float* part, int SR, int W, int R, F val) {
    __shared__ float sh[8][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int j = blockIdx.x * 32 + tx;
    const int p = blockIdx.y;
    const int k0 = p * R, k1 = min(k0 + R, SR);
    float acc = 0.f;
    if (j < W)
        for (int k = k0 + ty; k < k1; k += 8) acc += val(k, j);
    sh[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && j < W) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += sh[i][tx];
        part[(i64)p * W + j] = s;
    }
}

// Pass 2: dst[j] += sum over p of part[p, j]; one block of 256 threads per column.
extern "C" __global__ void __launch_bounds__(256) colsum_final(float* dst, const float* part, int P, int W) {
    const int j = blockIdx.x;
    float s = 0.f;
    for (int p = threadIdx.x; p < P; p += blockDim.x) s += part[(i64)p * W + j];
    s = block_sum(s);
    if (threadIdx.x == 0) dst[j] += s;
}

// src [SR, W] f32.
extern "C" __global__ void __launch_bounds__(256) colsum_part_f32(float* part, const float* src, int SR, int W, int R) {
    colsum_part_impl(part, SR, W, R, [&](int k, int j) { return src[(i64)k * W + j]; });
}

// dw of RMSNorm: rows r = k*groups + g of the [rows, dim] input, viewed as super-rows k of width
// W = groups*dim, contribute dy * x^ to column j = g*dim + c; the last super-row may be partial.
template <class T>
__device__ __forceinline__ void rms_dw_part_impl(float* part, const T* dy, const T* x, const float* rstd, int rows,
                                                 int dim, int groups, int R) {
    const int W = groups * dim;
    const int SR = (rows + groups - 1) / groups;
    colsum_part_impl(part, SR, W, R, [&](int k, int j) {
        const i64 r = (i64)k * groups + j / dim;
        if (r >= rows) return 0.f;
        const i64 i = (i64)k * W + j;
        return ld(dy, i) * (ld(x, i) * rstd[r]);
    });
}

// ---------------------------------------------------------------------------------------------
// KV-shift (as crate::kv_shift, prev = None). x, out [B, T, H*D], alpha [B, T, H]; start[b] is
// the left padding of batch row b (null: none). One warp per (b, t, h): row = (b*T + t)*H + h,
// whose D channels start at row*D.

// The time t of row (b, t, h) of [B, T, H] and the left padding s of its batch row b.
__device__ __forceinline__ void kv_shift_time(const int* start, i64 row, int Tn, int H, int& t, int& s) {
    const i64 bt = row / H;
    t = (int)(bt % Tn);
    const int b = (int)(bt / Tn);
    s = start != nullptr ? max(start[b], 0) : 0;
}

template <class T>
__device__ __forceinline__ void kv_shift_fwd_impl(T* out, const T* x, const T* alpha, const int* start, int B, int Tn,
                                                  int H, int D) {
    const i64 row = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row >= (i64)B * Tn * H) return;
    int t, s;
    kv_shift_time(start, row, Tn, H, t, s);
    const i64 base = row * D;
    const float a = t < s ? 0.f : ld(alpha, row);
    const i64 prev = base - (i64)H * D;
    row_chunks(D, [&](int c, int n) {
        float v[4], p[4];
        ldv(x, base + c, n, v);
        if (t > s) {
            ldv(x, prev + c, n, p);
            for (int k = 0; k < n; ++k) v[k] = a * p[k] + (1.f - a) * v[k];
        } else if (t == s) {
            for (int k = 0; k < n; ++k) v[k] = (1.f - a) * v[k];
        }
        stv(out, base + c, n, v);
    });
}

// dx_t = dout_t (1 - a_t) + dout_{t+1} a_{t+1} (t >= s); dout_t at padding. dalpha_t = dout_t .
// (x_{t-1} - x_t) (t > s), -dout_t . x_t (t = s), 0 at padding.
template <class T>
__device__ __forceinline__ void kv_shift_bwd_impl(T* dx, T* dalpha, const T* dout, const T* x, const T* alpha,
                                                  const int* start, int B, int Tn, int H, int D) {
    const int lane = threadIdx.x & 31;
    const i64 row = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row >= (i64)B * Tn * H) return;
    int t, s;
    kv_shift_time(start, row, Tn, H, t, s);
    const i64 base = row * D;
    if (t < s) {
        row_chunks(D, [&](int c, int n) {
            float g[4];
            ldv(dout, base + c, n, g);
            stv(dx, base + c, n, g);
        });
        if (lane == 0) st(dalpha, row, 0.f);
        return;
    }
    const i64 hd = (i64)H * D;
    const float a = ld(alpha, row);
    const bool has_next = t + 1 < Tn;
    const float na = has_next ? ld(alpha, row + H) : 0.f;
    float da = 0.f;
    row_chunks(D, [&](int c, int n) {
        float go[4], cur[4], p[4], nx[4], g[4];
        ldv(dout, base + c, n, go);
        ldv(x, base + c, n, cur);
        if (t > s) ldv(x, base - hd + c, n, p);
        if (has_next) ldv(dout, base + hd + c, n, nx);
        for (int k = 0; k < n; ++k) {
            if (t > s) da += go[k] * (p[k] - cur[k]);
            else da -= go[k] * cur[k];
            g[k] = go[k] * (1.f - a);
            if (has_next) g[k] += nx[k] * na;
        }
        stv(dx, base + c, n, g);
    });
    da = warp_sum(da);
    if (lane == 0) st(dalpha, row, da);
}

// ---------------------------------------------------------------------------------------------
// RoPE (as crate::rope::rope_apply), in place on x [rows, H*D]. One thread per (row, c < D/2):
// the angle is formed in f32 as the reference does, its sine and cosine in f64, and the rotation
// applied to channel pair (c, c + D/2) of every head.

template <class T>
__device__ __forceinline__ void rope_impl(T* x, const int* pos, int rows, int H, int D, double base, int inverse) {
    const int half = D / 2;
    const i64 idx = flat_index();
    if (idx >= (i64)rows * half) return;
    const i64 row = idx / half;
    const int c = (int)(idx % half);
    const double inv_freq = 1.0 / pow(base, 2.0 * (double)c / (double)D);
    const float ang = (float)pos[row] * (float)inv_freq;
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    const float sn = (float)(inverse ? -sd : sd), cs = (float)cd;
    T* xr = x + row * H * D;
    for (int h = 0; h < H; ++h) {
        const i64 i1 = (i64)h * D + c, i2 = i1 + half;
        const float a = ld(xr, i1), b = ld(xr, i2);
        st(xr, i1, a * cs - b * sn);
        st(xr, i2, b * cs + a * sn);
    }
}

// ---------------------------------------------------------------------------------------------
// Elementwise ops.

template <class T>
__device__ __forceinline__ void sigmoid_fwd_impl(T* y, const T* x, i64 n) {
    map1(y, x, n, [](float v) { return sigmoid_gate(v); });
}

// dx = dy * y * (1 - y), from the forward's output.
template <class T>
__device__ __forceinline__ void sigmoid_bwd_impl(T* dx, const T* dy, const T* y, i64 n) {
    map2(dx, dy, y, n, [](float g, float s) { return g * s * (1.f - s); });
}

// Output gate: z = pre * sigmoid(g).
template <class T>
__device__ __forceinline__ void gate_mul_fwd_impl(T* z, const T* pre, const T* g, i64 n) {
    map2(z, pre, g, n, [](float p, float q) { return p * sigmoid_gate(q); });
}

// dpre = dz * s, dg = dz * pre * s * (1 - s), s = sigmoid(g).
template <class T>
__device__ __forceinline__ void gate_mul_bwd_impl(T* dpre, T* dg, const T* dz, const T* pre, const T* g, i64 n) {
    vec4(n, [&](i64 i, int w) {
        float d[4], p[4], q[4], a[4], b[4];
        ldv(dz, i, w, d);
        ldv(pre, i, w, p);
        ldv(g, i, w, q);
        for (int k = 0; k < w; ++k) {
            const float s = sigmoid_gate(q[k]);
            a[k] = d[k] * s;
            b[k] = d[k] * p[k] * s * (1.f - s);
        }
        stv(dpre, i, w, a);
        stv(dg, i, w, b);
    });
}

template <class T>
__device__ __forceinline__ void add_impl(T* y, const T* a, const T* b, i64 n) {
    map2(y, a, b, n, [](float u, float v) { return u + v; });
}

template <class T>
__device__ __forceinline__ void add_inplace_impl(T* y, const T* x, i64 n) {
    map2(y, y, x, n, [](float u, float v) { return u + v; });
}

// out = x converted (f32 <-> the activation type), four elements a thread.
template <class O, class I>
__device__ __forceinline__ void cast_impl(O* out, const I* x, i64 n) {
    map1(out, x, n, [](float v) { return v; });
}

// SwiGLU (as crate::swiglu): gu [rows, 2I] = [gate | up], h [rows, I]. One thread per 4
// channels of a row when I % 4 == 0 (vector loads and stores), else one per (row, c); the same
// arithmetic per element either way.
template <class T>
__device__ __forceinline__ void swiglu_fwd_impl(T* h, const T* gu, int rows, int I) {
    if ((I & 3) == 0) {
        const i64 idx = flat_index() * 4;
        if (idx >= (i64)rows * I) return;
        const i64 r = idx / I, c = idx % I;
        float a[4], u[4], o[4];
        ld4(gu, r * 2 * I + c, a);
        ld4(gu, r * 2 * I + I + c, u);
        for (int k = 0; k < 4; ++k) o[k] = a[k] * sigmoid_gate(a[k]) * u[k];
        st4(h, idx, o);
        return;
    }
    const i64 idx = flat_index();
    if (idx >= (i64)rows * I) return;
    const i64 r = idx / I, c = idx % I;
    const float a = ld(gu, r * 2 * I + c), u = ld(gu, r * 2 * I + I + c);
    st(h, idx, a * sigmoid_gate(a) * u);
}

template <class T>
__device__ __forceinline__ void swiglu_bwd_impl(T* dgu, const T* dh, const T* gu, int rows, int I) {
    if ((I & 3) == 0) {
        const i64 idx = flat_index() * 4;
        if (idx >= (i64)rows * I) return;
        const i64 r = idx / I, c = idx % I;
        float a[4], u[4], g[4], da[4], du[4];
        ld4(gu, r * 2 * I + c, a);
        ld4(gu, r * 2 * I + I + c, u);
        ld4(dh, idx, g);
        for (int k = 0; k < 4; ++k) {
            const float s = sigmoid_gate(a[k]);
            da[k] = g[k] * u[k] * s * (1.f + a[k] * (1.f - s));
            du[k] = g[k] * a[k] * s;
        }
        st4(dgu, r * 2 * I + c, da);
        st4(dgu, r * 2 * I + I + c, du);
        return;
    }
    const i64 idx = flat_index();
    if (idx >= (i64)rows * I) return;
    const i64 r = idx / I, c = idx % I;
    const float a = ld(gu, r * 2 * I + c), u = ld(gu, r * 2 * I + I + c);
    const float s = sigmoid_gate(a), g = ld(dh, idx);
    st(dgu, r * 2 * I + c, g * u * s * (1.f + a * (1.f - s)));
    st(dgu, r * 2 * I + I + c, g * a * s);
}

// Forget gate (f32).
extern "C" __global__ void __launch_bounds__(256) add_bias_rows(float* x, const float* bias, i64 rows, int cols) {
    const i64 i = flat_index();
    if (i < rows * cols) x[i] += bias[i % cols];
}
extern "C" __global__ void __launch_bounds__(256) fill_rows(float* x, const float* row, i64 rows, int cols) {
    const i64 i = flat_index();
    if (i < rows * cols) x[i] = row[i % cols];
}
extern "C" __global__ void __launch_bounds__(256) log_fgate_fwd(float* a, const float* logit, i64 n) {
    map1(a, logit, n, [](float v) { return log_sigmoidf_(v); });
}
extern "C" __global__ void __launch_bounds__(256) log_fgate_bwd(float* dlogit, const float* da, const float* logit,
                                                                 i64 n) {
    map2(dlogit, da, logit, n, [](float d, float v) { return d * sigmoid_gate(-v); });
}

// ---------------------------------------------------------------------------------------------
// Embedding. Forward: one thread per element; ids outside [0, vocab) give a zero row (the host
// validates ids before they are uploaded; this only keeps a bad id from reading out of bounds).

template <class T>
__device__ __forceinline__ void embedding_fwd_impl(T* out, const T* table, const int* ids, int rows, int d, int vocab) {
    const i64 idx = flat_index();
    if (idx >= (i64)rows * d) return;
    const i64 r = idx / d, c = idx % d;
    const int id = ids[r];
    const float v = (id >= 0 && id < vocab) ? ld(table, (i64)id * d + c) : 0.f;
    st(out, idx, v);
}

// Backward: one block per distinct token (segment); its positions, in increasing order, are
// order[seg_start[s] .. seg_start[s + 1]). Each thread owns channels c = tid + k*blockDim and adds
// the rows one after the other onto dtable, the CPU reference's order.
template <class T>
__device__ __forceinline__ void embedding_bwd_impl(float* dtable, const T* dout, const int* order, const int* seg_tok,
                                                   const int* seg_start, int d) {
    const int sgi = blockIdx.x;
    const int tok = seg_tok[sgi], p0 = seg_start[sgi], p1 = seg_start[sgi + 1];
    float* dst = dtable + (i64)tok * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float s = dst[c];
        for (int p = p0; p < p1; ++p) s += ld(dout, (i64)order[p] * d + c);
        dst[c] = s;
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy, one block (512 threads) per row of f32 logits [rows, vocab]:
// loss = lse - logit[target], dlogits = weight * (softmax - onehot(target)). target < 0: loss 0,
// dlogits 0. target >= vocab: loss NaN (a visible failure, not an out-of-bounds read).

// Merge the (max, sum of exp(x - max)) pair (m2, s2) into (m, s).
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
    if (m2 == NEG_INF) return;
    if (m == NEG_INF) {
        m = m2;
        s = s2;
        return;
    }
    if (m2 > m) {
        s = s * expf(m - m2) + s2;
        m = m2;
    } else {
        s += s2 * expf(m2 - m);
    }
}

template <class T>
__device__ __forceinline__ void xent_impl(T* dlogits, float* losses, const float* logits, const int* targets,
                                          float weight, int rows, int vocab) {
    __shared__ float s_m[32], s_s[32];
    __shared__ float s_lse;
    const i64 row = blockIdx.x;
    const float* lr = logits + row * vocab;
    T* dr = dlogits + row * vocab;
    const int tgt = targets[row];
    if (tgt < 0) {
        for (int c = threadIdx.x; c < vocab; c += blockDim.x) st(dr, c, 0.f);
        if (threadIdx.x == 0) losses[row] = 0.f;
        return;
    }
    float m = NEG_INF, s = 0.f;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
        const float v = lr[c];
        if (v != v) {
            // NaN: poison the row's statistics.
            m = v;
            s = v;
            break;
        }
        ms_merge(m, s, v, 1.f);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
        if (m != m || m2 != m2) {
            m = s = __int_as_float(0x7fc00000);
        } else {
            ms_merge(m, s, m2, s2);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        s_m[warp] = m;
        s_s[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mm = NEG_INF, ss = 0.f;
        bool nan = false;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
            if (s_m[w] != s_m[w]) nan = true;
            else ms_merge(mm, ss, s_m[w], s_s[w]);
        }
        const float lse = nan ? __int_as_float(0x7fc00000) : mm + logf(ss);
        s_lse = lse;
        losses[row] = tgt < vocab ? lse - lr[tgt] : __int_as_float(0x7fc00000);
    }
    __syncthreads();
    const float lse = s_lse;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
        float g = expf(lr[c] - lse) * weight;
        if (c == tgt) g -= weight;
        st(dr, c, g);
    }
}

// ---------------------------------------------------------------------------------------------
// AdamW (as foxlm::optim::AdamW::update for one tensor), the gradient scaled by grad_scale first.
// decay = 1 - lr*weight_decay, step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t) come
// from the host. copy (or null) receives the new weight in T.

template <class T>
__device__ __forceinline__ void adamw_impl(float* w, T* copy, const float* g, float* m, float* v, i64 n, float b1,
                                           float b2, float eps, float decay, float step_size, float bc2_sqrt,
                                           float grad_scale) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = flat_index(); i < n; i += stride) {
        const float gj = g[i] * grad_scale;
        const float mj = b1 * m[i] + (1.f - b1) * gj;
        const float vj = b2 * v[i] + (1.f - b2) * gj * gj;
        m[i] = mj;
        v[i] = vj;
        const float denom = sqrtf(vj) / bc2_sqrt + eps;
        const float p = w[i] * decay - step_size * mj / denom;
        w[i] = p;
        if (copy != nullptr) st(copy, i, p);
    }
}

// Sum of squares, pass 1: a fixed grid (chosen from n alone) of 256-thread blocks, f64 partials.
extern "C" __global__ void __launch_bounds__(256) sumsq_part(double* part, const float* x, i64 n) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    double acc = 0.0;
    for (i64 i = flat_index(); i < n; i += stride) {
        const double v = (double)x[i];
        acc += v * v;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// Pass 2: one block sums the partials in a fixed order into out[slot].
extern "C" __global__ void __launch_bounds__(256) sumsq_final(float* out, int slot, const double* part, int P) {
    double s = 0.0;
    for (int p = threadIdx.x; p < P; p += blockDim.x) s += part[p];
    s = block_sum(s);
    if (threadIdx.x == 0) out[slot] = (float)s;
}

// ---------------------------------------------------------------------------------------------
// The T instantiations.

#define OPS_FOR(T, S)                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        rms_norm_fwd_##S(T* y, float* rstd, const T* x, const float* w, int rows, int dim, int groups, float eps) { \
        rms_fwd_impl<T>(y, rstd, x, w, rows, dim, groups, eps);                                                     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) rms_norm_fwd_wide_##S(                                       \
        T* y, float* rstd, T* h, const T* a, const T* b, const float* w, int dim, int groups, float eps) {         \
        norm_row<T, true>(y, rstd, h, a, b, w, blockIdx.x, dim, groups, eps);                                     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) add_rms_norm_fwd_##S(                                        \
        T* h, T* y, float* rstd, const T* a, const T* b, const float* w, int rows, int dim, float eps) {           \
        add_rms_fwd_impl<T>(h, y, rstd, a, b, w, rows, dim, eps);                                                  \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) rms_norm_bwd_dx_##S(                                         \
        T* dx, int accumulate, const T* dy, const T* x, const float* rstd, const float* w, int rows, int dim,      \
        int groups) {                                                                                              \
        rms_bwd_dx_impl<T>(dx, accumulate, dy, x, rstd, w, rows, dim, groups);                                     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) rms_norm_bwd_fused_##S(                                      \
        float* part, T* dx, int accumulate, const T* dy, const T* x, const float* rstd, const float* w, int rows,  \
        int dim, int groups, int R) {                                                                              \
        rms_bwd_fused_impl<T>(part, dx, accumulate, dy, x, rstd, w, rows, dim, groups, R);                         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) rms_norm_dw_part_##S(                                        \
        float* part, const T* dy, const T* x, const float* rstd, int rows, int dim, int groups, int R) {           \
        rms_dw_part_impl<T>(part, dy, x, rstd, rows, dim, groups, R);                                              \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) kv_shift_fwd_##S(T* out, const T* x, const T* alpha,         \
                                                                       const int* start, int B, int Tn, int H,     \
                                                                       int D) {                                    \
        kv_shift_fwd_impl<T>(out, x, alpha, start, B, Tn, H, D);                                                   \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) kv_shift_bwd_##S(                                            \
        T* dx, T* dalpha, const T* dout, const T* x, const T* alpha, const int* start, int B, int Tn, int H,       \
        int D) {                                                                                                   \
        kv_shift_bwd_impl<T>(dx, dalpha, dout, x, alpha, start, B, Tn, H, D);                                      \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        rope_apply_##S(T* x, const int* pos, int rows, int H, int D, double base, int inverse) {                   \
        rope_impl<T>(x, pos, rows, H, D, base, inverse);                                                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) sigmoid_fwd_##S(T* y, const T* x, i64 n) {                   \
        sigmoid_fwd_impl<T>(y, x, n);                                                                              \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) sigmoid_bwd_##S(T* dx, const T* dy, const T* y, i64 n) {     \
        sigmoid_bwd_impl<T>(dx, dy, y, n);                                                                         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) gate_mul_fwd_##S(T* z, const T* pre, const T* g, i64 n) {    \
        gate_mul_fwd_impl<T>(z, pre, g, n);                                                                        \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        gate_mul_bwd_##S(T* dpre, T* dg, const T* dz, const T* pre, const T* g, i64 n) {                           \
        gate_mul_bwd_impl<T>(dpre, dg, dz, pre, g, n);                                                             \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) swiglu_fwd_##S(T* h, const T* gu, int rows, int I) {         \
        swiglu_fwd_impl<T>(h, gu, rows, I);                                                                        \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        swiglu_bwd_##S(T* dgu, const T* dh, const T* gu, int rows, int I) {                                        \
        swiglu_bwd_impl<T>(dgu, dh, gu, rows, I);                                                                  \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) add_##S(T* y, const T* a, const T* b, i64 n) {               \
        add_impl<T>(y, a, b, n);                                                                                   \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) add_inplace_##S(T* y, const T* x, i64 n) {                   \
        add_inplace_impl<T>(y, x, n);                                                                              \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) cast_from_f32_##S(T* out, const float* x, i64 n) {           \
        cast_impl<T, float>(out, x, n);                                                                            \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) cast_to_f32_##S(float* out, const T* x, i64 n) {             \
        cast_impl<float, T>(out, x, n);                                                                            \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        embedding_fwd_##S(T* out, const T* table, const int* ids, int rows, int d, int vocab) {                    \
        embedding_fwd_impl<T>(out, table, ids, rows, d, vocab);                                                    \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) embedding_bwd_##S(                                           \
        float* dtable, const T* dout, const int* order, const int* seg_tok, const int* seg_start, int d) {         \
        embedding_bwd_impl<T>(dtable, dout, order, seg_tok, seg_start, d);                                         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(512) cross_entropy_##S(                                           \
        T* dlogits, float* losses, const float* logits, const int* targets, float weight, int rows, int vocab) {   \
        xent_impl<T>(dlogits, losses, logits, targets, weight, rows, vocab);                                       \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        adamw_##S(float* w, T* copy, const float* g, float* m, float* v, i64 n, float b1, float b2, float eps,     \
                  float decay, float step_size, float bc2_sqrt, float grad_scale) {                                \
        adamw_impl<T>(w, copy, g, m, v, n, b1, b2, eps, decay, step_size, bc2_sqrt, grad_scale);                   \
    }

OPS_FOR(float, f32)
OPS_FOR(bf16, bf16)
