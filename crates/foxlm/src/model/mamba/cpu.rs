//! The Mamba family's operations on the CPU backend (f32, the reference): `fox_kernels`'
//! selective scan (with its decode step) on the layer's buffers.

use super::ops::{MambaOps, MambaParams, ScanGradsOf, ScanIn};
use super::state::MambaState;
use crate::backend::cpu::{Cpu, CpuBatch};
use crate::backend::scan_state::{chunks_from, forward_carrying, Carry};
use crate::backend::Family;
use crate::config::MambaSizes;
use anyhow::{ensure, Result};
use fox_kernels::selective_scan::{self, BcLayout, GradsMut, Scan};
use fox_kernels::ssd;

/// z, xz's last Di columns, as a contiguous [B·T, Di] (the scan's layout).
fn gate(s: &MambaSizes, xz: &[f32]) -> Vec<f32> {
    xz.chunks(2 * s.inner).flat_map(|row| row[s.inner..].iter().copied()).collect()
}

/// A = -exp(A_log) and the gate z: the operands that the scan's forward and backward both
/// derive from the layer before they can state the problem.
fn decay_and_gate(cpu: &Cpu, p: &MambaParams, xz: &[f32]) -> (Vec<f32>, Vec<f32>) {
    (cpu.neg_exp(p.a_log), gate(&p.sizes, xz))
}

/// The scan problem of one forward (or its backward), D taken from the layer's parameters.
fn scan<'a>(
    cpu: &'a Cpu,
    p: &MambaParams,
    b: &'a CpuBatch,
    x: &ScanIn<'a, Vec<f32>>,
    a: &'a [f32],
    z: &'a [f32],
) -> Scan<'a> {
    let s = &p.sizes;
    Scan {
        batch: b.batch,
        len: b.seq,
        channels: s.inner,
        state: s.state,
        u: x.u,
        delta: x.delta,
        a,
        bc: x.xp,
        bc_layout: BcLayout::x_proj(b.seq, s.dt_rank, s.state),
        d: &cpu.params[p.d_skip],
        z: Some(z),
        start: b.pads(),
    }
}

impl MambaOps for Cpu<'_> {
    fn mamba_dt_split(&mut self, dt_low: &mut Vec<f32>, xp: &Vec<f32>, p: &MambaParams, rows: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let (r, w) = (p.sizes.dt_rank, p.sizes.x_proj_dim());
        let n = crate::backend::cpu::first("Mamba dt split", rows.checked_mul(r), &[dt_low.len()])?;
        crate::backend::cpu::first("Mamba dt split", rows.checked_mul(w), &[xp.len()])?;
        for (dst, src) in dt_low[..n].chunks_mut(r.max(1)).zip(xp.chunks(w)) {
            dst.copy_from_slice(&src[..r]);
        }
        Ok(())
    }

    fn mamba_dt_merge(&mut self, dxp: &mut Vec<f32>, d_dt_low: &Vec<f32>, p: &MambaParams) -> Result<()> {
        let _t = self.time(Family::Other);
        let (r, w) = (p.sizes.dt_rank, p.sizes.x_proj_dim());
        ensure!(d_dt_low.len() * w == dxp.len() * r, "Mamba dt merge: {} values for {}", d_dt_low.len(), dxp.len());
        for (dst, src) in dxp.chunks_mut(w).zip(d_dt_low.chunks(r.max(1))) {
            dst[..r].copy_from_slice(src);
        }
        Ok(())
    }

    fn mamba_delta_fwd(&mut self, delta: &mut Vec<f32>, dt_pre: &Vec<f32>, p: &MambaParams, rows: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let di = p.sizes.inner;
        let n = crate::backend::cpu::first("Mamba delta", rows.checked_mul(di), &[delta.len(), dt_pre.len()])?;
        ssd::dt_fwd(&mut delta[..n], &dt_pre[..n], di, &self.params[p.dt_bias])
    }

    fn mamba_delta_bwd(
        &mut self,
        d_dt_pre: &mut Vec<f32>,
        ddelta: &Vec<f32>,
        dt_pre: &Vec<f32>,
        p: &MambaParams,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let di = p.sizes.inner;
        let mut db = vec![0.0; di];
        ssd::dt_bwd(d_dt_pre, di, &mut db, ddelta, dt_pre, &self.params[p.dt_bias])?;
        self.add_grad(p.dt_bias, &db)
    }

    fn selective_scan_fwd(
        &mut self,
        y: &mut Vec<f32>,
        saved: &mut Vec<f32>,
        x: ScanIn<'_, Vec<f32>>,
        p: &MambaParams,
        b: &CpuBatch,
        state: Option<&mut MambaState>,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let (a, z) = decay_and_gate(self, p, x.xz);
        let prob = scan(self, p, b, &x, &a, &z);
        ensure!(
            saved.len() == selective_scan::saved_len(&prob),
            "Mamba scan buffers sized for another batch ({} saved values, {} needed)",
            saved.len(),
            selective_scan::saved_len(&prob)
        );
        forward_carrying(state, b.batch, b.seq, |carry| {
            match carry {
                Carry::Zeros => selective_scan::forward(&prob, None, y, saved, None),
                Carry::Step(st) => selective_scan::decode_step(&prob, &mut st.ssm, y),
                Carry::Chunks(st) => chunks_from(&mut st.ssm, |from, to| {
                    selective_scan::forward(&prob, Some(from), y, saved, Some(to));
                    Ok(())
                })?,
            }
            Ok(())
        })
    }

    fn selective_scan_bwd(
        &mut self,
        grads: ScanGradsOf<'_, Vec<f32>>,
        dy: &Vec<f32>,
        saved: &Vec<f32>,
        x: ScanIn<'_, Vec<f32>>,
        p: &MambaParams,
        b: &CpuBatch,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let s = &p.sizes;
        let (a, z) = decay_and_gate(self, p, x.xz);
        let prob = scan(self, p, b, &x, &a, &z);
        let (mut da, mut dd, mut dz) = (vec![0.0; a.len()], vec![0.0; s.inner], vec![0.0; z.len()]);
        let ScanGradsOf { du, ddelta, dxp, dxz } = grads;
        let g = GradsMut { du, ddelta, da: &mut da, dbc: dxp, dd: &mut dd, dz: Some(&mut dz), dh0: None };
        selective_scan::backward(&prob, saved, dy, g);
        for (row, src) in dxz.chunks_mut(2 * s.inner).zip(dz.chunks(s.inner.max(1))) {
            row[s.inner..].copy_from_slice(src);
        }
        self.add_a_log_grad(p.a_log, &da, &a)?;
        self.add_grad(p.d_skip, &dd)
    }
}
