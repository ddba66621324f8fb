//! Where a node's key-encryption keys come from: a file, or a command that
//! prints them (as LUKS keyscripts and `cryptsetup --key-file -` do), one
//! key per line, the first current. A command is how a KMS plugs in
//! (`vault kv get -field=kek secret/weft/node1`, a KMIP client, a TPM
//! unseal): weft asks it at start and at every rewrap, and keeps the keys
//! in memory only.
//!
//! What this does not do: derive or use keys (weft-volume's `crypt`).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use weft_volume::crypt::Keyring;

/// The longest a key command may take.
const COMMAND_PATIENCE: Duration = Duration::from_secs(30);
/// The most key text read from a source.
const KEY_TEXT_BYTES_MAX: u64 = 64 << 10;

/// A source of key-encryption keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A file of keys (readable by weft's user only).
    File(PathBuf),
    /// A shell command whose standard output is the keys.
    Command(String),
}

impl KeySource {
    /// Reads the keys now.
    pub fn load(&self) -> Result<Keyring, String> {
        let text = match self {
            KeySource::File(path) => read_file(path)?,
            KeySource::Command(command) => run(command)?,
        };
        Keyring::parse(&text).map_err(|error| format!("{}: {error}", self.describe()))
    }

    /// What it is, for messages (never the keys).
    pub fn describe(&self) -> String {
        match self {
            KeySource::File(path) => format!("key file {}", path.display()),
            KeySource::Command(command) => format!("key command `{command}`"),
        }
    }
}

fn read_file(path: &std::path::Path) -> Result<String, String> {
    let describe = || format!("key file {}", path.display());
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", describe()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file
            .metadata()
            .map_err(|e| format!("{}: {e}", describe()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "{} can be read by other users (mode {:o}); run `chmod 600 {}`",
                describe(),
                mode & 0o777,
                path.display()
            ));
        }
    }
    let mut text = String::new();
    file.take(KEY_TEXT_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", describe()))?;
    Ok(text)
}

fn run(command: &str) -> Result<String, String> {
    let describe = || format!("key command `{command}`");
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", describe()))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() > COMMAND_PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{} did not finish within {} s",
                describe(),
                COMMAND_PATIENCE.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut text = String::new();
    if let Some(stdout) = child.stdout.take() {
        stdout
            .take(KEY_TEXT_BYTES_MAX)
            .read_to_string(&mut text)
            .map_err(|e| format!("{}: {e}", describe()))?;
    }
    if !status.success() {
        let mut stderr = String::new();
        if let Some(pipe) = child.stderr.take() {
            let _ = pipe.take(4096).read_to_string(&mut stderr);
        }
        return Err(format!(
            "{} failed ({status}): {}",
            describe(),
            stderr.trim()
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b";

    #[test]
    fn a_file_of_keys_loads_and_must_be_private() {
        let dir = std::env::temp_dir().join(format!("weft-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kek");
        std::fs::write(&path, format!("# node key\n{KEY}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = KeySource::File(path.clone()).load().unwrap_err();
        assert!(error.contains("chmod 600"), "{error}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(KeySource::File(path).load().unwrap().ids().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_command_prints_keys_and_its_failure_is_told() {
        let ring = KeySource::Command(format!("printf '%s\\n%s\\n' new-{KEY} {KEY}"))
            .load()
            .unwrap();
        assert_eq!(ring.ids().len(), 2);
        let error = KeySource::Command("echo vault sealed >&2; exit 3".into())
            .load()
            .unwrap_err();
        assert!(error.contains("vault sealed"), "{error}");
        let error = KeySource::Command("echo short".into()).load().unwrap_err();
        assert!(error.contains("openssl rand -hex 32"), "{error}");
    }
}
