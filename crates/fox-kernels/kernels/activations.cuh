// Activations written once for every kernel unit (compile.rs puts this file after common.cuh or
// elem.cuh): the model's gates and Mamba-2's and Gated DeltaNet's softplus, each as the CPU
// reference (fox_kernels::scalar) computes it, so that fused and chunked paths agree.

// The KV-shift gate's sigmoid (fast exponential).
__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }
// The output gate's and SwiGLU's sigmoid, without overflow on either side.
__device__ __forceinline__ float sigmoid_gate(float x) {
    if (x >= 0.f) return 1.f / (1.f + expf(-x));
    const float e = expf(x);
    return e / (1.f + e);
}
// The forget gate's log-sigmoid.
__device__ __forceinline__ float log_sigmoidf_(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }
// PyTorch's softplus (linear above 20).
__device__ __forceinline__ float softplus_(float x) { return x > 20.0f ? x : fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }
