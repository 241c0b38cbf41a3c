//! Inline SVG charts (no script, no library): a line chart for the survival curve and
//! horizontal bar charts for everything else. Values arrive computed; this only draws.

use maud::{Markup, html};

/// A point of the survival curve.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CurvePoint {
    pub tool_calls: u32,
    pub rate: f64,
    pub alive: u64,
    pub reached: u64,
}

const W: f64 = 420.0;
const H: f64 = 220.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 34.0;

/// The survival curve: share of runs alive after k tool calls, on a 0–100 % axis.
pub(crate) fn survival(points: &[CurvePoint]) -> Markup {
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let n = points.len().max(1);
    let x = |i: usize| {
        if n == 1 {
            LEFT + plot_w / 2.0
        } else {
            LEFT + plot_w * i as f64 / (n - 1) as f64
        }
    };
    let y = |rate: f64| TOP + plot_h * (1.0 - rate.clamp(0.0, 1.0));
    let path: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(p.rate)))
        .collect();
    html! {
        svg id="survival-chart" viewBox=(format!("0 0 {W} {H}")) width="100%" role="img" aria-label="turn survival curve" {
            @for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
                line class="grid" x1=(LEFT) x2=(W - RIGHT) y1=(format!("{:.1}", y(tick))) y2=(format!("{:.1}", y(tick))) {}
                text x=(LEFT - 6.0) y=(format!("{:.1}", y(tick) + 4.0)) text-anchor="end" { (format!("{:.0}%", tick * 100.0)) }
            }
            @if !path.is_empty() {
                polyline class="curve" points=(path.join(" ")) {}
            }
            @for (i, p) in points.iter().enumerate() {
                circle class="point" cx=(format!("{:.1}", x(i))) cy=(format!("{:.1}", y(p.rate))) r="4"
                    data-tool-calls=(p.tool_calls) data-rate=(format!("{:.6}", p.rate))
                    data-alive=(p.alive) data-reached=(p.reached) {
                    title { (format!("after {} tool calls: {:.1}% alive ({} runs reached it)", p.tool_calls, p.rate * 100.0, p.reached)) }
                }
                text class="point-label" x=(format!("{:.1}", x(i))) y=(format!("{:.1}", y(p.rate) - 8.0)) text-anchor="middle" { (format!("{:.1}%", p.rate * 100.0)) }
                text x=(format!("{:.1}", x(i))) y=(H - BOTTOM + 16.0) text-anchor="middle" { (p.tool_calls) }
            }
            text x=(LEFT + plot_w / 2.0) y=(H - 4.0) text-anchor="middle" { "tool calls" }
        }
    }
}

/// One bar.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bar {
    pub label: String,
    pub value: f64,
    /// What is written after the bar.
    pub text: String,
}

/// Horizontal bars scaled to the largest value; `class` colours them.
pub(crate) fn bars(id: &str, bars: &[Bar], class: &str) -> Markup {
    if bars.is_empty() {
        return html! { p class="empty" id=(id) { "Nothing recorded yet." } };
    }
    let row_h = 22.0;
    let label_w = 150.0;
    let text_w = 90.0;
    let height = row_h * bars.len() as f64 + 8.0;
    let max = bars.iter().map(|b| b.value).fold(0.0f64, f64::max);
    let scale = if max > 0.0 {
        (W - label_w - text_w) / max
    } else {
        0.0
    };
    html! {
        svg id=(id) viewBox=(format!("0 0 {W} {height}")) width="100%" role="img" {
            @for (i, bar) in bars.iter().enumerate() {
                @let top = 4.0 + row_h * i as f64;
                @let width = (bar.value.max(0.0) * scale).max(if bar.value > 0.0 { 2.0 } else { 0.0 });
                g class="bar-row" data-label=(bar.label) data-value=(bar.value) {
                    text x=(label_w - 6.0) y=(format!("{:.1}", top + 14.0)) text-anchor="end" { (short(&bar.label)) }
                    rect class={ "barfill " (class) } x=(label_w) y=(format!("{:.1}", top + 3.0)) width=(format!("{width:.1}")) height="14" rx="2" {
                        title { (bar.label) ": " (bar.text) }
                    }
                    text x=(format!("{:.1}", label_w + width + 6.0)) y=(format!("{:.1}", top + 14.0)) { (bar.text) }
                }
            }
        }
    }
}

fn short(label: &str) -> String {
    if label.chars().count() > 22 {
        let head: String = label.chars().take(21).collect();
        format!("{head}…")
    } else {
        label.to_string()
    }
}
