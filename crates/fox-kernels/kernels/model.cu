// Small kernels the model's CUDA backend needs beside kernels/ops.cu: in-place sigmoid and its
// backward (KV-shift's mixing weights), and ACP thresholds from QK-norm weights on the device
// (the weights change every step, so the bound is formed where they live, without a copy back).
// Compiled alone by NVRTC: no headers.

typedef unsigned short u16;

__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ld(const u16* p, long long i) { return __uint_as_float(((unsigned)p[i]) << 16); }
__device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(u16* p, long long i, float v) {
    // round to nearest even; NaN stays NaN
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        p[i] = (u16)((u >> 16) | 0x40);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = (u16)(u >> 16);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }

template <typename T>
__device__ void sigmoid_inplace(T* x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        st(x, i, sigmoidf_(ld(x, i)));
}

template <typename T>
__device__ void sigmoid_bwd_inplace(T* dy, const T* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float s = ld(y, i);
        st(dy, i, ld(dy, i) * s * (1.f - s));
    }
}

extern "C" __global__ void fox_sigmoid_inplace_f32(float* x, long long n) { sigmoid_inplace(x, n); }
extern "C" __global__ void fox_sigmoid_inplace_bf16(u16* x, long long n) { sigmoid_inplace(x, n); }
extern "C" __global__ void fox_sigmoid_bwd_inplace_f32(float* dy, const float* y, long long n) {
    sigmoid_bwd_inplace(dy, y, n);
}
extern "C" __global__ void fox_sigmoid_bwd_inplace_bf16(u16* dy, const u16* y, long long n) {
    sigmoid_bwd_inplace(dy, y, n);
}

// δ[b, h] = −(2U_h + ln N) + ln ε with U_h = sqrt(d)·max|γ_q,h|·max|γ_k,h| (SPEC §1), γ of size
// H·d (per head) or d (shared: wlen == d). One warp per head; every batch row gets its head's δ.
extern "C" __global__ void fox_acp_from_qk_norm(const float* wq, const float* wk, int wlen, int heads, int d,
                                               int batch, float ln_n, float log_eps, float* out) {
    const int h = blockIdx.x;
    const int lane = threadIdx.x;
    const int off = (wlen == d) ? 0 : h * d;
    float mq = 0.f, mk = 0.f;
    for (int i = lane; i < d; i += 32) {
        mq = fmaxf(mq, fabsf(wq[off + i]));
        mk = fmaxf(mk, fabsf(wk[off + i]));
    }
    for (int s = 16; s > 0; s >>= 1) {
        mq = fmaxf(mq, __shfl_xor_sync(0xffffffffu, mq, s));
        mk = fmaxf(mk, __shfl_xor_sync(0xffffffffu, mk, s));
    }
    if (lane == 0) {
        const float u = sqrtf((float)d) * mq * mk;
        const float delta = -(2.f * u + ln_n) + log_eps;
        for (int b = 0; b < batch; ++b) out[b * heads + h] = delta;
    }
}
