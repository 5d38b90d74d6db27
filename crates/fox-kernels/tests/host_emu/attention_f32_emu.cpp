// kernels/attention_f32.cu run on the host under tests/host_emu/mock.h against a brute-force f64
// reference of the CPU attention's definition: causal, left padding, grouped-query attention
// (query head h reads k/v head h / (H / Hkv); dk, dv summed over the group), a sliding window
// (keys r - w < j <= r), and ACP's tile skipping replayed as the CPU tiles it (blocks of 32 query
// rows, tiles of 64 keys); and decoding: a chunk of rows against a [B, Hkv, cap, D] cache
// (fox32_fwd_cached), with the same windows and ACP. Tolerance 1e-5 relative L2 (f32 against f64 on O(100) terms).
#include "mock.h"
#include "../../kernels/attention_f32.cu"
#define EMU_SEED 7
#include "check.h"

static void cmp(const char* what, const char* name, const std::vector<float>& got, const std::vector<double>& want,
                double tol) {
    double e = rel_l2(got, want, true);
    bool ok = e <= tol;
    if (!ok) fails++;
    printf("%s %-44s %-6s %.3e\n", ok ? "ok  " : "FAIL", name, what, e);
}

struct Case {
    const char* name;
    int b, h, hkv, t, d, w;
    std::vector<int> start;  // empty: no padding
    float delta;             // ACP threshold for every (b, h); 0: off
};

