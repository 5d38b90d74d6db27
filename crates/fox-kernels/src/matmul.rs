//! Matrix products through the `gemm` crate. Linear weights are stored [out, in] as in PyTorch.

use crate::par::SharedMut;
use gemm::Parallelism;
use rayon::prelude::*;

/// Products below this many multiply-adds run on one thread: threading a tiny product costs more
/// than it saves (decoding runs many of them).
const SERIAL: usize = 1 << 18;
/// Up to this size a product is split here, into row (or column) blocks of dst, one
/// single-threaded GEMM each: on the narrow shapes of small models (d = 64) the crate's own
/// threading ran at one core's speed. Larger products use the crate's threading.
const SPLIT: usize = 1 << 28;

/// How to cut `len` rows (or columns) of dst into tasks: the rows per task, a multiple of 8 (the
/// micro-kernels' height), or None when one task would do. Each task packs the whole other
/// operand (`other` values), so tasks get at least 128 rows unless that operand is small. Each
/// element of dst is computed by exactly one GEMM over the whole of k either way, and the crate
/// blocks k by k alone, so the result does not depend on the split.
///
/// `width` is dst's other dimension: where it is at most 64 and k above 512, tasks get more than
/// 64 rows, as the crate blocks the k of products of at most 64 × 64 otherwise (at 512).
fn split(len: usize, width: usize, k: usize) -> Option<usize> {
    let other = width * k;
    let min_rows = if other <= 1 << 16 { 32 } else { 128 };
    let min_rows = if width <= 64 && k > 512 { min_rows.max(72) } else { min_rows };
    let tasks = (len / min_rows).min(4 * rayon::current_num_threads());
    (tasks >= 2).then(|| len.div_ceil(tasks).next_multiple_of(8))
}

/// Tiles of dst for `threads` > 2 threads: the tiles' first rows and first columns (each list
/// ending with m or n), at least `threads` tiles where the product allows, or None (one tile, or
/// a product above SPLIT whose B is not transposed: the crate's own threading). With B
/// transposed, columns first (each tile packs only its columns of B); otherwise rows first (each
/// tile packs its rows of A).
///
/// The result must not depend on the tiling: every tile is one GEMM over the whole of k, and the
/// crate blocks k by k alone, except for products of at most 64 × 64, whose k it cuts at 512.
/// So tiles are at least 128 columns wide (whole 64-column panels, the last one taking the
/// remainder), or, where n is narrower, at least 65 rows tall; `gemm_strided` checks the crate's
/// other special paths ([`same_path`]) before it uses a tiling.
fn grid(m: usize, n: usize, threads: usize, b_transposed: bool, size: usize) -> Option<(Vec<usize>, Vec<usize>)> {
    if size > SPLIT && !b_transposed {
        return None;
    }
    let wide = n >= 128;
    let max_ct = if wide { n / 128 } else { 1 };
    let max_rt = (m / if wide { 32 } else { 65 }).max(1);
    let (rt, ct) = if b_transposed {
        let ct = threads.min(max_ct);
        (threads.div_ceil(ct).min(max_rt), ct)
    } else {
        let rt = threads.min(max_rt);
        (rt, threads.div_ceil(rt).min(max_ct))
    };
    if rt * ct < 2 {
        return None;
    }
    let rows = (0..=rt).map(|i| i * m / rt).collect();
    let panels = n / 64;
    let cols = (0..=ct).map(|i| if i == ct { n } else { i * panels / ct * 64 }).collect();
    Some((rows, cols))
}

/// Whether every tile between the row starts `rows` and column starts `cols` takes the crate's
/// code path that the whole m × n product takes, and so sums k in the same order: it has
/// special paths for products of at most 256 elements (one accumulator per element), of one row
/// or one column (gemv), and of at most 64 × 64 (k cut at 512 instead of by k alone).
fn same_path(rows: &[usize], cols: &[usize], m: usize, n: usize, k: usize) -> bool {
    let class = |r: usize, c: usize| (r * c <= 256, r <= 1, c <= 1, k > 512 && r <= 64 && c <= 64);
    let whole = class(m, n);
    rows.windows(2).all(|r| cols.windows(2).all(|c| class(r[1] - r[0], c[1] - c[0]) == whole))
}

