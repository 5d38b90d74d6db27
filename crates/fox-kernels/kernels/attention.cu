// Forgetting Attention on NVIDIA GPUs (sm_80+; tensor cores through mma.sync m16n8k16).
//
//   s_ij = scale * q_i . k_j + c_i - c_j   (j <= i, j >= start(i)),   o_i = softmax_j(s_ij) v_j
//
// Layout of the work follows FlashAttention-2: the forward and the dq pass give each warp 16
// query rows and stream key tiles of 64 through shared memory (cp.async, double-buffered); the
// dk/dv pass gives each warp 16 keys and streams query tiles. The bias c_i - c_j is formed in
// fp32 from the fp32 prefix sums before it joins the logit. Softmax runs in base 2 (exp2 of
// logit * log2 e), statistics in fp32. dc for the keys is the column sum of dS, accumulated by
// the warp that owns the key: no atomics anywhere on the hot path.
//
// Included after common.cuh.

// mma.sync's tile layout: swizzled [rows, D] tiles read by ldmatrix.
struct SwzTiles {
    template <int D, int R, int NTHREADS, class F>
    static __device__ __forceinline__ void load(u16* s, const u16* base, long long st, int row0, F ok) {
        load_tile<D, R, NTHREADS>(s, base, st, row0, ok);
    }
    // copies that have landed are visible to ldmatrix after the block's barrier
    static __device__ __forceinline__ void landed() {}
};

// Key tile jt (BK keys) of a query block's walk into buffer buf: K and V in the pass's tile layout
// (keys outside [kstart, tk) zero-filled) and the keys' gate sums c_j.
template <int D, int BK, int NTH, class Tiles>
__device__ __forceinline__ void load_key_tile(const AttnParams& p, u16* sK, u16* sV, float* sC, const u16* kbase,
                                              const u16* vbase, const float* ckb, int kstart, int jt, int buf) {
    const int tid = threadIdx.x;
    auto ok = [&](int j) { return j < p.tk && j >= kstart; };
    Tiles::template load<D, BK, NTH>(sK + buf * BK * D, kbase, p.k_st, jt, ok);
    Tiles::template load<D, BK, NTH>(sV + buf * BK * D, vbase, p.v_st, jt, ok);
    if (tid < BK) {
        const int j = jt + tid;
        cp_async4(sC + buf * BK + tid, ckb + (j < p.tk ? j : 0), j < p.tk);
    }
}

// Step it of a double-buffered walk over tiles [it0, end) whose tile it0 went into buffer 0:
// load(it + 1, other buffer) is issued and tile it awaited, visible to the block (in the Tiles
// layout) after the barrier. Returns tile it's buffer.
template <class Tiles, class Load>
__device__ __forceinline__ int walk_step(const Load& load, int it, int it0, int end) {
    const int buf = (it - it0) & 1;
    if (it + 1 < end) load(it + 1, buf ^ 1);
    cp_commit();
    cp_wait<1>();
    Tiles::landed();
    __syncthreads();
    return buf;
}

// load_key_tile for the query block of head bh = (b, h) whose key walk starts at jbase, from the
// first key its first row r0 may see: load(it, buf) brings key tile it into buffer buf.
template <int D, int BK, int NTH, class Tiles>
struct KeyTileLoader {
    const AttnParams& p;
    u16 *sK, *sV;
    float* sC;
    const u16* kbase;
    const u16* vbase;
    const float* ckb;
    int kstart, jbase;
    __device__ __forceinline__ KeyTileLoader(const AttnParams& p_, u16* sK_, u16* sV_, float* sC_, int b, int h, int bh,
                                             int r0, int jbase_)
        : p(p_), sK(sK_), sV(sV_), sC(sC_), kbase(p_.k + b * p_.k_sb + kv_head(p_, h) * p_.k_sh),
          vbase(p_.v + b * p_.v_sb + kv_head(p_, h) * p_.v_sh), ckb(p_.ck + (long long)bh * p_.tk),
          kstart(row_start(p_, b, r0)), jbase(jbase_) {}
    __device__ __forceinline__ void operator()(int it, int buf) const {
        load_key_tile<D, BK, NTH, Tiles>(p, sK, sV, sC, kbase, vbase, ckb, kstart, jbase + it * BK, buf);
    }
    __device__ __forceinline__ int next(int it, int it0, int end) const {
        return walk_step<Tiles>(*this, it, it0, end);
    }
};

// Scores k-block kb (two n8 tiles of C-layout fp32 accumulators) packed as an m16k16 A operand
// of mma.sync, rounded to the dtype.
template <int NT, bool BF>
__device__ __forceinline__ void a_frag(const float (&S)[NT][4], int kb, u32 (&a)[4]) {
    a[0] = pack2<BF>(S[2 * kb][0], S[2 * kb][1]);
    a[1] = pack2<BF>(S[2 * kb][2], S[2 * kb][3]);
    a[2] = pack2<BF>(S[2 * kb + 1][0], S[2 * kb + 1][1]);
    a[3] = pack2<BF>(S[2 * kb + 1][2], S[2 * kb + 1][3]);
}

// Accumulator element (nt, e) of an 8-column tile nt, e in mma.sync's C layout: mma.sync's
// [nt][e]; a wgmma product's [4*nt + e]; a wgmma accumulator of D columns in 64-column atoms,
// [nt / 8][4*(nt % 8) + e]. The kernels' shared steps and epilogues read either through it.
template <class F, int N>
__device__ __forceinline__ F& acc_at(F (&a)[N][4], int nt, int e) { return a[nt][e]; }
template <class F, int N>
__device__ __forceinline__ F& acc_at(F (&a)[N], int nt, int e) { return a[4 * nt + e]; }
template <class F, int N>
__device__ __forceinline__ F& acc_at(F (&a)[N][32], int nt, int e) { return a[nt >> 3][4 * (nt & 7) + e]; }

// acc += A B^T over k-chunk kc for a warp's 16 rows: a its A fragment of the chunk, B the NT·8 rows
// of the shared [rows, D] tile at b_s (K in S = Q K^T, V in dP = dO V^T, Q in S^T = K Q^T, ...).
template <int D, int NT, bool BF>
__device__ __forceinline__ void mma_rows_chunk(const Ldsm<D>& ls, const u32 (&a)[4], u32 b_s, int kc,
                                               float (&acc)[NT][4]) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
        u32 b0, b1, b2, b3;
        ldsm_x4a(b0, b1, b2, b3, ls.p1(b_s, np * 16, kc * 2));
        mma16816<BF>(acc[2 * np], a, b0, b1);
        mma16816<BF>(acc[2 * np + 1], a, b2, b3);
    }
}

