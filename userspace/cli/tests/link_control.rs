//! Root's opt-in to retraining links of devices another driver owns, on a
//! copy of the DGX-like fixture (its link above switch 0000:08:00.0 is
//! degraded): `pcieipc probe` marks that link retrainable or not with the
//! line that allows it, and `pcieipc link allow / disallow / allowed` read
//! and write the module parameter under `--sysfs-root`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PARAMETER: &str = "sys/module/pcieipc/parameters/link_control";

/// A copy of the dgx8 fixture, removed when dropped.
struct Root(PathBuf);

impl Root {
    fn new(name: &str) -> Root {
        let path = std::env::temp_dir().join(format!(
            "pcieipc-link-control-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sysfs/dgx8");
        let copied = Command::new("cp")
            .arg("-a")
            .arg(&fixture)
            .arg(&path)
            .status()
            .expect("run cp");
        assert!(copied.success(), "copying {}", fixture.display());
        Root(path)
    }

    fn text(&self) -> &str {
        self.0.to_str().unwrap()
    }

    fn parameter(&self) -> PathBuf {
        self.0.join(PARAMETER)
    }

    /// The module "loaded": its parameter file, holding `list`.
    fn load_module(&self, list: &str) {
        std::fs::create_dir_all(self.parameter().parent().unwrap()).unwrap();
        std::fs::write(self.parameter(), list).unwrap();
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pcieipc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .args(args)
        .output()
        .expect("run pcieipc")
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "pcieipc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The probe's line for the degraded switch port.
fn switch_line(root: &Root) -> String {
    // The degraded link on a GPU path is an error finding: the probe exits 1
    // (`--fail-on error`), having printed its report.
    let output = pcieipc(&["probe", "--sysfs-root", root.text()]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    text.lines()
        .find(|line| line.contains("[0000:08:00.0]"))
        .unwrap_or_else(|| panic!("no line for 0000:08:00.0 in:\n{text}"))
        .to_string()
}

#[test]
fn probe_marks_the_degraded_link_and_allow_makes_it_retrainable() {
    let root = Root::new("probe");
    let line = switch_line(&root);
    assert!(
        line.contains("DEGRADED (not retrainable: pcieipc.ko is not loaded; to allow: insmod pcieipc.ko link_control=0000:08:00.0)"),
        "{line}"
    );

    root.load_module("\n");
    let line = switch_line(&root);
    assert!(
        line.contains("DEGRADED (not retrainable: pcieipc does not bind 0000:08:00.0 and root has not listed it in link_control; to allow: pcieipc link allow 0000:08:00.0 "),
        "{line}"
    );
    let link = |args: &[&str]| {
        let mut all = vec!["link", "--sysfs-root", root.text()];
        all.extend_from_slice(args);
        pcieipc(&all)
    };
    assert_eq!(stdout_of(&link(&["allowed", "--json"])).trim(), "[]");

    stdout_of(&link(&["allow", "0000:08:00.0", "5e:00.0"]));
    assert_eq!(
        std::fs::read_to_string(root.parameter()).unwrap(),
        "0000:08:00.0,0000:5e:00.0\n"
    );
    assert!(switch_line(&root).contains("DEGRADED (retrainable)"));
    // Allowing it again changes nothing.
    stdout_of(&link(&["allow", "0000:08:00.0"]));
    assert_eq!(
        stdout_of(&link(&["allowed", "--json"])).trim(),
        r#"["0000:08:00.0","0000:5e:00.0"]"#
    );

    let refused = link(&["allow", "10000:01:00.0"]);
    assert!(!refused.status.success());
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(
        error.contains("PCI domains above 0xffff are not supported"),
        "{error}"
    );
    let malformed = link(&["allow", "0000:01:20.0"]);
    assert!(!malformed.status.success());
    assert!(
        String::from_utf8_lossy(&malformed.stderr).contains("0000:01:20.0"),
        "{}",
        String::from_utf8_lossy(&malformed.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.parameter()).unwrap(),
        "0000:08:00.0,0000:5e:00.0\n",
        "a refused address changes nothing"
    );

    stdout_of(&link(&["disallow", "0000:08:00.0"]));
    assert_eq!(
        std::fs::read_to_string(root.parameter()).unwrap(),
        "0000:5e:00.0\n"
    );
    assert!(switch_line(&root).contains("DEGRADED (not retrainable"));
}

#[test]
fn allow_without_the_module_says_so() {
    let root = Root::new("unloaded");
    let output = pcieipc(&["link", "--sysfs-root", root.text(), "allow", "0000:08:00.0"]);
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("parameters/link_control: not there: is pcieipc.ko loaded?"),
        "{error}"
    );
}
