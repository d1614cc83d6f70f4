//! `pcieipc probe --html` in a real browser: headless Chromium loads the page
//! of the dgx8 fixture (with its monitor events) and of this machine, and the
//! test reads the DOM: a box per device of the report, the degraded link
//! marked, each ring drawn and switched off and on by its checkbox, a
//! device's hover card, the events on the time strip, and no console errors.
//! It saves the dgx8 page's screenshot in the target directory, and as
//! docs/probe-html.png (the README's picture) with PCIEIPC_WRITE_SCREENSHOT=1.
//! Chromium and chromedriver are required: without them the test fails.

mod webdriver;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use webdriver::{ChromeDriver, Session};

const WINDOW: (u32, u32) = (1700, 1500);

fn repository(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// `pcieipc probe ARGS --json` from the repository root, parsed, after
/// writing the page to `html`.
fn probe_with_html(args: &[&str], html: &Path) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .current_dir(repository(""))
        .arg("probe")
        .args(args)
        .arg("--html")
        .arg(html)
        .arg("--json")
        .output()
        .expect("run pcieipc probe");
    // 1 is a finding at --fail-on (the dgx8 fixture's degraded link); 2 a failed probe.
    assert!(
        matches!(output.status.code(), Some(0 | 1)),
        "pcieipc probe {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the JSON report")
}

/// Whether an element is drawn: it has a box of some size. (Chromium's
/// `checkVisibility()` answers true for SVG shapes inside a hidden group.)
const DRAWN: &str = "const drawn = element => { \
    const box = element.getBoundingClientRect(); return box.width > 0 && box.height > 0; };";

fn strings(value: Value) -> Vec<String> {
    serde_json::from_value(value).expect("a list of strings")
}

