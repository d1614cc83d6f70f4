//! A trace drawn as an SVG timeline (`pcieipc trace svg`): a band per rank,
//! a row per kind of span (calls, steps, waits, sleeps, GPU kernels), for a
//! picture where no trace viewer runs. Pure: trace text in, SVG text out.

use std::fmt::Write;

use serde_json::Value;

use pcieipc::trace::{events, TraceError};

/// The rows of a rank's band, top to bottom, with their colours.
const ROWS: [(&str, &str); 6] = [
    ("init", "#9e9e9e"),
    ("call", "#3f51b5"),
    ("step", "#43a047"),
    ("wait", "#fb8c00"),
    ("sleep", "#e53935"),
    ("kernel", "#8e24aa"),
];
const WIDTH: f64 = 1200.0;
const LABELS: f64 = 110.0;
const ROW: f64 = 18.0;
const AXIS: f64 = 30.0;

struct Span {
    pid: u64,
    name: String,
    row: usize,
    start: f64,
    end: f64,
    /// A call's element count.
    count: Option<u64>,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The timeline of the lowest rank's last `last_calls` calls of the
/// largest message in the trace (a benchmark's or a training step's, not the
/// small calls around them), all ranks drawn over that time; the whole
/// trace when `last_calls` is 0 or there are no calls.
pub fn timeline_svg(text: &str, last_calls: usize) -> Result<String, TraceError> {
    let mut spans = Vec::new();
    for (index, event) in events(text)?.iter().enumerate() {
        if event.get("ph").and_then(Value::as_str) != Some("X") {
            continue;
        }
        let category = event.get("cat").and_then(Value::as_str).unwrap_or("");
        let Some(row) = ROWS.iter().position(|(name, _)| *name == category) else {
            continue;
        };
        let number = |key: &str| event.get(key).and_then(Value::as_f64);
        let (Some(pid), Some(start), Some(duration)) = (
            event.get("pid").and_then(Value::as_u64),
            number("ts"),
            number("dur"),
        ) else {
            return Err(TraceError::BadEvent {
                index,
                what: "no pid, ts or dur",
            });
        };
        spans.push(Span {
            pid,
            name: event
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            row,
            start,
            end: start + duration.max(0.0),
            count: event
                .get("args")
                .and_then(|args| args.get("count"))
                .and_then(Value::as_u64),
        });
    }
    let mut ranks: Vec<u64> = spans.iter().map(|span| span.pid).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let lowest_rank_calls = || {
        spans
            .iter()
            .filter(|span| Some(&span.pid) == ranks.first() && ROWS[span.row].0 == "call")
    };
    let largest = lowest_rank_calls().filter_map(|call| call.count).max();
    let mut calls: Vec<&Span> = lowest_rank_calls()
        .filter(|call| call.count == largest)
        .collect();
    calls.sort_by(|a, b| a.start.total_cmp(&b.start));
    let shown = &calls[calls.len().saturating_sub(last_calls)..];
    let (from, to) = match (shown.first(), shown.last()) {
        (Some(first), Some(last)) if last_calls > 0 => (first.start, last.end),
        _ => (
            spans.iter().map(|span| span.start).fold(f64::MAX, f64::min),
            spans.iter().map(|span| span.end).fold(f64::MIN, f64::max),
        ),
    };
    let length = (to - from).max(1e-3);
    let x = |t: f64| LABELS + (t - from).clamp(0.0, length) / length * (WIDTH - LABELS - 40.0);
    let band = ROWS.len() as f64 * ROW + 12.0;
    let height = AXIS + band * ranks.len().max(1) as f64 + 24.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LABELS}" y="16">{:.1} µs shown ({} calls of rank {}); colours: {}</text>"#,
        length,
        shown.len(),
        ranks.first().copied().unwrap_or(0),
        ROWS.iter()
            .map(|(name, colour)| format!(r#"<tspan fill="{colour}">■ {name}</tspan>"#))
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (band_index, rank) in ranks.iter().enumerate() {
        let top = AXIS + band_index as f64 * band;
        let _ = writeln!(
            svg,
            r#"<text x="4" y="{:.1}" font-weight="bold">rank {rank}</text>"#,
            top + 14.0
        );
        for (row, (name, _)) in ROWS.iter().enumerate() {
            let _ = writeln!(
                svg,
                r##"<text x="50" y="{:.1}" fill="#555">{name}</text>"##,
                top + row as f64 * ROW + 13.0
            );
        }
        for span in spans
            .iter()
            .filter(|span| span.pid == *rank && span.end >= from && span.start <= to)
        {
            let (left, right) = (x(span.start), x(span.end));
            let y = top + span.row as f64 * ROW;
            let _ = write!(
                svg,
                r#"<rect x="{left:.2}" y="{y:.1}" width="{:.2}" height="{:.1}" fill="{}"><title>{} {:.1} µs</title></rect>"#,
                (right - left).max(0.5),
                ROW - 3.0,
                ROWS[span.row].1,
                escape(&span.name),
                span.end - span.start
            );
            if right - left > 7.0 * span.name.len() as f64 {
                let _ = write!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" fill="white">{}</text>"#,
                    left + 3.0,
                    y + 12.0,
                    escape(&span.name)
                );
            }
            svg.push('\n');
        }
    }
    let bottom = height - 8.0;
    for tick in 0..=4 {
        let t = from + length * f64::from(tick) / 4.0;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{bottom:.1}" text-anchor="middle">{:.1} µs</text>"#,
            x(t),
            t - from
        );
    }
    svg.push_str("</svg>\n");
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_shown_span_is_a_rect_in_its_rank_band_and_row() {
        let trace = json!({"traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
            {"ph": "X", "pid": 0, "name": "all_reduce", "cat": "call", "ts": 0.0, "dur": 100.0},
            {"ph": "X", "pid": 0, "name": "reduce", "cat": "step", "ts": 10.0, "dur": 50.0},
            {"ph": "X", "pid": 1, "name": "all_reduce", "cat": "call", "ts": 5.0, "dur": 90.0},
            {"ph": "X", "pid": 1, "name": "<wait>", "cat": "wait", "ts": 6.0, "dur": 30.0},
        ]})
        .to_string();
        let svg = timeline_svg(&trace, 10).unwrap();
        assert_eq!(svg.matches("<rect x=").count(), 4);
        assert!(svg.contains("rank 0") && svg.contains("rank 1"));
        assert!(svg.contains("&lt;wait&gt; 30.0 µs"), "names are escaped");
        assert!(svg.contains("100.0 µs shown (1 calls of rank 0)"));
        assert!(matches!(
            timeline_svg(r#"{"traceEvents": [{"ph": "X", "cat": "call"}]}"#, 1),
            Err(TraceError::BadEvent { index: 0, .. })
        ));
    }
}
