// Decoding with a KV cache on the GPU: appending a chunk to a layer's cache, the cache's part in
// KV-shift and in the gate prefix sum, gathering each row's last position, and choosing the next
// token (greedy, or temperature / top-k / top-p sampling) without a copy of the logits to the
// host. Compiled by NVRTC after elem.cuh (no other headers).
//
// The cache of a layer: k, v [B, Hkv, cap, D] (activation dtype; Hkv < H with grouped-query
// attention), c [B, H, cap] (f32: the gate is per query head), and the last unmixed k~, v~ of each
// row [B, Hkv*D] for KV-shift. Chunks are [B, t, Hkv, D] (k, v projections) and [B, H, t] (gate
// sums). A sliding window keeps the whole history: the attention kernels mask keys outside it.
// Where a kernel takes `lenp`, the cached length is read from the device (so that a captured CUDA
// graph replays every decode step); otherwise from `len`.

typedef unsigned long long u64;

__device__ __forceinline__ int cached_len(const int* lenp, int len) { return lenp != nullptr ? *lenp : len; }

#define GRID_LOOP(i, n) \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// k, v [B, t, Hkv, D] -> cache [B, Hkv, cap, D] at the cached length; c [B, H, t] -> [B, H, cap]
// (two loops: k, v and c have different head counts under grouped-query attention).
template <typename T>
__device__ void cache_append(T* kc, T* vc, float* cc, const T* k, const T* v, const float* c, int B, int t, int H,
                             int Hkv, int D, int cap, const int* lenp, int len0) {
    const int len = cached_len(lenp, len0);
    GRID_LOOP(i, (long long)B * t * Hkv * D) {
        const int d = (int)(i % D);
        const int h = (int)((i / D) % Hkv);
        const int ti = (int)((i / ((long long)D * Hkv)) % t);
        const long long b = i / ((long long)D * Hkv * t);
        const long long row = (b * Hkv + h) * cap + len + ti;
        kc[row * D + d] = k[i];
        vc[row * D + d] = v[i];
    }
    GRID_LOOP(i, (long long)B * H * t) {
        const long long bh = i / t;
        cc[bh * cap + len + i % t] = c[i];
    }
}

// KV-shift at a chunk's first position continues the cached sequence: out[b, 0] = a * prev[b] +
// (1 - a) * x[b, 0] (the chunk kernel, run without left padding, wrote (1 - a) * x[b, 0] there).
// H here is the k/v heads' count (the shift gates are per k/v head).
template <typename T>
__device__ void kv_shift_prev(T* out, const T* x, const T* alpha, const T* prev, int B, int t, int H, int D,
                              const int* lenp, int len0) {
    if (cached_len(lenp, len0) == 0) return;
    GRID_LOOP(i, (long long)B * H * D) {
        const long long b = i / ((long long)H * D);
        const int hd = (int)(i % ((long long)H * D));
        const long long pos = b * t * H * D + hd;  // row b, position 0
        const float a = ld(alpha, b * t * H + hd / D);
        st(out, pos, a * ld(prev, i) + (1.f - a) * ld(x, pos));
    }
}

// The chunk's gate prefix sums continue the cache's: c[bh, :] += cc[bh, len - 1].
__device__ void cache_c_offset(float* c, const float* cc, int BH, int t, int cap, const int* lenp, int len0) {
    const int len = cached_len(lenp, len0);
    if (len == 0) return;
    GRID_LOOP(i, (long long)BH * t) {
        const long long bh = i / t;
        c[i] += cc[bh * cap + len - 1];
    }
}

// dst [B, w] = src [B, t, w] at position t - 1 (the last unmixed k~, v~; the last hidden state).
template <typename T>
__device__ void last_rows(T* dst, const T* src, int B, int t, int w) {
    GRID_LOOP(i, (long long)B * w) {
        const long long b = i / w;
        dst[i] = src[(b * t + t - 1) * w + i % w];
    }
}

