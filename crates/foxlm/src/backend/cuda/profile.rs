//! The per-family profiler of `bench train`: an event before every operation.

use super::*;

impl<T: Elem> Cuda<T> {
    /// Starts recording an event before every operation (a little slower; for `bench train`).
    pub fn start_profile(&mut self) {
        self.prof = Some(Vec::new());
    }

    /// Stops recording and returns, per family, the GPU time (ms) and the number of operations
    /// (each one to a few kernel launches) since [`Cuda::start_profile`]. Waits for the GPU.
    pub fn take_profile(&mut self) -> Result<Vec<(Family, f64, usize)>> {
        let Some(marks) = self.prof.take() else { return Ok(Vec::new()) };
        let end = self.gpu.stream().record_event(Some(TIMING)).map_err(|e| anyhow!("{e:?}"))?;
        self.gpu.sync()?;
        let mut out: std::collections::BTreeMap<Family, (f64, usize)> = Default::default();
        for (i, (fam, ev)) in marks.iter().enumerate() {
            let next = marks.get(i + 1).map_or(&end, |m| &m.1);
            let ms = ev.elapsed_ms(next).map_err(|e| anyhow!("{e:?}"))? as f64;
            let e = out.entry(*fam).or_default();
            e.0 += ms;
            e.1 += 1;
        }
        Ok(out.into_iter().map(|(f, (ms, n))| (f, ms, n)).collect())
    }

    pub(crate) fn mark(&mut self, family: Family) -> Result<()> {
        if let Some(p) = self.prof.as_mut() {
            let e = self.gpu.stream().record_event(Some(TIMING)).map_err(|e| anyhow!("recording an event: {e:?}"))?;
            p.push((family, e));
        }
        Ok(())
    }
}
