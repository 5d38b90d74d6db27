// Forgetting Attention's warp-specialised forward (sm_90a), included after wgmma.cu: FlashAttention-3's
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
// The bias c_i - c_j comes from c_i in registers and c_j in the stage, as in wgmma.cu: no extra memory
// traffic. Masks, ACP, GQA, windows, padding and packed documents are wgmma.cu's (common.cuh); rows
// outside a view are zero-filled by the TMA unit, rows before a row's start are masked to -inf,
// so they must be finite (the model's padding rows are).
#ifdef FOX_HAVE_WGMMA

// A CUtensorMap: 128 opaque bytes, encoded on the host (128-byte aligned, as CUDA 13 declares it).
struct __align__(128) TmaMap {
    u64 w[16];
};
struct WsParams {
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
// Two tiles of R rows from row `row` of head `head`, batch row b, each NA atoms of [R][64], into x
// and y through maps mx and my; both copies arrive on barrier bar.
template <int R, int NA>
__device__ __forceinline__ void tma_load_pair(u16* x, const TmaMap* mx, u16* y, const TmaMap* my, u32 bar, int row,
                                              int head, int b) {
#pragma unroll
    for (int at = 0; at < NA; ++at) {
        tma_load4(smem_u32(x + at * R * 64), mx, bar, at * 64, row, head, b);
        tma_load4(smem_u32(y + at * R * 64), my, bar, at * 64, row, head, b);
    }
}
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }

