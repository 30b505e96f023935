//! The report's charts as SVG (plotters' SVG backend: text stays `<text>` for the viewer's
//! fonts, so nothing is loaded at build or run time).
//!
//! Colours are fixed per meaning across every chart: one per dimension ([`DIM_COLORS`], with
//! [`TIE_COLOR`] for a shared maximum), one per pair outcome ([`OUTCOME_COLORS`]), and one per
//! variant by its position in the input ([`variant_color`]), from the Okabe-Ito palette so that
//! the dimensions stay distinguishable with the common colour-vision deficiencies.

use std::error::Error;
use std::ops::Range;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::accum::{Acc, VariantAcc, WeightAcc};
use super::tables::{
    DIM_NAMES, DOMINANT_NAMES, OUTCOME_NAMES, dominant_shares, label_cells, tactic_emotions,
    used_labels, variant_name, violation_counts, wsum_labels,
};

/// Cognitive, Affective, Proactive.
pub const DIM_COLORS: [RGBColor; 3] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
];
/// A shared maximum (no single dominant dimension), and a tied pair.
pub const TIE_COLOR: RGBColor = RGBColor(0x99, 0x99, 0x99);
/// Win, tie, loss.
pub const OUTCOME_COLORS: [RGBColor; 3] = [
    RGBColor(0xE6, 0x9F, 0x00),
    TIE_COLOR,
    RGBColor(0xCC, 0x79, 0xA7),
];
const VARIANT_COLORS: [RGBColor; 8] = [
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0x33, 0x33, 0x33),
    RGBColor(0xB8, 0xA0, 0x00),
    RGBColor(0x8C, 0x56, 0x4B),
    RGBColor(0x6A, 0x3D, 0x9A),
    RGBColor(0x1B, 0x9E, 0x77),
];
/// The colour of the variant at input position `i` (the same in every chart).
pub fn variant_color(i: usize) -> RGBColor {
    VARIANT_COLORS[i % VARIANT_COLORS.len()]
}

/// The dominant-dimension colours: the three dimensions, then ties.
pub const DOMINANT_COLORS: [RGBColor; 4] = [DIM_COLORS[0], DIM_COLORS[1], DIM_COLORS[2], TIE_COLOR];

const FONT: &str = "sans-serif";
const AXIS: RGBColor = RGBColor(0x44, 0x44, 0x44);

/// One rendered chart.
#[derive(Clone, Debug)]
pub struct Chart {
    /// File name in the report directory (`<stem>.svg`).
    pub file: String,
    /// Heading.
    pub title: String,
    /// The SVG document.
    pub svg: String,
    /// The legend: series names and their colours (what a test looks for).
    pub series: Vec<(String, RGBColor)>,
}

type Res = Result<(), Box<dyn Error>>;
/// A panel of stacked bars: its name, category labels, and the stacked values per category.
pub(super) type StackedPanel = (String, Vec<String>, Vec<Vec<f64>>);
/// A series of bars: name, colour, and `(k, n)` per category.
pub type CountSeries = (String, RGBColor, Vec<(u64, u64)>);
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// `#RRGGBB` of a colour, as the SVG backend writes it.
pub fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// An axis over `lo..hi` whose grid and labels sit exactly at `ticks` (category positions or
/// turns), thinned evenly when there are more ticks than room.
#[derive(Clone, Debug)]
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Axis {
    /// `n` categories at `0..n`.
    fn categories(n: usize) -> Self {
        Axis {
            lo: -0.5,
            hi: n as f64 - 0.5,
            ticks: (0..n).map(|i| i as f64).collect(),
        }
    }
}

impl Ranged for Axis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        let f = if span > 0.0 {
            (v - self.lo) / span
        } else {
            0.5
        };
        let px = f64::from(limit.0) + f * f64::from(limit.1 - limit.0);
        px.round().clamp(-1e6, 1e6) as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        let max = hint.max_num_points();
        if max == 0 || self.ticks.is_empty() {
            return Vec::new();
        }
        let step = self.ticks.len().div_ceil(max).max(1);
        self.ticks.iter().step_by(step).copied().collect()
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

impl ValueFormatter<f64> for Axis {
    fn format(v: &f64) -> String {
        format!("{v}")
    }
}

fn pct(v: &f64) -> String {
    format!("{:.0}%", v * 100.0)
}

fn label_at(labels: &[String], v: f64) -> String {
    let i = v.round();
    if i >= 0.0 && (v - i).abs() < 1e-9 {
        labels.get(i as usize).cloned().unwrap_or_default()
    } else {
        String::new()
    }
}

/// Renders `w` x `h` pixels: a title line, a legend line, and the body drawn by `body`.
fn render(
    w: u32,
    h: u32,
    title: &str,
    legend: &[(String, RGBColor)],
    body: impl FnOnce(&Area<'_>) -> Res,
) -> Result<String, String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (w, h)).into_drawing_area();
        let drawn = (|| -> Res {
            root.fill(&WHITE)?;
            root.draw(&Text::new(
                title.to_owned(),
                (16, 10),
                (FONT, 22).into_font().style(FontStyle::Bold).color(&BLACK),
            ))?;
            let (_, rest) = root.split_vertically(40);
            let (legend_area, body_area) =
                rest.split_vertically(if legend.is_empty() { 0 } else { 30 });
            draw_legend(&legend_area, legend)?;
            body(&body_area)?;
            root.present()?;
            Ok(())
        })();
        drawn.map_err(|e| format!("chart {title:?}: {e}"))?;
    }
    Ok(buf)
}

