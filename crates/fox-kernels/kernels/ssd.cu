// Mamba-2's SSD and its companions on the GPU, f32 in and out with f32 state and accumulation:
// the twins of crate::ssd, crate::conv1d and crate::rms_norm_gated (layouts as documented there).
// Deterministic: no atomics; every sum runs in a fixed order.

#define SSD_L 64      // chunk length (crate::ssd::CHUNK)
#define SSD_NMAX 128  // largest state size N the forward's shared tiles hold
#define SSD_SROW 129  // state row stride in shared memory: 16 rows of one column fall in 16 banks

__device__ __forceinline__ float ssd_silu(float x) { return x / (1.0f + __expf(-x)); }

// Causal depthwise conv1d (+SiLU), one thread per output (b, t, c). x rows of stride x_stride;
// w [C, W]; bias [C] or null; start [B] or null (positions before start[b] are 0 in and out);
// prev [B, W-1, C] or null (inputs before position 0, read only where start[b] == 0).
extern "C" __global__ void ssd_conv1d_fwd_f32(float* out, const float* x, long x_stride, const float* w,
                                              const float* bias, const int* start, const float* prev, int B,
                                              int T, int C, int W, int silu) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * T * C) return;
    int c = (int)(i % C);
    long bt = i / C;
    int t = (int)(bt % T), b = (int)(bt / T);
    int s = start ? start[b] : 0;
    if (t < s) {
        out[i] = 0.0f;
        return;
    }
    float acc = bias ? bias[c] : 0.0f;
    for (int k = 0; k < W; ++k) {
        int pos = t - (W - 1) + k;
        float v = 0.0f;
        if (pos >= 0) {
            if (pos >= s) v = x[((long)b * T + pos) * x_stride + c];
        } else if (s == 0 && prev) {
            v = prev[((long)b * (W - 1) + (W - 1 + pos)) * C + c];
        }
        acc += w[c * W + k] * v;
    }
    out[i] = silu ? ssd_silu(acc) : acc;
}

// C Bᵀ of every (batch row, group, chunk): cb [B, G, nch, L, L], one block of 256 threads per
// chunk, each thread 16 entries (row (tid / 64) * 16 + k, column tid % 64), k-sum in order over N.
extern "C" __global__ void __launch_bounds__(256) ssd_cb_f32(float* cb, const float* xbc, long stride, int B,
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
                const float* row = xbc + ((long)b * T + t0 + r) * stride;
                cv = row[co + n0 + n];
                bv = row[bo + n0 + n];
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

extern "C" __global__ void __launch_bounds__(256)
    ssd_chunk_state_f32(float* states, float* decay, const float* xbc, long stride, const float* dt,
                        const float* A, const int* start, int B, int T, int H, int P, int N, int G, int nch) {
    extern __shared__ float sm[];
    float* Xw = sm;                          // [L][PMAX]
    float* Bs = Xw + SSD_L * SSD_PMAX;       // [L][NMAX]
    float* cum = Bs + SSD_L * SSD_NMAX;      // [L]
    float* dtm = cum + SSD_L;                // [L]
    int idx = blockIdx.x;
    int c = idx % nch, bh = idx / nch, h = bh % H, b = bh / H;
    int g = h / (H / G);
    int t0 = c * SSD_L, len = min(SSD_L, T - t0);
    int st = start ? start[b] : 0;
    int tid = threadIdx.x;
    ssd_chunk_cum(dtm, cum, dt, A[h], b, h, T, H, t0, len, st);
    float last = cum[len - 1];
    long rowbase = ((long)b * T + t0) * stride;
    for (int i = tid; i < SSD_L * SSD_NMAX; i += 256) {
        int r = i / SSD_NMAX, n = i % SSD_NMAX;
        Bs[i] = (r < len && n < N) ? xbc[rowbase + (long)r * stride + (long)H * P + (long)g * N + n] : 0.0f;
    }
    for (int i = tid; i < SSD_L * SSD_PMAX; i += 256) {
        int r = i / SSD_PMAX, p = i % SSD_PMAX;
        float v = 0.0f;
        if (r < len && p < P) v = __expf(last - cum[r]) * dtm[r] * xbc[rowbase + (long)r * stride + (long)h * P + p];
        Xw[i] = v;
    }
    __syncthreads();
    // Thread tile: rows p0 .. p0 + 7, columns n = lane + 32 q.
    int lane = tid % 32, p0 = (tid / 32) * 8;
    float acc[8][4];
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[k][q] = 0.0f;
    for (int j = 0; j < len; ++j) {
        float bv[4], xv[8];
#pragma unroll
        for (int q = 0; q < 4; ++q) bv[q] = Bs[j * SSD_NMAX + lane + 32 * q];
#pragma unroll
        for (int k = 0; k < 8; ++k) xv[k] = Xw[j * SSD_PMAX + p0 + k];
#pragma unroll
        for (int k = 0; k < 8; ++k)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[k][q] += xv[k] * bv[q];
    }
    float* dst = states + (long)idx * P * N;
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int p = p0 + k, n = lane + 32 * q;
            if (p < P && n < N) dst[(long)p * N + n] = acc[k][q];
        }
    if (tid == 0) decay[idx] = __expf(last);
}

