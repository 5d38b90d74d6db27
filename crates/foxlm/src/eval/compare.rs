//! Comparing models' per-token loss curves from separate `foxlm eval loss` runs (`foxlm eval
//! compare`): one overlay of L(i), one of each model's L(i) minus a baseline's, and a table of
//! range means (the last quarter of the training context, and beyond it), with each model's final
//! validation loss and training time when its training folder is given.
//!
//! Position i is as in [`crate::eval::loss`]: L(i) is the loss of the prediction made after seeing
//! i + 1 tokens (BOS included), i = 0..N. With training context T, "the last quarter" is
//! i in [3T/4, T) and "extrapolated" is i in [T, N).

use crate::eval::loss::moving_average;
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};

/// One model's L(i), read from an `eval loss` output.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve {
    pub name: String,
    pub loss: Vec<f64>,
    pub train_context: Option<usize>,
    /// The file it was read from.
    pub source: PathBuf,
}

/// Reads every model's L(i) from an `eval loss` output: its folder (loss.json inside), a
/// loss.json, or a loss.csv (the columns not marked "(smoothed)").
pub fn read_curves(path: &Path) -> Result<Vec<Curve>> {
    let file = if path.is_dir() { path.join("loss.json") } else { path.to_path_buf() };
    let text = crate::validate::read_text(&file).with_context(|| format!("--input {}", path.display()))?;
    let curves = if file.extension().is_some_and(|e| e == "csv") {
        curves_from_csv(&text, &file)?
    } else {
        curves_from_json(&text, &file)?
    };
    if curves.is_empty() {
        bail!("{}: no model's loss in it", file.display());
    }
    Ok(curves)
}

fn curves_from_json(text: &str, file: &Path) -> Result<Vec<Curve>> {
    let v: serde_json::Value = serde_json::from_str(text)
        .with_context(|| format!("{}: not JSON (expected eval loss's loss.json)", file.display()))?;
    let models = v
        .get("models")
        .and_then(|m| m.as_array())
        .ok_or_else(|| anyhow!("{}: no \"models\" list (expected eval loss's loss.json)", file.display()))?;
    let mut out = vec![];
    for (k, m) in models.iter().enumerate() {
        let name = m
            .get("name")
            .and_then(|n| n.as_str())
            .ok_or_else(|| anyhow!("{}: models[{k}] has no \"name\"", file.display()))?;
        let loss = m
            .get("loss")
            .and_then(|l| l.as_array())
            .ok_or_else(|| anyhow!("{}: models[{k}] ({name}) has no \"loss\" list", file.display()))?
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                    anyhow!("{}: models[{k}] ({name}): loss[{i}] is {x}, not a finite number", file.display())
                })
            })
            .collect::<Result<Vec<f64>>>()?;
        if loss.is_empty() {
            bail!("{}: models[{k}] ({name}): empty loss list", file.display());
        }
        let train_context = m.get("train_context").and_then(|c| c.as_u64()).map(|c| c as usize);
        out.push(Curve { name: name.to_string(), loss, train_context, source: file.to_path_buf() });
    }
    Ok(out)
}

/// Splits one CSV line (fields may be quoted, with "" for a quote).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

fn curves_from_csv(text: &str, file: &Path) -> Result<Vec<Curve>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = csv_fields(lines.next().ok_or_else(|| anyhow!("{}: empty file", file.display()))?);
    if header.first().map(|h| h.trim()) != Some("position") {
        bail!("{}: the first column is not \"position\" (expected eval loss's loss.csv)", file.display());
    }
    let cols: Vec<usize> = (1..header.len()).filter(|&c| !header[c].ends_with(" (smoothed)")).collect();
    let mut loss = vec![Vec::new(); cols.len()];
    for (r, line) in lines.enumerate() {
        let f = csv_fields(line);
        if f.len() != header.len() {
            bail!("{}: row {} has {} fields, the header {}", file.display(), r + 2, f.len(), header.len());
        }
        let pos: usize =
            f[0].trim().parse().map_err(|_| anyhow!("{}: row {}: position {:?}", file.display(), r + 2, f[0]))?;
        if pos != r {
            bail!("{}: row {} is position {pos}, expected {r} (positions 0, 1, 2, ...)", file.display(), r + 2);
        }
        for (k, &c) in cols.iter().enumerate() {
            let x: f64 = f[c].trim().parse().map_err(|_| {
                anyhow!("{}: row {}, column {:?}: {:?} is not a number", file.display(), r + 2, header[c], f[c])
            })?;
            if !x.is_finite() {
                bail!("{}: row {}, column {:?}: {x} is not finite", file.display(), r + 2, header[c]);
            }
            loss[k].push(x);
        }
    }
    if loss.first().is_some_and(|l| l.is_empty()) {
        bail!("{}: no rows", file.display());
    }
    Ok(cols
        .iter()
        .zip(loss)
        .map(|(&c, loss)| Curve { name: header[c].clone(), loss, train_context: None, source: file.to_path_buf() })
        .collect())
}

