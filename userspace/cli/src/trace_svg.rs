//! A trace drawn as an SVG timeline (`pcieipc trace svg`): a band per rank,
//! a row per kind of span (calls, steps, waits, sleeps, GPU kernels) and one
//! per GPU stream whose steps the trace has (the copy engines' launches
//! through host memory), for a picture where no trace viewer runs. Pure:
//! trace text in, SVG text out.

use std::collections::HashMap;
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
/// The colours of GPU steps on their streams' rows: copies, flag kernels
/// and reductions.
const COPY: &str = "#00897b";
const FLAG: &str = "#c62828";
const REDUCE: &str = "#8e24aa";
const WIDTH: f64 = 1200.0;
const LABELS: f64 = 150.0;
const ROW: f64 = 18.0;
const AXIS: f64 = 30.0;

struct Span {
    pid: u64,
    name: String,
    /// An index of `ROWS`, or past them a GPU stream's row.
    row: usize,
    colour: &'static str,
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

/// A GPU step's colour, by what it is (`gpu step` in docs/trace.md).
fn gpu_step_colour(name: &str) -> &'static str {
    match name {
        "signal" | "await" | "meet" => FLAG,
        "reduce" => REDUCE,
        _ => COPY,
    }
}

/// The timeline of the lowest rank's last `last_calls` calls of the
/// largest message in the trace (a benchmark's or a training step's, not the
/// small calls around them), all ranks drawn over that time; the whole
/// trace when `last_calls` is 0 or there are no calls. Where the lowest
/// rank's calls have GPU kernel spans, those are the calls (the host only
/// queues them: the work runs on the GPU after the call returns).
pub fn timeline_svg(text: &str, last_calls: usize) -> Result<String, TraceError> {
    let events = events(text)?;
    let str_of =
        |event: &Value, key: &str| event.get(key).and_then(Value::as_str).map(str::to_owned);
    let track_names: HashMap<(u64, u64), String> = events
        .iter()
        .filter(|event| str_of(event, "ph").as_deref() == Some("M"))
        .filter(|event| str_of(event, "name").as_deref() == Some("thread_name"))
        .filter_map(|event| {
            let id = |key: &str| event.get(key).and_then(Value::as_u64);
            let name = event.get("args").and_then(|args| str_of(args, "name"))?;
            Some(((id("pid")?, id("tid")?), name))
        })
        .collect();
    let track_of = |event: &Value| {
        let id = |key: &str| event.get(key).and_then(Value::as_u64).unwrap_or(0);
        let (pid, tid) = (id("pid"), id("tid"));
        let name = track_names
            .get(&(pid, tid))
            .cloned()
            .unwrap_or_else(|| format!("GPU stream {tid}"));
        (tid, name)
    };
    let is_gpu_step = |event: &&Value| {
        str_of(event, "ph").as_deref() == Some("X")
            && str_of(event, "cat").as_deref() == Some("gpu step")
    };
    // A row per GPU stream with steps, in the order of their tracks (the
    // first a rank registered on top), each name once across the ranks.
    let mut gpu_tracks: Vec<(u64, String)> =
        events.iter().filter(is_gpu_step).map(track_of).collect();
    gpu_tracks.sort();
    let mut gpu_rows: Vec<String> = Vec::new();
    for (_, name) in gpu_tracks {
        if !gpu_rows.contains(&name) {
            gpu_rows.push(name);
        }
    }
    let mut spans = Vec::new();
    for (index, event) in events.iter().enumerate() {
        if event.get("ph").and_then(Value::as_str) != Some("X") {
            continue;
        }
        let category = event.get("cat").and_then(Value::as_str).unwrap_or("");
        let name = event
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let (row, colour) = if category == "gpu step" {
            let track = track_of(event).1;
            let row = gpu_rows
                .iter()
                .position(|known| *known == track)
                .unwrap_or(0);
            (ROWS.len() + row, gpu_step_colour(&name))
        } else {
            match ROWS.iter().position(|(row, _)| *row == category) {
                Some(row) => (row, ROWS[row].1),
                None => continue,
            }
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
            name,
            row,
            colour,
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
    let lowest = ranks.first().copied();
    let in_row = |span: &Span, row: &str| ROWS.get(span.row).is_some_and(|(name, _)| *name == row);
    let on_gpu = spans
        .iter()
        .any(|span| Some(span.pid) == lowest && in_row(span, "kernel"));
    let call_row = if on_gpu { "kernel" } else { "call" };
    let lowest_rank_calls = || {
        spans
            .iter()
            .filter(|span| Some(span.pid) == lowest && in_row(span, call_row))
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
    let rows = ROWS.len() + gpu_rows.len();
    let band = rows as f64 * ROW + 12.0;
    let height = AXIS + band * ranks.len().max(1) as f64 + 24.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut legend: Vec<(&str, &str)> = ROWS.to_vec();
    if !gpu_rows.is_empty() {
        legend.extend([("copy", COPY), ("flag", FLAG), ("reduce", REDUCE)]);
    }
    let _ = writeln!(
        svg,
        r#"<text x="{LABELS}" y="16">{:.1} µs shown ({} calls of rank {}); colours: {}</text>"#,
        length,
        shown.len(),
        ranks.first().copied().unwrap_or(0),
        legend
            .iter()
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
        let row_names = ROWS
            .iter()
            .map(|(name, _)| *name)
            .chain(gpu_rows.iter().map(String::as_str));
        for (row, name) in row_names.enumerate() {
            let _ = writeln!(
                svg,
                r##"<text x="50" y="{:.1}" fill="#555">{}</text>"##,
                top + row as f64 * ROW + 13.0,
                escape(name)
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
                span.colour,
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

    /// GPU steps get a row per stream, named by its track and ordered by
    /// it; where the calls have GPU kernel spans, the window is theirs (the
    /// host's call span only queued the work).
    #[test]
    fn gpu_steps_are_drawn_on_their_streams_rows_over_the_kernels_time() {
        let trace = json!({"traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 2, "args": {"name": "copies from host"}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "copies to host"}},
            {"ph": "X", "pid": 0, "tid": 0, "name": "all_reduce", "cat": "call", "ts": 0.0, "dur": 3.0, "args": {"count": 8}},
            {"ph": "X", "pid": 0, "tid": 0, "name": "all_reduce", "cat": "kernel", "ts": 50.0, "dur": 200.0, "args": {"count": 8}},
            {"ph": "X", "pid": 0, "tid": 2, "name": "pull", "cat": "gpu step", "ts": 120.0, "dur": 50.0},
            {"ph": "X", "pid": 0, "tid": 1, "name": "push", "cat": "gpu step", "ts": 60.0, "dur": 40.0},
            {"ph": "X", "pid": 0, "tid": 1, "name": "signal", "cat": "gpu step", "ts": 100.0, "dur": 20.0},
        ]})
        .to_string();
        let svg = timeline_svg(&trace, 1).unwrap();
        assert!(svg.contains("200.0 µs shown (1 calls of rank 0)"), "{svg}");
        let label_at = |name: &str| {
            let label = format!(r##"fill="#555">{name}</text>"##);
            let at = svg.find(&label).unwrap_or_else(|| panic!("no row {name}"));
            let y = &svg[..at];
            let y = &y[y.rfind("y=\"").unwrap() + 3..];
            y[..y.find('"').unwrap()].parse::<f64>().unwrap()
        };
        assert!(label_at("copies to host") < label_at("copies from host"));
        assert!(label_at("kernel") < label_at("copies to host"));
        let rect_of = |title: &str| {
            let at = svg
                .find(&format!("<title>{title}"))
                .unwrap_or_else(|| panic!("no {title}"));
            svg[..at].rsplit("<rect").next().unwrap().to_owned()
        };
        assert!(rect_of("push 40.0 µs").contains(COPY));
        assert!(rect_of("signal 20.0 µs").contains(FLAG));
        assert!(rect_of("pull 50.0 µs").contains(COPY));
        // The call's host span, before the kernels, is outside the window.
        assert!(!svg.contains("all_reduce 3.0 µs"));
    }
}