// acc += P B for a warp's 16 rows: P its NT·8 scores (mma.sync's C layout, rounded to the dtype
// as the A operand), B the shared [keys, D] tile at b_s (V in the forward, K in the dq pass).
template <int D, int NT, bool BF>
__device__ __forceinline__ void mma_scores_tile(const Ldsm<D>& ls, const float (&S)[NT][4], u32 b_s,
                                                float (&acc)[D / 8][4]) {
#pragma unroll
    for (int kc2 = 0; kc2 < NT / 2; ++kc2) {
        u32 a[4];
        a_frag<NT, BF>(S, kc2, a);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            u32 b0, b1, b2, b3;
            ldsm_x4a_t(b0, b1, b2, b3, ls.p2(b_s, kc2 * 16, dp * 2));
            mma16816<BF>(acc[2 * dp], a, b0, b1);
            mma16816<BF>(acc[2 * dp + 1], a, b2, b3);
        }
    }
}

// A warp's accumulator as the flat array row_max and row_exp_sum read (acc_at's first two layouts).
template <int N>
__device__ __forceinline__ float* acc_flat(float (&a)[N][4]) { return &a[0][0]; }
template <int N>
__device__ __forceinline__ float* acc_flat(float (&a)[N]) { return a; }

// The forwards' step on a key tile's scores S (NT 8-column tiles, either layout) for a thread's two
// query rows (c_i, positions, first keys): bias c_i - c_j with c_j from sC[koff..] and the mask,
// in log2 units, then the online softmax: S <- exp2(S - m) with the new row maxima m, l updated
// and the rows of O (D columns, either layout) rescaled.
template <int D, int NT, class A, class Acc>
__device__ __forceinline__ void fwd_softmax(A& S, const float* sC, int koff, int jt, bool need_mask,
                                            const float (&ci)[2], const int (&pos)[2], const int (&st)[2],
                                            float scale_log2, Acc& O, float (&m)[2], float (&l)[2]) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int jl = koff + nt * 8 + 2 * t4 + (e & 1);
            const int rr = e >> 1;
            // c_i - c_j formed in fp32 first: keep the difference exact where it is small.
            float x = acc_at(S, nt, e) * scale_log2 + (ci[rr] - sC[jl]) * LOG2E;
            if (need_mask) {
                const int j = jt + jl;
                if (j > pos[rr] || j < st[rr]) x = NEG_INF;
            }
            acc_at(S, nt, e) = x;
        }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const float mx = row_max<NT>(acc_flat(S), rr);
        const float mnew = fmaxf(m[rr], mx);
        const float muse = mnew == NEG_INF ? 0.f : mnew;
        const float corr = fast_exp2(m[rr] - muse);
        m[rr] = mnew;
        const float rs = row_exp_sum<NT>(acc_flat(S), rr, muse);
        l[rr] = l[rr] * corr + rs;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            acc_at(O, dt, 2 * rr) *= corr;
            acc_at(O, dt, 2 * rr + 1) *= corr;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Per-warp tile step shared by the forward and the decode kernel: S = Q K^T for NT*8 keys
// starting at key `koff` of the shared tile, bias + mask, online softmax, O += P V.
// ---------------------------------------------------------------------------------------------
template <int D, int NT, bool BF>
__device__ __forceinline__ void fwd_tile_step(const Ldsm<D>& ls, const u32 (&qf)[D / 16][4], const u16* sK, const u16* sV,
                                              const float* sC, int koff, int jt, bool need_mask,
                                              const float (&ci)[2], const int (&pos)[2], const int (&st)[2],
                                              float scale_log2, float (&O)[D / 8][4], float (&m)[2],
                                              float (&l)[2]) {
    float S[NT][4];
    const u32 kb = smem_u32(sK) + (u32)(koff * D * 2), vb = smem_u32(sV) + (u32)(koff * D * 2);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) S[nt][0] = S[nt][1] = S[nt][2] = S[nt][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) mma_rows_chunk<D, NT, BF>(ls, qf[kc], kb, kc, S);
    fwd_softmax<D, NT>(S, sC, koff, jt, need_mask, ci, pos, st, scale_log2, O, m, l);
    // O += P V
    mma_scores_tile<D, NT, BF>(ls, S, vb, O);
}

// Load this warp's 16 rows of a swizzled [rows, D] tile as mma A fragments.
template <int D>
__device__ __forceinline__ void load_a_frag(const Ldsm<D>& ls, u32 (&f)[4], u32 sbase, int row0, int kc) {
    ldsm_x4a(f[0], f[1], f[2], f[3], ls.p2(sbase, row0, kc * 2));
}
template <int D>
__device__ __forceinline__ void load_a_frags(const Ldsm<D>& ls, u32 (&f)[D / 16][4], u32 sbase, int row0) {
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) load_a_frag<D>(ls, f[kc], sbase, row0, kc);
}

// The two A operands of the backward passes' paired products for a warp's 16 rows (Q and dO in
// the dq pass, K and V in the dk/dv pass), swizzled [rows, D] tiles at shared xs, ys. With D <= 64
// they are read once into registers (hold); above, per k-chunk, which keeps registers for the
// accumulators.
template <int D>
struct APair {
    static constexpr bool IN_REGS = D <= 64;
    u32 x[IN_REGS ? D / 16 : 1][4], y[IN_REGS ? D / 16 : 1][4];
    u32 xs, ys;
    int row0;
    __device__ __forceinline__ APair(u32 xs_, u32 ys_, int row0_) : xs(xs_), ys(ys_), row0(row0_) {}
    __device__ __forceinline__ void hold(const Ldsm<D>& ls) {
        if constexpr (IN_REGS) {
            load_a_frags<D>(ls, x, xs, row0);
            load_a_frags<D>(ls, y, ys, row0);
        }
    }
    // X += A_x B_x^T and Y += A_y B_y^T, zeroed first, against NT*8 rows of the shared tiles bx, by.
    template <int NT, bool BF>
    __device__ __forceinline__ void products(const Ldsm<D>& ls, u32 bx, u32 by, float (&X)[NT][4],
                                             float (&Y)[NT][4]) const {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            X[nt][0] = X[nt][1] = X[nt][2] = X[nt][3] = Y[nt][0] = Y[nt][1] = Y[nt][2] = Y[nt][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < D / 16; ++kc) {
            u32 ax[4], ay[4];
            if constexpr (IN_REGS) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    ax[i] = x[kc][i];
                    ay[i] = y[kc][i];
                }
            } else {
                load_a_frag<D>(ls, ax, xs, row0, kc);
                load_a_frag<D>(ls, ay, ys, row0, kc);
            }
            mma_rows_chunk<D, NT, BF>(ls, ax, bx, kc, X);
            mma_rows_chunk<D, NT, BF>(ls, ay, by, kc, Y);
        }
    }
};

