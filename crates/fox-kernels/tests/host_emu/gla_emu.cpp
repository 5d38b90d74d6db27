// kernels/gla.cu run on the host under tests/host_emu/mock.h against an f64 reference of the
// recurrence (crate::gla's definition: S_t = Diag(e^{g_t}) S_{t−1} + k_t v_tᵀ, o_t = scale S_tᵀ q_t):
// the chunked forward's outputs and final state, the backward's every gradient (through time,
// with every state kept) with an initial state and a final state's gradient, decode steps that
// continue a chunked prefill, and HGRN2's gates and lower bounds against plain loops. Cases: left
// padding (a row starting mid-chunk, a chunk of padding only), T not a multiple of 64, K and V not
// multiples of the 64-wide tiles (40, 80) and full ones (128), head widths 8 and 16, strong decays
// (g down to about −12, a lower bound near 0) and weak ones (g ≈ −1e-3). The launch sequence is
// cuda/gla.rs's.
//
// Tolerances: relative L2 1e-5 for f32 outputs and states, 1e-4 for gradients (f32 sums of up to
// 128 channels and 64 positions against f64, states carried over chunks; the gate's gradient is a
// difference of such sums); observed ≤ 4.3e-6. bf16 runs against the f64 reference of its rounded
// inputs, through version 1 (f32 products; the outputs rounded once to bf16, 2^-9 relative) and
// version 2 (tensor cores, emulated here per PTX's m16n8k16 fragment layouts: the products'
// operands rounded to bf16 as well): 1e-2, the gate's gradient 2e-2 (a difference of sums);
// observed ≤ 2.9e-3, dg ≤ 9.7e-3 (strong decays, version 2). Version 3 (the walk, with
// ldmatrix and cp.async from mock.h, and with its forward's scores on tensor cores) under the same
// tolerances: the same errors as version 2.
#include "mock.h"
#include "../../kernels/elem.cuh"
#include "../../kernels/activations.cuh"
#define GLA_DSMEM(name) static float name[GLA_DQK_SMEM_FLOATS]
// mma.sync m16n8k16 (bf16 in, f32 sums) for one warp: the lanes leave their fragments in the
// warp's slot and each computes its four outputs from everyone's (PTX ISA's fragment layouts:
// A's register i holds rows g + 8 (i & 1), columns 2t + 8 (i >> 1) and + 1; B's register i rows
// 2t + 8i and + 1, column g; C rows g and g + 8, columns 2t and 2t + 1; g = lane / 4, t = lane % 4).
#define GLA_MMA_EMULATED
struct MmaSlot {
    u32 a[32][4];
    u32 b[32][2];
};
static MmaSlot g_mma[8];
static float bf_half(u32 v, int hi) { return __uint_as_float(hi ? (v & 0xffff0000u) : (v << 16)); }
inline void gla_mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    MmaSlot& X = g_mma[w];
    for (int i = 0; i < 4; ++i) X.a[lane][i] = a[i];
    X.b[lane][0] = b0;
    X.b[lane][1] = b1;
    g_warps[w].bar->arrive_and_wait();
    auto A = [&](int r, int k) { return bf_half(X.a[(r & 7) * 4 + (k & 7) / 2][(r >= 8) + 2 * (k >= 8)], k & 1); };
    auto B = [&](int k, int n) { return bf_half(X.b[n * 4 + (k & 7) / 2][k >= 8], k & 1); };
    const int g = lane >> 2, t = lane & 3;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const int r = g + 8 * (e >> 1), n = 2 * t + (e & 1);
        float s = c[e];
        for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
        out[e] = s;
    }
    g_warps[w].bar->arrive_and_wait();
    for (int e = 0; e < 4; ++e) c[e] = out[e];
}
#define ET float
#define KN(name) name##_f32
#include "../../kernels/gla.cu"
#undef ET
#undef KN
#define ET u16
#define KN(name) name##_bf16
#include "../../kernels/gla.cu"
#define EMU_SEED 7
#include "check.h"

static void cmp(const char* name, const char* what, const std::vector<float>& got, const std::vector<double>& want,
                double tol) {
    double e = got.size() == want.size() ? rel_l2(got, want) : INFINITY;
    bool ok = e <= tol;
    if (!ok) fails++;
    printf("%s %-44s %-12s %.3e\n", ok ? "ok  " : "FAIL", name, what, e);
}
static double lsig(double x) { return std::min(x, 0.0) - log1p(exp(-fabs(x))); }

