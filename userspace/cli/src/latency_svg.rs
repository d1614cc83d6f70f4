//! Per-call latency distributions drawn as SVG (`pcieipc bench
//! --latency-plot`): a panel per placement, a column per size, and in each
//! column pcieipc's distribution beside its peer's. Times are drawn as
//! multiples of pcieipc's median at that size on a log axis, so that a
//! 0.3 µs call and a 50 ms one show their tails on one scale, and a peer
//! slower at the median sits above 1. Pure: distributions in, SVG text out.

use std::fmt::Write;

use crate::bench_latency::{Distribution, Placement};

/// One size and placement: pcieipc's calls, and the peer's when given.
pub struct PlotRow {
    pub size_bytes: usize,
    pub placement: Placement,
    pub ours: Distribution,
    pub peer: Option<Distribution>,
}

const COLUMN: f64 = 64.0;
const LEFT: f64 = 70.0;
const PANEL: f64 = 260.0;
const TOP: f64 = 54.0;
const GAP: f64 = 70.0;
const OURS: &str = "#3f51b5";
const PEER: &str = "#fb8c00";

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn size_name(bytes: usize) -> String {
    match bytes {
        _ if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) => format!("{}M", bytes >> 20),
        _ if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) => format!("{}K", bytes >> 10),
        _ => format!("{bytes}"),
    }
}

fn microseconds(us: f64) -> String {
    match us {
        _ if us >= 1000.0 => format!("{:.1} ms", us / 1000.0),
        _ if us >= 10.0 => format!("{us:.0} µs"),
        _ => format!("{us:.2} µs"),
    }
}