// Many device-to-device copies in one launch (serving: a newcomer's cache rows into its slot, a
// relocation): run r copies runs[r].bytes from runs[r].src to runs[r].dst, one block per run (the
// grid strides over them), 16 bytes a thread where the run allows, else bytes. One driver call
// per run cost about as much as the prefill the runs come from.
struct CopyRun {
    unsigned long long src, dst, bytes;
};
extern "C" __global__ void __launch_bounds__(256) fox_copy_runs(const CopyRun* runs, int n) {
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const CopyRun c = runs[r];
        if (((c.src | c.dst | c.bytes) & 15) == 0) {
            const uint4* s = (const uint4*)c.src;
            uint4* d = (uint4*)c.dst;
            for (unsigned long long i = threadIdx.x; i < c.bytes / 16; i += blockDim.x) d[i] = s[i];
        } else {
            const unsigned char* s = (const unsigned char*)c.src;
            unsigned char* d = (unsigned char*)c.dst;
            for (unsigned long long i = threadIdx.x; i < c.bytes; i += blockDim.x) d[i] = s[i];
        }
    }
}

// Scoring (echo + logprobs) on the device: per row of logits [rows, ld], the log-probability of
// the row's target token (NaN for a target outside the vocabulary) and the k most likely tokens
// with theirs, in the host's order (larger logit first, then smaller id). One 256-thread block per
// row. One pass over the row gives its log-sum-exp (an online max and sum) and its most likely
// token together, so k = 1 (what lm-evaluation-harness asks) reads the logits once; each further
// token is one more pass, a block-wide arg-max over the tokens ranked after the last one chosen.
// Only (1 + 2k) numbers a position go to the host instead of the vocabulary's logits.
#define LP_INF __int_as_float(0x7f800000)
// e^(m − M) for a running max m under the new max M ≥ m (0 for an empty sum's m = −∞).
__device__ __forceinline__ float lp_rescale(float m, float M) { return m == -LP_INF ? 0.f : expf(m - M); }
// Folds (om, os, oi) into (m, s, i): max, sum of e^(x − max), the first index of the max.
__device__ __forceinline__ void lp_fold(float& m, float& s, int& i, float om, float os, int oi) {
    const float M = fmaxf(m, om);
    s = s * lp_rescale(m, M) + os * lp_rescale(om, M);
    if (ranks_before(om, oi, m, i)) i = oi;
    m = M;
}
extern "C" __global__ void __launch_bounds__(256) fox_token_logprobs(const float* logits, int ld, int V,
                                                                     const int* targets, int k, float* lp,
                                                                     int* top_i, float* top_lp) {
    __shared__ float shv[8], shs[8];
    __shared__ int shi[8];
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const float* x = logits + (long long)row * ld;
    // This thread's tokens in increasing order: a strictly larger logit moves the max, so ties keep
    // the first index.
    float m = -LP_INF, s = 0.f;
    int bi = 0x7fffffff;
    for (int i = tid; i < V; i += 256) {
        const float v = x[i];
        if (v > m) {
            s = s * lp_rescale(m, v) + 1.f;
            m = v;
            bi = i;
        } else if (v > -LP_INF) {
            s += expf(v - m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        lp_fold(m, s, bi, om, os, oi);
    }
    if (lane == 0) {
        shv[w] = m;
        shs[w] = s;
        shi[w] = bi;
    }
    __syncthreads();
    m = shv[0];
    s = shs[0];
    bi = shi[0];
    for (int j = 1; j < 8; ++j) lp_fold(m, s, bi, shv[j], shs[j], shi[j]);
    const float lse = m + logf(s);
    if (tid == 0) {
        const int t = targets[row];
        lp[row] = (t >= 0 && t < V) ? x[t] - lse : __int_as_float(0x7fc00000);
        if (k > 0) {
            top_i[(long long)row * k] = bi;
            top_lp[(long long)row * k] = m - lse;
        }
    }
    float pv = m;
    int pi = bi;
    for (int j = 1; j < k; ++j) {
        float bv = -LP_INF;
        int bj = 0x7fffffff;
        for (int i = tid; i < V; i += 256) {
            const float v = x[i];
            if (ranks_before(pv, pi, v, i) && ranks_before(v, i, bv, bj)) {
                bv = v;
                bj = i;
            }
        }
        block_argmax<8>(bv, bj, shv, shi);
        if (tid == 0) {
            top_i[(long long)row * k + j] = bj;
            top_lp[(long long)row * k + j] = bv - lse;
        }
        pv = bv;
        pi = bj;
    }
}

// Advances the device-side cached length and RoPE positions by one (the end of a decode step).
extern "C" __global__ void fox_decode_advance(int* lenp, int* positions, int B) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < B) positions[i] += 1;
    if (i == 0) *lenp += 1;
}

