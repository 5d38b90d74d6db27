//! Every operation of the Forgetting Transformer, forward and backward.
//!
//! The CPU path (f32, `gemm` + `rayon`) is the reference every other backend is tested against.
//! Tensors are plain row-major `f32` slices with their shapes passed explicitly, as in llm.c:
//! the model is a fixed, known set of operations and each one's buffers are visible at its call.

pub mod attention;
pub mod conv1d;
pub mod cross_entropy;
pub mod cuda;
pub mod delta_rule;
pub mod fgate;
pub mod gate;
pub mod gla;
pub mod head;
pub mod kv_shift;
mod linalg;
mod linear_attention;
pub mod matmul;
pub mod par;
pub mod rms_norm_gated;
pub mod rmsnorm;
pub mod rope;
pub mod scalar;
pub mod selective_scan;
pub mod simd;
pub mod small_gemm;
pub mod ssd;
pub mod swiglu;
#[cfg(test)]
mod testing;

/// The chunks [c0, c0 + len) of `chunk` positions that cover n, in order (the chunked forms of
/// the recurrences: SSD, GLA, the delta rule).
pub(crate) fn chunks(n: usize, chunk: usize) -> impl DoubleEndedIterator<Item = (usize, usize)> + ExactSizeIterator {
    (0..n.div_ceil(chunk)).map(move |c| (c * chunk, chunk.min(n - c * chunk)))
}

/// The elements a strided `rows` × `cols` matrix spans: the last row ends `cols` past its start
/// (none when the matrix is empty).
pub(crate) fn strided_span(rows: usize, stride: usize, cols: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * stride + cols
    }
}
