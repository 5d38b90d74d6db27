// What the host-emulation tests share: their seeded normal inputs, the failure count and the
// relative L2 error they judge by. A test defines EMU_SEED, its generator's seed, before the
// include (the inputs, and so the printed errors, follow from it).
#pragma once
#include <cmath>
#include <random>
#include <vector>

static std::mt19937 rng(EMU_SEED);
static std::vector<float> randn(size_t n, float s = 1.f) {
    std::normal_distribution<float> d(0.f, s);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}
static int fails = 0;

// ‖got − want‖ / ‖want‖ (‖got − want‖ where want is 0), a NaN counting as an infinite error. With
// `skip_equal_inf`, entries where want is ±∞ and got is the same infinity (masked scores) are left
// out. Callers check the sizes.
template <class W>
static double rel_l2(const std::vector<float>& got, const std::vector<W>& want, bool skip_equal_inf = false) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        if (skip_equal_inf && std::isinf((double)want[i]) && got[i] == want[i]) continue;
        double d = (double)got[i] - want[i];
        num += std::isnan(d) ? INFINITY : d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
