//! `keel.toml` parsing and checking (`keel_config`). Input: the file's text. Invariants:
//! - parsing and `keel config check` never panic, and report the same diagnostics;
//! - every diagnostic's position is inside the text (1-based line and column);
//! - text and JSON rendering work for every diagnostic list;
//! - a configuration that loads round-trips: serialized back to TOML and parsed again, it
//!   is the same configuration.
#![no_main]

use std::path::Path;

use keel_config::{Diagnostic, KeelConfig, check_str, load_blocking, render_json, render_text};
use libfuzzer_sys::fuzz_target;

const FILE: &str = "keel.toml";
const BASE: &str = "/nonexistent/keel-fuzz";

fn env(name: &str) -> Option<String> {
    match name {
        "OPENAI_API_KEY" | "ANTHROPIC_API_KEY" => Some("sk-test".into()),
        "HOST" => Some("127.0.0.1".into()),
        "EMPTY" => Some(String::new()),
        _ => None,
    }
}

fn check_positions(text: &str, diagnostics: &[Diagnostic]) {
    let lines: Vec<&str> = text.split('\n').collect();
    for d in diagnostics {
        let Some(line) = d.line else {
            assert!(d.column.is_none(), "a column without a line: {d:?}");
            continue;
        };
        assert!(
            line >= 1 && line <= lines.len() + 1,
            "line {line} outside the text: {d:?}"
        );
        if let (Some(column), Some(content)) = (d.column, lines.get(line - 1)) {
            let width = content.chars().count();
            assert!(
                column >= 1 && column <= width + 2,
                "column {column} outside line {line} ({width} chars): {d:?}"
            );
        }
        assert!(!d.message.trim().is_empty(), "empty message: {d:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (config, diagnostics) = KeelConfig::parse_with_env(text, FILE, Path::new(BASE), &env);
    let checked = check_str(text, FILE, Path::new(BASE), &env);
    let mut sorted = diagnostics.clone();
    sorted.sort_by_key(|d| (d.line.unwrap_or(usize::MAX), d.column.unwrap_or(0)));
    // Compared as multisets, by every field (no serialization: it cost a quarter of the
    // target's time).
    let key = |d: &Diagnostic| {
        (
            d.line,
            d.column,
            d.severity.as_str(),
            d.code as u8,
            d.file.clone(),
            d.key.clone(),
            d.message.clone(),
        )
    };
    let mut a: Vec<_> = sorted.iter().map(key).collect();
    let mut b: Vec<_> = checked.iter().map(key).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b, "parse and check disagree");
    check_positions(text, &diagnostics);
    let rendered = render_text(&diagnostics);
    assert_eq!(rendered.lines().count() >= diagnostics.len(), true);
    let json = render_json(&diagnostics);
    assert!(json.is_object());

    let Some(config) = config else {
        assert!(
            load_blocking(&diagnostics) || !diagnostics.is_empty(),
            "no config and no diagnostic"
        );
        return;
    };
    if load_blocking(&diagnostics) {
        return;
    }
    let Ok(again) = toml::to_string(&config) else {
        return;
    };
    // Expansion already happened; text that still looks like a reference (`${NAME}`) or an
    // escape (`$$` for `$`) would expand again.
    if again.contains("${") || again.contains("$$") {
        return;
    }
    let (reparsed, second) = KeelConfig::parse_with_env(&again, FILE, Path::new(BASE), &env);
    assert!(
        !load_blocking(&second),
        "serialized config does not load:\n{again}\n{second:?}"
    );
    let reparsed = reparsed.unwrap_or_else(|| panic!("serialized config does not parse:\n{again}"));
    // NaN never equals itself; compare the serializations then.
    let same =
        reparsed == config || toml::to_string(&reparsed).ok().as_deref() == Some(again.as_str());
    assert!(
        same,
        "round trip changed the config:\n{again}\n{reparsed:?}\n{config:?}"
    );
});