// d[64] (+)= A(smem, K-major) * B(smem, K-major), m64n128k16
template <bool BF>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], u64 da, u64 db, int accumulate) {
    WGMMA(BF, "%66", "m64n128k16", WG_D64 ", %64, %65, p, 1, 1, 0, 0", : WG_R64 : "l"(da), "l"(db), "r"(accumulate));
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
__device__ __forceinline__ void ws_issue_s(float (&S)[NS], u32 q_s, u32 k_s) {
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
__device__ __forceinline__ void ws_issue_pv(float (&O)[NA][32], const u32 (&a)[NT / 2][4], u32 v_s) {
    wg_fence();
#pragma unroll
    for (int at = 0; at < NA; ++at)
#pragma unroll
        for (int kc2 = 0; kc2 < NT / 2; ++kc2)
            wgmma_rs_n64<BF, 1>(O[at], a[kc2], gmma_desc(v_s + (u32)(at * BK * 128 + kc2 * 2 * 1024), BK * 128, 1024));
    wg_commit();
}

// FOLD (FOX_FWD_WS_FOLD=1; measured no faster, so not the default): the bias relative to the
// block's first row. Softmax over keys j of s_ij + c_i - c_j does not depend on the row's c_i, so
// the stage holds (c_ref - c_j) log2(e) for c_ref = c of the block's first query row (small near
// the diagonal, where the weight is: no precision lost to large |c|), each score costs one FFMA
// for scale and bias, and the row term c_i - c_ref is added to the row's maximum once, for lse. The running maximum moves only when a
// tile's exceeds it by RESCALE_LOG2 (p stays below 2^8, far inside fp32, bf16 and fp16), so most
// tiles skip rescaling O: a warp-uniform vote. Without FOLD: c_i - c_j per score and O rescaled
// every tile.
constexpr float RESCALE_LOG2 = 8.f;
template <int D, bool BF, int BK, int NST, bool PINGPONG, bool FOLD>
__device__ __forceinline__ void fwd_ws_impl(const WsParams& P) {
    const AttnParams& p = P.a;
    constexpr int BQ = 128, NA = D / 64, NS = BK / 2, NT = BK / 8;
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
    const QueryBlock q = query_block<BQ, BK>(p);
    const int bh = q.bh, b = q.b, h = q.h, r0 = q.r0, rlast = q.rlast, jbase = q.jbase, first = q.first,
              ntiles = q.ntiles;
    const int n = ntiles - first;
    if (tid == 0) {
        for (int s = 0; s < NST; ++s) {
            mbar_init(full(s), 2);  // the copies' arrival and the gate sums'
            mbar_init(empty(s), 8);
        }
        mbar_init(qbar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        count_tiles(p, first, ntiles);
    }
    __syncthreads();

    if (wgi == 0) {
        // producer: one thread issues the tensor copies, its warp copies the gate sums (a TMA
        // box must start 16-byte aligned, which c_j of an odd tk is not)
        // 384 threads launch with 168 registers each; the producer's 128 threads give back 144
        // each, exactly the 72 each that the 256 consumer threads take (an increase waits until
        // the registers are free, so the two must balance). A third consumer warpgroup at D = 64
        // (192 rows, 160 registers each) was measured slower: docs/kernel-notes.md.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (warp == 0 && n > 0) {
            const int hk = kv_head(p, h);
            const float* ckb = p.ck + (long long)bh * p.tk;
            const float cref = FOLD ? p.cq[(long long)bh * p.tq + r0] : 0.f;
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
                    tma_load_pair<BK, NA>(sK + s * BK * D, &P.k, sV + s * BK * D, &P.v, full(s), jt, hk, b);
                }
#pragma unroll
                for (int x = lane; x < BK; x += 32) {
                    if constexpr (FOLD) sC[s * BK + x] = jt + x < p.tk ? (cref - ckb[jt + x]) * LOG2E : 0.f;
                    else sC[s * BK + x] = (jt + x < p.tk ? ckb[jt + x] : 0.f) * LOG2E;
                }
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
    float ci[2];  // c_i log2(e), or with FOLD (c_i - c_ref) log2(e)
    int pos[2], st[2], rows[2];
    const float cref = FOLD ? p.cq[(long long)bh * p.tq + r0] : 0.f;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int r = r0 + wrow + g + rr * 8;
        rows[rr] = r;
        if (r < p.tq) {
            ci[rr] = FOLD ? (p.cq[(long long)bh * p.tq + r] - cref) * LOG2E : p.cq[(long long)bh * p.tq + r] * LOG2E;
            pos[rr] = p.q_pos0 + r;
            st[rr] = row_start(p, b, r);
        } else {
            ci[rr] = 0.f;
            pos[rr] = -1;
            st[rr] = 0;
        }
    }
    float O[NA][32];
    wg_zero(O);
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

    if (n > 0) {
        // this warpgroup's first row: its tiles past the diagonal of the block's first rows need no mask
        const int pos_min = p.q_pos0 + r0 + cw * 64;
        const int start_max = row_start(p, b, rlast);
        const float scale_log2 = p.scale * LOG2E;
        const u32 q_s = smem_u32(sQ) + (u32)(cw * 64 * 128);
        const int mine = 1 + cw, other = 2 - cw;  // named barrier ids
        float S[NS];
        u32 a[NT / 2][4];
        // bias, mask and online softmax of tile i in S (S[4*nt + e] is mma.sync's S[nt][e]), in
        // log2 units: c_i and c_j come scaled by log2(e), so the bias costs a subtraction folded
        // into the scaling's FMA (one multiply per score less than wgmma.cu; the D = 64 forward is bound
        // by these per-score instructions, BENCHMARKS.md); returns the rows' rescale factors
        auto softmax = [&](int i, float (&corr)[2]) {
            const int s = i % NST;
            const float* c_s = sC + s * BK;
            const int jt = jbase + (first + i) * BK;
            const bool need_mask = (jt + BK - 1 > pos_min) || (jt < start_max);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                // one 8-byte load with FOLD (c_s is 8-byte aligned, which the compiler cannot see)
                const float2 cc = FOLD ? *(const float2*)(c_s + nt * 8 + 2 * t4)
                                       : make_float2(c_s[nt * 8 + 2 * t4], c_s[nt * 8 + 2 * t4 + 1]);
                const float c0 = cc.x, c1 = cc.y;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int rr = e >> 1;
                    float x = FOLD ? fmaf(S[4 * nt + e], scale_log2, (e & 1) ? c1 : c0)
                                   : fmaf(S[4 * nt + e], scale_log2, ci[rr] - ((e & 1) ? c1 : c0));
                    if (need_mask) {
                        const int j = jt + nt * 8 + 2 * t4 + (e & 1);
                        if (j > pos[rr] || j < st[rr]) x = NEG_INF;
                    }
                    S[4 * nt + e] = x;
                }
            }
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const float mx = row_max<NT>(S, rr);
                const float mnew = FOLD ? (mx > m[rr] + RESCALE_LOG2 ? mx : m[rr]) : fmaxf(m[rr], mx);
                const float muse = mnew == NEG_INF ? 0.f : mnew;
                corr[rr] = FOLD && mnew == m[rr] ? 1.f : fast_exp2(m[rr] - muse);
                m[rr] = mnew;
                const float rs = row_exp_sum<NT>(S, rr, muse);
                l[rr] = l[rr] * corr[rr] + rs;
            }
        };
        auto pack = [&]() { wg_pack_a<BF>(S, a); };
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
        ws_issue_s<D, BF, BQ, BK, NS>(S, q_s, k_at(0));
        if (PINGPONG) named_arrive(other);
        wg_wait<0>();
        float corr[2];
        softmax(0, corr);
        pack();
        for (int i = 1; i < n; ++i) {
            mbar_wait(full(i % NST), phase(i));
            if (PINGPONG) named_sync(mine);
            ws_issue_s<D, BF, BQ, BK, NS>(S, q_s, k_at(i));
            ws_issue_pv<D, BF, BK, NA, NT>(O, a, v_at(i - 1));
            if (PINGPONG) named_arrive(other);
            wg_wait<1>();  // S of tile i (committed first)
            softmax(i, corr);
            wg_wait<0>();  // P V of tile i - 1
            release(i - 1);
            if (!FOLD || __any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
                for (int at = 0; at < NA; ++at)
#pragma unroll
                    for (int dtl = 0; dtl < 8; ++dtl)
#pragma unroll
                        for (int rr = 0; rr < 2; ++rr) {
                            O[at][4 * dtl + 2 * rr] *= corr[rr];
                            O[at][4 * dtl + 2 * rr + 1] *= corr[rr];
                        }
            }
            pack();
        }
        if (PINGPONG) named_sync(mine);
        ws_issue_pv<D, BF, BK, NA, NT>(O, a, v_at(n - 1));
        if (PINGPONG && cw == 0) named_arrive(other);
        wg_wait<0>();
        release(n - 1);
    }
    if constexpr (FOLD) {
        // the row term left out of every score: lse = max + c_i - c_ref + log(sum)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) m[rr] += ci[rr];
    }
    store_o_rows<D, BF>(p, O, m, l, rows, b, h, bh, t4);
}

