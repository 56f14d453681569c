//! `--plot FILE.svg`: a hand-written SVG with the latency distributions (CDFs of TTFT, TPOT,
//! ITL and E2E latency, one line per run) and throughput: for several runs, the
//! throughput-versus-latency curve (output tokens/s against median TPOT and E2E), for one
//! run, output tokens per second over time.

use std::fmt::Write as _;

use crate::report::{BenchReport, RunReport};

const PANEL_W: f64 = 380.0;
const PANEL_H: f64 = 260.0;
const MARGIN_L: f64 = 60.0;
const MARGIN_B: f64 = 40.0;
const MARGIN_T: f64 = 28.0;
const MARGIN_R: f64 = 16.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One line of a chart.
struct Series {
    name: String,
    color: &'static str,
    points: Vec<(f64, f64)>,
    markers: bool,
    /// Text next to each marker (sweep levels).
    point_labels: Vec<String>,
}

/// Tick values covering `[lo, hi]` at a 1-2-5 step.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 20 {
        out.push(t);
        t += step;
    }
    out
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        return format!("{v:.0}");
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A chart's plotting area on the page and the data range it shows.
struct Frame {
    px: f64,
    py: f64,
    w: f64,
    h: f64,
    xmin: f64,
    xmax: f64,
    ymin: f64,
    ymax: f64,
}

impl Frame {
    /// The area at (`px`, `py`) of `w` by `h`, scaled to show every point with the origin,
    /// plus 5% headroom.
    fn fit(px: f64, py: f64, w: f64, h: f64, all: &[(f64, f64)]) -> Self {
        let fold = |f: fn(&(f64, f64)) -> f64| {
            all.iter()
                .map(f)
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                    (a.min(v), b.max(v))
                })
        };
        let (mut xmin, mut xmax) = fold(|p| p.0);
        let (mut ymin, mut ymax) = fold(|p| p.1);
        xmin = xmin.min(0.0);
        ymin = ymin.min(0.0);
        if xmax <= xmin {
            xmax = xmin + 1.0;
        }
        if ymax <= ymin {
            ymax = ymin + 1.0;
        }
        xmax *= 1.05;
        ymax *= 1.05;
        Self {
            px,
            py,
            w,
            h,
            xmin,
            xmax,
            ymin,
            ymax,
        }
    }

    fn sx(&self, x: f64) -> f64 {
        self.px + (x - self.xmin) / (self.xmax - self.xmin) * self.w
    }

    fn sy(&self, y: f64) -> f64 {
        self.py + self.h - (y - self.ymin) / (self.ymax - self.ymin) * self.h
    }
}

/// Draws one chart at (`x0`, `y0`).
fn panel(
    out: &mut String,
    x0: f64,
    y0: f64,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
) {
    let (w, h) = (PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B);
    let (px, py) = (x0 + MARGIN_L, y0 + MARGIN_T);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="13" font-weight="bold" text-anchor="middle">{}</text>"#,
        px + w / 2.0,
        y0 + 16.0,
        escape(title)
    );
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .collect();
    if all.is_empty() {
        let _ = writeln!(
            out,
            r##"<text x="{}" y="{}" font-size="12" text-anchor="middle" fill="#888">no data</text>"##,
            px + w / 2.0,
            py + h / 2.0
        );
        return;
    }
    let frame = Frame::fit(px, py, w, h, &all);
    axes(out, &frame, x0, xlabel, ylabel);
    for (i, s) in series.iter().enumerate() {
        line(out, &frame, i, s);
    }
}

/// The frame, its grid and ticks, and the axis labels.
fn axes(out: &mut String, frame: &Frame, x0: f64, xlabel: &str, ylabel: &str) {
    let &Frame { px, py, w, h, .. } = frame;
    let _ = writeln!(
        out,
        r##"<rect x="{px}" y="{py}" width="{w}" height="{h}" fill="none" stroke="#444"/>"##
    );
    for t in ticks(frame.xmin, frame.xmax) {
        let x = frame.sx(t);
        let _ = writeln!(
            out,
            r##"<line x1="{x}" y1="{py}" x2="{x}" y2="{}" stroke="#eee"/><text x="{x}" y="{}" font-size="10" text-anchor="middle">{}</text>"##,
            py + h,
            py + h + 13.0,
            fmt_tick(t)
        );
    }
    for t in ticks(frame.ymin, frame.ymax) {
        let y = frame.sy(t);
        let _ = writeln!(
            out,
            r##"<line x1="{px}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" font-size="10" text-anchor="end">{}</text>"##,
            px + w,
            px - 4.0,
            y + 3.0,
            fmt_tick(t)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
        px + w / 2.0,
        py + h + 30.0,
        escape(xlabel)
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>"#,
        x0 + 14.0,
        py + h / 2.0,
        x0 + 14.0,
        py + h / 2.0,
        escape(ylabel)
    );
}

/// Series `i`: its polyline, markers with their labels, and its name in the legend.
fn line(out: &mut String, frame: &Frame, i: usize, s: &Series) {
    let path: Vec<String> = s
        .points
        .iter()
        .map(|&(x, y)| format!("{:.2},{:.2}", frame.sx(x), frame.sy(y)))
        .collect();
    let _ = writeln!(
        out,
        r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.6"/>"#,
        path.join(" "),
        s.color
    );
    if s.markers {
        for (j, &(x, y)) in s.points.iter().enumerate() {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.2}" cy="{:.2}" r="3" fill="{}"/>"#,
                frame.sx(x),
                frame.sy(y),
                s.color
            );
            if let Some(label) = s.point_labels.get(j) {
                let _ = writeln!(
                    out,
                    r#"<text x="{:.2}" y="{:.2}" font-size="10" fill="{}">{}</text>"#,
                    frame.sx(x) + 5.0,
                    frame.sy(y) - 5.0,
                    s.color,
                    escape(label)
                );
            }
        }
    }
    if !s.name.is_empty() {
        let ly = frame.py + 12.0 + 13.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{ly}" font-size="10" text-anchor="end" fill="{}">{}</text>"#,
            frame.px + frame.w - 4.0,
            s.color,
            escape(&s.name)
        );
    }
}

