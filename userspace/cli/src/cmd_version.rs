//! `pcieipc --version`: this program's version, the commit it was built
//! from and the ABI it speaks, and, where `/dev/pcieipc` exists, the loaded
//! module's ABI, said plainly when the two differ.

use std::process::ExitCode;

use pcieipc::device::{Device, DeviceError, ModuleVersion, ABI_VERSION, DEFAULT_PATH};

/// What became of asking the loaded module.
pub(crate) enum Module {
    Absent,
    Loaded(ModuleVersion),
    /// It speaks another ABI (major, minor).
    Differs(u16, u16),
    /// It could not be asked (not root, say): why.
    Unreadable(String),
}

/// The two lines `--version` prints (pure, for tests).
pub(crate) fn describe(version: &str, commit: &str, module: &Module) -> String {
    let (major, minor) = ABI_VERSION;
    let module = match module {
        Module::Absent => format!("no module loaded ({DEFAULT_PATH} absent)"),
        Module::Loaded(loaded) => format!(
            "loaded module {} speaks ABI {}.{} ({DEFAULT_PATH})",
            loaded.module_version, loaded.abi_major, loaded.abi_minor
        ),
        Module::Differs(module_major, module_minor) => format!(
            "the loaded module speaks ABI {module_major}.{module_minor} ({DEFAULT_PATH}): \
             they differ; load the module built from the same sources"
        ),
        Module::Unreadable(why) => format!("the loaded module could not be asked: {why}"),
    };
    format!("pcieipc {version} (commit {commit})\nABI {major}.{minor}; {module}\n")
}

/// Asks the module at `DEFAULT_PATH`, if it is there.
fn loaded_module() -> Module {
    match Device::open(DEFAULT_PATH).and_then(|device| device.version()) {
        Ok(loaded) => Module::Loaded(loaded),
        Err(DeviceError::Open { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Module::Absent
        }
        Err(DeviceError::AbiMismatch {
            module_major,
            module_minor,
            ..
        }) => Module::Differs(module_major, module_minor),
        Err(error) => Module::Unreadable(error.to_string()),
    }
}

pub(crate) fn run() -> anyhow::Result<ExitCode> {
    print!(
        "{}",
        describe(
            env!("CARGO_PKG_VERSION"),
            env!("PCIEIPC_COMMIT"),
            &loaded_module()
        )
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_module_state_is_said_with_this_program_s_abi() {
        let (major, minor) = ABI_VERSION;
        let first = "pcieipc 1.2.3 (commit 0123456789ab)\n";
        assert_eq!(
            describe("1.2.3", "0123456789ab", &Module::Absent),
            format!("{first}ABI {major}.{minor}; no module loaded (/dev/pcieipc absent)\n")
        );
        let loaded = ModuleVersion {
            abi_major: major,
            abi_minor: minor,
            bound_devices: 2,
            module_version: "1.2.3".into(),
            events_emitted: 0,
        };
        assert_eq!(
            describe("1.2.3", "0123456789ab", &Module::Loaded(loaded)),
            format!(
                "{first}ABI {major}.{minor}; loaded module 1.2.3 speaks ABI {major}.{minor} \
                 (/dev/pcieipc)\n"
            )
        );
        let differs = describe("1.2.3", "0123456789ab", &Module::Differs(major + 1, 0));
        assert!(
            differs.ends_with(&format!(
                "the loaded module speaks ABI {}.0 (/dev/pcieipc): they differ; load the module \
                 built from the same sources\n",
                major + 1
            )),
            "{differs}"
        );
        let unreadable = describe(
            "1.2.3",
            "x",
            &Module::Unreadable("permission denied".into()),
        );
        assert!(unreadable.ends_with("could not be asked: permission denied\n"));
    }
}