#define DECODE_KERNELS(S, T)                                                                                       \
    extern "C" __global__ void fox_cache_append_##S(T* kc, T* vc, float* cc, const T* k, const T* v,              \
                                                    const float* c, int B, int t, int H, int Hkv, int D, int cap,  \
                                                    const int* lenp, int len) {                                    \
        cache_append<T>(kc, vc, cc, k, v, c, B, t, H, Hkv, D, cap, lenp, len);                                     \
    }                                                                                                              \
    extern "C" __global__ void fox_kv_shift_prev_##S(T* out, const T* x, const T* alpha, const T* prev, int B,    \
                                                     int t, int H, int D, const int* lenp, int len) {              \
        kv_shift_prev<T>(out, x, alpha, prev, B, t, H, D, lenp, len);                                              \
    }                                                                                                              \
    extern "C" __global__ void fox_last_rows_##S(T* dst, const T* src, int B, int t, int w) {                     \
        last_rows<T>(dst, src, B, t, w);                                                                           \
    }

DECODE_KERNELS(f32, float)
DECODE_KERNELS(bf16, u16)

extern "C" __global__ void fox_cache_c_offset(float* c, const float* cc, int BH, int t, int cap, const int* lenp,
                                              int len) {
    cache_c_offset(c, cc, BH, t, cap, lenp, len);
}

// ---- a fused decode step ------------------------------------------------------------------------
// One position per row against the cache, with a layer's seven input projections done as one
// GEMM into p [B, ldp] (f32, the stacked weights' outputs side by side at the offsets below; -1:
// the projection is absent). One block per (row, head), one thread per channel. Each value is
// rounded to T where the op-by-op path stores it in T, so bf16 decoding rounds as the chunked
// forward does. The cached length comes from `lenp` when set (CUDA graphs), else from `len`.

struct DecodeIn {
    const float* p;
    void* q;            // [B, H, D] out: q after QK-norm and RoPE
    float* c;           // [B, H] out: the query's gate sum
    void* kc;           // cache [B, H, cap, D]: k, v and c at the cached length
    void* vc;
    float* cc;
    void* k_shift;      // [B, H, D]: the previous unmixed k~, v~ (read, then replaced)
    void* v_shift;
    const float* q_norm;  // QK-norm weights [groups, D] (null: no QK-norm)
    const float* k_norm;
    const float* fgate_bias;  // [H] (null: no forget gate)
    const int* positions;     // RoPE position of each row [B]
    const int* lenp;
    double rope_base;  // 0: no RoPE
    int ldp, q_off, k_off, ks_off, v_off, vs_off, f_off;
    int B, H, D, cap, len, qn_groups, kn_groups;
    float qk_eps;
};

// Sums over the block of two values, returned to every thread (blockDim.x a multiple of 32).
__device__ float2 block_sum2(float2 v, float2* sh) {
    for (int s = 16; s > 0; s >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, s);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, s);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float2 t = make_float2(0.f, 0.f);
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
        t.x += sh[w].x;
        t.y += sh[w].y;
    }
    return t;
}

// KV-shift of one channel: a * prev + (1 - a) * x with a = sigmoid(gate logit), from the raw
// projection x and gate logit (rounded to T first, as the op-by-op path stores them).
template <typename T>
__device__ float shift_mix(float x, float gate, float prev) {
    const float a = round_to<T>(sigmoidf_(round_to<T>(gate)));
    return round_to<T>(a * prev + (1.f - a) * round_to<T>(x));
}