/// Swatches and names in one row, left to right.
fn draw_legend(area: &Area<'_>, items: &[(String, RGBColor)]) -> Res {
    let style = (FONT, 15).into_font().color(&BLACK);
    let mut x = 16;
    for (name, color) in items {
        area.draw(&Rectangle::new([(x, 8), (x + 14, 22)], color.filled()))?;
        area.draw(&Text::new(
            name.clone(),
            (x + 20, 15),
            style.pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        let (tw, _) = area.estimate_text_size(name, &style)?;
        x += 20 + tw as i32 + 24;
    }
    Ok(())
}

/// Splits `area` into a grid for `n` panels, at most `cols` per row.
fn panels<'a>(area: &Area<'a>, n: usize, cols: usize) -> Vec<Area<'a>> {
    let cols = cols.clamp(1, n.max(1));
    let rows = n.div_ceil(cols).max(1);
    area.split_evenly((rows, cols))
}

fn grid_size(n: usize, cols: usize, panel: (u32, u32), extra_h: u32) -> (u32, u32) {
    let cols = cols.clamp(1, n.max(1));
    let rows = n.div_ceil(cols).max(1);
    (panel.0 * cols as u32, panel.1 * rows as u32 + extra_h)
}

/// Legend entries of the three dimensions.
pub(super) fn dim_legend() -> Vec<(String, RGBColor)> {
    DIM_NAMES
        .iter()
        .zip(DIM_COLORS)
        .map(|(n, c)| ((*n).to_owned(), c))
        .collect()
}

pub(super) fn dominant_legend() -> Vec<(String, RGBColor)> {
    DOMINANT_NAMES
        .iter()
        .zip(DOMINANT_COLORS)
        .map(|(n, c)| ((*n).to_owned(), c))
        .collect()
}

fn variant_legend(acc: &Acc, keep: impl Fn(&VariantAcc) -> bool) -> Vec<(usize, String, RGBColor)> {
    acc.variants
        .iter()
        .enumerate()
        .filter(|(_, (_, v))| keep(v))
        .map(|(i, (name, _))| (i, variant_name(name), variant_color(i)))
        .collect()
}

/// A vertical whisker from `lo` to `hi` at `x` with caps of half-width `cap`.
fn whisker(x: f64, lo: f64, hi: f64, cap: f64) -> Vec<PathElement<(f64, f64)>> {
    let s = BLACK.stroke_width(1);
    vec![
        PathElement::new(vec![(x, lo), (x, hi)], s),
        PathElement::new(vec![(x - cap, lo), (x + cap, lo)], s),
        PathElement::new(vec![(x - cap, hi), (x + cap, hi)], s),
    ]
}

/// The same, horizontal (for bars along x).
fn hwhisker(y: f64, lo: f64, hi: f64, cap: f64) -> Vec<PathElement<(f64, f64)>> {
    let s = BLACK.stroke_width(1);
    vec![
        PathElement::new(vec![(lo, y), (hi, y)], s),
        PathElement::new(vec![(lo, y - cap), (lo, y + cap)], s),
        PathElement::new(vec![(hi, y - cap), (hi, y + cap)], s),
    ]
}

/// Table 4 as grouped bars: win, tie and loss rate per variant with Wilson whiskers.
pub fn preference(acc: &Acc) -> Result<Option<Chart>, String> {
    let rows: Vec<(String, [u64; 3])> = acc
        .variants
        .iter()
        .filter(|(_, v)| v.pairs.scored() > 0)
        .map(|(n, v)| {
            let o = v.pairs.outcomes;
            (variant_name(n), [o[0], o[1], o[2]])
        })
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    let title = "Preference recovery (Table 4)";
    let legend: Vec<(String, RGBColor)> = OUTCOME_NAMES
        .iter()
        .zip(OUTCOME_COLORS)
        .map(|(n, c)| ((*n).to_owned(), c))
        .collect();
    let names: Vec<String> = rows.iter().map(|(n, _)| n.clone()).collect();
    let w = (180 * rows.len() as u32 + 160).max(640);
    let svg = render(w, 460, title, &legend, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(Axis::categories(rows.len()), 0f64..1f64)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(rows.len())
            .x_label_formatter(&|v| label_at(&names, *v))
            .y_label_formatter(&pct)
            .y_desc("share of scored pairs")
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 15))
            .axis_style(AXIS)
            .light_line_style(TRANSPARENT)
            .draw()?;
        let bw = 0.26;
        for (i, (_, counts)) in rows.iter().enumerate() {
            let n: u64 = counts.iter().sum();
            for (k, &c) in counts.iter().enumerate() {
                let x = i as f64 + (k as f64 - 1.0) * bw;
                let p = c as f64 / n as f64;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x - bw / 2.0 + 0.01, 0.0), (x + bw / 2.0 - 0.01, p)],
                    OUTCOME_COLORS[k].filled(),
                )))?;
                if let Some(ci) = super::stats::wilson95(c, n) {
                    chart.draw_series(whisker(x, ci.lo, ci.hi, bw / 6.0))?;
                }
                chart.draw_series(std::iter::once(Text::new(
                    format!("{:.1}%", p * 100.0),
                    (x, p),
                    (FONT, 13)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Bottom)),
                )))?;
            }
        }
        Ok(())
    })?;
    Ok(Some(Chart {
        file: "preference_recovery.svg".to_owned(),
        title: title.to_owned(),
        svg,
        series: legend,
    }))
}

