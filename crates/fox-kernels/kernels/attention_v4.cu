// Forgetting Attention v4 forward (sm_90a), included after wgmma.cu: FlashAttention-3's
// scheduling with the forget gate.
//   - Warp specialisation: warpgroup 0 is the producer (one thread issues every copy, the
//     warpgroup gives its registers away with setmaxnreg), warpgroups 1 and 2 are consumers of 64
//     query rows each (128 rows a block).
//   - TMA: Q once, then K and V (128-byte-swizzle atoms, the layout the wgmma descriptors
//     address) into a ring of NST stages; the producer warp copies the keys' gate sums c_j. A stage's "full" mbarrier completes
//     when its bytes have landed; its "empty" mbarrier when all 8 consumer warps are done with it.
//   - Intra-warpgroup pipelining: S = Q K_j^T is issued together with O += P_{j-1} V_{j-1}, and the
//     softmax of tile j runs while the P V product is still in flight.
//   - Ping-pong: two named barriers make the consumer warpgroups take turns issuing their matrix
//     products, so one's exponentials run under the other's wgmma.
// The bias c_i - c_j comes from c_i in registers and c_j in the stage, as in v3: no extra memory
// traffic. Masks, ACP, GQA, windows, padding and packed documents are v3's (common.cuh); rows
// outside a view are zero-filled by the TMA unit, rows before a row's start are masked to -inf,
// so they must be finite (the model's padding rows are).
#ifdef FOX_HAVE_WGMMA

// A CUtensorMap: 128 opaque bytes, encoded on the host (128-byte aligned, as CUDA 13 declares it).
struct __align__(128) TmaMap {
    u64 w[16];
};
struct V4Params {
    AttnParams a;
    TmaMap q, k, v;  // 4-d (D, T, heads, B)
};

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void tma_load4(u32 dst, const TmaMap* map, u32 bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
        "%6}], [%2];\n" ::"r"(dst),
        "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
// Named barriers 1 and 2 between the two consumer warpgroups (256 threads).
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }

// d[64] (+)= A(smem, K-major) * B(smem, K-major), m64n128k16
template <bool BF>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], u64 da, u64 db, int accumulate) {
    if constexpr (BF) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : WG_R64
                     : "l"(da), "l"(db), "r"(accumulate));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : WG_R64
                     : "l"(da), "l"(db), "r"(accumulate));
    }
}
template <int NS, bool BF>
__device__ __forceinline__ void wgmma_ss(float (&S)[NS], u64 da, u64 db, int accumulate) {
    if constexpr (NS == 32) wgmma_ss_n64<BF>(S, da, db, accumulate);
    else wgmma_ss_n128<BF>(S, da, db, accumulate);
}
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// S = Q K^T for one consumer warpgroup: Q rows at q_s (an atom of BQ rows), K at k_s.
template <int D, bool BF, int BQ, int BK, int NS>
__device__ __forceinline__ void v4_issue_s(float (&S)[NS], u32 q_s, u32 k_s) {
    wg_fence();
#pragma unroll
    for (int s = 0; s < D / 16; ++s) {
        const u32 ao = (u32)((s >> 2) * BQ * 128 + (s & 3) * 32);
        const u32 bo = (u32)((s >> 2) * BK * 128 + (s & 3) * 32);
        wgmma_ss<NS, BF>(S, gmma_desc(q_s + ao, 16, 1024), gmma_desc(k_s + bo, 16, 1024), s > 0 ? 1 : 0);
    }
    wg_commit();
}
// O += P V with P as register A fragments and V (keys x D atoms) at v_s.
template <int D, bool BF, int BK, int NA, int NT>
__device__ __forceinline__ void v4_issue_pv(float (&O)[NA][32], const u32 (&a)[NT / 2][4], u32 v_s) {
    wg_fence();
#pragma unroll
    for (int at = 0; at < NA; ++at)
#pragma unroll
        for (int kc2 = 0; kc2 < NT / 2; ++kc2)
            wgmma_rs_n64<BF, 1>(O[at], a[kc2], gmma_desc(v_s + (u32)(at * BK * 128 + kc2 * 2 * 1024), BK * 128, 1024));
    wg_commit();
}

