// Block-wide sums and arg-maxes shared by kernel units (compile.rs puts this file before the kernels that use
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

// Whether (v, i) ranks before (bv, bi) in the host's order of tokens: the larger value, on a tie
// the smaller index.
__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// The first of each thread's (v, i) in ranks_before's order over a block of NW warps, into every
// thread's (v, i): each warp's by shuffles, then the warps' (through shv, shi: NW values each) in
// warp order.
template <int NW>
__device__ __forceinline__ void block_argmax(float& v, int& i, float* shv, int* shi) {
    for (int s = 16; s > 0; s >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, s);
        const int oi = __shfl_xor_sync(0xffffffffu, i, s);
        if (ranks_before(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        shv[threadIdx.x >> 5] = v;
        shi[threadIdx.x >> 5] = i;
    }
    __syncthreads();
    v = shv[0];
    i = shi[0];
    for (int w = 1; w < NW; ++w)
        if (ranks_before(shv[w], shi[w], v, i)) {
            v = shv[w];
            i = shi[w];
        }
}
