//! PNG figures of the evaluations, drawn with `plotters` on its bitmap backend. Text is rendered
//! with the DejaVu Sans font embedded in the binary (assets/fonts/), so no system font is needed.

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

// One embedded font for every plot: the one plot.rs registers.
pub use crate::plot::{register_font as ensure_font, FONT_FAMILY as FONT};

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e:?}")
}

/// The cell a label of a segmented axis stands at (None past the last).
fn segment(v: &SegmentValue<i32>) -> Option<usize> {
    match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => Some(*i as usize),
        SegmentValue::Last => None,
    }
}

/// Distinguishable line colours (matplotlib's tab10).
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One line of a line chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// A dashed vertical line at this x (e.g. the model's training context), in the series colour.
    pub marker_x: Option<f64>,
}

/// A line chart of several series with a legend. `log_x`: logarithmic x axis (x must be > 0).
pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_x: bool,
    pub log_y: bool,
    /// Legend text of the dashed markers (e.g. "training context").
    pub marker_label: &'a str,
}

fn range_of(vals: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        if hi <= lo {
            return (lo / 2.0, hi * 2.0);
        }
        let r = (hi / lo).powf(0.04);
        (lo / r, hi * r)
    } else {
        if hi <= lo {
            return (lo - 0.5, hi + 0.5);
        }
        let pad = (hi - lo) * 0.04;
        (lo - pad, hi + pad)
    }
}

/// A tick label: integers plainly ("16", "1000"), large values in thousands ("16k"),
/// others with three significant digits.
pub fn tick_label(v: f64) -> String {
    let a = v.abs();
    if a >= 10_000.0 {
        let k = v / 1000.0;
        if (k - k.round()).abs() < 1e-9 {
            format!("{}k", k.round())
        } else {
            format!("{k:.1}k")
        }
    } else if (v - v.round()).abs() < 1e-9 * a.max(1.0) {
        format!("{}", v.round())
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Formats a tick value.
type Fmt<'a> = &'a dyn Fn(&f64) -> String;

/// Tick labels of an axis over [lo, hi]: [`tick_label`] on a log axis (ticks a decade apart); on
/// a linear one, as many decimals as the tick spacing (about a tenth of the range) needs.
pub fn axis_labels(log: bool, lo: f64, hi: f64) -> Box<dyn Fn(&f64) -> String> {
    if log {
        return Box::new(|v: &f64| tick_label(*v));
    }
    let step = ((hi - lo) / 10.0).abs();
    if step >= 1.0 || step == 0.0 || !step.is_finite() {
        return Box::new(|v: &f64| tick_label(*v));
    }
    let decimals = (-step.log10()).ceil().clamp(0.0, 8.0) as usize;
    Box::new(move |v: &f64| format!("{v:.decimals$}"))
}

/// At most about `max` points of a series, keeping the first and last: evenly spaced in x on a
/// linear axis, log-spaced on a log axis. Curves with more points than pixels draw badly.
pub fn thin(points: &[(f64, f64)], max: usize, log_x: bool) -> Vec<(f64, f64)> {
    if points.len() <= max {
        return points.to_vec();
    }
    let key = |x: f64| if log_x { x.max(1e-300).ln() } else { x };
    let (lo, hi) = (key(points[0].0), key(points[points.len() - 1].0));
    let mut out = vec![points[0]];
    let mut next = lo;
    let step = (hi - lo) / max as f64;
    for &p in &points[1..points.len() - 1] {
        if key(p.0) >= next + step {
            out.push(p);
            next = key(p.0);
        }
    }
    out.push(points[points.len() - 1]);
    out
}

impl LineChart<'_> {
    pub fn draw(&self, path: &Path, series: &[Series]) -> Result<()> {
        ensure_font();
        let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let series: Vec<Series> = series
            .iter()
            .map(|s| Series { name: s.name.clone(), points: thin(&s.points, 600, self.log_x), marker_x: s.marker_x })
            .collect();
        let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0).chain(s.marker_x));
        let (x0, x1) = range_of(xs, self.log_x);
        let (y0, y1) = range_of(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), self.log_y);
        // A log y axis only helps over a decade or more; below that it has almost no ticks.
        let log_y = self.log_y && y1 / y0 >= 10.0;
        let (y0, y1) = if log_y == self.log_y {
            (y0, y1)
        } else {
            range_of(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), false)
        };
        let fx = axis_labels(self.log_x, x0, x1);
        let fy = axis_labels(log_y, y0, y1);
        let f = (&*fx, &*fy);
        match (self.log_x, log_y) {
            (true, true) => self.draw_on(&root, &series, (x0..x1).log_scale(), (y0..y1).log_scale(), (y0, y1), f),
            (true, false) => self.draw_on(&root, &series, (x0..x1).log_scale(), y0..y1, (y0, y1), f),
            (false, true) => self.draw_on(&root, &series, x0..x1, (y0..y1).log_scale(), (y0, y1), f),
            (false, false) => self.draw_on(&root, &series, x0..x1, y0..y1, (y0, y1), f),
        }?;
        root.present().map_err(|e| anyhow!("writing {}: {e:?}", path.display()))
    }

    fn draw_on<X, Y>(
        &self,
        root: &DrawingArea<BitMapBackend<'_>, Shift>,
        series: &[Series],
        x: X,
        y: Y,
        (y0, y1): (f64, f64),
        (fx, fy): (Fmt<'_>, Fmt<'_>),
    ) -> Result<()>
    where
        X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
        Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
        X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
        Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
    {
        let mut chart = ChartBuilder::on(root)
            .caption(self.title, (FONT, 26))
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(78)
            .build_cartesian_2d(x, y)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .x_label_formatter(&fx)
            .y_label_formatter(&fy)
            .label_style((FONT, 17))
            .axis_desc_style((FONT, 20))
            .x_labels(10)
            .y_labels(8)
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(205, 205, 205))
            .draw()
            .map_err(err)?;
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(s.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
        }
        let mut marker_legend = false;
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            if let Some(mx) = s.marker_x {
                let line = vec![(mx, y0), (mx, y1)];
                let a = chart.draw_series(DashedLineSeries::new(line, 8, 6, color.stroke_width(2))).map_err(err)?;
                if !marker_legend {
                    marker_legend = true;
                    a.label(self.marker_label).legend(move |(x, y)| {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (7, 0)], BLACK.stroke_width(2))
                            + PathElement::new(vec![(12, 0), (19, 0)], BLACK.stroke_width(2))
                    });
                }
            }
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 17))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

