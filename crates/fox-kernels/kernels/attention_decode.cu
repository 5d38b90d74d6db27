// Decode of one query row per (b, h) against a long cache (tq = 1: a decode step), split over
// the keys like decode_impl, without tensor cores. The 16-row mma tiles of decode_impl spend 15
// of 16 rows on padding for one query and stage every key tile through shared memory; here each
// key's D values are read straight into registers by D/8 lanes (16 bytes each), so a warp covers
// 32/(D/8) keys per load and a thread keeps U such loads of K and V in flight before it uses the
// first. Scores: q.k in fp32 from the bf16/f16 words, then the gate bias (c_i - c_j) as in the
// tiled kernels; probabilities stay in fp32 (no rounding of P to 16 bits before P V).
//
// Grid (splits, B*H), 128 threads; the same key tiles per split and the same partials (o, m, l)
// as decode_impl, merged by the last split of (b, h) to finish, which may also apply the layer's
// output norm and gate (DecodeOut). Included after attention.cu, activations.cuh before both.

// What the last split writes after the merge when z is set: a FoX (Pro) layer's per-head output
// norm and output gate, z = RMSNorm(o) * w * sigmoid(g), bitwise as decode.cu's decode_out after
// this kernel's o (the fused decode step then skips that launch).
struct DecodeOut {
    u16* z;               // [B, H, D] (bf16)
    const float* norm_w;  // [H, D], or null: no output norm
    const float* gate;    // the stacked projections' f32 outputs [B, gate_ld], or null: no gate
    long long gate_ld;
    int gate_off;         // the gate's logits of head h, channel i at gate_off + h * D + i
    float eps;
};

// The output norm and gate of (b, h) = bh's merged row `o` [D] (thread i < D holds channel i).
template <int D, int NTH>
__device__ __forceinline__ void decode_out_row(const DecodeOut& e, int H, int bh, const float* o) {
    const int b = bh / H, h = bh % H, i = threadIdx.x;
    const bool on = i < D;
    // o as the unfused path reads it back: rounded to bf16
    float x = on ? round_half<true>(o[i]) : 0.f;
    const float w = e.norm_w != nullptr && on ? e.norm_w[(long long)h * D + i] : 0.f;
    const float g = e.gate != nullptr && on ? e.gate[(long long)b * e.gate_ld + e.gate_off + (long long)h * D + i] : 0.f;
    if (e.norm_w != nullptr) {
        // summed in decode_out's order (a butterfly per warp, then the warps in order; the warps
        // past D add zeros), so the norm matches it bit for bit
        __shared__ float sh[NTH / 32];
        const float ss = block_total<NTH / 32>(x * x, sh);
        x = round_half<true>(x * (1.f / sqrtf(ss / (float)D + e.eps)) * w);
    }
    if (e.gate != nullptr) x *= sigmoid_gate(round_half<true>(g));
    if (on) e.z[(long long)bh * D + i] = to_half<true>(x);
}

// Eight 16-bit words of a 16-byte load as floats.
template <bool BF>
__device__ __forceinline__ void unpack8(const uint4& w, float (&x)[8]) {
    const u32 v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        x[2 * i] = to_f32<BF>((u16)(v[i] & 0xffffu));
        x[2 * i + 1] = to_f32<BF>((u16)(v[i] >> 16));
    }
}

// One online-softmax state (m in log2 units, l, and this lane's 8 channels of o) folded into
// another: the two summed as if one had seen both states' keys.
__device__ __forceinline__ void fold_state(float& m, float& l, float (&o)[8], float om, float ol, const float (&oo)[8]) {
    const float M = fmaxf(m, om);
    const float Mu = M == NEG_INF ? 0.f : M;
    const float a = fast_exp2(m - Mu), b = fast_exp2(om - Mu);
    l = l * a + ol * b;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = o[e] * a + oo[e] * b;
    m = M;
}

