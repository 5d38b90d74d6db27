//! Plots as PNG (or SVG, by the file's extension), with an embedded font so text renders without
//! system fonts: line series (loss curves, per-position loss) and heatmaps (needle-in-a-haystack
//! grids, forget and attention matrices).
//!
//! The font is DejaVu Sans (assets/fonts/, licence beside it), compiled into the binary.

use anyhow::{anyhow, bail, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");
/// The family name the embedded font is registered under.
pub const FONT_FAMILY: &str = "sans-serif";

/// Registers the embedded font under [`FONT_FAMILY`] (once per process).
pub fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT);
    });
}

/// One named line of (x, y) points.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Also mark each point with a dot (for sparse series such as periodic validation).
    pub markers: bool,
    /// The palette colour to draw it in (None: its index), so two series can share one.
    pub color: Option<usize>,
    /// Draw the line dashed (e.g. validation beside the training curve of the same colour).
    pub dashed: bool,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { name: name.into(), points, markers: false, color: None, dashed: false }
    }

    /// The same series with each point marked.
    pub fn with_markers(mut self) -> Self {
        self.markers = true;
        self
    }

    /// The same series with a dashed line.
    pub fn dashed(mut self) -> Self {
        self.dashed = true;
        self
    }

    /// The same series in palette colour `i`.
    pub fn with_color(mut self, i: usize) -> Self {
        self.color = Some(i);
        self
    }
}

type DrawResult = Result<(), Box<dyn std::error::Error + 'static>>;

/// Draws a chart into `path`: SVG when it ends in .svg (`svg`), else PNG (`png`); the two closures
/// are the chart's one generic `draw`, once per plotters backend.
fn save_as(
    path: &Path,
    size: (u32, u32),
    svg: impl FnOnce(DrawingArea<SVGBackend, Shift>) -> DrawResult,
    png: impl FnOnce(DrawingArea<BitMapBackend, Shift>) -> DrawResult,
) -> Result<()> {
    register_font();
    let res = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg")) {
        svg(SVGBackend::new(path, size).into_drawing_area())
    } else {
        png(BitMapBackend::new(path, size).into_drawing_area())
    };
    res.map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))
}

/// A line chart.
#[derive(Clone, Debug)]
pub struct LinePlot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub log_x: bool,
    pub log_y: bool,
    /// Fixed y range; None fits the data (with a margin).
    pub y_range: Option<(f64, f64)>,
    pub width: u32,
    pub height: u32,
}

impl LinePlot {
    pub fn new(title: impl Into<String>, x_label: impl Into<String>, y_label: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: Vec::new(),
            log_x: false,
            log_y: false,
            y_range: None,
            width: 1000,
            height: 640,
        }
    }

    pub fn series(mut self, s: Series) -> Self {
        self.series.push(s);
        self
    }

    /// Writes the chart to `path`: SVG when it ends in .svg, else PNG.
    pub fn save(&self, path: &Path) -> Result<()> {
        save_as(path, (self.width, self.height), |a| self.draw(a), |a| self.draw(a))
    }

    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        let pts =
            self.series.iter().flat_map(|s| s.points.iter()).filter(|(x, y)| {
                x.is_finite() && y.is_finite() && (!self.log_x || *x > 0.0) && (!self.log_y || *y > 0.0)
            });
        let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if !x0.is_finite() {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if let Some((a, b)) = self.y_range {
            (y0, y1) = (a, b);
        } else if self.log_y {
            (y0, y1) = (y0 / 1.05, y1 * 1.05);
        } else {
            let m = ((y1 - y0) * 0.05).max(1e-6);
            (y0, y1) = (y0 - m, y1 + m);
        }
        let font = (FONT_FAMILY, 16).into_font();
        let mut builder = ChartBuilder::on(&root);
        builder.caption(&self.title, (FONT_FAMILY, 24)).margin(16).x_label_area_size(48).y_label_area_size(72);
        macro_rules! body {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(&self.x_label)
                    .y_desc(&self.y_label)
                    .label_style(font.clone())
                    .x_label_formatter(&|x| tick(*x))
                    .y_label_formatter(&|y| tick(*y))
                    .axis_desc_style((FONT_FAMILY, 18))
                    .light_line_style(RGBColor(235, 235, 235))
                    .draw()?;
                for (i, s) in self.series.iter().enumerate() {
                    let color = Palette99::pick(s.color.unwrap_or(i)).to_rgba();
                    let data: Vec<(f64, f64)> = s
                        .points
                        .iter()
                        .copied()
                        .filter(|(x, y)| {
                            x.is_finite() && y.is_finite() && (!self.log_x || *x > 0.0) && (!self.log_y || *y > 0.0)
                        })
                        .collect();
                    let style = ShapeStyle::from(&color).stroke_width(2);
                    if s.markers {
                        chart.draw_series(data.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
                    }
                    let dashed = s.dashed;
                    let drawn = match dashed {
                        true => chart.draw_series(DashedLineSeries::new(data, 6, 5, style))?,
                        false => chart.draw_series(LineSeries::new(data, style))?,
                    };
                    if !s.name.is_empty() {
                        drawn.label(s.name.clone()).legend(move |(x, y)| {
                            let st = ShapeStyle::from(&color).stroke_width(2);
                            // two segments, with a gap when dashed
                            let (a, b) = if dashed { (7, 12) } else { (10, 10) };
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (a, 0)], st)
                                + PathElement::new(vec![(b, 0), (20, 0)], st)
                        });
                    }
                }
                if self.series.iter().any(|s| !s.name.is_empty()) {
                    chart
                        .configure_series_labels()
                        .label_font(font.clone())
                        .background_style(WHITE.mix(0.85))
                        .border_style(BLACK)
                        .position(SeriesLabelPosition::UpperRight)
                        .draw()?;
                }
            }};
        }
        match (self.log_x, self.log_y) {
            (false, false) => body!(builder.build_cartesian_2d(x0..x1, y0..y1)?),
            (true, false) => body!(builder.build_cartesian_2d((x0..x1).log_scale(), y0..y1)?),
            (false, true) => body!(builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?),
            (true, true) => body!(builder.build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?),
        }
        root.present()?;
        Ok(())
    }
}