// RoPE of channel i of a head held in sh [D] (as ops.cu's rope_apply).
__device__ float rope_channel(const float* sh, int i, int D, int pos, double base) {
    const int half = D / 2;
    const int c = i < half ? i : i - half;
    const double inv_freq = 1.0 / pow(base, 2.0 * (double)c / (double)D);
    const float ang = (float)pos * (float)inv_freq;
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    const float sn = (float)sd, cs = (float)cd;
    const float a = sh[c], b = sh[c + half];
    return i < half ? a * cs - b * sn : b * cs + a * sn;
}

// The kernel is a chain of dependent steps at batch 1, so every load that depends on no other is
// issued first and the gate (thread 0) runs before the norms.
// (row, head) `bh` of the step, one thread per channel (the megakernel calls it too).
template <typename T>
__device__ void decode_in(const DecodeIn& p, int bh) {
    __shared__ float2 red[32];
    __shared__ float shq[1024], shk[1024];
    const int b = bh / p.H, h = bh % p.H, D = p.D, i = threadIdx.x;
    const bool on = i < D;
    const float* pr = p.p + (long long)b * p.ldp;
    const long long hd = (long long)h * D + (on ? i : 0), si = (long long)b * p.H * D + hd;
    const bool ks = p.ks_off >= 0, vs = p.vs_off >= 0, qk = p.q_norm != nullptr;
    const int len = cached_len(p.lenp, p.len);
    float q = 0.f, kx = 0.f, vx = 0.f, ka = 0.f, va = 0.f, kp = 0.f, vp = 0.f, wq = 0.f, wk = 0.f;
    if (on) {
        q = pr[p.q_off + hd];
        kx = pr[p.k_off + hd];
        vx = pr[p.v_off + hd];
        if (ks) {
            ka = pr[p.ks_off + h];
            kp = ld((const T*)p.k_shift, si);
        }
        if (vs) {
            va = pr[p.vs_off + h];
            vp = ld((const T*)p.v_shift, si);
        }
        if (qk) {
            wq = p.q_norm[(h % p.qn_groups) * D + i];
            wk = p.k_norm[(h % p.kn_groups) * D + i];
        }
    }
    const long long row = (long long)bh * p.cap + len;
    if (i == 0) {
        float c = 0.f;
        if (p.fgate_bias != nullptr) {
            const float logit = p.f_off >= 0 ? pr[p.f_off + h] + p.fgate_bias[h] : p.fgate_bias[h];
            c = log_sigmoidf_(logit) + (len > 0 ? p.cc[row - 1] : 0.f);
        }
        p.c[bh] = c;
        p.cc[row] = c;
    }
    if (len == 0) kp = vp = 0.f;
    q = round_to<T>(q);
    float k = ks ? shift_mix<T>(kx, ka, kp) : round_to<T>(kx);
    const float v = vs ? shift_mix<T>(vx, va, vp) : round_to<T>(vx);
    if (on && ks) st((T*)p.k_shift, si, kx);
    if (on && vs) st((T*)p.v_shift, si, vx);
    if (qk) {
        const float2 ss = block_sum2(make_float2(q * q, k * k), red);
        q = round_to<T>(q * (1.f / sqrtf(ss.x / (float)D + p.qk_eps)) * wq);
        k = round_to<T>(k * (1.f / sqrtf(ss.y / (float)D + p.qk_eps)) * wk);
    }
    if (p.rope_base > 0.0) {
        if (on) {
            shq[i] = q;
            shk[i] = k;
        }
        __syncthreads();
        if (on) {
            const int pos = p.positions[b];
            q = round_to<T>(rope_channel(shq, i, D, pos, p.rope_base));
            k = round_to<T>(rope_channel(shk, i, D, pos, p.rope_base));
        }
    }
    if (on) {
        st((T*)p.q, (long long)bh * D + i, q);
        st((T*)p.kc, row * D + i, k);
        st((T*)p.vc, row * D + i, v);
    }
}

