// Hopper (sm_90a) forward with warpgroup matrix instructions (wgmma), included after
// attention.cu. Two consumer warpgroups of 64 query rows each (256 threads, 128 rows a block),
// 64-key tiles through cp.async into shared memory laid out in the canonical 128-byte-swizzle
// atoms that wgmma descriptors address: a [rows, D] tile is stored as D/64 atoms of [rows][64]
// bf16 (128-byte rows, 16-byte chunk index XOR row % 8, 1024-byte aligned).
//   S = Q K^T : wgmma m64n64k16, A = Q and B = K from shared memory, both K-major.
//   O += P V  : wgmma m64nDk16, A = P from registers (the mma.sync A-fragment layout), B = V from
//               shared memory, MN-major (rows = keys, D contiguous).
// The accumulator layout of wgmma per warp equals mma.sync's per 8-column tile, so the bias,
// mask and online softmax are the same code as the mma.sync forward.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FOX_HAVE_WGMMA 1

template <int D, int R>
__device__ __forceinline__ int atom_off(int r, int c) {
    return (c >> 3) * R * 64 + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

// Thread `tid` of NTHREADS copies its share of rows [row0, row0 + R) into atoms (zero-filled
// where !ok(row)).
template <int D, int R, int NTHREADS, class F>
__device__ __forceinline__ void load_tile_atoms_by(int tid, u16* s, const u16* base, long long st, int row0, F ok) {
    constexpr int C = D / 8;
#pragma unroll
    for (int i0 = 0; i0 < R * C; i0 += NTHREADS) {
        const int i = i0 + tid;
        if (R * C % NTHREADS != 0 && i >= R * C) break;
        const int r = i / C, c = i % C;
        const int gr = row0 + r;
        const bool valid = ok(gr);
        const u16* src = valid ? base + (long long)gr * st + c * 8 : base;
        cp_async16(s + atom_off<D, R>(r, c), src, valid);
    }
}
template <int D, int R, int NTHREADS, class F>
__device__ __forceinline__ void load_tile_atoms(u16* s, const u16* base, long long st, int row0, F ok) {
    load_tile_atoms_by<D, R, NTHREADS>((int)threadIdx.x, s, base, st, row0, ok);
}

// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ u64 gmma_desc(u32 saddr, u32 lbo, u32 sbo) {
    u64 d = 0;
    d |= (u64)((saddr >> 4) & 0x3fff);
    d |= (u64)((lbo >> 4) & 0x3fff) << 16;
    d |= (u64)((sbo >> 4) & 0x3fff) << 32;
    d |= (u64)1 << 62;  // SWIZZLE_128B
    return d;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The wgmma passes' tile layout (SwzTiles is mma.sync's): atoms, read by the tensor cores through
// the async proxy, to which landed copies are made visible by a proxy fence before the barrier.
struct AtomTiles {
    template <int D, int R, int NTHREADS, class F>
    static __device__ __forceinline__ void load(u16* s, const u16* base, long long st, int row0, F ok) {
        load_tile_atoms<D, R, NTHREADS>(s, base, st, row0, ok);
    }
    static __device__ __forceinline__ void landed() { fence_proxy_async(); }
};

#define WG_R8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_R16 WG_R8(0), WG_R8(8)
#define WG_R32 WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24)
#define WG_R64 WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48), WG_R8(56)
#define WG_D16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define WG_D32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define WG_D64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
               "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
// One wgmma of shape SHAPE with f32 accumulators, bf16 operands when BF and fp16 otherwise: PRED
// is the operand that scales D (0: D = A B), ARGS the instruction's operands after the type and
// __VA_ARGS__ the asm's operand lists. asm takes only string literals, so the type picks between
// two copies of one text.
#define WGMMA(BF, PRED, SHAPE, ARGS, ...)                                                                       \
    do {                                                                                                        \
        if constexpr (BF)                                                                                       \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                      \
                         "wgmma.mma_async.sync.aligned." SHAPE ".f32.bf16.bf16 " ARGS ";\n}\n" __VA_ARGS__);    \
        else                                                                                                    \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                      \
                         "wgmma.mma_async.sync.aligned." SHAPE ".f32.f16.f16 " ARGS ";\n}\n" __VA_ARGS__);      \
    } while (0)