// The query block of BQ rows [r0, rlast] that this CTA owns, for head bh = (b, h), and its key
// tiles (see key_tiles). Blocks run in reverse order: the last rows see the most keys, so the
// longest blocks start first.
struct QueryBlock {
    int bh, b, h, r0, rlast, jbase, first, ntiles;
};
template <int BQ, int BK>
__device__ __forceinline__ QueryBlock query_block(const AttnParams& p) {
    QueryBlock q;
    const int qb = gridDim.x - 1 - blockIdx.x;
    q.bh = blockIdx.y, q.b = q.bh / p.H, q.h = q.bh % p.H;
    q.r0 = qb * BQ;
    q.rlast = min(q.r0 + BQ, p.tq) - 1;
    key_tiles<BK>(p, q.b, q.bh, q.r0, q.rlast, q.jbase, q.first, q.ntiles);
    return q;
}

// Whether query row r of batch row b is copied (zero-filled otherwise): a real row that sees a key.
struct QueryOk {
    const AttnParams& p;
    int b;
    __device__ __forceinline__ bool operator()(int r) const { return r < p.tq && p.q_pos0 + r >= row_start(p, b, r); }
};

// The dq passes' own copies: the block's Q and dO rows (dO is [B, tq, H, D]: as a view, row
// stride H*D) in the pass's tile layout.
template <int D, int BQ, int NTH, class Tiles>
__device__ __forceinline__ void load_q_do(const AttnParams& p, const QueryBlock& q, u16* sQ, u16* sG) {
    const QueryOk ok{p, q.b};
    Tiles::template load<D, BQ, NTH>(sQ, p.q + q.b * p.q_sb + q.h * p.q_sh, p.q_st, q.r0, ok);
    Tiles::template load<D, BQ, NTH>(sG, p.dout + ((long long)q.b * p.tq * p.H + q.h) * D, (long long)p.H * D, q.r0,
                                     ok);
}

// The walk of a forward, dq or decode pass over key tiles [t0, t1) of query block q, double-buffered
// into sK, sV, sC: load_q() issues the block's own copies (a commit group of their own, before the
// first key tile's), then step(it, buf, jt, need_mask) runs for each tile it once it has landed in
// buffer buf (jt: its first key; need_mask: the tile crosses the block's causal diagonal or a
// document start).
template <int D, int BK, int NTH, class Tiles, class LoadQ, class Step>
__device__ __forceinline__ void key_walk(const AttnParams& p, const QueryBlock& q, int t0, int t1, u16* sK, u16* sV,
                                         float* sC, LoadQ load_q, Step step) {
    if (t0 >= t1) return;
    const KeyTileLoader<D, BK, NTH, Tiles> load_kv(p, sK, sV, sC, q.b, q.h, q.bh, q.r0, q.jbase);
    load_q();
    cp_commit();
    load_kv(t0, 0);
    cp_commit();
    const int pos_min = p.q_pos0 + q.r0;
    const int start_max = row_start(p, q.b, q.rlast);
    for (int it = t0; it < t1; ++it) {
        const int buf = load_kv.next(it, t0, t1);
        const int jt = q.jbase + it * BK;
        step(it, buf, jt, (jt + BK - 1 > pos_min) || (jt < start_max));
        __syncthreads();
    }
}

// A thread's two query rows rows[rr] = r_first + 8 rr of head bh: the gate sum c_i, the position
// and the first visible key, and for the backward (BWD) the log-sum-exp in log2 units and delta.
// A row past tq sees no key and adds nothing to the backward; the forward leaves lse2 and dl unread.
struct QueryRows {
    float ci[2], lse2[2], dl[2];
    int pos[2], st[2], rows[2];
};
template <bool BWD>
__device__ __forceinline__ QueryRows query_rows(const AttnParams& p, int b, int bh, int r_first) {
    QueryRows q;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int r = r_first + rr * 8;
        q.rows[rr] = r;
        if (r < p.tq) {
            const long long idx = (long long)bh * p.tq + r;
            q.ci[rr] = p.cq[idx];
            q.pos[rr] = p.q_pos0 + r;
            q.st[rr] = row_start(p, b, r);
            if constexpr (BWD) {
                const float ls = p.lse_in[idx];
                q.lse2[rr] = ls == NEG_INF ? POS_INF : ls * LOG2E;
                q.dl[rr] = p.delta[idx];
            }
        } else {
            q.ci[rr] = 0.f;
            q.pos[rr] = -1;
            q.st[rr] = 0;
            if constexpr (BWD) {
                q.lse2[rr] = POS_INF;
                q.dl[rr] = 0.f;
            }
        }
    }
    return q;
}

// The dq passes' step on a key tile (NT 8-column tiles, either layout), for a thread's two query
// rows: P = exp2(s - lse) with the forward's bias and mask, and dS = P (dP - delta) in place in S;
// dcq gathers this thread's part of dS's row sums. c_s: the tile's c_j.
template <int NT, class A>
__device__ __forceinline__ void dq_scores(A& S, const A& DP, const QueryRows& qr, const float* c_s, int jt,
                                          bool need_mask, float scale_log2, float (&dcq)[2]) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int jl = nt * 8 + 2 * t4 + (e & 1);
            const int rr = e >> 1;
            const float x = acc_at(S, nt, e) * scale_log2 + (qr.ci[rr] - c_s[jl]) * LOG2E - qr.lse2[rr];
            float pr = fast_exp2(x);
            if (need_mask) {
                const int j = jt + jl;
                if (j > qr.pos[rr] || j < qr.st[rr]) pr = 0.f;
            }
            const float ds = pr * (acc_at(DP, nt, e) - qr.dl[rr]);
            dcq[rr] += ds;
            acc_at(S, nt, e) = ds;
        }
    }
}

