//! Compiled kernel images kept on disk between processes, so that a
//! communicator's first call does not wait for NVRTC (hundreds of
//! milliseconds per element type and reduction), as Triton and PyTorch keep
//! theirs.
//!
//! An entry is named by the digest of everything its image depends on (the
//! kernels' source, the GPU's architecture, the driver's version, this
//! crate's version: `KernelStore::key`; not NVRTC's, see `nvrtc`) and carries
//! that digest, and its image's length and CRC-32. An entry that does not read
//! back whole, names another key, or is not this user's alone (owned by
//! another user, writable by others, a link) is never loaded: it is compiled
//! again and replaced. The directory must be this user's and writable by
//! nobody else, or nothing is kept.
//!
//! The CRC guards against damage (a torn or truncated write, a flipped bit),
//! not against a writer: only the user can write the directory, and whoever
//! can could write any digest. A SHA-256 of the image did the same at 0.1 ms
//! (156 KiB, with SHA extensions) of a first call that is meant to take
//! under 1 ms; the CRC takes about 10 µs.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The first line of every entry.
const MAGIC: &[u8] = b"pcieipc kernel image 2\n";
/// Entries larger than this are not read (a module of the reduce kernels
/// is well under 1 MiB).
const MAX_ENTRY_BYTES: u64 = 64 << 20;

/// The directory of kernel images, or none (switched off, or unsafe).
pub(crate) struct KernelStore {
    dir: Option<PathBuf>,
}

/// What an entry's image depends on.
pub(crate) type Key = [u8; 32];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Whether `metadata` is this user's and writable by no one else.
fn private(metadata: &fs::Metadata) -> bool {
    // SAFETY: geteuid has no preconditions.
    metadata.uid() == unsafe { libc::geteuid() } && metadata.mode() & 0o022 == 0
}

impl KernelStore {
    /// The store `PCIEIPC_KERNEL_CACHE` names (a directory, or `off`), else
    /// `$XDG_CACHE_HOME/pcieipc/kernels`, else `~/.cache/pcieipc/kernels`.
    pub(crate) fn from_env() -> KernelStore {
        let chosen = match std::env::var_os("PCIEIPC_KERNEL_CACHE") {
            Some(value) if value == "off" => None,
            Some(value) => Some(PathBuf::from(value)),
            None => std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))
                .map(|cache| cache.join("pcieipc").join("kernels")),
        };
        match chosen {
            Some(dir) => KernelStore::in_dir(&dir),
            None => KernelStore { dir: None },
        }
    }

    /// The store in `dir`, made (mode 0700) if missing; none when it is not
    /// a directory of this user's that nobody else may write.
    pub(crate) fn in_dir(dir: &Path) -> KernelStore {
        let _ = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
        let usable =
            fs::symlink_metadata(dir).is_ok_and(|metadata| metadata.is_dir() && private(&metadata));
        KernelStore {
            dir: usable.then(|| dir.to_path_buf()),
        }
    }

    /// The key of an image built from `parts` (source, architecture,
    /// driver version), each length-prefixed so that no two lists collide.
    pub(crate) fn key(parts: &[&[u8]]) -> Key {
        let mut hasher = Sha256::new();
        hasher.update(env!("CARGO_PKG_VERSION").as_bytes());
        for part in parts {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        hasher.finalize().into()
    }

    fn path(&self, key: &Key) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|dir| dir.join(format!("{}.bin", hex(key))))
    }

    /// The image stored under `key`, if its entry is whole, is the one for
    /// `key`, and is this user's alone.
    pub(crate) fn load(&self, key: &Key) -> Option<Vec<u8>> {
        let path = self.path(key)?;
        let mut file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .ok()?;
        let metadata = file.metadata().ok()?;
        if !metadata.is_file() || !private(&metadata) || metadata.len() > MAX_ENTRY_BYTES {
            return None;
        }
        let mut entry = Vec::with_capacity(metadata.len() as usize);
        file.read_to_end(&mut entry).ok()?;
        parse_entry(&entry, key)
    }

    /// Stores `image` under `key`: written to a new private file, then
    /// renamed over the entry, so that a reader sees the old entry or the
    /// new one whole. Failing to store only costs the next process a
    /// compile.
    pub(crate) fn save(&self, key: &Key, image: &[u8]) {
        let Some(path) = self.path(key) else {
            return;
        };
        let staged = path.with_extension(format!("tmp-{}", std::process::id()));
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&staged)
            .and_then(|mut file: File| file.write_all(&entry(key, image)));
        if written.and_then(|()| fs::rename(&staged, &path)).is_err() {
            let _ = fs::remove_file(&staged);
        }
    }
}

