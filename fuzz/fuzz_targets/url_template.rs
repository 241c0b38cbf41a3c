//! URL templates of declarative HTTP tools (`keel_tools::http::template`). Input: a
//! generated template (`http://127.0.0.1:9/` + path pieces mixing literals and `{name}`
//! placeholders, optional query and fragment, `${ENV}` references) and generated
//! arguments. Invariants:
//! - `${ENV}` expansion fails exactly for the unset variables without a default, and
//!   names only references `env_refs` found;
//! - filling succeeds exactly when every placeholder has a non-empty scalar argument and
//!   no path segment becomes `.` or `..`;
//! - a filled URL parses, keeps the template's scheme, host and port, has exactly the
//!   template's path segments, a query or fragment only when the template has one, and a
//!   segment that is one placeholder decodes back to the argument's text.
#![no_main]

use arbitrary::{Arbitrary, Result, Unstructured};
use keel_tools::http::template::{
    env_refs, expand_env, fill_placeholders, placeholders, scalar_text,
};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

const NAMES: &[&str] = &["id", "q", "page", "a", "b"];
const WORDS: &[&str] = &["releases", "v1", "x.y", "~u", "-", "%41"];

#[derive(Debug)]
enum Piece {
    Literal(&'static str),
    Placeholder(&'static str),
}

fn env(name: &str) -> Option<String> {
    match name {
        "HOST" => Some("127.0.0.1:9".into()),
        "EMPTY" => Some(String::new()),
        "TOKEN" => Some("t0k".into()),
        _ => None,
    }
}

fn arb_arg(u: &mut Unstructured) -> Result<Value> {
    Ok(match u.int_in_range(0..=9)? {
        0 => Value::Null,
        1 => Value::Bool(bool::arbitrary(u)?),
        2 => Value::from(i64::arbitrary(u)?),
        3 => serde_json::Number::from_f64(f64::arbitrary(u)?).map_or(Value::Null, Value::Number),
        4 => Value::Array(vec![Value::from(1)]),
        5 => Value::String((*u.choose(&[".", "..", "", "a/b", "?x#y", "%2e", "..."])?).into()),
        _ => Value::String(String::arbitrary(u)?),
    })
}

fn segment_text(pieces: &[Piece], args: &Map<String, Value>) -> String {
    pieces
        .iter()
        .map(|piece| match piece {
            Piece::Literal(text) => (*text).to_string(),
            Piece::Placeholder(name) => args.get(*name).and_then(scalar_text).unwrap_or_default(),
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok((template, segments, query, fragment, args, env_text)) = generate(&mut u) else {
        return;
    };

    // ${ENV} expansion.
    let refs = env_refs(&env_text);
    match expand_env(&env_text, &env) {
        Ok(expanded) => {
            if !env_text.contains("${") {
                assert_eq!(expanded, env_text);
            }
        }
        Err(missing) => {
            assert!(!missing.is_empty());
            for name in &missing {
                assert!(
                    refs.iter().any(|r| &r.name == name && r.default.is_none()),
                    "`{name}` reported missing but not referenced without default in {env_text:?}"
                );
                assert!(env(name).is_none(), "`{name}` is set but reported missing");
            }
        }
    }

    // Placeholders.
    let names = placeholders(&template);
    let usable = names.iter().all(|name| {
        args.get(name)
            .and_then(scalar_text)
            .is_some_and(|t| !t.is_empty())
    });
    let dot_segment = segments.iter().any(|pieces| {
        pieces.iter().any(|p| matches!(p, Piece::Placeholder(_)))
            && matches!(segment_text(pieces, &args).as_str(), "." | "..")
    });
    let filled = fill_placeholders(&template, &args);
    let Ok(filled) = filled else {
        assert!(
            !usable || dot_segment,
            "{template:?} with {args:?} failed without a reason: {filled:?}"
        );
        return;
    };
    assert!(
        usable && !dot_segment,
        "{template:?} with {args:?} gave {filled}"
    );
    let url = url::Url::parse(&filled)
        .unwrap_or_else(|e| panic!("{filled:?} (from {template:?}) does not parse: {e}"));
    assert_eq!(url.scheme(), "http");
    assert_eq!(url.host_str(), Some("127.0.0.1"));
    assert_eq!(url.port(), Some(9));
    assert_eq!(url.query().is_some(), query, "query of {filled}");
    assert_eq!(url.fragment().is_some(), fragment, "fragment of {filled}");
    let got: Vec<&str> = url.path_segments().map(|s| s.collect()).unwrap_or_default();
    assert_eq!(
        got.len(),
        segments.len(),
        "path segments of {filled} vs {template}"
    );
    for (pieces, segment) in segments.iter().zip(&got) {
        if let [Piece::Placeholder(name)] = pieces.as_slice() {
            let decoded: Vec<u8> = percent_encoding::percent_decode_str(segment).collect();
            let expected = args.get(*name).and_then(scalar_text).unwrap_or_default();
            assert_eq!(
                decoded,
                expected.into_bytes(),
                "segment {segment} of {filled}"
            );
        }
    }
});

type Generated = (
    String,
    Vec<Vec<Piece>>,
    bool,
    bool,
    Map<String, Value>,
    String,
);

fn generate(u: &mut Unstructured) -> Result<Generated> {
    let count = u.int_in_range(1..=5)?;
    let mut segments = Vec::with_capacity(count);
    for _ in 0..count {
        let n = u.int_in_range(1..=3)?;
        let mut pieces = Vec::with_capacity(n);
        for _ in 0..n {
            pieces.push(if u.ratio(1u8, 2u8)? {
                Piece::Placeholder(*u.choose(NAMES)?)
            } else {
                Piece::Literal(*u.choose(WORDS)?)
            });
        }
        segments.push(pieces);
    }
    let mut template = String::from("http://127.0.0.1:9");
    for pieces in &segments {
        template.push('/');
        for piece in pieces {
            match piece {
                Piece::Literal(text) => template.push_str(text),
                Piece::Placeholder(name) => template.push_str(&format!("{{{name}}}")),
            }
        }
    }
    let query = u.ratio(1u8, 3u8)?;
    if query {
        template.push_str(&format!("?q={{{}}}&r=1", u.choose(NAMES)?));
    }
    let fragment = u.ratio(1u8, 5u8)?;
    if fragment {
        template.push_str(&format!("#f{{{}}}", u.choose(NAMES)?));
    }
    let mut args = Map::new();
    for name in NAMES {
        if u.ratio(4u8, 5u8)? {
            args.insert((*name).to_string(), arb_arg(u)?);
        }
    }
    let mut env_text = String::new();
    for _ in 0..u.int_in_range(0..=4)? {
        match u.int_in_range(0..=4)? {
            0 => env_text.push_str("${HOST}"),
            1 => env_text.push_str("${ EMPTY :-d}"),
            2 => env_text.push_str("${NOPE}"),
            3 => env_text.push_str("${NOPE:-x}"),
            _ => env_text.push_str(&String::arbitrary(u)?),
        }
    }
    Ok((template, segments, query, fragment, args, env_text))
}