/// What a training folder (`foxlm train --out`) says about its run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// The last validation loss in metrics.jsonl.
    pub final_val_loss: Option<f64>,
    pub steps: u64,
    pub tokens: u64,
    /// Wall time of the training as metrics.jsonl records it (the last line's elapsed_s).
    pub elapsed_s: f64,
}

/// Reads a training folder's metrics.jsonl.
pub fn read_run(dir: &Path) -> Result<RunInfo> {
    let file = dir.join(crate::train::METRICS_FILE);
    if !file.is_file() {
        bail!("--run {}: no {} (is it a `foxlm train --out` folder?)", dir.display(), crate::train::METRICS_FILE);
    }
    let ms = crate::train::read_metrics(dir);
    let last = ms.last().ok_or_else(|| anyhow!("{}: no metrics lines", file.display()))?;
    Ok(RunInfo {
        final_val_loss: ms.iter().rev().find(|m| m.kind == "val").and_then(|m| m.val_loss),
        steps: ms.iter().map(|m| m.step).max().unwrap_or(0),
        tokens: ms.iter().map(|m| m.tokens).max().unwrap_or(0),
        elapsed_s: last.elapsed_s,
    })
}

/// A run's training curve (the paper's Figure 25): training loss and validation loss against
/// tokens seen, from its metrics.jsonl.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainCurve {
    pub name: String,
    /// (tokens seen, training loss) of each logged step.
    pub train: Vec<(u64, f64)>,
    /// (tokens seen, validation loss) of each validation.
    pub val: Vec<(u64, f64)>,
    pub info: RunInfo,
}

/// Reads a training folder's curve; it is named after the folder.
pub fn read_train_curve(dir: &Path) -> Result<TrainCurve> {
    let info = read_run(dir)?;
    let ms = crate::train::read_metrics(dir);
    let finite = |x: Option<f64>| x.filter(|v| v.is_finite());
    let train: Vec<(u64, f64)> =
        ms.iter().filter(|m| m.kind == "train").filter_map(|m| Some((m.tokens, finite(m.loss)?))).collect();
    let val = ms.iter().filter(|m| m.kind == "val").filter_map(|m| Some((m.tokens, finite(m.val_loss)?))).collect();
    if train.is_empty() {
        bail!("--run {}: {} has no training loss line", dir.display(), crate::train::METRICS_FILE);
    }
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_string()))
        .unwrap_or_else(|| dir.display().to_string());
    Ok(TrainCurve { name, train, val, info })
}

/// Trailing mean of the losses logged in the last `window` tokens (t - window, t] at each point:
/// the same span of training for runs that log at different intervals.
pub fn smooth_by_tokens(points: &[(u64, f64)], window: u64) -> Vec<(u64, f64)> {
    let mut lo = 0usize;
    points
        .iter()
        .enumerate()
        .map(|(i, &(t, _))| {
            while lo < i && points[lo].0.saturating_add(window) <= t {
                lo += 1;
            }
            // Summed afresh (not a running sum, whose round-off would drift over a long run).
            let w = &points[lo..=i];
            (t, w.iter().map(|p| p.1).sum::<f64>() / w.len() as f64)
        })
        .collect()
}

/// Quotes a CSV field when it needs it.
fn csv_field(s: &str) -> String {
    match s.contains([',', '"', '\n']) {
        true => format!("\"{}\"", s.replace('"', "\"\"")),
        false => s.to_string(),
    }
}

/// The curves as CSV, one row per logged step and per validation:
/// `run,tokens,train_loss,train_loss_smoothed,val_loss` (blank where a row has no such value).
pub fn train_csv(curves: &[TrainCurve], smoothed: &[Vec<(u64, f64)>]) -> String {
    let mut s = String::from("run,tokens,train_loss,train_loss_smoothed,val_loss\n");
    for (c, sm) in curves.iter().zip(smoothed) {
        let name = csv_field(&c.name);
        for (&(t, l), &(_, m)) in c.train.iter().zip(sm) {
            s += &format!("{name},{t},{l},{m},\n");
        }
        for &(t, v) in &c.val {
            s += &format!("{name},{t},,,{v}\n");
        }
    }
    s
}