struct Case {
    const char* name;
    int B, T, H, K, V;
    std::vector<int> start;
    bool init;
    double gate_bias, gate_scale;
    bool bf16_v1;  // bf16 through version 1 as well as the tensor cores
};

struct Ref {
    std::vector<double> o, fin, dq, dk, dv, dg, dinit;
};

// The recurrence in f64, forward and backward through time.
static Ref reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, const std::vector<float>& g, const std::vector<float>& init,
                     const std::vector<float>& dout, const std::vector<float>& dfin, float scale) {
    const int B = c.B, T = c.T, H = c.H, K = c.K, V = c.V;
    Ref r;
    r.o.assign((size_t)B * T * H * V, 0.0);
    r.fin.assign((size_t)B * H * K * V, 0.0);
    r.dq.assign(q.size(), 0.0);
    r.dk.assign(k.size(), 0.0);
    r.dv.assign(v.size(), 0.0);
    r.dg.assign(g.size(), 0.0);
    r.dinit.assign(r.fin.size(), 0.0);
    for (int b = 0; b < B; ++b) {
        const int st = c.start.empty() ? 0 : std::min(c.start[b], T);
        for (int h = 0; h < H; ++h) {
            const size_t bh = (size_t)b * H + h;
            std::vector<std::vector<double>> S(T + 1, std::vector<double>((size_t)K * V, 0.0));
            for (size_t e = 0; e < (size_t)K * V; ++e) S[st][e] = init[bh * K * V + e];
            for (int t = st; t < T; ++t) {
                const size_t rw = ((size_t)b * T + t) * H + h;
                for (int i = 0; i < K; ++i)
                    for (int j = 0; j < V; ++j)
                        S[t + 1][(size_t)i * V + j] = exp((double)g[rw * K + i]) * S[t][(size_t)i * V + j] +
                                                      (double)k[rw * K + i] * v[rw * V + j];
                for (int j = 0; j < V; ++j) {
                    double s = 0;
                    for (int i = 0; i < K; ++i) s += S[t + 1][(size_t)i * V + j] * q[rw * K + i];
                    r.o[rw * V + j] = scale * s;
                }
            }
            for (size_t e = 0; e < (size_t)K * V; ++e) r.fin[bh * K * V + e] = S[T][e];
            std::vector<double> dS((size_t)K * V);
            for (size_t e = 0; e < dS.size(); ++e) dS[e] = dfin[bh * K * V + e];
            for (int t = T - 1; t >= st; --t) {
                const size_t rw = ((size_t)b * T + t) * H + h;
                for (int i = 0; i < K; ++i) {
                    double s = 0;
                    for (int j = 0; j < V; ++j) s += S[t + 1][(size_t)i * V + j] * dout[rw * V + j];
                    r.dq[rw * K + i] = scale * s;
                }
                for (int i = 0; i < K; ++i)
                    for (int j = 0; j < V; ++j) dS[(size_t)i * V + j] += scale * (double)q[rw * K + i] * dout[rw * V + j];
                for (int i = 0; i < K; ++i) {
                    double s = 0;
                    for (int j = 0; j < V; ++j) s += dS[(size_t)i * V + j] * v[rw * V + j];
                    r.dk[rw * K + i] = s;
                }
                for (int j = 0; j < V; ++j) {
                    double s = 0;
                    for (int i = 0; i < K; ++i) s += dS[(size_t)i * V + j] * k[rw * K + i];
                    r.dv[rw * V + j] = s;
                }
                for (int i = 0; i < K; ++i) {
                    const double a = exp((double)g[rw * K + i]);
                    double s = 0;
                    for (int j = 0; j < V; ++j) s += S[t][(size_t)i * V + j] * dS[(size_t)i * V + j];
                    r.dg[rw * K + i] = a * s;
                    for (int j = 0; j < V; ++j) dS[(size_t)i * V + j] *= a;
                }
            }
            for (size_t e = 0; e < dS.size(); ++e) r.dinit[bh * K * V + e] = dS[e];
        }
    }
    return r;
}

