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

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything: the operator, and every node calling another.
    Admin,
    /// Volume lifecycle (create, delete, grow, snapshot, attach, limits)
    /// and the hosts it attaches, and every read: the CSI controller.
    Csi,
    /// Every read and /metrics: Prometheus, dashboards.
    ReadOnly,
}

impl Role {
    /// The suffix of its token file (beside the admin token's), for the scoped ones.
    fn file_suffix(self) -> &'static str {
        match self {
            Role::Admin => "",
            Role::Csi => ".csi",
            Role::ReadOnly => ".read-only",
        }
    }

    /// Whether it may call `method` on route `pattern` (relative to `/api/v1/`).
    pub fn allows(self, method: &str, pattern: &str) -> bool {
        match self {
            Role::Admin => true,
            Role::ReadOnly => method == "GET",
            Role::Csi => {
                method == "GET"
                    || matches!(
                        (method, pattern),
                        ("POST", "volumes")
                            | ("DELETE", "volumes/{volume}")
                            | ("POST", "volumes/{volume}/resize")
                            | ("POST", "volumes/{volume}/flatten")
                            | ("PATCH", "volumes/{volume}/qos")
                            | ("POST", "volumes/{volume}/hosts")
                            | ("DELETE", "volumes/{volume}/hosts/{host}")
                            | ("POST", "volumes/{volume}/snapshots")
                            | ("DELETE", "volumes/{volume}/snapshots/{snapshot}")
                            | ("POST", "hosts")
                            // Its own hosts' DH-HMAC-CHAP secrets (`csi-`
                            // hosts only: Api::handle checks the name).
                            | ("PATCH", "hosts/{host}")
                    )
            }
        }
    }

    /// The scoped role named `name` (`csi`, `read-only`), as the CLI and
    /// the API name them.
    pub fn scoped_named(name: &str) -> Option<Role> {
        match name {
            "csi" => Some(Role::Csi),
            "read-only" => Some(Role::ReadOnly),
            _ => None,
        }
    }

    /// Its name in the API's answers (`GET session`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Csi => "csi",
            Role::ReadOnly => "read-only",
        }
    }

    /// How it is named in messages.
    pub fn describe(self) -> &'static str {
        match self {
            Role::Admin => "the admin token",
            Role::Csi => "the CSI token (volume lifecycle)",
            Role::ReadOnly => "the read-only token",
        }
    }
}

/// The tokens a node accepts: the admin token, and the scoped ones derived
/// from it (HMAC-SHA256 of their role and generation under the admin
/// token). Every node of a cluster holds the admin token and reads the
/// generations from the store, so every node accepts the same scoped
/// tokens with no token stored anywhere, and none of them gives the admin
/// token away. A scoped token is revoked alone by moving its role to the
/// next generation ([`crate::scoped_tokens::renew`]).
#[derive(Clone)]
pub struct Credentials {
    admin: String,
    csi: String,
    read_only: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials")
    }
}

impl Credentials {
    /// Those of admin token `admin` at `generations`.
    pub fn of(admin: &str, generations: Generations) -> Credentials {
        Credentials {
            admin: admin.to_string(),
            csi: derived(admin, Role::Csi, generations.csi),
            read_only: derived(admin, Role::ReadOnly, generations.read_only),
        }
    }

    /// The admin token (what nodes call each other with).
    pub fn admin(&self) -> &str {
        &self.admin
    }

    /// The token of `role`.
    pub fn token_of(&self, role: Role) -> &str {
        match role {
            Role::Admin => &self.admin,
            Role::Csi => &self.csi,
            Role::ReadOnly => &self.read_only,
        }
    }

    /// The role of `presented`, if it is one of these tokens.
    pub fn role_of(&self, presented: &str) -> Option<Role> {
        [
            (&self.admin, Role::Admin),
            (&self.csi, Role::Csi),
            (&self.read_only, Role::ReadOnly),
        ]
        .into_iter()
        .find(|(token, _)| matches(token, presented))
        .map(|(_, role)| role)
    }

    /// Writes each scoped token beside the admin token's file `admin_path`
    /// (`PATH.csi`, `PATH.read-only`, mode 0600) unless it is there
    /// already; the files written or found.
    pub fn write_scoped(&self, admin_path: &Path) -> io::Result<Vec<std::path::PathBuf>> {
        let mut paths = Vec::new();
        for (role, token) in [(Role::Csi, &self.csi), (Role::ReadOnly, &self.read_only)] {
            let mut name = admin_path.as_os_str().to_os_string();
            name.push(role.file_suffix());
            let path = std::path::PathBuf::from(name);
            if read_private(&path).ok().as_deref() != Some(token.as_str()) {
                create(&path, token)?;
            }
            paths.push(path);
        }
        Ok(paths)
    }
}

/// Which generation of each scoped token is valid: each starts at 0 and
/// moves on when its token is revoked (the store keeps them, under
/// [`crate::scoped_tokens::GENERATIONS_KEY`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Generations {
    /// The CSI token's.
    #[serde(default)]
    pub csi: u64,
    /// The read-only token's.
    #[serde(default)]
    pub read_only: u64,
}

