// Programmatic dependent launch (sm_90), for every kernel unit that uses it (compile.rs puts this
// file first). A kernel launched with the attribute may start while the one before it finishes:
// pdl_wait_prev blocks until that one has completed and its writes are visible, and
// pdl_trigger_next lets the next kernel start once every block of this one has called it. Both
// are no-ops on older GPUs, for kernels launched without the attribute, and in the host emulation.

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
