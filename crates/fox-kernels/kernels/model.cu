// Small kernels the model's CUDA backend needs beside kernels/ops.cu: in-place sigmoid and its
// backward (KV-shift's mixing weights), and ACP thresholds from QK-norm weights on the device
// (the weights change every step, so the bound is formed where they live, without a copy back).
// Compiled by NVRTC after elem.cuh (no other headers).

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

// δ[b, h] = −(2U_h + ln N) + ln ε with U_h = sqrt(d)·max|γ_q,h|·max|γ_k,kv(h)| (SPEC §1). γ_q has
// wq_len = H·d (per head) or d (shared), γ_k wk_len = Hkv·d (per k/v head: grouped-query attention
// reads kv(h) = h / (H / Hkv)) or d. One warp per query head; every batch row gets its head's δ.
extern "C" __global__ void fox_acp_from_qk_norm(const float* wq, const float* wk, int wq_len, int wk_len, int heads,
                                               int kv_heads, int d, int batch, float ln_n, float log_eps,
                                               float* out) {
    const int h = blockIdx.x;
    const int lane = threadIdx.x;
    const int qoff = (wq_len == d) ? 0 : h * d;
    const int koff = (wk_len == d) ? 0 : h / (heads / kv_heads) * d;
    float mq = 0.f, mk = 0.f;
    for (int i = lane; i < d; i += 32) {
        mq = fmaxf(mq, fabsf(wq[qoff + i]));
        mk = fmaxf(mk, fabsf(wk[koff + i]));
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

// Fused softmax cross-entropy over rows of `vocab` logits stored `ld` apart (the output head pads
// its rows to a multiple of 64 so that cuBLASLt's fast kernels apply). One block of
// 512 threads per row: loss[r] = lse − x[target]; dlogits[r, c] = weight·(softmax − onehot) for
// c < vocab and 0 in the padding; rows with target < 0 get loss 0 and dlogits 0.
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* sh) {
    for (int s = 16; s > 0; s >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, s);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    const int nw = blockDim.x >> 5;
    v = (threadIdx.x < nw) ? sh[threadIdx.x] : (is_max ? __int_as_float(0xff800000) : 0.f);
    if (w == 0) {
        for (int s = 16; s > 0; s >>= 1) {
            const float o = __shfl_xor_sync(0xffffffffu, v, s);
            v = is_max ? fmaxf(v, o) : v + o;
        }
        if (l == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

// A row without a target (t < 0): zero gradient and zero loss; true when the row was one.
template <typename T>
__device__ __forceinline__ bool ce_ignored(T* dx, float* losses, long long r, int t, int ld) {
    if (t >= 0) return false;
    for (int c = threadIdx.x; c < ld; c += blockDim.x) st(dx, c, 0.f);
    if (threadIdx.x == 0) losses[r] = 0.f;
    return true;
}

// A row's loss and gradient from its logits x (global or shared memory) and their maximum m:
// lse = m + log Σ e^{x − m} over the vocabulary, dx = weight (softmax − one-hot) (0 in the
// padding columns up to ld), loss = lse − x[t].
template <typename T>
__device__ __forceinline__ void ce_finish(T* dx, float* losses, long long r, const float* x, int t, float m,
                                          float weight, int vocab, int ld, float* sh) {
    float s = 0.f;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) s += __expf(x[c] - m);
    s = block_reduce(s, false, sh);
    const float lse = m + logf(s);
    for (int c = threadIdx.x; c < ld; c += blockDim.x) {
        float g = 0.f;
        if (c < vocab) g = weight * (__expf(x[c] - lse) - (c == t ? 1.f : 0.f));
        st(dx, c, g);
    }
    if (threadIdx.x == 0) losses[r] = lse - x[t];
}

// A row's cross-entropy (one block per row, 512 threads; sh: 32 floats of shared memory): the
// row's maximum, then ce_finish. With SMEM the row is held in shared memory (ld floats of dynamic shared memory, ld a multiple
// of 4): the logits cross memory once, in 16-byte loads, where the plain kernel reads them three
// times (the max, the sum, the gradient). The sum and the gradient walk the row in the same order
// either way, so losses and dlogits are bitwise the same.
template <typename T, bool SMEM>
__device__ __forceinline__ void ce_row(T* dlogits, float* losses, const float* logits, const int* targets,
                                       float weight, int vocab, int ld, float* sh) {
    extern __shared__ float4 row4[];
    float* row = (float*)row4;
    const long long r = blockIdx.x;
    const float* x = logits + r * ld;
    T* dx = dlogits + r * ld;
    const int t = targets[r];
    if (ce_ignored(dx, losses, r, t, ld)) return;
    float m = __int_as_float(0xff800000);
    if constexpr (SMEM) {
        // Four 16-byte loads in flight per thread: one block per SM (the row fills shared memory).
        const float4* x4 = (const float4*)x;
        const int n4 = ld / 4, step = blockDim.x;
        for (int c0 = threadIdx.x; c0 < n4; c0 += 4 * step) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (c0 + u * step < n4) v[u] = x4[c0 + u * step];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int c4 = c0 + u * step, c = 4 * c4;
                if (c4 >= n4) break;
                row4[c4] = v[u];
                if (c < vocab) m = fmaxf(m, v[u].x);
                if (c + 1 < vocab) m = fmaxf(m, v[u].y);
                if (c + 2 < vocab) m = fmaxf(m, v[u].z);
                if (c + 3 < vocab) m = fmaxf(m, v[u].w);
            }
        }
    } else {
        for (int c = threadIdx.x; c < vocab; c += blockDim.x) m = fmaxf(m, x[c]);
    }
    ce_finish(dx, losses, r, SMEM ? row : x, t, block_reduce(m, true, sh), weight, vocab, ld, sh);
}

// The kernels' bodies. Each declares its own reduction buffer: a static shared array is named
// after its function, and the names are part of the generated code.
template <typename T>
__device__ void cross_entropy_ld(T* dlogits, float* losses, const float* logits, const int* targets, float weight,
                                 int vocab, int ld) {
    __shared__ float sh[32];
    ce_row<T, false>(dlogits, losses, logits, targets, weight, vocab, ld, sh);
}
template <typename T>
__device__ void cross_entropy_ld_smem(T* dlogits, float* losses, const float* logits, const int* targets, float weight,
                                      int vocab, int ld) {
    __shared__ float sh[32];
    ce_row<T, true>(dlogits, losses, logits, targets, weight, vocab, ld, sh);
}

extern "C" __global__ void __launch_bounds__(512) fox_cross_entropy_ld_f32(float* dl, float* loss, const float* x,
                                                                           const int* t, float w, int vocab, int ld) {
    cross_entropy_ld(dl, loss, x, t, w, vocab, ld);
}
extern "C" __global__ void __launch_bounds__(512) fox_cross_entropy_ld_bf16(u16* dl, float* loss, const float* x,
                                                                            const int* t, float w, int vocab, int ld) {
    cross_entropy_ld(dl, loss, x, t, w, vocab, ld);
}
extern "C" __global__ void __launch_bounds__(512) fox_cross_entropy_ld_smem_f32(float* dl, float* loss, const float* x,
                                                                                 const int* t, float w, int vocab,
                                                                                 int ld) {
    cross_entropy_ld_smem(dl, loss, x, t, w, vocab, ld);
}
extern "C" __global__ void __launch_bounds__(512) fox_cross_entropy_ld_smem_bf16(u16* dl, float* loss, const float* x,
                                                                                  const int* t, float w, int vocab,
                                                                                  int ld) {
    cross_entropy_ld_smem(dl, loss, x, t, w, vocab, ld);
}
