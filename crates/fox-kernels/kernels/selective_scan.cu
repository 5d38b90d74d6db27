// Mamba's selective scan, the CUDA twin of crate::selective_scan (read its module comment for the
// recurrence and the layouts). Compiled by NVRTC after elem.cuh (no other headers).
//
// Thread layout of every kernel here: a block of 256 threads holds 16 channels × 16 states;
// thread (g, n) = (threadIdx.x / 16, threadIdx.x % 16) owns h[b, d, n] of channel
// d = blockIdx.x·16 + g of batch row b = blockIdx.y, in a register. So N ≤ 16 (lanes n ≥ N keep a
// zero state and add nothing). B·Di·16 threads run the recurrence side by side, each one
// sequential in time; the sums over n (y, and dδ, du in the backward) are 16-lane butterflies of
// shuffles, whose result has the same bits in every lane (each step adds a pair in both orders,
// and float addition is commutative).
//
// The forward saves h at the start of every 64 positions ([B, ceil(T/64), Di, N], the CPU
// layout, so the check compares them). The backward walks the chunks in reverse, each in two
// halves of 32 (second half first): it recomputes the half's states from the chunk's saved start
// into registers (hs[32], fully unrolled; y per channel in shared memory), then runs the half's
// reverse-time recurrence. Both read their inputs from a shared-memory stage of 32 positions
// (ScanStage below).
// dB and dC are sums over every channel: per position, the two channels of a warp add with one
// shuffle, the 8 warps of the block in order through shared memory, and a last kernel adds the
// blocks in block order: no float atomics, the same bits on every run.
//
// Positions before start[b] (left padding) and past T run with δ = u = 0 (a decay of exactly 1:
// the state and its gradient pass through unchanged) and write 0 outputs and gradients.

#define SCAN_CH 16
#define SCAN_THREADS 256
#define SCAN_CHUNK 64
#define SCAN_HALF 32

struct ScanParams {
    const void* u;      // [B, T, Di] T
    const void* delta;  // [B, T, Di] T
    const float* A;     // [Di, N]
    const void* bc;     // B_t[n] at b·sb + t·st + b_off + n, C_t[n] at … + c_off + n; T
    const float* D;     // [Di]
    const void* z;      // [B, T, Di] T in rows of stride zs, or null
    const int* start;   // [B], or null
    const float* h0;    // [B, Di, N], or null (forward); the state updated in place (decode)
    void* out;          // [B, T, Di] T
    float* saved;       // [B, K, Di, N]
    float* h_last;      // [B, Di, N], or null
    const void* dout;   // [B, T, Di] T
    void* du;           // [B, T, Di] T
    void* ddelta;       // [B, T, Di] T
    void* dz;           // as z, or null
    void* dbc;          // as bc, T
    float* dh0;         // [B, Di, N], or null
    float* part_bc;     // [blocks, B, T, 32]: per channel block, Σ dB_t (0..15), Σ dC_t (16..31)
    float* part_a;      // [B, Di, N]
    float* part_d;      // [B, Di]
    float* da;          // [Di, N], added to
    float* dd;          // [Di], added to
    long long sb, st;
    long long zs;       // row stride of z and dz (Di when contiguous)
    int b_off, c_off;
    int B, T, Di, N;
};

__device__ __forceinline__ float sum16(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v;
}

// Thread (g, n) of a block (the layout at the top): channel d of batch row b, chan = d < Di and
// live = chan && n < N.
struct ScanThread {
    int g, n, d, b;
    bool chan, live;
};
__device__ __forceinline__ ScanThread scan_thread(const ScanParams& p) {
    const int g = threadIdx.x >> 4, n = threadIdx.x & 15;
    const int d = blockIdx.x * SCAN_CH + g, b = blockIdx.y;
    const bool chan = d < p.Di;
    return {g, n, d, b, chan, chan && n < p.N};
}

__device__ __forceinline__ float scan_sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// What one position reads, zeros where it does not run (padding, past T, channels past Di).
struct ScanIn {
    float dl, u, b, c;
};

template <typename T>
__device__ __forceinline__ ScanIn scan_load(const ScanParams& p, int b, int t, int d, int n, bool real) {
    ScanIn x = {0.f, 0.f, 0.f, 0.f};
    if (real) {
        const long long row = ((long long)b * p.T + t) * p.Di + d;
        x.dl = ld((const T*)p.delta, row);
        x.u = ld((const T*)p.u, row);
        if (n < p.N) {
            const long long r = b * p.sb + t * p.st;
            x.b = ld((const T*)p.bc, r + p.b_off + n);
            x.c = ld((const T*)p.bc, r + p.c_off + n);
        }
    }
    return x;
}

