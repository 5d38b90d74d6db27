//! `foxlm eval compare`: overlays the L(i) curves of separate `foxlm eval loss` runs, plots their
//! differences to a baseline, and tabulates range means (see [`crate::eval::compare`]); and
//! overlays training runs' loss curves against tokens seen (the paper's Figure 25).

use crate::eval::compare::{self, Curve};
use crate::eval::plots::LineChart;
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// An `eval loss` output: its folder, its loss.json or its loss.csv; repeatable. Every model
    /// in each is compared, in order.
    #[arg(long, required_unless_present = "run", num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Training folder (`foxlm train --out`); repeatable. Their training curves (loss against
    /// tokens seen, from metrics.jsonl) are overlaid in compare-train.png, with compare-train.csv
    /// and compare-train.md. With --input, give one per model, in the same order: the L(i)
    /// table then shows each one's final validation loss and training time.
    #[arg(long)]
    pub run: Vec<PathBuf>,
    /// Training curves: the trailing mean over this many tokens (default: 2% of the longest run).
    #[arg(long, value_name = "TOKENS")]
    pub smooth_tokens: Option<u64>,
    /// Training curves: also draw each run's validation losses (dots on a dashed line in its colour).
    #[arg(long)]
    pub val_loss: bool,
    /// The model the differences are taken against (its name in the inputs; default the first).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Training context T (default: the one the inputs record, which must agree). The table
    /// averages L(i) over [3T/4, T) and over [T, N).
    #[arg(long)]
    pub train_context: Option<usize>,
    /// Window of the centred moving average of the plots.
    #[arg(long, default_value_t = 101)]
    pub window: usize,
    /// Clip the plotted differences to ±this many nats (a diverging model would flatten the others).
    #[arg(long)]
    pub diff_clip: Option<f64>,
    /// Output folder: compare-loss.png, compare-diff.png, compare.md, compare.json (L(i));
    /// compare-train.png, compare-train.csv, compare-train.md (training curves, with --run).
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
}

pub fn run(a: CompareArgs) -> Result<()> {
    if a.window < 1 {
        bail!("--window must be at least 1");
    }
    if let Some(c) = a.diff_clip {
        if !(c > 0.0 && c.is_finite()) {
            bail!("--diff-clip {c}: expected a positive number of nats");
        }
    }
    if a.smooth_tokens == Some(0) {
        bail!("--smooth-tokens must be at least 1");
    }
    let names = match a.input.is_empty() {
        true => None,
        false => Some(compare_losses(&a)?),
    };
    if !a.run.is_empty() {
        compare_training(&a, names)?;
    }
    Ok(())
}

/// The training curves of --run: overlay, CSV, table. `names`: the models of --input, in order.
fn compare_training(a: &CompareArgs, names: Option<Vec<String>>) -> Result<()> {
    let mut curves = a.run.iter().map(|r| compare::read_train_curve(r)).collect::<Result<Vec<_>>>()?;
    match names {
        Some(n) => curves.iter_mut().zip(n).for_each(|(c, n)| c.name = n),
        None => {
            let mut seen: Vec<String> = vec![];
            for c in curves.iter_mut() {
                let base = c.name.clone();
                let mut k = 2;
                while seen.contains(&c.name) {
                    c.name = format!("{base} ({k})");
                    k += 1;
                }
                seen.push(c.name.clone());
            }
        }
    }
    let longest = curves.iter().filter_map(|c| c.train.last().map(|p| p.0)).max().unwrap_or(0);
    let window = a.smooth_tokens.unwrap_or((longest / 50).max(1));
    let smoothed: Vec<Vec<(u64, f64)>> = curves.iter().map(|c| compare::smooth_by_tokens(&c.train, window)).collect();
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create output folder {}", a.out.display()))?;
    let write = |name: &str, bytes: &[u8]| {
        let p = a.out.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("cannot write {}", p.display()))
    };
    let md = compare::train_markdown(&curves, &smoothed, window);
    write("compare-train.md", md.as_bytes())?;
    write("compare-train.csv", compare::train_csv(&curves, &smoothed).as_bytes())?;
    let mut plot = crate::plot::LinePlot::new(
        format!("Training loss (mean over {} tokens)", crate::plot::tick(window as f64)),
        "tokens seen",
        "loss (nats/token)",
    );
    for (i, (c, sm)) in curves.iter().zip(&smoothed).enumerate() {
        let pts = sm.iter().map(|&(t, l)| (t as f64, l)).collect();
        plot = plot.series(crate::plot::Series::new(c.name.clone(), pts).with_color(i));
        if a.val_loss && !c.val.is_empty() {
            let pts = c.val.iter().map(|&(t, l)| (t as f64, l)).collect();
            let s = crate::plot::Series::new(format!("{} (validation)", c.name), pts);
            plot = plot.series(s.with_markers().dashed().with_color(i));
        }
    }
    let val: Vec<&[(u64, f64)]> = match a.val_loss {
        true => curves.iter().map(|c| &c.val[..]).collect(),
        false => vec![],
    };
    plot.y_range = compare::train_y_range(&smoothed, &val, 0.05);
    plot.save(&a.out.join("compare-train.png"))?;
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{md}")?;
    writeln!(stdout, "wrote compare-train.md, compare-train.csv, compare-train.png to {}", a.out.display())?;
    Ok(())
}