// The kernels of one activation type (S: f32 or bf16), by their names without the suffix.
#define GLA_KERNELS(S)                                     \
    static constexpr auto cumsum = gla_cumsum_##S;         \
    static constexpr auto chunk_h = gla_chunk_h_##S;       \
    static constexpr auto scores = gla_scores_##S;         \
    static constexpr auto fwd_o = gla_fwd_o_##S;           \
    static constexpr auto dscores = gla_dscores_##S;       \
    static constexpr auto bwd_dv = gla_bwd_dv_##S;         \
    static constexpr auto bwd_dqk = gla_bwd_dqk_##S;       \
    static constexpr auto chunk_h_tc = gla_chunk_h_tc_##S; \
    static constexpr auto dscores_tc = gla_dscores_tc_##S; \
    static constexpr auto fwd_o_tc = gla_fwd_o_tc_##S;     \
    static constexpr auto bwd_dv_tc = gla_bwd_dv_tc_##S;   \
    static constexpr auto bwd_dqk_tc = gla_bwd_dqk_tc_##S; \
    static constexpr auto decode = gla_decode_##S;
template <class E>
struct Kern;
template <>
struct Kern<float> {
    GLA_KERNELS(f32)
    static constexpr auto gates_fwd = hgrn2_gates_fwd_f32;
    static constexpr auto gates_bwd = hgrn2_gates_bwd_f32;
    static float to(float x) { return x; }
    static float from(float x) { return x; }
};
template <>
struct Kern<u16> {
    GLA_KERNELS(bf16)
    static u16 to(float x) { return mock_rne(x); }
    static float from(u16 x) { return __uint_as_float((u32)x << 16); }
};

template <class E>
static std::vector<E> conv(const std::vector<float>& x) {
    std::vector<E> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = Kern<E>::to(x[i]);
    return y;
}
template <class E>
static std::vector<float> back(const std::vector<E>& x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = Kern<E>::from(x[i]);
    return y;
}

// The problem as the kernels take it, with the scratch of cuda/gla.rs.
template <class E>
struct Dev {
    int B, T, H, K, V, nch;
    std::vector<E> q, k, v, g;
    const int* start;
    float scale;
    std::vector<float> G, hs, A, dhs, dA;
    std::vector<u16> A16;  // version 3's forward scores (bf16)
    Dev(const Case& c, const std::vector<float>& q_, const std::vector<float>& k_, const std::vector<float>& v_,
        const std::vector<float>& g_, const int* st, float sc)
        : B(c.B), T(c.T), H(c.H), K(c.K), V(c.V), nch((c.T + 63) / 64), q(conv<E>(q_)), k(conv<E>(k_)),
          v(conv<E>(v_)), g(conv<E>(g_)), start(st), scale(sc) {
        G.assign((size_t)B * T * H * K, 0.f);
        hs.assign((size_t)B * H * (nch + 1) * K * V, 0.f);
        A.assign((size_t)B * H * nch * 64 * 64, 0.f);
        A16.assign(A.size(), 0x7fc0);  // NaN: every element must be written
        dhs.assign((size_t)B * H * nch * K * V, 0.f);
        dA.assign(A.size(), 0.f);
    }
    bool tc = false;
    int walk = 0;  // version 3: the walk's channels per block (16, 32, 64), with tc's other kernels
    bool stc = false;  // version 3's forward with its scores on tensor cores (bf16 A)
    // hs16: the walk leaves bf16 Sᵀ for gla_fwd_o_w (the forward's), else f32 S (the backward's).
    void states(const float* init, float* fin, int hs16 = 0) {
        const unsigned nc = nch, bh = B * H;
        launch({(unsigned)((H * K + 255) / 256), nc, (unsigned)B}, 256,
               [&] { Kern<E>::cumsum(G.data(), g.data(), start, T, H, K); });
        if (walk) {
            // Version 3's state passing (bf16 only): the walk over KB channels a block.
            auto kern = walk == 16 ? gla_walk_tc_k16 : walk == 32 ? gla_walk_tc_k32 : gla_walk_tc_k64;
            launch({(unsigned)((V + GLA_WV - 1) / GLA_WV), (unsigned)((K + walk - 1) / walk), bh}, 32 * GLA_WW, [&] {
                kern(hs.data(), fin, init, (const u16*)k.data(), (const u16*)v.data(), G.data(), start, T, H, K, V,
                     nch, hs16);
            });
        } else {
            launch({(unsigned)(((K + 63) / 64) * ((V + 63) / 64)), nc, bh}, 256, [&] {
                (tc ? Kern<E>::chunk_h_tc : Kern<E>::chunk_h)(hs.data(), nch + 1, k.data(), v.data(), G.data(), start,
                                                            T, H, K, V, 0, scale);
            });
            launch({(unsigned)((B * H * K * V + 255) / 256), 1, 1}, 256,
                   [&] { gla_scan_fwd(hs.data(), fin, init, G.data(), B, T, H, K, V, nch); });
        }
        if (hs16 && stc) {
            // Version 3's forward with bf16 A, between sub-chunks on (emulated) tensor cores.
            auto kern = K <= 64 ? gla_scores_w_k64 : gla_scores_w_k128;
            launch({nc, bh, 1}, 256, [&] {
                kern(A16.data(), (const u16*)q.data(), (const u16*)k.data(), G.data(), start, T, H, K, nch);
            });
        } else {
            launch({nc, bh, 1}, 256,
                   [&] { Kern<E>::scores(A.data(), q.data(), k.data(), G.data(), start, T, H, K, nch); });
        }
    }
    std::vector<float> fwd(const float* init, float* fin) {
        std::vector<E> o((size_t)B * T * H * V, Kern<E>::to(7.f));
        if (walk && K <= 128) {
            states(init, fin, 1);
            const dim3e grid{(unsigned)((V + 63) / 64), (unsigned)nch, (unsigned)(B * H)};
            if (stc) {
                auto kern = K <= 64 ? gla_fwd_o_w16_k64 : gla_fwd_o_w16_k128;
                launch(grid, 256, [&] {
                    kern((u16*)o.data(), (const u16*)q.data(), (const u16*)v.data(), G.data(), (const u16*)hs.data(),
                         A16.data(), start, T, H, K, V, nch, scale);
                });
            } else {
                auto kern = K <= 64 ? gla_fwd_o_w_k64 : gla_fwd_o_w_k128;
                launch(grid, 256, [&] {
                    kern((u16*)o.data(), (const u16*)q.data(), (const u16*)v.data(), G.data(), (const u16*)hs.data(),
                         A.data(), start, T, H, K, V, nch, scale);
                });
            }
            return back<E>(o);
        }
        states(init, fin);
        launch({(unsigned)((V + 63) / 64), (unsigned)nch, (unsigned)(B * H)}, 256, [&] {
            (tc ? Kern<E>::fwd_o_tc : Kern<E>::fwd_o)(o.data(), q.data(), v.data(), G.data(), hs.data(), A.data(),
                                                      start, T, H, K, V, nch, scale);
        });
        return back<E>(o);
    }
};