// d[32] (+)= A(smem, K-major) * B(smem, K-major), m64n64k16
template <bool BF>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], u64 da, u64 db, int accumulate) {
    WGMMA(BF, "%34", "m64n64k16", WG_D32 ", %32, %33, p, 1, 1, 0, 0", : WG_R32 : "l"(da), "l"(db), "r"(accumulate));
}

// d[32] (+)= A(registers) * B(smem; TB = 1: MN-major, 0: K-major), m64n64k16
template <bool BF, int TB>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const u32 (&a)[4], u64 db, int accumulate = 1) {
    WGMMA(BF, "%37", "m64n64k16", WG_D32 ", {%32,%33,%34,%35}, %36, p, 1, 1, %38",
          : WG_R32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(TB));
}

// d[64] (+)= A(registers) * B(smem, K-major), m64n128k16
template <bool BF>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const u32 (&a)[4], u64 db, int accumulate) {
    WGMMA(BF, "%69", "m64n128k16", WG_D64 ", {%64,%65,%66,%67}, %68, p, 1, 1, 0",
          : WG_R64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

template <int NS, bool BF>
__device__ __forceinline__ void wgmma_s(float (&S)[NS], const u32 (&a)[4], u64 db, int accumulate) {
    if constexpr (NS == 32) wgmma_rs_n64<BF, 0>(S, a, db, accumulate);
    else wgmma_rs_n128<BF>(S, a, db, accumulate);
}

// ---------------------------------------------------------------------------------------------
// Pieces shared by the wgmma kernels and the warp-specialised ones (attention_ws.cu).
// ---------------------------------------------------------------------------------------------
// The backward passes' paired products for a warpgroup's 64 rows: X = A_x B_x^T and Y = A_y B_y^T
// over D, the A tiles (RA rows in atoms; ax_s, ay_s: the warpgroup's first row) and the 64-row B
// tiles (RB rows in atoms) K-major in shared memory; committed, not awaited. The dq pass's S = Q K^T,
// dP = dO V^T; the dk/dv pass's S^T = K Q^T, dP^T = V dO^T.
template <int D, bool BF, int RA, int RB>
__device__ __forceinline__ void wg_issue_pair(float (&X)[32], float (&Y)[32], u32 ax_s, u32 ay_s, u32 bx_s, u32 by_s) {
    wg_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
        const u32 ao = (u32)((k >> 2) * RA * 128 + (k & 3) * 32);
        const u32 bo = (u32)((k >> 2) * RB * 128 + (k & 3) * 32);
        wgmma_ss_n64<BF>(X, gmma_desc(ax_s + ao, 16, 1024), gmma_desc(bx_s + bo, 16, 1024), k > 0 ? 1 : 0);
        wgmma_ss_n64<BF>(Y, gmma_desc(ay_s + ao, 16, 1024), gmma_desc(by_s + bo, 16, 1024), k > 0 ? 1 : 0);
    }
    wg_commit();
}

// dk/dv passes: P^T and dS^T (fp32 accumulator layout) packed as register A fragments, then
// dV += P^T dO and dK += dS^T Q with dO, Q read N-major; committed, not awaited. The fragments
// must stay live in ap, as until the products complete.
template <int D, bool BF, int BQB, int NTQ, int NA>
__device__ __forceinline__ void wg_issue_dkdv(float (&dK)[NA][32], float (&dV)[NA][32], const float (&P)[32],
                                              const float (&DS)[32], u32 (&ap)[NTQ / 2][4], u32 (&as)[NTQ / 2][4],
                                              u32 q_s, u32 g_s) {
#pragma unroll
    for (int kq = 0; kq < NTQ / 2; ++kq) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            ap[kq][x] = pack2<BF>(P[8 * kq + 2 * x], P[8 * kq + 2 * x + 1]);
            as[kq][x] = pack2<BF>(DS[8 * kq + 2 * x], DS[8 * kq + 2 * x + 1]);
        }
    }
    wg_fence();