// The passes' epilogues, for a warp's two rows (query rows `rows`, or key rows jrow) whatever the
// accumulator's layout (acc_at): the forward's O / l in the dtype and lse (natural log; -inf for
// rows that saw no key), the dq pass's scale dQ and dcq, the dk/dv pass's scale dK and dV.
template <int D, bool BF, class A>
__device__ __forceinline__ void store_o_rows(const AttnParams& p, const A& O, const float (&m)[2], const float (&l)[2],
                                             const int (&rows)[2], int b, int h, int bh, int t4) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const float lt = quad_sum(l[rr]);
        const int r = rows[rr];
        if (r >= p.tq) continue;
        const float inv = lt > 0.f ? 1.f / lt : 0.f;
        u16* orow = p.o + (((long long)b * p.tq + r) * p.H + h) * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
            *(u32*)(orow + dt * 8 + 2 * t4) = pack2<BF>(acc_at(O, dt, 2 * rr) * inv, acc_at(O, dt, 2 * rr + 1) * inv);
        if (t4 == 0) p.lse[(long long)bh * p.tq + r] = lt > 0.f ? m[rr] * LN2 + __logf(lt) : NEG_INF;
    }
}
template <int D, bool BF, class A>
__device__ __forceinline__ void store_dq_rows(const AttnParams& p, const A& dQ, const float (&dcq)[2],
                                              const int (&rows)[2], int b, int h, int bh, int t4) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const float dc = quad_sum(dcq[rr]);
        const int r = rows[rr];
        if (r >= p.tq) continue;
        u16* qrow = p.dq + (((long long)b * p.tq + r) * p.H + h) * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
            *(u32*)(qrow + dt * 8 + 2 * t4) =
                pack2<BF>(acc_at(dQ, dt, 2 * rr) * p.scale, acc_at(dQ, dt, 2 * rr + 1) * p.scale);
        if (t4 == 0) p.dcq[(long long)bh * p.tq + r] = dc;
    }
}
template <int D, bool BF, class A>
__device__ __forceinline__ void store_dkdv_rows(const AttnParams& p, const A& dK, const A& dV, const int (&jrow)[2],
                                                int b, int hk, int t4) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int j = jrow[rr];
        if (j >= p.tk) continue;
        const long long off = (((long long)b * p.tk + j) * p.Hkv + hk) * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            *(u32*)(p.dk + off + dt * 8 + 2 * t4) =
                pack2<BF>(acc_at(dK, dt, 2 * rr) * p.scale, acc_at(dK, dt, 2 * rr + 1) * p.scale);
            *(u32*)(p.dv + off + dt * 8 + 2 * t4) = pack2<BF>(acc_at(dV, dt, 2 * rr), acc_at(dV, dt, 2 * rr + 1));
        }
    }
}

// Shared memory of a pass that walks key tiles: the block's query-side tiles (qrows × D: Q, and in
// a dq pass dO), then key_walk's two stages of [BK][D] keys and of values, then the stages' gate
// sums.
template <int D, int BK>
struct KeyWalkSmem {
    u16 *sQ, *sK, *sV;
    float* sC;
    __device__ __forceinline__ KeyWalkSmem(unsigned char* raw, int qrows) {
        sQ = (u16*)raw;
        sK = sQ + qrows * D;
        sV = sK + 2 * BK * D;
        sC = (float*)(sV + 2 * BK * D);
    }
};

// The dynamic shared memory from its first 1024-byte boundary, where wgmma's swizzle atoms start.
__device__ __forceinline__ unsigned char* atom_aligned(unsigned char* smem_raw) {
    const u32 raw = smem_u32(smem_raw);
    return smem_raw + (((raw + 1023u) & ~1023u) - raw);
}

// Key tiles [t_begin, t_end) of q against a warp's 16 query rows (sQ rows qrow0..; QR rows in the
// tile), each warp taking NT·8 key columns from kcol0 of every tile: the unnormalised O and the
// rows' (m, l).
template <int D, int QR, int BK, int NTH, int NT, bool BF>
__device__ __forceinline__ void fwd_walk(const AttnParams& p, const QueryBlock& q, int t_begin, int t_end,
                                         const KeyWalkSmem<D, BK>& sm, int qrow0, int kcol0, const QueryRows& qr,
                                         float (&O)[D / 8][4], float (&m)[2], float (&l)[2]) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) O[dt][0] = O[dt][1] = O[dt][2] = O[dt][3] = 0.f;
    m[0] = m[1] = NEG_INF;
    l[0] = l[1] = 0.f;
    const float scale_log2 = p.scale * LOG2E;
    Ldsm<D> ls;
    ls.init();
    u32 qf[D / 16][4];
    key_walk<D, BK, NTH, SwzTiles>(
        p, q, t_begin, t_end, sm.sK, sm.sV, sm.sC,
        [&] { load_tile<D, QR, NTH>(sm.sQ, p.q + q.b * p.q_sb + q.h * p.q_sh, p.q_st, q.r0, QueryOk{p, q.b}); },
        [&](int it, int buf, int jt, bool need_mask) {
            if (it == t_begin) load_a_frags<D>(ls, qf, smem_u32(sm.sQ), qrow0);
            fwd_tile_step<D, NT, BF>(ls, qf, sm.sK + buf * BK * D, sm.sV + buf * BK * D, sm.sC + buf * BK, kcol0,
                                     jt, need_mask, qr.ci, qr.pos, qr.st, scale_log2, O, m, l);
        });
}

