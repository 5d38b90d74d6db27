//! The Mamba-2 family's operations on the CPU backend (f32, the reference): `fox_kernels`'
//! chunked SSD (with its decode step) and the gated RMSNorm on the layer's buffers.

use super::ops::{Mamba2Ops, Mamba2Params, SsdIn};
use super::state::Mamba2State;
use crate::backend::cpu::{Cpu, CpuBatch};
use crate::backend::scan_state::{chunks_from, forward_carrying, Carry};
use crate::backend::Family;
use crate::config::Mamba2Sizes;
use anyhow::Result;
use fox_kernels::rms_norm_gated::{rms_norm_gated_bwd, rms_norm_gated_fwd, GatedNorm};
use fox_kernels::ssd::{self, Ssd, SsdGrads};

/// The SSD problem over the conv output.
fn ssd<'a>(s: &Mamba2Sizes, b: &'a CpuBatch, x: SsdIn<'a, Vec<f32>, Vec<f32>>, a: &'a [f32], d: &'a [f32]) -> Ssd<'a> {
    Ssd {
        batch: b.batch,
        seq: b.seq,
        heads: s.heads,
        head_dim: s.head_dim,
        state: s.state,
        groups: s.groups,
        xbc: x.xbc,
        xbc_stride: s.conv_dim(),
        dt: x.dt,
        a,
        d,
        start: b.pads(),
    }
}

impl Mamba2Ops for Cpu<'_> {
    fn mamba2_dt_fwd(&mut self, dt: &mut Vec<f32>, zxbcdt: &Vec<f32>, p: &Mamba2Params, rows: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = &p.sizes;
        let n = crate::backend::cpu::first("Mamba-2 dt", rows.checked_mul(s.heads), &[dt.len()])?;
        ssd::dt_fwd(&mut dt[..n], &zxbcdt[s.dt_offset()..], s.in_proj_dim(), &self.params[p.dt_bias])
    }

    fn mamba2_dt_bwd(
        &mut self,
        dzxbcdt: &mut Vec<f32>,
        ddt: &Vec<f32>,
        zxbcdt: &Vec<f32>,
        p: &Mamba2Params,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = p.sizes;
        let at = s.dt_offset();
        let mut db = vec![0.0; s.heads];
        ssd::dt_bwd(&mut dzxbcdt[at..], s.in_proj_dim(), &mut db, ddt, &zxbcdt[at..], &self.params[p.dt_bias])?;
        self.add_grad(p.dt_bias, &db)
    }

    fn ssd_fwd(
        &mut self,
        y: &mut Vec<f32>,
        x: SsdIn<'_, Vec<f32>, Vec<f32>>,
        p: &Mamba2Params,
        b: &CpuBatch,
        state: Option<&mut Mamba2State>,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let a = self.neg_exp(p.a_log);
        let prob = ssd(&p.sizes, b, x, &a, &self.params[p.d_skip]);
        forward_carrying(state, b.batch, b.seq, |carry| match carry {
            Carry::Zeros => ssd::ssd_fwd(&prob, y, None, None),
            Carry::Step(st) => ssd::ssd_decode_step(&prob, &mut st.ssm, y),
            Carry::Chunks(st) => chunks_from(&mut st.ssm, |from, to| ssd::ssd_fwd(&prob, y, Some(from), Some(to))),
        })
    }

    fn ssd_bwd(
        &mut self,
        dxbc: &mut Vec<f32>,
        ddt: &mut Vec<f32>,
        dy: &Vec<f32>,
        x: SsdIn<'_, Vec<f32>, Vec<f32>>,
        p: &Mamba2Params,
        b: &CpuBatch,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let h = p.sizes.heads;
        let a = self.neg_exp(p.a_log);
        let (mut da, mut dd) = (vec![0.0; h], vec![0.0; h]);
        let prob = ssd(&p.sizes, b, x, &a, &self.params[p.d_skip]);
        let grads = SsdGrads { dxbc, ddt, da: &mut da, dd: &mut dd, dinit: None };
        ssd::ssd_bwd(&prob, dy, None, None, grads)?;
        self.add_a_log_grad(p.a_log, &da, &a)?;
        self.add_grad(p.d_skip, &dd)
    }

    fn gated_norm_fwd(
        &mut self,
        g: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
        y: &Vec<f32>,
        zxbcdt: &Vec<f32>,
        p: &Mamba2Params,
        rows: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = &p.sizes;
        let dim = s.inner / s.groups;
        let n = crate::backend::cpu::first("gated norm", rows.checked_mul(s.inner), &[g.len(), y.len()])?;
        let nz = crate::backend::cpu::first("gated norm", rows.checked_mul(s.in_proj_dim()), &[zxbcdt.len()])?;
        crate::backend::cpu::first("gated norm", rows.checked_mul(s.groups), &[rstd.len()])?;
        let (g, rstd, y, z) = (&mut g[..n], &mut rstd[..rows * s.groups], &y[..n], &zxbcdt[..nz]);
        let norm = GatedNorm { x: y, z, z_stride: s.in_proj_dim(), w: &self.params[p.norm], dim, groups: s.groups };
        rms_norm_gated_fwd(&norm, p.eps, g, rstd)
    }

    fn gated_norm_bwd(
        &mut self,
        dy: &mut Vec<f32>,
        dzxbcdt: &mut Vec<f32>,
        dg: &Vec<f32>,
        y: &Vec<f32>,
        zxbcdt: &Vec<f32>,
        rstd: &Vec<f32>,
        p: &Mamba2Params,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = p.sizes;
        let dim = s.inner / s.groups;
        let mut dw = vec![0.0; s.inner];
        let w = self.params[p.norm].to_vec();
        let norm = GatedNorm { x: y, z: zxbcdt, z_stride: s.in_proj_dim(), w: &w, dim, groups: s.groups };
        rms_norm_gated_bwd(&norm, dg, rstd, dy, dzxbcdt, &mut dw)?;
        self.add_grad(p.norm, &dw)
    }
}
