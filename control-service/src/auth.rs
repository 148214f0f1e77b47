//! Who is calling the public API: API keys (bearer tokens) per tenant or for the operator, known to
//! the service only by their SHA-256, or open mode for local demos, where every caller is trusted
//! like the operator.
//!
//! A presented key is hashed and compared with every stored hash in constant time, so neither the
//! timing of a comparison nor of a lookup tells an attacker anything about a stored key.

use domain::TenantId;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// Whether callers must present an API key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// No authentication: every caller acts as the operator. For local demos only; logged loudly.
    Open,
    /// Every call of the public API needs `Authorization: Bearer <key>` of a configured key.
    Keys,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `open` or `keys`. Unset: `keys` when any key is configured (here or in `keys_file`), else
    /// `open`.
    pub mode: Option<AuthMode>,
    /// API keys, by their SHA-256 (never the key itself).
    pub keys: Vec<ApiKeyConfig>,
    /// A TOML file of more keys (`[[keys]]` entries like `auth.keys`), relative to this config
    /// file's directory; kept apart so that the keys can be managed without the rest.
    pub keys_file: Option<PathBuf>,
}

/// One API key: its hash and whom it acts for (a tenant, or the operator).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Hex SHA-256 of the key (`printf %s "$KEY" | sha256sum`).
    pub sha256: String,
    /// The tenant this key acts as; exactly one of `tenant` and `admin = true`.
    #[serde(default)]
    pub tenant: Option<String>,
    /// An operator key: acts for any tenant, sets request times freely (trace replays), reads
    /// `/v1/stats`, and is not rate limited.
    #[serde(default)]
    pub admin: bool,
    /// A name for logs (the key is never logged).
    #[serde(default)]
    pub name: Option<String>,
}

/// The file named by `auth.keys_file`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeysFile {
    pub keys: Vec<ApiKeyConfig>,
}

/// Why the `[auth]` settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

/// The caller of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Open mode: no identity; trusted like the operator.
    Open,
    /// An operator key: acts for any tenant.
    Admin { name: String },
    /// A tenant key: acts only as this tenant.
    Tenant(TenantId),
}

impl Caller {
    /// The only tenant this caller may act as; `None` for the operator and in open mode (any).
    pub fn tenant(&self) -> Option<&TenantId> {
        match self {
            Caller::Tenant(tenant) => Some(tenant),
            Caller::Open | Caller::Admin { .. } => None,
        }
    }

    /// May set request times freely (trace replays), skips rate limits and reads fleet statistics.
    pub fn is_operator(&self) -> bool {
        self.tenant().is_none()
    }
}

/// Why a request carries no usable key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("an API key is required: `Authorization: Bearer <key>`")]
    Missing,
    #[error("the API key is not valid")]
    Unknown,
}

#[derive(Clone, Debug)]
struct StoredKey {
    sha256: [u8; 32],
    caller: Caller,
}

/// The configured keys, or open mode.
#[derive(Clone, Debug)]
pub struct ApiKeys {
    keys: Vec<StoredKey>,
    open: bool,
}

