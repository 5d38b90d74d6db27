//! A pointer that rayon tasks may share when each task writes a disjoint set of elements, and
//! per-thread scratch buffers kept between calls.

use std::cell::RefCell;

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