// The backward as cuda/gla.rs launches it; gradients come back as f32.
template <class E>
static void bwd(Dev<E>& d, const float* init, const std::vector<float>& dout_f, const float* dfin,
                std::vector<float>& dq_f, std::vector<float>& dk_f, std::vector<float>& dv_f, std::vector<float>& dg_f,
                std::vector<float>& dinit) {
    const int B = d.B, T = d.T, H = d.H, K = d.K, V = d.V, nch = d.nch;
    const unsigned nc = nch, bh = B * H;
    auto dout = conv<E>(dout_f);
    std::vector<E> dq(dq_f.size()), dk(dk_f.size()), dv(dv_f.size()), dg(dg_f.size());
    d.states(init, nullptr);
    launch({(unsigned)(((K + 63) / 64) * ((V + 63) / 64)), nc, bh}, 256, [&] {
        (d.tc ? Kern<E>::chunk_h_tc : Kern<E>::chunk_h)(d.dhs.data(), nch, d.q.data(), dout.data(), d.G.data(),
                                                        d.start, T, H, K, V, 1, d.scale);
    });
    launch({(unsigned)((B * H * K * V + 255) / 256), 1, 1}, 256,
           [&] { gla_scan_bwd(d.dhs.data(), dinit.data(), dfin, d.G.data(), B, T, H, K, V, nch); });
    launch({nc, bh, 1}, 256, [&] {
        (d.tc ? Kern<E>::dscores_tc : Kern<E>::dscores)(d.dA.data(), dout.data(), d.v.data(), d.start, T, H, V,
                                                        nch, d.scale);
    });
    launch({(unsigned)((V + 63) / 64), nc, bh}, 256, [&] {
        (d.tc ? Kern<E>::bwd_dv_tc : Kern<E>::bwd_dv)(dv.data(), d.k.data(), dout.data(), d.G.data(), d.A.data(),
                                                      d.dhs.data(), d.start, T, H, K, V, nch, d.scale);
    });
    launch({(unsigned)((K + 63) / 64), nc, bh}, 256, [&] {
        (d.tc ? Kern<E>::bwd_dqk_tc : Kern<E>::bwd_dqk)(dq.data(), dk.data(), dg.data(), d.q.data(), d.k.data(),
                                                        d.v.data(), dout.data(), d.G.data(), d.hs.data(),
                                                        d.dhs.data(), d.dA.data(), d.start, T, H, K, V, nch, d.scale);
    });
    dq_f = back<E>(dq);
    dk_f = back<E>(dk);
    dv_f = back<E>(dv);
    dg_f = back<E>(dg);
}