/// SHA-256 of a key, as stored.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Lower-case hex of a hash, as written in the config (`printf %s "$KEY" | sha256sum`).
pub fn to_hex(hash: &[u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(hash)
}

/// Equal without an early exit: the time taken does not depend on where two hashes differ.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

fn invalid(field: String, message: impl Into<String>) -> KeysError {
    KeysError::Invalid { field, message: message.into() }
}

fn stored(entry: &ApiKeyConfig, field: &str) -> Result<StoredKey, KeysError> {
    let sha256 = from_hex(&entry.sha256).ok_or_else(|| {
        invalid(
            format!("{field}.sha256"),
            "must be the 64 hex digits of the key's SHA-256 (`printf %s \"$KEY\" | sha256sum`)",
        )
    })?;
    let caller = match (&entry.tenant, entry.admin) {
        (Some(tenant), false) => {
            domain::validate::check_id(tenant, &format!("{field}.tenant"))
                .map_err(|error| invalid(error.field().to_owned(), error.message()))?;
            Caller::Tenant(TenantId(tenant.clone()))
        }
        (None, true) => Caller::Admin { name: entry.name.clone().unwrap_or_else(|| "admin".to_owned()) },
        _ => return Err(invalid(field.to_owned(), "needs exactly one of `tenant = \"...\"` and `admin = true`")),
    };
    Ok(StoredKey { sha256, caller })
}

impl ApiKeys {
    /// Open mode: every caller is trusted.
    pub fn open() -> Self {
        ApiKeys { keys: Vec::new(), open: true }
    }

    /// The keys of the config and of its keys file, and the mode.
    pub fn from_config(config: &AuthConfig) -> Result<Self, KeysError> {
        let mut keys = Vec::new();
        for (i, entry) in config.keys.iter().enumerate() {
            keys.push(stored(entry, &format!("auth.keys[{i}]"))?);
        }
        if let Some(path) = &config.keys_file {
            let text =
                std::fs::read_to_string(path).map_err(|source| KeysError::Read { path: path.to_owned(), source })?;
            let file: KeysFile = toml::from_str(&text)
                .map_err(|e| KeysError::Parse { path: path.to_owned(), message: e.to_string() })?;
            for (i, entry) in file.keys.iter().enumerate() {
                keys.push(stored(entry, &format!("{}: keys[{i}]", path.display()))?);
            }
        }
        for (i, key) in keys.iter().enumerate() {
            if keys[..i].iter().any(|earlier| earlier.sha256 == key.sha256) {
                return Err(invalid("auth.keys".to_owned(), "the same key is configured twice"));
            }
        }
        let open = match config.mode {
            Some(AuthMode::Open) => true,
            Some(AuthMode::Keys) if keys.is_empty() => {
                return Err(invalid(
                    "auth.mode".to_owned(),
                    "`keys` needs at least one key in auth.keys or auth.keys_file (or `open` for a local demo)",
                ))
            }
            Some(AuthMode::Keys) => false,
            None => keys.is_empty(),
        };
        Ok(ApiKeys { keys, open })
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Tenant and operator keys configured.
    pub fn counts(&self) -> (usize, usize) {
        let tenants = self.keys.iter().filter(|k| matches!(k.caller, Caller::Tenant(_))).count();
        (tenants, self.keys.len() - tenants)
    }

    /// The caller presenting this `Authorization` header value (`Bearer <key>`).
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, AuthError> {
        if self.open {
            return Ok(Caller::Open);
        }
        let key = authorization
            .and_then(|value| value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|key| !key.is_empty())
            .ok_or(AuthError::Missing)?;
        let presented = hash_key(key);
        // Every stored hash is compared, match or not.
        let mut found = None;
        for stored in &self.keys {
            if constant_time_eq(&stored.sha256, &presented) {
                found = Some(&stored.caller);
            }
        }
        found.cloned().ok_or(AuthError::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, tenant: Option<&str>, admin: bool) -> ApiKeyConfig {
        ApiKeyConfig { sha256: to_hex(&hash_key(key)), tenant: tenant.map(str::to_owned), admin, name: None }
    }

    #[test]
    fn keys_map_to_their_tenant_or_the_operator() {
        let config = AuthConfig {
            keys: vec![entry("alice-key", Some("alice"), false), entry("ops-key", None, true)],
            ..AuthConfig::default()
        };
        let keys = ApiKeys::from_config(&config).unwrap();
        assert!(!keys.is_open());
        assert_eq!(keys.counts(), (1, 1));
        assert_eq!(keys.authenticate(Some("Bearer alice-key")), Ok(Caller::Tenant(TenantId::from("alice"))));
        let admin = keys.authenticate(Some("Bearer ops-key")).unwrap();
        assert!(admin.is_operator() && admin.tenant().is_none());
        assert_eq!(keys.authenticate(Some("Bearer alice-key2")), Err(AuthError::Unknown));
        assert_eq!(keys.authenticate(Some("alice-key")), Err(AuthError::Missing));
        assert_eq!(keys.authenticate(Some("Bearer ")), Err(AuthError::Missing));
        assert_eq!(keys.authenticate(None), Err(AuthError::Missing));
    }

    #[test]
    fn the_known_sha256_of_a_key_is_what_the_config_holds() {
        // `printf %s abc | sha256sum`
        assert_eq!(to_hex(&hash_key("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(from_hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"), Some(hash_key("abc")));
        assert_eq!(from_hex("ba78"), None);
        assert!(constant_time_eq(&hash_key("x"), &hash_key("x")));
        assert!(!constant_time_eq(&hash_key("x"), &hash_key("y")));
    }

    #[test]
    fn open_mode_without_keys_or_when_asked() {
        let keys = ApiKeys::from_config(&AuthConfig::default()).unwrap();
        assert!(keys.is_open());
        assert_eq!(keys.authenticate(None), Ok(Caller::Open));
        let config = AuthConfig {
            mode: Some(AuthMode::Open),
            keys: vec![entry("k", Some("t"), false)],
            ..AuthConfig::default()
        };
        assert!(ApiKeys::from_config(&config).unwrap().is_open());
        let error = ApiKeys::from_config(&AuthConfig { mode: Some(AuthMode::Keys), ..AuthConfig::default() });
        assert!(error.unwrap_err().to_string().starts_with("auth.mode:"));
    }

    #[test]
    fn bad_entries_are_refused_naming_the_field() {
        let field_of = |entry: ApiKeyConfig| {
            let config = AuthConfig { keys: vec![entry], ..AuthConfig::default() };
            ApiKeys::from_config(&config).unwrap_err().to_string()
        };
        assert!(field_of(entry("k", Some("a/b"), false)).starts_with("auth.keys[0].tenant:"));
        assert!(field_of(entry("k", Some("t"), true)).starts_with("auth.keys[0]:"));
        assert!(field_of(entry("k", None, false)).starts_with("auth.keys[0]:"));
        let config =
            AuthConfig { keys: vec![entry("k", Some("t"), false), entry("k", None, true)], ..AuthConfig::default() };
        assert!(ApiKeys::from_config(&config).unwrap_err().to_string().starts_with("auth.keys:"));
    }

    #[test]
    fn the_shipped_example_keys_file_holds_the_documented_demo_keys() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/control-service.keys.example.toml");
        let keys = ApiKeys::from_config(&AuthConfig { keys_file: Some(path), ..AuthConfig::default() }).unwrap();
        assert_eq!(keys.authenticate(Some("Bearer t-1-demo-key")), Ok(Caller::Tenant(TenantId::from("t-1"))));
        assert!(keys.authenticate(Some("Bearer ops-demo-key")).unwrap().is_operator());
    }

    #[test]
    fn a_keys_file_adds_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        let hash = to_hex(&hash_key("bob-key"));
        std::fs::write(&path, format!("[[keys]]\ntenant = \"bob\"\nsha256 = \"{hash}\"\n")).unwrap();
        let config = AuthConfig { keys_file: Some(path), ..AuthConfig::default() };
        let keys = ApiKeys::from_config(&config).unwrap();
        assert_eq!(keys.authenticate(Some("Bearer bob-key")), Ok(Caller::Tenant(TenantId::from("bob"))));
    }
}
