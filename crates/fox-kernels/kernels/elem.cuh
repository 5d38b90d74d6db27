// bf16 and f32 element access shared by the model's small kernels (model.cu, decode.cu): bf16
// travels as raw 16-bit words, widened exactly and rounded to nearest even (NaN stays NaN). Also
// the bf16 tensor-core pieces and the asynchronous copies of the delta rule, GLA and the SSD on
// tensor cores, and the chunked recurrences' state passing (GLA, the SSD).

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

#ifndef FOX_HOST_EMU
// (The host emulation's mock.h has its own mma.sync, ldmatrix and cp.async.)
typedef unsigned int u32;
// c (16x8 f32) += a (16x16 bf16, row-major fragment) · b (16x8 bf16, column fragment).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// ldmatrix: four (two) 8x8 pieces of 16-bit elements, lane l giving the address of row l % 8 of
// piece l / 8; register i of lane l gets piece i's (row l / 4, columns 2 (l % 4) + {0, 1}), or with
// .trans its (rows 2 (l % 4) + {0, 1}, column l / 4).
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void ldsm_x2(u32 (&r)[2], const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void ldsm_x2_t(u32 (&r)[2], const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}
// 16 bytes from global to shared memory, asynchronously (zeros when !valid).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif

// Double buffering: with a next tile set, its copies are issued (into the other set) before this
// set's copies are awaited, so that they land while this set is used.
template <typename Issue>
__device__ __forceinline__ void cp_async_prefetch(bool has_next, Issue&& issue_next) {
    if (has_next) {
        issue_next();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

// The state passing of a chunked recurrence (GLA, the SSD) for one state element: x enters; for
// each of nch chunks in turn (from the first, or with REV from the last), slot c of p (slots
// `stride` apart) gets x and x = decay(c) · x + (what slot c held); returns the last x. The loads
// of AHEAD chunks go out together, then their updates: one memory latency per group, not per
// chunk (the compiler cannot hoist the loads over the stores to the same array itself).
template <bool REV, int AHEAD, typename Decay>
__device__ __forceinline__ float chunk_pass(float* p, long stride, float x, int nch, Decay decay) {
    for (int c0 = REV ? nch - 1 : 0; REV ? c0 >= 0 : c0 < nch; c0 += REV ? -AHEAD : AHEAD) {
        float ds[AHEAD], dc[AHEAD];
#pragma unroll
        for (int k = 0; k < AHEAD; ++k) {
            const int c = REV ? c0 - k : c0 + k;
            const bool in = REV ? c >= 0 : c < nch;
            ds[k] = in ? p[(long)c * stride] : 0.0f;
            dc[k] = in ? decay(c) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < AHEAD; ++k) {
            const int c = REV ? c0 - k : c0 + k;
            if (REV ? c >= 0 : c < nch) {
                p[(long)c * stride] = x;
                x = dc[k] * x + ds[k];
            }
        }
    }
    return x;
}