// ---------------------------------------------------------------------------------------------
// Forward: grid (ceil(tq / (16 NW)), B*H), 32 NW threads (NW warps x 16 query rows).
// ---------------------------------------------------------------------------------------------
template <int D, bool BF, int NW>
__device__ __forceinline__ void fwd_impl(const AttnParams& p) {
    constexpr int BQ = 16 * NW, BK = 64, NTH = 32 * NW;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const KeyWalkSmem<D, BK> sm(smem_raw, BQ);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const QueryBlock q = query_block<BQ, BK>(p);
    if (tid == 0) count_tiles(p, q.first, q.ntiles);

    // this thread's two rows
    const QueryRows qr = query_rows<false>(p, q.b, q.bh, q.r0 + warp * 16 + g);
    float O[D / 8][4], m[2], l[2];
    fwd_walk<D, BQ, BK, NTH, BK / 8, BF>(p, q, q.first, q.ntiles, sm, warp * 16, 0, qr, O, m, l);
    store_o_rows<D, BF>(p, O, m, l, qr.rows, q.b, q.h, q.bh, t4);
}

// Query row r of (b, h), channel d: the splits' partials merged in split order (returned; channel 0
// writes the row's lse); ml holds the splits' (m, l) pairs of the row. Partials are read past L1
// (other blocks wrote them).
template <int D>
__device__ __forceinline__ float combine_row(const AttnParams& p, int bh, int r, int d, const float* ml) {
    const long long stride = (long long)p.B * p.H * 16;
    float M = NEG_INF;
    for (int s = 0; s < p.splits; ++s) M = fmaxf(M, ml[2 * s]);
    const float Mu = M == NEG_INF ? 0.f : M;
    float L = 0.f, acc = 0.f;
#pragma unroll 16
    for (int s = 0; s < p.splits; ++s) {
        const float wt = exp2f(ml[2 * s] - Mu);
        L += ml[2 * s + 1] * wt;
        acc += __ldcg(p.part_o + ((long long)s * stride + bh * 16 + r) * D + d) * wt;
    }
    if (d == 0) p.lse[(long long)bh * p.tq + r] = L > 0.f ? M * LN2 + logf(L) : NEG_INF;
    return L > 0.f ? acc / L : 0.f;
}

// Channel d of query row r of (b, h) = bh into o [B, tq, H, D], rounded to the 16-bit type.
template <int D, bool BF>
__device__ __forceinline__ void store_o(const AttnParams& p, int bh, int r, int d, float o) {
    const int b = bh / p.H, h = bh % p.H;
    p.o[(((long long)b * p.tq + r) * p.H + h) * D + d] = to_half<BF>(o);
}

// The last split of (b, h) to finish merges the splits' partials in split order whatever the
// order of finishing (so the result does not depend on timing), hands put(r, d, o) each merged
// value of the tq rows, re-arms the arrival counter and returns true; the others return false.
// At batch 1 a separate combine kernel would cost a launch and a dependent round trip per layer.
// `sml`: shared scratch of 2 * tq * splits floats.
template <int D, int NTH, class F>
__device__ __forceinline__ bool merge_splits_if_last(const AttnParams& p, int bh, float* sml, F&& put) {
    __shared__ int s_last;
    const int tid = threadIdx.x;
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(p.sem + bh, 1u) == (unsigned)(p.splits - 1);
    __syncthreads();
    if (!s_last) return false;
    __threadfence();
    const long long stride = (long long)p.B * p.H * 16;
    for (int i = tid; i < p.tq * p.splits; i += NTH) {
        const int r = i / p.splits, s = i % p.splits;
        const long long pr = (long long)s * stride + bh * 16 + r;
        sml[2 * i] = __ldcg(p.part_ml + pr * 2);
        sml[2 * i + 1] = __ldcg(p.part_ml + pr * 2 + 1);
    }
    __syncthreads();
    for (int idx = tid; idx < p.tq * D; idx += NTH) {
        const int r = idx / D, d = idx % D;
        put(r, d, combine_row<D>(p, bh, r, d, sml + 2 * r * p.splits));
    }
    if (tid == 0) p.sem[bh] = 0;
    return true;
}

// ---------------------------------------------------------------------------------------------
// Decode (tq <= 16 query rows against a long cache), split over the keys: grid (splits, B*H),
// 128 threads. Each 64-key tile is shared by the CTA; warp w takes its keys 16w..16w+15, so the
// four warps run four independent online softmaxes that are merged in shared memory, and each
// split writes an unnormalised partial (o, m, l); the last split of a (b, h) to finish merges them.
// ---------------------------------------------------------------------------------------------
template <int D, bool BF>
__device__ __forceinline__ void decode_impl(const AttnParams& p) {
    constexpr int BK = 64, NTH = 128, NW = 4;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const KeyWalkSmem<D, BK> sm(smem_raw, 16);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int split = blockIdx.x;
    const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
    // all tq rows in one block; the split takes its share of the block's key tiles
    QueryBlock q{bh, b, h, 0, p.tq - 1};
    key_tiles<BK>(p, b, bh, 0, q.rlast, q.jbase, q.first, q.ntiles);
    const int per = (q.ntiles - q.first + p.splits - 1) / p.splits;
    const int t_begin = q.first + split * per;
    const int t_end = min(t_begin + per, q.ntiles);
    if (tid == 0 && split == 0) count_tiles(p, q.first, q.ntiles);

    const QueryRows qr = query_rows<false>(p, b, bh, g);
    float O[D / 8][4], m[2], l[2];
    fwd_walk<D, 16, BK, NTH, 2, BF>(p, q, t_begin, t_end, sm, 0, warp * 16, qr, O, m, l);
    cp_wait<0>();
    __syncthreads();

    // merge the four warps: sO [NW][16][D], sM/sL [NW][16]
    float* sO = (float*)sm.sK;  // 2*BK*D*2 bytes >= NW*16*D*4 bytes
    float* sM = (float*)smem_raw;  // reuse sQ (16*D*2 bytes >= 2*NW*16*4)
    float* sL = sM + NW * 16;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int r = g + rr * 8;
        const float lt = quad_sum(l[rr]);
        if (t4 == 0) {
            sM[warp * 16 + r] = m[rr];
            sL[warp * 16 + r] = lt;
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            sO[(warp * 16 + r) * D + dt * 8 + 2 * t4] = O[dt][2 * rr];
            sO[(warp * 16 + r) * D + dt * 8 + 2 * t4 + 1] = O[dt][2 * rr + 1];
        }
    }
    __syncthreads();
    const long long pbase = ((long long)split * p.B * p.H + bh) * 16;
    // only the real query rows: the merge below waits for these stores
    for (int idx = tid; idx < p.tq * D; idx += NTH) {
        const int r = idx / D, d = idx % D;
        float M = NEG_INF;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, sM[w * 16 + r]);
        const float Mu = M == NEG_INF ? 0.f : M;
        float L = 0.f, acc = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float wt = fast_exp2(sM[w * 16 + r] - Mu);
            L += sL[w * 16 + r] * wt;
            acc += sO[(w * 16 + r) * D + d] * wt;
        }
        p.part_o[(pbase + r) * D + d] = acc;
        if (d == 0) {
            p.part_ml[(pbase + r) * 2] = M;
            p.part_ml[(pbase + r) * 2 + 1] = L;
        }
    }

    // the tiles are done with: their shared memory holds the splits' (m, l)
    merge_splits_if_last<D, NTH>(p, bh, (float*)smem_raw,
                                 [&](int r, int d, float o) { store_o<D, BF>(p, bh, r, d, o); });
}

