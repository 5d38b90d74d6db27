// kernels/ops.cu run on the host under tests/host_emu/mock.h, each kernel against a plain loop of
// its definition (the CPU ops' semantics). Checks index arithmetic, bounds, tails and the
// two-pass reductions; tolerances are ~1e-6 relative L2 (the same f32 arithmetic in another
// summation order), 0 where the kernel must be exact, 1e-2 for outputs rounded to bf16.
#include "mock.h"
#include "../../kernels/pdl.cuh"
#include "../../kernels/activations.cuh"
#include "../../kernels/ops.cu"
#define EMU_SEED 42
#include "check.h"

static void cmp(const char* what, const std::vector<float>& got, const std::vector<float>& want, double tol) {
    if (got.size() != want.size()) { printf("FAIL %s size\n", what); fails++; return; }
    double e = rel_l2(got, want);
    bool ok = e <= tol;
    if (!ok) fails++;
    printf("%s %-40s %.3e\n", ok ? "ok  " : "FAIL", what, e);
}
static std::vector<bf16> tob(const std::vector<float>& x) {
    std::vector<bf16> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i].x = mock_rne(x[i]);
    return r;
}
static std::vector<float> fromb(const std::vector<bf16>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i] = __uint_as_float((u32)x[i].x << 16);
    return r;
}
static float sg(float x) { return x >= 0 ? 1.f / (1.f + expf(-x)) : expf(x) / (1.f + expf(x)); }
static dim3e g1(long n) { return {(unsigned)n, 1, 1}; }

// RMSNorm's loops: each row's 1/rms, and the backward (dx = acc·dx0 + rstd·(w·dy − x̂·mean(w·dy·x̂)),
// dw = dw0 + Σ_rows dy·x̂) with weight row r % groups.
static std::vector<float> rms_rstd(const std::vector<float>& x, int rows, int dim) {
    std::vector<float> rr(rows);
    for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int c = 0; c < dim; ++c) ss += x[r * dim + c] * x[r * dim + c];
        rr[r] = 1.0 / sqrt(ss / dim + 1e-6);
    }
    return rr;
}
static void rms_bwd_loop(std::vector<float>& dxr, std::vector<float>& dwr, bool acc, const std::vector<float>& dx0,
                         const std::vector<float>& dy, const std::vector<float>& x, const std::vector<float>& rr,
                         const std::vector<float>& w, int rows, int dim, int groups) {
    for (int r = 0; r < rows; ++r) {
        int g = r % groups;
        double dot = 0;
        for (int c = 0; c < dim; ++c) dot += w[g * dim + c] * dy[r * dim + c] * x[r * dim + c] * rr[r];
        double mean = dot / dim;
        for (int c = 0; c < dim; ++c) {
            dxr[r * dim + c] = (acc ? dx0[r * dim + c] : 0.f) +
                               rr[r] * (w[g * dim + c] * dy[r * dim + c] - x[r * dim + c] * rr[r] * mean);
            dwr[g * dim + c] += dy[r * dim + c] * x[r * dim + c] * rr[r];
        }
    }
}

