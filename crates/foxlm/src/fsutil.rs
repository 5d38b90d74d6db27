//! Writing files so that a failure never leaves a torn one: every file written through here is
//! synced to disk, and [`write_atomic`] replaces a file through a temporary name and a rename.
//!
//! FOXLM_TEST_DISK_LIMIT is a testing hook: once that many bytes have been written through
//! [`write_synced`] by this process, writes fail with "no space left on device" (simulated). It
//! exists so tests can check that a full disk never corrupts a checkpoint.

use anyhow::{anyhow, Context, Result};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes written through [`write_synced`] so far, for FOXLM_TEST_DISK_LIMIT.
static BYTES_WRITTEN: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` (created or truncated) and syncs the file to disk.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let res = (|| -> std::io::Result<()> {
        if let Some(limit) = std::env::var("FOXLM_TEST_DISK_LIMIT").ok().and_then(|v| v.parse::<u64>().ok()) {
            let before = BYTES_WRITTEN.fetch_add(bytes.len() as u64, Ordering::SeqCst);
            if before + bytes.len() as u64 > limit {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    "No space left on device (simulated)",
                ));
            }
        }
        let mut f = std::fs::File::create(path)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    res.map_err(|e| anyhow!("cannot write {}: {e}", path.display()))
}

/// Replaces `path` with `bytes` through `<name>.tmp` (written with [`write_synced`]) and a rename,
/// so that `path` holds either its old content or all of the new; the temporary file does not
/// outlive a failure.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().ok_or_else(|| anyhow!("cannot write {}: not a file name", path.display()))?;
    let tmp = path.with_file_name(format!("{}.tmp", name.to_string_lossy()));
    let res = write_synced(&tmp, bytes).and_then(|()| {
        std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
    });
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Syncs a folder's entries (after files were created or renamed in it), best effort.
pub fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        for name in ["config.json", "latest"] {
            let p = d.path().join(name);
            write_atomic(&p, b"old").unwrap();
            write_atomic(&p, b"new").unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), b"new");
        }
        let mut names: Vec<String> =
            std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        names.sort();
        assert_eq!(names, ["config.json", "latest"]);
        // A rename onto a folder fails: the error names both paths, and the temporary goes.
        std::fs::create_dir(d.path().join("dir")).unwrap();
        std::fs::write(d.path().join("dir/x"), b"").unwrap();
        let e = write_atomic(&d.path().join("dir"), b"x").unwrap_err();
        assert!(format!("{e:#}").contains("cannot rename"), "{e:#}");
        assert!(!d.path().join("dir.tmp").exists());
    }
}