/// The plot of `rows` (sizes in the order given; a placement without rows
/// gets no panel). `ours` and `peer` name the two sides in the legend.
pub fn latency_svg(rows: &[PlotRow], title: &str, ours: &str, peer: Option<&str>) -> String {
    let placements: Vec<Placement> = [Placement::OutOfPlace, Placement::InPlace]
        .into_iter()
        .filter(|placement| rows.iter().any(|row| row.placement == *placement))
        .collect();
    let columns = placements
        .iter()
        .map(|placement| {
            rows.iter()
                .filter(|row| row.placement == *placement)
                .count()
        })
        .max()
        .unwrap_or(0);
    // The y range: every drawn value over its column's median, padded.
    let ratios = rows.iter().flat_map(|row| {
        let reference = row.ours.p50();
        [Some(&row.ours), row.peer.as_ref()]
            .into_iter()
            .flatten()
            .flat_map(move |d| [d.percentiles[0] / reference, d.max / reference])
    });
    let (low, high) = ratios
        .filter(|ratio| ratio.is_finite() && *ratio > 0.0)
        .fold((0.8f64, 2.0f64), |(low, high), ratio| {
            (low.min(ratio), high.max(ratio))
        });
    let (low, high) = ((low / 1.2).log10(), (high * 1.2).log10());
    // Room for the title and legend however few the sizes.
    let width = (LEFT + COLUMN * columns.max(1) as f64 + 20.0).max(760.0);
    let height = TOP + (PANEL + GAP) * placements.len().max(1) as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="10" y="18" font-size="13">{}</text>"#,
        escape(title)
    );
    let mut legend = format!(r#"<tspan fill="{OURS}">■ {}</tspan>"#, escape(ours));
    if let Some(peer) = peer {
        let _ = write!(
            legend,
            r#"   <tspan fill="{PEER}">■ {}</tspan>"#,
            escape(peer)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="10" y="36">{legend}   box: p50 to p99, bar: p90, line: to p99.7, dot: max; each call's time ÷ {}'s p50 at its size (log)</text>"#,
        escape(ours)
    );
    for (panel, placement) in placements.iter().enumerate() {
        let top = TOP + (PANEL + GAP) * panel as f64 + 14.0;
        let y = |ratio: f64| top + PANEL * (high - ratio.max(1e-9).log10()) / (high - low);
        let _ = writeln!(
            svg,
            r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text>"#,
            top - 4.0,
            placement.name()
        );
        // Decade ticks and 2x, 5x between, where they fall in the range.
        let mut tick = 10f64.powf(low.floor());
        while tick.log10() <= high {
            for step in [1.0, 2.0, 5.0] {
                let value = tick * step;
                let at = value.log10();
                if at < low || at > high {
                    continue;
                }
                let line_y = y(value);
                let stroke = if step == 1.0 { "#bbb" } else { "#e4e4e4" };
                let _ = writeln!(
                    svg,
                    r#"<line x1="{LEFT}" x2="{:.1}" y1="{line_y:.1}" y2="{line_y:.1}" stroke="{stroke}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}×</text>"#,
                    width - 20.0,
                    LEFT - 6.0,
                    line_y + 4.0,
                    format_ratio(value)
                );
            }
            tick *= 10.0;
        }
        let panel_rows = rows.iter().filter(|row| row.placement == *placement);
        for (column, row) in panel_rows.enumerate() {
            let centre = LEFT + COLUMN * (column as f64 + 0.5);
            let reference = row.ours.p50();
            let sides = [(Some(&row.ours), OURS), (row.peer.as_ref(), PEER)];
            let offsets = if row.peer.is_some() {
                [-10.0, 10.0]
            } else {
                [0.0, 0.0]
            };
            for ((distribution, colour), offset) in sides.into_iter().zip(offsets) {
                let Some(d) = distribution else { continue };
                draw_distribution(&mut svg, d, reference, centre + offset, colour, &y);
            }
            let bottom = top + PANEL;
            let _ = writeln!(
                svg,
                r#"<text x="{centre:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="{centre:.1}" y="{:.1}" text-anchor="middle" fill="dimgray">{}</text>"#,
                bottom + 16.0,
                size_name(row.size_bytes),
                bottom + 30.0,
                microseconds(reference)
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn format_ratio(value: f64) -> String {
    if value >= 1.0 {
        format!("{value:.0}")
    } else {
        format!("{value}")
    }
}

fn draw_distribution(
    svg: &mut String,
    d: &Distribution,
    reference: f64,
    x: f64,
    colour: &str,
    y: &impl Fn(f64) -> f64,
) {
    let [p50, p90, p99, p99_7] = d.percentiles.map(|value| y(value / reference));
    let max = y(d.max / reference);
    let _ = writeln!(
        svg,
        r#"<g stroke="{colour}" fill="{colour}"><title>p50 {} · p90 {} · p99 {} · p99.7 {} · max {} · sd {} ({} calls)</title><line x1="{x:.1}" x2="{x:.1}" y1="{p99:.1}" y2="{p99_7:.1}" stroke-width="2"/><rect x="{:.1}" y="{p99:.1}" width="12" height="{:.1}" fill-opacity="0.35"/><line x1="{:.1}" x2="{:.1}" y1="{p50:.1}" y2="{p50:.1}" stroke-width="2"/><line x1="{:.1}" x2="{:.1}" y1="{p90:.1}" y2="{p90:.1}"/><circle cx="{x:.1}" cy="{max:.1}" r="2.5"/></g>"#,
        microseconds(d.percentiles[0]),
        microseconds(d.percentiles[1]),
        microseconds(d.percentiles[2]),
        microseconds(d.percentiles[3]),
        microseconds(d.max),
        microseconds(d.stddev),
        d.calls,
        x - 6.0,
        (p50 - p99).max(1.0),
        x - 6.0,
        x + 6.0,
        x - 6.0,
        x + 6.0,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn distribution(samples: &[f64]) -> Distribution {
        Distribution::of(samples).unwrap()
    }

    #[test]
    fn each_size_gets_its_sides_and_labels() {
        let mut calls = vec![1.0; 1000];
        calls[3] = 4.0;
        let rows = [
            PlotRow {
                size_bytes: 8,
                placement: Placement::OutOfPlace,
                ours: distribution(&calls),
                peer: Some(distribution(&[2.0, 2.0, 3.0])),
            },
            PlotRow {
                size_bytes: 1 << 20,
                placement: Placement::OutOfPlace,
                ours: distribution(&[100.0, 150.0]),
                peer: None,
            },
        ];
        let svg = latency_svg(&rows, "title <&>", "pcieipc", Some("OpenMPI"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("title &lt;&amp;&gt;"));
        assert!(svg.contains("out of place") && !svg.contains("in place"));
        // Three distributions drawn: two sides at 8 B, one at 1 MiB.
        assert_eq!(svg.matches("<circle").count(), 3);
        assert_eq!(svg.matches(&format!(r#"stroke="{PEER}""#)).count(), 1);
        assert!(svg.contains(">8<") && svg.contains(">1M<"));
        // The tooltip carries the numbers: the slow call is the maximum.
        assert!(
            svg.contains("p50 1.00 µs · p90 1.00 µs · p99 1.00 µs · p99.7 1.00 µs · max 4.00 µs")
        );
        assert!(svg.contains(">1.00 µs<") && svg.contains(">100 µs<"));
    }

    #[test]
    fn a_tail_is_drawn_above_the_median() {
        let rows = [PlotRow {
            size_bytes: 64,
            placement: Placement::InPlace,
            ours: distribution(&[1.0, 1.0, 1.0, 10.0]),
            peer: None,
        }];
        let svg = latency_svg(&rows, "t", "pcieipc", None);
        let number_after = |text: &str, key: &str| -> f64 {
            let rest = &text[text.rfind(key).unwrap() + key.len()..];
            rest.split('"').next().unwrap().parse().unwrap()
        };
        // The 1x and 10x ticks' labels sit 4 px below their lines.
        let tick_y = |label: &str| {
            let before = &svg[..svg.find(&format!(">{label}×<")).unwrap()];
            number_after(before, " y=\"") - 4.0
        };
        let max_y = number_after(&svg, "cy=\"");
        // SVG's y grows downwards: the max, 10x the median, on the 10x line.
        assert!((max_y - tick_y("10")).abs() < 0.2, "max at {max_y}");
        assert!(max_y < tick_y("1"));
    }
}