static std::vector<double> widen(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

static void gla_case(const Case& c) {
    const int B = c.B, T = c.T, H = c.H, K = c.K, V = c.V;
    const size_t nk = (size_t)B * T * H * K, nv = (size_t)B * T * H * V, ns = (size_t)B * H * K * V;
    auto q = randn(nk), v = randn(nv), dout = randn(nv), f = randn(nk, c.gate_scale);
    std::vector<float> g(nk), k(nk);
    for (size_t i = 0; i < nk; ++i) {
        g[i] = (float)lsig(f[i] + c.gate_bias);
        k[i] = 1.f - expf(g[i]);  // HGRN2's key, tied to the gate
    }
    auto init = randn(ns), dfin = randn(ns);
    if (!c.init) std::fill(init.begin(), init.end(), 0.f);
    const float scale = 1.f / sqrtf((float)K);
    std::vector<int> start = c.start;
    const int* sp = start.empty() ? nullptr : start.data();
    // Garbage at padded positions: the kernels must not read it.
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < (start.empty() ? 0 : start[b]); ++t)
            for (int h = 0; h < H; ++h) {
                const size_t r = ((size_t)b * T + t) * H + h;
                for (int i = 0; i < K; ++i) q[r * K + i] = k[r * K + i] = g[r * K + i] = 1e3f;
                for (int j = 0; j < V; ++j) v[r * V + j] = dout[r * V + j] = 1e3f;
            }
    Ref r = reference(c, q, k, v, g, init, dout, dfin, scale);

    Dev<float> d(c, q, k, v, g, sp, scale);
    std::vector<float> fin(ns, 5.f);
    auto o = d.fwd(c.init ? init.data() : nullptr, fin.data());
    cmp(c.name, "o", o, r.o, 1e-5);
    cmp(c.name, "final state", fin, r.fin, 1e-5);

    std::vector<float> dq(nk, 9.f), dk(nk, 9.f), dv(nv, 9.f), dg(nk, 9.f), dinit(ns, 9.f);
    bwd(d, c.init ? init.data() : nullptr, dout, dfin.data(), dq, dk, dv, dg, dinit);
    cmp(c.name, "dq", dq, r.dq, 1e-4);
    cmp(c.name, "dk", dk, r.dk, 1e-4);
    cmp(c.name, "dv", dv, r.dv, 1e-4);
    cmp(c.name, "dg", dg, r.dg, 1e-4);
    cmp(c.name, "dinit", dinit, r.dinit, 1e-4);
    // Without a final state's gradient (training): only do reaches the inputs.
    std::vector<float> zero(ns, 0.f);
    Ref r0 = reference(c, q, k, v, g, init, dout, zero, scale);
    bwd(d, c.init ? init.data() : nullptr, dout, nullptr, dq, dk, dv, dg, dinit);
    cmp(c.name, "dg, no dfinal", dg, r0.dg, 1e-4);
    cmp(c.name, "dk, no dfinal", dk, r0.dk, 1e-4);

    // bf16 on rounded inputs: version 1 (f32 products) and version 2 (tensor cores; the same
    // kernels with the f32 tiles too, as a check of their arithmetic on f32 inputs).
    auto rq = back<u16>(conv<u16>(q)), rk = back<u16>(conv<u16>(k)), rv = back<u16>(conv<u16>(v)),
         rg = back<u16>(conv<u16>(g)), rdo = back<u16>(conv<u16>(dout));
    Ref rb = reference(c, rq, rk, rv, rg, init, rdo, dfin, scale);
    for (int tc = c.bf16_v1 ? 0 : 1; tc < 2; ++tc) {
        Dev<u16> d16(c, q, k, v, g, sp, scale);
        d16.tc = tc;
        std::vector<float> f16(ns, 5.f);
        auto o16 = d16.fwd(c.init ? init.data() : nullptr, f16.data());
        char nm[96];
        snprintf(nm, sizeof nm, "%s bf16 %s", c.name, tc ? "tc" : "v1");
        cmp(nm, "o", o16, rb.o, 1e-2);
        cmp(nm, "final state", f16, rb.fin, tc ? 1e-2 : 1e-5);
        bwd(d16, c.init ? init.data() : nullptr, dout, dfin.data(), dq, dk, dv, dg, dinit);
        cmp(nm, "dq", dq, rb.dq, 1e-2);
        cmp(nm, "dk", dk, rb.dk, 1e-2);
        cmp(nm, "dv", dv, rb.dv, 1e-2);
        cmp(nm, "dg", dg, rb.dg, 2e-2);
        cmp(nm, "dinit", dinit, rb.dinit, tc ? 1e-2 : 1e-4);
    }
    // Version 3: version 2 with the state passing as the walk; every block width forward, the
    // backward (which recomputes the states the same way) through KB = 32, and the state continued
    // in place (fin == init) bit for bit the same forward; then at KB = 16 with the forward's scores
    // on tensor cores (gla_scores_w, gla_fwd_o_w16).
    for (int vi = 0; vi < 4; ++vi) {
        const int kb = vi < 3 ? 16 << vi : 16;
        Dev<u16> d16(c, q, k, v, g, sp, scale);
        d16.tc = true;
        d16.walk = kb;
        d16.stc = vi == 3;
        std::vector<float> f16(ns, 5.f);
        auto o16 = d16.fwd(c.init ? init.data() : nullptr, f16.data());
        char nm[96];
        snprintf(nm, sizeof nm, "%s bf16 walk%d%s", c.name, kb, d16.stc ? " tc-scores" : "");
        cmp(nm, "o", o16, rb.o, 1e-2);
        cmp(nm, "final state", f16, rb.fin, 1e-2);
        if (c.init) {
            std::vector<float> st = init;
            auto o2 = d16.fwd(st.data(), st.data());
            double diff = 0;
            for (size_t i = 0; i < o2.size(); ++i) diff += o2[i] != o16[i];
            for (size_t i = 0; i < st.size(); ++i) diff += st[i] != f16[i];
            if (diff) fails++;
            printf("%s %-44s %-12s %.0f\n", diff ? "FAIL" : "ok  ", nm, "in place", diff);
        }
        if (kb != 32 || d16.stc) continue;
        bwd(d16, c.init ? init.data() : nullptr, dout, dfin.data(), dq, dk, dv, dg, dinit);
        cmp(nm, "dq", dq, rb.dq, 1e-2);
        cmp(nm, "dk", dk, rb.dk, 1e-2);
        cmp(nm, "dv", dv, rb.dv, 1e-2);
        cmp(nm, "dg", dg, rb.dg, 2e-2);
        cmp(nm, "dinit", dinit, rb.dinit, 1e-2);
    }
    if (c.bf16_v1) {
        Dev<float> dt(c, q, k, v, g, sp, scale);
        dt.tc = true;
        auto ot = dt.fwd(c.init ? init.data() : nullptr, fin.data());
        cmp(c.name, "o, f32 through tc", ot, r.o, 1e-2);
    }
}

