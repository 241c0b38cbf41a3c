//! Keeping secrets out of what this crate prints: URLs shown in errors and `Debug`
//! output lose their userinfo, query and fragment, and API keys sent in custom headers are
//! marked sensitive so HTTP-level logging does not print them.
//!
//! API keys themselves are held as [`secrecy::SecretString`] (its `Debug` prints
//! `[REDACTED]` and it has no `Display`).

use reqwest::RequestBuilder;
use reqwest::header::HeaderValue;

/// `scheme://host[:port]/path` of a URL: no userinfo, query or fragment, which is where
/// keys, signatures and passwords travel.
pub(crate) fn display_url(url: &url::Url) -> String {
    let host = match url.host() {
        Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
        Some(host) => host.to_string(),
        None => String::new(),
    };
    match url.port() {
        Some(port) => format!("{}://{host}:{port}{}", url.scheme(), url.path()),
        None => format!("{}://{host}{}", url.scheme(), url.path()),
    }
}

/// [`display_url`] for text that may not parse as a URL: the query, fragment and
/// anything before an `@` in the authority are cut off textually.
pub(crate) fn display_url_text(raw: &str) -> String {
    if let Ok(url) = url::Url::parse(raw)
        && url.has_host()
    {
        return display_url(&url);
    }
    let cut = raw
        .find(['?', '#'])
        .map_or(raw, |end| raw.get(..end).unwrap_or(raw));
    let (scheme, rest) = match cut.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, cut),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    match scheme {
        Some(scheme) => format!("{scheme}://{host}{path}"),
        None => format!("{host}{path}"),
    }
}

/// Adds a header whose value is a credential, marked sensitive (hyper and reqwest then
/// never print it in `Debug` output or logs). A value that is not a valid header value is
/// passed on unchanged so reqwest reports its usual builder error, which does not quote it.
pub(crate) fn sensitive_header(
    builder: RequestBuilder,
    name: &'static str,
    value: &str,
) -> RequestBuilder {
    match HeaderValue::from_str(value) {
        Ok(mut header) => {
            header.set_sensitive(true);
            builder.header(name, header)
        }
        Err(_) => builder.header(name, value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_userinfo_query_and_fragment() {
        let url =
            url::Url::parse("https://user:pw@api.example.com:8443/v1/chat?key=abc#frag").unwrap();
        assert_eq!(display_url(&url), "https://api.example.com:8443/v1/chat");
        assert_eq!(
            display_url_text("http://:pw@[::1]:9/x?sig=1"),
            "http://[::1]:9/x"
        );
        assert_eq!(
            display_url_text("ht tp://u:p@host/p?token=1"),
            "ht tp://host/p"
        );
        assert_eq!(display_url_text("u:p@host:1/p?k=1"), "host:1/p");
    }
}