// A block's inputs for SCAN_HALF positions, staged in shared memory: every load of a group is
// issued at once (cooperatively, 16 consecutive channels of a row together) instead of one
// position at a time inside the recurrence, where each position's loads waited for the last
// one's stores (the compiler cannot tell the buffers apart) and the scan ran at global-memory
// latency per step (docs/kernel-notes.md has the measurement).
struct ScanStage {
    float dl[SCAN_HALF * SCAN_CH], u[SCAN_HALF * SCAN_CH], z[SCAN_HALF * SCAN_CH], go[SCAN_HALF * SCAN_CH];
    float y[SCAN_HALF * SCAN_CH];  // y of each (position, channel), written by the recurrence
    float bc[SCAN_HALF * 32];      // B_t (0..15), C_t (16..31)
};

// One thread's share of a stage, in registers (loads in flight while the block computes).
struct ScanFetch {
    float dl[2], u[2], z[2], go[2], bc[4];
};

// Entry e of a [position][channel] array is (e / 16, e % 16); of bc, (e / 32, e % 32). Values are
// 0 where the position does not run (padding, past T, channels past Di, states past N).
template <typename T>
__device__ __forceinline__ void scan_fetch(ScanFetch& f, const ScanParams& p, int b, int s, int t0, bool grads) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int e = threadIdx.x + k * SCAN_THREADS, t = t0 + (e >> 4), d = blockIdx.x * SCAN_CH + (e & 15);
        const bool ok = d < p.Di && t < p.T && t >= s;
        const long long row = ((long long)b * p.T + t) * p.Di + d;
        f.dl[k] = ok ? ld((const T*)p.delta, row) : 0.f;
        f.u[k] = ok ? ld((const T*)p.u, row) : 0.f;
        f.z[k] = (ok && p.z) ? ld((const T*)p.z, ((long long)b * p.T + t) * p.zs + d) : 0.f;
        f.go[k] = (ok && grads) ? ld((const T*)p.dout, row) : 0.f;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int e = threadIdx.x + k * SCAN_THREADS, t = t0 + (e >> 5), c = e & 31, n = c & 15;
        const bool ok = t < p.T && t >= s && n < p.N;
        f.bc[k] = ok ? ld((const T*)p.bc, b * p.sb + t * p.st + (c < 16 ? p.b_off : p.c_off) + n) : 0.f;
    }
}

__device__ __forceinline__ void scan_put(ScanStage& sm, const ScanFetch& f) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int e = threadIdx.x + k * SCAN_THREADS;
        sm.dl[e] = f.dl[k];
        sm.u[e] = f.u[k];
        sm.z[e] = f.z[k];
        sm.go[e] = f.go[k];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) sm.bc[threadIdx.x + k * SCAN_THREADS] = f.bc[k];
}

template <typename T>
__device__ void scan_fwd(const ScanParams& p) {
    __shared__ ScanStage sm;
    const auto [g, n, d, b, chan, live] = scan_thread(p);
    const int K = (p.T + SCAN_CHUNK - 1) / SCAN_CHUNK;
    const int s = p.start ? min(p.start[b], p.T) : 0;
    const long long hi = ((long long)b * p.Di + d) * p.N + n;
    float h = (live && p.h0) ? p.h0[hi] : 0.f;
    const float a = live ? p.A[d * p.N + n] : 0.f;
    const float dsk = chan ? p.D[d] : 0.f;
    ScanFetch f;
    scan_fetch<T>(f, p, b, s, 0, false);
    for (int t0 = 0; t0 < p.T; t0 += SCAN_HALF) {
        __syncthreads();  // the last group's outputs are read
        scan_put(sm, f);
        __syncthreads();
        if (t0 + SCAN_HALF < p.T) scan_fetch<T>(f, p, b, s, t0 + SCAN_HALF, false);
        if (t0 % SCAN_CHUNK == 0 && live) p.saved[(((long long)b * K + t0 / SCAN_CHUNK) * p.Di + d) * p.N + n] = h;
#pragma unroll 8
        for (int i = 0; i < SCAN_HALF; ++i) {
            const float dl = sm.dl[i * SCAN_CH + g], uu = sm.u[i * SCAN_CH + g];
            h = __expf(dl * a) * h + (dl * uu) * sm.bc[i * 32 + n];
            const float y = sum16(h * sm.bc[i * 32 + 16 + n]) + dsk * uu;
            if (n == 0) sm.y[i * SCAN_CH + g] = y;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int e = threadIdx.x + k * SCAN_THREADS, t = t0 + (e >> 4), dd = blockIdx.x * SCAN_CH + (e & 15);
            if (dd < p.Di && t < p.T) {
                const float y = sm.y[e], zz = sm.z[e];
                float o = 0.f;
                if (t >= s) o = p.z ? y * (zz * scan_sigmoid(zz)) : y;
                st((T*)p.out, ((long long)b * p.T + t) * p.Di + dd, o);
            }
        }
    }
    if (live && p.h_last) p.h_last[hi] = h;
}