/// dst[m, n] (row stride dst_rs) = (accumulate ? dst : 0) + A[m, k] · B[k, n], with arbitrary
/// element strides for A and B (row stride, column stride).
#[allow(clippy::too_many_arguments)]
pub fn gemm_strided(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    accumulate: bool,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(dst.len() >= (m - 1) * dst_rs + n, "gemm: dst too small");
    assert!(m == 1 || dst_rs >= n, "gemm: dst's rows overlap (row stride {dst_rs} < {n} columns)");
    if k > 0 {
        assert!(a.len() > (m - 1) * a_rs + (k - 1) * a_cs, "gemm: A too small");
        assert!(b.len() > (k - 1) * b_rs + (n - 1) * b_cs, "gemm: B too small");
    }
    // The whole product in one call of the crate, on one thread or with its own threading.
    let whole = |dst: &mut [f32], par| {
        // SAFETY: bounds checked above.
        unsafe {
            gemm_ptr(m, n, k, dst.as_mut_ptr(), dst_rs, accumulate, a.as_ptr(), a_rs, a_cs, b.as_ptr(), b_rs, b_cs, par)
        }
    };
    let size = m * n * k;
    if size < SERIAL {
        whole(dst, Parallelism::None);
        return;
    }
    let d = SharedMut::new(dst);
    // Tiles between consecutive row and column starts (each list ending with m or n), a
    // single-threaded GEMM each over the whole of k; false (nothing done) where a tile would
    // take another of the crate's paths than the whole product ([`same_path`]).
    let by_tiles = |rows: Vec<usize>, cols: Vec<usize>| {
        if !same_path(&rows, &cols, m, n, k) {
            return false;
        }
        let tiles: Vec<(usize, usize, usize, usize)> =
            rows.windows(2).flat_map(|r| cols.windows(2).map(move |c| (r[0], r[1], c[0], c[1]))).collect();
        // SAFETY: bounds checked above; each task writes its own tile of dst.
        tiles.into_par_iter().for_each(|(r0, r1, c0, c1)| unsafe {
            let (a, b) = (a.as_ptr().add(r0 * a_rs), b.as_ptr().add(c0 * b_cs));
            let dst = d.ptr().add(r0 * dst_rs + c0);
            gemm_seq(r1 - r0, c1 - c0, k, dst, dst_rs, accumulate, a, a_rs, a_cs, b, b_rs, b_cs)
        });
        true
    };
    // Blocks of `block` from 0 (the last one shorter), as starts ending with `len`.
    let steps = |len: usize, block: usize| (0..len).step_by(block).chain([len]).collect::<Vec<_>>();
    let threads = rayon::current_num_threads();
    // More than two threads: tiles in two dimensions, as the splits below would leave threads
    // idle on the products of a short batch (256 rows: two row tasks).
    if threads > 2 {
        if let Some((rows, cols)) = grid(m, n, threads, b_rs == 1, size) {
            if by_tiles(rows, cols) {
                return;
            }
        }
    }
    // B stored transposed (b_rs = 1, a Linear's wᵀ): the crate packs B (its rows are not the
    // layout the micro-kernel reads), and with tasks of rows each would pack all of B. So columns
    // of dst, one task per thread, each packing only its own part of B, whatever the size (in
    // whole 64-column panels, the micro-kernel's height over B's columns); measured faster at
    // 125M (docs/kernel-notes.md).
    if b_rs == 1
        && threads >= 2
        && n >= 128 * threads
        && by_tiles(vec![0, m], steps(n, n.div_ceil(threads).next_multiple_of(64)))
    {
        return;
    }
    if size <= SPLIT {
        if let Some(rows) = split(m, n, k) {
            if by_tiles(steps(m, rows), vec![0, n]) {
                return;
            }
        }
        if let Some(cols) = split(n, m, k) {
            if by_tiles(vec![0, m], steps(n, cols)) {
                return;
            }
        }
    }
    whole(dst, Parallelism::Rayon(0));
}