// ---------------------------------------------------------------------------------------------
// Backward preprocessing: delta_i = dO_i . O_i (fp32), 0 for rows that saw no key.
// One warp per (b, r, h) row; grid (ceil(B*tq*H / 8)), 256 threads.
// ---------------------------------------------------------------------------------------------
template <int D, bool BF>
__device__ __forceinline__ void bwd_delta_impl(const AttnParams& p) {
    const long long rowid = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const long long nrows = (long long)p.B * p.tq * p.H;
    if (rowid >= nrows) return;
    const int h = rowid % p.H;
    const long long bt = rowid / p.H;
    const int r = bt % p.tq, b = bt / p.tq;
    const u16* o = p.o_in + rowid * D;
    const u16* g = p.dout + rowid * D;
    float acc = 0.f;
#pragma unroll
    for (int d = lane * 2; d < D; d += 64) {
        const u32 ov = *(const u32*)(o + d), gv = *(const u32*)(g + d);
        acc += to_f32<BF>((u16)(ov & 0xffff)) * to_f32<BF>((u16)(gv & 0xffff));
        acc += to_f32<BF>((u16)(ov >> 16)) * to_f32<BF>((u16)(gv >> 16));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        const long long idx = ((long long)b * p.H + h) * p.tq + r;
        p.delta[idx] = p.lse_in[idx] == NEG_INF ? 0.f : acc;
    }
}

// ---------------------------------------------------------------------------------------------
// Backward, dq pass: grid (ceil(tq / 128), B*H), 256 threads (8 warps x 16 query rows), key
// tiles of 64. dS = P (dP - delta), dq = scale * dS K, dcq = row sums of dS.
// ---------------------------------------------------------------------------------------------
template <int D, bool BF>
__device__ __forceinline__ void bwd_dq_impl(const AttnParams& p) {
    constexpr int BQ = 128, BK = 64, NTH = 256, NT = BK / 8;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const KeyWalkSmem<D, BK> sm(smem_raw, 2 * BQ);
    u16 *sQ = sm.sQ, *sG = sQ + BQ * D, *sK = sm.sK, *sV = sm.sV;  // sG: dO
    float* sC = sm.sC;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const QueryBlock q = query_block<BQ, BK>(p);
    const QueryRows qr = query_rows<true>(p, q.b, q.bh, q.r0 + warp * 16 + g);

    float dQ[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) dQ[dt][0] = dQ[dt][1] = dQ[dt][2] = dQ[dt][3] = 0.f;
    float dcq[2] = {0.f, 0.f};

    const float scale_log2 = p.scale * LOG2E;
    Ldsm<D> ls;
    ls.init();
    APair<D> qg(smem_u32(sQ), smem_u32(sG), warp * 16);
    key_walk<D, BK, NTH, SwzTiles>(
        p, q, q.first, q.ntiles, sK, sV, sC, [&] { load_q_do<D, BQ, NTH, SwzTiles>(p, q, sQ, sG); },
        [&](int it, int buf, int jt, bool need_mask) {
            if (it == q.first) qg.hold(ls);
            const u32 kbb = smem_u32(sK + buf * BK * D), vbb = smem_u32(sV + buf * BK * D);
            float S[NT][4], P[NT][4];  // S = Q K^T, P holds dP = dO V^T for now
            qg.products<NT, BF>(ls, kbb, vbb, S, P);
            dq_scores<NT>(S, P, qr, sC + buf * BK, jt, need_mask, scale_log2, dcq);
            // dQ += dS K
            mma_scores_tile<D, NT, BF>(ls, S, kbb, dQ);
        });
    store_dq_rows<D, BF>(p, dQ, dcq, qr.rows, q.b, q.h, q.bh, t4);
}

// ---------------------------------------------------------------------------------------------
// Backward, dk/dv passes (mma.sync here, wgmma in wgmma.cu): grid (ceil(tk / BKB), B*Hkv), 16 keys
// a warp, query tiles of BQB rows. They work on the transposed scores S^T = K Q^T so that each warp
// owns its keys' rows: dV += P^T dO, dK += dS^T Q, dck = -(row sums of dS^T), all in the warp's
// registers. With grouped-query attention the block keeps its K/V tile and walks the group's query
// heads in order, so dK, dV sum over the group deterministically; dck is written per query head.
// The passes share their shared-memory layout (DkdvSmem), block geometry (DkdvBlock), copies
// (dkdv_load_kv, dkdv_load_q, in the pass's tile layout: SwzTiles, wgmma.cu's AtomTiles) and the
// P^T, dS^T step (DkdvTile::scores); a pass brings its matrix products.
// ---------------------------------------------------------------------------------------------


// Shared memory of a dk/dv pass: the block's K and V, then two stages of a query tile (Q, dO and
// its rows' lse, delta, c and packed-document starts).
template <int D, int BKB, int BQB>
struct DkdvSmem {
    u16 *k, *v, *q, *g;  // q, g: [2][BQB*D]
    float *lse, *del, *cq;  // [2][BQB]
    int* st;
    __device__ __forceinline__ explicit DkdvSmem(unsigned char* base) {
        k = (u16*)base;
        v = k + BKB * D;
        q = v + BKB * D;
        g = q + 2 * BQB * D;
        lse = (float*)(g + 2 * BQB * D);
        del = lse + 2 * BQB;
        cq = del + 2 * BQB;
        st = (int*)(cq + 2 * BQB);
    }
};