template <int D, bool BF, int BK, int NST, bool PINGPONG>
__device__ __forceinline__ void fwd_v4_impl(const V4Params& P) {
    const AttnParams& p = P.a;
    constexpr int BQ = 128, NA = D / 64, NS = BK / 2, NT = BK / 8, DT = D / 8;
    constexpr u32 Q_BYTES = BQ * D * 2, KV_BYTES = BK * D * 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 raw = smem_u32(smem_raw);
    unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
    u16* sQ = (u16*)smem;  // NA atoms of [BQ][64]
    u16* sK = sQ + BQ * D;  // NST stages of NA atoms of [BK][64]
    u16* sV = sK + NST * BK * D;
    float* sC = (float*)(sV + NST * BK * D);  // NST x BK
    const u32 bars = smem_u32(sC + NST * BK);  // full[NST], empty[NST], q
    auto full = [&](int s) { return bars + 8u * (u32)s; };
    auto empty = [&](int s) { return bars + 8u * (u32)(NST + s); };
    const u32 qbar = bars + 16u * NST;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wgi = warp >> 2;
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
    const int r0 = qb * BQ;
    const int rlast = min(r0 + BQ, p.tq) - 1;
    int jbase, first, ntiles;
    key_tiles<BK>(p, b, bh, r0, rlast, jbase, first, ntiles);
    const int n = ntiles - first;
    if (tid == 0) {
        for (int s = 0; s < NST; ++s) {
            mbar_init(full(s), 2);  // the copies' arrival and the gate sums'
            mbar_init(empty(s), 8);
        }
        mbar_init(qbar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        if (p.counters != nullptr) {
            atomicAdd(&p.counters[0], (u64)(ntiles - first));
            atomicAdd(&p.counters[1], (u64)first);
        }
    }
    __syncthreads();

    if (wgi == 0) {
        // producer: one thread issues the tensor copies, its warp copies the gate sums (a TMA
        // box must start 16-byte aligned, which c_j of an odd tk is not)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (warp == 0 && n > 0) {
            const int hk = kv_head(p, h);
            const float* ckb = p.ck + (long long)bh * p.tk;
            if (lane == 0) {
                mbar_expect_tx(qbar, Q_BYTES);
#pragma unroll
                for (int at = 0; at < NA; ++at) tma_load4(smem_u32(sQ + at * BQ * 64), &P.q, qbar, at * 64, r0, h, b);
            }
            for (int i = 0; i < n; ++i) {
                const int s = i % NST;
                if (i >= NST) mbar_wait(empty(s), (u32)((i / NST - 1) & 1));
                const int jt = jbase + (first + i) * BK;
                if (lane == 0) {
                    mbar_expect_tx(full(s), 2 * KV_BYTES);
#pragma unroll
                    for (int at = 0; at < NA; ++at) {
                        tma_load4(smem_u32(sK + s * BK * D + at * BK * 64), &P.k, full(s), at * 64, jt, hk, b);
                        tma_load4(smem_u32(sV + s * BK * D + at * BK * 64), &P.v, full(s), at * 64, jt, hk, b);
                    }
                }
#pragma unroll
                for (int x = lane; x < BK; x += 32) sC[s * BK + x] = jt + x < p.tk ? ckb[jt + x] : 0.f;
                __syncwarp();
                if (lane == 0) mbar_arrive(full(s));
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int cw = wgi - 1;  // consumer warpgroup
    const int g = lane >> 2, t4 = lane & 3;
    const int wrow = cw * 64 + (warp & 3) * 16;  // this warp's first row in the block
    float ci[2];
    int pos[2], st[2], rows[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int r = r0 + wrow + g + rr * 8;
        rows[rr] = r;
        if (r < p.tq) {
            ci[rr] = p.cq[(long long)bh * p.tq + r];
            pos[rr] = p.q_pos0 + r;
            st[rr] = row_start(p, b, r);
        } else {
            ci[rr] = 0.f;
            pos[rr] = -1;
            st[rr] = 0;
        }
    }
    float O[NA][32];
#pragma unroll
    for (int at = 0; at < NA; ++at)
#pragma unroll
        for (int j = 0; j < 32; ++j) O[at][j] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

    if (n > 0) {
        const int pos_min = p.q_pos0 + r0;
        const int start_max = row_start(p, b, rlast);
        const float scale_log2 = p.scale * LOG2E;
        const u32 q_s = smem_u32(sQ) + (u32)(cw * 64 * 128);
        const int mine = 1 + cw, other = 2 - cw;  // named barrier ids
        float S[NS];
        u32 a[NT / 2][4];
        // bias, mask and online softmax of tile i in S (S[4*nt + e] is mma.sync's S[nt][e]);
        // returns the rows' rescale factors and leaves P (unnormalised) packed in a
        auto softmax = [&](int i, float (&corr)[2]) {
            const int s = i % NST;
            const float* c_s = sC + s * BK;
            const int jt = jbase + (first + i) * BK;
            const bool need_mask = (jt + BK - 1 > pos_min) || (jt < start_max);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const float c0 = c_s[nt * 8 + 2 * t4], c1 = c_s[nt * 8 + 2 * t4 + 1];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int rr = e >> 1;
                    float x = S[4 * nt + e] * scale_log2 + (ci[rr] - ((e & 1) ? c1 : c0)) * LOG2E;
                    if (need_mask) {
                        const int j = jt + nt * 8 + 2 * t4 + (e & 1);
                        if (j > pos[rr] || j < st[rr]) x = NEG_INF;
                    }
                    S[4 * nt + e] = x;
                }
            }
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                float mx = NEG_INF;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(S[4 * nt + 2 * rr], S[4 * nt + 2 * rr + 1]));
                mx = quad_max(mx);
                const float mnew = fmaxf(m[rr], mx);
                const float muse = mnew == NEG_INF ? 0.f : mnew;
                corr[rr] = fast_exp2(m[rr] - muse);
                m[rr] = mnew;
                float rs = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const float p0 = fast_exp2(S[4 * nt + 2 * rr] - muse);
                    const float p1 = fast_exp2(S[4 * nt + 2 * rr + 1] - muse);
                    S[4 * nt + 2 * rr] = p0;
                    S[4 * nt + 2 * rr + 1] = p1;
                    rs += p0 + p1;
                }
                l[rr] = l[rr] * corr[rr] + rs;
            }
        };
        auto pack = [&]() {
#pragma unroll
            for (int kc2 = 0; kc2 < NT / 2; ++kc2)
#pragma unroll
                for (int x = 0; x < 4; ++x) a[kc2][x] = pack2<BF>(S[8 * kc2 + 2 * x], S[8 * kc2 + 2 * x + 1]);
        };
        auto release = [&](int i) {
            __syncwarp();
            if (lane == 0) mbar_arrive(empty(i % NST));
        };
        auto k_at = [&](int i) { return smem_u32(sK + (i % NST) * BK * D); };
        auto v_at = [&](int i) { return smem_u32(sV + (i % NST) * BK * D); };
        auto phase = [&](int i) { return (u32)((i / NST) & 1); };

        // The warpgroups take turns issuing: the second lets the first go before its first turn,
        // and skips its last hand-back (it would have no taker), so the barriers stay balanced.
        if (PINGPONG && cw == 1) named_arrive(1);
        mbar_wait(qbar, 0);
        mbar_wait(full(0), phase(0));
        if (PINGPONG) named_sync(mine);
        v4_issue_s<D, BF, BQ, BK, NS>(S, q_s, k_at(0));
        if (PINGPONG) named_arrive(other);
        wg_wait<0>();
        float corr[2];
        softmax(0, corr);
        pack();
        for (int i = 1; i < n; ++i) {
            mbar_wait(full(i % NST), phase(i));
            if (PINGPONG) named_sync(mine);
            v4_issue_s<D, BF, BQ, BK, NS>(S, q_s, k_at(i));
            v4_issue_pv<D, BF, BK, NA, NT>(O, a, v_at(i - 1));
            if (PINGPONG) named_arrive(other);
            wg_wait<1>();  // S of tile i (committed first)
            softmax(i, corr);
            wg_wait<0>();  // P V of tile i - 1
            release(i - 1);
#pragma unroll
            for (int at = 0; at < NA; ++at)
#pragma unroll
                for (int dtl = 0; dtl < 8; ++dtl)
#pragma unroll
                    for (int rr = 0; rr < 2; ++rr) {
                        O[at][4 * dtl + 2 * rr] *= corr[rr];
                        O[at][4 * dtl + 2 * rr + 1] *= corr[rr];
                    }
            pack();
        }
        if (PINGPONG) named_sync(mine);
        v4_issue_pv<D, BF, BK, NA, NT>(O, a, v_at(n - 1));
        if (PINGPONG && cw == 0) named_arrive(other);
        wg_wait<0>();
        release(n - 1);
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const float lt = quad_sum(l[rr]);
        const int r = rows[rr];
        if (r >= p.tq) continue;
        const float inv = lt > 0.f ? 1.f / lt : 0.f;
        u16* orow = p.o + (((long long)b * p.tq + r) * p.H + h) * D;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            const float o0 = O[dt >> 3][4 * (dt & 7) + 2 * rr], o1 = O[dt >> 3][4 * (dt & 7) + 2 * rr + 1];
            *(u32*)(orow + dt * 8 + 2 * t4) = pack2<BF>(o0 * inv, o1 * inv);
        }
        if (t4 == 0) p.lse[(long long)bh * p.tq + r] = lt > 0.f ? m[rr] * LN2 + __logf(lt) : NEG_INF;
    }
}
#endif

