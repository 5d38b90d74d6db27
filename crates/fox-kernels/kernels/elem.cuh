// bf16 and f32 element access shared by the model's small kernels (model.cu, decode.cu): bf16
// travels as raw 16-bit words, widened exactly and rounded to nearest even (NaN stays NaN).

typedef unsigned short u16;

__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ld(const u16* p, long long i) { return __uint_as_float(((unsigned)p[i]) << 16); }
__device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(u16* p, long long i, float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        p[i] = (u16)((u >> 16) | 0x40);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = (u16)(u >> 16);
}

// v rounded to the element type and widened again (identity for f32).
template <typename T>
__device__ __forceinline__ float round_to(float v) {
    T t;
    st(&t, 0, v);
    return ld(&t, 0);
}

// Lets the next kernel in the stream, when launched with programmatic dependent launch, start
// while this one runs (it still waits for this one's completion before reading; see ops.cu).
__device__ __forceinline__ void pdl_trigger_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
// In a kernel launched with programmatic dependent launch: waits until the kernel before it has
// completed and its writes are visible (ops.cu's pdl_wait). A no-op otherwise.
__device__ __forceinline__ void pdl_wait_prev() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