/// `gemm_strided` on raw pointers, single-threaded: for callers that already split the work
/// between threads and write disjoint parts of one buffer.
///
/// # Safety
/// dst must be valid for writes at (i·dst_rs + j) for i < m, j < n, A for reads at
/// (i·a_rs + p·a_cs), B at (p·b_rs + j·b_cs) for p < k; no other thread may touch those
/// elements of dst meanwhile.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_seq(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    b_rs: usize,
    b_cs: usize,
) {
    gemm_ptr(m, n, k, dst, dst_rs, accumulate, a, a_rs, a_cs, b, b_rs, b_cs, Parallelism::None)
}

#[allow(clippy::too_many_arguments)]
unsafe fn gemm_ptr(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    b_rs: usize,
    b_cs: usize,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                std::slice::from_raw_parts_mut(dst.add(r * dst_rs), n).fill(0.0);
            }
        }
        return;
    }
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        accumulate,
        a,
        a_cs as isize,
        a_rs as isize,
        b,
        b_cs as isize,
        b_rs as isize,
        1.0,
        1.0,
        false,
        false,
        false,
        par,
    );
}

/// The `gemm` crate's own rate on n×n×n f32 products, all rayon threads: the reference that CPU
/// training throughput is compared with. The operands stay allocated, so that the rate can be
/// sampled again and again between training steps (on a shared machine the rate moves by a third
/// within seconds; a share of it means something only against a sample taken beside the step).
pub struct GemmReference {
    n: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl GemmReference {
    /// Operands for n×n×n products, and one untimed warm-up product.
    pub fn new(n: usize) -> Self {
        let a: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 97) as f32 / 97.0).collect();
        let b: Vec<f32> = (0..n * n).map(|i| ((i * 104729) % 89) as f32 / 89.0).collect();
        let mut r = GemmReference { n, a, b, c: vec![0.0f32; n * n] };
        r.product();
        r
    }

    /// The side of the products.
    pub fn n(&self) -> usize {
        self.n
    }

    fn product(&mut self) {
        let n = self.n;
        gemm_strided(n, n, n, &mut self.c, n, false, &self.a, n, 1, &self.b, n, 1);
    }

    /// GFLOP/s of the fastest of `reps` products.
    pub fn gflops(&mut self, reps: usize) -> f64 {
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let t0 = std::time::Instant::now();
            self.product();
            best = best.min(t0.elapsed().as_secs_f64());
        }
        2.0 * (self.n * self.n * self.n) as f64 / best / 1e9
    }
}

/// The products the CPU benchmarks sample the peak on: 512³ and 1024³, all rayon threads.
pub fn peak_references() -> Vec<GemmReference> {
    vec![GemmReference::new(512), GemmReference::new(1024)]
}

/// The gemm crate's peak now: the best of three 512³ and two 1024³ products (`refs` from
/// [`peak_references`]; other sizes get two repetitions).
pub fn peak_now(refs: &mut [GemmReference]) -> f64 {
    refs.iter_mut().map(|r| r.gflops(if r.n() <= 512 { 3 } else { 2 })).fold(0.0, f64::max)
}

/// The `gemm` crate's own rate on an n×n×n f32 product (GFLOP/s, best of `reps` after one
/// warm-up, all rayon threads).
pub fn gemm_gflops(n: usize, reps: usize) -> f64 {
    GemmReference::new(n).gflops(reps)
}

/// y[m, n] = x[m, k] · wᵀ, w: [n, k] (a Linear layer without bias). Where the CPU has AVX-512
/// and there are at least [`TILE_ROWS`] rows: on `small_gemm`'s tiles ([`linear_fwd_tiles`]).
/// Otherwise through the crate: with wᵀ as B (`b_rs` = 1), `gemm_strided` splits by columns of
/// y; each element is still one GEMM over the whole of k (the crate blocks k by k alone). Either
/// way the split does not change the result.
pub fn linear_fwd(y: &mut [f32], x: &[f32], w: &[f32], m: usize, k: usize, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if m >= TILE_ROWS && k > 0 && crate::simd::has_avx512() {
        return linear_fwd_tiles(y, x, w, m, k, n);
    }
    gemm_strided(m, n, k, y, n, false, x, k, 1, w, 1, k);
}