// The block's keys [j0, jlast] (this thread's rows jrow) of batch row b, k/v head hk, the first
// query tile that can see them and the first key any query row of b sees (kfloor).
template <int BKB, int BQB>
struct DkdvBlock {
    int b, hk, group, j0, jlast, qfirst, kfloor;
    int jrow[2];
    __device__ __forceinline__ explicit DkdvBlock(const AttnParams& p) {
        const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
        const int kb = blockIdx.x;
        b = blockIdx.y / p.Hkv;
        hk = blockIdx.y % p.Hkv;
        group = p.H / p.Hkv;
        j0 = kb * BKB;
        jlast = min(j0 + BKB, p.tk) - 1;
        qfirst = max(j0 - p.q_pos0, 0) / BQB;
        kfloor = row_start(p, b, 0);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) jrow[rr] = j0 + warp * 16 + (lane >> 2) + rr * 8;
    }
};

// The block's K and V tiles (committed, not awaited), kept for every query head of the group.
template <int D, int BKB, int BQB, int NTH, class Tiles>
__device__ __forceinline__ void dkdv_load_kv(const AttnParams& p, const DkdvBlock<BKB, BQB>& kb,
                                             const DkdvSmem<D, BKB, BQB>& sm) {
    const u16* kbase = p.k + kb.b * p.k_sb + kb.hk * p.k_sh;
    const u16* vbase = p.v + kb.b * p.v_sb + kb.hk * p.v_sh;
    auto kok = [&](int j) { return j < p.tk && j >= kb.kfloor; };
    Tiles::template load<D, BKB, NTH>(sm.k, kbase, p.k_st, kb.j0, kok);
    Tiles::template load<D, BKB, NTH>(sm.v, vbase, p.v_st, kb.j0, kok);
    cp_commit();
}

// Copy query tile rq (its first row) of head bh into stage buf: Q and dO (qbase, gbase: the head's
// rows; dO is [B, tq, H, D], as a view row stride H*D) and the rows' lse, delta, c and packed starts.
template <int D, int BKB, int BQB, int NTH, class Tiles>
__device__ __forceinline__ void dkdv_load_q(const AttnParams& p, const DkdvSmem<D, BKB, BQB>& sm, int b, int bh,
                                            const u16* qbase, const u16* gbase, int rq, int buf) {
    const int tid = threadIdx.x;
    const QueryOk qok{p, b};
    Tiles::template load<D, BQB, NTH>(sm.q + buf * BQB * D, qbase, p.q_st, rq, qok);
    Tiles::template load<D, BQB, NTH>(sm.g + buf * BQB * D, gbase, (long long)p.H * D, rq, qok);
    if (tid < BQB) {
        const int r = rq + tid;
        const bool in = r < p.tq;
        const long long idx = (long long)bh * p.tq + (in ? r : 0);
        cp_async4(sm.lse + buf * BQB + tid, p.lse_in + idx, in);
        cp_async4(sm.del + buf * BQB + tid, p.delta + idx, in);
        cp_async4(sm.cq + buf * BQB + tid, p.cq + idx, in);
    } else if (tid < 2 * BQB && p.start_mode == 2) {
        const int r = rq + tid - BQB;
        const bool in = r < p.tq;
        cp_async4(sm.st + buf * BQB + tid - BQB, p.start + (long long)b * p.tq + (in ? r : 0), in);
    }
}

// One query tile of a dk/dv pass as its step sees it: Q and dO at shared addresses q_s, g_s, the
// rows' staged values, and what scores() needs to turn S^T and dP^T into P^T and dS^T.
struct DkdvTile {
    const AttnParams& p;
    u32 q_s, g_s;
    const float *lse, *del, *cq;
    const int* st;
    int b, rq;
    bool need_mask;
    float scale_log2;
    const float (&ckr)[2];  // c of this thread's keys
    const int (&jrow)[2];
    float (&dck)[2];
    // ST <- P^T, DP <- dS^T in place (NTQ accumulator tiles of 8 query columns), dck -= row sums
    // of dS^T. The mask test is a template argument, so that the tiles without a mask run
    // straight-line code (a test inside the unrolled loop is a branch per score)
    template <int NTQ, class A>
    __device__ __forceinline__ void scores(A& ST, A& DP) const {
        if (need_mask) scores_as<NTQ, true>(ST, DP);
        else scores_as<NTQ, false>(ST, DP);
    }
    template <int NTQ, bool MASK, class A>
    __device__ __forceinline__ void scores_as(A& ST, A& DP) const {
        const int t4 = threadIdx.x & 3;
        const KeyMask mask = key_mask(p, b);
#pragma unroll
        for (int nt = 0; nt < NTQ; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int il = nt * 8 + 2 * t4 + (e & 1);  // query column
                const int kr = e >> 1;                     // key row (g or g+8)
                const float x = acc_at(ST, nt, e) * scale_log2 + (cq[il] - ckr[kr]) * LOG2E - lse[il] * LOG2E;
                float pr = fast_exp2(x);
                if (MASK && mask.hides(rq + il, jrow[kr], st + il)) pr = 0.f;
                const float ds = pr * (acc_at(DP, nt, e) - del[il]);
                dck[kr] -= ds;
                acc_at(ST, nt, e) = pr;
                acc_at(DP, nt, e) = ds;
            }
        }
    }
};

