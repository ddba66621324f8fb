//! The API's bearer token: 32 random bytes as hex, created at the first
//! start in `<data dir>/api-token` (or the `--api-token-file` given), mode
//! 0600, and printed once, when created. Every API call but the OpenAPI
//! document must present it as `Authorization: Bearer <token>`.

use std::io;
use std::path::Path;

/// File name of the token in the data directory.
pub const FILE_NAME: &str = "api-token";

/// Reads the token at `path`, creating it first if absent; the flag says
/// whether it was created now.
pub fn load_or_create(path: &Path) -> Result<(String, bool), String> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let token = text.trim().to_string();
            if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "{}: not a usable token (16 or more printable characters); remove it to create a new one",
                    path.display()
                ));
            }
            Ok((token, false))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            let token = weft_node::identity::hex(
                &weft_node::identity::random_bytes::<32>()
                    .map_err(|e| format!("random bytes for the API token: {e}"))?,
            );
            create(path, &token).map_err(|e| format!("creating {}: {e}", path.display()))?;
            Ok((token, true))
        }
        Err(error) => Err(format!("{}: {error}", path.display())),
    }
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
}
