//! Where a node's key-encryption keys come from: a file, or a command that
//! prints them (as LUKS keyscripts and `cryptsetup --key-file -` do), one
//! key per line, the first current. A command is how a KMS plugs in
//! (`vault kv get -field=kek secret/weft/node1`, a KMIP client, a TPM
//! unseal): weft asks it at start and at every rewrap, and keeps the keys
//! in memory only.
//!
//! What this does not do: derive or use keys (weft-volume's `crypt`).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use weft_volume::crypt::Keyring;
use zeroize::Zeroizing;

/// The longest a key command may take.
const COMMAND_PATIENCE: Duration = Duration::from_secs(30);
/// The most key text read from a source.
const KEY_TEXT_BYTES_MAX: u64 = 64 << 10;
/// The most of a failed key command's standard error quoted.
const STDERR_BYTES_MAX: u64 = 4096;

/// A source of key-encryption keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A file of keys (readable by weft's user only).
    File(PathBuf),
    /// A shell command whose standard output is the keys.
    Command(String),
}

impl KeySource {
    /// Reads the keys now (a command: in this thread, for up to 30 s).
    pub fn load(&self) -> Result<Keyring, String> {
        let text = match self {
            KeySource::File(path) => read_file(path)?,
            KeySource::Command(command) => run(command)?,
        };
        Keyring::parse(&text).map_err(|error| format!("{}: {error}", self.describe()))
    }

    /// What kind it is, for logs ("key file", "key command").
    pub fn kind(&self) -> &'static str {
        match self {
            KeySource::File(_) => "key file",
            KeySource::Command(_) => "key command",
        }
    }

    /// What it is, for messages: a file's path; never a command's text
    /// (commands carry tokens) nor any key.
    pub fn describe(&self) -> String {
        match self {
            KeySource::File(path) => format!("key file {}", path.display()),
            KeySource::Command(_) => "the key command (--kek-command)".into(),
        }
    }
}

fn read_file(path: &std::path::Path) -> Result<Zeroizing<String>, String> {
    let describe = || format!("key file {}", path.display());
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", describe()))?;
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
    let mut text = Zeroizing::new(String::new());
    file.take(KEY_TEXT_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", describe()))?;
    Ok(text)
}

/// Runs `command` in a process group of its own (killed whole if it takes
/// too long), its output read as it comes (a chatty command never blocks
/// on a full pipe).
fn run(command: &str) -> Result<Zeroizing<String>, String> {
    const WHAT: &str = "the key command (--kek-command)";
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("{WHAT}: {e}"))?;
    let started = Instant::now();
    let stdout = drain(child.stdout.take(), KEY_TEXT_BYTES_MAX);
    let stderr = drain(child.stderr.take(), STDERR_BYTES_MAX);
    let Some(status) = wait(&mut child, started) else {
        kill_group(&mut child);
        return Err(format!(
            "{WHAT} did not finish within {} s",
            COMMAND_PATIENCE.as_secs()
        ));
    };
    // A process the command left behind may hold its output open: waited
    // for no longer than the command's own time.
    let left = COMMAND_PATIENCE.saturating_sub(started.elapsed());
    let Ok(text) = stdout.recv_timeout(left) else {
        kill_group(&mut child);
        return Err(format!(
            "{WHAT} exited, but a process it started keeps its output open; make it print the keys and exit"
        ));
    };
    let text = Zeroizing::new(text);
    if !status.success() {
        let stderr = stderr
            .recv_timeout(Duration::from_secs(1))
            .unwrap_or_default();
        return Err(format!("{WHAT} failed ({status}): {}", stderr.trim()));
    }
    Ok(text)
}

/// Reads `pipe` to its end on a thread of its own (at most `limit` bytes
/// kept, the rest read and dropped); the text arrives on the receiver.
fn drain<R: Read + Send + 'static>(pipe: Option<R>, limit: u64) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.by_ref().take(limit).read_to_string(&mut text);
            let _ = std::io::copy(&mut pipe, &mut std::io::sink());
        }
        let _ = sender.send(text);
    });
    receiver
}

fn wait(child: &mut Child, started: Instant) -> Option<std::process::ExitStatus> {
    while started.elapsed() < COMMAND_PATIENCE {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Kills the command's whole process group (its children too), and the
/// shell itself in any case.
fn kill_group(child: &mut Child) {
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    let _ = child.kill();
    let _ = child.wait();
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
        // A chatty command does not block on its pipe; the text of a
        // command (it may carry a token) is never quoted.
        let chatty = format!("head -c 200000 /dev/zero | tr '\\0' x >&2; echo {KEY}");
        assert_eq!(KeySource::Command(chatty).load().unwrap().ids().len(), 1);
        let error = KeySource::Command("echo token=s3cr3t >/dev/null; exit 1".into())
            .load()
            .unwrap_err();
        assert!(!error.contains("s3cr3t"), "{error}");
        let error = KeySource::Command("echo short".into()).load().unwrap_err();
        assert!(error.contains("openssl rand -hex 32"), "{error}");
    }
}