/// Shorthand: a line chart of `series` to `path` (PNG, or SVG by extension).
pub fn line_plot(path: &Path, title: &str, x_label: &str, y_label: &str, series: &[Series]) -> Result<()> {
    let mut p = LinePlot::new(title, x_label, y_label);
    p.series = series.to_vec();
    p.save(path)
}

/// A heatmap of `values` (rows × cols, row-major; NaN cells are drawn grey), colour scale
/// from `range` (or the data's min/max), with row and column tick labels.
#[derive(Clone, Debug)]
pub struct Heatmap {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub rows: usize,
    pub cols: usize,
    pub values: Vec<f64>,
    /// Labels of the columns (x) and rows (y); empty for indices.
    pub col_labels: Vec<String>,
    pub row_labels: Vec<String>,
    pub range: Option<(f64, f64)>,
    /// Write each cell's value in it (for small grids).
    pub annotate: bool,
    pub width: u32,
    pub height: u32,
}

impl Heatmap {
    pub fn new(title: impl Into<String>, rows: usize, cols: usize, values: Vec<f64>) -> Self {
        Self {
            title: title.into(),
            x_label: String::new(),
            y_label: String::new(),
            rows,
            cols,
            values,
            col_labels: Vec::new(),
            row_labels: Vec::new(),
            range: None,
            annotate: false,
            width: 900,
            height: 760,
        }
    }