// Kernels: fox_fwdv4_d{D}_{type} (128-key tiles; stages: 4 at D = 64, 2 at D = 128) and the
// variant without ping-pong (fox_fwdv4np_*), kept for the measurements in BENCHMARKS.md.
#define FOX_V4(D, TY, BF, NST)                                                                              \
    extern "C" __global__ void __launch_bounds__(384, 1) fox_fwdv4_d##D##_##TY(const __grid_constant__ V4Params p) {   \
        FOX_V4_BODY(D, BF, NST, true)                                                                        \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(384, 1) fox_fwdv4np_d##D##_##TY(const __grid_constant__ V4Params p) { \
        FOX_V4_BODY(D, BF, NST, false)                                                                       \
    }
#ifdef FOX_HAVE_WGMMA
#define FOX_V4_BODY(D, BF, NST, PP) fwd_v4_impl<D, BF, 128, NST, PP>(p);
#else
struct __align__(128) TmaMap {
    u64 w[16];
};
struct V4Params {
    AttnParams a;
    TmaMap q, k, v;
};
#define FOX_V4_BODY(D, BF, NST, PP) __trap();
#endif
FOX_V4(64, bf16, true, 4)
FOX_V4(128, bf16, true, 2)
FOX_V4(64, f16, false, 4)
FOX_V4(128, f16, false, 2)
