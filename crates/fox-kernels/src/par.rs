//! rayon's global pool as the CPU ops want it (denormals flushed), a pointer that rayon tasks may
//! share when each task writes a disjoint set of elements, and per-thread scratch buffers kept
//! between calls.

use std::cell::RefCell;

/// Sets this thread to flush denormal floats (below 1.18e-38) to zero, as results (FTZ) and as
/// operands (DAZ): x86-64's MXCSR bits; elsewhere nothing. Intel cores compute each operation
/// that meets a denormal in microcode, a hundred times slower (the attention of a CPU step, whose
/// decayed scores underflow, ran 3.5x slower on a Xeon without them: docs/kernel-notes.md,
/// "Measurements behind choices in the code"). Values that are normal floats
/// are computed as before, bit for bit; only what would be a denormal becomes 0 (TensorFlow's
/// default on CPUs, `torch.set_flush_denormal(True)` in PyTorch).
pub fn flush_denormals_here() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sets two MXCSR mode bits (FTZ 0x8000, DAZ 0x0040); changes no memory.
    #[allow(deprecated)] // _mm_setcsr: the intrinsic for this, not yet given a replacement
    unsafe {
        use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
        _mm_setcsr(_mm_getcsr() | 0x8040);
    }
}

/// Builds rayon's global pool with every worker flushing denormals ([`flush_denormals_here`]),
/// and sets the calling thread so too. Programs call it before anything else uses rayon (the
/// pool is built once per process: later calls, or a pool already built, return the error and
/// leave it as it is). The thread count is rayon's default (RAYON_NUM_THREADS, else all cores).
pub fn init_pool() -> Result<(), rayon::ThreadPoolBuildError> {
    flush_denormals_here();
    rayon::ThreadPoolBuilder::new().start_handler(|_| flush_denormals_here()).build_global()
}

/// Runs `f` on a thread of rayon's global pool (directly when already on one). The parallel loops
/// and products inside `f` then split their work from a worker, which takes a share itself and
/// whose partner is often still spinning, instead of being injected from outside while the
/// calling thread sleeps until each is done. A training step is hundreds of such loops, so each
/// hand-off saved counts (docs/kernel-notes.md has the measurement).
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let mut out = None;
    // rayon::scope runs its closure on a worker of the global pool.
    rayon::scope(|_| out = Some(f()));
    out.expect("rayon::scope ran its closure")
}

#[derive(Clone, Copy)]
pub struct SharedMut<T>(*mut T);
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub fn new(s: &mut [T]) -> Self {
        Self(s.as_mut_ptr())
    }
    /// The start of the slice, for code that hands disjoint parts of it to raw-pointer kernels.
    pub fn ptr(&self) -> *mut T {
        self.0
    }
    /// # Safety
    /// `i` must be in bounds of the slice this was made from, and no other task may touch
    /// element `i` at the same time.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get(&self, i: usize) -> &mut T {
        &mut *self.0.add(i)
    }
    /// # Safety
    /// As `get`, for the whole range `[start, start + len)`.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(start), len)
    }
}

/// `f` on the first `n` values of a thread's scratch buffer `key`, grown as needed and kept for
/// the next call (allocating afresh costs a page fault per 4 KiB). Contents are left over from
/// earlier calls.
pub fn with_buffer<R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<f32>>>,
    n: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < n {
                v.resize(n, 0.0);
            }
            f(&mut v[..n])
        }
        // Re-entered on this thread (a nested call): a buffer of its own.
        Err(_) => f(&mut vec![0.0; n]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A product below the normal range is a denormal by default and 0 once flushed; normal
    /// results keep their bits. (On a thread of its own: the mode is per thread.)
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn flushed_denormals_become_zero() {
        let (a, b) = (std::hint::black_box(1e-30f32), std::hint::black_box(1e-10f32));
        let before = std::thread::spawn(move || (a * b, a * 3.0)).join().unwrap();
        assert!(before.0 > 0.0 && before.0 < f32::MIN_POSITIVE, "{}", before.0);
        let after = std::thread::spawn(move || {
            flush_denormals_here();
            (a * b, a * 3.0, std::hint::black_box(before.0) + 0.0)
        })
        .join()
        .unwrap();
        assert_eq!(after.0.to_bits(), 0);
        assert_eq!(after.1.to_bits(), before.1.to_bits());
        // A denormal operand counts as 0 (DAZ).
        assert_eq!(after.2.to_bits(), 0);
    }
}
