//! Named parameters: one f32 buffer per checkpoint tensor, addressed by a small id.

use rayon::prelude::*;
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn zeros(shape: &[usize]) -> Self {
        Self { shape: shape.to_vec(), data: vec![0.0; shape.iter().product()] }
    }
    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

/// Index of a parameter in `Params`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParamId(pub usize);

/// How AdamW treats a parameter (SPEC §3: decay on matrices and embeddings only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// Linear weights and the embedding: weight decay applies.
    Matrix,
    /// Norm weights and biases: no weight decay.
    NoDecay,
    /// A buffer saved with the model but never trained (the fixed forget gate's bias).
    Frozen,
}

/// A bias-free Linear layer; its weight is [out, in] as in the checkpoint.
#[derive(Clone, Copy, Debug)]
pub struct Linear {
    pub weight: ParamId,
    pub out_features: usize,
    pub in_features: usize,
}

impl Linear {
    pub fn new(p: &mut Params, name: &str, out_features: usize, in_features: usize) -> Self {
        let weight = p.add(name, &[out_features, in_features], ParamKind::Matrix);
        Self { weight, out_features, in_features }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Params {
    pub names: Vec<String>,
    pub kinds: Vec<ParamKind>,
    pub tensors: Vec<Tensor>,
    index: HashMap<String, usize>,
}

impl Params {
    pub fn add(&mut self, name: &str, shape: &[usize], kind: ParamKind) -> ParamId {
        assert!(!self.index.contains_key(name), "duplicate parameter {name}");
        let id = self.names.len();
        self.names.push(name.to_string());
        self.kinds.push(kind);
        self.tensors.push(Tensor::zeros(shape));
        self.index.insert(name.to_string(), id);
        ParamId(id)
    }
    pub fn id(&self, name: &str) -> Option<ParamId> {
        self.index.get(name).map(|&i| ParamId(i))
    }
    pub fn len(&self) -> usize {
        self.names.len()
    }
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
    pub fn numel(&self) -> usize {
        self.tensors.iter().map(|t| t.numel()).sum()
    }
    /// Gradient buffers shaped like the parameters, zeroed (pages mapped when first touched).
    pub fn zeros_like(&self) -> Vec<Vec<f32>> {
        self.tensors.iter().map(|t| vec![0.0; t.numel()]).collect()
    }
    /// [`Params::zeros_like`] with every page written now, for buffers that a CPU training step
    /// reads and then writes (gradients, AdamW's moments). `vec![0.0; n]` maps the kernel's
    /// shared zero page, and the first write after a read then takes a copy-on-write fault and a
    /// TLB shoot-down on every core for each 4 KiB: at 125M, about 5 s of system time in the
    /// first step. Not for buffers that stay mostly untouched (a GPU run's host copies).
    pub fn written_zeros_like(&self) -> Vec<Vec<f32>> {
        self.tensors.iter().map(|t| written_zeros(t.numel())).collect()
    }
}

/// n zeros, every page written (see [`Params::written_zeros_like`]).
pub fn written_zeros(n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(n);
    v.spare_capacity_mut().par_chunks_mut(1 << 14).for_each(|c| {
        c.iter_mut().for_each(|x| {
            x.write(0.0);
        })
    });
    // SAFETY: all n elements were initialised above.
    unsafe { v.set_len(n) };
    v
}

impl std::ops::Index<ParamId> for Params {
    type Output = [f32];
    fn index(&self, id: ParamId) -> &[f32] {
        &self.tensors[id.0].data
    }
}

impl std::ops::IndexMut<ParamId> for Params {
    fn index_mut(&mut self, id: ParamId) -> &mut [f32] {
        &mut self.tensors[id.0].data
    }
}
