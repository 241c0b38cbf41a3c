//! Tool-argument and output handling: `keel_runtime::repair` (bounded coercions towards a
//! schema), `ToolCall::parse_arguments` and the structured planner's action parser.
//! Input: a generated JSON Schema (types, properties, required, defaults, items, `$ref`)
//! and a generated value. Invariants:
//! - the number of repairs is bounded (at most the limit + 1 are reported);
//! - repair is idempotent: repairing a repaired value (within bounds) changes nothing;
//! - repairs invent nothing: containers keep their kind, objects keep their keys, arrays
//!   their length, and nothing changes without a recorded repair;
//! - `parse_arguments` of the value's JSON text gives the value back (floats aside);
//!   the planner's parser never panics on any text.
#![no_main]

use arbitrary::{Arbitrary, Result, Unstructured};
use keel_core::ToolCall;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};

const VOCAB: &[&str] = &[
    "a", "b", "c", "id", "count", "true", "false", "3", "2.0", " 7 ", "x",
];
const TYPES: &[&str] = &[
    "string", "integer", "number", "boolean", "null", "object", "array",
];

fn arb_schema(u: &mut Unstructured, depth: u32) -> Result<Value> {
    let mut schema = Map::new();
    if u.ratio(1u8, 8u8)? {
        let target = *u.choose(&["#", "#/$defs/t", "#/properties/a", "#/nowhere", "other"])?;
        schema.insert("$ref".into(), json!(target));
        return Ok(Value::Object(schema));
    }
    if u.ratio(4u8, 5u8)? {
        if u.ratio(1u8, 4u8)? {
            let n = u.int_in_range(1..=3)?;
            let mut list = Vec::new();
            for _ in 0..n {
                list.push(json!(*u.choose(TYPES)?));
            }
            schema.insert("type".into(), Value::Array(list));
        } else {
            schema.insert("type".into(), json!(*u.choose(TYPES)?));
        }
    }
    if depth > 0 && u.ratio(1u8, 2u8)? {
        let mut properties = Map::new();
        for _ in 0..u.int_in_range(0..=4)? {
            properties.insert((*u.choose(VOCAB)?).to_string(), arb_schema(u, depth - 1)?);
        }
        schema.insert("properties".into(), Value::Object(properties));
    }
    if u.ratio(1u8, 3u8)? {
        let mut required = Vec::new();
        for _ in 0..u.int_in_range(0..=3)? {
            required.push(json!(*u.choose(VOCAB)?));
        }
        schema.insert("required".into(), Value::Array(required));
    }
    if u.ratio(1u8, 4u8)? {
        schema.insert("default".into(), keel_fuzz::arb_value(u, VOCAB, 1)?);
    }
    if depth > 0 && u.ratio(1u8, 4u8)? {
        schema.insert("items".into(), arb_schema(u, depth - 1)?);
    }
    if depth > 0 && u.ratio(1u8, 6u8)? {
        schema.insert("$defs".into(), json!({"t": arb_schema(u, depth - 1)?}));
    }
    Ok(Value::Object(schema))
}

/// Containers keep their kind, arrays their length, objects their keys (plus some).
fn check_shape(before: &Value, after: &Value, path: &str) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let Some(repaired) = b.get(key) else {
                    panic!("repair removed {path}/{key}");
                };
                check_shape(value, repaired, &format!("{path}/{key}"));
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "repair changed the length of {path}");
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                check_shape(x, y, &format!("{path}/{index}"));
            }
        }
        (Value::Object(_) | Value::Array(_), other) => {
            panic!("repair replaced the container at {path} with {other}")
        }
        (_, Value::Object(_) | Value::Array(_)) => {
            panic!("repair turned the scalar at {path} into a container")
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(schema) = arb_schema(&mut u, 3) else {
        return;
    };
    let Ok(value) = keel_fuzz::arb_value(&mut u, VOCAB, 4) else {
        return;
    };
    let text = String::arbitrary(&mut u).unwrap_or_default();

    let mut repaired = value.clone();
    let repairs = keel_runtime::repair::repair(&mut repaired, &schema);
    assert!(repairs.len() <= 17, "{} repairs reported", repairs.len());
    check_shape(&value, &repaired, "");
    if repairs.is_empty() {
        assert_eq!(repaired, value, "a value changed without a recorded repair");
    }
    if keel_runtime::repair::within_bounds(&repairs) {
        let mut again = repaired.clone();
        let second = keel_runtime::repair::repair(&mut again, &schema);
        assert!(
            second.is_empty(),
            "repair is not idempotent: {repairs:?} then {second:?}"
        );
        assert_eq!(again, repaired);
    }
    let call = ToolCall {
        id: "c".into(),
        name: "t".into(),
        arguments: value.to_string(),
    };
    let parsed = call.parse_arguments();
    assert!(
        parsed.is_ok(),
        "serialized arguments do not parse: {parsed:?}"
    );
    // Without serde_json's `float_roundtrip`, a float may come back one ulp off.
    if !has_float(&value) {
        assert_eq!(parsed.ok(), Some(value));
    }
    let call = ToolCall {
        id: "c".into(),
        name: "t".into(),
        arguments: text.clone(),
    };
    let _ = call.parse_arguments();
    let _ = keel_core::planner::parse_action(&text, &["calculator", "search"]);
});

fn has_float(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_f64(),
        Value::Array(items) => items.iter().any(has_float),
        Value::Object(map) => map.values().any(has_float),
        _ => false,
    }
}