// Loads the stage of positions t0.. into shared memory (loads issued before the barrier).
template <typename T>
__device__ __forceinline__ void scan_stage(ScanStage& sm, const ScanParams& p, int b, int s, int t0) {
    ScanFetch f;
    scan_fetch<T>(f, p, b, s, t0, true);
    __syncthreads();  // everyone is done with the last stage (and with red)
    scan_put(sm, f);
    __syncthreads();
}

template <typename T>
__device__ void scan_bwd(const ScanParams& p) {
    __shared__ ScanStage sm;
    __shared__ float red[SCAN_THREADS / 32][SCAN_HALF][32];
    const auto [g, n, d, b, chan, live] = scan_thread(p);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int K = (p.T + SCAN_CHUNK - 1) / SCAN_CHUNK;
    const int s = p.start ? min(p.start[b], p.T) : 0;
    const long long hi = ((long long)b * p.Di + d) * p.N + n;
    const float a = live ? p.A[d * p.N + n] : 0.f;
    const float dsk = chan ? p.D[d] : 0.f;
    float dh = 0.f, da = 0.f, dd = 0.f;
    for (int k = K - 1; k >= 0; --k) {
        const int c0 = k * SCAN_CHUNK;
        const float hstart = live ? p.saved[(((long long)b * K + k) * p.Di + d) * p.N + n] : 0.f;
        for (int half = 1; half >= 0; --half) {
            const int t0 = c0 + half * SCAN_HALF;
            if (t0 >= p.T) continue;  // the same for the whole block
            float h = hstart;
            if (half == 1) {
                // The state at the chunk's midpoint, from its start.
                scan_stage<T>(sm, p, b, s, c0);
#pragma unroll 8
                for (int i = 0; i < SCAN_HALF; ++i) {
                    const float dl = sm.dl[i * SCAN_CH + g];
                    h = __expf(dl * a) * h + (dl * sm.u[i * SCAN_CH + g]) * sm.bc[i * 32 + n];
                }
            }
            scan_stage<T>(sm, p, b, s, t0);
            const float hin = h;
            float hs[SCAN_HALF];
#pragma unroll
            for (int i = 0; i < SCAN_HALF; ++i) {
                const float dl = sm.dl[i * SCAN_CH + g], uu = sm.u[i * SCAN_CH + g];
                h = __expf(dl * a) * h + (dl * uu) * sm.bc[i * 32 + n];
                hs[i] = h;
                const float y = sum16(h * sm.bc[i * 32 + 16 + n]) + dsk * uu;
                if (n == 0) sm.y[i * SCAN_CH + g] = y;
            }
            __syncwarp();  // y of a channel is read by the 16 lanes of its own warp
#pragma unroll
            for (int i = SCAN_HALF - 1; i >= 0; --i) {
                const int t = t0 + i;
                const bool in = chan && t < p.T, real = in && t >= s;
                const long long row = ((long long)b * p.T + t) * p.Di + d;
                const int e = i * SCAN_CH + g;
                const float dl = sm.dl[e], uu = sm.u[e], go = sm.go[e];
                const float bn = sm.bc[i * 32 + n], cn = sm.bc[i * 32 + 16 + n];
                float dy = go;
                if (p.z) {
                    // dz = dout·y·SiLU'(z), SiLU'(z) = σ(z)·(1 + z·(1 − σ(z))); dy = dout·SiLU(z).
                    const float zz = sm.z[e];
                    const float sg = scan_sigmoid(zz);
                    const float dzv = go * sm.y[e] * (sg * (1.f + zz * (1.f - sg)));
                    dy = go * (zz * sg);
                    if (in && n == 0) st((T*)p.dz, ((long long)b * p.T + t) * p.zs + d, real ? dzv : 0.f);
                }
                dd += dy * uu;
                const float hp = i ? hs[i - 1] : hin;
                const float ex = __expf(dl * a);
                dh += dy * cn;
                const float vc = dy * hs[i];
                const float vb = dh * (dl * uu);
                const float ge = dh * hp * ex;
                da += ge * dl;
                const float sa = sum16(ge * a);
                const float sbv = sum16(dh * bn);
                dh *= ex;
                if (in && n == 0) {
                    st((T*)p.du, row, real ? sbv * dl + dy * dsk : 0.f);
                    st((T*)p.ddelta, row, real ? sa + sbv * uu : 0.f);
                }
                const float wb = vb + __shfl_xor_sync(0xffffffffu, vb, 16);
                const float wc = vc + __shfl_xor_sync(0xffffffffu, vc, 16);
                if (lane < 16) {
                    red[warp][i][lane] = wb;
                    red[warp][i][16 + lane] = wc;
                }
            }
            __syncthreads();
            for (int j = threadIdx.x; j < SCAN_HALF * 32; j += SCAN_THREADS) {
                const int i = j >> 5, c = j & 31, t = t0 + i;
                float sum = 0.f;
#pragma unroll
                for (int w = 0; w < SCAN_THREADS / 32; ++w) sum += red[w][i][c];
                if (t < p.T) p.part_bc[(((long long)blockIdx.x * p.B + b) * p.T + t) * 32 + c] = sum;
            }
        }
    }
    if (live) {
        if (p.dh0) p.dh0[hi] = dh;
        p.part_a[hi] = da;
    }
    if (chan && n == 0) p.part_d[(long long)b * p.Di + d] = dd;
}