/// A common y range for mean weights with their bands: `[0, 1]` narrowed to the data, on a
/// 0.1 grid, so panels of different variants compare directly.
fn weight_range(groups: impl Iterator<Item = (f64, f64)>) -> Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for (a, b) in groups {
        lo = lo.min(a);
        hi = hi.max(b);
    }
    if !(lo.is_finite() && hi.is_finite()) {
        return 0.0..1.0;
    }
    let lo = ((lo * 10.0).floor() / 10.0).clamp(0.0, 0.9);
    let hi = ((hi * 10.0).ceil() / 10.0).clamp(lo + 0.1, 1.0);
    lo..hi
}

fn band(a: &super::stats::Welford) -> Option<(f64, f64, f64)> {
    let m = a.mean()?;
    let (lo, hi) = a.ci95().map_or((m, m), |c| (c.lo, c.hi));
    Some((m, lo, hi))
}

/// Figure 3: mean weight per dimension by turn, with 95% bands and the count per turn below.
pub fn weights_by_turn(acc: &Acc) -> Result<Option<Chart>, String> {
    let groups: Vec<(String, &VariantAcc)> = acc
        .variants
        .iter()
        .filter(|(_, v)| !v.by_turn.is_empty())
        .map(|(n, v)| (variant_name(n), v))
        .collect();
    if groups.is_empty() {
        return Ok(None);
    }
    let turns: Vec<u32> = {
        let mut t: Vec<u32> = groups
            .iter()
            .flat_map(|(_, v)| v.by_turn.keys().copied())
            .collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    let (first, last) = (
        f64::from(turns.first().copied().unwrap_or(0)),
        f64::from(turns.last().copied().unwrap_or(0)),
    );
    let yr = weight_range(groups.iter().flat_map(|(_, v)| {
        v.by_turn
            .values()
            .flat_map(|a| a.w.iter().filter_map(band).map(|(_, lo, hi)| (lo, hi)))
    }));
    let axis = Axis {
        lo: first - 0.5,
        hi: last + 0.5,
        ticks: turns.iter().map(|&t| f64::from(t)).collect(),
    };
    let title = "Dimension weights by turn (Figure 3)";
    let legend = dim_legend();
    let (w, h) = grid_size(groups.len(), 2, (620, 470), 70);
    let svg = render(w, h, title, &legend, |area| {
        for (panel, (name, v)) in panels(area, groups.len(), 2).iter().zip(&groups) {
            let (top, bottom) = panel.split_vertically(330);
            let mut chart = ChartBuilder::on(&top)
                .caption(name, (FONT, 17))
                .margin(12)
                .x_label_area_size(30)
                .y_label_area_size(56)
                .build_cartesian_2d(axis.clone(), yr.clone())?;
            chart
                .configure_mesh()
                .x_labels(16)
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_labels(6)
                .y_label_formatter(&|v| format!("{v:.2}"))
                .y_desc("mean weight")
                .label_style((FONT, 14))
                .axis_desc_style((FONT, 15))
                .axis_style(AXIS)
                .light_line_style(TRANSPARENT)
                .draw()?;
            for (d, color) in DIM_COLORS.iter().enumerate() {
                let pts: Vec<(f64, f64, f64, f64)> = v
                    .by_turn
                    .iter()
                    .filter_map(|(t, a)| {
                        band(&a.w[d])
                            .map(|(m, lo, hi)| (f64::from(*t), m, lo.max(yr.start), hi.min(yr.end)))
                    })
                    .collect();
                let mut poly: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.3)).collect();
                poly.extend(pts.iter().rev().map(|p| (p.0, p.2)));
                chart.draw_series(std::iter::once(Polygon::new(
                    poly,
                    color.mix(0.18).filled(),
                )))?;
                chart.draw_series(std::iter::once(PathElement::new(
                    pts.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(),
                    color.stroke_width(3),
                )))?;
                chart.draw_series(
                    pts.iter()
                        .map(|p| Circle::new((p.0, p.1), 4, color.filled())),
                )?;
            }
            let max_n = v
                .by_turn
                .values()
                .map(WeightAcc::n)
                .max()
                .unwrap_or(1)
                .max(1) as f64;
            let mut counts = ChartBuilder::on(&bottom)
                .margin_left(12)
                .margin_right(12)
                .margin_bottom(8)
                .x_label_area_size(36)
                .y_label_area_size(56)
                .build_cartesian_2d(axis.clone(), 0f64..max_n * 1.15)?;
            counts
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(16)
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_labels(3)
                .y_label_formatter(&|v| format!("{v:.0}"))
                .x_desc("turn")
                .y_desc("n")
                .label_style((FONT, 14))
                .axis_desc_style((FONT, 15))
                .axis_style(AXIS)
                .light_line_style(TRANSPARENT)
                .draw()?;
            counts.draw_series(v.by_turn.iter().map(|(t, a)| {
                let x = f64::from(*t);
                Rectangle::new(
                    [(x - 0.35, 0.0), (x + 0.35, a.n() as f64)],
                    TIE_COLOR.mix(0.6).filled(),
                )
            }))?;
        }
        Ok(())
    })?;
    Ok(Some(Chart {
        file: "weights_by_turn.svg".to_owned(),
        title: title.to_owned(),
        svg,
        series: legend,
    }))
}