impl Generations {
    /// `role`'s (the admin token has none: 0).
    pub fn of(&self, role: Role) -> u64 {
        match role {
            Role::Admin => 0,
            Role::Csi => self.csi,
            Role::ReadOnly => self.read_only,
        }
    }

    /// These with `role`'s moved on by one (none past the last).
    pub fn renewed(mut self, role: Role) -> Option<Generations> {
        match role {
            Role::Admin => {}
            Role::Csi => self.csi = self.csi.checked_add(1)?,
            Role::ReadOnly => self.read_only = self.read_only.checked_add(1)?,
        }
        Some(self)
    }

    /// The greater of each role's generation in these and `other`.
    pub fn max(self, other: Generations) -> Generations {
        Generations {
            csi: self.csi.max(other.csi),
            read_only: self.read_only.max(other.read_only),
        }
    }
}

/// The scoped token of `role` at `generation` under admin token `admin`
/// (generation 0 is derived as before generations existed, so that tokens
/// handed out then stay valid).
fn derived(admin: &str, role: Role, generation: u64) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(admin.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(b"weft api token:");
    mac.update(role.file_suffix().as_bytes());
    if generation > 0 {
        mac.update(format!(":{generation}").as_bytes());
    }
    weft_node::identity::hex(&mac.finalize().into_bytes())
}

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
    fn scoped_tokens_derive_from_the_admin_token_and_allow_their_routes_only() {
        let credentials = Credentials::of("admin-token-0123456789abcdef", Generations::default());
        let (csi, read_only) = (
            derived("admin-token-0123456789abcdef", Role::Csi, 0),
            derived("admin-token-0123456789abcdef", Role::ReadOnly, 0),
        );
        assert_eq!(csi.len(), 64);
        assert_ne!(csi, read_only);
        assert_ne!(
            csi,
            derived("another-admin-token-012345", Role::Csi, 0),
            "per cluster"
        );
        assert_eq!(
            credentials.role_of("admin-token-0123456789abcdef"),
            Some(Role::Admin)
        );
        assert_eq!(credentials.role_of(&csi), Some(Role::Csi));
        assert_eq!(credentials.role_of(&read_only), Some(Role::ReadOnly));
        assert_eq!(credentials.role_of("something-else"), None);
        assert!(
            Role::ReadOnly.allows("GET", "volumes") && !Role::ReadOnly.allows("POST", "volumes")
        );
        assert!(
            Role::Csi.allows("POST", "volumes")
                && Role::Csi.allows("POST", "volumes/{volume}/hosts")
        );
        assert!(!Role::Csi.allows("POST", "pools") && !Role::Csi.allows("DELETE", "hosts/{host}"));
        assert!(!Role::Csi.allows("POST", "nodes/{node}/drain"));
        assert!(Role::Admin.allows("DELETE", "pools/{pool}"));
        let dir = std::env::temp_dir().join(format!("weft-token-scoped-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let admin = dir.join(FILE_NAME);
        let paths = credentials.write_scoped(&admin).unwrap();
        assert_eq!(read_private(&paths[0]).unwrap(), csi);
        assert_eq!(read_private(&paths[1]).unwrap(), read_only);
        assert!(paths[1].to_string_lossy().ends_with("api-token.read-only"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_scoped_token_of_a_new_generation_replaces_its_roles_alone() {
        let admin = "admin-token-0123456789abcdef";
        let first = Credentials::of(admin, Generations::default());
        // Generation 0: the tokens of builds before generations (Python's
        // hmac: HMAC-SHA256(admin, "weft api token:.csi"), then ".csi:1").
        assert_eq!(
            first.token_of(Role::Csi),
            "d00a29b2ef5fae790d09e2fb39690eeebae0a42d5e8a75152a51a9174c6f6e20"
        );
        let generations = Generations::default().renewed(Role::Csi).unwrap();
        assert_eq!(
            generations,
            Generations {
                csi: 1,
                read_only: 0
            }
        );
        let second = Credentials::of(admin, generations);
        assert_eq!(
            second.token_of(Role::Csi),
            "072d60eef6b60ab3cdaf5eaeaa3610794ab1678ab34a4e735a9fe12c9090252e"
        );
        let old_csi = first.token_of(Role::Csi);
        assert_ne!(second.token_of(Role::Csi), old_csi);
        assert_eq!(
            second.role_of(old_csi),
            None,
            "the old CSI token is refused"
        );
        assert_eq!(second.role_of(second.token_of(Role::Csi)), Some(Role::Csi));
        assert_eq!(
            second.role_of(first.token_of(Role::ReadOnly)),
            Some(Role::ReadOnly),
            "the read-only token is untouched"
        );
        assert_eq!(second.role_of(admin), Some(Role::Admin));
        assert_eq!(Role::scoped_named("csi"), Some(Role::Csi));
        assert_eq!(Role::scoped_named("read-only"), Some(Role::ReadOnly));
        assert_eq!(Role::scoped_named("admin"), None);
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