#pragma unroll
    for (int at = 0; at < NA; ++at) {
#pragma unroll
        for (int kq = 0; kq < NTQ / 2; ++kq) {
            const u32 bo = (u32)(at * BQB * 128 + kq * 2 * 1024);
            wgmma_rs_n64<BF, 1>(dV[at], ap[kq], gmma_desc(g_s + bo, BQB * 128, 1024));
            wgmma_rs_n64<BF, 1>(dK[at], as[kq], gmma_desc(q_s + bo, BQB * 128, 1024));
        }
    }
    wg_commit();
}

// A warp's scores S (S[4 nt + e] is mma.sync's S[nt][e]) rounded to the dtype as the register A
// fragments of the next product, a[kc2] for its keys 16 kc2..
template <bool BF, int NS>
__device__ __forceinline__ void wg_pack_a(const float (&S)[NS], u32 (&a)[NS / 8][4]) {
#pragma unroll
    for (int kc2 = 0; kc2 < NS / 8; ++kc2)
#pragma unroll
        for (int x = 0; x < 4; ++x) a[kc2][x] = pack2<BF>(S[8 * kc2 + 2 * x], S[8 * kc2 + 2 * x + 1]);
}

// Zeroes a warpgroup accumulator: NA tiles of 64 x 64, 32 floats a thread.
template <int NA>
__device__ __forceinline__ void wg_zero(float (&acc)[NA][32]) {
#pragma unroll
    for (int i = 0; i < NA * 32; ++i) acc[i / 32][i % 32] = 0.f;
}

// acc += P B per 64-column atom of B, the wgmma twin of mma_scores_tile: P the BK scores of each row
// (wgmma's accumulator layout, rounded to the dtype as the register A operand), B the shared
// [BK keys, D] tile at b_s read MN-major. EACH: a commit and wait after every atom, as the forward
// was written and timed; the dq pass waits once, after all atoms.
template <int D, int BK, bool BF, bool EACH>
__device__ __forceinline__ void wg_scores_tile(const float (&S)[BK / 2], u32 b_s, float (&acc)[D / 64][32]) {
    u32 a[BK / 16][4];
    wg_pack_a<BF>(S, a);
    if (!EACH) wg_fence();
#pragma unroll
    for (int at = 0; at < D / 64; ++at) {
        if (EACH) wg_fence();
#pragma unroll
        for (int kc2 = 0; kc2 < BK / 16; ++kc2) {
            const u64 db = gmma_desc(b_s + (u32)(at * BK * 128 + kc2 * 2 * 1024), BK * 128, 1024);
            wgmma_rs_n64<BF, 1>(acc[at], a[kc2], db);
        }
        if (EACH) {
            wg_commit();
            wg_wait0();
        }
    }
    if (!EACH) {
        wg_commit();
        wg_wait0();
    }
}

