// Forget-gate prefix sums and ACP thresholds (included after common.cuh).
//
// Segments: position t of batch row b belongs to the document starting at key(t) = start(b, t)
// (start_mode 0: 0; 1: start[b], left padding; 2: start[b*T + t], packed documents). A position
// before its start is padding: its a_t counts as 0 and its outputs are 0. Starts are
// non-decreasing in t, so documents are contiguous and a scan restarts where key(t) changes.

struct ScanParams {
    const float* in1;   // forward: a [B, T, H]; backward: dcq [B, H, T]
    const float* in2;   // backward: dck [B, H, T] (added to in1), or null
    float* out;         // forward: c [B, H, T]; backward: da [B, T, H]
    const int* start;
    int B, H, T, start_mode;
};

__device__ __forceinline__ int seg_key(const ScanParams& p, int b, int t) {
    if (p.start_mode == 0) return 0;
    if (p.start_mode == 1) return p.start[b];
    return p.start[b * p.T + t];
}

// One CTA of 256 threads per (b, h): a segmented scan over T, inclusive, forward (REV = false,
// c_t = sum of a over the document up to t) or reverse (REV = true, da_t = sum of dc over the
// document from t on).
template <bool REV>
__device__ __forceinline__ void scan_impl(const ScanParams& p) {
    constexpr int NTH = 256;
    __shared__ float s_sum[NTH];
    __shared__ int s_flag[NTH];
    const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
    const int tid = threadIdx.x;
    const int n = (p.T + NTH - 1) / NTH;
    const int lo = tid * n, hi = min(lo + n, p.T);
    auto pos_of = [&](int k) { return REV ? p.T - 1 - k : k; };
    auto value = [&](int t) -> float {
        if (t < seg_key(p, b, t)) return 0.f;
        if (REV) {
            const long long i = ((long long)b * p.H + h) * p.T + t;
            return p.in1[i] + (p.in2 != nullptr ? p.in2[i] : 0.f);
        }
        return p.in1[((long long)b * p.T + t) * p.H + h];
    };
    auto seg_first = [&](int k) { return k == 0 || seg_key(p, b, pos_of(k)) != seg_key(p, b, pos_of(k - 1)); };

    int fl = 0;
    float s = 0.f;
    for (int k = lo; k < hi; ++k) {
        const float v = value(pos_of(k));
        if (seg_first(k)) {
            fl = 1;
            s = v;
        } else {
            s += v;
        }
    }
    s_flag[tid] = fl;
    s_sum[tid] = s;
    __syncthreads();
    // inclusive Hillis-Steele scan of (flag, sum) pairs
    for (int d = 1; d < NTH; d <<= 1) {
        int f2 = 0;
        float s2 = 0.f;
        if (tid >= d) {
            f2 = s_flag[tid - d];
            s2 = s_sum[tid - d];
        }
        __syncthreads();
        if (tid >= d) {
            if (!s_flag[tid]) s_sum[tid] += s2;
            s_flag[tid] |= f2;
        }
        __syncthreads();
    }
    float run = tid > 0 ? s_sum[tid - 1] : 0.f;
    for (int k = lo; k < hi; ++k) {
        const int t = pos_of(k);
        const float v = value(t);
        run = seg_first(k) ? v : run + v;
        const float o = t < seg_key(p, b, t) ? 0.f : run;
        if (REV) p.out[((long long)b * p.T + t) * p.H + h] = o;
        else p.out[((long long)b * p.H + h) * p.T + t] = o;
    }
}

extern "C" __global__ void __launch_bounds__(256) fox_fgate_cumsum_fwd(const ScanParams p) { scan_impl<false>(p); }
extern "C" __global__ void __launch_bounds__(256) fox_fgate_cumsum_bwd(const ScanParams p) { scan_impl<true>(p); }

// |row|² of a D-wide row of 16-bit elements, summed by one warp (every lane gets it).
template <int D, bool BF>
__device__ __forceinline__ float row_sq_norm(const u16* row, int lane) {
    float acc = 0.f;
    for (int d = lane * 2; d < D; d += 64) {
        const u32 w = *(const u32*)(row + d);
        const float x0 = to_f32<BF>((u16)(w & 0xffff)), x1 = to_f32<BF>((u16)(w >> 16));
        acc += x0 * x0 + x1 * x1;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    return acc;
}

// ACP threshold per (b, h) from the largest query and key norms:
//   U = scale * max|q| * max|k|,  delta = -(2U + ln N) + ln eps.
// One CTA of 256 threads (8 warps, a warp per row) per (b, h). Rows that see nothing (padding)
// are left out of the maxima.
template <int D, bool BF>
__device__ __forceinline__ void acp_norm_impl(const AttnParams& p, float log_eps, float ln_n, float* out) {
    __shared__ float s_q[8], s_k[8];
    const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kfloor = row_start(p, b, 0);
    float bq = 0.f, bk = 0.f;
    for (int r = warp; r < p.tq; r += 8) {
        if (p.q_pos0 + r < row_start(p, b, r)) continue;
        const u16* row = p.q + b * p.q_sb + h * p.q_sh + (long long)r * p.q_st;
        const float acc = row_sq_norm<D, BF>(row, lane);
        bq = fmaxf(bq, acc);
    }
    for (int j = max(kfloor, 0) + warp; j < p.tk; j += 8) {
        const u16* row = p.k + b * p.k_sb + kv_head(p, h) * p.k_sh + (long long)j * p.k_st;
        const float acc = row_sq_norm<D, BF>(row, lane);
        bk = fmaxf(bk, acc);
    }
    if (lane == 0) {
        s_q[warp] = bq;
        s_k[warp] = bk;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float q2 = 0.f, k2 = 0.f;
        for (int w = 0; w < 8; ++w) {
            q2 = fmaxf(q2, s_q[w]);
            k2 = fmaxf(k2, s_k[w]);
        }
        const float u = p.scale * sqrtf(q2) * sqrtf(k2);
        out[bh] = -(2.f * u + ln_n) + log_eps;
    }
}

#define FOX_ACP(D, TY, BF)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256)                                                          \
        fox_acp_norms_d##D##_##TY(const AttnParams p, float log_eps, float ln_n, float* out) {                 \
        acp_norm_impl<D, BF>(p, log_eps, ln_n, out);                                                           \
    }
FOX_ACP(64, bf16, true)
FOX_ACP(128, bf16, true)
FOX_ACP(64, f16, false)
FOX_ACP(128, f16, false)
