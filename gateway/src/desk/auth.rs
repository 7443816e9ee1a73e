//! Who may use the review desk: reviewers (a file of hashed tokens with a role), their
//! signed session cookies, and the CSRF tokens of their forms.
//!
//! The reviewers file (`--desk-reviewers-file`, TOML) is separate from the agents' tokens
//! file: an agent's token never opens the desk, and a reviewer's token enqueues nothing.
//!
//! ```toml
//! [[reviewer]]
//! id = "alice"              # recorded as who decided (resolved_by, event actor review:alice)
//! sha256 = "9f86d08…"       # `oncely-gateway reviewer new` prints the entry
//! role = "decide"           # or "view": may read, may not decide
//! tenants = ["acme"]        # optional; absent = every tenant
//! approve = true            # optional, default false: may approve and reject held actions
//! ```
//!
//! `approve` is a right of its own, beside the role: who decides reviews (what happened)
//! is not necessarily who may let an action go out (what will happen). A reviewer with
//! it sees, on the "Held for approval" pages, the payload of each action held by an
//! approval rule (`awaiting_approval`, docs/approvals.md) of their tenants, and may
//! approve it or reject it (a rejection needs a note). The desk records the decision
//! with the reviewer's id as the approver: an action that needs four eyes needs two
//! different reviewers (the same one twice is refused), and whoever asked for an action
//! (its `requested_by`: the gateway token's id or the SDK's actor) may never approve it
//! — so do not give a reviewer the id of an agent's token. A reviewer without it, of
//! either role, sees the held actions without their payload and without the buttons.
//!
//! Signing in trades the token for a session cookie, `<hex id>.<expiry>.<mac>`, where the
//! MAC is HMAC-SHA256 under the gateway's session key over the id, the expiry and the
//! reviewer's token hash: a cookie stops working when it expires, when the session key
//! changes, and when the reviewer's entry is removed or given a new token. The cookie is
//! `HttpOnly`, `SameSite=Strict` and (unless turned off for plain-HTTP tests) `Secure`
//! under the `__Host-` prefix.
//! Every form carries a CSRF token, an HMAC of the session cookie under the same key, and
//! a `POST` whose `Origin` names another host is refused whatever it carries.

use hmac::{KeyInit, Mac};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type HmacSha256 = hmac::Hmac<Sha256>;

/// The session cookie's name over HTTPS. The `__Host-` prefix makes browsers accept it
/// only with `Secure`, `Path=/` and no `Domain`: a sibling subdomain or a plain-HTTP page
/// cannot plant or overwrite it (RFC 6265bis).
pub const COOKIE: &str = "__Host-oncely_desk";
/// Its name with `--desk-insecure-cookie` (plain-HTTP set-ups such as tests): browsers
/// refuse a `__Host-` cookie without `Secure`.
pub const INSECURE_COOKIE: &str = "oncely_desk";

/// What a reviewer may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeskRole {
    /// Read reviews and operations.
    View,
    /// Read, and decide reviews.
    Decide,
}

impl DeskRole {
    /// Its name in the file and on pages.
    pub fn as_str(self) -> &'static str {
        match self {
            DeskRole::View => "view",
            DeskRole::Decide => "decide",
        }
    }
}

/// A signed-in reviewer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewer {
    /// The entry's id: who decided, in the audit trail.
    pub id: String,
    /// The role.
    pub role: DeskRole,
    /// The tenants whose reviews this reviewer sees (`None`: all).
    pub tenants: Option<Vec<String>>,
    /// May see held actions' payloads and approve or reject them (of their tenants).
    pub approve: bool,
}

impl Reviewer {
    /// Whether this reviewer sees operations of `tenant` (`""` for none).
    pub fn sees(&self, tenant: &str) -> bool {
        self.tenants
            .as_ref()
            .is_none_or(|t| t.iter().any(|x| x == tenant))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    reviewer: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    id: String,
    sha256: String,
    role: DeskRole,
    #[serde(default)]
    tenants: Option<Vec<String>>,
    #[serde(default)]
    approve: bool,
}

/// The loaded reviewers.
#[derive(Debug)]
pub struct Reviewers {
    entries: Vec<([u8; 32], Reviewer)>,
}

/// Whether `id` is a safe reviewer id: it is written into the audit trail and shown on
/// pages, so 1..=64 of `A-Za-z0-9._@-`.
fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
}

