//! The anti-forgery token every state-changing form carries (approve, deny, reply, fork).
//!
//! The same-origin check (`Sec-Fetch-Site`, `Origin`) stops a page on another site from
//! posting a form, and the Host allow-list stops a DNS-rebound page from reading the UI;
//! the token is the second lock: a post must also carry a secret only the UI's own pages
//! hold. `keel ui` draws one at start-up for its single user; a server that mounts the UI
//! behind logins (`keel serve`'s `/ui`) gives each session its own by inserting a
//! [`CsrfToken`] into the request's extensions. Forms render it as a hidden `csrf` field;
//! the check compares in constant time.

/// A request's anti-forgery token (an extension a mounting server inserts per session;
/// without one, the UI's own token applies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrfToken(pub String);

impl CsrfToken {
    /// A fresh random token (256 bits, hex).
    pub fn random() -> Self {
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes);
        Self(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// Who an approval or denial from a request's page is recorded as: an extension a
/// mounting server inserts per session (`keel serve`: `ui:<key id>`); without one,
/// `keel ui`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidedBy(pub String);

/// Whether a posted `csrf` field matches `expected` (constant time in the length of
/// `expected`; an empty expectation never matches).
pub(crate) fn matches(posted: Option<&str>, expected: &str) -> bool {
    let Some(posted) = posted else { return false };
    if expected.is_empty() || posted.len() != expected.len() {
        return false;
    }
    posted
        .bytes()
        .zip(expected.bytes())
        .fold(0u8, |diff, (a, b)| diff | (a ^ b))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_exact_token() {
        let token = CsrfToken::random();
        assert_eq!(token.0.len(), 64);
        assert!(matches(Some(&token.0), &token.0));
        assert!(!matches(None, &token.0));
        assert!(!matches(Some(""), ""));
        assert!(!matches(Some(&token.0[..63]), &token.0));
        assert_ne!(CsrfToken::random(), token);
    }
}
