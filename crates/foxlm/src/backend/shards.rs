//! How ZeRO-1 cuts each tensor over the ranks of a data-parallel run (`cuda::zero1`; see
//! `crate::distributed`).

use std::ops::Range;

/// Each tensor of `len` elements cut into `world` shards of `ceil(len / world)` (the last padded
/// with zeros): rank r owns `[r·shard, (r+1)·shard)` of the padded tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shards {
    pub rank: usize,
    pub world: usize,
    pub shard: Vec<usize>,
}

impl Shards {
    pub fn new(lens: impl IntoIterator<Item = usize>, rank: usize, world: usize) -> Self {
        Self { rank, world, shard: lens.into_iter().map(|n| n.div_ceil(world.max(1))).collect() }
    }

    /// Elements of tensor `i` with its padding.
    pub fn padded(&self, i: usize) -> usize {
        self.shard[i] * self.world
    }

    /// This rank's shard of tensor `i` in the padded tensor.
    pub fn own(&self, i: usize) -> Range<usize> {
        self.rank * self.shard[i]..(self.rank + 1) * self.shard[i]
    }

    /// The part of this rank's shard that lies within the first `n` elements (the tensor's
    /// unpadded data), as a range of the tensor.
    pub fn own_within(&self, i: usize, n: usize) -> Range<usize> {
        let r = self.own(i);
        r.start.min(n)..r.end.min(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_pad_and_partition() {
        let s = Shards::new([10, 3, 8], 2, 3);
        assert_eq!(s.shard, [4, 1, 3]);
        assert_eq!((s.padded(0), s.own(0), s.own_within(0, 10)), (12, 8..12, 8..10));
        assert_eq!((s.own(1), s.own_within(1, 3)), (2..3, 2..3));
        assert_eq!(s.own_within(2, 5), 5..5);
        // One rank owns everything, unpadded.
        let one = Shards::new([10, 3], 0, 1);
        assert_eq!((one.own(0), one.padded(1)), (0..10, 3));
    }
}