// One thread per state element e of (b, h): S_0 = init (or 0); for each chunk c, S_c replaces
// ΔS_c and S_{c+1} = decay_c · S_c + ΔS_c; fin gets S_nch.
extern "C" __global__ void ssd_state_pass_f32(float* states, float* fin, const float* init, const float* decay,
                                              int BH, int PN, int nch) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)BH * PN) return;
    long bh = i / PN, e = i % PN;
    float s = init ? init[i] : 0.0f;
    float* p = states + bh * nch * PN + e;
    const float* d = decay + bh * nch;
#pragma unroll 8
    for (int c = 0; c < nch; ++c) {
        float ds = p[(long)c * PN];
        p[(long)c * PN] = s;
        s = d[c] * s + ds;
    }
    if (fin) fin[i] = s;
}

extern "C" __global__ void __launch_bounds__(256)
    ssd_chunk_scan_f32(float* y, const float* xbc, long stride, const float* dt, const float* A, const float* D,
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
    int c = idx % nch, bh = idx / nch, h = bh % H, b = bh / H;
    int g = h / (H / G);
    int t0 = c * SSD_L, len = min(SSD_L, T - t0);
    int st = start ? start[b] : 0;
    int tid = threadIdx.x;
    long HP = (long)H * P;
    long rowbase = ((long)b * T + t0) * stride;
    const float* sc = states + (long)idx * P * N;
    for (int i = tid; i < SSD_L * SSD_NMAX; i += 256) {
        int r = i / SSD_NMAX, n = i % SSD_NMAX;
        Cs[i] = (r < len && n < N) ? xbc[rowbase + (long)r * stride + HP + (long)G * N + (long)g * N + n] : 0.0f;
    }
    for (int i = tid; i < SSD_L * SSD_PMAX; i += 256) {
        int r = i / SSD_PMAX, p = i % SSD_PMAX;
        Xs[i] = (r < len && p < P) ? xbc[rowbase + (long)r * stride + (long)h * P + p] : 0.0f;
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
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[k][q] = acc2[k][q] = 0.0f;
    // M is lower-triangular: rows up to r0 + 3 need j ≤ r0 + 3.
    int jend = min(r0 + 4, SSD_L);
    for (int j = 0; j < jend; ++j) {
        float mv[4], xv[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) mv[k] = M[(r0 + k) * (SSD_L + 1) + j];
#pragma unroll
        for (int q = 0; q < 4; ++q) xv[q] = Xs[j * SSD_PMAX + pl + 16 * q];
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[k][q] += mv[k] * xv[q];
    }
    for (int n = 0; n < N; ++n) {
        float cv[4], sv[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) cv[k] = Cs[(r0 + k) * SSD_NMAX + n];
#pragma unroll
        for (int q = 0; q < 4; ++q) sv[q] = S[(pl + 16 * q) * SSD_SROW + n];
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc2[k][q] += cv[k] * sv[q];
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
            y[((long)b * T + t) * HP + (long)h * P + p] = o;
        }
    }
}

// One decoding step: state [B, H, P, N] updated in place, y [B, H·P]; xbc [B, stride], dt [B, H].
// One block of 256 threads per (b, h); warp w handles rows p = w, w + 8, ...; lanes split N and
// reduce y with a fixed shuffle tree. start [B] or null: a row with start[b] > 0 is padding.
extern "C" __global__ void __launch_bounds__(256)
    ssd_decode_f32(float* state, float* y, const float* xbc, long stride, const float* dt, const float* A,
                   const float* D, const int* start, int H, int P, int N, int G) {
    int bh = blockIdx.x, h = bh % H, b = bh / H;
    int g = h / (H / G);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float* row = xbc + (long)b * stride;
    const float* x = row + (long)h * P;
    const float* bv = row + (long)H * P + (long)g * N;
    const float* cv = bv + (long)G * N;
    bool pad = start && start[b] > 0;
    float dtv = dt[bh], decay = __expf(dtv * A[h]);
    for (int p = warp; p < P; p += 8) {
        float* s = state + ((long)bh * P + p) * N;
        float xv = dtv * x[p];
        float acc = 0.0f;
        if (!pad) {
            for (int n = lane; n < N; n += 32) {
                float v = decay * s[n] + xv * bv[n];
                s[n] = v;
                acc += v * cv[n];
            }
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) y[(long)bh * P + p] = pad ? 0.0f : acc + D[h] * x[p];
    }
}

// Gated RMSNorm forward: y = (x ⊙ silu(z)) · rstd · w over rows of dim; one block of 256 threads
// per row, the sum of squares by a fixed tree. x, y [rows, dim]; z rows of stride z_stride.
extern "C" __global__ void __launch_bounds__(256)
    ssd_rms_norm_gated_fwd_f32(float* y, float* rstd, const float* x, const float* z, long z_stride,
                               const float* w, int dim, float eps) {
    __shared__ float red[256];
    long r = blockIdx.x;
    const float* xr = x + r * dim;
    const float* zr = z + r * z_stride;
    float* yr = y + r * dim;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < dim; k += 256) {
        float gv = xr[k] * ssd_silu(zr[k]);
        yr[k] = gv;
        ss += gv * gv;
    }
    red[threadIdx.x] = ss;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    float s = rsqrtf(red[0] / dim + eps);
    if (threadIdx.x == 0) rstd[r] = s;
    for (int k = threadIdx.x; k < dim; k += 256) yr[k] = yr[k] * s * w[k];
}
