// kernels/decode.cu's scoring kernel (fox_token_logprobs) on the host under mock.h, against a
// double-precision log-softmax and a sort: the target's log-probability and the top k in the
// host's order (larger logit first, then smaller id), with ties, a −∞ logit and targets outside
// the vocabulary. The online log-sum-exp sums in another order than the loop: tolerance 1e-5.
#include "mock.h"
#include "../../kernels/pdl.cuh"
#include "../../kernels/elem.cuh"
#include "../../kernels/activations.cuh"
#include "../../kernels/reduce.cuh"
#include "../../kernels/decode.cu"

static int fails = 0;
static void expect(bool ok, const char* what, double err) {
    if (!ok) fails++;
    printf("%s %-56s %.3e\n", ok ? "ok  " : "FAIL", what, err);
}

int main() {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 3.f);
    const int V = 1000, ld = 1024;
    for (int k : {0, 1, 3}) {
        const int rows = 5;
        std::vector<float> x((size_t)rows * ld, NAN);  // the padding past V is never read
        for (int r = 0; r < rows; ++r)
            for (int i = 0; i < V; ++i) x[(size_t)r * ld + i] = nd(rng);
        // Row 1: the largest logit three times (ties: the smallest id first) and a −∞ logit.
        for (int i : {700, 40, 999}) x[ld + i] = 20.f;
        x[ld + 3] = -INFINITY;
        // Row 2: every logit equal. Row 3: the max at id 0 and V − 1.
        for (int i = 0; i < V; ++i) x[2 * ld + i] = 0.5f;
        x[3 * ld] = 9.f;
        x[3 * ld + V - 1] = 9.f;
        std::vector<int> tg = {5, 999, 0, -1, V};
        std::vector<float> lp(rows);
        std::vector<int> ti(std::max(rows * k, 1), -7);
        std::vector<float> tl(std::max(rows * k, 1));
        launch({(unsigned)rows, 1, 1}, 256,
               [&] { fox_token_logprobs(x.data(), ld, V, tg.data(), k, lp.data(), ti.data(), tl.data()); });
        double lp_err = 0, top_err = 0;
        bool ids_ok = true, nan_ok = true;
        for (int r = 0; r < rows; ++r) {
            const float* xr = &x[(size_t)r * ld];
            double m = -INFINITY, s = 0;
            for (int i = 0; i < V; ++i) m = std::max(m, (double)xr[i]);
            for (int i = 0; i < V; ++i) s += exp((double)xr[i] - m);
            const double lse = m + log(s);
            if (tg[r] >= 0 && tg[r] < V)
                lp_err = std::max(lp_err, fabs(lp[r] - ((double)xr[tg[r]] - lse)));
            else
                nan_ok = nan_ok && std::isnan(lp[r]);
            std::vector<int> ord(V);
            for (int i = 0; i < V; ++i) ord[i] = i;
            std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return xr[a] > xr[b]; });
            for (int j = 0; j < k; ++j) {
                ids_ok = ids_ok && ti[(size_t)r * k + j] == ord[j];
                top_err = std::max(top_err, fabs(tl[(size_t)r * k + j] - ((double)xr[ord[j]] - lse)));
            }
        }
        char what[96];
        snprintf(what, sizeof what, "k=%d: target log-probabilities", k);
        expect(lp_err <= 1e-5, what, lp_err);
        snprintf(what, sizeof what, "k=%d: targets outside the vocabulary give NaN", k);
        expect(nan_ok, what, 0);
        snprintf(what, sizeof what, "k=%d: top ids in the host's order (ties: smaller id)", k);
        expect(ids_ok, what, 0);
        snprintf(what, sizeof what, "k=%d: top log-probabilities", k);
        expect(top_err <= 1e-5, what, top_err);
    }
    printf("%d failures\n", fails);
    return fails != 0;
}
