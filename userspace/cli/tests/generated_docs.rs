//! The completions and man pages come from the parser's definitions: every
//! subcommand and its flags are in them, and a bad shell or an
//! unwritable directory is a clear error.

use std::process::{Command, Output};

const SUBCOMMANDS: [&str; 9] = [
    "probe",
    "bench",
    "device",
    "link",
    "monitor",
    "events",
    "trace",
    "completions",
    "man-pages",
];

fn pcieipc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .args(args)
        .output()
        .expect("run pcieipc")
}

fn stdout_of(args: &[&str]) -> String {
    let output = pcieipc(args);
    assert!(
        output.status.success(),
        "pcieipc {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[test]
fn completions_name_every_subcommand_and_their_flags() {
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout_of(&["completions", shell]);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell}: no '{sub}' in the script");
        }
        for flag in ["sysfs-root", "nranks", "store", "link-of"] {
            // fish names a long flag as `-l NAME`, the others as `--NAME`.
            let spelled = if shell == "fish" {
                format!("-l {flag}")
            } else {
                format!("--{flag}")
            };
            assert!(
                script.contains(&spelled),
                "{shell}: no '{spelled}' in the script"
            );
        }
    }
    assert!(stdout_of(&["completions", "bash"]).contains("complete -F _pcieipc"));
}

#[test]
fn a_shell_it_does_not_know_is_refused() {
    let output = pcieipc(&["completions", "tcsh"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid value 'tcsh'"), "{stderr}");
    assert!(
        stderr.contains("bash"),
        "the choices are not listed: {stderr}"
    );
}

#[test]
fn man_pages_one_per_command_with_its_flags() {
    let dir = std::env::temp_dir().join(format!("pcieipc-man-{}", std::process::id()));
    stdout_of(&["man-pages", dir.to_str().unwrap()]);
    let page = |name: &str| {
        std::fs::read_to_string(dir.join(name)).unwrap_or_else(|err| panic!("{name}: {err}"))
    };
    let main = page("pcieipc.1");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        main.contains(&format!(".TH pcieipc 1  \"pcieipc {version}\"")),
        "no title line with the version: {main}"
    );
    for sub in SUBCOMMANDS {
        let roff_name = format!("pcieipc\\-{}(1)", sub.replace('-', "\\-"));
        assert!(
            main.contains(&roff_name),
            "pcieipc.1 does not point to {sub}"
        );
        let sub_page = page(&format!("pcieipc-{sub}.1"));
        assert!(
            sub_page.contains(&format!(".TH pcieipc-{sub} 1")),
            "pcieipc-{sub}.1: {sub_page}"
        );
    }
    assert!(page("pcieipc-probe.1").contains("\\-\\-sysfs\\-root"));
    assert!(page("pcieipc-bench.1").contains("\\-\\-nranks"));
    assert!(
        page("pcieipc-link-retrain.1").contains("pcieipc link allow"),
        "nested subcommands"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn man_pages_into_a_file_names_it() {
    let file = std::env::temp_dir().join(format!("pcieipc-man-file-{}", std::process::id()));
    std::fs::write(&file, b"").unwrap();
    let output = pcieipc(&["man-pages", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(file.to_str().unwrap()), "{stderr}");
}