/// The runs' table in Markdown: budget, final smoothed training loss, final validation loss, time.
pub fn train_markdown(curves: &[TrainCurve], smoothed: &[Vec<(u64, f64)>], window: u64) -> String {
    let mut s = format!(
        "| run | steps | tokens | final training loss (mean of last {window} tokens) | final val. loss | training time |\n\
         |---|---|---|---|---|---|\n"
    );
    for (c, sm) in curves.iter().zip(smoothed) {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            c.name.replace('|', "\\|"),
            c.info.steps,
            c.info.tokens,
            sm.last().map_or("–".into(), |p| format!("{:.4}", p.1)),
            c.info.final_val_loss.map_or("–".into(), |v| format!("{v:.4}")),
            duration(c.info.elapsed_s)
        );
    }
    s
}

/// The y range that shows the curves past their first `skip` fraction of tokens (the first
/// steps' loss, near ln V, would flatten the rest), with a margin.
pub fn train_y_range(smoothed: &[Vec<(u64, f64)>], val: &[&[(u64, f64)]], skip: f64) -> Option<(f64, f64)> {
    let end = smoothed.iter().flat_map(|s| s.last()).map(|p| p.0).max()?;
    let from = (end as f64 * skip) as u64;
    let ys = smoothed.iter().flat_map(|s| s.iter()).chain(val.iter().flat_map(|v| v.iter()));
    let (lo, hi) = ys
        .filter(|p| p.0 >= from && p.1.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    (lo.is_finite() && hi > lo).then_some((lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)))
}

/// Mean of `loss[lo..hi]`; None when the range is empty or not fully inside the curve.
pub fn range_mean(loss: &[f64], lo: usize, hi: usize) -> Option<f64> {
    (lo < hi && hi <= loss.len()).then(|| loss[lo..hi].iter().sum::<f64>() / (hi - lo) as f64)
}

/// The start of the last quarter of the training context, floor(3T/4) (without overflow).
pub fn late_start(train_context: usize) -> usize {
    train_context - train_context.div_ceil(4)
}

/// One row of the comparison table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub name: String,
    pub final_val_loss: Option<f64>,
    /// Mean L(i) over the last quarter of the training context, [3T/4, T).
    pub late: Option<f64>,
    /// Mean L(i) over the extrapolated range [T, N).
    pub extrapolated: Option<f64>,
    /// The same minus the baseline's.
    pub late_diff: Option<f64>,
    pub extrapolated_diff: Option<f64>,
    pub run: Option<RunInfo>,
}

/// The table: one row per curve, differences against `curves[baseline]`.
pub fn table(curves: &[Curve], baseline: usize, train_context: usize, runs: &[Option<RunInfo>]) -> Vec<Row> {
    let t = train_context;
    let n = curves.iter().map(|c| c.loss.len()).max().unwrap_or(0);
    let late = |c: &Curve| range_mean(&c.loss, late_start(t), t);
    let extra = |c: &Curve| range_mean(&c.loss, t, n);
    let base = &curves[baseline];
    let diff = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
    curves
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let run = runs.get(i).cloned().flatten();
            Row {
                name: c.name.clone(),
                final_val_loss: run.as_ref().and_then(|r| r.final_val_loss),
                late: late(c),
                extrapolated: extra(c),
                late_diff: diff(late(c), late(base)),
                extrapolated_diff: diff(extra(c), extra(base)),
                run,
            }
        })
        .collect()
}

/// Position bands for the table of L(i) over the context: [0, T/32), [T/32, T/8), [T/8, T/4),
/// [T/4, T/2), [T/2, T) inside the training context T, then beyond it [T, 3T/2), [3T/2, 2T), ...
/// up to the evaluated n (the last band cut at n). Where a model's gap to the baseline grows from
/// band to band, its L(i) flattens where the baseline's still falls (SPEC §5's reading of L(i)).
pub fn position_bands(train_context: usize, n: usize) -> Vec<(usize, usize)> {
    let t = train_context;
    let mut edges: Vec<usize> = [0, t / 32, t / 8, t / 4, t / 2, t].iter().map(|&e| e.min(n)).collect();
    let mut e = t;
    while e < n {
        e = e.saturating_add((t / 2).max(1)).min(n);
        edges.push(e);
    }
    edges.dedup();
    edges.windows(2).map(|w| (w[0], w[1])).collect()
}

/// Mean L(i) per band for each curve (None where a band is not inside the curve).
pub fn band_means(curves: &[Curve], bands: &[(usize, usize)]) -> Vec<Vec<Option<f64>>> {
    curves.iter().map(|c| bands.iter().map(|&(lo, hi)| range_mean(&c.loss, lo, hi)).collect()).collect()
}

