// kernels/delta_rule.cu run on the host under tests/host_emu/mock.h (mma.sync emulated lane by
// lane) against an f64 reference of the recurrence (crate::delta_rule's definition): the chunked
// forward's outputs and final state, the backward's every gradient (through time, every state
// kept) with a final-state gradient and the initial state's, the decode step, the L2 norm, the
// decay and the swish gate. Cases: left padding (a row starting mid-chunk), an initial state,
// T = 70 (a chunk and a part), K and V below the tiles' sizes (zero padding of K and of V's
// blocks), two blocks of V, K = 128, with and without the decay, f32 and bf16, five chunks (bf16).
// The forward also runs in segments of one chunk each, to the same bits. bf16 with K' ≥ 64 runs
// through both forward walks (mma.sync per warp, wgmma per warpgroup); bf16 also through the
// parallel walk (segments' sums, their join, every segment's walk at once) in segments of one and
// two chunks, forward and backward.
//
// Tolerances, relative L2 against f64: f32 1e-4 (f32 sums over at most 128 + 64 terms, states
// carried over two chunks; observed ≤ 3e-6), dg 1e-3 (a reverse prefix sum of terms of both signs);
// bf16 3e-2 (operands rounded to bf16: 2^-9 relative each, T and the stored states and U once
// more; observed ≤ 8e-3).
#include "mock.h"
#include "../../kernels/elem.cuh"
#include "../../kernels/activations.cuh"
#include "../../kernels/delta_rule.cu"
#define EMU_SEED 7
#include "check.h"

static std::vector<float> uni(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}
static void cmp(const std::string& name, const char* what, const std::vector<float>& got, const std::vector<double>& want,
                double tol) {
    double e = rel_l2(got, want);
    bool ok = e <= tol && got.size() == want.size();
    if (!ok) fails++;
    printf("%s %-44s %-10s %.3e\n", ok ? "ok  " : "FAIL", name.c_str(), what, e);
}

static void same_bits(const std::string& name, const char* what, const std::vector<float>& got,
                      const std::vector<float>& want) {
    size_t n = got.size() == want.size() ? 0 : 1;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) n += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    if (n) fails++;
    printf("%s %-44s %-10s %zu elements differ\n", n ? "FAIL" : "ok  ", name.c_str(), what, n);
}

// Values as the kernels see them: bf16-rounded for E = u16.
template <typename E>
static std::vector<E> to_e(const std::vector<float>& x) {
    std::vector<E> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) st(out.data(), (long long)i, x[i]);
    return out;
}
template <typename E>
static std::vector<float> from_e(const std::vector<E>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = ld(x.data(), (long long)i);
    return out;
}
template <typename E>
static std::vector<float> rounded(const std::vector<float>& x) {
    return from_e(to_e<E>(x));
}

struct Case {
    const char* name;
    int B, T, H, K, V, KP;
    bool gated, init;
    std::vector<int> start;
};

template <typename E>
static const char* tname();
template <>
const char* tname<float>() {
    return "f32";
}
template <>
const char* tname<u16>() {
    return "bf16";
}

// The bf16 forward walk by wgmma (dr_walk_wg, K' ≥ 64) in place of dr_walk_tc: same blocks and threads.
static bool g_walk_wg = false;
template <typename E, int KP>
static void walk_fwd_of(DrParams p) {
    if constexpr (sizeof(E) == 2 && KP >= 64) {
        if (g_walk_wg) return dr_walk_wg<KP>(p);
    }
    DrWalk<E, KP>::run(p);
}

// > 0: the forward walk (also the backward's) is the parallel walk in segments of this many chunks.
static int g_scan = 0;