/// Stacked shares (`values[i]`, summing to at most 1) over categories, one panel per group.
#[allow(clippy::too_many_arguments)]
pub(super) fn stacked_panels(
    file: &str,
    title: &str,
    legend: Vec<(String, RGBColor)>,
    colors: &[RGBColor],
    x_desc: &str,
    y_desc: &str,
    groups: &[StackedPanel],
) -> Result<Chart, String> {
    let (w, h) = grid_size(groups.len(), 2, (620, 400), 70);
    let svg = render(w, h, title, &legend, |area| {
        for (panel, (name, cats, values)) in panels(area, groups.len(), 2).iter().zip(groups) {
            let mut chart = ChartBuilder::on(panel)
                .caption(name, (FONT, 17))
                .margin(12)
                .x_label_area_size(52)
                .y_label_area_size(60)
                .build_cartesian_2d(Axis::categories(cats.len()), 0f64..1f64)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(cats.len())
                .x_label_formatter(&|v| label_at(cats, *v))
                .y_label_formatter(&pct)
                .x_desc(x_desc)
                .y_desc(y_desc)
                .label_style((FONT, 14))
                .axis_desc_style((FONT, 15))
                .axis_style(AXIS)
                .light_line_style(TRANSPARENT)
                .draw()?;
            for (i, shares) in values.iter().enumerate() {
                let x = i as f64;
                let mut base = 0.0;
                for (k, &s) in shares.iter().enumerate() {
                    if s > 0.0 {
                        chart.draw_series(std::iter::once(Rectangle::new(
                            [(x - 0.38, base), (x + 0.38, (base + s).min(1.0))],
                            colors[k % colors.len()].filled(),
                        )))?;
                    }
                    base += s;
                }
            }
        }
        Ok(())
    })?;
    Ok(Chart {
        file: file.to_owned(),
        title: title.to_owned(),
        svg,
        series: legend,
    })
}

/// Appendix D: the dominant dimension's share by turn.
pub fn dominant_by_turn(acc: &Acc) -> Result<Option<Chart>, String> {
    let groups: Vec<_> = acc
        .variants
        .iter()
        .filter(|(_, v)| !v.by_turn.is_empty())
        .map(|(n, v)| {
            let cats = v.by_turn.keys().map(|t| t.to_string()).collect();
            let vals = v
                .by_turn
                .values()
                .map(|a| dominant_shares(a).to_vec())
                .collect();
            (variant_name(n), cats, vals)
        })
        .collect();
    if groups.is_empty() {
        return Ok(None);
    }
    stacked_panels(
        "dominant_by_turn.svg",
        "Dominant dimension by turn (Appendix D)",
        dominant_legend(),
        &DOMINANT_COLORS,
        "turn",
        "share of rubrics",
        &groups,
    )
    .map(Some)
}

/// Emotions with valid rubrics in any variant, as `(index, "label (n=..)")` per variant.
fn emotion_groups(acc: &Acc, value: impl Fn(&WeightAcc) -> Vec<f64>) -> Vec<StackedPanel> {
    acc.variants
        .iter()
        .filter(|(_, v)| v.by_emotion.iter().any(|a| a.n() > 0))
        .map(|(n, v)| {
            let (cats, vals) = acc
                .emotions
                .iter()
                .zip(&v.by_emotion)
                .filter(|(_, a)| a.n() > 0)
                .map(|(e, a)| (format!("{e} ({})", a.n()), value(a)))
                .unzip();
            (variant_name(n), cats, vals)
        })
        .collect()
}

/// Figure 4: the composition of the mean weights per emotion.
pub fn weights_by_emotion(acc: &Acc) -> Result<Option<Chart>, String> {
    let groups = emotion_groups(acc, |a| {
        a.w.iter().map(|w| w.mean().unwrap_or(0.0)).collect()
    });
    if groups.is_empty() {
        return Ok(None);
    }
    stacked_panels(
        "weights_by_emotion.svg",
        "Dimension weights by emotion (Figure 4)",
        dim_legend(),
        &DIM_COLORS,
        "emotion (rubrics)",
        "mean weight",
        &groups,
    )
    .map(Some)
}

/// Figure 9: the dominant dimension's share per emotion.
pub fn dominant_by_emotion(acc: &Acc) -> Result<Option<Chart>, String> {
    let groups = emotion_groups(acc, |a| dominant_shares(a).to_vec());
    if groups.is_empty() {
        return Ok(None);
    }
    stacked_panels(
        "dominant_by_emotion.svg",
        "Dominant dimension by emotion (Figure 9)",
        dominant_legend(),
        &DOMINANT_COLORS,
        "emotion (rubrics)",
        "share of rubrics",
        &groups,
    )
    .map(Some)
}

