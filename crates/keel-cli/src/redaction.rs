//! What the CLI prints on stderr outside the logger (error messages, worker lines,
//! notices) goes through the same [`Redactor`] as the logs: keel.toml's
//! `[telemetry.redaction]` rules, and at least the built-in ones even when redaction is
//! turned off there — a store URL's password or an API key in an error message must not
//! reach a terminal or a CI log.

use std::sync::OnceLock;

use keel_telemetry::Redactor;

/// `text` with secrets replaced.
pub fn for_stderr(text: &str) -> String {
    static REDACTOR: OnceLock<Redactor> = OnceLock::new();
    let redactor = REDACTOR.get_or_init(|| {
        match Redactor::from_config(&crate::config::get().telemetry.redaction) {
            Ok(redactor) if redactor.is_enabled() => redactor,
            _ => Redactor::default(),
        }
    });
    redactor.redact_str(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_url_passwords_and_keys_are_redacted_and_the_rest_kept() {
        let line = for_stderr(
            "cannot open store postgres://keel:secretpw@127.0.0.1:1/x: cannot connect to \
             Postgres: Connection refused (os error 111); key sk-ant-api03-abcdefghijklmnopqrstuvwx",
        );
        assert!(!line.contains("secretpw"), "{line}");
        assert!(!line.contains("abcdefghijklmnop"), "{line}");
        assert!(line.contains("postgres://keel:"), "{line}");
        assert!(line.contains("127.0.0.1:1/x"), "{line}");
        let plain = "job 12 thread thr_01J0ABC: ended done (resumed an interrupted run)";
        assert_eq!(for_stderr(plain), plain);
    }
}