/// The bands as a Markdown table: each model's mean L(i) per band and, below, its difference to the
/// baseline's.
pub fn bands_markdown(curves: &[Curve], baseline: usize, bands: &[(usize, usize)]) -> String {
    let means = band_means(curves, bands);
    let esc = |s: &str| s.replace('|', "\\|");
    let head: String = bands.iter().map(|(lo, hi)| format!(" [{lo}, {hi}) |")).collect();
    let rule: String = "---|".repeat(bands.len());
    let mut s = format!("| mean L(i), i ∈ |{head}\n|---|{rule}\n");
    for (c, m) in curves.iter().zip(&means) {
        let cells: String = m.iter().map(|v| v.map_or(" – |".to_string(), |v| format!(" {v:.4} |"))).collect();
        s += &format!("| {} |{cells}\n", esc(&c.name));
    }
    s += &format!("\n| Δ vs {} |{head}\n|---|{rule}\n", esc(&curves[baseline].name));
    for (c, m) in curves.iter().zip(&means) {
        let cells: String = m
            .iter()
            .zip(&means[baseline])
            .map(|(a, b)| match (a, b) {
                (Some(a), Some(b)) => format!(" {:+.4} |", a - b),
                _ => " – |".to_string(),
            })
            .collect();
        s += &format!("| {} |{cells}\n", esc(&c.name));
    }
    s
}

/// Minutes and seconds: "4 min 32 s".
fn duration(s: f64) -> String {
    let s = s.round() as u64;
    if s >= 60 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

/// The table in Markdown. `n` is the evaluated context (positions 0..n).
pub fn markdown(rows: &[Row], baseline: &str, train_context: usize, n: usize) -> String {
    let t = train_context;
    let num = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{v:.4}"));
    let signed = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{v:+.4}"));
    let esc = |s: &str| s.replace('|', "\\|");
    let with_runs = rows.iter().any(|r| r.run.is_some());
    let mut s = format!(
        "| model | final val. loss | L(i), i ∈ [{}, {t}) | L(i), i ∈ [{t}, {n}) | Δ [{}, {t}) vs {b} | Δ [{t}, {n}) vs {b} |",
        late_start(t),
        late_start(t),
        b = esc(baseline)
    );
    if with_runs {
        s += " steps | tokens | training time |";
    }
    s += "\n|---|---|---|---|---|---|";
    if with_runs {
        s += "---|---|---|";
    }
    s.push('\n');
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} |",
            esc(&r.name),
            num(r.final_val_loss),
            num(r.late),
            num(r.extrapolated),
            signed(r.late_diff),
            signed(r.extrapolated_diff)
        );
        if with_runs {
            match &r.run {
                Some(run) => s += &format!(" {} | {} | {} |", run.steps, run.tokens, duration(run.elapsed_s)),
                None => s += " – | – | – |",
            }
        }
        s.push('\n');
    }
    s
}

/// Curves with unique names (later duplicates get " (2)", " (3)", ...).
pub fn unique_names(curves: &mut [Curve]) {
    let mut seen: Vec<String> = vec![];
    for c in curves.iter_mut() {
        let mut name = c.name.clone();
        let mut k = 2;
        while seen.contains(&name) {
            name = format!("{} ({k})", c.name);
            k += 1;
        }
        seen.push(name.clone());
        c.name = name;
    }
}