// dB, dC: the channel blocks' sums added in block order; one thread per (b, t, c).
template <typename T>
__device__ void scan_bwd_bc(const ScanParams& p, int blocks) {
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= (long long)p.B * p.T * 32) return;
    const int c = (int)(j & 31), n = c & 15;
    if (n >= p.N) return;
    const long long bt = j >> 5;
    const int b = (int)(bt / p.T), t = (int)(bt % p.T);
    float sum = 0.f;
    for (int k = 0; k < blocks; ++k) sum += p.part_bc[((long long)k * p.B * p.T + bt) * 32 + c];
    st((T*)p.dbc, b * p.sb + t * p.st + (c < 16 ? p.b_off : p.c_off) + n, sum);
}

// dA += Σ_b, dD += Σ_b, batch rows in order; one thread per (d, n) and per d.
__device__ void scan_bwd_params(const ScanParams& p) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int dn = p.Di * p.N;
    if (j < dn) {
        float sum = 0.f;
        for (int b = 0; b < p.B; ++b) sum += p.part_a[(long long)b * dn + j];
        p.da[j] += sum;
    } else if (j < dn + p.Di) {
        const int d = j - dn;
        float sum = 0.f;
        for (int b = 0; b < p.B; ++b) sum += p.part_d[(long long)b * p.Di + d];
        p.dd[d] += sum;
    }
}

// One token per batch row (T = 1): the state h_last [B, Di, N] is read and updated in place,
// as the forward's step does; a row with start[b] ≥ 1 is padding: state kept, output 0.
template <typename T>
__device__ void scan_decode(const ScanParams& p) {
    const auto [g, n, d, b, chan, live] = scan_thread(p);
    const bool real = chan && !(p.start && p.start[b] > 0);
    const long long hi = ((long long)b * p.Di + d) * p.N + n;
    float h = live ? p.h_last[hi] : 0.f;
    const float a = live ? p.A[d * p.N + n] : 0.f;
    const ScanIn x = scan_load<T>(p, b, 0, d, n, real);
    h = __expf(x.dl * a) * h + (x.dl * x.u) * x.b;
    const float y = sum16(h * x.c) + (chan ? p.D[d] : 0.f) * x.u;
    if (live) p.h_last[hi] = h;
    if (chan && n == 0) {
        const long long row = (long long)b * p.Di + d;
        float o = 0.f;
        if (real && p.z) {
            const float zz = ld((const T*)p.z, (long long)b * p.zs + d);
            o = y * (zz * scan_sigmoid(zz));
        } else if (real) {
            o = y;
        }
        st((T*)p.out, row, o);
    }
}

#define SCAN_FOR(NAME, T)                                                                                  \
    extern "C" __global__ void __launch_bounds__(SCAN_THREADS) fox_scan_fwd_##NAME(ScanParams p) {         \
        scan_fwd<T>(p);                                                                                    \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(SCAN_THREADS, 2) fox_scan_bwd_##NAME(ScanParams p) {      \
        scan_bwd<T>(p);                                                                                    \
    }                                                                                                      \
    extern "C" __global__ void fox_scan_bwd_bc_##NAME(ScanParams p, int blocks) { scan_bwd_bc<T>(p, blocks); } \
    extern "C" __global__ void __launch_bounds__(SCAN_THREADS) fox_scan_decode_##NAME(ScanParams p) {      \
        scan_decode<T>(p);                                                                                 \
    }

SCAN_FOR(f32, float)
SCAN_FOR(bf16, u16)

extern "C" __global__ void fox_scan_bwd_params(ScanParams p) { scan_bwd_params(p); }
