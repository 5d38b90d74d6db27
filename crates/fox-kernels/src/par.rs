//! A pointer that rayon tasks may share when each task writes a disjoint set of elements.

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