/// Smoothed L(i) of every curve, and of every curve minus the baseline (over the positions both
/// have), as plot series; differences clipped to ±`clip` when given.
pub fn series(
    curves: &[Curve],
    baseline: usize,
    window: usize,
    train_context: usize,
    clip: Option<f64>,
) -> (Vec<crate::eval::plots::Series>, Vec<crate::eval::plots::Series>) {
    use crate::eval::plots::Series;
    let marker = Some(train_context as f64);
    let base = &curves[baseline].loss;
    let mut loss = vec![];
    let mut diff = vec![];
    for c in curves {
        let sm = moving_average(&c.loss, window);
        loss.push(Series {
            name: c.name.clone(),
            points: sm.iter().enumerate().map(|(i, &v)| ((i + 1) as f64, v)).collect(),
            marker_x: marker,
        });
        let m = c.loss.len().min(base.len());
        let d: Vec<f64> = (0..m).map(|i| c.loss[i] - base[i]).collect();
        let d = moving_average(&d, window);
        diff.push(Series {
            name: c.name.clone(),
            points: d
                .iter()
                .enumerate()
                .map(|(i, &v)| ((i + 1) as f64, clip.map_or(v, |cl| v.clamp(-cl, cl))))
                .collect(),
            marker_x: marker,
        });
    }
    (loss, diff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_handle_quotes() {
        assert_eq!(csv_fields("a,\"b,c\",\"d \"\"e\"\"\""), vec!["a", "b,c", "d \"e\""]);
        assert_eq!(csv_fields("1,,2"), vec!["1", "", "2"]);
    }

    #[test]
    fn training_curves_are_smoothed_over_the_same_tokens() {
        let p = [(10, 4.0), (20, 2.0), (30, 6.0), (40, 0.0)];
        // window 20: (t - 20, t] holds this point and the one before it
        assert_eq!(smooth_by_tokens(&p, 20), vec![(10, 4.0), (20, 3.0), (30, 4.0), (40, 3.0)]);
        assert_eq!(smooth_by_tokens(&p, 1), p.to_vec());
        assert_eq!(smooth_by_tokens(&p, 1000).last(), Some(&(40, 3.0)));
        let info = RunInfo { final_val_loss: Some(5.5), steps: 4, tokens: 40, elapsed_s: 61.0 };
        let c = TrainCurve { name: "a,b".into(), train: p.to_vec(), val: vec![(40, 5.5)], info };
        let sm = vec![smooth_by_tokens(&c.train, 20)];
        let csv = train_csv(std::slice::from_ref(&c), &sm);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "run,tokens,train_loss,train_loss_smoothed,val_loss");
        assert_eq!(lines[2], "\"a,b\",20,2,3,");
        assert_eq!(lines[5], "\"a,b\",40,,,5.5");
        let md = train_markdown(std::slice::from_ref(&c), &sm, 20);
        assert!(md.contains("| a,b | 4 | 40 | 3.0000 | 5.5000 | 1 min 01 s |"), "{md}");
        // past the first half: smoothed 4.0, 3.0 and the validation 5.5
        let (lo, hi) = train_y_range(&sm, &[&c.val], 0.5).unwrap();
        assert!((lo - 2.875).abs() < 1e-12 && (hi - 5.625).abs() < 1e-12, "{lo} {hi}");
    }

    #[test]
    fn position_bands_cover_the_context_then_halves_beyond_it() {
        assert_eq!(
            position_bands(2048, 4096),
            vec![(0, 64), (64, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 3072), (3072, 4096)]
        );
        // cut at n, inside or just past the training context
        assert_eq!(position_bands(2048, 1500), vec![(0, 64), (64, 256), (256, 512), (512, 1024), (1024, 1500)]);
        assert_eq!(position_bands(4, 0), vec![]);
        assert_eq!(position_bands(2048, 2500).last(), Some(&(2048, 2500)));
        assert_eq!(position_bands(8, 12), vec![(0, 1), (1, 2), (2, 4), (4, 8), (8, 12)]);
        let curve = |name: &str, loss: Vec<f64>| Curve {
            name: name.into(),
            loss,
            train_context: Some(4),
            source: std::path::PathBuf::from(name),
        };
        let a = curve("a", vec![4.0, 3.0, 2.0, 2.0, 1.0, 1.0]);
        let b = curve("b|c", vec![4.0, 3.5, 3.0, 3.0, 2.5]);
        let bands = position_bands(4, 6);
        assert_eq!(bands, vec![(0, 1), (1, 2), (2, 4), (4, 6)]);
        let md = bands_markdown(&[a, b], 0, &bands);
        assert!(md.contains("| a | 4.0000 | 3.0000 | 2.0000 | 1.0000 |"), "{md}");
        assert!(md.contains("| b\\|c | 4.0000 | 3.5000 | 3.0000 | – |"), "{md}");
        assert!(md.contains("| Δ vs a | [0, 1) | [1, 2) | [2, 4) | [4, 6) |"), "{md}");
        assert!(md.contains("| b\\|c | +0.0000 | +0.5000 | +1.0000 | – |"), "{md}");
    }

    #[test]
    fn range_mean_is_none_outside_the_curve() {
        let l = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(range_mean(&l, 1, 3), Some(2.5));
        assert_eq!(range_mean(&l, 2, 5), None);
        assert_eq!(range_mean(&l, 2, 2), None);
        assert_eq!(duration(272.4), "4 min 32 s");
        assert_eq!(duration(9.0), "9 s");
        assert_eq!((late_start(2048), late_start(10), late_start(usize::MAX)), (1536, 7, usize::MAX / 4 * 3 + 2));
    }
}
