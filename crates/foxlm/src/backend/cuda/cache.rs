//! One layer's inference state on the device: the attention layers' decode cache ([`GpuCache`])
//! and the state of each family ([`GpuLayerState`]).

use crate::model::cache::LayerState;
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::Elem;

/// One layer's decode cache on the device (kernels/decode.cu): keys and values [B, H_kv, cap, D]
/// in the activation dtype, the running gate sums c [B, H, cap] in f32 (per query head, as the
/// gate; so a step adds one log f and never recomputes a prefix sum), and each row's last unmixed
/// k̃, ṽ [B, H_kv·D] for KV-shift. A sliding window keeps every position: the attention kernels
/// mask the keys outside it.
pub struct GpuCache<T> {
    pub k: CudaSlice<T>,
    pub v: CudaSlice<T>,
    pub c: CudaSlice<f32>,
    pub k_shift: CudaSlice<T>,
    pub v_shift: CudaSlice<T>,
    /// Positions filled (the same for every row: rows are left-padded to a common length).
    pub len: usize,
    pub cap: usize,
    pub batch: usize,
    /// Query heads H (of c) and k/v heads H_kv (of k, v and the KV-shift states).
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The current step's k, v and c are in the cache already (a fused decode step wrote them),
    /// so its attention only reads.
    pub staged: bool,
}

/// Element counts of one layer's cache buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLens {
    /// k and v, each.
    pub kv: usize,
    pub c: usize,
    /// k_shift and v_shift, each.
    pub shift: usize,
}

/// One layer's inference state on the GPU.
pub type GpuLayerState<T> = LayerState<GpuCache<T>, CudaSlice<f32>>;

crate::model::cache::held_in_fields!([T] GpuCache<T>);

impl<T> GpuLayerState<T> {
    /// The host-side length again after CUDA graph replays (which advanced only the device's),
    /// with nothing staged.
    pub fn reset_len(&mut self, len: usize) {
        if let LayerState::Attention(c) = self {
            c.staged = false;
        }
        self.held_mut().set_tokens(len);
    }
}

impl<T: Elem> GpuCache<T> {
    /// What [`Cuda::new_caches`](super::Cuda::new_caches) allocates per layer for `batch` rows of `cap` positions.
    pub fn lens(batch: usize, heads: usize, kv_heads: usize, head_dim: usize, cap: usize) -> CacheLens {
        CacheLens { kv: batch * kv_heads * cap * head_dim, c: batch * heads * cap, shift: batch * kv_heads * head_dim }
    }

    /// Device bytes of one layer's cache.
    pub fn bytes(batch: usize, heads: usize, kv_heads: usize, head_dim: usize, cap: usize) -> usize {
        let l = Self::lens(batch, heads, kv_heads, head_dim, cap);
        (2 * l.kv + 2 * l.shift) * std::mem::size_of::<T>() + l.c * std::mem::size_of::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::GpuCache;
    use crate::model::attention::kv_cache::KvCache;

    /// The GPU cache holds what the CPU's holds (k, v and the KV-shift states per k/v head, c per
    /// query head), in the activation dtype for k, v and the shift states.
    #[test]
    fn gpu_cache_sizes_follow_the_kv_heads() {
        for (b, h, hkv, d, cap) in [(1, 4, 4, 16, 9), (2, 4, 2, 64, 300), (3, 8, 1, 128, 17), (2, 6, 3, 24, 1)] {
            let l = GpuCache::<f32>::lens(b, h, hkv, d, cap);
            assert_eq!((l.kv, l.c, l.shift), (b * hkv * cap * d, b * h * cap, b * hkv * d));
            assert_eq!(GpuCache::<f32>::bytes(b, h, hkv, d, cap), KvCache::bytes_for(b, h, hkv, d, cap));
            let bf16 = GpuCache::<half::bf16>::bytes(b, h, hkv, d, cap);
            assert_eq!(bf16, 2 * (2 * l.kv + 2 * l.shift) + 4 * l.c);
        }
        // The memory checks of the commands count the same bytes (f32).
        let mut cfg = crate::presets::Variant::FoxPro.config(256, 3, 8);
        cfg.num_kv_heads = Some(2);
        let per_layer = GpuCache::<f32>::bytes(2, 8, 2, 32, 50) as u128;
        assert_eq!(3 * per_layer, crate::validate::kv_cache_bytes(&cfg, 2, 50));
        // Grouped-query attention shrinks k and v by the group, not c.
        let (mha, gqa) =
            (GpuCache::<half::bf16>::lens(2, 8, 8, 64, 100), GpuCache::<half::bf16>::lens(2, 8, 2, 64, 100));
        assert_eq!((mha.kv / gqa.kv, mha.shift / gqa.shift, mha.c), (4, 4, gqa.c));
    }
}