// The kernels of one KP.
template <typename E, int KP>
struct Kern {
    static void prep(DrParams p, int keep) { dr_prep<E, KP>(p, keep); }
    static void walk_fwd(DrParams p) { walk_fwd_of<E, KP>(p); }
    // The forward walk's blocks and threads: bf16 on tensor cores, 16 columns of V per warp.
    static constexpr bool tc = sizeof(E) == 2;
    static unsigned walk_threads() { return tc ? 32 * DR_WW : 256; }
    static unsigned walk_blocks(int Vp) { return tc ? (unsigned)((Vp + DR_WV - 1) / DR_WV) : (unsigned)(Vp / 32); }
    static void out(DrParams p) { dr_out<E, KP>(p); }
    static void dvl(DrParams p) { dr_dvl<E, KP>(p); }
    static void walk_bwd(DrParams p) { dr_walk_bwd<E, KP>(p); }
    static void grads(DrParams p) { dr_grads<E, KP>(p); }
    // The walk of chunks p.c0..p.c1: one walk, or with g_scan the parallel walk (its sums and
    // entering states in buffers of its own).
    static void walk(DrParams p, int BH, int Vp) {
        if (!(tc && g_scan > 0)) {
            launch(dim3e{walk_blocks(Vp), (unsigned)BH, 1}, walk_threads(), [&] { walk_fwd(p); });
            return;
        }
        if constexpr (tc) {
            const int nch = p.c1 - p.c0, nseg = (nch + g_scan - 1) / g_scan;
            std::vector<float> sums((size_t)std::max(nseg - 1, 0) * BH * KP * (Vp + KP)),
                entry((size_t)nseg * BH * p.K * p.V);
            p.seglen = g_scan;
            p.sums = sums.data();
            p.entry = entry.data();
            const unsigned nvb = (unsigned)((Vp + DR_WV - 1) / DR_WV), nkb = (unsigned)((KP + DR_WV - 1) / DR_WV);
            if (nseg > 1) launch(dim3e{nvb + nkb, (unsigned)BH, (unsigned)(nseg - 1)}, 32 * DR_WW, [&] { dr_walk_tc<KP, true>(p); });
            launch(dim3e{(unsigned)((Vp + DR_JC - 1) / DR_JC), (unsigned)BH, 1}, DrJoin<KP>::NT, [&] { dr_walk_join<KP>(p, nseg); });
            launch(dim3e{nvb, (unsigned)BH, (unsigned)nseg}, 32 * DR_WW, [&] { dr_walk_tc<KP, false>(p); });
        }
    }
};