// The walk of a dk/dv pass over the group's query heads and the query tiles that see the block
// (double-buffered copies), writing dck per head. Once a tile has landed it calls landed() and
// step(tile): the pass forms S^T and dP^T for its keys, calls tile.scores, then adds its products
// into dK and dV.
template <int D, int BKB, int BQB, int NTH, class Tiles, class Landed, class Step>
__device__ __forceinline__ void dkdv_walk(const AttnParams& p, const DkdvBlock<BKB, BQB>& kb,
                                          const DkdvSmem<D, BKB, BQB>& sm, Landed landed, Step step) {
    const int tid = threadIdx.x, t4 = tid & 3;
    const int b = kb.b, hk = kb.hk, group = kb.group, j0 = kb.j0, jlast = kb.jlast, qfirst = kb.qfirst;
    const int(&jrow)[2] = kb.jrow;
    for (int h = hk * group; h < (hk + 1) * group; ++h) {
        const int bh = b * p.H + h;
        const int qend = dkdv_query_end(p, b, bh, qfirst, BQB, jlast);
        float ckr[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) ckr[rr] = jrow[rr] < p.tk ? p.ck[(long long)bh * p.tk + jrow[rr]] : 0.f;
        float dck[2] = {0.f, 0.f};

        if (qfirst < qend) {
            const u16* qbase = p.q + b * p.q_sb + h * p.q_sh;
            const u16* gbase = p.dout + ((long long)b * p.tq * p.H + h) * D;
            auto load_q = [&](int qi, int buf) {
                dkdv_load_q<D, BKB, BQB, NTH, Tiles>(p, sm, b, bh, qbase, gbase, qi * BQB, buf);
            };
            load_q(qfirst, 0);
            cp_commit();

            const float scale_log2 = p.scale * LOG2E;
            for (int qi = qfirst; qi < qend; ++qi) {
                const int buf = walk_step<Tiles>(load_q, qi, qfirst, qend);
                landed();
                const u32 q_s = smem_u32(sm.q + buf * BQB * D), g_s = smem_u32(sm.g + buf * BQB * D);
                const float* lse_s = sm.lse + buf * BQB;
                const float* del_s = sm.del + buf * BQB;
                const float* cq_s = sm.cq + buf * BQB;
                const int* st_s = sm.st + buf * BQB;
                const int rq = qi * BQB;
                const bool need_mask = dkdv_tile_masked(p, b, rq, BQB, j0, jlast);
                step(DkdvTile{p, q_s, g_s, lse_s, del_s, cq_s, st_s, b, rq, need_mask, scale_log2, ckr, jrow, dck});
                __syncthreads();
            }
        }

#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const float dc = quad_sum(dck[rr]);
            if (jrow[rr] < p.tk && t4 == 0) p.dck[(long long)bh * p.tk + jrow[rr]] = dc;
        }
    }  // query heads of the group
    cp_wait<0>();  // the K/V copies, when no head had a query tile
}

// The mma.sync dk/dv pass: 256 threads (8 warps x 16 keys), 128 keys a block.
template <int D, bool BF, int BQB>
__device__ __forceinline__ void bwd_dkdv_impl(const AttnParams& p) {
    constexpr int BKB = 128, NTH = 256, NTQ = BQB / 8;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const DkdvSmem<D, BKB, BQB> sm(smem_raw);
    const DkdvBlock<BKB, BQB> kb(p);
    const int tid = threadIdx.x, warp = tid >> 5, t4 = tid & 3;

    float dK[D / 8][4], dV[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
        dK[dt][0] = dK[dt][1] = dK[dt][2] = dK[dt][3] = dV[dt][0] = dV[dt][1] = dV[dt][2] = dV[dt][3] = 0.f;

    dkdv_load_kv<D, BKB, BQB, NTH, SwzTiles>(p, kb, sm);
    Ldsm<D> ls;
    ls.init();
    APair<D> kv(smem_u32(sm.k), smem_u32(sm.v), warp * 16);
    bool kv_held = false;

    // the warp's K and V fragments, once the first tile's barrier has passed the copies
    auto landed = [&]() {
        if (!kv_held) {
            kv.hold(ls);
            kv_held = true;
        }
    };
    dkdv_walk<D, BKB, BQB, NTH, SwzTiles>(p, kb, sm, landed, [&](const DkdvTile& t) {
        const u32 qbb = t.q_s, gbb = t.g_s;
        float ST[NTQ][4], DP[NTQ][4];
        kv.products<NTQ, BF>(ls, qbb, gbb, ST, DP);
        t.scores<NTQ>(ST, DP);
        // dV += P^T dO, dK += dS^T Q
        mma_scores_tile<D, NTQ, BF>(ls, ST, gbb, dV);
        mma_scores_tile<D, NTQ, BF>(ls, DP, qbb, dK);
    });

    store_dkdv_rows<D, BF>(p, dK, dV, kb.jrow, kb.b, kb.hk, t4);
}

// ---------------------------------------------------------------------------------------------
// Entry points. Names: fox_<pass>_d<D>_<bf16|f16>.
// ---------------------------------------------------------------------------------------------
#define FWD_LB(D) 256, (D == 64 ? 2 : 1)
#define FWD4_LB(D) 128, (D == 64 ? 4 : 2)
#define FOX_ENTRY(NAME, IMPL, NTH, ...)                                                         \
    extern "C" __global__ void __launch_bounds__(NTH) NAME(const AttnParams p) { IMPL<__VA_ARGS__>(p); }

// The decode kernel may take q_pos0 from the device (CUDA graphs of a decode step).
#define FOX_DECODE_ENTRY(NAME, IMPL, NTH, ...)                                                  \
    extern "C" __global__ void __launch_bounds__(NTH) NAME(const AttnParams p_in) {            \
        AttnParams p = p_in;                                                                    \
        pdl_trigger_next();                                                                     \
        if (p.q_pos0_dev != nullptr) p.q_pos0 = *p.q_pos0_dev;                                  \
        IMPL<__VA_ARGS__>(p);                                                                   \
    }

#define FOX_ALL(D, TY, BF, BQB)                                                  \
    FOX_ENTRY(fox_fwd_d##D##_##TY, fwd_impl, FWD_LB(D), D, BF, 8)                      \
    FOX_ENTRY(fox_fwdw4_d##D##_##TY, fwd_impl, FWD4_LB(D), D, BF, 4)                   \
    FOX_DECODE_ENTRY(fox_decode_d##D##_##TY, decode_impl, 128, D, BF)            \
    FOX_ENTRY(fox_bwd_delta_d##D##_##TY, bwd_delta_impl, 256, D, BF)             \
    FOX_ENTRY(fox_bwd_dq_d##D##_##TY, bwd_dq_impl, 256, D, BF)                   \
    FOX_ENTRY(fox_bwd_dkdv_d##D##_##TY, bwd_dkdv_impl, 256, D, BF, BQB)

FOX_ALL(64, bf16, true, 64)
FOX_ALL(128, bf16, true, 32)
FOX_ALL(64, f16, false, 64)
FOX_ALL(128, f16, false, 32)