/// Linear interpolation through colour stops at even spacing; `v` in [0, 1].
pub fn colormap(stops: &[(u8, u8, u8)], v: f64) -> RGBColor {
    let v = if v.is_finite() { v.clamp(0.0, 1.0) } else { 0.0 };
    let x = v * (stops.len() - 1) as f64;
    let i = (x.floor() as usize).min(stops.len() - 2);
    let f = x - i as f64;
    let (a, b) = (stops[i], stops[i + 1]);
    let mix = |p: u8, q: u8| (p as f64 + (q as f64 - p as f64) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Viridis, sampled at 9 stops.
pub const VIRIDIS: [(u8, u8, u8); 9] = [
    (68, 1, 84),
    (71, 44, 122),
    (59, 81, 139),
    (44, 113, 142),
    (33, 144, 141),
    (39, 173, 129),
    (92, 200, 99),
    (170, 220, 50),
    (253, 231, 37),
];

/// Red through yellow to green (a score of 0 is red, full marks green).
pub const RED_GREEN: [(u8, u8, u8); 3] = [(215, 48, 39), (254, 224, 139), (26, 152, 80)];

/// A colour bar beside a heatmap: the map from `lo` to `hi` with `ticks` labelled values.
pub fn colorbar(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    stops: &[(u8, u8, u8)],
    lo: f64,
    hi: f64,
    label: &str,
    tick_fmt: impl Fn(f64) -> String,
) -> Result<()> {
    let mut chart = ChartBuilder::on(area)
        .margin_top(40)
        .margin_bottom(60)
        .margin_right(8)
        .y_label_area_size(0)
        .right_y_label_area_size(62)
        .build_cartesian_2d(0f64..1f64, lo..hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_y_mesh()
        .disable_x_axis()
        .y_labels(6)
        .y_label_formatter(&|v| tick_fmt(*v))
        .y_desc(label)
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 17))
        .draw()
        .map_err(err)?;
    let n = 100;
    chart
        .draw_series((0..n).map(|i| {
            let a = lo + (hi - lo) * i as f64 / n as f64;
            let b = lo + (hi - lo) * (i + 1) as f64 / n as f64;
            Rectangle::new([(0.0, a), (1.0, b)], colormap(stops, (i as f64 + 0.5) / n as f64).filled())
        }))
        .map_err(err)?;
    Ok(())
}

/// A matrix drawn as coloured cells inside `area`, row 0 at the top. Values are mapped by
/// `norm` to [0, 1]; NaN cells are left light grey.
#[allow(clippy::too_many_arguments)]
pub fn matrix_panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    m: &[f32],
    rows: usize,
    cols: usize,
    title: &str,
    stops: &[(u8, u8, u8)],
    norm: impl Fn(f64) -> f64,
    axis_labels: (&str, &str),
) -> Result<()> {
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 17))
        .margin(6)
        .x_label_area_size(34)
        .y_label_area_size(44)
        .build_cartesian_2d(0f64..cols as f64, rows as f64..0f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(5)
        .y_labels(5)
        .x_label_formatter(&|v| format!("{}", v.round() as i64))
        .y_label_formatter(&|v| format!("{}", v.round() as i64))
        .x_desc(axis_labels.0)
        .y_desc(axis_labels.1)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(err)?;
    let grey = RGBColor(240, 240, 240);
    chart
        .draw_series((0..rows).flat_map(|i| (0..cols).map(move |j| (i, j))).map(|(i, j)| {
            let v = m[i * cols + j] as f64;
            let c = if v.is_nan() { grey } else { colormap(stops, norm(v)) };
            Rectangle::new([(j as f64, i as f64), (j as f64 + 1.0, i as f64 + 1.0)], c.filled())
        }))
        .map_err(err)?;
    Ok(())
}