/// Horizontal grouped bars: one group per category (top to bottom), one bar per series, with
/// optional Wilson whiskers from counts `(k, n)`.
fn hbars(
    file: &str,
    title: &str,
    x_desc: &str,
    cats: &[String],
    series: &[CountSeries],
    whiskers: bool,
) -> Result<Chart, String> {
    let legend: Vec<(String, RGBColor)> = series.iter().map(|(n, c, _)| (n.clone(), *c)).collect();
    let per = series.len().max(1) as f64;
    let group_px = (16.0 * per + 14.0).max(30.0);
    let h = ((group_px * cats.len() as f64) as u32 + 180).max(320);
    let label_w = cats.iter().map(|c| c.chars().count()).max().unwrap_or(8) as u32 * 9 + 24;
    let rev: Vec<String> = cats.iter().rev().cloned().collect();
    let max_rate = series
        .iter()
        .flat_map(|(_, _, v)| v.iter())
        .map(|&(k, n)| match super::stats::wilson95(k, n) {
            Some(c) if whiskers => c.hi,
            Some(_) => k as f64 / n as f64,
            None => 0.0,
        })
        .fold(0.0f64, f64::max);
    let x_max = ((max_rate * 10.0).ceil() / 10.0).clamp(0.1, 1.0);
    let svg = render(label_w + 640, h, title, &legend, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(label_w)
            .build_cartesian_2d(0f64..x_max, Axis::categories(cats.len()))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(cats.len())
            .y_label_formatter(&|v| label_at(&rev, *v))
            .x_label_formatter(&pct)
            .x_desc(x_desc)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .axis_style(AXIS)
            .light_line_style(TRANSPARENT)
            .draw()?;
        let bh = 0.8 / per;
        for (s, (_, color, values)) in series.iter().enumerate() {
            for (i, &(k, n)) in values.iter().enumerate() {
                if n == 0 {
                    continue;
                }
                // Row 0 at the top.
                let y = (cats.len() - 1 - i) as f64 + 0.4 - bh * (s as f64 + 0.5);
                let p = k as f64 / n as f64;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [
                        (0.0, y - bh / 2.0 + 0.01),
                        (p.min(x_max), y + bh / 2.0 - 0.01),
                    ],
                    color.filled(),
                )))?;
                // A zero count keeps its interval in the table; drawn, it only clutters.
                if let (true, true, Some(ci)) = (whiskers, k > 0, super::stats::wilson95(k, n)) {
                    chart.draw_series(hwhisker(y, ci.lo, ci.hi.min(x_max), bh / 5.0))?;
                }
            }
        }
        Ok(())
    })?;
    Ok(Chart {
        file: file.to_owned(),
        title: title.to_owned(),
        svg,
        series: legend,
    })
}

fn short_dim(d: &str) -> &str {
    d.get(..3).unwrap_or(d)
}

/// Figure 5: occurrence rate of each tactic per variant.
pub fn strategy_by_variant(acc: &Acc) -> Result<Option<Chart>, String> {
    let labels = used_labels(acc);
    let vars = variant_legend(acc, |v| v.tactics.responses > 0);
    if labels.is_empty() || vars.is_empty() {
        return Ok(None);
    }
    let cats: Vec<String> = labels
        .iter()
        .map(|&id| {
            let (l, d) = label_cells(acc, id);
            format!("{l} ({})", short_dim(&d))
        })
        .collect();
    let series: Vec<_> = vars
        .iter()
        .map(|(i, name, color)| {
            let t = &acc.variants[*i].1.tactics;
            let vals = labels
                .iter()
                .map(|&id| (t.uses[usize::from(id)], t.responses))
                .collect();
            (name.clone(), *color, vals)
        })
        .collect();
    hbars(
        "strategy_by_variant.svg",
        "Strategy occurrence per variant (Figure 5)",
        "share of responses using the tactic",
        &cats,
        &series,
        true,
    )
    .map(Some)
}

/// A file-name stem for a variant: lowercase ASCII letters, digits and `-`.
pub fn slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') {
            s.push('-');
        }
    }
    let s: String = s.trim_matches('-').chars().take(40).collect();
    if s.is_empty() {
        "variant".to_owned()
    } else {
        s
    }
}

/// The heatmap colour of a rate in `[0, 1]`: white to dark blue.
pub fn heat(p: f64) -> RGBColor {
    let p = if p.is_finite() {
        p.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let lerp = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * p).round() as u8;
    RGBColor(lerp(0xF7, 0x08), lerp(0xFB, 0x30), lerp(0xFF, 0x6B))
}