impl Reviewers {
    /// Load and check a reviewers file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reviewers file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("reviewers file {}: {e}", path.display()))
    }

    /// Parse a reviewers file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.reviewer.is_empty() {
            return Err("no [[reviewer]] entries: nobody could sign in to the review desk".into());
        }
        let mut ids = BTreeSet::new();
        let mut entries = Vec::new();
        for (i, e) in file.reviewer.into_iter().enumerate() {
            let at = format!("reviewer[{i}] ({:?})", e.id);
            if !valid_id(&e.id) {
                return Err(format!(
                    "{at}: id must be 1..=64 characters of A-Z a-z 0-9 . _ @ -"
                ));
            }
            if !ids.insert(e.id.clone()) {
                return Err(format!("{at}: id must be unique"));
            }
            let mut hash = [0u8; 32];
            hex::decode_to_slice(e.sha256.trim(), &mut hash).map_err(|_| {
                format!(
                    "{at}: sha256 must be 64 hex digits (`oncely-gateway reviewer new` prints it)"
                )
            })?;
            if e.tenants.as_ref().is_some_and(|t| t.is_empty()) {
                return Err(format!(
                    "{at}: tenants = [] would show nothing; leave it out for every tenant"
                ));
            }
            entries.push((
                hash,
                Reviewer {
                    id: e.id,
                    role: e.role,
                    tenants: e.tenants,
                    approve: e.approve,
                },
            ));
        }
        Ok(Self { entries })
    }

    /// The reviewer a token belongs to (every entry compared in constant time).
    pub fn authenticate(&self, token: &str) -> Option<&Reviewer> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (hash, r) in &self.entries {
            // Every entry is compared, whatever matched before.
            if crate::tokens::constant_time_eq(hash, &presented) && found.is_none() {
                found = Some(r);
            }
        }
        found
    }

    fn by_id(&self, id: &str) -> Option<&([u8; 32], Reviewer)> {
        self.entries.iter().find(|(_, r)| r.id == id)
    }
}

/// Signs and checks session cookies and CSRF tokens.
#[derive(Clone)]
pub struct Sessions {
    key: Vec<u8>,
    ttl: Duration,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("key", &"<redacted>")
            .field("ttl", &self.ttl)
            .finish()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Sessions {
    /// Sessions signed with `key` (at least 32 bytes), lasting `ttl`.
    pub fn new(key: Vec<u8>, ttl: Duration) -> Result<Self, String> {
        if key.len() < 32 {
            return Err(format!(
                "the desk's session key has {} bytes; it needs at least 32",
                key.len()
            ));
        }
        Ok(Self { key, ttl })
    }

    /// Sessions with a random key: they end when the process does.
    pub fn random(ttl: Duration) -> std::io::Result<Self> {
        use std::io::Read;
        let mut key = vec![0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
        Ok(Self { key, ttl })
    }

    /// How long a session lasts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        for p in parts {
            m.update(&(p.len() as u64).to_be_bytes());
            m.update(p);
        }
        m
    }

    /// A new session cookie value for `reviewer` (who signed in with a token of `hash`).
    fn issue(&self, id: &str, hash: &[u8; 32], expires: u64) -> String {
        let mac = self
            .mac(&[b"session", id.as_bytes(), &expires.to_be_bytes(), hash])
            .finalize()
            .into_bytes();
        format!("{}.{expires}.{}", hex::encode(id), hex::encode(mac))
    }

    /// Sign in: the cookie value for a token, or `None` for an unknown token.
    pub fn sign_in(&self, reviewers: &Reviewers, token: &str) -> Option<(String, Reviewer)> {
        let r = reviewers.authenticate(token)?;
        let (hash, _) = reviewers.by_id(&r.id)?;
        let value = self.issue(&r.id, hash, now_secs() + self.ttl.as_secs());
        Some((value, r.clone()))
    }

    /// The reviewer a cookie value stands for, if it is intact, unexpired and its
    /// reviewer still has the token it was issued for.
    pub fn check(&self, reviewers: &Reviewers, value: &str) -> Option<Reviewer> {
        let mut parts = value.split('.');
        let (id, expires, mac) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let id = String::from_utf8(hex::decode(id).ok()?).ok()?;
        let expires: u64 = expires.parse().ok()?;
        let mac = hex::decode(mac).ok()?;
        let (hash, reviewer) = reviewers.by_id(&id)?;
        self.mac(&[b"session", id.as_bytes(), &expires.to_be_bytes(), hash])
            .verify_slice(&mac)
            .ok()?;
        (now_secs() < expires).then(|| reviewer.clone())
    }

    /// The CSRF token of the forms shown under session cookie `value`.
    pub fn csrf(&self, value: &str) -> String {
        hex::encode(
            self.mac(&[b"csrf", value.as_bytes()])
                .finalize()
                .into_bytes(),
        )
    }

    /// Whether `token` is the CSRF token of session cookie `value` (constant time).
    pub fn csrf_ok(&self, value: &str, token: &str) -> bool {
        hex::decode(token).ok().is_some_and(|t| {
            self.mac(&[b"csrf", value.as_bytes()])
                .verify_slice(&t)
                .is_ok()
        })
    }
}