/// The needle-test heatmap: context lengths across, depths down (0 % at the top), each cell
/// coloured red (0) to green (10) and labelled with its score; a dashed line marks the training
/// context. `scores[depth_index * lengths.len() + length_index]`.
pub fn niah_heatmap(
    path: &Path,
    title: &str,
    lengths: &[usize],
    depths: &[f64],
    scores: &[f64],
    train_context: Option<usize>,
) -> Result<()> {
    use plotters::coord::ranged1d::{IntoSegmentedCoord, SegmentValue};
    ensure_font();
    let (cols, rows) = (lengths.len(), depths.len());
    let w = (200 + 78 * cols as u32 + 120).max(760);
    let h = (170 + 38 * rows as u32).max(420);
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, (FONT, 22)).map_err(err)?;
    let (main, bar) = root.split_horizontally(w - 120);
    // The boundary after the last column whose length is within the training context.
    let marker = train_context
        .map(|tc| (tc, lengths.iter().take_while(|&&l| l <= tc).count()))
        .filter(|&(_, k)| k > 0 && k < cols);
    let x_desc = match marker {
        Some((tc, _)) => format!("context length (tokens); dashed line: training context ({tc})"),
        None => "context length (tokens)".to_string(),
    };
    let marker = marker.map(|m| m.1);
    let mut chart = ChartBuilder::on(&main)
        .margin(12)
        .x_label_area_size(52)
        .y_label_area_size(90)
        .build_cartesian_2d((0..cols as i32 - 1).into_segmented(), (0..rows as i32 - 1).into_segmented())
        .map_err(err)?;
    let xfmt =
        |v: &SegmentValue<i32>| segment(v).and_then(|i| lengths.get(i)).map(|l| l.to_string()).unwrap_or_default();
    // Row r (from the bottom) shows depth index rows − 1 − r, so depth 0 is at the top.
    let yfmt = |v: &SegmentValue<i32>| {
        segment(v).filter(|&r| r < rows).map(|r| format!("{}", depths[rows - 1 - r])).unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(cols)
        .y_labels(rows)
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .x_desc(x_desc.as_str())
        .y_desc("needle depth (%)")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 18))
        .draw()
        .map_err(err)?;
    let cell = |j: usize, r: usize| scores[(rows - 1 - r) * cols + j];
    chart
        .draw_series((0..rows).flat_map(|r| (0..cols).map(move |j| (j, r))).map(|(j, r)| {
            let s = cell(j, r);
            let c = if s.is_nan() { RGBColor(200, 200, 200) } else { colormap(&RED_GREEN, s / 10.0) };
            Rectangle::new(
                [
                    (SegmentValue::Exact(j as i32), SegmentValue::Exact(r as i32)),
                    (SegmentValue::Exact(j as i32 + 1), SegmentValue::Exact(r as i32 + 1)),
                ],
                c.filled(),
            )
        }))
        .map_err(err)?;
    // White lines between cells.
    chart
        .draw_series((0..rows).flat_map(|r| (0..cols).map(move |j| (j, r))).map(|(j, r)| {
            Rectangle::new(
                [
                    (SegmentValue::Exact(j as i32), SegmentValue::Exact(r as i32)),
                    (SegmentValue::Exact(j as i32 + 1), SegmentValue::Exact(r as i32 + 1)),
                ],
                WHITE.stroke_width(1),
            )
        }))
        .map_err(err)?;
    let label_style =
        TextStyle::from((FONT, 14).into_font()).color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Center,
        ));
    chart
        .draw_series((0..rows).flat_map(|r| (0..cols).map(move |j| (j, r))).map(|(j, r)| {
            let s = cell(j, r);
            let text = if s.is_nan() { "-".to_string() } else { format!("{s:.1}") };
            Text::new(text, (SegmentValue::CenterOf(j as i32), SegmentValue::CenterOf(r as i32)), label_style.clone())
        }))
        .map_err(err)?;
    if let Some(k) = marker {
        let line = vec![
            (SegmentValue::Exact(k as i32), SegmentValue::Exact(0)),
            (SegmentValue::Exact(k as i32), SegmentValue::Last),
        ];
        chart.draw_series(DashedLineSeries::new(line, 10, 6, BLACK.stroke_width(3))).map_err(err)?;
    }
    colorbar(&bar, &RED_GREEN, 0.0, 10.0, "score", |v| format!("{v:.0}"))?;
    root.present().map_err(|e| anyhow!("writing {}: {e:?}", path.display()))
}

