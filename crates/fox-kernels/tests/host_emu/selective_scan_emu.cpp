// kernels/selective_scan.cu run on the host under tests/host_emu/mock.h against an f64 reference
// of the recurrence (crate::selective_scan's definition): the forward's outputs, chunk states and
// final state, the backward's every gradient (through time, with every state kept), decode steps,
// with left padding (a row starting mid-chunk), an initial state, the gate, a partial block of
// channels (Di = 18: blocks of 16), N = 16 and N = 5, T = 70 (a chunk of 64 and a part of the
// next one's first half). Tolerance 1e-5 relative L2: f32 against f64 over 70 steps whose decays
// are at most 1 (observed ≤ 1.7e-7). The bf16 forward runs once against the same f64 reference of
// the unrounded inputs: u, δ, z, B, C and the output each rounded to bf16 (2^-9 relative), 3e-2
// (observed 4e-3). The dt columns of dbc must stay untouched.
#include "mock.h"
#include "../../kernels/elem.cuh"
#include "../../kernels/activations.cuh"
#include "../../kernels/selective_scan.cu"
#define EMU_SEED 11
#include "check.h"

static void cmp(const char* name, const char* what, const std::vector<float>& got, const std::vector<double>& want,
                double tol) {
    double e = rel_l2(got, want);
    bool ok = e <= tol && got.size() == want.size();
    if (!ok) fails++;
    printf("%s %-34s %-14s %.3e\n", ok ? "ok  " : "FAIL", name, what, e);
}
static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

struct Case {
    const char* name;
    int B, T, Di, N, dt_rank;
    bool gate, h0;
    std::vector<int> start;
};