// After attention: z = RMSNorm_per_head(o) * w (when `norm_w`) * sigmoid(g) (when og_off >= 0),
// g the output gate's logits in p.
template <typename T>
__device__ void decode_out(T* z, const T* o, const float* p, const float* norm_w, int ldp, int og_off, int H, int D,
                           float eps, int bh) {
    __shared__ float2 red[32];
    const int b = bh / H, h = bh % H, i = threadIdx.x;
    const bool on = i < D;
    const long long at = (long long)bh * D + (on ? i : 0);
    float x = on ? ld(o, at) : 0.f;
    const float w = norm_w != nullptr && on ? norm_w[(long long)h * D + i] : 0.f;
    const float g = og_off >= 0 && on ? p[(long long)b * ldp + og_off + (long long)h * D + i] : 0.f;
    if (norm_w != nullptr) {
        const float ss = block_sum2(make_float2(x * x, 0.f), red).x;
        x = round_to<T>(x * (1.f / sqrtf(ss / (float)D + eps)) * w);
    }
    if (og_off >= 0) x *= sigmoid_gate(round_to<T>(g));
    if (on) st(z, at, x);
}

extern "C" __global__ void __launch_bounds__(1024) fox_decode_in_f32(const DecodeIn p) {
    pdl_trigger_next();
    decode_in<float>(p, blockIdx.x);
}
extern "C" __global__ void __launch_bounds__(1024) fox_decode_in_bf16(const DecodeIn p) {
    pdl_trigger_next();
    decode_in<u16>(p, blockIdx.x);
}
extern "C" __global__ void __launch_bounds__(1024)
    fox_decode_out_f32(float* z, const float* o, const float* p, const float* w, int ldp, int og, int H, int D, float eps) {
    pdl_trigger_next();
    decode_out<float>(z, o, p, w, ldp, og, H, D, eps, blockIdx.x);
}
extern "C" __global__ void __launch_bounds__(1024)
    fox_decode_out_bf16(u16* z, const u16* o, const float* p, const float* w, int ldp, int og, int H, int D, float eps) {
    pdl_trigger_next();
    decode_out<u16>(z, o, p, w, ldp, og, H, D, eps, blockIdx.x);
}

// ---- choosing the next token -------------------------------------------------------------------
// One block of 1024 threads per row of `vocab` logits stored `ld` apart. Greedy (temperature 0):
// the first index of the largest logit, as torch.argmax. Sampling: probabilities exp((x - m)/T)
// over the top-k logits (ties at the k-th value are all kept), then the smallest set of the most
// likely whose mass reaches top_p (found by bisection over the logits' order-preserving integer
// keys, so no sort), then a draw in index order with a counter-based random number of (seed,
// step, row). The chosen id goes to out[row] and, when `ids_out` is set, to the next step's input.

#define SB 1024
#define NWARP (SB / 32)