// A prefill of T − 3 positions through the chunked forward with the final state, then 3 decode
// steps continuing it, against the whole sequence's reference; row 1 (of B = 2) is padding for
// the prefill's first `pad` positions.
static void decode_case(int K, int V, int T, int pad) {
    const int B = 2, H = 2, P = T - 3;
    const size_t nk = (size_t)B * T * H * K, nv = (size_t)B * T * H * V, ns = (size_t)B * H * K * V;
    auto q = randn(nk), v = randn(nv), f = randn(nk);
    std::vector<float> g(nk), k(nk);
    for (size_t i = 0; i < nk; ++i) {
        g[i] = (float)lsig(f[i] + 1.0);
        k[i] = 1.f - expf(g[i]);
    }
    const float scale = 1.f / sqrtf((float)K);
    Case c{"decode", B, T, H, K, V, {0, pad}, true, 0, 1, false};
    auto init = randn(ns);
    std::vector<float> zeros(nv, 0.f), zs(ns, 0.f);
    Ref r = reference(c, q, k, v, g, init, zeros, zs, scale);
    // The prefill: the first P positions.
    auto head = [&](const std::vector<float>& x, int D) {
        std::vector<float> y((size_t)B * P * H * D);
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < P; ++t)
                for (size_t e = 0; e < (size_t)H * D; ++e)
                    y[(((size_t)b * P + t) * H) * D + e] = x[(((size_t)b * T + t) * H) * D + e];
        return y;
    };
    Case cp = c;
    cp.T = P;
    Dev<float> d(cp, head(q, K), head(k, K), head(v, V), head(g, K), c.start.data(), scale);
    std::vector<float> state = init;
    auto o = d.fwd(state.data(), state.data());  // continuing the state in place
    std::vector<float> got(nv, 0.f);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < P; ++t)
            for (size_t e = 0; e < (size_t)H * V; ++e)
                got[(((size_t)b * T + t) * H) * V + e] = o[(((size_t)b * P + t) * H) * V + e];
    // Decode steps (no padding left).
    for (int t = P; t < T; ++t) {
        auto row = [&](const std::vector<float>& x, int D) {
            std::vector<float> y((size_t)B * H * D);
            for (int b = 0; b < B; ++b)
                for (size_t e = 0; e < (size_t)H * D; ++e) y[(size_t)b * H * D + e] = x[(((size_t)b * T + t) * H) * D + e];
            return y;
        };
        auto qs = row(q, K), ks = row(k, K), vs = row(v, V), gs = row(g, K);
        std::vector<float> os((size_t)B * H * V, 7.f);
        launch({(unsigned)(B * H), (unsigned)((V + 31) / 32), 1}, 256, [&] {
            gla_decode_f32(state.data(), os.data(), qs.data(), ks.data(), vs.data(), gs.data(), nullptr, H, K, V, scale);
        });
        for (int b = 0; b < B; ++b)
            for (size_t e = 0; e < (size_t)H * V; ++e) got[(((size_t)b * T + t) * H) * V + e] = os[(size_t)b * H * V + e];
    }
    char name[64];
    snprintf(name, sizeof name, "prefill + 3 decode steps K=%d V=%d pad %d", K, V, pad);
    cmp(name, "o", got, r.o, 1e-5);
    cmp(name, "final state", state, r.fin, 1e-5);
    // A padded decode row: o = 0, its state unchanged.
    int st2[2] = {0, 1};
    std::vector<float> before = state, os((size_t)B * H * V, 7.f);
    auto qs = randn((size_t)B * H * K), vs = randn((size_t)B * H * V);
    std::vector<float> gs((size_t)B * H * K, -0.5f), ks((size_t)B * H * K, 0.4f);
    launch({(unsigned)(B * H), (unsigned)((V + 31) / 32), 1}, 256, [&] {
        gla_decode_f32(state.data(), os.data(), qs.data(), ks.data(), vs.data(), gs.data(), st2, H, K, V, scale);
    });
    double moved = 0, out = 0;
    for (size_t e = ns / 2; e < ns; ++e) moved += fabs(state[e] - before[e]);
    for (size_t e = (size_t)H * V; e < os.size(); ++e) out += fabs(os[e]);
    bool ok = moved == 0 && out == 0 && state[0] != before[0];
    if (!ok) fails++;
    printf("%s %-44s %-12s %.3e\n", ok ? "ok  " : "FAIL", name, "padded row", moved + out);
}