int main() {
    // (a window of 1 leaves dq = dk = 0 up to round-off, where a relative error means nothing:
    // the GPU check's rows cover it; 2 is the narrowest window compared here)
    const Case cases[] = {
        {"GQA H=4 Hkv=2 T=45 d16 left padding", 2, 4, 2, 45, 16, 0, {0, 9}, 0.f},
        {"GQA H=3 Hkv=1 window 13 T=70 d40", 1, 3, 1, 70, 40, 13, {}, 0.f},
        {"window 2 T=65 d32 left padding", 2, 2, 2, 65, 32, 2, {3, 0}, 0.f},
        {"window 100 >= T T=50 d8", 1, 2, 2, 50, 8, 100, {}, 0.f},
        {"GQA H=4 Hkv=2 window 100 ACP delta=-2 T=140", 1, 4, 2, 140, 16, 100, {20}, -2.f},
        {"MHA H=3 T=70 d24 left padding", 2, 3, 3, 70, 24, 0, {0, 11}, 0.f},
    };
    for (const Case& cs : cases) {
        const int B = cs.b, H = cs.h, HK = cs.hkv, T = cs.t, D = cs.d, W = cs.w, G = H / HK;
        auto q = randn((size_t)B * T * H * D), k = randn((size_t)B * T * HK * D), v = randn((size_t)B * T * HK * D);
        auto dout = randn((size_t)B * T * H * D);
        // c: prefix sums of log-sigmoid gates, 0 at padding
        std::vector<float> c((size_t)B * H * T, 0.f);
        auto logits = randn((size_t)B * T * H);
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h) {
                float acc = 0.f;
                int st = cs.start.empty() ? 0 : cs.start[b];
                for (int t = st; t < T; ++t) {
                    float x = logits[(b * T + t) * H + h] + 1.f;
                    acc += x >= 0 ? -log1pf(expf(-x)) : x - log1pf(expf(x));
                    c[(b * H + h) * T + t] = acc;
                }
            }
        const float scale = 1.f / sqrtf((float)D);
        auto st_of = [&](int b) { return cs.start.empty() ? 0 : cs.start[b]; };
        auto key_start = [&](int b, int r) { return W > 0 ? max(st_of(b), r - W + 1) : st_of(b); };
        // the CPU's first visited key of row r (block of 32 rows, tiles of 64, ACP prefix)
        auto first = [&](int b, int h, int r) {
            int r0 = r / 32 * 32, end = min(r0 + 32, T);
            int f = key_start(b, r0) / 64 * 64;
            if (cs.delta != 0.f) {
                const float* cb = &c[(size_t)(b * H + h) * T];
                while (f + 64 <= end && cb[r0] - cb[f + 63] < cs.delta && f + 63 < r0) f += 64;
            }
            return max(f, key_start(b, r));
        };
        // Row r of (b, h) against its keys j0..r in f64: the scores s_j (-inf before j0), their
        // max and the sum of exp(s_j - max).
        auto score_row = [&](int b, int h, int r, int j0, std::vector<double>& s, double& mx, double& z) {
            const int hk = h / G;
            s.assign(r + 1, -INFINITY);
            mx = -INFINITY;
            for (int j = j0; j <= r; ++j) {
                double dot = 0;
                for (int e = 0; e < D; ++e)
                    dot += (double)q[((b * T + r) * H + h) * D + e] * k[((b * T + j) * HK + hk) * D + e];
                s[j] = scale * dot + ((double)c[(b * H + h) * T + r] - c[(b * H + h) * T + j]);
                mx = std::max(mx, s[j]);
            }
            z = 0;
            for (int j = j0; j <= r; ++j) z += exp(s[j] - mx);
        };
        // reference in f64
        std::vector<double> o_r((size_t)B * T * H * D, 0), lse_r((size_t)B * H * T, -INFINITY);
        std::vector<double> dq_r(o_r.size(), 0), dk_r(k.size(), 0), dv_r(v.size(), 0), dc_r(lse_r.size(), 0);
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h) {
                const int hk = h / G;
                for (int r = st_of(b); r < T; ++r) {
                    const int j0 = first(b, h, r);
                    std::vector<double> s;
                    double mx, z;
                    score_row(b, h, r, j0, s, mx, z);
                    lse_r[(b * H + h) * T + r] = mx + log(z);
                    std::vector<double> p(r + 1, 0);
                    for (int j = j0; j <= r; ++j) p[j] = exp(s[j] - mx) / z;
                    double* orow = &o_r[((size_t)(b * T + r) * H + h) * D];
                    for (int j = j0; j <= r; ++j)
                        for (int e = 0; e < D; ++e) orow[e] += p[j] * v[((b * T + j) * HK + hk) * D + e];
                    const float* dor = &dout[((size_t)(b * T + r) * H + h) * D];
                    double delta = 0;
                    for (int e = 0; e < D; ++e) delta += dor[e] * orow[e];
                    for (int j = j0; j <= r; ++j) {
                        double dp = 0;
                        for (int e = 0; e < D; ++e) dp += dor[e] * (double)v[((b * T + j) * HK + hk) * D + e];
                        const double ds = p[j] * (dp - delta);
                        for (int e = 0; e < D; ++e) {
                            dq_r[((size_t)(b * T + r) * H + h) * D + e] += scale * ds * k[((b * T + j) * HK + hk) * D + e];
                            dk_r[((size_t)(b * T + j) * HK + hk) * D + e] += scale * ds * q[((b * T + r) * H + h) * D + e];
                            dv_r[((size_t)(b * T + j) * HK + hk) * D + e] += p[j] * dor[e];
                        }
                        dc_r[(b * H + h) * T + r] += ds;
                        dc_r[(b * H + h) * T + j] -= ds;
                    }
                }
            }
        // the kernels (the backward gets the reference o, rounded to f32)
        std::vector<float> o(o_r.size()), lse(lse_r.size()), o_in(o_r.size());
        for (size_t i = 0; i < o_r.size(); ++i) o_in[i] = (float)o_r[i];
        std::vector<float> lse_in(lse_r.size());
        std::vector<float> dq(o.size()), dk(k.size()), dv(v.size()), dc(lse.size()), delta(lse.size());
        std::vector<float> prune((size_t)B * H, cs.delta);
        std::vector<int> start(cs.start);
        // A forward's parameters for t query rows (gate sums c_); ck_: the cache's gate sums or null.
        auto fwd_params = [&](const float* q_, const float* k_, const float* v_, const float* c_, const float* ck_,
                              float* o_, float* lse_, int t) {
            F32Params p{};
            p.q = q_;
            p.k = k_;
            p.v = v_;
            p.c = c_;
            p.ck = ck_;
            p.start = start.empty() ? nullptr : start.data();
            p.prune = cs.delta != 0.f ? prune.data() : nullptr;
            p.o = o_;
            p.lse = lse_;
            p.b = B;
            p.h = H;
            p.t = t;
            p.d = D;
            p.scale = scale;
            p.hkv = HK;
            p.window = W;
            return p;
        };
        F32Params p = fwd_params(q.data(), k.data(), v.data(), c.data(), nullptr, o.data(), lse.data(), T);
        const unsigned rows = (unsigned)(B * H * T), kv_rows = (unsigned)(B * HK * T);
        launch({(rows + WARPS - 1) / WARPS, 1, 1}, WARPS * 32, [&] { fox32_fwd(p); });
        cmp("o", cs.name, o, o_r, 1e-5);
        cmp("lse", cs.name, lse, lse_r, 1e-5);
        for (size_t i = 0; i < lse.size(); ++i) lse_in[i] = (float)lse_r[i];
        p.lse = lse_in.data();
        p.o_in = o_in.data();
        p.dout = dout.data();
        p.delta = delta.data();
        p.dq = dq.data();
        p.dk = dk.data();
        p.dv = dv.data();
        p.dc = dc.data();
        launch({(rows + WARPS - 1) / WARPS, 1, 1}, WARPS * 32, [&] { fox32_bwd_dq(p); });
        launch({(kv_rows + WARPS - 1) / WARPS, 1, 1}, WARPS * 32, [&] { fox32_bwd_dkdv(p); });
        cmp("dq", cs.name, dq, dq_r, 1e-5);
        cmp("dk", cs.name, dk, dk_r, 1e-5);
        cmp("dv", cs.name, dv, dv_r, 1e-5);
        cmp("dc", cs.name, dc, dc_r, 1e-4);

        // Decoding: the last `tq` rows as a chunk (two blocks of query rows) against a cache
        // [B, Hkv, cap, D] holding every position, the gate sums [B, H, cap]; the window counts
        // from each row's position and ACP walks the chunk's blocks as the CPU's cached forward.
        {
            const int tq = 40, cap = T + 3, q0 = T - tq;
            std::vector<float> kc((size_t)B * HK * cap * D, 0.f), vc(kc.size(), 0.f), cc((size_t)B * H * cap, 0.f);
            std::vector<float> qq((size_t)B * tq * H * D), cq((size_t)B * H * tq);
            for (int b = 0; b < B; ++b) {
                for (int hk = 0; hk < HK; ++hk)
                    for (int t = 0; t < T; ++t)
                        for (int e = 0; e < D; ++e) {
                            kc[(((size_t)b * HK + hk) * cap + t) * D + e] = k[((size_t)(b * T + t) * HK + hk) * D + e];
                            vc[(((size_t)b * HK + hk) * cap + t) * D + e] = v[((size_t)(b * T + t) * HK + hk) * D + e];
                        }
                for (int h = 0; h < H; ++h) {
                    for (int t = 0; t < T; ++t) cc[((size_t)b * H + h) * cap + t] = c[((size_t)b * H + h) * T + t];
                    for (int r = 0; r < tq; ++r) {
                        cq[((size_t)b * H + h) * tq + r] = c[((size_t)b * H + h) * T + q0 + r];
                        for (int e = 0; e < D; ++e)
                            qq[(((size_t)b * tq + r) * H + h) * D + e] = q[(((size_t)b * T + q0 + r) * H + h) * D + e];
                    }
                }
            }
            std::vector<float> oc(qq.size()), lc(cq.size());
            std::vector<double> oc_r(oc.size(), 0), lc_r(lc.size(), -INFINITY);
            for (int b = 0; b < B; ++b)
                for (int h = 0; h < H; ++h)
                    for (int r = 0; r < tq; ++r) {
                        const int pos = q0 + r, hk = h / G;
                        if (pos < st_of(b)) continue;
                        const int r0 = r / 32 * 32, end = q0 + min(r0 + 32, tq);
                        const float* cb = &cc[(size_t)(b * H + h) * cap];
                        int f = key_start(b, q0 + r0) / 64 * 64;
                        if (cs.delta != 0.f)
                            while (f + 64 <= end && cq[(size_t)(b * H + h) * tq + r0] - cb[f + 63] < cs.delta &&
                                   f + 63 < q0 + r0)
                                f += 64;
                        const int j0 = max(f, key_start(b, pos));
                        std::vector<double> s;
                        double mx, z;
                        score_row(b, h, pos, j0, s, mx, z);
                        lc_r[((size_t)b * H + h) * tq + r] = mx + log(z);
                        double* orow = &oc_r[(((size_t)b * tq + r) * H + h) * D];
                        for (int j = j0; j <= pos; ++j)
                            for (int e = 0; e < D; ++e)
                                orow[e] += exp(s[j] - mx) / z * v[((b * T + j) * HK + hk) * D + e];
                    }
            F32Params pc = fwd_params(qq.data(), kc.data(), vc.data(), cq.data(), cc.data(), oc.data(), lc.data(), tq);
            pc.q_pos0 = q0;
            pc.cap = cap;
            const unsigned crow = (unsigned)(B * H * tq);
            launch({(crow + WARPS - 1) / WARPS, 1, 1}, WARPS * 32, [&] { fox32_fwd_cached(pc); });
            cmp("o (cached)", cs.name, oc, oc_r, 1e-5);
            cmp("lse (cached)", cs.name, lc, lc_r, 1e-5);
        }
    }
    printf("%d failures\n", fails);
    return fails != 0;
}