// Order-preserving map of a float to an unsigned integer (larger float -> larger key).
__device__ __forceinline__ unsigned fkey(float x) {
    const unsigned u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ u64 splitmix64(u64 z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ float block_sum(float v, float* sh) { return block_total<NWARP>(v, sh); }

__device__ unsigned block_count_ge(const float* x, int vocab, unsigned key, unsigned* shu) {
    unsigned n = 0;
    for (int c = threadIdx.x; c < vocab; c += SB) n += fkey(x[c]) >= key;
    return block_total<NWARP>(n, shu);
}

extern "C" __global__ void __launch_bounds__(SB)
    fox_sample(int* out, int* ids_out, const float* logits, int vocab, int ld, float temperature, int top_k,
               float top_p, u64 seed, const int* stepp, int step0) {
    __shared__ float shf[NWARP];
    __shared__ unsigned shu[NWARP];
    __shared__ int shi[NWARP];
    const int row = blockIdx.x;
    const float* x = logits + (long long)row * ld;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    // the largest logit and its first index
    float best = __int_as_float(0xff800000);
    int bi = 0x7fffffff;
    // unrolled so that the loads are in flight together (same order, same result)
#pragma unroll 8
    for (int c = threadIdx.x; c < vocab; c += SB) {
        const float v = x[c];
        if (v > best) {
            best = v;
            bi = c;
        }
    }
    block_argmax<NWARP>(best, bi, shf, shi);
    if (bi == 0x7fffffff) bi = 0;  // every logit NaN
    int chosen = bi;

    if (temperature > 0.f) {
        const float m = best, inv_t = 1.f / temperature;
        // top-k: the largest key with at least k logits at or above it
        unsigned kmin = 0;
        if (top_k > 0 && top_k < vocab) {
            unsigned lo = 0, hi = 0xffffffffu;  // count(>= lo) >= k holds for lo = 0
            while (lo < hi) {
                const unsigned mid = lo + (unsigned)(((u64)hi - lo + 1) / 2);  // no overflow at hi = ~0
                if (block_count_ge(x, vocab, mid, shu) >= (unsigned)top_k) lo = mid;
                else hi = mid - 1;
            }
            kmin = lo;
        }
        float z = 0.f;
        for (int c = threadIdx.x; c < vocab; c += SB)
            if (fkey(x[c]) >= kmin) z += __expf((x[c] - m) * inv_t);
        z = block_sum(z, shf);
        // top-p: the largest key whose kept mass at or above it reaches top_p
        unsigned pmin = kmin;
        if (top_p < 1.f) {
            unsigned lo = kmin, hi = fkey(m);
            while (lo < hi) {
                const unsigned mid = lo + (unsigned)(((u64)hi - lo + 1) / 2);  // no overflow at hi = ~0
                float s = 0.f;
                for (int c = threadIdx.x; c < vocab; c += SB)
                    if (fkey(x[c]) >= mid) s += __expf((x[c] - m) * inv_t);
                s = block_sum(s, shf);
                if (s >= top_p * z) lo = mid;
                else hi = mid - 1;
            }
            pmin = lo;
            z = 0.f;
            for (int c = threadIdx.x; c < vocab; c += SB)
                if (fkey(x[c]) >= pmin) z += __expf((x[c] - m) * inv_t);
            z = block_sum(z, shf);
        }
        // the draw: the first index whose running kept mass exceeds u * z
        const int step = stepp != nullptr ? *stepp : step0;
        const u64 r = splitmix64(seed ^ splitmix64(((u64)step << 20) ^ (u64)row));
        const float target = (float)((r >> 40) * (1.0 / 16777216.0)) * z;
        float run = 0.f;
        int found = -1, last_kept = bi;
        for (int c0 = 0; c0 < vocab && found < 0; c0 += SB) {
            const int c = c0 + threadIdx.x;
            const bool kept = c < vocab && fkey(x[c]) >= pmin;
            float e = kept ? __expf((x[c] - m) * inv_t) : 0.f;
            // inclusive scan within the warp, then across warps
            for (int s = 1; s < 32; s <<= 1) {
                const float o = __shfl_up_sync(0xffffffffu, e, s);
                if (lane >= s) e += o;
            }
            __syncthreads();
            if (lane == 31) shf[warp] = e;
            __syncthreads();
            float before = run;
            for (int w = 0; w < warp; ++w) before += shf[w];
            float total = run;
            for (int w = 0; w < NWARP; ++w) total += shf[w];
            const bool hit = kept && before + e > target;
            // the first hitting index of this chunk, and the last kept index so far
            int cand = hit ? c : 0x7fffffff;
            int lk = kept ? c : -1;
            for (int s = 16; s > 0; s >>= 1) {
                cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, s));
                lk = max(lk, __shfl_xor_sync(0xffffffffu, lk, s));
            }
            __syncthreads();
            if (lane == 0) {
                shi[warp] = cand;
                shu[warp] = (unsigned)(lk + 1);
            }
            __syncthreads();
            int f = 0x7fffffff, l = -1;
            for (int w = 0; w < NWARP; ++w) {
                f = min(f, shi[w]);
                l = max(l, (int)shu[w] - 1);
            }
            if (l >= 0) last_kept = l;
            if (f != 0x7fffffff) found = f;
            run = total;
        }
        // rounding can leave the target just above the total: take the last kept token
        chosen = found >= 0 ? found : last_kept;
    }
    if (threadIdx.x == 0) {
        out[row] = chosen;
        if (ids_out != nullptr) ids_out[row] = chosen;
    }
}
