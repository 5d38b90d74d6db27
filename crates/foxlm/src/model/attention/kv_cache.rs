//! The decode cache of one layer: keys and values in head-first layout, the running gate prefix
//! sum c per head (so a step adds one log f and never recomputes a prefix sum), and the last
//! unmixed k̃, ṽ for KV-shift. With grouped-query attention k and v hold the H_kv k/v heads and c
//! the H query heads (the gate is per query head).

use fox_kernels::attention::View;

#[derive(Clone, Debug)]
pub struct KvCache {
    pub batch: usize,
    /// Query heads H (of c).
    pub heads: usize,
    /// k/v heads H_kv (of k, v and the KV-shift states).
    pub kv_heads: usize,
    pub head_dim: usize,
    pub len: usize,
    cap: usize,
    /// [B, H_kv, cap, D]
    k: Vec<f32>,
    v: Vec<f32>,
    /// [B, H, cap]
    c: Vec<f32>,
    /// [B, H_kv·D]
    pub k_shift: Vec<f32>,
    pub v_shift: Vec<f32>,
}

impl KvCache {
    pub fn new(batch: usize, heads: usize, kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let cap = capacity.max(1);
        Self {
            batch,
            heads,
            kv_heads,
            head_dim,
            len: 0,
            cap,
            k: vec![0.0; batch * kv_heads * cap * head_dim],
            v: vec![0.0; batch * kv_heads * cap * head_dim],
            c: vec![0.0; batch * heads * cap],
            k_shift: vec![0.0; batch * kv_heads * head_dim],
            v_shift: vec![0.0; batch * kv_heads * head_dim],
        }
    }

    /// Bytes held for `tokens` cached tokens.
    pub fn bytes_for(batch: usize, heads: usize, kv_heads: usize, head_dim: usize, tokens: usize) -> usize {
        4 * (batch * tokens * (2 * kv_heads * head_dim + heads) + 2 * batch * kv_heads * head_dim)
    }

    fn grow(&mut self, need: usize) {
        let new_cap = need.max(self.cap * 2);
        let (b, h, hkv, d) = (self.batch, self.heads, self.kv_heads, self.head_dim);
        let mut k = vec![0.0; b * hkv * new_cap * d];
        let mut v = vec![0.0; b * hkv * new_cap * d];
        let mut c = vec![0.0; b * h * new_cap];
        let n = self.len * d;
        for bh in 0..b * hkv {
            k[bh * new_cap * d..][..n].copy_from_slice(&self.k[bh * self.cap * d..][..n]);
            v[bh * new_cap * d..][..n].copy_from_slice(&self.v[bh * self.cap * d..][..n]);
        }
        for bh in 0..b * h {
            c[bh * new_cap..][..self.len].copy_from_slice(&self.c[bh * self.cap..][..self.len]);
        }
        (self.k, self.v, self.c, self.cap) = (k, v, c, new_cap);
    }

    /// Appends t tokens: k, v [B, t, H_kv·D] and c [B, H, t].
    pub fn append(&mut self, k: &[f32], v: &[f32], c: &[f32], t: usize) {
        if self.len + t > self.cap {
            self.grow(self.len + t);
        }
        let (h, hkv, d, cap) = (self.heads, self.kv_heads, self.head_dim, self.cap);
        for bi in 0..self.batch {
            for hi in 0..hkv {
                for ti in 0..t {
                    let src = ((bi * t + ti) * hkv + hi) * d;
                    let dst = ((bi * hkv + hi) * cap + self.len + ti) * d;
                    self.k[dst..dst + d].copy_from_slice(&k[src..src + d]);
                    self.v[dst..dst + d].copy_from_slice(&v[src..src + d]);
                }
            }
            for hi in 0..h {
                let bh = bi * h + hi;
                self.c[bh * cap + self.len..][..t].copy_from_slice(&c[bh * t..(bh + 1) * t]);
            }
        }
        self.len += t;
    }

    pub fn c_at(&self, bh: usize, pos: usize) -> f32 {
        self.c[bh * self.cap + pos]
    }

    /// c for the cached positions as [B, H, len].
    pub fn c_compact(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.batch * self.heads * self.len);
        for bh in 0..self.batch * self.heads {
            out.extend_from_slice(&self.c[bh * self.cap..][..self.len]);
        }
        out
    }

    pub fn k_view(&self) -> View<'_> {
        View::bhtd(&self.k, self.cap, self.head_dim, self.kv_heads)
    }
    pub fn v_view(&self) -> View<'_> {
        View::bhtd(&self.v, self.cap, self.head_dim, self.kv_heads)
    }
}

impl KvCache {
    /// A cache of `len` positions holding, in each new row, positions `from..src.len` of one row of
    /// a source cache, right-aligned so that every row ends at `len` (the positions before are left
    /// padding). For continuous batching: rows of different lengths decode together.
    pub(crate) fn gather(rows: &[(&KvCache, usize, usize)], len: usize, capacity: usize) -> KvCache {
        let (heads, kv_heads, head_dim) = rows.first().map_or((1, 1, 1), |(c, _, _)| (c.heads, c.kv_heads, c.head_dim));
        let mut out = KvCache::new(rows.len(), heads, kv_heads, head_dim, capacity.max(len));
        let (h, hkv, d, cap) = (heads, kv_heads, head_dim, out.cap);
        for (bi, &(src, row, from)) in rows.iter().enumerate() {
            let n = src.len - from;
            let at = len - n;
            for hi in 0..hkv {
                let (sbh, dbh) = (row * hkv + hi, bi * hkv + hi);
                let s = (sbh * src.cap + from) * d;
                let t = (dbh * cap + at) * d;
                out.k[t..t + n * d].copy_from_slice(&src.k[s..s + n * d]);
                out.v[t..t + n * d].copy_from_slice(&src.v[s..s + n * d]);
            }
            for hi in 0..h {
                let (sbh, dbh) = (row * h + hi, bi * h + hi);
                out.c[dbh * cap + at..][..n].copy_from_slice(&src.c[sbh * src.cap + from..][..n]);
            }
            let dkv = hkv * d;
            out.k_shift[bi * dkv..(bi + 1) * dkv].copy_from_slice(&src.k_shift[row * dkv..(row + 1) * dkv]);
            out.v_shift[bi * dkv..(bi + 1) * dkv].copy_from_slice(&src.v_shift[row * dkv..(row + 1) * dkv]);
        }
        out.len = len;
        out
    }
}