template <int D, bool BF, int BK, int NWG>
__device__ __forceinline__ void fwd_wgmma_impl(const AttnParams& p) {
    constexpr int BQ = 64 * NWG, NTH = 128 * NWG, NT = BK / 8, NA = D / 64, NS = BK / 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // NA atoms of [BQ][64], then 2 x NA atoms of [BK][64] each for K and V
    const KeyWalkSmem<D, BK> sm(atom_aligned(smem_raw), BQ);
    u16 *sQ = sm.sQ, *sK = sm.sK, *sV = sm.sV;
    float* sC = sm.sC;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const QueryBlock q = query_block<BQ, BK>(p);
    if (tid == 0) count_tiles(p, q.first, q.ntiles);
    const QueryRows qr = query_rows<false>(p, q.b, q.bh, q.r0 + warp * 16 + g);
    // O[at][4*dtl + e] is mma.sync's O[8*at + dtl][e]
    float O[NA][32];
    wg_zero(O);
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

    const float scale_log2 = p.scale * LOG2E;
    u32 qf[D / 16][4];
    key_walk<D, BK, NTH, AtomTiles>(
        p, q, q.first, q.ntiles, sK, sV, sC,
        [&] { load_tile_atoms<D, BQ, NTH>(sQ, p.q + q.b * p.q_sb + q.h * p.q_sh, p.q_st, q.r0, QueryOk{p, q.b}); },
        [&](int it, int buf, int jt, bool need_mask) {
            const u32 k_s = smem_u32(sK + buf * BK * D);
            const u32 v_s = smem_u32(sV + buf * BK * D);
            if (it == q.first) {
                // this warp's 16 query rows as register A fragments (mma.sync layout), once
#pragma unroll
                for (int kc = 0; kc < D / 16; ++kc) {
                    const int row = warp * 16 + (lane & 15), ch = kc * 2 + (lane >> 4);
                    ldsm_x4(qf[kc][0], qf[kc][1], qf[kc][2], qf[kc][3], sQ + atom_off<D, BQ>(row, ch));
                }
            }
            float S[NS];
            wg_fence();
#pragma unroll
            for (int s = 0; s < D / 16; ++s) {
                const u64 db = gmma_desc(k_s + (u32)((s >> 2) * BK * 128 + (s & 3) * 32), 16, 1024);
                wgmma_s<NS, BF>(S, qf[s], db, s > 0 ? 1 : 0);
            }
            wg_commit();
            wg_wait0();

            fwd_softmax<D, NT>(S, sC + buf * BK, 0, jt, need_mask, qr.ci, qr.pos, qr.st, scale_log2, O, m, l);
            wg_scores_tile<D, BK, BF, true>(S, v_s, O);  // O += P V
        });
    store_o_rows<D, BF>(p, O, m, l, qr.rows, q.b, q.h, q.bh, t4);
}

// ---------------------------------------------------------------------------------------------
// Backward with wgmma. Same passes, bounds and masks as the mma.sync kernels in attention.cu.
// dq pass: 2 warpgroups x 64 query rows, 64-key tiles. S = Q K^T and dP = dO V^T from shared
// memory (K-major), dQ += dS K with dS from registers and K read MN-major.
// ---------------------------------------------------------------------------------------------
template <int D, bool BF, int NWG>
__device__ __forceinline__ void bwd_dq_wg_impl(const AttnParams& p) {
    constexpr int BQ = 64 * NWG, BK = 64, NTH = 128 * NWG, NT = BK / 8, NA = D / 64;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const KeyWalkSmem<D, BK> sm(atom_aligned(smem_raw), 2 * BQ);
    u16 *sQ = sm.sQ, *sG = sQ + BQ * D, *sK = sm.sK, *sV = sm.sV;  // sG: dO
    float* sC = sm.sC;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int wg = warp >> 2;
    const QueryBlock q = query_block<BQ, BK>(p);
    const QueryRows qr = query_rows<true>(p, q.b, q.bh, q.r0 + warp * 16 + g);
    float dQ[NA][32];
    wg_zero(dQ);
    float dcq[2] = {0.f, 0.f};

    const float scale_log2 = p.scale * LOG2E;
    const u32 q_s = smem_u32(sQ) + (u32)(wg * 64 * 128);
    const u32 g_s = smem_u32(sG) + (u32)(wg * 64 * 128);
    key_walk<D, BK, NTH, AtomTiles>(
        p, q, q.first, q.ntiles, sK, sV, sC, [&] { load_q_do<D, BQ, NTH, AtomTiles>(p, q, sQ, sG); },
        [&](int, int buf, int jt, bool need_mask) {
            const u32 k_s = smem_u32(sK + buf * BK * D);
            const u32 v_s = smem_u32(sV + buf * BK * D);
            float S[32], DP[32];
            wg_issue_pair<D, BF, BQ, BK>(S, DP, q_s, g_s, k_s, v_s);
            wg_wait0();
            dq_scores<NT>(S, DP, qr, sC + buf * BK, jt, need_mask, scale_log2, dcq);
            wg_scores_tile<D, BK, BF, false>(S, k_s, dQ);  // dQ += dS K
        });
    store_dq_rows<D, BF>(p, dQ, dcq, qr.rows, q.b, q.h, q.bh, t4);
}