template <typename E, int KP>
static void run_case(const Case& c) {
    const int B = c.B, T = c.T, H = c.H, K = c.K, V = c.V;
    const int nch = (T + 63) / 64, Tp = nch * 64, Vp = (V + 31) / 32 * 32, BH = B * H;
    const size_t nq = (size_t)B * T * H * K, nv = (size_t)B * T * H * V, nb = (size_t)B * T * H, ns = (size_t)BH * K * V;
    // Inputs: q, k unit rows (as after the L2 norm), β in (0, 1), g ≤ 0.
    auto unit = [&](std::vector<float> x) {
        for (size_t r = 0; r < x.size() / K; ++r) {
            double s = 0;
            for (int i = 0; i < K; ++i) s += (double)x[r * K + i] * x[r * K + i];
            for (int i = 0; i < K; ++i) x[r * K + i] = (float)(x[r * K + i] / sqrt(s));
        }
        return x;
    };
    auto q = rounded<E>(unit(randn(nq))), k = rounded<E>(unit(randn(nq))), v = rounded<E>(randn(nv));
    auto beta = rounded<E>(uni(nb, 0.05f, 0.95f));
    auto g = uni(nb, -0.6f, -0.01f);
    auto init = c.init ? randn(ns, 0.5f) : std::vector<float>(ns, 0.f);
    auto dout = rounded<E>(randn(nv)), dfin = randn(ns);
    auto st_of = [&](int b) { return c.start.empty() ? 0 : std::min(c.start[b], T); };
    const double scale = 1.0 / sqrt((double)K);

    // f64 reference: forward keeping every state, then back through time.
    std::vector<double> o(nv, 0), fin(ns), dq(nq, 0), dk(nq, 0), dv(nv, 0), db(nb, 0), dgr(nb, 0), dinit(ns);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
            const int bh = b * H + h, s0 = st_of(b), n = T - s0;
            std::vector<std::vector<double>> S(n + 1, std::vector<double>(K * V));
            for (int i = 0; i < K * V; ++i) S[0][i] = init[(size_t)bh * K * V + i];
            auto R = [&](int t) { return ((size_t)b * T + t) * H + h; };
            for (int i = 0; i < n; ++i) {
                const int t = s0 + i;
                const double al = c.gated ? exp((double)g[R(t)]) : 1.0, be = beta[R(t)];
                const float* kt = &k[R(t) * K];
                const float* qt = &q[R(t) * K];
                for (int vc = 0; vc < V; ++vc) {
                    double sk = 0;
                    for (int kd = 0; kd < K; ++kd) sk += S[i][kd * V + vc] * kt[kd];
                    const double u = be * (v[R(t) * V + vc] - al * sk);
                    double oo = 0;
                    for (int kd = 0; kd < K; ++kd) {
                        S[i + 1][kd * V + vc] = al * S[i][kd * V + vc] + kt[kd] * u;
                        oo += qt[kd] * S[i + 1][kd * V + vc];
                    }
                    o[R(t) * V + vc] = scale * oo;
                }
            }
            for (int i = 0; i < K * V; ++i) fin[(size_t)bh * K * V + i] = S[n][i];
            std::vector<double> dS(K * V);
            for (int i = 0; i < K * V; ++i) dS[i] = dfin[(size_t)bh * K * V + i];
            for (int i = n - 1; i >= 0; --i) {
                const int t = s0 + i;
                const double al = c.gated ? exp((double)g[R(t)]) : 1.0, be = beta[R(t)];
                const float* kt = &k[R(t) * K];
                const float* qt = &q[R(t) * K];
                const std::vector<double>& Sp = S[i];
                const std::vector<double>& Sn = S[i + 1];
                // o_t = scale S_tᵀ q_t
                for (int kd = 0; kd < K; ++kd)
                    for (int vc = 0; vc < V; ++vc) {
                        const double d = scale * dout[R(t) * V + vc];
                        dq[R(t) * K + kd] += d * Sn[kd * V + vc];
                        dS[kd * V + vc] += d * qt[kd];
                    }
                double dal = 0;
                for (int vc = 0; vc < V; ++vc) {
                    // S_t = α S_{t−1} + k u_tᵀ, u = β (v − α S_{t−1}ᵀ k)
                    double du = 0, sk = 0;
                    for (int kd = 0; kd < K; ++kd) {
                        du += dS[kd * V + vc] * kt[kd];
                        sk += Sp[kd * V + vc] * kt[kd];
                    }
                    const double u = be * (v[R(t) * V + vc] - al * sk);
                    for (int kd = 0; kd < K; ++kd) dk[R(t) * K + kd] += dS[kd * V + vc] * u;
                    dv[R(t) * V + vc] = be * du;
                    db[R(t)] += du * (v[R(t) * V + vc] - al * sk);
                    const double e = be * du;
                    dal -= e * sk;
                    for (int kd = 0; kd < K; ++kd) {
                        dk[R(t) * K + kd] -= al * Sp[kd * V + vc] * e;
                        dal += dS[kd * V + vc] * Sp[kd * V + vc];
                        dS[kd * V + vc] = al * dS[kd * V + vc] - al * kt[kd] * e;
                    }
                }
                dgr[R(t)] = dal * al;
            }
            for (int i = 0; i < K * V; ++i) dinit[(size_t)bh * K * V + i] = dS[i];
        }

    // The kernels.
    std::vector<E> eq = to_e<E>(q), ek = to_e<E>(k), ev = to_e<E>(v), eb = to_e<E>(beta), edo = to_e<E>(dout);
    std::vector<E> eo(nv, E(0)), w((size_t)BH * Tp * KP), u((size_t)BH * Tp * Vp), states((size_t)BH * nch * KP * Vp),
        tm((size_t)BH * nch * 64 * 64), dstates(states.size()), edq(nq), edk(nq), edv(nv), edb(nb);
    std::vector<float> gc((size_t)BH * Tp), du((size_t)BH * Tp * Vp), state = init, dgk(nb), dini(ns);
    std::vector<int> start(c.start.begin(), c.start.end());
    DrParams p{};
    p.q = eq.data();
    p.k = ek.data();
    p.v = ev.data();
    p.beta = eb.data();
    p.g = c.gated ? g.data() : nullptr;
    p.start = start.empty() ? nullptr : start.data();
    p.init = c.init ? state.data() : nullptr;
    p.fin = state.data();
    p.gc = gc.data();
    p.w = w.data();
    p.u = u.data();
    p.states = states.data();
    p.tm = tm.data();
    p.dstates = dstates.data();
    p.du = du.data();
    p.o = eo.data();
    p.dout = edo.data();
    p.dq = edq.data();
    p.dk = edk.data();
    p.dv = edv.data();
    p.dbeta = edb.data();
    p.dg = c.gated ? dgk.data() : nullptr;
    p.scale = (float)scale;
    p.B = B, p.T = T, p.H = H, p.K = K, p.V = V, p.Tp = Tp, p.nch = nch, p.Vp = Vp;
    // Rows of 16-byte multiples take the asynchronous copies (K = 20 in bf16 does not).
    p.vk = K * sizeof(E) % 16 == 0;
    p.vv = V * sizeof(E) % 16 == 0;
    p.c0 = 0, p.c1 = nch;
    typedef Kern<E, KP> Kn;
    const unsigned gch = nch, gv = Vp / 32;
    launch(dim3e{gch, (unsigned)BH, 1}, 256, [&] { Kn::prep(p, 0); });
    Kn::walk(p, BH, Vp);
    launch(dim3e{gch, (unsigned)BH, 1}, 256, [&] { Kn::out(p); });
    const std::string name = std::string(tname<E>()) + (g_walk_wg ? " wg " : " ") +
                             (g_scan ? "scan" + std::to_string(g_scan) + " " : "") + c.name;
    const bool bf = sizeof(E) == 2;
    const double tol = bf ? 3e-2 : 1e-4, tolg = bf ? 3e-2 : 1e-3;
    cmp(name, "o", from_e(eo), o, tol);
    cmp(name, "final", state, fin, tol);
    // The forward in segments of one chunk (the state carried in f32 from walk to walk): the same
    // bits as in one walk.
    if (nch > 1 && !g_scan) {
        std::vector<E> eo1 = eo;
        std::vector<float> carry(ns), fin1(ns);
        DrParams s = p;
        s.o = eo1.data();
        for (int c0 = 0; c0 < nch; ++c0) {
            s.c0 = c0, s.c1 = c0 + 1;
            s.init = c0 > 0 ? carry.data() : c.init ? init.data() : nullptr;
            s.fin = c0 + 1 < nch ? carry.data() : fin1.data();
            launch(dim3e{1, (unsigned)BH, 1}, 256, [&] { Kn::prep(s, 0); });
            launch(dim3e{Kn::walk_blocks(Vp), (unsigned)BH, 1}, Kn::walk_threads(), [&] { Kn::walk_fwd(s); });
            launch(dim3e{1, (unsigned)BH, 1}, 256, [&] { Kn::out(s); });
        }
        same_bits(name, "o (segments)", from_e(eo1), from_e(eo));
        same_bits(name, "final (segments)", fin1, state);
    }
    // Backward: the forward recomputed (T kept, no final state), then the backward kernels.
    p.init = c.init ? init.data() : nullptr;
    p.fin = nullptr;
    p.dfin = dfin.data();
    p.dinit = dini.data();
    launch(dim3e{gch, (unsigned)BH, 1}, 256, [&] { Kn::prep(p, 1); });
    Kn::walk(p, BH, Vp);
    launch(dim3e{gch, (unsigned)BH, 1}, 256, [&] { Kn::dvl(p); });
    launch(dim3e{gv, (unsigned)BH, 1}, 256, [&] { Kn::walk_bwd(p); });
    launch(dim3e{gch, (unsigned)BH, 1}, 256, [&] { Kn::grads(p); });
    cmp(name, "dq", from_e(edq), dq, tol);
    cmp(name, "dk", from_e(edk), dk, tol);
    cmp(name, "dv", from_e(edv), dv, tol);
    cmp(name, "dbeta", from_e(edb), db, tol);
    if (c.gated) cmp(name, "dg", dgk, dgr, tolg);
    cmp(name, "dinit", dini, dinit, tol);

    // Decode steps from the final state over the next 3 positions of new inputs (row 1 padded at
    // the first when the case pads).
    if (!bf) {
        std::vector<double> S(fin.begin(), fin.end());
        std::vector<float> dst(state.size());
        for (size_t i = 0; i < dst.size(); ++i) dst[i] = (float)fin[i];
        for (int step = 0; step < 3; ++step) {
            auto q1 = unit(randn((size_t)BH * K)), k1 = unit(randn((size_t)BH * K)), v1 = randn((size_t)BH * V);
            auto b1 = uni(BH, 0.05f, 0.95f), g1 = uni(BH, -0.6f, -0.01f);
            std::vector<int> st1(B, 0);
            if (!c.start.empty() && step == 0) st1[B - 1] = 1;
            std::vector<float> o1(BH * V);
            std::vector<double> want(BH * V, 0);
            for (int bh = 0; bh < BH; ++bh) {
                if (st1[bh / H] > 0) continue;
                const double al = c.gated ? exp((double)g1[bh]) : 1.0;
                for (int vc = 0; vc < V; ++vc) {
                    double sk = 0;
                    for (int kd = 0; kd < K; ++kd) sk += S[(size_t)bh * K * V + kd * V + vc] * k1[bh * K + kd];
                    const double uu = b1[bh] * (v1[bh * V + vc] - al * sk);
                    double oo = 0;
                    for (int kd = 0; kd < K; ++kd) {
                        double& s = S[(size_t)bh * K * V + kd * V + vc];
                        s = al * s + k1[bh * K + kd] * uu;
                        oo += q1[bh * K + kd] * s;
                    }
                    want[bh * V + vc] = scale * oo;
                }
            }
            DrParams d = p;
            d.q = q1.data();
            d.k = k1.data();
            d.v = v1.data();
            d.beta = b1.data();
            d.g = c.gated ? g1.data() : nullptr;
            d.start = st1.data();
            d.fin = dst.data();
            d.o = o1.data();
            d.T = 1;
            launch(dim3e{(unsigned)((V + 127) / 128), (unsigned)BH, 1}, 128, [&] { dr_decode<float>(d); });
            cmp(name, "decode o", o1, want, 1e-5);
        }
        cmp(name, "decode S", dst, S, 1e-5);
    }
}

