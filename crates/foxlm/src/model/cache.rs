//! A model's inference state: per layer, what its mixer family keeps between forwards (an
//! attention layer's KV cache with its gate sums and KV-shift states; a recurrent layer's scan
//! and convolution states, fixed in size), and the batch's left padding. The CPU's is [`Cache`];
//! a GPU backend keeps its own per-layer states in the same [`LayerState`] shape.

use super::attention::kv_cache::KvCache;
use super::attention::kv_cache_cuda::GpuCache;
use super::deltanet::cuda::GpuDeltaNetState;
use super::deltanet::state::DeltaNetState;
use super::hgrn2::cuda::GpuHgrn2State;
use super::hgrn2::state::Hgrn2State;
use super::mamba::cuda::GpuMambaState;
use super::mamba::state::MambaState;
use super::mamba2::cuda::GpuMamba2State;
use super::mamba2::state::Mamba2State;
use super::{Mixer, Model};
use crate::backend::cuda::decode::i32_of;
use crate::backend::cuda::Cuda;
use crate::backend::scan_state::ScanState;
use anyhow::Result;
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::Elem;

/// One layer's inference state, by family (K: the attention's KV cache; V: the backend's f32
/// buffer, which holds the recurrent families' states).
#[derive(Clone, Debug)]
pub enum LayerState<K, V = Vec<f32>> {
    Attention(K),
    Mamba2(Mamba2State<V>),
    Mamba(MambaState<V>),
    DeltaNet(DeltaNetState<V>),
    Hgrn2(Hgrn2State<V>),
}

/// One layer's CPU inference state.
pub type CpuLayerState = LayerState<KvCache>;

/// What a layer's state holds, whatever its family: batch rows and the tokens seen.
pub trait Held {
    fn rows(&self) -> usize;
    fn tokens(&self) -> usize;
    fn set_tokens(&mut self, len: usize);
}

/// [`Held`] for state types whose `batch` and `len` fields say it; `[T, ...]` for generic ones.
macro_rules! held_in_fields {
    ($([$($g:ident),*] $t:ty),* $(,)?) => {$(
        impl<$($g),*> $crate::model::cache::Held for $t {
            fn rows(&self) -> usize {
                self.batch
            }
            fn tokens(&self) -> usize {
                self.len
            }
            fn set_tokens(&mut self, len: usize) {
                self.len = len;
            }
        }
    )*};
}

pub(crate) use held_in_fields;

held_in_fields!([] KvCache, [S, V] ScanState<S, V>);

impl<K: Held, V> LayerState<K, V> {
    /// The state, whatever its family.
    pub fn held(&self) -> &dyn Held {
        match self {
            LayerState::Attention(c) => c,
            LayerState::Mamba2(s) => s,
            LayerState::Mamba(s) => s,
            LayerState::DeltaNet(s) => s,
            LayerState::Hgrn2(s) => s,
        }
    }

    pub fn held_mut(&mut self) -> &mut dyn Held {
        match self {
            LayerState::Attention(c) => c,
            LayerState::Mamba2(s) => s,
            LayerState::Mamba(s) => s,
            LayerState::DeltaNet(s) => s,
            LayerState::Hgrn2(s) => s,
        }
    }

    /// Tokens this layer has seen (host side).
    pub fn len(&self) -> usize {
        self.held().tokens()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batch rows held.
    pub fn batch(&self) -> usize {
        self.held().rows()
    }
}

impl CpuLayerState {
    /// The attention layer's KV cache.
    pub fn kv(&self) -> Option<&KvCache> {
        match self {
            LayerState::Attention(c) => Some(c),
            LayerState::Mamba2(_) | LayerState::Mamba(_) | LayerState::DeltaNet(_) | LayerState::Hgrn2(_) => None,
        }
    }
}

/// The CPU inference state of a whole model plus the batch's left padding.
#[derive(Clone, Debug)]
pub struct Cache {
    pub layers: Vec<CpuLayerState>,
    /// First real position of each batch row (left padding), if any row is padded.
    pub start: Option<Vec<usize>>,
}

impl Cache {
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// First real position of batch row `row`.
    pub fn row_start(&self, row: usize) -> usize {
        self.start.as_ref().map_or(0, |s| s[row])
    }

