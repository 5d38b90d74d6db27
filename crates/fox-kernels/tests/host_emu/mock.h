// Host emulation of the CUDA subset that kernels/ops.cu, attention_f32.cu, selective_scan.cu, delta_rule.cu, gla.cu and decode.cu use, so the kernels' logic can be tested
// without a GPU: one std::thread per CUDA thread, the blocks of a grid one after the other
// (so `__shared__` can be a function-local static), a std::barrier per block for __syncthreads
// and per warp for the warp shuffles, ballots and __syncwarp. Threads that return early drop out
// of both barriers (a whole warp returns together in the kernels emulated here).
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>
using std::max;
using std::min;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define NEG_INF (-INFINITY)
struct dim3e { unsigned x = 0, y = 0, z = 0; };
thread_local dim3e threadIdx;
dim3e blockIdx, blockDim, gridDim;
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct uint2 { u32 x, y; };
struct uint4 { u32 x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float __uint_as_float(u32 u) { float f; memcpy(&f, &u, 4); return f; }
inline u32 __float_as_uint(float f) { u32 u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline float __expf(float x) { return expf(x); }
inline u16 mock_rne(float v) {
    u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
template <bool BF> inline u32 pack2(float lo, float hi) { return (u32)mock_rne(lo) | ((u32)mock_rne(hi) << 16); }
std::barrier<>* g_block_bar;
struct Warp { std::barrier<>* bar; double vals[32]; u32 ma[32][4], mb[32][2]; const u16* ptr[32]; };
std::vector<Warp> g_warps;
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
// A warp-wide exchange: every lane publishes v, then read(vals, lane) picks the lane's result
// from the warp's values; the barriers keep one exchange's values from the next's.
template <class R, class F> R warp_exchange(double v, F read) {
    int lane = threadIdx.x & 31;
    Warp& w = g_warps[threadIdx.x >> 5];
    w.vals[lane] = v;
    w.bar->arrive_and_wait();
    R r = read(w.vals, lane);
    w.bar->arrive_and_wait();
    return r;
}
template <class V> V __shfl_xor_sync(unsigned, V v, int off) {
    return warp_exchange<V>((double)v, [&](const double* vals, int lane) { return (V)vals[lane ^ off]; });
}
template <class V> V __shfl_sync(unsigned, V v, int src) {
    return warp_exchange<V>((double)v, [&](const double* vals, int) { return (V)vals[src & 31]; });
}
template <class V> V __shfl_up_sync(unsigned, V v, int delta) {
    return warp_exchange<V>((double)v,
                            [&](const double* vals, int lane) { return lane >= delta ? (V)vals[lane - delta] : v; });
}
inline unsigned __ballot_sync(unsigned, bool pred) {
    return warp_exchange<unsigned>(pred ? 1.0 : 0.0, [](const double* vals, int) {
        unsigned r = 0;
        for (int i = 0; i < 32; ++i)
            if (vals[i] != 0.0) r |= 1u << i;
        return r;
    });
}
inline void __syncwarp() { g_warps[threadIdx.x >> 5].bar->arrive_and_wait(); }
// Dynamic shared memory (`extern __shared__`): one buffer, the blocks run one after the other.
#define FOX_HOST_EMU 1
alignas(1024) static unsigned char dyn_smem[232 * 1024];
#ifndef MOCK_LATE_CP_ASYNC
// cp.async of 16 bytes (zeros when !valid), done at once; commits and waits have nothing to do.
// Landing at once shows a buffer overwritten while it is still read (the copy lands early).
inline void cp_async16(void* dst, const void* src, bool valid) {
    if (valid)
        memcpy(dst, src, 16);
    else
        memset(dst, 0, 16);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
#else
// With MOCK_LATE_CP_ASYNC the copies land as late as the GPU may let them: a thread's committed
// groups at its cp.async.wait_group N (all but the N newest), which shows a tile read before its
// wait (the copy lands late). The source is read at issue.
struct MockCopy {
    void* dst;
    unsigned char data[16];
};
thread_local std::vector<MockCopy> t_open;
thread_local std::vector<std::vector<MockCopy>> t_groups;
inline void cp_async16(void* dst, const void* src, bool valid) {
    MockCopy c;
    c.dst = dst;
    if (valid)
        memcpy(c.data, src, 16);
    else
        memset(c.data, 0, 16);
    t_open.push_back(c);
}
inline void cp_async_commit() {
    t_groups.push_back(std::move(t_open));
    t_open.clear();
}
template <int N>
inline void cp_async_wait() {
    while ((int)t_groups.size() > N) {
        for (auto& c : t_groups.front()) memcpy(c.dst, c.data, 16);
        t_groups.erase(t_groups.begin());
    }
}
#endif
// ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].shared.b16: lane l points at row l % 8 of piece l / 8;
// register i of lane l gets piece i's (row l / 4, columns 2 (l % 4), 2 (l % 4) + 1), transposed with
// .trans (rows 2 (l % 4), 2 (l % 4) + 1 of column l / 4).
template <int N, bool TR>
inline void mock_ldsm(u32* r, const u16* p) {
    const int lane = threadIdx.x & 31;
    Warp& w = g_warps[threadIdx.x >> 5];
    w.ptr[lane] = p;
    w.bar->arrive_and_wait();
    for (int i = 0; i < N; ++i) {
        const int row = lane / 4, col = 2 * (lane % 4);
        u16 lo, hi;
        if (TR) {
            lo = w.ptr[8 * i + col][row];
            hi = w.ptr[8 * i + col + 1][row];
        } else {
            lo = w.ptr[8 * i + row][col];
            hi = w.ptr[8 * i + row][col + 1];
        }
        r[i] = (u32)lo | ((u32)hi << 16);
    }
    w.bar->arrive_and_wait();
}
// stmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lane l points at row l % 8 of piece l / 8;
// register i of lane l holds piece i's (row l / 4, columns 2 (l % 4), 2 (l % 4) + 1), stored
// transposed (into rows 2 (l % 4), 2 (l % 4) + 1, column l / 4).
inline void stsm_x4_t(u16* p, const u32 (&r)[4]) {
    const int lane = threadIdx.x & 31;
    Warp& w = g_warps[threadIdx.x >> 5];
    w.ptr[lane] = p;
    for (int i = 0; i < 4; ++i) w.ma[lane][i] = r[i];
    w.bar->arrive_and_wait();
    if (lane == 0)
        for (int l = 0; l < 32; ++l)
            for (int i = 0; i < 4; ++i) {
                const int row = l / 4, col = 2 * (l % 4);
                u16* a = const_cast<u16*>(w.ptr[8 * i + col]);
                u16* b = const_cast<u16*>(w.ptr[8 * i + col + 1]);
                a[row] = (u16)(w.ma[l][i] & 0xffffu);
                b[row] = (u16)(w.ma[l][i] >> 16);
            }
    w.bar->arrive_and_wait();
}
inline void ldsm_x4(u32 (&r)[4], const u16* p) { mock_ldsm<4, false>(r, p); }
inline void ldsm_x4_t(u32 (&r)[4], const u16* p) { mock_ldsm<4, true>(r, p); }
inline void ldsm_x2(u32 (&r)[2], const u16* p) { mock_ldsm<2, false>(r, p); }
inline void ldsm_x2_t(u32 (&r)[2], const u16* p) { mock_ldsm<2, true>(r, p); }
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 on the warp's fragments (PTX ISA's layout:
// lane = 4·group + t; A's registers 0-3 hold (group, 2t..2t+1), (group + 8, ·), (group, 2t + 8..),
// (group + 8, 2t + 8..); B's (k = 2t..2t+1, n = group), (k = 2t + 8.., group); C's (group, 2t..2t+1),
// (group + 8, 2t..2t+1)), products summed in f32.
inline float mock_bf(u32 w, int hi) { return __uint_as_float(hi ? (w & 0xffff0000u) : (w << 16)); }
inline void mma_bf16_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    const int lane = threadIdx.x & 31;
    Warp& w = g_warps[threadIdx.x >> 5];
    for (int i = 0; i < 4; ++i) w.ma[lane][i] = a[i];
    w.mb[lane][0] = b0;
    w.mb[lane][1] = b1;
    w.bar->arrive_and_wait();
    auto A = [&](int r, int k) { return mock_bf(w.ma[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k & 1); };
    auto B = [&](int k, int n) { return mock_bf(w.mb[n * 4 + (k % 8) / 2][k >= 8], k & 1); };
    const int g = lane >> 2, t = lane & 3;
    for (int r = 0; r < 4; ++r) {
        const int row = g + (r >> 1) * 8, col = 2 * t + (r & 1);
        float s = 0.f;
        for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, col);
        c[r] += s;
    }
    w.bar->arrive_and_wait();
}
// wgmma.mma_async m64n64k16 (bf16, f32 sums) as delta_rule.cu uses it, done at issue: per warp, its
// 16 rows from its A fragment (mma.sync's layout) times B [16][64] from the dynamic shared memory by
// descriptor (start address >> 4 in bits 0-13, offsets from dyn_smem; 128-byte swizzle, 8-row
// groups 1024 bytes apart, 64 columns of one atom): B(k, n) at start + 128 n + 2 k when K-major
// (tb = 0), at start + 128 k + 2 n when N-major (tb = 1), its 16-byte piece XOR address bits 7-9.
inline void mock_wgmma_n64(float (&d)[32], const u32 (&a)[4], u64 desc, int tb, int acc) {
    const int lane = threadIdx.x & 31;
    Warp& w = g_warps[threadIdx.x >> 5];
    for (int i = 0; i < 4; ++i) w.ma[lane][i] = a[i];
    w.bar->arrive_and_wait();
    if (((desc >> 32) & 0x3fff) != 64 || (desc >> 62) != 1) abort();
    const u32 start = (u32)(desc & 0x3fff) << 4;
    auto A = [&](int r, int k) { return mock_bf(w.ma[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k & 1); };
    auto B = [&](int k, int n) {
        u32 at = start + (tb ? 128 * k + 2 * n : 128 * n + 2 * k);
        at ^= ((at >> 7) & 7) << 4;
        u16 v;
        memcpy(&v, dyn_smem + at, 2);
        return __uint_as_float((u32)v << 16);
    };
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 32; ++i) {
        const int row = g + ((i >> 1) & 1) * 8, col = 8 * (i >> 2) + 2 * t + (i & 1);
        float s = 0.f;
        for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, col);
        d[i] = (acc ? d[i] : 0.f) + s;
    }
    w.bar->arrive_and_wait();
}
template <class F> void launch(dim3e grid, unsigned block, F f) {
    gridDim = grid;
    blockDim = {block, 1, 1};
    for (unsigned z = 0; z < std::max(grid.z, 1u); ++z)
        for (unsigned y = 0; y < std::max(grid.y, 1u); ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = {x, y, z};
                std::barrier<> bb(block);
                g_block_bar = &bb;
                std::vector<std::unique_ptr<std::barrier<>>> wb;
                g_warps.assign(block / 32, Warp{});
                for (unsigned w = 0; w < block / 32; ++w) {
                    wb.emplace_back(new std::barrier<>(32));
                    g_warps[w].bar = wb.back().get();
                }
                std::vector<std::thread> ts;
                for (unsigned t = 0; t < block; ++t)
                    ts.emplace_back([&, t] {
                        threadIdx = {t, 0, 0};
                        f();
                        g_warps[t / 32].bar->arrive_and_drop();
                        bb.arrive_and_drop();
                    });
                for (auto& th : ts) th.join();
            }
}