/// Empirical CDF points of samples (ms): a step per sample.
fn cdf(samples: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let mut out = Vec::with_capacity(2 * v.len());
    for (i, x) in v.iter().enumerate() {
        out.push((*x, i as f64 / n));
        out.push((*x, (i + 1) as f64 / n));
    }
    out
}

fn metric_samples(run: &RunReport, metric: &str) -> Vec<f64> {
    let ok = run.requests.iter().filter(|r| r.ok());
    let ms: Vec<f64> = match metric {
        "TTFT" => ok.filter_map(|r| r.ttft_s).collect(),
        "TPOT" => ok.filter_map(|r| r.tpot_s()).collect(),
        "ITL" => ok.flat_map(|r| r.itl_s.iter().copied()).collect(),
        _ => ok.map(|r| r.latency_s).collect(),
    };
    ms.into_iter().map(|s| s * 1000.0).collect()
}

/// Output tokens per second over time, in about 20 bins, from each token's arrival time
/// (start + TTFT + cumulative ITL; with `usage`, extra tokens are spread over the chunks).
fn throughput_over_time(run: &RunReport) -> Vec<(f64, f64)> {
    let mut times = Vec::new();
    for r in run.requests.iter().filter(|r| r.ok()) {
        let Some(ttft) = r.ttft_s else { continue };
        let mut t = r.start_s + ttft;
        let chunks = 1 + r.itl_s.len();
        let per_chunk = r.output_tokens() as f64 / chunks as f64;
        times.push((t, per_chunk));
        for gap in &r.itl_s {
            t += gap;
            times.push((t, per_chunk));
        }
    }
    let end = run.metrics.duration_s.max(1e-3);
    let bins = 20usize;
    let width = end / bins as f64;
    let mut counts = vec![0.0; bins];
    for (t, n) in times {
        let b = ((t / width) as usize).min(bins - 1);
        counts[b] += n;
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, c)| ((i as f64 + 0.5) * width, c / width))
        .collect()
}

/// The SVG document for a report.
pub fn render_svg(report: &BenchReport) -> String {
    let cols = 3.0;
    let (width, height) = (PANEL_W * cols, PANEL_H * 2.0 + 30.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="14">{} — {} {} ({})</text>"#,
        escape(&report.tool),
        escape(&report.config.url),
        escape(&report.config.model),
        escape(&format!("{:?}", report.config.endpoint).to_lowercase())
    );
    let color = |i: usize| COLORS[i % COLORS.len()];
    for (k, metric) in ["TTFT", "TPOT", "ITL", "E2E"].iter().enumerate() {
        let series: Vec<Series> = report
            .runs
            .iter()
            .enumerate()
            .map(|(i, run)| Series {
                name: run.label.clone(),
                color: color(i),
                points: cdf(&metric_samples(run, metric)),
                markers: false,
                point_labels: Vec::new(),
            })
            .collect();
        let (col, row) = ((k % 3) as f64, (k / 3) as f64);
        panel(
            &mut out,
            col * PANEL_W,
            30.0 + row * PANEL_H,
            &format!("{metric} CDF"),
            &format!("{metric} (ms)"),
            "fraction of samples",
            &series,
        );
    }
    let y1 = 30.0 + PANEL_H;
    if report.runs.len() > 1 {
        for (k, (name, pick)) in [
            (
                "median TPOT",
                (|r: &RunReport| r.metrics.tpot_ms.map(|s| s.median))
                    as fn(&RunReport) -> Option<f64>,
            ),
            ("median E2E", |r: &RunReport| {
                r.metrics.e2e_ms.map(|s| s.median)
            }),
        ]
        .into_iter()
        .enumerate()
        {
            let (points, point_labels): (Vec<(f64, f64)>, Vec<String>) = report
                .runs
                .iter()
                .filter_map(|r| Some(((r.metrics.output_throughput, pick(r)?), r.label.clone())))
                .unzip();
            let series = [Series {
                name: String::new(),
                color: color(k),
                points,
                markers: true,
                point_labels,
            }];
            panel(
                &mut out,
                (1 + k) as f64 * PANEL_W,
                y1,
                &format!("throughput vs {name}"),
                "output tokens/s",
                &format!("{name} (ms)"),
                &series,
            );
        }
    } else if let Some(run) = report.runs.first() {
        let series = [Series {
            name: run.label.clone(),
            color: color(0),
            points: throughput_over_time(run),
            markers: true,
            point_labels: Vec::new(),
        }];
        panel(
            &mut out,
            PANEL_W,
            y1,
            "output throughput over time",
            "time since start (s)",
            "output tokens/s",
            &series,
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 1.0).len(), 6);
        let t = ticks(0.0, 0.37);
        assert!(t.len() >= 3 && t.len() <= 8, "{t:?}");
    }

    #[test]
    fn cdf_steps() {
        assert_eq!(
            cdf(&[2.0, 1.0]),
            vec![(1.0, 0.0), (1.0, 0.5), (2.0, 0.5), (2.0, 1.0)]
        );
    }
}