/// The fewest rows for which the forward packs w for the tiles: with fewer, packing w costs more
/// than the crate's product (decoding runs a few rows at a time).
pub const TILE_ROWS: usize = 48;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// A task's columns of wᵀ, packed for the tiles (per worker thread, kept between calls).
    static PACKED_W: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`linear_fwd`] on `small_gemm`'s tiles: tasks of rows × 64-column panels of y (one per
/// thread where the shape allows); each packs its panels of wᵀ, then every row tile reads them
/// there, x's values broadcast as they are. The crate packed w with a transpose too, but more
/// slowly, and packed x as well (fox-pro-125m's forward products, 256 rows, 2 threads: 130-180
/// GFLOP/s through the crate, 184-191 here; 198-216 with w packed beforehand). Each element is
/// one FMA chain over k in order, so the tasks do not change the result.
#[cfg(target_arch = "x86_64")]
pub fn linear_fwd_tiles(y: &mut [f32], x: &[f32], w: &[f32], m: usize, k: usize, n: usize) {
    use crate::small_gemm::{self as sg, Limit, B};
    assert!(y.len() >= m * n && x.len() >= m * k && w.len() >= n * k, "linear_fwd: buffers too small");
    assert!(crate::simd::has_avx512(), "linear_fwd_tiles needs AVX-512");
    let panels = n.div_ceil(sg::PANEL);
    let threads = if m * n * k < SERIAL { 1 } else { rayon::current_num_threads() };
    let ct = threads.min(panels).max(1);
    let rt = threads.div_ceil(ct).min(m / TILE_ROWS).max(1);
    let tasks: Vec<(usize, usize)> = (0..rt).flat_map(|r| (0..ct).map(move |c| (r, c))).collect();
    let yp = SharedMut::new(y);
    tasks.into_par_iter().for_each(|(r, c)| {
        let (r0, r1) = (r * m / rt, (r + 1) * m / rt);
        let (c0, c1) = (c * panels / ct * sg::PANEL, ((c + 1) * panels / ct * sg::PANEL).min(n));
        crate::par::with_buffer(&PACKED_W, sg::packed_len(c1 - c0, k), |buf| {
            // SAFETY: w's rows c0..c1 hold k values each and buf holds them packed; y's rows
            // r0..r1, columns c0..c1 are this task's alone; x's rows r0..r1 hold k values.
            unsafe {
                sg::pack_transposed(buf.as_mut_ptr(), w.as_ptr().add(c0 * k), k, c1 - c0, k);
                let (yt, xt) = (yp.ptr().add(r0 * n + c0), x.as_ptr().add(r0 * k));
                sg::gemm(
                    r1 - r0,
                    c1 - c0,
                    k,
                    yt,
                    n,
                    false,
                    xt,
                    k,
                    1,
                    B::packed(buf.as_ptr(), k),
                    Limit::Depth,
                    |_, _| (0, k),
                );
            }
        });
    });
}