/// The L(i) comparison of --input; returns the models' names, in order.
fn compare_losses(a: &CompareArgs) -> Result<Vec<String>> {
    let mut curves: Vec<Curve> = vec![];
    for p in &a.input {
        curves.extend(compare::read_curves(p)?);
    }
    compare::unique_names(&mut curves);
    if !a.run.is_empty() && a.run.len() != curves.len() {
        bail!(
            "--run is given {} times for {} models ({}); give one training folder per model, in order",
            a.run.len(),
            curves.len(),
            curves.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    let runs = a.run.iter().map(|r| compare::read_run(r).map(Some)).collect::<Result<Vec<_>>>()?;
    let baseline = match &a.baseline {
        None => 0,
        Some(b) => curves.iter().position(|c| &c.name == b).with_context(|| {
            format!(
                "--baseline {b:?}: no such model; the inputs hold {}",
                curves.iter().map(|c| format!("{:?}", c.name)).collect::<Vec<_>>().join(", ")
            )
        })?,
    };
    let train_context = match a.train_context {
        Some(t) => t,
        None => {
            let recorded: Vec<(usize, &Curve)> =
                curves.iter().filter_map(|c| c.train_context.map(|t| (t, c))).collect();
            let Some(&(t, _)) = recorded.first() else {
                bail!("the inputs record no training context: give --train-context");
            };
            if let Some((u, c)) = recorded.iter().find(|(u, _)| *u != t) {
                bail!(
                    "the models' training contexts differ ({t} and {u}, {} in {}): give --train-context",
                    c.name,
                    c.source.display()
                );
            }
            t
        }
    };
    if train_context < 4 {
        bail!("--train-context {train_context}: expected at least 4 (the table averages its last quarter)");
    }
    let n = curves.iter().map(|c| c.loss.len()).max().unwrap_or(0);
    if let Some(c) = curves.iter().find(|c| c.loss.len() != n) {
        eprintln!(
            "warning: {} has {} positions, others {n}: its ranges beyond its curve are left blank",
            c.name,
            c.loss.len()
        );
    }
    if n < train_context {
        eprintln!("warning: the curves end at position {n}, before the training context {train_context}");
    }
    let rows = compare::table(&curves, baseline, train_context, &runs);
    let base_name = curves[baseline].name.clone();
    let bands = compare::position_bands(train_context, n);
    let md = format!(
        "{}\n{}",
        compare::markdown(&rows, &base_name, train_context, n),
        compare::bands_markdown(&curves, baseline, &bands)
    );
    let band_means = compare::band_means(&curves, &bands);
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create output folder {}", a.out.display()))?;
    let write = |name: &str, bytes: &[u8]| {
        let p = a.out.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("cannot write {}", p.display()))
    };
    write("compare.md", md.as_bytes())?;
    let report = json!({
        "baseline": base_name,
        "train_context": train_context,
        "positions": n,
        "late_range": [compare::late_start(train_context), train_context],
        "extrapolated_range": [train_context, n],
        "bands": bands.iter().map(|&(lo, hi)| [lo, hi]).collect::<Vec<_>>(),
        "models": rows.iter().zip(&curves).zip(&band_means).map(|((r, c), bm)| json!({
            "name": r.name,
            "source": c.source.display().to_string(),
            "final_val_loss": r.final_val_loss,
            "late_mean": r.late,
            "extrapolated_mean": r.extrapolated,
            "late_diff": r.late_diff,
            "extrapolated_diff": r.extrapolated_diff,
            "band_means": bm,
            "train_steps": r.run.as_ref().map(|x| x.steps),
            "train_tokens": r.run.as_ref().map(|x| x.tokens),
            "train_seconds": r.run.as_ref().map(|x| x.elapsed_s),
        })).collect::<Vec<_>>(),
    });
    write("compare.json", serde_json::to_string_pretty(&report)?.as_bytes())?;

    let (loss, diff) = compare::series(&curves, baseline, a.window, train_context, a.diff_clip);
    LineChart {
        title: &format!("Per-token loss L(i) (moving average of {})", a.window),
        x_label: "token position",
        y_label: "loss (nats)",
        log_x: n > 1,
        log_y: false,
        marker_label: "training context",
    }
    .draw(&a.out.join("compare-loss.png"), &loss)?;
    let clip = a.diff_clip.map_or(String::new(), |c| format!(", clipped at ±{c}"));
    LineChart {
        title: &format!("L(i) minus {base_name}'s (moving average of {}{clip})", a.window),
        x_label: "token position",
        y_label: "loss difference (nats)",
        log_x: false,
        log_y: false,
        marker_label: "training context",
    }
    .draw(&a.out.join("compare-diff.png"), &diff)?;

    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{md}")?;
    writeln!(stdout, "wrote compare.md, compare.json, compare-loss.png, compare-diff.png to {}", a.out.display())?;
    Ok(curves.into_iter().map(|c| c.name).collect())
}