    /// A new cache whose rows are the given rows (cache, row index) of other caches of the same
    /// model, each keeping only its real positions and right-aligned to the longest one (shorter
    /// rows get left padding). Decoding then continues every row exactly as in its own cache; this
    /// is how a serving batch admits and drops sequences between steps. `extra` reserves room for
    /// that many more positions. Panics if `rows` is empty or the caches have different layers.
    pub fn gather_rows(rows: &[(&Cache, usize)], extra: usize) -> Cache {
        let len = rows.iter().map(|&(c, r)| c.len() - c.row_start(r)).max().unwrap_or(0);
        let n_layers = rows.first().map_or(0, |(c, _)| c.layers.len());
        // Layer `$li` of every row as the variant `$family`'s state, gathered by `$ty::gather`.
        macro_rules! gather {
            ($li:expr, $family:ident, $ty:ty) => {{
                let src: Vec<(&$ty, usize)> = rows
                    .iter()
                    .filter_map(|&(c, r)| match &c.layers[$li] {
                        LayerState::$family(s) => Some((s, r)),
                        _ => None,
                    })
                    .collect();
                LayerState::$family(<$ty>::gather(&src, len))
            }};
        }
        let layers = (0..n_layers)
            .map(|li| match &rows[0].0.layers[li] {
                LayerState::Attention(_) => {
                    let src: Vec<(&KvCache, usize, usize)> =
                        rows.iter().filter_map(|&(c, r)| c.layers[li].kv().map(|k| (k, r, c.row_start(r)))).collect();
                    LayerState::Attention(KvCache::gather(&src, len, len + extra))
                }
                LayerState::Mamba2(_) => gather!(li, Mamba2, Mamba2State),
                LayerState::Mamba(_) => gather!(li, Mamba, MambaState),
                LayerState::DeltaNet(_) => gather!(li, DeltaNet, DeltaNetState),
                LayerState::Hgrn2(_) => gather!(li, Hgrn2, Hgrn2State),
            })
            .collect();
        let start: Vec<usize> = rows.iter().map(|&(c, r)| len - (c.len() - c.row_start(r))).collect();
        let padded = start.iter().any(|&s| s > 0);
        Cache { layers, start: padded.then_some(start) }
    }
}

/// One layer's inference state on the GPU.
pub type GpuLayerState<T> = LayerState<GpuCache<T>, CudaSlice<f32>>;

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

impl<T: Elem> Cuda<T> {
    /// An empty inference state for every layer: `batch` rows of up to `cap` positions (an
    /// attention layer's k, v of the H_kv k/v heads and c of the H query heads; every position
    /// even with a sliding window).
    pub fn new_caches(&self, model: &Model, batch: usize, cap: usize) -> Result<Vec<GpuLayerState<T>>> {
        let cap = cap.max(1);
        model
            .layers
            .iter()
            .map(|blk| match &blk.mixer {
                Mixer::Attention(l) => {
                    let (h, hkv, d) = (l.heads, l.kv_heads, l.head_dim);
                    // The kernels index rows of c [B·H·cap] and of k, v [B·H_kv·cap] in 32 bits (H ≥ H_kv).
                    i32_of(batch * h * cap, "batch × heads × cache positions")?;
                    let n = GpuCache::<T>::lens(batch, h, hkv, d, cap);
                    Ok(LayerState::Attention(GpuCache {
                        k: self.gpu.zeros(n.kv)?,
                        v: self.gpu.zeros(n.kv)?,
                        c: self.gpu.zeros(n.c)?,
                        k_shift: self.gpu.zeros(n.shift)?,
                        v_shift: self.gpu.zeros(n.shift)?,
                        len: 0,
                        cap,
                        batch,
                        heads: h,
                        kv_heads: hkv,
                        head_dim: d,
                        staged: false,
                    }))
                }
                Mixer::Mamba2(l) => Ok(LayerState::Mamba2(GpuMamba2State::new(&self.gpu, batch, *l.sizes())?)),
                Mixer::Mamba(l) => Ok(LayerState::Mamba(GpuMambaState::new(&self.gpu, batch, *l.sizes())?)),
                Mixer::DeltaNet(l) => Ok(LayerState::DeltaNet(GpuDeltaNetState::new(&self.gpu, batch, *l.sizes())?)),
                Mixer::Hgrn2(l) => Ok(LayerState::Hgrn2(GpuHgrn2State::new(&self.gpu, batch, *l.sizes())?)),
            })
            .collect()
    }
}