/// A new reviewer token (same shape as agents' tokens, its own prefix).
pub fn generate() -> std::io::Result<String> {
    crate::tokens::generate().map(|t| t.replacen("onc_", "ocr_", 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::hash_hex;

    fn reviewers() -> Reviewers {
        Reviewers::parse(&format!(
            "[[reviewer]]\nid = \"alice\"\nsha256 = \"{}\"\nrole = \"decide\"\n\n\
             [[reviewer]]\nid = \"bob\"\nsha256 = \"{}\"\nrole = \"view\"\ntenants = [\"acme\"]\napprove = true\n",
            hash_hex("tok-a"),
            hash_hex("tok-b")
        ))
        .expect("parse")
    }

    #[test]
    fn tokens_sign_in_and_cookies_stand_for_their_reviewer_only() {
        let rs = reviewers();
        let s = Sessions::new(vec![7; 32], Duration::from_secs(60)).expect("key");
        let (cookie, alice) = s.sign_in(&rs, "tok-a").expect("alice");
        assert_eq!((alice.id.as_str(), alice.role), ("alice", DeskRole::Decide));
        assert_eq!(s.check(&rs, &cookie), Some(alice));
        assert!(s.sign_in(&rs, "tok-x").is_none());
        // Another key, a changed byte, a cookie for a removed reviewer: refused.
        let other = Sessions::new(vec![8; 32], Duration::from_secs(60)).expect("key");
        assert_eq!(other.check(&rs, &cookie), None);
        let mut forged = cookie.clone().into_bytes();
        let last = forged.len() - 1;
        forged[last] = if forged[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(
            s.check(&rs, &String::from_utf8(forged).expect("utf8")),
            None
        );
        let bob_id = cookie.replacen(&hex::encode("alice"), &hex::encode("bob"), 1);
        assert_eq!(s.check(&rs, &bob_id), None, "the id is under the MAC");
        let rotated = Reviewers::parse(&format!(
            "[[reviewer]]\nid = \"alice\"\nsha256 = \"{}\"\nrole = \"decide\"\n",
            hash_hex("tok-new")
        ))
        .expect("parse");
        assert_eq!(
            s.check(&rotated, &cookie),
            None,
            "a new token ends old sessions"
        );
        // Expired.
        let gone = Sessions::new(vec![7; 32], Duration::ZERO).expect("key");
        let (old, _) = gone.sign_in(&rs, "tok-a").expect("alice");
        assert_eq!(gone.check(&rs, &old), None);
        // CSRF tokens belong to one session.
        let (cookie2, _) = s.sign_in(&rs, "tok-b").expect("bob");
        assert!(s.csrf_ok(&cookie, &s.csrf(&cookie)));
        assert!(!s.csrf_ok(&cookie, &s.csrf(&cookie2)));
        assert!(!s.csrf_ok(&cookie, ""));
    }

    #[test]
    fn bad_reviewer_files_are_refused_with_the_entry_named() {
        assert!(
            Reviewers::parse("")
                .expect_err("empty")
                .contains("no [[reviewer]]")
        );
        let bad_id = format!(
            "[[reviewer]]\nid = \"a b\"\nsha256 = \"{}\"\nrole = \"view\"\n",
            hash_hex("x")
        );
        assert!(
            Reviewers::parse(&bad_id)
                .expect_err("id")
                .contains("reviewer[0]")
        );
        let bad_role = format!(
            "[[reviewer]]\nid = \"a\"\nsha256 = \"{}\"\nrole = \"admin\"\n",
            hash_hex("x")
        );
        assert!(Reviewers::parse(&bad_role).is_err());
        let no_tenants = format!(
            "[[reviewer]]\nid = \"a\"\nsha256 = \"{}\"\nrole = \"view\"\ntenants = []\n",
            hash_hex("x")
        );
        assert!(
            Reviewers::parse(&no_tenants)
                .expect_err("tenants")
                .contains("tenants = []")
        );
        assert!(Sessions::new(vec![1; 16], Duration::ZERO).is_err());
    }

    #[test]
    fn tenant_lists_limit_what_a_reviewer_sees() {
        let rs = reviewers();
        let bob = rs.authenticate("tok-b").expect("bob");
        assert!(bob.sees("acme") && !bob.sees("globex") && !bob.sees(""));
        assert!(rs.authenticate("tok-a").expect("alice").sees("globex"));
    }

    #[test]
    fn the_approve_right_is_given_explicitly_and_apart_from_the_role() {
        let rs = reviewers();
        assert!(
            !rs.authenticate("tok-a").expect("alice").approve,
            "default: no"
        );
        let bob = rs.authenticate("tok-b").expect("bob");
        assert!(bob.approve && bob.role == DeskRole::View);
        let not_bool = format!(
            "[[reviewer]]\nid = \"a\"\nsha256 = \"{}\"\nrole = \"view\"\napprove = \"yes\"\n",
            hash_hex("x")
        );
        assert!(Reviewers::parse(&not_bool).is_err());
    }
}