/// Figure 10: one heatmap per variant, tactics by emotion.
pub fn strategy_by_emotion(acc: &Acc) -> Result<Vec<Chart>, String> {
    let labels = used_labels(acc);
    if labels.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<String> = labels
        .iter()
        .map(|&id| {
            let (l, d) = label_cells(acc, id);
            format!("{l} ({})", short_dim(&d))
        })
        .collect();
    let rev: Vec<String> = rows.iter().rev().cloned().collect();
    let mut out = Vec::new();
    let mut used_stems: Vec<String> = Vec::new();
    for (name, v) in &acc.variants {
        let cols: Vec<(String, &super::accum::TacticAcc)> = tactic_emotions(acc, v)
            .map(|(e, t)| (format!("{e} ({})", t.responses), t))
            .collect();
        if cols.is_empty() {
            continue;
        }
        let display = variant_name(name);
        let mut stem = format!("strategy_by_emotion_{}", slug(&display));
        let base = stem.clone();
        let mut k = 2;
        while used_stems.contains(&stem) {
            stem = format!("{base}-{k}");
            k += 1;
        }
        used_stems.push(stem.clone());
        let title = format!("Strategy occurrence by emotion: {display} (Figure 10)");
        let col_names: Vec<String> = cols.iter().map(|(n, _)| n.clone()).collect();
        let label_w = rows.iter().map(|c| c.chars().count()).max().unwrap_or(8) as u32 * 9 + 24;
        let w = label_w + 110 * cols.len() as u32 + 140;
        let h = 34 * rows.len() as u32 + 200;
        let svg = render(w, h, &title, &[], |area| {
            let (plot, scale) = area.split_horizontally(w - 110);
            let mut chart = ChartBuilder::on(&plot)
                .margin(16)
                .x_label_area_size(44)
                .y_label_area_size(label_w)
                .build_cartesian_2d(Axis::categories(cols.len()), Axis::categories(rows.len()))?;
            chart
                .configure_mesh()
                .disable_mesh()
                .x_labels(cols.len())
                .y_labels(rows.len())
                .x_label_formatter(&|v| label_at(&col_names, *v))
                .y_label_formatter(&|v| label_at(&rev, *v))
                .x_desc("user emotion (responses)")
                .label_style((FONT, 14))
                .axis_desc_style((FONT, 15))
                .axis_style(AXIS)
                .light_line_style(TRANSPARENT)
                .draw()?;
            for (c, (_, t)) in cols.iter().enumerate() {
                for (r, &id) in labels.iter().enumerate() {
                    let p = t.uses[usize::from(id)] as f64 / t.responses as f64;
                    let (x, y) = (c as f64, (rows.len() - 1 - r) as f64);
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)],
                        heat(p).filled(),
                    )))?;
                    let ink = if p > 0.5 { WHITE } else { BLACK };
                    chart.draw_series(std::iter::once(Text::new(
                        format!("{:.0}%", p * 100.0),
                        (x, y),
                        (FONT, 13)
                            .into_font()
                            .color(&ink)
                            .pos(Pos::new(HPos::Center, VPos::Center)),
                    )))?;
                }
            }
            draw_scale(&scale)?;
            Ok(())
        })?;
        out.push(Chart {
            file: format!("{stem}.svg"),
            title,
            svg,
            series: Vec::new(),
        });
    }
    Ok(out)
}

/// The heatmap's colour scale, 0% at the bottom to 100% at the top.
fn draw_scale(area: &Area<'_>) -> Res {
    let (x0, y0, steps, step_h) = (20, 30, 10, 20);
    let style = (FONT, 13).into_font().color(&BLACK);
    for i in 0..steps {
        let p = (i as f64 + 0.5) / steps as f64;
        let y = y0 + (steps - 1 - i) * step_h;
        area.draw(&Rectangle::new(
            [(x0, y), (x0 + 20, y + step_h)],
            heat(p).filled(),
        ))?;
    }
    area.draw(&Rectangle::new(
        [(x0, y0), (x0 + 20, y0 + steps * step_h)],
        AXIS.stroke_width(1),
    ))?;
    for (label, y) in [
        ("100%", y0),
        ("50%", y0 + steps * step_h / 2),
        ("0%", y0 + steps * step_h),
    ] {
        area.draw(&Text::new(
            label,
            (x0 + 26, y),
            style.pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }
    Ok(())
}

/// Format health: valid share per variant with Wilson whiskers.
pub fn format_valid(acc: &Acc) -> Result<Option<Chart>, String> {
    let vars = variant_legend(acc, |v| v.rubrics.total > 0);
    if vars.is_empty() {
        return Ok(None);
    }
    let names: Vec<String> = vars.iter().map(|(_, n, _)| n.clone()).collect();
    let legend: Vec<(String, RGBColor)> = vars.iter().map(|(_, n, c)| (n.clone(), *c)).collect();
    let title = "Format health: valid rubrics";
    let w = (140 * vars.len() as u32 + 160).max(560);
    let svg = render(w, 420, title, &legend, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(Axis::categories(vars.len()), 0f64..1f64)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(vars.len())
            .x_label_formatter(&|v| label_at(&names, *v))
            .y_label_formatter(&pct)
            .y_desc("valid share (r_fmt = 1)")
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 15))
            .axis_style(AXIS)
            .light_line_style(TRANSPARENT)
            .draw()?;
        for (pos, (i, _, color)) in vars.iter().enumerate() {
            let r = &acc.variants[*i].1.rubrics;
            let x = pos as f64;
            let p = r.valid as f64 / r.total as f64;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x - 0.3, 0.0), (x + 0.3, p)],
                color.filled(),
            )))?;
            if let Some(ci) = super::stats::wilson95(r.valid, r.total) {
                chart.draw_series(whisker(x, ci.lo, ci.hi, 0.06))?;
            }
            chart.draw_series(std::iter::once(Text::new(
                format!("{}/{}", r.valid, r.total),
                (x, p),
                (FONT, 13)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )))?;
        }
        Ok(())
    })?;
    Ok(Some(Chart {
        file: "format_valid.svg".to_owned(),
        title: title.to_owned(),
        svg,
        series: legend,
    }))
}