// ---------------------------------------------------------------------------------------------
// The warp-specialised backward: one pass per key block. Two consumer warpgroups of 64 keys each
// (128 keys a block) walk the query tiles of 64 rows that see the block, as wgmma.cu's dk/dv pass
// does, and each also forms its keys' share of dQ = dS K from its dS^T staged in shared memory: 5
// matrix products per tile pair instead of 7, and no second pass. Warpgroup 0 holds a loader warp
// (TMA for K, V, Q and dO into a two-stage ring with mbarriers; its lanes copy lse, delta and the
// gate sums) and a writer thread, which adds each warpgroup's staged dQ share (with the row sums
// of dS, dcq, in eight extra columns) into fp32 scratch with one bulk reduction
// (cp.reduce.async.bulk). The consumer warpgroups share no barrier, so they drift apart and one's
// exponentials overlap the other's matrix products.
// The adds into a query tile happen in a fixed order, so the sums are deterministic: a counter per
// (head, query tile) says how many of the tile's key blocks have added. The key blocks that see a
// query tile are a run ending at its diagonal block (starts, windows and ACP only cut the run's
// beginning), and they add from the diagonal down, so a block's turn is its distance from the
// diagonal. Blocks are launched last key block first: a block only waits on later key blocks,
// which started before it and reach each query tile two tiles sooner, so waits are rare (adding in
// ascending order instead made every block wait for its predecessor: 1.5x slower, measured).
// ---------------------------------------------------------------------------------------------
struct BwdWsParams {
    AttnParams a;
    float* acc;     // [B, H, tq, D + 8] fp32: dq, then eight partial sums of dcq; zero at launch
    unsigned* sem;  // [B, H, ceil(tq / 64)], zero at launch
    TmaMap k, v, q, g;  // (D, T, heads, B): k, v (128-row boxes), q, dO (64-row boxes)
};

// d (+)= A(smem, M-major) * B(smem, N-major): m64n32k16 (d[16]) and m64n64k16 (d[32])
template <bool BF>
__device__ __forceinline__ void wgmma_tt_n32(float (&d)[16], u64 da, u64 db, int accumulate) {
    WGMMA(BF, "%18", "m64n32k16", WG_D16 ", %16, %17, p, 1, 1, 1, 1", : WG_R16 : "l"(da), "l"(db), "r"(accumulate));
}
template <bool BF>
__device__ __forceinline__ void wgmma_tt_n64(float (&d)[32], u64 da, u64 db, int accumulate) {
    WGMMA(BF, "%34", "m64n64k16", WG_D32 ", %32, %33, p, 1, 1, 1, 1", : WG_R32 : "l"(da), "l"(db), "r"(accumulate));
}