static void small_ops() {
    const int rows = 37, dim = 40, H = 3;
    auto x = randn(rows * dim), dy = randn(rows * dim);
    std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim);
    std::vector<double> wy(rows * dim), wdx(rows * dim);
    for (int r = 0; r < rows; ++r) {
        double s = 0, yd = 0;
        for (int i = 0; i < dim; ++i) s += (double)x[r * dim + i] * x[r * dim + i];
        const double rs = 1.0 / sqrt(s + 1e-6);
        for (int i = 0; i < dim; ++i) {
            wy[r * dim + i] = x[r * dim + i] * rs;
            yd += wy[r * dim + i] * dy[r * dim + i];
        }
        for (int i = 0; i < dim; ++i) wdx[r * dim + i] = rs * (dy[r * dim + i] - wy[r * dim + i] * yd);
    }
    launch(dim3e{(rows + 7) / 8, 1, 1}, 256, [&] { dr_l2norm_fwd<float>(y.data(), rstd.data(), x.data(), rows, dim); });
    cmp("l2norm", "y", y, wy, 1e-6);
    launch(dim3e{(rows + 7) / 8, 1, 1}, 256,
           [&] { dr_l2norm_bwd<float>(dx.data(), dy.data(), y.data(), rstd.data(), rows, dim); });
    cmp("l2norm", "dx", dx, wdx, 1e-5);

    const int n = 300;
    auto a = randn(n * H, 2.f), a_log = uni(H, 0.f, 2.7f), bias = uni(H, -6.f, -2.f), dg = randn(n * H);
    a[5] = 30.f;  // softplus's linear range
    std::vector<float> g(n * H), da(n * H), tb(n * H), tl(n * H), dbias(H, 0.5f), dalog(H, 0.25f);
    std::vector<double> wg(n * H), wda(n * H), wdb(H, 0.5), wdl(H, 0.25);
    for (int i = 0; i < n * H; ++i) {
        const int h = i % H;
        const double xx = (double)a[i] + bias[h], A = -exp((double)a_log[h]);
        const double sp = xx > 20 ? xx : log1p(exp(xx)), sg = xx > 20 ? 1.0 : 1.0 / (1.0 + exp(-xx));
        wg[i] = A * sp;
        wda[i] = dg[i] * A * sg;
        wdb[h] += wda[i];
        wdl[h] += dg[i] * sp * A;
    }
    launch(dim3e{(n * H + 255) / 256, 1, 1}, 256,
           [&] { dr_decay_fwd<float>(g.data(), a.data(), a_log.data(), bias.data(), n, H); });
    cmp("decay", "g", g, wg, 1e-6);
    launch(dim3e{(n * H + 255) / 256, 1, 1}, 256, [&] {
        dr_decay_bwd<float>(da.data(), tb.data(), tl.data(), dg.data(), a.data(), a_log.data(), bias.data(), n, H);
    });
    launch(dim3e{(unsigned)H, 1, 1}, 256,
           [&] { dr_decay_reduce(dbias.data(), dalog.data(), tb.data(), tl.data(), a_log.data(), n, H); });
    cmp("decay", "da", da, wda, 1e-6);
    cmp("decay", "ddt_bias", dbias, wdb, 1e-5);
    cmp("decay", "dA_log", dalog, wdl, 1e-5);

    const long long m = 1000;
    auto sx = randn(m), sg = randn(m, 3.f), sdy = randn(m);
    std::vector<float> sy(m), sdx(m), sdg(m);
    std::vector<double> wsy(m), wsdx(m), wsdg(m);
    for (int i = 0; i < m; ++i) {
        const double s = 1.0 / (1.0 + exp(-(double)sg[i]));
        wsy[i] = sx[i] * sg[i] * s;
        wsdx[i] = sdy[i] * sg[i] * s;
        wsdg[i] = sdy[i] * sx[i] * s * (1 + sg[i] * (1 - s));
    }
    launch(dim3e{(unsigned)((m + 255) / 256), 1, 1}, 256, [&] { dr_swish_fwd<float>(sy.data(), sx.data(), sg.data(), m); });
    launch(dim3e{(unsigned)((m + 255) / 256), 1, 1}, 256,
           [&] { dr_swish_bwd<float>(sdx.data(), sdg.data(), sdy.data(), sx.data(), sg.data(), m); });
    cmp("swish gate", "y", sy, wsy, 1e-6);
    cmp("swish gate", "dx", sdx, wsdx, 1e-6);
    cmp("swish gate", "dgate", sdg, wsdg, 1e-6);
}