fn format_memory(m: f64) -> String {
    if !m.is_finite() {
        "inf".into()
    } else if m >= 10_000.0 {
        format!("{:.0}k", m / 1000.0)
    } else if m >= 100.0 {
        format!("{m:.0}")
    } else {
        format!("{m:.1}")
    }
}

/// Heatmap of every head's effective memory length (layers down, heads across), on a log scale.
pub fn memory_heatmap(
    path: &Path,
    title: &str,
    stats: &[crate::eval::gates::HeadGate],
    layers: usize,
    heads: usize,
) -> Result<()> {
    use plotters::coord::ranged1d::{IntoSegmentedCoord, SegmentValue};
    ensure_font();
    let w = (200 + 64 * heads as u32 + 120).max(700);
    let h = (170 + 36 * layers as u32).max(380);
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, (FONT, 20)).map_err(err)?;
    let (main, bar) = root.split_horizontally(w - 120);
    let finite_max = stats.iter().map(|s| s.memory_length).filter(|m| m.is_finite()).fold(1.0f64, f64::max);
    let top = finite_max.log10().ceil().max(1.0);
    let mut chart = ChartBuilder::on(&main)
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(70)
        .build_cartesian_2d((0..heads as i32 - 1).into_segmented(), (0..layers as i32 - 1).into_segmented())
        .map_err(err)?;
    let xfmt = |v: &SegmentValue<i32>| segment(v).filter(|&i| i < heads).map(|i| i.to_string()).unwrap_or_default();
    let yfmt = |v: &SegmentValue<i32>| {
        segment(v).filter(|&r| r < layers).map(|r| (layers - 1 - r).to_string()).unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(heads)
        .y_labels(layers)
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .x_desc("head")
        .y_desc("layer")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 18))
        .draw()
        .map_err(err)?;
    let at =
        |j: usize, r: usize| stats.iter().find(|s| s.layer == layers - 1 - r && s.head == j).map(|s| s.memory_length);
    chart
        .draw_series((0..layers).flat_map(|r| (0..heads).map(move |j| (j, r))).map(|(j, r)| {
            let m = at(j, r).unwrap_or(f64::NAN);
            let v = if m.is_infinite() { 1.0 } else { m.max(1.0).log10() / top };
            let c = if m.is_nan() { RGBColor(200, 200, 200) } else { colormap(&VIRIDIS, v) };
            Rectangle::new(
                [
                    (SegmentValue::Exact(j as i32), SegmentValue::Exact(r as i32)),
                    (SegmentValue::Exact(j as i32 + 1), SegmentValue::Exact(r as i32 + 1)),
                ],
                c.filled(),
            )
        }))
        .map_err(err)?;
    let centre = plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Center,
    );
    chart
        .draw_series((0..layers).flat_map(|r| (0..heads).map(move |j| (j, r))).map(|(j, r)| {
            let m = at(j, r).unwrap_or(f64::NAN);
            let v = if m.is_infinite() { 1.0 } else { m.max(1.0).log10() / top };
            // Dark text on the light (yellow-green) end of viridis, white on the dark end.
            let color: &'static RGBColor = if v > 0.6 { &BLACK } else { &WHITE };
            let style = TextStyle::from((FONT, 13).into_font()).color(color).pos(centre);
            Text::new(format_memory(m), (SegmentValue::CenterOf(j as i32), SegmentValue::CenterOf(r as i32)), style)
        }))
        .map_err(err)?;
    colorbar(&bar, &VIRIDIS, 0.0, top, "memory length (tokens)", |v| format!("{}", 10f64.powf(v).round()))?;
    root.present().map_err(|e| anyhow!("writing {}: {e:?}", path.display()))
}

