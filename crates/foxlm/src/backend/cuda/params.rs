//! The parameter store on the device: fp32 masters, working copies and gradients, and their
//! downloads to the host.

use super::*;

/// A parameter on the device: the fp32 master, the `T` working copy of a matrix (GEMMs and the
/// embedding read it), and the fp32 gradient.
pub struct DeviceParam<T> {
    pub master: CudaSlice<f32>,
    pub copy: Option<CudaSlice<T>>,
    pub grad: CudaSlice<f32>,
}

impl<T: Elem> Cuda<T> {
    /// Copies the fp32 master weights into `params` (for a checkpoint or a CPU check).
    pub fn download_params(&self, params: &mut Params) -> Result<()> {
        for (i, p) in self.params.iter().enumerate() {
            let n = self.numel[i];
            if self.zero.is_some() && p.copy.is_some() {
                // A matrix's fp32 weights are sharded: every rank takes part in the gather.
                self.gather_to_host(i, &p.master, 0, params.tensors[i].data.as_mut_slice())?;
                continue;
            }
            self.gpu
                .stream()
                .memcpy_dtoh(&p.master.slice(0..n), params.tensors[i].data.as_mut_slice())
                .map_err(|e| anyhow!("{e:?}"))?;
        }
        self.gpu.sync()
    }

    /// Copies the gradients into `grads` (shaped like the parameters).
    pub fn download_grads(&self, grads: &mut [Vec<f32>]) -> Result<()> {
        for (i, p) in self.params.iter().enumerate() {
            let g = self.gpu.download(&p.grad)?;
            let n = grads[i].len();
            grads[i].copy_from_slice(&g[..n]);
        }
        Ok(())
    }

    /// Copies AdamW's moments and step into `opt`.
    pub fn download_optimizer(&self, opt: &mut AdamW) -> Result<()> {
        let o = self.opt.as_ref().ok_or_else(|| anyhow!("AdamW state not initialised"))?;
        opt.step = o.step;
        for i in 0..self.params.len() {
            let n = self.numel[i];
            if self.zero.is_some() {
                self.gather_to_host(i, &o.m[i], 0, &mut opt.m[i])?;
                self.gather_to_host(i, &o.v[i], 0, &mut opt.v[i])?;
                continue;
            }
            opt.m[i] = self.gpu.stream().clone_dtoh(&o.m[i].slice(0..n)).map_err(|e| anyhow!("{e:?}"))?;
            opt.v[i] = self.gpu.stream().clone_dtoh(&o.v[i].slice(0..n)).map_err(|e| anyhow!("{e:?}"))?;
        }
        Ok(())
    }

    pub(crate) fn copy_of(&self, id: ParamId) -> Result<&CudaSlice<T>> {
        self.params[id.0]
            .copy
            .as_ref()
            .ok_or_else(|| anyhow!("{} has no working copy (not a matrix)", self.names[id.0]))
    }
}