template <int D, bool BF>
__device__ __forceinline__ void decode_row_impl(const AttnParams& p, const DecodeOut& e) {
    constexpr int BK = 64, NTH = 128, NW = NTH / 32;
    constexpr int LPK = D / 8;     // lanes per key, 16 bytes each
    constexpr int KPW = 32 / LPK;  // keys per warp per load
    constexpr int U = 8;           // loads of K and V in flight per thread
    constexpr int STEP = NW * KPW; // keys per block per load
    __shared__ float sO[NW][D];
    __shared__ float sM[NW], sL[NW];
    __shared__ float sml[2 * 64];  // the splits' (m, l) for the merge (splits <= 64)

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int grp = lane / LPK, part = lane % LPK;
    const int split = blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
    // Launched as a programmatic dependent of the kernel that wrote q, the query's gate sum and
    // the newest key (the fused step's fox_decode_in), the first keys load while that kernel
    // runs; ACP's thresholds come from the kernel before, so with them everything waits.
    bool waited = p.prune != nullptr;
    if (waited) pdl_wait_prev();

    int jbase, first, ntiles;
    key_tiles<BK>(p, b, bh, 0, 0, jbase, first, ntiles);
    const int per = (ntiles - first + p.splits - 1) / p.splits;
    const int t_begin = first + split * per;
    const int t_end = min(t_begin + per, ntiles);
    if (tid == 0 && split == 0) count_tiles(p, first, ntiles);
    // keys [j0, j1) of this split that the row sees
    const int j0 = max(jbase + t_begin * BK, row_start(p, b, 0));
    const int j1 = min(jbase + t_end * BK, p.q_pos0 + 1);

    float m = NEG_INF, l = 0.f, o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = 0.f;
    if (j0 < j1) {
        const int hk = kv_head(p, h);
        const u16* kb = p.k + b * p.k_sb + hk * p.k_sh + part * 8;
        const u16* vb = p.v + b * p.v_sb + hk * p.v_sh + part * 8;
        const float* ckb = p.ck + (long long)bh * p.tk;
        const float scale_log2 = p.scale * LOG2E;
        float ci, q[8];
        auto load_query = [&] {
            ci = p.cq[bh];
            unpack8<BF>(*(const uint4*)(p.q + b * p.q_sb + h * p.q_sh + part * 8), q);
        };
        if (waited) load_query();
        // warp-uniform trip count: the lanes of a key group reduce with shuffles
        for (int jb = j0 + warp * KPW; jb - warp * KPW < j1; jb += U * STEP) {
            uint4 kw[U], vw[U];
            float cj[U];
            auto load_key = [&](int u, bool ok) {
                const int j = jb + u * STEP + grp;
                kw[u] = ok ? *(const uint4*)(kb + j * p.k_st) : make_uint4(0, 0, 0, 0);
                vw[u] = ok ? *(const uint4*)(vb + j * p.v_st) : make_uint4(0, 0, 0, 0);
                cj[u] = ok ? ckb[j] : 0.f;
            };
            // keys from q_pos0 on (the newest) only after the wait
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int j = jb + u * STEP + grp;
                load_key(u, j < j1 && (waited || j < p.q_pos0));
            }
            if (!waited) {
                pdl_wait_prev();
                waited = true;
                load_query();
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int j = jb + u * STEP + grp;
                    if (j < j1 && j >= p.q_pos0) load_key(u, true);
                }
            }
            float s[U];
            float mx = NEG_INF;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float k[8];
                unpack8<BF>(kw[u], k);
                float dot = 0.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) dot = fmaf(q[e], k[e], dot);
#pragma unroll
                for (int off = LPK / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
                // c_i - c_j formed in fp32 first, as in the tiled kernels
                s[u] = jb + u * STEP + grp < j1 ? dot * scale_log2 + (ci - cj[u]) * LOG2E : NEG_INF;
                mx = fmaxf(mx, s[u]);
            }
            const float mnew = fmaxf(m, mx);
            const float muse = mnew == NEG_INF ? 0.f : mnew;
            const float corr = fast_exp2(m - muse);
            m = mnew;
            l *= corr;
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] *= corr;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float pu = fast_exp2(s[u] - muse);
                float v[8];
                unpack8<BF>(vw[u], v);
                l += pu;
#pragma unroll
                for (int e = 0; e < 8; ++e) o[e] = fmaf(pu, v[e], o[e]);
            }
        }
    }
    // (a block without keys still waits: this kernel must not finish before the one it follows)
    if (!waited) pdl_wait_prev();
    // the warp's key groups into lanes 0..LPK-1, then the warps through shared memory
#pragma unroll
    for (int off = LPK; off < 32; off <<= 1) {
        float oo[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) oo[e] = __shfl_xor_sync(0xffffffffu, o[e], off);
        const float om = __shfl_xor_sync(0xffffffffu, m, off), ol = __shfl_xor_sync(0xffffffffu, l, off);
        fold_state(m, l, o, om, ol, oo);
    }
    if (lane < LPK) {
#pragma unroll
        for (int e = 0; e < 8; ++e) sO[warp][part * 8 + e] = o[e];
        if (lane == 0) {
            sM[warp] = m;
            sL[warp] = l;
        }
    }
    __syncthreads();
    const long long pbase = ((long long)split * p.B * p.H + bh) * 16;
    if (tid < D) {
        float M = NEG_INF;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, sM[w]);
        const float Mu = M == NEG_INF ? 0.f : M;
        float L = 0.f, acc = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float wt = fast_exp2(sM[w] - Mu);
            L += sL[w] * wt;
            acc += sO[w][tid] * wt;
        }
        p.part_o[pbase * D + tid] = acc;
        if (tid == 0) {
            p.part_ml[pbase * 2] = M;
            p.part_ml[pbase * 2 + 1] = L;
        }
    }
    __shared__ float so[D];
    const bool last = merge_splits_if_last<D, NTH>(p, bh, sml, [&](int r, int d, float v) {
        store_o<D, BF>(p, bh, r, d, v);
        so[d] = v;
    });
    if (!last || e.z == nullptr) return;
    __syncthreads();
    decode_out_row<D, NTH>(e, p.H, bh, so);
}

// As FOX_DECODE_ENTRY, with the output epilogue (zeros: none).
#define FOX_DECODE_ROW_ENTRY(D, TY, BF)                                                                      \
    extern "C" __global__ void __launch_bounds__(128) fox_decode1_d##D##_##TY(const AttnParams p_in, const DecodeOut e) { \
        AttnParams p = p_in;                                                                                \
        pdl_trigger_next();                                                                                 \
        if (p.q_pos0_dev != nullptr) p.q_pos0 = *p.q_pos0_dev;                                              \
        decode_row_impl<D, BF>(p, e);                                                                       \
    }
FOX_DECODE_ROW_ENTRY(64, bf16, true)
FOX_DECODE_ROW_ENTRY(128, bf16, true)
FOX_DECODE_ROW_ENTRY(64, f16, false)
FOX_DECODE_ROW_ENTRY(128, f16, false)