    /// Writes the heatmap to `path`: SVG when it ends in .svg, else PNG.
    pub fn save(&self, path: &Path) -> Result<()> {
        if self.values.len() != self.rows * self.cols || self.rows == 0 || self.cols == 0 {
            bail!("heatmap: {} values for {} x {} cells", self.values.len(), self.rows, self.cols);
        }
        save_as(path, (self.width, self.height), |a| self.draw(a), |a| self.draw(a))
    }

    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        let finite = self.values.iter().copied().filter(|v| v.is_finite());
        let (lo, hi) = self
            .range
            .unwrap_or_else(|| finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v))));
        let (lo, hi) = if lo.is_finite() && hi > lo { (lo, hi) } else { (lo.min(0.0), lo.min(0.0) + 1.0) };
        let (main, bar) = root.split_horizontally(self.width.saturating_sub(110));
        let (rows, cols) = (self.rows as i32, self.cols as i32);
        let mut chart = ChartBuilder::on(&main)
            .caption(&self.title, (FONT_FAMILY, 22))
            .margin(12)
            .x_label_area_size(56)
            .y_label_area_size(80)
            .build_cartesian_2d((0..cols - 1).into_segmented(), (0..rows - 1).into_segmented())?;
        // Row 0 at the top: row r is drawn in segment rows - 1 - r.
        let (cl, rl) = (self.col_labels.clone(), self.row_labels.clone());
        let seg_label = |labels: &[String], v: &SegmentValue<i32>, flip: Option<i32>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                let i = flip.map_or(*i, |n| n - 1 - *i);
                if i < 0 {
                    String::new()
                } else if labels.is_empty() {
                    format!("{i}")
                } else {
                    labels.get(i as usize).cloned().unwrap_or_default()
                }
            }
            SegmentValue::Last => String::new(),
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_labels(self.cols.min(24))
            .y_labels(self.rows.min(24))
            .x_label_formatter(&|x| seg_label(&cl, x, None))
            .y_label_formatter(&|y| seg_label(&rl, y, Some(rows)))
            .label_style((FONT_FAMILY, 14))
            .axis_desc_style((FONT_FAMILY, 16))
            .draw()?;
        let cells = (0..self.rows).flat_map(|r| (0..self.cols).map(move |c| (r, c)));
        chart.draw_series(cells.map(|(r, c)| {
            let v = self.values[r * self.cols + c];
            let color =
                if v.is_finite() { colormap(((v - lo) / (hi - lo)).clamp(0.0, 1.0)) } else { RGBColor(200, 200, 200) };
            let (x, y) = (c as i32, rows - 1 - r as i32);
            Rectangle::new(
                [
                    (SegmentValue::Exact(x), SegmentValue::Exact(y)),
                    (SegmentValue::Exact(x + 1), SegmentValue::Exact(y + 1)),
                ],
                color.filled(),
            )
        }))?;
        if self.annotate {
            use plotters::style::text_anchor::{HPos, Pos, VPos};
            for r in 0..self.rows {
                for c in 0..self.cols {
                    let v = self.values[r * self.cols + c];
                    if v.is_finite() {
                        let t = ((v - lo) / (hi - lo)).clamp(0.0, 1.0);
                        let color = if t > 0.6 { BLACK } else { WHITE };
                        let style =
                            (FONT_FAMILY, 13).into_font().color(&color).pos(Pos::new(HPos::Center, VPos::Center));
                        chart.draw_series(std::iter::once(Text::new(
                            format!("{v:.2}"),
                            (SegmentValue::CenterOf(c as i32), SegmentValue::CenterOf(rows - 1 - r as i32)),
                            style,
                        )))?;
                    }
                }
            }
        }
        // Colour bar.
        let mut cb = ChartBuilder::on(&bar)
            .margin_top(52)
            .margin_bottom(68)
            .margin_right(8)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..1f64, lo..hi)?;
        cb.configure_mesh()
            .disable_mesh()
            .disable_x_axis()
            .y_labels(6)
            .y_label_formatter(&|y| tick(*y))
            .label_style((FONT_FAMILY, 13))
            .draw()?;
        let steps = 100;
        cb.draw_series((0..steps).map(|i| {
            let a = lo + (hi - lo) * i as f64 / steps as f64;
            let b = lo + (hi - lo) * (i + 1) as f64 / steps as f64;
            Rectangle::new([(0.0, a), (1.0, b)], colormap(i as f64 / (steps - 1) as f64).filled())
        }))?;
        root.present()?;
        Ok(())
    }
}

/// A compact tick label: 12.5k, 3M, 0.25, 1e-4.
pub fn tick(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a == 0.0 {
        "0".into()
    } else if a >= 1e9 {
        trim(format!("{:.2}", v / 1e9)) + "G"
    } else if a >= 1e6 {
        trim(format!("{:.2}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 1e-3 {
        trim(format!("{v:.3}"))
    } else {
        format!("{v:.0e}")
    }
}

/// A viridis-like colour map, t in [0, 1].
pub fn colormap(t: f64) -> RGBColor {
    const STOPS: [(f64, f64, f64); 5] =
        [(68.0, 1.0, 84.0), (59.0, 82.0, 139.0), (33.0, 145.0, 140.0), (94.0, 201.0, 98.0), (253.0, 231.0, 37.0)];
    let x = t.clamp(0.0, 1.0) * (STOPS.len() - 1) as f64;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let f = x - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |p: f64, q: f64| (p + (q - p) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_png_line_plot_and_heatmap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("loss.png");
        let s1 = Series::new("train", (1..100).map(|i| (i as f64, 10.0 / (i as f64).sqrt())).collect());
        let s2 = Series::new("val", (1..10).map(|i| (i as f64 * 10.0, 11.0 / (i as f64 * 10.0).sqrt())).collect());
        line_plot(&p, "Loss", "tokens", "loss (nats)", &[s1, s2]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let h = dir.path().join("h.svg");
        let mut hm = Heatmap::new("grid", 2, 3, vec![0.0, 0.5, 1.0, f64::NAN, 0.25, 0.75]);
        hm.annotate = true;
        hm.save(&h).unwrap();
        assert!(std::fs::read_to_string(&h).unwrap().contains("<svg"));
        assert!(Heatmap::new("bad", 2, 2, vec![1.0]).save(&h).is_err());
    }
}
