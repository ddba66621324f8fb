//! Small files that must survive a power cut whole: the embedded store, the
//! node identity, the API token. [`write_file`] replaces a file so that after
//! a crash at any instant it holds either its old content or its new content,
//! never a mix, a truncation or nothing: temporary file, fsync, rename, fsync
//! of the directory (without the last two syncs, ext4 and xfs may show an
//! empty file after the rename, the failure the node identity must never see).
//!
//! What it does not do: lock against other writers (each file has one).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Replaces `path` with `bytes` crash-atomically, with permission bits `mode`
/// (e.g. 0o600 for secrets). Creates the parent directory if missing.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(directory)?;
    let mut temporary_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a file name is needed"))?
        .to_os_string();
    temporary_name.push(".tmp");
    let temporary = directory.join(temporary_name);
    // A temporary left by a crash is stale; removed first so that `mode`
    // applies (it is only set when a file is created).
    match std::fs::remove_file(&temporary) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)?;
    File::open(directory)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_whole_with_its_mode_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("weft-durable-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub/state");
        write_file(&path, b"first", 0o600).unwrap();
        // A temporary from an earlier crash, longer than the new content.
        std::fs::write(dir.join("sub/state.tmp"), b"stale and much longer").unwrap();
        write_file(&path, b"second", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert!(!dir.join("sub/state.tmp").exists());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