int main() {
    const Case cases[] = {
        {"B=2 T=70 Di=18 N=16 gate pad h0", 2, 70, 18, 16, 3, true, true, {0, 40}},
        {"B=1 T=33 Di=16 N=5 gate", 1, 33, 16, 5, 2, true, false, {}},
    };
    for (const Case& c : cases) {
        const int B = c.B, T = c.T, Di = c.Di, N = c.N, st = c.dt_rank + 2 * c.N, K = (T + 63) / 64;
        const long m = (long)B * T * Di;
        auto u = randn(m), dout = randn(m), z = randn(m, 2.f), bc = randn((size_t)B * T * st), D = randn(Di);
        auto h0 = randn((size_t)B * Di * N);
        std::vector<float> delta(m), A((size_t)Di * N);
        for (auto& x : delta) x = log1pf(expf(randn(1)[0] - 1.f));
        std::uniform_real_distribution<float> ua(-1.f, 1.5f);
        for (auto& x : A) x = -expf(ua(rng));
        if (!c.h0) std::fill(h0.begin(), h0.end(), 0.f);
        auto s_of = [&](int b) { return c.start.empty() ? 0 : std::min(c.start[b], T); };
        auto Bv = [&](int b, int t, int n) { return (double)bc[((size_t)b * T + t) * st + c.dt_rank + n]; };
        auto Cv = [&](int b, int t, int n) { return (double)bc[((size_t)b * T + t) * st + c.dt_rank + N + n]; };
        // f64 reference: every state, y, out.
        std::vector<double> hs((size_t)B * (T + 1) * Di * N), ys(m, 0.0), out(m, 0.0);
        auto H = [&](int b, int t, int d, int n) -> double& { return hs[(((size_t)b * (T + 1) + t) * Di + d) * N + n]; };
        for (int b = 0; b < B; ++b)
            for (int d = 0; d < Di; ++d) {
                for (int n = 0; n < N; ++n) H(b, 0, d, n) = h0[((size_t)b * Di + d) * N + n];
                for (int t = 0; t < T; ++t) {
                    const long r = ((long)b * T + t) * Di + d;
                    const bool real = t >= s_of(b);
                    double y = real ? (double)D[d] * u[r] : 0.0;
                    for (int n = 0; n < N; ++n) {
                        double h = H(b, t, d, n);
                        if (real) h = exp((double)delta[r] * A[d * N + n]) * h + (double)delta[r] * Bv(b, t, n) * u[r];
                        H(b, t + 1, d, n) = h;
                        y += real ? h * Cv(b, t, n) : 0.0;
                    }
                    ys[r] = y;
                    out[r] = real ? (c.gate ? y * z[r] * sigm(z[r]) : y) : 0.0;
                }
            }
        std::vector<double> saved_ref((size_t)B * K * Di * N), hlast_ref((size_t)B * Di * N);
        for (int b = 0; b < B; ++b)
            for (int d = 0; d < Di; ++d)
                for (int n = 0; n < N; ++n) {
                    for (int k = 0; k < K; ++k) saved_ref[(((size_t)b * K + k) * Di + d) * N + n] = H(b, k * 64, d, n);
                    hlast_ref[((size_t)b * Di + d) * N + n] = H(b, T, d, n);
                }
        // f64 reference backward (through time).
        std::vector<double> rdu(m, 0.0), rdd(m, 0.0), rdz(m, 0.0), rdA((size_t)Di * N, 0.0), rdD(Di, 0.0);
        std::vector<double> rdB((size_t)B * T * N, 0.0), rdC((size_t)B * T * N, 0.0), rdh0((size_t)B * Di * N, 0.0);
        for (int b = 0; b < B; ++b)
            for (int d = 0; d < Di; ++d) {
                std::vector<double> dh(N, 0.0);
                for (int t = T - 1; t >= 0; --t) {
                    const long r = ((long)b * T + t) * Di + d;
                    if (t < s_of(b)) continue;
                    const double go = dout[r], dl = delta[r], uu = u[r];
                    double dy = go;
                    if (c.gate) {
                        const double sg = sigm(z[r]);
                        rdz[r] = go * ys[r] * sg * (1 + z[r] * (1 - sg));
                        dy = go * z[r] * sg;
                    }
                    rdD[d] += dy * uu;
                    double gu = dy * D[d], gd = 0;
                    for (int n = 0; n < N; ++n) {
                        const double a = A[d * N + n], e = exp(dl * a), hp = H(b, t, d, n), hc = H(b, t + 1, d, n);
                        rdC[((size_t)b * T + t) * N + n] += dy * hc;
                        const double dht = dh[n] + dy * Cv(b, t, n);
                        rdB[((size_t)b * T + t) * N + n] += dht * dl * uu;
                        gd += dht * hp * e * a + dht * Bv(b, t, n) * uu;
                        gu += dht * dl * Bv(b, t, n);
                        rdA[d * N + n] += dht * hp * e * dl;
                        dh[n] = dht * e;
                    }
                    rdu[r] = gu;
                    rdd[r] = gd;
                }
                for (int n = 0; n < N; ++n) rdh0[((size_t)b * Di + d) * N + n] = dh[n];
            }
        // The kernels, f32.
        std::vector<int> start(c.start.begin(), c.start.end());
        std::vector<float> gout(m), saved((size_t)B * K * Di * N), hlast((size_t)B * Di * N);
        const int blocks = (Di + 15) / 16;
        std::vector<float> du(m), dd(m), dz(m), dbc(bc.size(), 7.25f), dA((size_t)Di * N, 0.f), dD(Di, 0.f),
            dh0((size_t)B * Di * N);
        std::vector<float> scratch((size_t)blocks * B * T * 32 + (size_t)B * Di * (N + 1));
        ScanParams p{};
        p.u = u.data();
        p.delta = delta.data();
        p.A = A.data();
        p.bc = bc.data();
        p.D = D.data();
        p.z = c.gate ? z.data() : nullptr;
        p.start = start.empty() ? nullptr : start.data();
        p.h0 = c.h0 ? h0.data() : nullptr;
        p.out = gout.data();
        p.saved = saved.data();
        p.h_last = hlast.data();
        p.dout = dout.data();
        p.du = du.data();
        p.ddelta = dd.data();
        p.dz = c.gate ? dz.data() : nullptr;
        p.dbc = dbc.data();
        p.dh0 = dh0.data();
        p.part_bc = scratch.data();
        p.part_a = p.part_bc + (size_t)blocks * B * T * 32;
        p.part_d = p.part_a + (size_t)B * Di * N;
        p.da = dA.data();
        p.dd = dD.data();
        p.sb = (long long)T * st;
        p.st = st;
        p.zs = Di;  // z and dz contiguous [B, T, Di]
        p.b_off = c.dt_rank;
        p.c_off = c.dt_rank + N;
        p.B = B;
        p.T = T;
        p.Di = Di;
        p.N = N;
        launch({(unsigned)blocks, (unsigned)B, 1}, 256, [&] { fox_scan_fwd_f32(p); });
        cmp(c.name, "out", gout, out, 1e-5);
        cmp(c.name, "saved states", saved, saved_ref, 1e-5);
        cmp(c.name, "final state", hlast, hlast_ref, 1e-5);
        launch({(unsigned)blocks, (unsigned)B, 1}, 256, [&] { fox_scan_bwd_f32(p); });
        launch({(unsigned)((B * T * 32 + 255) / 256), 1, 1}, 256, [&] { fox_scan_bwd_bc_f32(p, blocks); });
        launch({(unsigned)((Di * (N + 1) + 255) / 256), 1, 1}, 256, [&] { fox_scan_bwd_params(p); });
        cmp(c.name, "du", du, rdu, 1e-5);
        cmp(c.name, "ddelta", dd, rdd, 1e-5);
        if (c.gate) cmp(c.name, "dz", dz, rdz, 1e-5);
        cmp(c.name, "dA", dA, rdA, 1e-5);
        cmp(c.name, "dD", dD, rdD, 1e-5);
        cmp(c.name, "dh0", dh0, rdh0, 1e-5);
        std::vector<float> gB, gC;
        std::vector<double> wB, wC;
        int touched = 0;
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < T; ++t) {
                const size_t row = ((size_t)b * T + t) * st;
                for (int j = 0; j < c.dt_rank; ++j) touched += dbc[row + j] != 7.25f;
                for (int n = 0; n < N; ++n) {
                    gB.push_back(dbc[row + c.dt_rank + n]);
                    gC.push_back(dbc[row + c.dt_rank + N + n]);
                    wB.push_back(rdB[((size_t)b * T + t) * N + n]);
                    wC.push_back(rdC[((size_t)b * T + t) * N + n]);
                }
            }
        cmp(c.name, "dB", gB, wB, 1e-5);
        cmp(c.name, "dC", gC, wC, 1e-5);
        cmp(c.name, "dt columns kept", {(float)touched}, {0.0}, 0.0);
        // Decode: the first 5 positions one at a time from h0 (rows of [B, Di] and [B, st]).
        if (c.start.empty()) {
            std::vector<float> h(h0), o((size_t)B * Di), gathered;
            std::vector<double> want;
            for (int t = 0; t < 5; ++t) {
                std::vector<float> ut, dt, zt, bct;
                for (int b = 0; b < B; ++b) {
                    for (int d = 0; d < Di; ++d) {
                        const long r = ((long)b * T + t) * Di + d;
                        ut.push_back(u[r]);
                        dt.push_back(delta[r]);
                        zt.push_back(z[r]);
                        want.push_back(out[r]);
                    }
                    for (int j = 0; j < st; ++j) bct.push_back(bc[((size_t)b * T + t) * st + j]);
                }
                ScanParams q = p;
                q.u = ut.data();
                q.delta = dt.data();
                q.z = c.gate ? zt.data() : nullptr;
                q.bc = bct.data();
                q.sb = st;
                q.T = 1;
                q.h_last = h.data();
                q.out = o.data();
                launch({(unsigned)blocks, (unsigned)B, 1}, 256, [&] { fox_scan_decode_f32(q); });
                gathered.insert(gathered.end(), o.begin(), o.end());
            }
            cmp(c.name, "decode outputs", gathered, want, 1e-5);
            std::vector<double> h5;
            for (int b = 0; b < B; ++b)
                for (int d = 0; d < Di; ++d)
                    for (int n = 0; n < N; ++n) h5.push_back(H(b, 5, d, n));
            cmp(c.name, "decode state", h, h5, 1e-5);
        }
        // bf16 activations: the bf16 loads and stores of the forward.
        std::vector<u16> ub(m), db(m), zb(m), bcb(bc.size()), ob(m);
        for (long i = 0; i < m; ++i) {
            ub[i] = mock_rne(u[i]);
            db[i] = mock_rne(delta[i]);
            zb[i] = mock_rne(z[i]);
        }
        for (size_t i = 0; i < bc.size(); ++i) bcb[i] = mock_rne(bc[i]);
        ScanParams q = p;
        q.u = ub.data();
        q.delta = db.data();
        q.z = c.gate ? zb.data() : nullptr;
        q.bc = bcb.data();
        q.out = ob.data();
        launch({(unsigned)blocks, (unsigned)B, 1}, 256, [&] { fox_scan_fwd_bf16(q); });
        std::vector<float> of(m);
        for (long i = 0; i < m; ++i) of[i] = __uint_as_float((u32)ob[i] << 16);
        cmp(c.name, "bf16 out", of, out, 3e-2);
    }
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
