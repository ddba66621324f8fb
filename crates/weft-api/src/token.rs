//! The API's bearer token: 32 random bytes as hex, created at the first
//! start in `<data dir>/api-token` (or the `--api-token-file` given), mode
//! 0600, and never printed (it would land in logs). Every API call but the
//! OpenAPI document must present it as `Authorization: Bearer <token>`.
//! A token file that others may read or write is refused, wherever a token
//! is read from a file (the node, the CLI, the CSI driver).

use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// File name of the token in the data directory.
pub const FILE_NAME: &str = "api-token";

/// Reads the token at `path`, creating it first if absent; the flag says
/// whether it was created now.
pub fn load_or_create(path: &Path) -> Result<(String, bool), String> {
    match read_private(path) {
        Ok(token) => {
            if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "{}: not a usable token (16 or more printable characters); remove it to create a new one",
                    path.display()
                ));
            }
            Ok((token, false))
        }
        Err(TokenFileError::Io(error)) if error.kind() == io::ErrorKind::NotFound => {
            let token = weft_node::identity::hex(
                &weft_node::identity::random_bytes::<32>()
                    .map_err(|e| format!("random bytes for the API token: {e}"))?,
            );
            create(path, &token).map_err(|e| format!("creating {}: {e}", path.display()))?;
            Ok((token, true))
        }
        Err(error) => Err(error.describe(path)),
    }
}

/// Why a token file could not be used.
#[derive(Debug)]
pub enum TokenFileError {
    /// It could not be read.
    Io(io::Error),
    /// Others than its owner may read or write it (its mode).
    NotPrivate(u32),
}

impl TokenFileError {
    /// What was wrong with the file at `path`, and the fix.
    pub fn describe(&self, path: &Path) -> String {
        match self {
            TokenFileError::Io(error) => format!("{}: {error}", path.display()),
            TokenFileError::NotPrivate(mode) => format!(
                "{}: others may read or write it (mode {mode:04o}), and whoever reads it holds the API token: make it private with chmod 600 {} (a Kubernetes secret: defaultMode: 0400 on its volume)",
                path.display(),
                path.display()
            ),
        }
    }
}

/// The token in the file at `path`, trimmed; refused if anyone but its
/// owner may read or write the file.
pub fn read_private(path: &Path) -> Result<String, TokenFileError> {
    let mut file = std::fs::File::open(path).map_err(TokenFileError::Io)?;
    let mode = file
        .metadata()
        .map_err(TokenFileError::Io)?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenFileError::NotPrivate(mode));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(TokenFileError::Io)?;
    Ok(text.trim().to_string())
}

/// Writes a new token crash-atomically (a power cut leaves no torn token).
fn create(path: &Path, token: &str) -> io::Result<()> {
    weft_control::durable::write_file(path, format!("{token}\n").as_bytes(), 0o600)
}

/// Whether `presented` equals `expected`, in time that does not depend on
/// where they differ.
pub fn matches(expected: &str, presented: &str) -> bool {
    let (a, b) = (expected.as_bytes(), presented.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_private_and_reread() {
        let dir = std::env::temp_dir().join(format!("weft-token-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join(FILE_NAME);
        let (token, created) = load_or_create(&path).unwrap();
        assert!(created);
        assert_eq!(token.len(), 64);
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        assert_eq!(load_or_create(&path).unwrap(), (token.clone(), false));
        assert!(matches(&token, &token));
        assert!(!matches(&token, &token[1..]));
        assert!(!matches(&token, &format!("x{}", &token[1..])));
        std::fs::write(&path, "short\n").unwrap();
        assert!(load_or_create(&path).unwrap_err().contains("remove it"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_token_file_others_may_read_is_refused_with_the_fix() {
        let dir = std::env::temp_dir().join(format!("weft-token-mode-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let error = load_or_create(&path).unwrap_err();
            assert!(
                error.contains(&format!("chmod 600 {}", path.display())),
                "{error}"
            );
            assert!(error.contains(&format!("mode {mode:04o}")), "{error}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let token = read_private(&path).unwrap();
            assert_eq!(token, "0123456789abcdef0123456789abcdef");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