/// One layer's figure: for each chosen head, the forget matrix (top row) and the attention map
/// (bottom row, log colour scale from 1e-4 to 1), with colour bars on the right.
pub fn gate_maps(
    path: &Path,
    layer: usize,
    panels: &[(usize, Vec<f32>, Vec<f32>)],
    stats: &[&crate::eval::gates::HeadGate],
    t: usize,
) -> Result<()> {
    ensure_font();
    let n = panels.len().max(1) as u32;
    let panel = 300u32;
    let bar_w = 130u32;
    let w = panel * n + bar_w;
    let h = 2 * panel + 50;
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    // The long title fits from three panels on; narrower figures get the short one.
    let title = if n >= 3 {
        format!("Layer {layer}: forget matrix F_ij = exp(c_i - c_j) (top), attention (bottom); {t} tokens")
    } else {
        format!("Layer {layer}, {t} tokens")
    };
    let root = root.titled(&title, (FONT, 20)).map_err(err)?;
    let (grid, bars) = root.split_horizontally(panel * n);
    let cells = grid.split_evenly((2, n as usize));
    let log_floor = -4.0;
    for (k, (head, f, p)) in panels.iter().enumerate() {
        let mem = format_memory(stats[k].memory_length);
        matrix_panel(
            &cells[k],
            f,
            t,
            t,
            &format!("head {head}: forget (memory {mem})"),
            &VIRIDIS,
            |v| v,
            ("key j", "query i"),
        )?;
        matrix_panel(
            &cells[n as usize + k],
            p,
            t,
            t,
            &format!("head {head}: attention"),
            &VIRIDIS,
            |v| (v.max(1e-30).log10() - log_floor) / -log_floor,
            ("key j", "query i"),
        )?;
    }
    let bar_cells = bars.split_evenly((2, 1));
    colorbar(&bar_cells[0], &VIRIDIS, 0.0, 1.0, "F_ij", |v| format!("{v:.1}"))?;
    colorbar(&bar_cells[1], &VIRIDIS, log_floor, 0.0, "log10 attention", |v| format!("{v:.0}"))?;
    root.present().map_err(|e| anyhow!("writing {}: {e:?}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colormap_hits_its_stops() {
        assert_eq!(colormap(&RED_GREEN, 0.0), RGBColor(215, 48, 39));
        assert_eq!(colormap(&RED_GREEN, 1.0), RGBColor(26, 152, 80));
        assert_eq!(colormap(&RED_GREEN, 0.5), RGBColor(254, 224, 139));
    }
}