int main() {
    small_ops();
    const Case a{"B=2 T=70 H=2 K=20 V=24 gated pad init", 2, 70, 2, 20, 24, 32, true, true, {0, 9}};
    const Case b{"B=1 T=64 H=1 K=64 V=40 (two V blocks)", 1, 64, 1, 64, 40, 64, false, false, {}};
    const Case d{"B=1 T=70 H=1 K=128 V=32 gated pad", 1, 70, 1, 128, 32, 128, true, false, {5}};
    run_case<float, 32>(a);
    run_case<u16, 32>(a);
    run_case<float, 64>(b);
    run_case<u16, 64>(b);
    run_case<float, 128>(d);
    run_case<u16, 128>(d);
    // Five chunks, in segments of one chunk too.
    const Case e{"B=1 T=300 H=1 K=32 V=16 gated init", 1, 300, 1, 32, 16, 32, true, true, {}};
    run_case<u16, 32>(e);
    // The walk by wgmma: K' = 64 (all four warps' columns real), K' = 128 with two warps past V',
    // and K = 60 (K's tile element by element, its last columns zero) over three chunks.
    const Case f{"B=1 T=150 H=1 K=60 V=64 gated init", 1, 150, 1, 60, 64, 64, true, true, {}};
    g_walk_wg = true;
    run_case<u16, 64>(b);
    run_case<u16, 128>(d);
    run_case<u16, 64>(f);
    g_walk_wg = false;
    run_case<u16, 64>(f);
    // The parallel walk: segments of one chunk (K' = 32, V' + K' in two blocks, an initial state
    // read in place of the final one; K' = 64, K = 60) and of two (five chunks: the last shorter;
    // K' = 128 with two warps past V').
    const Case h{"B=1 T=200 H=1 K=128 V=32 gated pad init", 1, 200, 1, 128, 32, 128, true, true, {30}};
    g_scan = 1;
    run_case<u16, 32>(a);
    run_case<u16, 64>(f);
    g_scan = 2;
    run_case<u16, 32>(e);
    run_case<u16, 128>(h);
    g_scan = 0;
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