// d[4] (+)= A(registers) * B(smem, K-major), m64n8k16: the gate sums' products (B a tile of ones)
template <bool BF>
__device__ __forceinline__ void wgmma_rs_n8(float (&d)[4], const u32 (&a)[4], u64 db) {
    WGMMA(BF, "1", "m64n8k16", "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0",
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// d[4] (+)= A(smem, M-major) * B(smem, K-major), m64n8k16
template <bool BF>
__device__ __forceinline__ void wgmma_t_n8(float (&d)[4], u64 da, u64 db, int accumulate) {
    WGMMA(BF, "%6", "m64n8k16", "{%0,%1,%2,%3}, %4, %5, p, 1, 1, 1, 0",
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void bulk_reduce_add(float* dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// One step of a transposing butterfly sum over the lanes that differ in `mask`: of v[0, 2·HALF),
// the lane with that bit set keeps the upper half, the other the lower, each adding its
// partner's copy of the half it keeps into v[0, HALF). Half the shuffles of reducing every value.
template <int HALF>
__device__ __forceinline__ void fold_half(float* v, int lane, int mask) {
    const bool up = (lane & mask) != 0;
#pragma unroll
    for (int i = 0; i < HALF; ++i) {
        const float send = up ? v[i] : v[i + HALF];
        const float keep = up ? v[i + HALF] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
    }
}

// P^T and dS^T of one tile in place of S^T and dP^T (S^T[4*nt + e]: key row g + 8*(e>>1), query
// column nt*8 + 2*t4 + (e&1)); a_s and del_s hold the columns' (c_i - lse_i) log2(e) and delta.
// MASK is a template argument so that the unmasked tiles (all but those on the diagonal or a
// row's start) run straight-line code: a mask test inside the unrolled loop put a branch after
// every score, which kept ptxas from interleaving the scores' exponentials (ncu: instruction-fetch
// and dependency stalls). With SHFL, -dS^T's row sums into dck and the row values loaded one by one.
template <bool MASK, bool SHFL, int NTQ>
__device__ __forceinline__ void bwd_ws_probs(float (&ST)[32], float (&DS)[32], float (&dck)[2], const AttnParams& p, int b,
                                             int rq, const int (&jrow)[2], const float (&ck2)[2], float scale_log2,
                                             const float* a_s, const float* del_s, const int* st_s, int t4) {
    const KeyMask mask = key_mask(p, b);
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt) {
        // the column pair's row values: one 8-byte load each without SHFL (the arrays are 8-byte
        // aligned, which the compiler cannot see)
        const int i0 = nt * 8 + 2 * t4;
        const float2 av = SHFL ? make_float2(a_s[i0], a_s[i0 + 1]) : *(const float2*)(a_s + i0);
        const float2 dv = SHFL ? make_float2(del_s[i0], del_s[i0 + 1]) : *(const float2*)(del_s + i0);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int il = i0 + (e & 1);
            const int kr = e >> 1;
            float pr = fast_exp2(fmaf(ST[4 * nt + e], scale_log2, ((e & 1) ? av.y : av.x) - ck2[kr]));
            if (MASK && mask.hides(rq + il, jrow[kr], st_s + il)) pr = 0.f;
            const float d = pr * (DS[4 * nt + e] - ((e & 1) ? dv.y : dv.x));
            if constexpr (SHFL) dck[kr] -= d;
            ST[4 * nt + e] = pr;
            DS[4 * nt + e] = d;
        }
    }
}

// A warp's dS^T fragments (its 16 keys as rows, the tile's BQB query rows as columns) into the
// warpgroup's 128-byte-swizzled atom at ds.
template <int NTQ>
__device__ __forceinline__ void bwd_ws_store_dst(u16* ds, const u32 (&as)[NTQ / 2][4], int wq, int g, int t4) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int key = wq * 16 + g + rr * 8;
#pragma unroll
        for (int nt = 0; nt < NTQ; ++nt)
            *(u32*)(ds + key * 64 + ((nt ^ (key & 7)) << 3) + 2 * t4) = as[nt >> 1][(nt & 1) * 2 + rr];
    }
}
// Row `row` of a warp's share of a dQ tile (half rr of its 16 query rows, the warpgroup's DH
// columns from col0) into the staging tiles sdq (row stride DP); returns the row.
template <int DH, int DP>
__device__ __forceinline__ float* bwd_ws_stage_row(float* sdq, int row, int col0, const float (&dQ)[DH / 2], int rr, int t4) {
    float* srow = sdq + row * DP + col0;
#pragma unroll
    for (int nt = 0; nt < DH / 8; ++nt)
        *(float2*)(srow + nt * 8 + 2 * t4) = make_float2(dQ[4 * nt + 2 * rr], dQ[4 * nt + 2 * rr + 1]);
    return srow;
}

// The gate sums dck_j = -sum_i dS_ij and dcq_i = sum_j dS_ij (the latter zero in exact arithmetic;
// formed because delta comes from the rounded O, whose error dck's sums carry and dcq's cancel in
// d log f's prefix sums). By default from the products: dS^T (the bf16 / fp16 fragments of dK's
// product) times a tile of ones gives dck in dK's row layout, and the staged dS times ones gives
// dcq in dQ's, so both sums see the same rounded dS as dK and dQ and d log f's cancellation stays
// exact; a few n8 products replace one add per score and the column sums' shuffles (at D = 64 a
// sixth of the per-score instructions). SHFL: the sums in fp32 by adds and shuffles
// (FOX_BWD_WS_SHFL=1, the kernel of BENCHMARKS.md's 2026-11-24 table).
template <int D, bool BF, bool SHFL>
__device__ __forceinline__ void bwd_ws_impl(const BwdWsParams& P) {
    const AttnParams& p = P.a;
    constexpr int BKB = 128, BQB = 64, NTQ = BQB / 8, NA = D / 64, DP = D + 8;
    // dS^T stages (two at D = 64; at D = 128 one, for shared memory) and two dQ staging tiles
    constexpr int DSS = D == 64 ? 2 : 1;
    // PIPE (D = 64 with the gate sums by products): the next tile's S^T and dP^T are issued
    // before this tile's dQ products are awaited. At D = 128 their accumulators do not fit beside
    // dK, dV and dQ; and the tile written as steps compiled D = 128 2% slower (ptxas moved the
    // mask test after the wait), so the plain loop stays for the other kernels.
    constexpr bool PIPE = D == 64 && !SHFL;
    constexpr u32 KV_BYTES = BKB * D * 2, QG_BYTES = BQB * D * 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 raw = smem_u32(smem_raw);
    unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
    u16* sK = (u16*)smem;          // NA atoms of [BKB][64]
    u16* sV = sK + BKB * D;
    u16* sQ = sV + BKB * D;        // [2 stages] NA atoms of [BQB][64]
    u16* sG = sQ + 2 * BQB * D;    // [2 stages]
    u16* sDS = sG + 2 * BQB * D;   // [DSS][2 warpgroups] dS^T, one atom [64 keys][64 query rows]
    float* sDQ = (float*)(sDS + DSS * 2 * 64 * BQB);  // [2][BQB][DP] the block's staged dQ shares
    u16* sOne = (u16*)(sDQ + 2 * BQB * DP);  // [8][64] ones: B of the gate sums' products
    float* sA = (float*)(sOne + 8 * 64);  // [2 stages][BQB]: (c_i - lse_i) log2(e)
    float* sDel = sA + 2 * BQB;
    int* sSt = (int*)(sDel + 2 * BQB);
    const u32 bars = smem_u32(sSt + 2 * BQB);
    const u32 kv_full = bars;
    auto full = [&](int s) { return bars + 8u + 8u * (u32)s; };
    auto empty = [&](int s) { return bars + 24u + 8u * (u32)s; };
    auto dq_full = [&](int s) { return bars + 40u + 8u * (u32)s; };
    auto dq_empty = [&](int s) { return bars + 56u + 8u * (u32)s; };

    const int lane = threadIdx.x & 31, warp_all = threadIdx.x >> 5;
    // last key block first: a block waits only on blocks after it, which start no later
    const int kb = gridDim.x - 1 - blockIdx.x;
    const int b = blockIdx.y / p.Hkv, hk = blockIdx.y % p.Hkv, group = p.H / p.Hkv;
    const int j0 = kb * BKB;
    const int jlast = min(j0 + BKB, p.tk) - 1;
    const int qfirst = max(j0 - p.q_pos0, 0) / BQB;
    const int nqt = (p.tq + BQB - 1) / BQB;
    if (threadIdx.x == 0) {
        mbar_init(kv_full, 1);
        for (int x = 0; x < 2; ++x) {
            mbar_init(full(x), 2);  // the tensor copies' arrival and the row values'
            mbar_init(empty(x), 8);
            mbar_init(dq_full(x), 8);
            mbar_init(dq_empty(x), 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp_all < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");  // balances the consumers' 240 (as in the forward)
        if (warp_all == 1) {
            // the loader
            if (lane == 0) {
                mbar_expect_tx(kv_full, 2 * KV_BYTES);
                tma_load_pair<BKB, NA>(sK, &P.k, sV, &P.v, kv_full, j0, hk, b);
            }
            int u = 0;
            for (int h = hk * group; h < (hk + 1) * group; ++h) {
                const int bh = b * p.H + h;
                const int qend = dkdv_query_end(p, b, bh, qfirst, BQB, jlast);
                for (int qi = qfirst; qi < qend; ++qi, ++u) {
                    const int s = u & 1, rq = qi * BQB;
                    if (u >= 2) mbar_wait(empty(s), (u32)(((u >> 1) - 1) & 1));
                    if (lane == 0) {
                        mbar_expect_tx(full(s), 2 * QG_BYTES);
                        tma_load_pair<BQB, NA>(sQ + s * BQB * D, &P.q, sG + s * BQB * D, &P.g, full(s), rq, h, b);
                    }
                    for (int x = lane; x < BQB; x += 32) {
                        const int r = rq + x;
                        const bool in = r < p.tq;
                        const long long idx = (long long)bh * p.tq + (in ? r : 0);
                        sA[s * BQB + x] = in ? (p.cq[idx] - p.lse_in[idx]) * LOG2E : 0.f;
                        sDel[s * BQB + x] = in ? p.delta[idx] : 0.f;
                        if (p.start_mode == 2) sSt[s * BQB + x] = p.start[(long long)b * p.tq + (in ? r : 0)];
                    }
                    __syncwarp();
                    if (lane == 0) mbar_arrive(full(s));
                }
            }
        } else if (threadIdx.x == 0) {
            // the writer: adds the block's staged share of each tile, in the tile's order
            int u = 0;
            for (int h = hk * group; h < (hk + 1) * group; ++h) {
                const int bh = b * p.H + h;
                const int qend = dkdv_query_end(p, b, bh, qfirst, BQB, jlast);
                for (int qi = qfirst; qi < qend; ++qi, ++u) {
                    const int khi = min((p.q_pos0 + min(qi * BQB + BQB, p.tq) - 1) / BKB, (int)gridDim.x - 1);
                    const u32 turn = (u32)(khi - kb);
                    unsigned* sem = P.sem + (long long)bh * nqt + qi;
                    const int rows = min(BQB, p.tq - qi * BQB);
                    const int s = u & 1;
                    mbar_wait(dq_full(s), (u32)((u >> 1) & 1));
                    while (ld_acquire(sem) != turn) {
                    }
                    asm volatile("fence.proxy.async.global;\n" ::: "memory");
                    bulk_reduce_add(P.acc + ((long long)bh * p.tq + qi * BQB) * DP, smem_u32(sDQ + s * BQB * DP),
                                    (u32)(rows * DP * 4));
                    mbar_arrive(dq_empty(s));
                    asm volatile("fence.proxy.async.global;\n" ::: "memory");
                    __threadfence();
                    st_release(sem, turn + 1);
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int cw = (warp_all >> 2) - 1, wq = warp_all & 3;  // consumer warpgroup, warp in it
    const int g = lane >> 2, t4 = lane & 3;
    int jrow[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) jrow[rr] = j0 + cw * 64 + wq * 16 + g + rr * 8;
    float dK[NA][32], dV[NA][32];
#pragma unroll
    for (int at = 0; at < NA; ++at)
#pragma unroll
        for (int j = 0; j < 32; ++j) dK[at][j] = dV[at][j] = 0.f;
    const u32 k_s = smem_u32(sK) + (u32)(cw * 64 * 128);  // this warpgroup's 64 keys in each atom
    const u32 v_s = smem_u32(sV) + (u32)(cw * 64 * 128);
    // dQ = dS K over all 128 keys: each warpgroup forms half of dQ's columns (K read MN-major)
    constexpr int DH = D / 2;
    const u32 kq_s = smem_u32(sK) + (u32)((D == 128 ? cw * BKB * 128 : cw * DH * 2));
    const u32 one_s = smem_u32(sOne);
    if constexpr (!SHFL) {
        // the staging tiles' last eight columns are added into the scratch with each tile: each
        // warpgroup's share of dcq in the first two, the other six zero, written once (visible
        // to the bulk reductions by the fences before each tile's dq_full arrival); the ones
        // tile, seen by the tensor cores after the proxy fence and the barrier
        const int ct = threadIdx.x - 128;
        for (int x = ct; x < 2 * BQB * 8; x += 256) sDQ[(x >> 3) * DP + D + (x & 7)] = 0.f;
        ((u32*)sOne)[ct] = BF ? 0x3f803f80u : 0x3c003c00u;
        fence_proxy_async();
        named_sync(1);
    }
    mbar_wait(kv_full, 0);
    int u = 0;

    for (int h = hk * group; h < (hk + 1) * group; ++h) {
        const int bh = b * p.H + h;
        const int qend = dkdv_query_end(p, b, bh, qfirst, BQB, jlast);
        float ck2[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) ck2[rr] = jrow[rr] < p.tk ? p.ck[(long long)bh * p.tk + jrow[rr]] * LOG2E : 0.f;
        float dck[2] = {0.f, 0.f};
        float dcK[4] = {0.f, 0.f, 0.f, 0.f};  // -dck by the ones product (columns equal)
        const float scale_log2 = p.scale * LOG2E;
        if constexpr (PIPE) {
            // The loop below in steps (D = 64, gate sums by products), so that the next tile's
            // S^T and dP^T are issued before this tile's dQ products are awaited.
            float ST[32], DS[32];
            // S^T and dP^T of the tile in stage uu & 1, committed
            auto issue_st_dpt = [&](int uu) {
                const int ss = uu & 1;
                mbar_wait(full(ss), (u32)((uu >> 1) & 1));
                wg_issue_pair<D, BF, BKB, BQB>(ST, DS, k_s, v_s, smem_u32(sQ + ss * BQB * D), smem_u32(sG + ss * BQB * D));
            };
            // P^T and dS^T in place of S^T and dP^T, as below
            auto probabilities = [&](int qi, int uu) {
                const int ss = uu & 1;
                const float* a_s = sA + ss * BQB;
                const float* del_s = sDel + ss * BQB;
                const int* st_s = sSt + ss * BQB;
                const int rq = qi * BQB;
                const bool need_mask = dkdv_tile_masked(p, b, rq, BQB, j0, jlast);
                if (need_mask)
                    bwd_ws_probs<true, false, NTQ>(ST, DS, dck, p, b, rq, jrow, ck2, scale_log2, a_s, del_s, st_s, t4);
                else
                    bwd_ws_probs<false, false, NTQ>(ST, DS, dck, p, b, rq, jrow, ck2, scale_log2, a_s, del_s, st_s, t4);
            };
            // dV += P^T dO, dK += dS^T Q, dcK += dS^T ones, committed; ap and as hold the
            // fragments until the products complete
            u32 ap[NTQ / 2][4], as[NTQ / 2][4];
            auto issue_dkdv = [&](int uu) {
                const int ss = uu & 1;
                wg_issue_dkdv<D, BF, BQB, NTQ, NA>(dK, dV, ST, DS, ap, as, smem_u32(sQ + ss * BQB * D),
                                                   smem_u32(sG + ss * BQB * D));
                wg_fence();
#pragma unroll
                for (int kq = 0; kq < NTQ / 2; ++kq) wgmma_rs_n8<BF>(dcK, as[kq], gmma_desc(one_s + (kq & 3) * 32, 16, 1024));
                wg_commit();
            };
            // dS^T into this warpgroup's atom of stage uu & 1, then a barrier: both warpgroups'
            // are in place (the stage's previous readers, two tiles back, are past the last one)
            auto store_dst = [&](int uu) {
                bwd_ws_store_dst<NTQ>(sDS + ((uu & 1) * 2 + cw) * 64 * BQB, as, wq, g, t4);
                fence_proxy_async();
                named_sync(1);
            };
            // this warpgroup's half of dQ's columns and its dcq share, as below, committed
            float dQ[DH / 2], dcQ[4];
            auto issue_dq = [&](int uu) {
                const u32 ds_s = smem_u32(sDS + (uu & 1) * 2 * 64 * BQB);
                wg_fence();
#pragma unroll
                for (int k = 0; k < 8; ++k)
                    wgmma_tt_n32<BF>(dQ, gmma_desc(ds_s + k * 2048, 64 * 128, 1024),
                                     gmma_desc(kq_s + (u32)(k * 2048), BKB * 128, 1024), k > 0 ? 1 : 0);
#pragma unroll
                for (int k = 0; k < 4; ++k) dcQ[k] = 0.f;
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    wgmma_t_n8<BF>(dcQ, gmma_desc(ds_s + (u32)((cw * 4 + k) * 2048), 64 * 128, 1024),
                                   gmma_desc(one_s + k * 32, 16, 1024), k > 0 ? 1 : 0);
                wg_commit();
            };
            // the completed dQ and dcq shares into staging tile uu & 1 once the writer has added
            // the one of two tiles back; then stage uu's Q and dO are released (the dK, dV
            // products have completed too)
            auto stage_dq = [&](int uu) {
                const int ss = uu & 1;
                if (uu >= 2) mbar_wait(dq_empty(ss), (u32)(((uu >> 1) - 1) & 1));
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) {
                    float* srow = bwd_ws_stage_row<DH, DP>(sDQ, ss * BQB + wq * 16 + g + rr * 8, cw * DH, dQ, rr, t4);
                    if (t4 == 0) srow[D - cw * DH + cw] = dcQ[2 * rr];
                }
                fence_proxy_async();
                __syncwarp();
                if (lane == 0) {
                    mbar_arrive(dq_full(ss));
                    mbar_arrive(empty(ss));  // this warp is done with the stage's Q and dO
                }
            };

            // the next tile's S^T and dP^T are issued after this tile's dQ products and run
            // under its staging (every path leaves with nothing in flight)
            if (qfirst < qend) {
                issue_st_dpt(u);
                int qi = qfirst;
                for (; qi + 1 < qend; ++qi, ++u) {
                    wg_wait0();
                    probabilities(qi, u);
                    issue_dkdv(u);
                    store_dst(u);
                    issue_dq(u);
                    issue_st_dpt(u + 1);
                    wg_wait<1>();
                    stage_dq(u);
                }
                wg_wait0();
                probabilities(qi, u);
                issue_dkdv(u);
                store_dst(u);
                issue_dq(u);
                wg_wait0();
                stage_dq(u);
                ++u;
            }
        } else {
            for (int qi = qfirst; qi < qend; ++qi, ++u) {
                const int s = u & 1;
                mbar_wait(full(s), (u32)((u >> 1) & 1));
                const u32 q_s = smem_u32(sQ + s * BQB * D);
                const u32 g_s = smem_u32(sG + s * BQB * D);
                const float* a_s = sA + s * BQB;
                const float* del_s = sDel + s * BQB;
                const int* st_s = sSt + s * BQB;
                const int rq = qi * BQB;
                const bool need_mask = dkdv_tile_masked(p, b, rq, BQB, j0, jlast);

                float ST[32], DS[32];
                wg_issue_pair<D, BF, BKB, BQB>(ST, DS, k_s, v_s, q_s, g_s);
                wg_wait0();
                if (need_mask)
                    bwd_ws_probs<true, SHFL, NTQ>(ST, DS, dck, p, b, rq, jrow, ck2, scale_log2, a_s, del_s, st_s, t4);
                else
                    bwd_ws_probs<false, SHFL, NTQ>(ST, DS, dck, p, b, rq, jrow, ck2, scale_log2, a_s, del_s, st_s, t4);
                // with SHFL, this warp's column sums of dS^T over its 16 keys (its share of dcq). At
                // D = 64, where per-score instructions are the limit, by a transposing butterfly (lane (g, t4) ends
                // with columns rev3(g)·8 + 2·t4 + {0, 1}); at D = 128 by reducing each column onto
                // lanes g = 0, which is faster there (docs/kernel-notes.md)
                if constexpr (!SHFL && D == 128) {
                    // all of P^T and dS^T formed here: without the column sums in between, ptxas
                    // otherwise spreads this work into the products below and, short of registers,
                    // serialises the wgmma instructions (its warning C7512)
#pragma unroll
                    for (int k = 0; k < 32; ++k) asm volatile("" : "+f"(ST[k]), "+f"(DS[k]));
                }
                float cs[2 * NTQ];
#pragma unroll
                for (int k = 0; k < 2 * NTQ; ++k)
                    cs[k] = SHFL ? DS[4 * (k >> 1) + (k & 1)] + DS[4 * (k >> 1) + 2 + (k & 1)] : 0.f;
                if constexpr (SHFL && D == 64) {
                    fold_half<NTQ>(cs, lane, 4);
                    fold_half<NTQ / 2>(cs, lane, 8);
                    fold_half<NTQ / 4>(cs, lane, 16);
                } else if constexpr (SHFL) {
#pragma unroll
                    for (int k = 0; k < 2 * NTQ; ++k) {
                        cs[k] += __shfl_xor_sync(0xffffffffu, cs[k], 4);
                        cs[k] += __shfl_xor_sync(0xffffffffu, cs[k], 8);
                        cs[k] += __shfl_xor_sync(0xffffffffu, cs[k], 16);
                    }
                }
                u32 ap[NTQ / 2][4], as[NTQ / 2][4];
                wg_issue_dkdv<D, BF, BQB, NTQ, NA>(dK, dV, ST, DS, ap, as, q_s, g_s);
                if constexpr (!SHFL) {
                    // dcK += dS^T ones: each row's sum over the tile's query rows
                    wg_fence();
#pragma unroll
                    for (int kq = 0; kq < NTQ / 2; ++kq) wgmma_rs_n8<BF>(dcK, as[kq], gmma_desc(one_s + (kq & 3) * 32, 16, 1024));
                    wg_commit();
                }
                // dS^T into this warpgroup's atom of the stage (keys as rows). With two stages, the
                // stage's previous readers (two tiles back) are past the last barrier; with one, wait
                // until both warpgroups have read the previous tile's
                const int sd = DSS == 2 ? s : 0;
                u16* ds = sDS + (sd * 2 + cw) * 64 * BQB;
                const u32 ds_s = smem_u32(sDS + sd * 2 * 64 * BQB);
                if constexpr (DSS == 1) named_sync(1);
                bwd_ws_store_dst<NTQ>(ds, as, wq, g, t4);
                fence_proxy_async();
                named_sync(1);  // both warpgroups' dS^T are in place
                {
                    float dQ[DH / 2];
                    wg_fence();
#pragma unroll
                    for (int k = 0; k < 8; ++k) {
                        const u64 da = gmma_desc(ds_s + k * 2048, 64 * 128, 1024);
                        const u64 db = gmma_desc(kq_s + (u32)(k * 2048), BKB * 128, 1024);
                        if constexpr (D == 128) wgmma_tt_n64<BF>(dQ, da, db, k > 0 ? 1 : 0);
                        else wgmma_tt_n32<BF>(dQ, da, db, k > 0 ? 1 : 0);
                    }
                    // dcq: dS ones over this warpgroup's 64 keys (the same code in both warpgroups: a
                    // branch on the warpgroup made ptxas serialise the products)
                    float dcQ[4] = {0.f, 0.f, 0.f, 0.f};
                    if constexpr (!SHFL) {
#pragma unroll
                        for (int k = 0; k < 4; ++k)
                            wgmma_t_n8<BF>(dcQ, gmma_desc(ds_s + (u32)((cw * 4 + k) * 2048), 64 * 128, 1024),
                                           gmma_desc(one_s + k * 32, 16, 1024), k > 0 ? 1 : 0);
                    }
                    wg_commit();
                    wg_wait0();
                    // the staging tile is free once the writer has added its share of two tiles back
                    if (u >= 2) mbar_wait(dq_empty(s), (u32)(((u >> 1) - 1) & 1));
#pragma unroll
                    for (int rr = 0; rr < 2; ++rr) {
                        float* srow = bwd_ws_stage_row<DH, DP>(sDQ, s * BQB + wq * 16 + g + rr * 8, cw * DH, dQ, rr, t4);
                        if (!SHFL && t4 == 0) srow[D - cw * DH + cw] = dcQ[2 * rr];
                    }
                }
                float* dcq_col = sDQ + s * BQB * DP + D + cw * 4 + wq;
                if constexpr (SHFL && D == 64) {
                    const int nt = ((g & 1) << 2) | (g & 2) | (g >> 2);
#pragma unroll
                    for (int c = 0; c < 2; ++c) dcq_col[(nt * 8 + 2 * t4 + c) * DP] = cs[c];
                } else if (SHFL && g == 0) {
#pragma unroll
                    for (int k = 0; k < 2 * NTQ; ++k) dcq_col[((k >> 1) * 8 + 2 * t4 + (k & 1)) * DP] = cs[k];
                }
                fence_proxy_async();
                __syncwarp();
                if (lane == 0) {
                    mbar_arrive(dq_full(s));
                    mbar_arrive(empty(s));  // this warp is done with the stage's Q and dO
                }
            }
        }
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const float dc = SHFL ? quad_sum(dck[rr]) : -dcK[2 * rr];
            if (jrow[rr] < p.tk && t4 == 0) p.dck[(long long)bh * p.tk + jrow[rr]] = dc;
        }
    }  // query heads of the group

    store_dkdv_rows<D, BF>(p, dK, dV, jrow, b, hk, t4);
}
#endif

// Kernels: fox_fwdws_d{D}_{type} (128-key tiles; stages: 4 at D = 64, 3 at D = 128), the same
// with FOLD (fox_fwdwsfold_*: no faster, BENCHMARKS.md) and without ping-pong (fox_fwdwsnp_*),
// kept for the measurements in BENCHMARKS.md.
#define FOX_WS(D, TY, BF, NST)                                                                              \
    extern "C" __global__ void __launch_bounds__(384, 1) fox_fwdws_d##D##_##TY(const __grid_constant__ WsParams p) {   \
        FOX_WS_BODY(D, BF, NST, true, false)                                                                 \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(384, 1) fox_fwdwsfold_d##D##_##TY(const __grid_constant__ WsParams p) { \
        FOX_WS_BODY(D, BF, NST, true, true)                                                                  \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(384, 1) fox_fwdwsnp_d##D##_##TY(const __grid_constant__ WsParams p) { \
        FOX_WS_BODY(D, BF, NST, false, false)                                                                \
    }
#ifdef FOX_HAVE_WGMMA
#define FOX_WS_BODY(D, BF, NST, PP, FOLD) fwd_ws_impl<D, BF, 128, NST, PP, FOLD>(p);
#else
struct __align__(128) TmaMap {
    u64 w[16];
};
struct WsParams {
    AttnParams a;
    TmaMap q, k, v;
};
#define FOX_WS_BODY(D, BF, NST, PP, FOLD) __trap();
#endif
#ifdef FOX_HAVE_WGMMA
#define FOX_BWD_WS_BODY(D, BF, SHFL) bwd_ws_impl<D, BF, SHFL>(p);
#else
struct BwdWsParams {
    AttnParams a;
    float* acc;
    unsigned* sem;
    TmaMap k, v, q, g;
};
#define FOX_BWD_WS_BODY(D, BF, SHFL) __trap();
#endif
// The one-pass backward (fox_bwdws_d{D}_{type}, 384 threads: the writer's warpgroup and two
// consumer warpgroups; fox_bwdwsshfl_* with the gate sums by shuffles) and its epilogue
// (fox_bwdws_dq_d{D}_{type}).
#define FOX_BWD_WS(D, TY, BF)                                                                                      \
    extern "C" __global__ void __launch_bounds__(384, 1) fox_bwdws_d##D##_##TY(const __grid_constant__ BwdWsParams p) { FOX_BWD_WS_BODY(D, BF, false) } \
    extern "C" __global__ void __launch_bounds__(384, 1) fox_bwdwsshfl_d##D##_##TY(const __grid_constant__ BwdWsParams p) { FOX_BWD_WS_BODY(D, BF, true) }
FOX_BWD_WS(64, bf16, true)
FOX_BWD_WS(128, bf16, true)
FOX_BWD_WS(64, f16, false)
FOX_BWD_WS(128, f16, false)
// dq [B, tq, H, D] = scale * acc's first D columns in the dtype; dcq [B, H, tq] = the sum of its
// last four (each a warp's share, added in a fixed order).
// One thread per 4 columns of a row.
template <int D, bool BF>
__device__ __forceinline__ void bwd_ws_dq(const float* acc, u16* dq, float* dcq, int B, int H, int tq, float scale) {
    const long long n = (long long)B * H * tq * (D / 4);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long row = i / (D / 4);  // (b, h, r)
        const int c = (int)(i % (D / 4)) * 4;
        const int r = (int)(row % tq), bh = (int)(row / tq);
        const float* a = acc + row * (D + 8);
        const float4 x = *(const float4*)(a + c);
        uint2 y;
        y.x = pack2<BF>(x.x * scale, x.y * scale);
        y.y = pack2<BF>(x.z * scale, x.w * scale);
        const long long o = (((long long)(bh / H) * tq + r) * H + bh % H) * D + c;
        *(uint2*)(dq + o) = y;
        if (c == 0) dcq[row] = (((a[D] + a[D + 1]) + (a[D + 2] + a[D + 3])) + ((a[D + 4] + a[D + 5]) + (a[D + 6] + a[D + 7])));
    }
}
#define FOX_BWD_WS_DQ(D, TY, BF)                                                                            \
    extern "C" __global__ void fox_bwdws_dq_d##D##_##TY(const float* acc, u16* dq, float* dcq, int B, int H, int tq, \
                                                        float scale) {                                      \
        bwd_ws_dq<D, BF>(acc, dq, dcq, B, H, tq, scale);                                                    \
    }
FOX_BWD_WS_DQ(64, bf16, true)
FOX_BWD_WS_DQ(128, bf16, true)
FOX_BWD_WS_DQ(64, f16, false)
FOX_BWD_WS_DQ(128, f16, false)
FOX_WS(64, bf16, true, 4)
FOX_WS(128, bf16, true, 3)
FOX_WS(64, f16, false, 4)
FOX_WS(128, f16, false, 3)
