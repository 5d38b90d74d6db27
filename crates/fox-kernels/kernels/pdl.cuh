// Programmatic dependent launch (sm_90) and flags between blocks, for every kernel unit that uses
// them (compile.rs puts this file first). A kernel launched with the attribute may start while
// the one before it finishes: pdl_wait_prev blocks until that one has completed and its writes
// are visible, and pdl_trigger_next lets the next kernel start once every block of this one has
// called it. Both are no-ops on older GPUs, for kernels launched without the attribute, and in
// the host emulation.

__device__ __forceinline__ void pdl_trigger_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
__device__ __forceinline__ void pdl_wait_prev() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A flag between the blocks of one grid (a grid barrier, a hand-off in order): a load that acquires
// and a store that releases, at GPU scope. Not in the host emulation, which runs none of their users.
#ifndef FOX_HOST_EMU
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
#endif