/// Backward of `linear_fwd`: dx[m, k] (+)= dy · w, dw[n, k] (+)= dyᵀ · x (added to where
/// `accumulate_dx` / `accumulate_dw`, else overwritten).
#[allow(clippy::too_many_arguments)]
pub fn linear_bwd(
    dx: Option<&mut [f32]>,
    accumulate_dx: bool,
    dw: &mut [f32],
    accumulate_dw: bool,
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
) {
    if let Some(dx) = dx {
        gemm_strided(m, k, n, dx, k, accumulate_dx, dy, n, 1, w, k, 1);
    }
    // dw[n, k] = dyᵀ[n, m] · x[m, k]
    gemm_strided(n, k, m, dw, k, accumulate_dw, dy, 1, n, x, k, 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Split into row or column tasks, the result has the same bits as one single-threaded GEMM
    /// (what makes results independent of the thread count), accumulating or not.
    #[test]
    fn split_products_equal_one_gemm_bitwise() {
        for (m, n, k) in
            [(1024usize, 64usize, 64usize), (40, 700, 96), (333, 130, 1029), (8, 5000, 64), (333, 60, 1029)]
        {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729) % 1013) as f32 / 1013.0 - 0.5).collect();
            for acc in [false, true] {
                let mut want = vec![0.25f32; m * n];
                // SAFETY: want is [m, n], a is [m, k], b is [k, n].
                unsafe { gemm_seq(m, n, k, want.as_mut_ptr(), n, acc, a.as_ptr(), k, 1, b.as_ptr(), n, 1) };
                let mut got = vec![0.25f32; m * n];
                gemm_strided(m, n, k, &mut got, n, acc, &a, k, 1, &b, n, 1);
                assert!(got == want, "{m}x{n}x{k} accumulate={acc}");
                // Two-dimensional tiles (more than two threads), B as stored and transposed.
                let bt: Vec<f32> = (0..k * n).map(|i| b[(i % k) * n + i / k]).collect();
                for threads in [3, 6, 16] {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    let mut got = vec![0.25f32; m * n];
                    pool.install(|| gemm_strided(m, n, k, &mut got, n, acc, &a, k, 1, &b, n, 1));
                    assert!(got == want, "{m}x{n}x{k} accumulate={acc}, {threads} threads");
                    let mut got = vec![0.25f32; m * n];
                    pool.install(|| gemm_strided(m, n, k, &mut got, n, acc, &a, k, 1, &bt, 1, k));
                    assert!(got == want, "{m}x{n}x{k} accumulate={acc}, {threads} threads, B transposed");
                }
            }
        }
    }

    /// The tiles of a short batch's products on 16 threads: at least 16 of them (the 1-D splits
    /// gave 2 row tasks for 256 rows), columns first when B is transposed, never a tile of at
    /// most 64 × 64 (whose k the crate blocks otherwise).
    #[test]
    fn grids_fill_the_threads() {
        let tiles = |g: Option<(Vec<usize>, Vec<usize>)>| g.map(|(r, c)| (r.len() - 1, c.len() - 1, r, c));
        let (rt, ct, rows, cols) = tiles(grid(256, 768, 16, true, 256 * 768 * 768)).unwrap();
        assert_eq!((rt, ct, rows, cols), (3, 6, vec![0, 85, 170, 256], vec![0, 128, 256, 384, 512, 640, 768]));
        let (rt, ct, rows, cols) = tiles(grid(256, 768, 16, false, 256 * 768 * 768)).unwrap();
        assert_eq!((rt, ct, rows[1], cols), (8, 2, 32, vec![0, 384, 768]));
        assert_eq!(tiles(grid(768, 768, 16, false, 768 * 768 * 256)).unwrap().0, 16);
        // The remainder stays in the last panel: 330 columns are 128 + 202.
        assert_eq!(tiles(grid(333, 330, 6, true, 333 * 330 * 1029)).unwrap().3, vec![0, 128, 330]);
        // Narrow: rows of at least 65.
        assert_eq!(tiles(grid(333, 64, 16, false, 333 * 64 * 1029)).unwrap().2, vec![0, 66, 133, 199, 266, 333]);
        // A large product with B as stored goes to the crate's threading; one tile is no split.
        assert_eq!(grid(4096, 4096, 16, false, 4096 * 4096 * 4096), None);
        assert_eq!(grid(16, 60, 16, true, 16 * 60 * 768), None);
    }

    /// Tilings that would put a tile on another of the crate's paths than the whole product are
    /// refused: a 33 × 64 tile of a 333 × 130 product with k = 1029 (k cut at 512; bits that
    /// differ, seen before this check), 1 × 128 tiles of one row of 768 (at most 256 elements
    /// against a gemv), 2048 × 1 tiles of two columns.
    #[test]
    fn tilings_keep_the_crates_path() {
        assert!(!same_path(&[0, 33, 66, 333], &[0, 64, 130], 333, 130, 1029));
        assert!(same_path(&[0, 111, 222, 333], &[0, 130], 333, 130, 1029));
        assert!(same_path(&[0, 33, 66, 333], &[0, 64, 130], 333, 130, 512));
        let cols: Vec<usize> = (0..=6).map(|i| i * 128).collect();
        assert!(!same_path(&[0, 1], &cols, 1, 768, 768));
        assert!(same_path(&[0, 1], &[0, 384, 768], 1, 768, 768));
        assert!(!same_path(&[0, 2048], &[0, 1, 2], 2048, 2, 768));
        assert!(same_path(&[0, 1024, 2048], &[0, 2], 2048, 2, 768));
    }

    /// linear_fwd gives the same bits on any number of threads (its tiles or the crate's column
    /// split), and the crate's product to rounding; accumulating, the crate's column split gives
    /// the bits of one single-threaded GEMM (the GPU check's reference accumulates).
    #[test]
    fn linear_fwd_is_independent_of_the_threads() {
        for (m, k, n) in
            [(256usize, 768usize, 768usize), (64, 300, 1000), (9, 128, 4096), (256, 64, 64), (50, 2048, 130)]
        {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 104729) % 1013) as f32 / 1013.0 - 0.5).collect();
            let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
            let mut want = vec![f32::NAN; m * n];
            one.install(|| linear_fwd(&mut want, &x, &w, m, k, n));
            for threads in [2, 3, 16] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut got = vec![f32::NAN; m * n];
                pool.install(|| linear_fwd(&mut got, &x, &w, m, k, n));
                assert!(got == want, "{m}x{k}->{n}, {threads} threads");
            }
            let mut crate_y = vec![0.0f32; m * n];
            // SAFETY: crate_y is [m, n], x is [m, k], w is [n, k] (read as its transpose).
            unsafe { gemm_seq(m, n, k, crate_y.as_mut_ptr(), n, false, x.as_ptr(), k, 1, w.as_ptr(), 1, k) };
            let diff = want.iter().zip(&crate_y).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(diff < 1e-4, "{m}x{k}->{n}: {diff}");
            let mut acc_want = crate_y.clone();
            // SAFETY: as above.
            unsafe { gemm_seq(m, n, k, acc_want.as_mut_ptr(), n, true, x.as_ptr(), k, 1, w.as_ptr(), 1, k) };
            let mut acc_got = crate_y.clone();
            gemm_strided(m, n, k, &mut acc_got, n, true, &x, k, 1, &w, 1, k);
            assert!(acc_got == acc_want, "{m}x{k}->{n}, accumulating");
        }
    }

    fn naive(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
            }
        }
        y
    }

    #[test]
    fn linear_matches_naive_and_backward_matches_transposes() {
        let (m, k, n) = (37, 29, 53);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5).collect();
        let mut y = vec![0.0; m * n];
        linear_fwd(&mut y, &x, &w, m, k, n);
        let r = naive(&x, &w, m, k, n);
        for (a, b) in y.iter().zip(&r) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        let dy: Vec<f32> = (0..m * n).map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5).collect();
        let mut dx = vec![0.0; m * k];
        let mut dw = vec![0.0; n * k];
        linear_bwd(Some(&mut dx), false, &mut dw, true, &dy, &x, &w, m, k, n);
        for i in 0..m {
            for p in 0..k {
                let e: f32 = (0..n).map(|j| dy[i * n + j] * w[j * k + p]).sum();
                assert!((dx[i * k + p] - e).abs() < 1e-4);
            }
        }
        for j in 0..n {
            for p in 0..k {
                let e: f32 = (0..m).map(|i| dy[i * n + j] * x[i * k + p]).sum();
                assert!((dw[j * k + p] - e).abs() < 1e-4);
            }
        }
    }
}