/// The line that seals `image`: its length and CRC-32.
fn seal(image: &[u8]) -> String {
    format!("{} {:08x}\n", image.len(), crc32fast::hash(image))
}

/// An entry: the magic line, the key in hex (a line), the image's seal (a
/// line), then the image.
fn entry(key: &Key, image: &[u8]) -> Vec<u8> {
    let mut entry = MAGIC.to_vec();
    entry.extend_from_slice(format!("{}\n{}", hex(key), seal(image)).as_bytes());
    entry.extend_from_slice(image);
    entry
}

/// The image of `entry` if it is an entry for `key` whose image matches its
/// seal.
fn parse_entry(entry: &[u8], key: &Key) -> Option<Vec<u8>> {
    let rest = entry.strip_prefix(MAGIC)?;
    let header = format!("{}\n", hex(key));
    let rest = rest.strip_prefix(header.as_bytes())?;
    let newline = rest.iter().position(|&byte| byte == b'\n')?;
    let image = &rest[newline + 1..];
    (rest[..=newline] == *seal(image).as_bytes()).then(|| image.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "pcieipc-kernel-store-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    const IMAGE: &[u8] = b"\x7fELF a kernel image";

    #[test]
    fn an_image_comes_back_under_its_key_only() {
        let dir = scratch("roundtrip");
        let store = KernelStore::in_dir(&dir);
        let key = KernelStore::key(&[b"source", b"sm_90"]);
        assert_eq!(store.load(&key), None);
        store.save(&key, IMAGE);
        assert_eq!(store.load(&key).as_deref(), Some(IMAGE));
        assert_eq!(store.load(&KernelStore::key(&[b"source", b"sm_80"])), None);
        let mode = fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_differ_with_every_part_and_its_boundaries() {
        let key = KernelStore::key;
        assert_ne!(key(&[b"ab", b"c"]), key(&[b"a", b"bc"]));
        assert_ne!(
            key(&[b"source", b"sm_90"]),
            key(&[b"source", b"sm_90", b""])
        );
        assert_eq!(key(&[b"source", b"sm_90"]), key(&[b"source", b"sm_90"]));
    }

    #[test]
    fn corrupt_foreign_or_shared_entries_are_never_loaded_and_are_rebuilt() {
        let dir = scratch("refused");
        let store = KernelStore::in_dir(&dir);
        let (key, other) = (KernelStore::key(&[b"one"]), KernelStore::key(&[b"two"]));
        let path = store.path(&key).unwrap();
        let mut whole = entry(&key, IMAGE);
        // A flipped bit of the image, a truncated entry, an image a byte
        // short or long, another key's entry under this name, a bad magic
        // line.
        let last = whole.len() - 1;
        whole[last] ^= 1;
        let short = entry(&key, IMAGE)[..last].to_vec();
        let long = [entry(&key, IMAGE).as_slice(), b"\0"].concat();
        let refused: [(&str, Vec<u8>); 6] = [
            ("corrupt", whole),
            ("truncated", entry(&key, IMAGE)[..MAGIC.len() + 10].to_vec()),
            ("a byte short", short),
            ("a byte long", long),
            ("foreign", entry(&other, IMAGE)),
            (
                "magic",
                [b"x".as_slice(), &entry(&key, IMAGE)[1..]].concat(),
            ),
        ];
        for (what, bytes) in refused {
            fs::write(&path, bytes).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
            assert_eq!(store.load(&key), None, "{what}");
            store.save(&key, IMAGE);
            assert_eq!(store.load(&key).as_deref(), Some(IMAGE), "{what}: rebuilt");
        }
        // Whole and right, but writable by others, or a link to such an entry.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(store.load(&key), None, "writable by others");
        let elsewhere = dir.join("elsewhere");
        fs::write(&elsewhere, entry(&key, IMAGE)).unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o600)).unwrap();
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert_eq!(store.load(&key), None, "a link");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_may_write_keeps_nothing() {
        let dir = scratch("shared");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let store = KernelStore::in_dir(&dir);
        let key = KernelStore::key(&[b"source"]);
        store.save(&key, IMAGE);
        assert_eq!(store.load(&key), None);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
        fs::remove_dir_all(&dir).unwrap();
    }
}