/// Format health: share of rubrics with each violation code, per variant.
pub fn violations(acc: &Acc) -> Result<Option<Chart>, String> {
    let vars = variant_legend(acc, |v| v.rubrics.total > 0);
    // Codes in order of their total rubric count over all variants.
    let mut totals: Vec<(care_core::ViolationCode, u64)> = Vec::new();
    for (_, v) in &acc.variants {
        for (c, k, _) in violation_counts(v) {
            match totals.iter_mut().find(|(x, _)| *x == c) {
                Some(t) => t.1 += k,
                None => totals.push((c, k)),
            }
        }
    }
    if totals.is_empty() || vars.is_empty() {
        return Ok(None);
    }
    totals.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.number().cmp(&b.0.number())));
    let cats: Vec<String> = totals.iter().map(|(c, _)| c.as_str().to_owned()).collect();
    let series: Vec<_> = vars
        .iter()
        .map(|(i, name, color)| {
            let r = &acc.variants[*i].1.rubrics;
            let vals = totals
                .iter()
                .map(|(c, _)| (r.codes[usize::from(c.number())].0, r.total))
                .collect();
            (name.clone(), *color, vals)
        })
        .collect();
    hbars(
        "violations.svg",
        "Format health: violation codes by frequency",
        "share of rubrics with the code",
        &cats,
        &series,
        false,
    )
    .map(Some)
}

/// Format health: criteria per dimension, one panel per variant.
pub fn criteria_counts(acc: &Acc) -> Result<Option<Chart>, String> {
    let max = super::tables::max_criteria_seen(acc);
    let groups: Vec<(String, &VariantAcc)> = acc
        .variants
        .iter()
        .filter(|(_, v)| v.rubrics.parsed > 0)
        .map(|(n, v)| (variant_name(n), v))
        .collect();
    if groups.is_empty() {
        return Ok(None);
    }
    let cats: Vec<String> = (0..=max).map(|k| k.to_string()).collect();
    let title = "Format health: criteria per dimension";
    let legend = dim_legend();
    let (w, h) = grid_size(groups.len(), 2, (560, 380), 70);
    let svg = render(w, h, title, &legend, |area| {
        for (panel, (name, v)) in panels(area, groups.len(), 2).iter().zip(&groups) {
            let mut chart = ChartBuilder::on(panel)
                .caption(name, (FONT, 17))
                .margin(12)
                .x_label_area_size(44)
                .y_label_area_size(60)
                .build_cartesian_2d(Axis::categories(cats.len()), 0f64..1f64)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(cats.len())
                .x_label_formatter(&|v| label_at(&cats, *v))
                .y_label_formatter(&pct)
                .x_desc("criteria in the dimension")
                .y_desc("share of parsed rubrics")
                .label_style((FONT, 14))
                .axis_desc_style((FONT, 15))
                .axis_style(AXIS)
                .light_line_style(TRANSPARENT)
                .draw()?;
            let n = v.rubrics.parsed.max(1) as f64;
            for (d, color) in DIM_COLORS.iter().enumerate() {
                chart.draw_series((0..=max).filter_map(|k| {
                    let c = v.rubrics.criteria[d][k];
                    let x = k as f64 + (d as f64 - 1.0) * 0.27;
                    (c > 0).then(|| {
                        Rectangle::new([(x - 0.12, 0.0), (x + 0.12, c as f64 / n)], color.filled())
                    })
                }))?;
            }
        }
        Ok(())
    })?;
    Ok(Some(Chart {
        file: "criteria_counts.svg".to_owned(),
        title: title.to_owned(),
        svg,
        series: legend,
    }))
}

/// Format health: the weight-sum error distribution per variant.
pub fn weight_sum_error(acc: &Acc) -> Result<Option<Chart>, String> {
    let vars = variant_legend(acc, |v| v.rubrics.parsed > 0);
    if vars.is_empty() {
        return Ok(None);
    }
    let cats: Vec<String> = wsum_labels(acc.tolerance).to_vec();
    let legend: Vec<(String, RGBColor)> = vars.iter().map(|(_, n, c)| (n.clone(), *c)).collect();
    let title = "Format health: weight-sum error sum(w) - 1";
    let per = vars.len() as f64;
    let svg = render(1000, 440, title, &legend, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d(Axis::categories(cats.len()), 0f64..1f64)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(cats.len())
            .x_label_formatter(&|v| label_at(&cats, *v))
            .y_label_formatter(&pct)
            .x_desc("sum(w) - 1")
            .y_desc("share of parsed rubrics")
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .axis_style(AXIS)
            .light_line_style(TRANSPARENT)
            .draw()?;
        let bw = 0.8 / per;
        for (s, (i, _, color)) in vars.iter().enumerate() {
            let r = &acc.variants[*i].1.rubrics;
            let n = r.parsed as f64;
            for (b, &k) in r.wsum.iter().enumerate().filter(|(_, k)| **k > 0) {
                let x = b as f64 - 0.4 + bw * (s as f64 + 0.5);
                let p = k as f64 / n;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x - bw / 2.0 + 0.01, 0.0), (x + bw / 2.0 - 0.01, p)],
                    color.filled(),
                )))?;
                // The count, so that a bin of one rubric among hundreds is still visible.
                chart.draw_series(std::iter::once(Text::new(
                    k.to_string(),
                    (x, p),
                    (FONT, 12)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Bottom)),
                )))?;
            }
        }
        Ok(())
    })?;
    Ok(Some(Chart {
        file: "weight_sum_error.svg".to_owned(),
        title: title.to_owned(),
        svg,
        series: legend,
    }))
}