int main() {
    // ---- RMSNorm fwd/bwd: dim 72 (4-wide loads), dim 37 (one element at a time), groups 3 with
    // a partial last super-row, and dim 136 (a second 128-element chunk)
    for (auto [rows, dim, groups] : {std::tuple{37, 72, 3}, std::tuple{37, 37, 3}, std::tuple{9, 136, 1}}) {
        auto x = randn(rows * dim), w = randn(groups * dim), dy = randn(rows * dim), dx0 = randn(rows * dim);
        auto dw0 = randn(groups * dim);
        std::vector<float> y(rows * dim), rstd(rows), yr(rows * dim), rr = rms_rstd(x, rows, dim);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < dim; ++c) yr[r * dim + c] = x[r * dim + c] * rr[r] * w[(r % groups) * dim + c];
        launch(g1((rows + 7) / 8), 256, [&] { rms_norm_fwd_f32(y.data(), rstd.data(), x.data(), w.data(), rows, dim, groups, 1e-6f); });
        cmp("rms fwd y", y, yr, 1e-6);
        cmp("rms fwd rstd", rstd, rr, 1e-6);
        std::vector<float> dxr(rows * dim), dwr = dw0;
        rms_bwd_loop(dxr, dwr, true, dx0, dy, x, rr, w, rows, dim, groups);
        auto dx = dx0;
        launch(g1((rows + 7) / 8), 256, [&] { rms_norm_bwd_dx_f32(dx.data(), 1, dy.data(), x.data(), rr.data(), w.data(), rows, dim, groups); });
        cmp("rms bwd dx accumulate", dx, dxr, 1e-6);
        int W = groups * dim, SR = (rows + groups - 1) / groups, R = 5, P = (SR + R - 1) / R;
        std::vector<float> part(P * W), dw = dw0;
        launch({(unsigned)((W + 31) / 32), (unsigned)P, 1}, 256, [&] { rms_norm_dw_part_f32(part.data(), dy.data(), x.data(), rr.data(), rows, dim, groups, R); });
        launch(g1(W), 256, [&] { colsum_final(dw.data(), part.data(), P, W); });
        cmp("rms bwd dw", dw, dwr, 1e-6);
        // bf16 forward
        auto xb = tob(x);
        auto xf = fromb(xb);
        std::vector<bf16> yb(rows * dim);
        std::vector<float> yr2(rows * dim);
        for (int r = 0; r < rows; ++r) {
            double ss = 0;
            for (int c = 0; c < dim; ++c) ss += xf[r * dim + c] * xf[r * dim + c];
            float s = 1.0 / sqrt(ss / dim + 1e-6);
            for (int c = 0; c < dim; ++c) yr2[r * dim + c] = xf[r * dim + c] * s * w[(r % groups) * dim + c];
        }
        launch(g1((rows + 7) / 8), 256, [&] { rms_norm_fwd_bf16(yb.data(), rstd.data(), xb.data(), w.data(), rows, dim, groups, 1e-6f); });
        cmp("rms fwd bf16 y", fromb(yb), yr2, 1e-2);
    }
    // ---- RMSNorm backward in one kernel (dx and the dw partial sums): rows of whole 128-wide
    // chunks (dim 128 with 3 groups, dim 256), rows of 16 and 8 lanes (dim 64 with 12 groups, dim
    // 32 with 4), partial last super-rows, chunks of 3 super-rows over several blocks and warps
    // with nothing to do; dx bitwise as the dx kernel, dw against the loop
    for (auto [rows, dim, groups] : {std::tuple{37, 128, 3}, std::tuple{20, 256, 1}, std::tuple{50, 64, 12},
                                     std::tuple{45, 32, 4}, std::tuple{200, 768, 1}}) {
        auto x = randn(rows * dim), w = randn(groups * dim), dy = randn(rows * dim), dx0 = randn(rows * dim);
        auto dw0 = randn(groups * dim);
        std::vector<float> rr = rms_rstd(x, rows, dim);
        for (int acc : {0, 1}) {
            std::vector<float> dxr(rows * dim), dwr = dw0;
            rms_bwd_loop(dxr, dwr, acc, dx0, dy, x, rr, w, rows, dim, groups);
            int W = groups * dim, SR = (rows + groups - 1) / groups, R = 3, P = (SR + R - 1) / R;
            std::vector<float> part(P * W, NAN), dw = dw0, dx = dx0, dx2 = dx0;
            launch(g1(P), 256, [&] {
                rms_norm_bwd_fused_f32(part.data(), dx.data(), acc, dy.data(), x.data(), rr.data(), w.data(), rows, dim,
                                       groups, R);
            });
            launch(g1(W), 256, [&] { colsum_final(dw.data(), part.data(), P, W); });
            launch(g1((rows + 7) / 8), 256, [&] {
                rms_norm_bwd_dx_f32(dx2.data(), acc, dy.data(), x.data(), rr.data(), w.data(), rows, dim, groups);
            });
            char what[96];
            snprintf(what, sizeof what, "rms bwd fused dim %d groups %d acc %d", dim, groups, acc);
            cmp((std::string(what) + " dx").c_str(), dx, dxr, 1e-6);
            cmp((std::string(what) + " dw").c_str(), dw, dwr, 1e-6);
            cmp((std::string(what) + " dx = dx kernel").c_str(), dx, dx2, 0);
        }
        // bf16: dx bitwise as the bf16 dx kernel
        auto xb = tob(x), dyb = tob(dy), dxb = tob(dx0), dxb2 = tob(dx0);
        int W = groups * dim, SR = (rows + groups - 1) / groups, R = 3, P = (SR + R - 1) / R;
        std::vector<float> part(P * W);
        launch(g1(P), 256, [&] {
            rms_norm_bwd_fused_bf16(part.data(), dxb.data(), 1, dyb.data(), xb.data(), rr.data(), w.data(), rows, dim,
                                    groups, R);
        });
        launch(g1((rows + 7) / 8), 256, [&] {
            rms_norm_bwd_dx_bf16(dxb2.data(), 1, dyb.data(), xb.data(), rr.data(), w.data(), rows, dim, groups);
        });
        cmp("rms bwd fused bf16 dx = dx kernel", fromb(dxb), fromb(dxb2), 0);
    }
    // ---- a decode step's norms: a block per row, alone and after a residual add (dim 72: 4-wide
    // loads, 37: single elements), against plain loops
    for (int dim : {72, 37}) {
        const int rows = 3;
        auto a = randn(rows * dim), b = randn(rows * dim), w = randn(dim);
        for (int add : {0, 1}) {
            std::vector<float> h(rows * dim), y(rows * dim), rstd(rows), hr(rows * dim), yr(rows * dim), rr(rows);
            for (int r = 0; r < rows; ++r) {
                double ss = 0;
                for (int c = 0; c < dim; ++c) {
                    hr[r * dim + c] = a[r * dim + c] + (add ? b[r * dim + c] : 0.f);
                    ss += (double)hr[r * dim + c] * hr[r * dim + c];
                }
                rr[r] = 1.0 / sqrt(ss / dim + 1e-6);
                for (int c = 0; c < dim; ++c) yr[r * dim + c] = hr[r * dim + c] * rr[r] * w[c];
            }
            launch(g1(rows), 256, [&] {
                rms_norm_fwd_wide_f32(y.data(), rstd.data(), add ? h.data() : nullptr, a.data(), add ? b.data() : nullptr,
                                      w.data(), dim, 1, 1e-6f);
            });
            cmp(add ? "add + rms (block per row) y" : "rms (block per row) y", y, yr, 1e-6);
            cmp("rms (block per row) rstd", rstd, rr, 1e-6);
            if (add) cmp("add + rms (block per row) h", h, hr, 0);
        }
    }
    // ---- matrix-vector products of a decode step: rows 3, in 64, out 37, the row split over 1 and
    // 2 warps; bf16 in and out; gate_proj with SwiGLU (I = 5)
    {
        const int rows = 3, in = 64, out = 37;
        auto x = randn(rows * in), w = randn(out * in, 0.1f);
        // y = x wᵀ in f64, rounded to f32
        auto gemv_ref = [&](const std::vector<float>& x, const std::vector<float>& w) {
            std::vector<float> y(rows * out);
            for (int r = 0; r < rows; ++r)
                for (int o = 0; o < out; ++o) {
                    double s = 0;
                    for (int k = 0; k < in; ++k) s += (double)x[r * in + k] * w[o * in + k];
                    y[r * out + o] = s;
                }
            return y;
        };
        const std::vector<float> yr = gemv_ref(x, w);
        for (int ks : {1, 2}) {
            std::vector<float> y(rows * out);
            launch(g1((out + 8 / ks - 1) / (8 / ks)), 256,
                   [&] { gemv_f32_f32(y.data(), nullptr, x.data(), w.data(), rows, in, out, ks); });
            cmp(ks == 1 ? "gemv f32 (a warp per output)" : "gemv f32 (2 warps per output)", y, yr, 1e-5);
        }
        auto xb = tob(x), wb = tob(w);
        auto xf = fromb(xb), wf = fromb(wb);
        const std::vector<float> ybr = gemv_ref(xf, wf);
        std::vector<bf16> yb(rows * out);
        launch(g1((out + 7) / 8), 256, [&] { gemv_bf16_bf16(yb.data(), nullptr, xb.data(), wb.data(), rows, in, out, 1); });
        cmp("gemv bf16", fromb(yb), ybr, 1e-2);
        const int inter = 5;
        auto wg = randn(2 * inter * in, 0.1f);
        std::vector<float> gur(rows * 2 * inter), hr(rows * inter);
        for (int r = 0; r < rows; ++r) {
            for (int o = 0; o < 2 * inter; ++o) {
                double s = 0;
                for (int k = 0; k < in; ++k) s += (double)x[r * in + k] * wg[o * in + k];
                gur[r * 2 * inter + o] = s;
            }
            for (int i = 0; i < inter; ++i) {
                float g = gur[r * 2 * inter + i];
                hr[r * inter + i] = g * sg(g) * gur[r * 2 * inter + inter + i];
            }
        }
        std::vector<float> gu(rows * 2 * inter), h(rows * inter);
        launch(g1((inter + 1) / 2), 256, [&] { gemv_glu_f32(gu.data(), h.data(), x.data(), wg.data(), rows, in, 2 * inter, 2); });
        cmp("gemv glu gu", gu, gur, 1e-5);
        cmp("gemv glu h", h, hr, 1e-5);
    }
    // ---- gemv_step_in (a Mamba-2 decode step's in_proj with its conv and dt): rows 3 (row 1
    // padding), out = z 8 | xBC 12 | dt 3 columns, conv width 4, against the GEMV loop then the
    // conv (continuing the state, SiLU) and softplus(dt_raw + bias); the state advanced in place.
    {
        const int rows = 3, in = 64, zc = 8, C = 12, W = 4, H = 3, out = zc + C + H;
        auto x = randn(rows * in), w = randn(out * in, 0.1f), cw = randn(C * W, 0.5f), cb = randn(C, 0.5f);
        auto dtb = randn(H), st0 = randn(rows * (W - 1) * C);
        int start[rows] = {0, 1, 0};
        std::vector<float> zr(rows * out), xbcr(rows * C), dtr(rows * H), str = st0;
        for (int r = 0; r < rows; ++r) {
            for (int o = 0; o < out; ++o) {
                double s = 0;
                for (int k = 0; k < in; ++k) s += (double)x[r * in + k] * w[o * in + k];
                zr[r * out + o] = s;
            }
            for (int c = 0; c < C; ++c) {
                if (start[r] > 0) continue;
                float* sc = &str[(r * (W - 1)) * C + c];
                const float v = zr[r * out + zc + c];
                double acc = cb[c];
                for (int k = 0; k < W - 1; ++k) acc += (double)cw[c * W + k] * sc[k * C];
                acc += (double)cw[c * W + W - 1] * v;
                for (int k = 0; k + 1 < W - 1; ++k) sc[k * C] = sc[(k + 1) * C];
                sc[(W - 2) * C] = v;
                xbcr[r * C + c] = acc / (1.0 + exp(-acc));
            }
            for (int h = 0; h < H; ++h) dtr[r * H + h] = log1p(exp((double)zr[r * out + zc + C + h] + dtb[h]));
        }
        std::vector<float> z(rows * out), xbc(rows * C, 7.f), dt(rows * H), st = st0;
        launch(g1((out + 7) / 8), 256, [&] {
            gemv_step_in_f32(z.data(), x.data(), w.data(), rows, in, out, 1, xbc.data(), st.data(), dt.data(),
                             cw.data(), cb.data(), dtb.data(), start, zc, C, W, zc + C, H);
        });
        for (int c = 0; c < C; ++c) xbcr[1 * C + c] = 0.f;  // the padding row's xbc is 0
        cmp("gemv_step_in zxbcdt", z, zr, 1e-5);
        cmp("gemv_step_in xbc", xbc, xbcr, 1e-5);
        cmp("gemv_step_in dt", dt, dtr, 1e-5);
        cmp("gemv_step_in conv state", st, str, 1e-5);
    }
    // ---- KV-shift B=2 T=9 H=3, D = 40 (4-wide) and 10 (single elements), start {0, 4}
    for (int D : {40, 10}) {
        int B = 2, T = 9, H = 3;
        int start[2] = {0, 4};
        auto x = randn(B * T * H * D), dout = randn(B * T * H * D);
        std::vector<float> al(B * T * H);
        for (auto& a : al) a = sg(randn(1)[0]);
        std::vector<float> outr(x.size()), dxr(x.size()), dar(al.size());
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < T; ++t)
                for (int h = 0; h < H; ++h) {
                    int s = start[b];
                    long row = ((long)b * T + t) * H + h;
                    float a = al[row];
                    float da = 0;
                    for (int c = 0; c < D; ++c) {
                        long i = row * D + c;
                        float cur = x[i];
                        float prev = (t > s) ? x[(((long)b * T + t - 1) * H + h) * D + c] : 0.f;
                        outr[i] = t < s ? cur : a * prev + (1 - a) * cur;
                        float go = dout[i];
                        if (t < s) { dxr[i] = go; continue; }
                        da += go * (prev - cur);
                        float g = go * (1 - a);
                        if (t + 1 < T) g += dout[(((long)b * T + t + 1) * H + h) * D + c] * al[((long)b * T + t + 1) * H + h];
                        dxr[i] = g;
                    }
                    dar[row] = t < s ? 0.f : da;
                }
        std::vector<float> out(x.size()), dx(x.size()), da(al.size());
        int rowsn = B * T * H;
        launch(g1((rowsn + 7) / 8), 256, [&] { kv_shift_fwd_f32(out.data(), x.data(), al.data(), start, B, T, H, D); });
        cmp("kv fwd", out, outr, 1e-6);
        launch(g1((rowsn + 7) / 8), 256, [&] { kv_shift_bwd_f32(dx.data(), da.data(), dout.data(), x.data(), al.data(), start, B, T, H, D); });
        cmp("kv bwd dx", dx, dxr, 1e-6);
        cmp("kv bwd dalpha", da, dar, 1e-6);
    }
    // ---- RoPE rows 5 H 2 D 8, fwd then inverse = identity, fwd vs formula
    {
        int rows = 5, H = 2, D = 8;
        int pos[5] = {-3, 0, 1, 77, 65000};
        auto x = randn(rows * H * D);
        auto y = x;
        long n = (long)rows * D / 2;
        launch(g1((n + 255) / 256), 256, [&] { rope_apply_f32(y.data(), pos, rows, H, D, 500000.0, 0); });
        std::vector<float> yr = x;
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < D / 2; ++c) {
                double ang = (float)pos[r] * (float)(1.0 / pow(500000.0, 2.0 * c / D));
                float s = sin(ang), co = cos(ang);
                for (int h = 0; h < H; ++h) {
                    float a = x[r * H * D + h * D + c], b = x[r * H * D + h * D + c + D / 2];
                    yr[r * H * D + h * D + c] = a * co - b * s;
                    yr[r * H * D + h * D + c + D / 2] = b * co + a * s;
                }
            }
        cmp("rope fwd", y, yr, 1e-6);
        launch(g1((n + 255) / 256), 256, [&] { rope_apply_f32(y.data(), pos, rows, H, D, 500000.0, 1); });
        cmp("rope inverse(fwd) = x", y, x, 1e-6);
    }
    // ---- elementwise with a tail (n = 1003), f32 and bf16
    {
        long n = 1003;
        auto a = randn(n, 3), b = randn(n), c = randn(n);
        std::vector<float> y(n), r(n), r2(n);
        unsigned gb = (unsigned)(((n + 3) / 4 + 255) / 256);
        launch(g1(gb), 256, [&] { sigmoid_fwd_f32(y.data(), a.data(), n); });
        for (long i = 0; i < n; ++i) r[i] = sg(a[i]);
        cmp("sigmoid fwd", y, r, 1e-6);
        std::vector<float> dx(n);
        launch(g1(gb), 256, [&] { sigmoid_bwd_f32(dx.data(), b.data(), r.data(), n); });
        for (long i = 0; i < n; ++i) r2[i] = b[i] * r[i] * (1 - r[i]);
        cmp("sigmoid bwd", dx, r2, 1e-6);
        std::vector<float> dp(n), dg(n);
        launch(g1(gb), 256, [&] { gate_mul_fwd_f32(y.data(), b.data(), a.data(), n); });
        for (long i = 0; i < n; ++i) r[i] = b[i] * sg(a[i]);
        cmp("gate fwd", y, r, 1e-6);
        launch(g1(gb), 256, [&] { gate_mul_bwd_f32(dp.data(), dg.data(), c.data(), b.data(), a.data(), n); });
        for (long i = 0; i < n; ++i) { float s = sg(a[i]); r[i] = c[i] * s; r2[i] = c[i] * b[i] * s * (1 - s); }
        cmp("gate bwd dpre", dp, r, 1e-6);
        cmp("gate bwd dg", dg, r2, 1e-6);
        auto ab = tob(a), bb = tob(b);
        std::vector<bf16> yb(n);
        launch(g1(gb), 256, [&] { add_bf16(yb.data(), ab.data(), bb.data(), n); });
        auto af = fromb(ab), bf = fromb(bb);
        for (long i = 0; i < n; ++i) r[i] = af[i] + bf[i];
        cmp("add bf16", fromb(yb), r, 1e-2);
        launch(g1(gb), 256, [&] { add_inplace_bf16(ab.data(), bb.data(), n); });
        cmp("add_inplace bf16", fromb(ab), r, 1e-2);
        launch(g1(gb), 256, [&] { cast_from_f32_bf16(yb.data(), c.data(), n); });
        auto cb = tob(c);
        int diff = 0;
        for (long i = 0; i < n; ++i) diff += yb[i].x != cb[i].x;
        printf("%s cast_from_f32 bf16 diffs %d\n", diff ? "FAIL" : "ok  ", diff);
        fails += diff != 0;
        std::vector<float> back(n);
        launch(g1(gb), 256, [&] { cast_to_f32_bf16(back.data(), cb.data(), n); });
        cmp("cast_to_f32 bf16", back, fromb(cb), 0);
        auto lg = randn(n, 4);
        launch(g1(gb), 256, [&] { log_fgate_fwd(y.data(), lg.data(), n); });
        for (long i = 0; i < n; ++i) r[i] = std::min(lg[i], 0.f) - log1pf(expf(-fabsf(lg[i])));
        cmp("log_fgate fwd", y, r, 1e-6);
        launch(g1(gb), 256, [&] { log_fgate_bwd(y.data(), b.data(), lg.data(), n); });
        for (long i = 0; i < n; ++i) r[i] = b[i] * sg(-lg[i]);
        cmp("log_fgate bwd", y, r, 1e-6);
    }
    // ---- bias rows, fill, column sums (rows 1001 cols 12, R = 7)
    {
        long rows = 1001;
        int cols = 12;
        auto x = randn(rows * cols), bias = randn(cols), d0 = randn(cols);
        auto y = x;
        std::vector<float> r(rows * cols);
        launch(g1((rows * cols + 255) / 256), 256, [&] { add_bias_rows(y.data(), bias.data(), rows, cols); });
        for (long i = 0; i < rows * cols; ++i) r[i] = x[i] + bias[i % cols];
        cmp("add_bias_rows", y, r, 0);
        launch(g1((rows * cols + 255) / 256), 256, [&] { fill_rows(y.data(), bias.data(), rows, cols); });
        for (long i = 0; i < rows * cols; ++i) r[i] = bias[i % cols];
        cmp("fill_rows", y, r, 0);
        int R = 7, P = (rows + R - 1) / R;
        std::vector<float> part(P * cols), d = d0, dr = d0;
        launch({1, (unsigned)P, 1}, 256, [&] { colsum_part_f32(part.data(), x.data(), rows, cols, R); });
        launch(g1(cols), 256, [&] { colsum_final(d.data(), part.data(), P, cols); });
        for (long i = 0; i < rows * cols; ++i) dr[i % cols] += x[i];
        cmp("col_sum_acc", d, dr, 1e-5);
    }
    // ---- SwiGLU rows 3, I 37 (a thread per channel) and I 44 (a thread per 4 channels), f32; bf16
    // at I 44 against the loop on the rounded inputs
    for (int I : {37, 44}) {
        int rows = 3;
        const long threads = I % 4 == 0 ? rows * I / 4 : rows * I;
        auto gu = randn(rows * 2 * I, 2), dh = randn(rows * I);
        std::vector<float> h(rows * I, NAN), hr(rows * I), dgu(rows * 2 * I, NAN), dr(rows * 2 * I);
        launch(g1((threads + 255) / 256), 256, [&] { swiglu_fwd_f32(h.data(), gu.data(), rows, I); });
        auto loops = [&](const std::vector<float>& g_, const std::vector<float>& d_) {
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < I; ++c) {
                    float a = g_[r * 2 * I + c], u = g_[r * 2 * I + I + c], s = sg(a);
                    hr[r * I + c] = a * s * u;
                    dr[r * 2 * I + c] = d_[r * I + c] * u * s * (1 + a * (1 - s));
                    dr[r * 2 * I + I + c] = d_[r * I + c] * a * s;
                }
        };
        loops(gu, dh);
        cmp(I % 4 ? "swiglu fwd (per channel)" : "swiglu fwd (4 channels a thread)", h, hr, 1e-6);
        launch(g1((threads + 255) / 256), 256, [&] { swiglu_bwd_f32(dgu.data(), dh.data(), gu.data(), rows, I); });
        cmp(I % 4 ? "swiglu bwd (per channel)" : "swiglu bwd (4 channels a thread)", dgu, dr, 1e-6);
        auto gub = tob(gu), dhb = tob(dh);
        std::vector<bf16> hb(rows * I), dgub(rows * 2 * I);
        launch(g1((threads + 255) / 256), 256, [&] { swiglu_fwd_bf16(hb.data(), gub.data(), rows, I); });
        launch(g1((threads + 255) / 256), 256, [&] { swiglu_bwd_bf16(dgub.data(), dhb.data(), gub.data(), rows, I); });
        loops(fromb(gub), fromb(dhb));
        cmp("swiglu fwd bf16", fromb(hb), hr, 1e-2);
        cmp("swiglu bwd bf16", fromb(dgub), dr, 1e-2);
    }
    // ---- embedding fwd/bwd, vocab 11, d 40, rows 30 (host grouping as in ops.rs)
    {
        int vocab = 11, d = 40, rows = 30;
        auto table = randn(vocab * d), dout = randn(rows * d), dt0 = randn(vocab * d);
        std::vector<int> ids(rows);
        for (auto& i : ids) i = rng() % 6;
        std::vector<float> out(rows * d), outr(rows * d);
        launch(g1((rows * d + 255) / 256), 256, [&] { embedding_fwd_f32(out.data(), table.data(), ids.data(), rows, d, vocab); });
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < d; ++c) outr[r * d + c] = table[ids[r] * d + c];
        cmp("embedding fwd", out, outr, 0);
        std::vector<int> order(rows), tok, st;
        for (int i = 0; i < rows; ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](int a, int b) { return std::make_pair(ids[a], a) < std::make_pair(ids[b], b); });
        int prev = -1;
        for (int i = 0; i < rows; ++i)
            if (ids[order[i]] != prev) { prev = ids[order[i]]; tok.push_back(prev); st.push_back(i); }
        st.push_back(rows);
        auto dt = dt0, dtr = dt0;
        launch(g1(tok.size()), 256, [&] { embedding_bwd_f32(dt.data(), dout.data(), order.data(), tok.data(), st.data(), d); });
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < d; ++c) dtr[ids[r] * d + c] += dout[r * d + c];
        cmp("embedding bwd (exact order)", dt, dtr, 0);
    }
    // ---- cross-entropy rows 4, vocab 1000 and 7
    for (int vocab : {1000, 7}) {
        int rows = 4;
        auto lg = randn(rows * vocab, 3);
        int tg[4] = {3, -1, vocab - 1, 0};
        float weight = 1.f / 3;
        std::vector<float> dl(rows * vocab), loss(rows), dr(rows * vocab), lr(rows);
        launch(g1(rows), 512, [&] { cross_entropy_f32(dl.data(), loss.data(), lg.data(), tg, weight, rows, vocab); });
        for (int r = 0; r < rows; ++r) {
            if (tg[r] < 0) { lr[r] = 0; continue; }
            double m = -INFINITY, s = 0;
            for (int c = 0; c < vocab; ++c) m = std::max(m, (double)lg[r * vocab + c]);
            for (int c = 0; c < vocab; ++c) s += exp(lg[r * vocab + c] - m);
            double lse = m + log(s);
            lr[r] = lse - lg[r * vocab + tg[r]];
            for (int c = 0; c < vocab; ++c) dr[r * vocab + c] = exp(lg[r * vocab + c] - lse) * weight - (c == tg[r] ? weight : 0);
        }
        cmp(vocab == 7 ? "xent loss v7" : "xent loss v1000", loss, lr, 1e-6);
        cmp(vocab == 7 ? "xent dlogits v7" : "xent dlogits v1000", dl, dr, 1e-5);
    }
    // ---- AdamW n = 1003, 2 steps, grid smaller than n/256 (grid-stride)
    {
        long n = 1003;
        auto w = randn(n), wr = w;
        std::vector<float> m(n), v(n), mr(n), vr(n), copyf(n);
        std::vector<bf16> copy(n);
        float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, lr = 1e-2f, wd = 0.1f, gs = 0.5f;
        for (int step = 1; step <= 2; ++step) {
            auto g = randn(n);
            double bc1 = 1 - pow((double)b1, step), bc2 = 1 - pow((double)b2, step);
            float ss = (float)(lr / bc1), bs = (float)sqrt(bc2), decay = (float)(1 - (double)lr * wd);
            for (long i = 0; i < n; ++i) {
                float gj = g[i] * gs;
                mr[i] = b1 * mr[i] + (1 - b1) * gj;
                vr[i] = b2 * vr[i] + (1 - b2) * gj * gj;
                wr[i] = wr[i] * decay - ss * mr[i] / (sqrtf(vr[i]) / bs + eps);
            }
            launch(g1(2), 256, [&] { adamw_bf16(w.data(), copy.data(), g.data(), m.data(), v.data(), n, b1, b2, eps, decay, ss, bs, gs); });
        }
        cmp("adamw w", w, wr, 1e-6);
        cmp("adamw m", m, mr, 1e-6);
        cmp("adamw v", v, vr, 1e-6);
        cmp("adamw bf16 copy", fromb(copy), wr, 1e-2);
    }
    // ---- sum of squares n = 100001, 7 blocks
    {
        long n = 100001;
        auto x = randn(n);
        double want = 0;
        for (auto v : x) want += (double)v * v;
        std::vector<double> part(7);
        float out[3] = {7, 7, 7};
        launch(g1(7), 256, [&] { sumsq_part(part.data(), x.data(), n); });
        launch(g1(1), 256, [&] { sumsq_final(out, 1, part.data(), 7); });
        bool ok = fabs(out[1] - want) / want < 1e-6 && out[0] == 7 && out[2] == 7;
        printf("%s sum_squares %g vs %g\n", ok ? "ok  " : "FAIL", out[1], want);
        fails += !ok;
    }
    printf("%d failures\n", fails);
    return fails != 0;
}
