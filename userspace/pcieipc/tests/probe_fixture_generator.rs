//! The committed synthetic fixture is exactly what the generator writes.
//! Run with PCIEIPC_WRITE_FIXTURES=1 to rewrite it after changing the generator.

#[path = "../../../tests/fixtures/sysfs/generator.rs"]
mod generator;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Every file (contents) and symlink (target) under `root`, by relative path.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut entries = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(root).unwrap().to_path_buf();
            let kind = fs::symlink_metadata(&path).unwrap().file_type();
            if kind.is_symlink() {
                entries.insert(
                    relative,
                    format!("-> {}", fs::read_link(&path).unwrap().display()),
                );
            } else if kind.is_dir() {
                pending.push(path);
            } else {
                entries.insert(relative, format!("{:?}", fs::read(&path).unwrap()));
            }
        }
    }
    entries
}

#[test]
fn committed_dgx8_fixture_matches_the_generator() {
    let committed = generator::fixture_root("dgx8");
    if std::env::var_os("PCIEIPC_WRITE_FIXTURES").is_some() {
        if committed.exists() {
            fs::remove_dir_all(&committed).unwrap();
        }
        generator::write_tree(&committed, &generator::dgx_eight_gpu(), 4096).unwrap();
    }
    let fresh = generator::ScratchDir::new("dgx8").unwrap();
    let root = fresh.path.join("root");
    generator::write_tree(&root, &generator::dgx_eight_gpu(), 4096).unwrap();
    let expected = snapshot(&root);
    let actual = snapshot(&committed);
    assert_eq!(expected.len(), actual.len(), "entry count");
    for (path, content) in &expected {
        assert_eq!(actual.get(path), Some(content), "{}", path.display());
    }
}

#[test]
fn large_tree_has_the_requested_size() {
    let devices = generator::large_tree(1000, 16);
    assert_eq!(devices.len(), 1000);
    assert_eq!(
        devices
            .iter()
            .filter(|device| device.class_code >> 8 == 0x0302)
            .count(),
        16
    );
}
