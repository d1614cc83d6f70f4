//! The few WebDriver calls the browser tests make, against chromedriver
//! driving headless Chromium (W3C WebDriver, plus chromedriver's browser log
//! for console errors). Missing programs fail the test with what to install.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

/// The key W3C WebDriver names element references by.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

const INSTALL: &str = "the browser test needs Chromium and its WebDriver: \
    apt-get install chromium chromium-driver (scripts/setup-host.sh installs them)";

fn on_path(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{program} not found on PATH: {INSTALL}"))
}

/// A chromedriver process on a free local port; killed on drop, with the
/// temporary directory it and its Chromium ran with (Chromium leaves its
/// profile's scoped directories behind when it is stopped).
pub struct ChromeDriver {
    process: Child,
    scratch: PathBuf,
    base_url: String,
    chromium: PathBuf,
    agent: ureq::Agent,
}

impl ChromeDriver {
    pub fn start() -> ChromeDriver {
        let chromium = on_path("chromium");
        let chromedriver = on_path("chromedriver");
        // chromedriver takes a port number only; the kernel picks a free one
        // here, released just before chromedriver binds it.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free local port")
            .port();
        let scratch = std::env::temp_dir().join(format!("pcieipc-chromium-{port}"));
        std::fs::create_dir_all(&scratch).expect("a scratch directory for Chromium");
        let process = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .env("TMPDIR", &scratch)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("starting {}: {error}; {INSTALL}", chromedriver.display())
            });
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // Bounds on a hang, not on speed: on a busy 2-CPU machine starting
            // Chromium alone has taken tens of seconds.
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let driver = ChromeDriver {
            process,
            scratch,
            base_url: format!("http://127.0.0.1:{port}"),
            chromium,
            agent,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = driver
                .agent
                .get(format!("{}/status", driver.base_url))
                .call()
                .ok()
                .and_then(|mut response| response.body_mut().read_json::<Value>().ok())
                .is_some_and(|status| status["value"]["ready"] == true);
            if ready {
                return driver;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not answer on port {port} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The `value` of a command's answer; a WebDriver error fails the test.
    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base_url);
        let answer = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, body) => self
                .agent
                .post(&url)
                .send_json(body.unwrap_or_else(|| json!({}))),
        };
        let mut response =
            answer.unwrap_or_else(|error| panic!("WebDriver {method} {path}: {error}"));
        let status = response.status();
        let answer: Value = response
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_json()
            .unwrap_or_else(|error| {
                panic!("WebDriver {method} {path}: reading the answer: {error}")
            });
        assert!(
            status.is_success(),
            "WebDriver {method} {path}: {status}: {}",
            answer["value"]
        );
        answer["value"].clone()
    }

    /// A headless Chromium window of `width` × `height` CSS pixels at scale 1.
    pub fn session(&self, width: u32, height: u32) -> Session<'_> {
        let capabilities = json!({
            "capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": self.chromium,
                    // --no-sandbox: the test command runs as root, where
                    // Chromium's sandbox refuses to start.
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--hide-scrollbars",
                             "--force-device-scale-factor=1",
                             format!("--window-size={width},{height}")]
                },
                "goog:loggingPrefs": {"browser": "ALL"}
            }}
        });
        let answer = self.command("POST", "/session", Some(capabilities));
        let id = answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {answer}"))
            .to_string();
        Session { driver: self, id }
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        // Nothing is left to do if it already exited.
        let _ = self.process.kill();
        let _ = self.process.wait();
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// One browser window; closed on drop.
pub struct Session<'a> {
    driver: &'a ChromeDriver,
    id: String,
}

/// An element found in the page.
pub struct Element(Value);

impl Session<'_> {
    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.driver
            .command(method, &format!("/session/{}{path}", self.id), body)
    }

    pub fn open_file(&self, path: &Path) {
        let path = path.canonicalize().expect("the page exists");
        self.command(
            "POST",
            "/url",
            Some(json!({"url": format!("file://{}", path.display())})),
        );
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page.
    pub fn execute(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
    }

    pub fn find(&self, css: &str) -> Element {
        Element(self.command(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        ))
    }

    pub fn click(&self, element: &Element) {
        self.command("POST", &format!("/element/{}/click", element.id()), None);
    }

    /// Moves the pointer onto the middle of `element`, scrolled into view.
    pub fn hover(&self, element: &Element) {
        self.execute(
            "arguments[0].scrollIntoView({block: 'center', inline: 'center'});",
            json!([element.0]),
        );
        self.command(
            "POST",
            "/actions",
            Some(json!({"actions": [{
                "type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
                "actions": [{"type": "pointerMove", "duration": 0, "origin": element.0, "x": 0, "y": 0}]
            }]})),
        );
    }

    /// The window's pixels as PNG.
    pub fn screenshot(&self) -> Vec<u8> {
        let encoded = self.command("GET", "/screenshot", None);
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("the screenshot as base64"))
            .expect("the screenshot decodes")
    }

    /// The browser console's entries since the last call: (level, message),
    /// levels as chromedriver names them (SEVERE for errors).
    pub fn console(&self) -> Vec<(String, String)> {
        let entries = self.command("POST", "/se/log", Some(json!({"type": "browser"})));
        entries
            .as_array()
            .expect("log entries")
            .iter()
            .map(|entry| {
                (
                    entry["level"].as_str().unwrap_or("?").to_string(),
                    entry["message"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect()
    }
}

impl Element {
    fn id(&self) -> &str {
        self.0[ELEMENT_KEY]
            .as_str()
            .unwrap_or_else(|| panic!("not an element reference: {}", self.0))
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let url = format!("{}/session/{}", self.driver.base_url, self.id);
        // Closes the browser. Best effort: it runs after a failure too, and
        // the test's outcome is already decided.
        let _ = self.driver.agent.delete(&url).call();
    }
}