/// One series of an [`interval_chart`]: a point (and its interval) per category, or none.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend name.
    pub name: String,
    /// Colour.
    pub color: RGBColor,
    /// Per category: the estimate and its 95% interval.
    pub points: Vec<Option<(f64, Option<super::stats::Interval>)>>,
}

/// Estimates with 95% whiskers over categories, one offset mark per series, and an optional
/// reference line (0 for differences, a threshold for a health check) drawn dashed in grey.
pub fn interval_chart(
    file: &str,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    cats: &[String],
    series: &[Series],
    reference: Option<f64>,
) -> Result<Chart, String> {
    let legend: Vec<(String, RGBColor)> =
        series.iter().map(|s| (s.name.clone(), s.color)).collect();
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for s in series {
        for (v, ci) in s.points.iter().flatten() {
            for x in [Some(*v), ci.map(|c| c.lo), ci.map(|c| c.hi)]
                .into_iter()
                .flatten()
            {
                if x.is_finite() {
                    lo = lo.min(x);
                    hi = hi.max(x);
                }
            }
        }
    }
    if let Some(r) = reference {
        lo = lo.min(r);
        hi = hi.max(r);
    }
    if !(lo.is_finite() && hi.is_finite()) {
        (lo, hi) = (0.0, 1.0);
    }
    let pad = if hi > lo { (hi - lo) * 0.08 } else { 0.5 };
    let yr = (lo - pad)..(hi + pad);
    let per = series.len().max(1) as f64;
    let w = ((40.0 + 14.0 * per) * cats.len() as f64 + 200.0).clamp(640.0, 2400.0) as u32;
    let svg = render(w, 460, title, &legend, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(Axis::categories(cats.len()), yr.clone())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(cats.len().min(40))
            .x_label_formatter(&|v| label_at(cats, *v))
            .y_labels(8)
            .y_label_formatter(&|v| format!("{v:.3}"))
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .axis_style(AXIS)
            .light_line_style(TRANSPARENT)
            .draw()?;
        if let Some(r) = reference {
            let n = cats.len() as f64;
            // Dashes, so the line reads as a reference and not as a series.
            let mut x = -0.5;
            while x < n - 0.5 {
                let end = (x + 0.12).min(n - 0.5);
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(x, r), (end, r)],
                    TIE_COLOR.stroke_width(2),
                )))?;
                x += 0.2;
            }
        }
        let band = 0.7 / per;
        for (k, s) in series.iter().enumerate() {
            for (i, p) in s.points.iter().enumerate() {
                let Some((v, ci)) = p else { continue };
                if !v.is_finite() {
                    continue;
                }
                let x = i as f64 - 0.35 + band * (k as f64 + 0.5);
                if let Some(ci) = ci.filter(|c| c.lo.is_finite() && c.hi.is_finite()) {
                    chart.draw_series(whisker(x, ci.lo, ci.hi, band / 4.0))?;
                }
                chart.draw_series(std::iter::once(Circle::new((x, *v), 5, s.color.filled())))?;
            }
        }
        Ok(())
    })?;
    Ok(Chart {
        file: file.to_owned(),
        title: title.to_owned(),
        svg,
        series: legend,
    })
}

/// Horizontal bars of shares `k/n` per category and series with Wilson whiskers (for the
/// health and verdict views).
pub fn share_bars(
    file: &str,
    title: &str,
    x_desc: &str,
    cats: &[String],
    series: &[CountSeries],
) -> Result<Chart, String> {
    hbars(file, title, x_desc, cats, series, true)
}

/// Every chart with data, in report order.
pub fn all(acc: &Acc) -> Result<Vec<Chart>, String> {
    let mut out = Vec::new();
    for c in [
        preference(acc)?,
        weights_by_turn(acc)?,
        dominant_by_turn(acc)?,
        weights_by_emotion(acc)?,
        dominant_by_emotion(acc)?,
        strategy_by_variant(acc)?,
    ]
    .into_iter()
    .flatten()
    {
        out.push(c);
    }
    out.extend(strategy_by_emotion(acc)?);
    for c in [
        format_valid(acc)?,
        violations(acc)?,
        criteria_counts(acc)?,
        weight_sum_error(acc)?,
    ]
    .into_iter()
    .flatten()
    {
        out.push(c);
    }
    Ok(out)
}