/// What every page must show of its report.
fn check_page(session: &Session, report: &Value, page: &str) {
    let bdfs: Vec<String> = report["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|device| device["bdf"].as_str().unwrap().to_string())
        .collect();
    assert!(!bdfs.is_empty(), "{page}: the report lists no devices");
    let boxes = strings(session.execute(
        "return Array.from(document.querySelectorAll('#tree g.device'), \
         node => node.dataset.bdf + ' ' + node.querySelector('.bdf').textContent);",
        json!([]),
    ));
    let expected: Vec<String> = bdfs.iter().map(|bdf| format!("{bdf} {bdf}")).collect();
    assert_eq!(boxes, expected, "{page}: device boxes (data-bdf, text)");

    let degraded: Vec<&str> = report["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|device| device["link"]["state"] == "degraded")
        .map(|device| device["bdf"].as_str().unwrap())
        .collect();
    let marked = strings(session.execute(
        &format!("{DRAWN} return Array.from(document.querySelectorAll('#tree g.link.degraded'), link => \
         link.dataset.bdf + ' ' + getComputedStyle(link.querySelector('line')).strokeDasharray + ' ' + \
         drawn(link.querySelector('.degraded-mark')) + ' ' + \
         link.querySelector('.degraded-mark').textContent);"),
        json!([]),
    ));
    assert_eq!(
        marked.len(),
        degraded.len(),
        "{page}: degraded links {marked:?}"
    );
    for (mark, bdf) in marked.iter().zip(&degraded) {
        assert!(
            mark.starts_with(&format!("{bdf} 8px, 5px true DEGRADED ")),
            "{page}: {mark}"
        );
    }

    let gpus = report["gpus"].as_array().unwrap().len();
    let visible_hops = |ring: &str| {
        session
            .execute(
                &format!(
                    "{DRAWN} return Array.from(document.querySelectorAll(\
                 '#tree g.ring[data-ring=\"' + arguments[0] + '\"] path.ring-edge'))\
                 .filter(drawn).length;"
                ),
                json!([ring]),
            )
            .as_u64()
            .unwrap() as usize
    };
    if report["ring"]["best"].is_null() {
        let toggles = session.execute(
            "return document.querySelectorAll('input[data-ring]').length;",
            json!([]),
        );
        assert_eq!(toggles, 0, "{page}: ring switches without a ring");
    } else {
        for (ring, other) in [("best", "nccl"), ("nccl", "best")] {
            assert_eq!(
                visible_hops(ring),
                gpus,
                "{page}: {ring} ring shown at first"
            );
            let toggle = session.find(&format!("#toggle-ring-{ring}"));
            session.click(&toggle);
            assert_eq!(visible_hops(ring), 0, "{page}: {ring} ring switched off");
            assert_eq!(visible_hops(other), gpus, "{page}: {other} ring stays");
            session.click(&toggle);
            assert_eq!(visible_hops(ring), gpus, "{page}: {ring} ring switched on");
        }
    }
}

/// Console errors so far must be none; a planted one proves they are read.
fn check_console(session: &Session, page: &str) {
    let severe: Vec<(String, String)> = session
        .console()
        .into_iter()
        .filter(|(level, _)| level == "SEVERE")
        .collect();
    assert!(severe.is_empty(), "{page}: console errors: {severe:?}");
    session.execute("console.error('planted by the test');", json!([]));
    let planted = session.console();
    assert!(
        planted
            .iter()
            .any(|(level, message)| level == "SEVERE" && message.contains("planted by the test")),
        "{page}: the console is not being read: {planted:?}"
    );
}

#[test]
fn probe_html_pages_render_in_chromium() {
    let driver = ChromeDriver::start();
    let session = driver.session(WINDOW.0, WINDOW.1);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("probe-html");
    std::fs::create_dir_all(&out).unwrap();

    // The dgx8 fixture with its monitor events.
    let dgx8_html = out.join("dgx8.html");
    // Relative, as the README's command names them: the page shows its root.
    let events = "tests/fixtures/events/dgx8-monitor.jsonl";
    let report = probe_with_html(
        &[
            "--sysfs-root",
            "tests/fixtures/sysfs/dgx8",
            "--events",
            events,
        ],
        &dgx8_html,
    );
    session.open_file(&dgx8_html);
    check_page(&session, &report, "dgx8");
    assert_eq!(report["devices"].as_array().unwrap().len(), 38);
    let degraded = session.execute(
        "return Array.from(document.querySelectorAll('#tree g.link.degraded'), link => link.dataset.bdf);",
        json!([]),
    );
    assert_eq!(degraded, json!(["0000:08:00.0"]));
    let lines = std::fs::read_to_string(repository(events))
        .unwrap()
        .lines()
        .count();
    let strip = session.execute(
        "return document.querySelectorAll('#timeline g.event').length;",
        json!([]),
    );
    assert_eq!(strip, json!(lines));

    // GPU6's card under the pointer: its AER counters and health.
    let gpu6 = session.find("#tree g.device[data-bdf=\"0000:8a:00.0\"]");
    session.hover(&gpu6);
    let card = session.execute(
        &format!(
            "{DRAWN} const card = document.getElementById('card-0000-8a-00-0'); \
         return [drawn(card), card.innerText];"
        ),
        json!([]),
    );
    assert_eq!(card[0], true, "GPU6's card is not shown: {card}");
    let text = card[1].as_str().unwrap();
    for expected in [
        "0000:8a:00.0 GPU6",
        "correctable 90000, non-fatal 3, fatal 0",
        "0.9097 from aer counters, SUB-HEALTHY",
        "IOMMU group\t32",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} not in GPU6's card:\n{text}"
        );
    }
    // Back to the top for the picture, the card still up.
    session.execute("window.scrollTo(0, 0);", json!([]));
    session.hover(&session.find("#tree g.device[data-bdf=\"0000:8a:00.0\"]"));
    let png = session.screenshot();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "the screenshot is a PNG");
    let size = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    let viewport = session.execute("return [window.innerWidth, window.innerHeight];", json!([]));
    assert_eq!(json!([size(16), size(20)]), viewport, "screenshot size");
    assert_eq!(size(16), WINDOW.0);
    std::fs::write(out.join("dgx8.png"), &png).unwrap();
    if std::env::var_os("PCIEIPC_WRITE_SCREENSHOT").is_some_and(|value| value == "1") {
        std::fs::write(repository("docs/probe-html.png"), &png).unwrap();
    }
    check_console(&session, "dgx8");

    // This machine, under the default sysfs root.
    let live_html = out.join("this-machine.html");
    let report = probe_with_html(&[], &live_html);
    session.open_file(&live_html);
    check_page(&session, &report, "this machine");
    check_console(&session, "this machine");
}