// The gates and lower bounds against plain loops (f64), bounded and unbounded, with a lower bound
// near 0 and one near 1.
static void gates_case() {
    const int rows = 300, d = 40, L = 4;
    auto raw = randn((size_t)L * d, 2.f);
    std::vector<float> lb((size_t)L * d, 9.f);
    launch({1, 1, 1}, 256, [&] { hgrn2_lower_bounds_fwd(lb.data(), raw.data(), L, d); });
    std::vector<double> rlb((size_t)L * d), p((size_t)L * d);
    for (int c = 0; c < d; ++c) {
        double m = -INFINITY, z = 0, s = 0;
        for (int l = 0; l < L; ++l) m = std::max(m, (double)raw[l * d + c]);
        for (int l = 0; l < L; ++l) z += exp(raw[l * d + c] - m);
        for (int l = 0; l < L; ++l) p[l * d + c] = exp(raw[l * d + c] - m) / z;
        rlb[c] = 0;
        for (int l = 1; l < L; ++l) rlb[l * d + c] = s += p[l * d + c];
    }
    cmp("hgrn2 lower bounds", "fwd", lb, rlb, 1e-6);
    auto dlb = randn((size_t)L * d);
    std::vector<float> grad((size_t)L * d, 0.5f);
    launch({1, 1, 1}, 256, [&] { hgrn2_lower_bounds_bwd(grad.data(), dlb.data(), raw.data(), L, d); });
    std::vector<double> rgrad((size_t)L * d);
    for (int c = 0; c < d; ++c) {
        std::vector<double> dp(L, 0.0);
        double suf = 0, dot = 0;
        for (int j = L - 1; j >= 1; --j) dp[j] = suf += dlb[j * d + c];
        for (int j = 0; j < L; ++j) dot += p[j * d + c] * dp[j];
        for (int j = 0; j < L; ++j) rgrad[j * d + c] = 0.5 + p[j * d + c] * (dp[j] - dot);
    }
    cmp("hgrn2 lower bounds", "bwd", grad, rgrad, 1e-6);

    const size_t n = (size_t)rows * d;
    auto qin = randn(n, 2.f), f = randn(n, 3.f), dq = randn(n), dk = randn(n), dg = randn(n);
    std::vector<float> row(d);
    for (int c = 0; c < d; ++c) row[c] = c == 0 ? 1e-6f : c == 1 ? 0.999f : lb[(size_t)2 * d + c];
    for (int bounded = 0; bounded < 2; ++bounded) {
        const float* lbp = bounded ? row.data() : nullptr;
        std::vector<float> q(n), k(n), g(n);
        launch({4, 1, 1}, 256, [&] { hgrn2_gates_fwd_f32(q.data(), k.data(), g.data(), qin.data(), f.data(), lbp, (long)n, d); });
        std::vector<double> rq(n), rk(n), rg(n), rdq(n), rdf(n), rdl(d, 0.0);
        for (size_t i = 0; i < n; ++i) {
            const double x = qin[i], s = 1 / (1 + exp(-x)), fv = f[i], sf = 1 / (1 + exp(-fv));
            rq[i] = x * s;
            const double l = row[i % d];
            rg[i] = bounded ? log(l + (1 - l) * sf) : lsig(fv);
            rk[i] = 1 - exp(rg[i]);
            rdq[i] = dq[i] * s * (1 + x * (1 - s));
            // g from the kernel's (rounded) value, as the backward reads it.
            const double gv = g[i], dgt = dg[i] - dk[i] * exp(gv);
            if (bounded) {
                rdf[i] = dgt * (1 - l) * sf * (1 - sf) / exp(gv);
                rdl[i % d] += dgt * (1 - sf) / exp(gv);
            } else {
                rdf[i] = dgt * (1 - sf);
            }
        }
        const char* nm = bounded ? "hgrn2 gates bounded" : "hgrn2 gates";
        cmp(nm, "q", q, rq, 1e-6);
        cmp(nm, "g", g, rg, 1e-6);
        cmp(nm, "k", k, rk, 1e-6);
        const int per = 64, parts = (rows + per - 1) / per;
        std::vector<float> dqin(n), df(n), part((size_t)parts * d, 3.f), dl(d, 8.f);
        launch({1, (unsigned)parts, 1}, 256, [&] {
            hgrn2_gates_bwd_f32(dqin.data(), df.data(), bounded ? part.data() : nullptr, dq.data(), dk.data(),
                                dg.data(), qin.data(), f.data(), g.data(), lbp, rows, d, per);
        });
        cmp(nm, "dq_in", dqin, rdq, 1e-5);
        cmp(nm, "df", df, rdf, 1e-5);
        if (bounded) {
            launch({1, 1, 1}, 256, [&] { gla_colsum_set(dl.data(), part.data(), parts, d); });
            cmp(nm, "dlb row", dl, rdl, 1e-5);
        }
    }
}

int main() {
    const Case cases[] = {
        // Row 1 starts mid-chunk (its first chunk all padding), an initial state, K and V past one
        // tile, partial tiles, T = 150 (two chunks and a part).
        {"B2 T150 H2 K=V=40 pad init", 2, 150, 2, 40, 40, {0, 70}, true, 1.0, 2.0, true},
        // Strong decays: g from about −12 to −0.1 (the products underflow across sub-chunks).
        {"B1 T100 H1 K16 V80 strong decay", 1, 100, 1, 16, 80, {}, false, -3.0, 4.0, false},
        // Weak decays (g ≈ −1e-3), full 128-wide tiles.
        {"B1 T70 H1 K=V=128 weak decay init", 1, 70, 1, 128, 128, {}, true, 7.0, 0.3, false},
        // The fla fixture's head width.
        {"B2 T33 H2 K=V=8 pad", 2, 33, 2, 8, 8, {0, 5}, false, 0.5, 1.0, false},
    };
    for (const Case& c : cases) gla_case(c);
    decode_case(40, 24, 70, 3);
    decode_case(128, 128, 67, 0);
    gates_case();
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