// dk/dv pass: 2 warpgroups x 64 keys (128 keys a block), 64-row query tiles. S^T = K Q^T and
// dP^T = V dO^T from shared memory (K-major); dV += P^T dO and dK += dS^T Q with P^T, dS^T from
// registers and dO, Q read MN-major. Grid (ceil(tk / BKB), B*Hkv): with grouped-query attention
// the block keeps its K/V tile and walks the group's query heads in order (as the mma.sync pass).
template <int D, bool BF, int NWG>
__device__ __forceinline__ void bwd_dkdv_wg_impl(const AttnParams& p) {
    constexpr int BKB = 64 * NWG, BQB = 64, NTH = 128 * NWG, NTQ = BQB / 8, NA = D / 64;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 raw = smem_u32(smem_raw);
    const DkdvSmem<D, BKB, BQB> sm(smem_raw + (((raw + 1023u) & ~1023u) - raw));

    const DkdvBlock<BKB, BQB> kb(p);
    const int tid = threadIdx.x, warp = tid >> 5, t4 = tid & 3;
    const int wg = warp >> 2;
    float dK[NA][32], dV[NA][32];
    wg_zero(dK);
    wg_zero(dV);

    dkdv_load_kv<D, BKB, BQB, NTH, AtomTiles>(p, kb, sm);
    const u32 k_s = smem_u32(sm.k) + (u32)(wg * 64 * 128);
    const u32 v_s = smem_u32(sm.v) + (u32)(wg * 64 * 128);
    dkdv_walk<D, BKB, BQB, NTH, AtomTiles>(p, kb, sm, [] {}, [&](const DkdvTile& t) {
        float ST[32], DP[32];
        wg_issue_pair<D, BF, BKB, BQB>(ST, DP, k_s, v_s, t.q_s, t.g_s);
        wg_wait0();
        t.scores<NTQ>(ST, DP);
        u32 ap[NTQ / 2][4], as[NTQ / 2][4];
        wg_issue_dkdv<D, BF, BQB, NTQ, NA>(dK, dV, ST, DP, ap, as, t.q_s, t.g_s);
        wg_wait0();
    });
    store_dkdv_rows<D, BF>(p, dK, dV, kb.jrow, kb.b, kb.hk, t4);
}
#endif

#define FOX_WG(D, TY, BF)                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 1) fox_fwdwg_d##D##_##TY(const AttnParams p) {     \
        FOX_WG_BODY(fwd_wgmma_impl, D, BF, 64, 2)                                                      \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 1) fox_fwdwg128_d##D##_##TY(const AttnParams p) {  \
        FOX_WG_BODY(fwd_wgmma_impl, D, BF, 128, 2)                                                     \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(128, 2) fox_fwdwg1_d##D##_##TY(const AttnParams p) {    \
        FOX_WG_BODY(fwd_wgmma_impl, D, BF, 64, 1)                                                      \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 1) fox_bwd_dqwg_d##D##_##TY(const AttnParams p) {  \
        FOX_WG_BODY(bwd_dq_wg_impl, D, BF, 2)                                                          \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(128, 2) fox_bwd_dqwg1_d##D##_##TY(const AttnParams p) { \
        FOX_WG_BODY(bwd_dq_wg_impl, D, BF, 1)                                                          \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 1) fox_bwd_dkdvwg_d##D##_##TY(const AttnParams p) { \
        FOX_WG_BODY(bwd_dkdv_wg_impl, D, BF, 2)                                                        \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(128, 2) fox_bwd_dkdvwg1_d##D##_##TY(const AttnParams p) { \
        FOX_WG_BODY(bwd_dkdv_wg_impl, D, BF, 1)                                                        \
    }
#ifdef FOX_HAVE_WGMMA
#define FOX_WG_BODY(IMPL, ...) IMPL<__VA_ARGS__>(p);
#else
#define FOX_WG_BODY(IMPL, ...) __trap();
#endif
FOX_WG(64, bf16, true)
FOX_WG(128, bf16, true)
FOX_WG(64, f16, false)
FOX_WG(128, f16, false)
