// Block-wide sums shared by kernel units (compile.rs puts this file before the kernels that use
// it): the same order of additions wherever a result must match another kernel's bit for bit.

// The total of v over a block of NW warps, for every thread: each warp's sum by shuffles, then the
// warps' sums (through sh, NW values) in warp order.
template <int NW, typename V>
__device__ __forceinline__ V block_total(V v, V* sh) {
    for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    V t = 0;
    for (int w = 0; w < NW; ++w) t += sh[w];
    return t;
}
