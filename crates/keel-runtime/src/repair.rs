//! Bounded output repair: the executor may fix a tool's output so it matches the tool's
//! output schema, but only with coercions that invent nothing — `"3"` → `3`, `"true"` →
//! `true`, `3` → `"3"`, `2.0` → `2` for an integer, and filling a missing required field
//! that has a schema `default`. Each repair is described so it can be recorded on the
//! outcome. Anything else stays a mismatch.

use serde_json::{Map, Value};

/// Maximum repairs applied to one output; more than this means the output is not "nearly
/// right" and is reported as a mismatch instead.
const MAX_REPAIRS: usize = 16;

/// Repairs `value` against `schema` in place; returns what was changed.
pub fn repair(value: &mut Value, schema: &Value) -> Vec<String> {
    let mut repairs = Vec::new();
    walk(value, schema, schema, "", &mut repairs, 0);
    repairs.truncate(MAX_REPAIRS + 1);
    repairs
}

/// Whether the repairs stayed within bounds.
pub fn within_bounds(repairs: &[String]) -> bool {
    repairs.len() <= MAX_REPAIRS
}

fn resolve<'s>(schema: &'s Value, root: &'s Value) -> &'s Value {
    let mut current = schema;
    for _ in 0..8 {
        let Some(reference) = current.get("$ref").and_then(Value::as_str) else {
            return current;
        };
        let Some(pointer) = reference.strip_prefix('#') else {
            return current;
        };
        match root.pointer(pointer) {
            Some(target) => current = target,
            None => return current,
        }
    }
    current
}

fn types_of(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn walk(
    value: &mut Value,
    schema: &Value,
    root: &Value,
    path: &str,
    repairs: &mut Vec<String>,
    depth: usize,
) {
    if depth > 32 || repairs.len() > MAX_REPAIRS {
        return;
    }
    let schema = resolve(schema, root);
    let types = types_of(schema);
    if !types.is_empty() {
        coerce(value, &types, path, repairs);
    }
    match value {
        Value::Object(map) => walk_object(map, schema, root, path, repairs, depth),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter_mut().enumerate() {
                    walk(
                        item,
                        item_schema,
                        root,
                        &format!("{path}/{index}"),
                        repairs,
                        depth + 1,
                    );
                }
            }
        }
        _ => {}
    }
}

fn walk_object(
    map: &mut Map<String, Value>,
    schema: &Value,
    root: &Value,
    path: &str,
    repairs: &mut Vec<String>,
    depth: usize,
) {
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if map.contains_key(name) {
                continue;
            }
            let default = properties
                .and_then(|p| p.get(name))
                .map(|s| resolve(s, root))
                .and_then(|s| s.get("default"));
            if let Some(default) = default {
                map.insert(name.to_string(), default.clone());
                repairs.push(format!(
                    "filled missing {path}/{name} with its schema default {default}"
                ));
            }
        }
    }
    if let Some(properties) = properties {
        for (name, property_schema) in properties {
            if let Some(child) = map.get_mut(name) {
                walk(
                    child,
                    property_schema,
                    root,
                    &format!("{path}/{name}"),
                    repairs,
                    depth + 1,
                );
            }
        }
    }
}

fn coerce(value: &mut Value, types: &[&str], path: &str, repairs: &mut Vec<String>) {
    let matches = |v: &Value| {
        types.iter().any(|t| match *t {
            "string" => v.is_string(),
            "integer" => v.as_i64().is_some() || v.as_u64().is_some(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            "object" => v.is_object(),
            "array" => v.is_array(),
            _ => true,
        })
    };
    if matches(value) {
        return;
    }
    let shown = if path.is_empty() { "/" } else { path };
    let replacement = types.iter().find_map(|t| match (*t, &*value) {
        ("integer", Value::String(s)) => s.trim().parse::<i64>().ok().map(Value::from),
        ("integer", Value::Number(n)) => n
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
            .map(|f| Value::from(f as i64)),
        ("number", Value::String(s)) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Value::from),
        ("boolean", Value::String(s)) => match s.trim() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        ("string", Value::Number(n)) => Some(Value::String(n.to_string())),
        ("string", Value::Bool(b)) => Some(Value::String(b.to_string())),
        _ => None,
    });
    if let Some(replacement) = replacement {
        repairs.push(format!("coerced {shown} from {value} to {replacement}"));
        *value = replacement;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn coerces_and_fills_defaults_without_inventing_data() {
        let schema = json!({
            "type": "object",
            "required": ["count", "ok", "unit", "items"],
            "properties": {
                "count": {"type": "integer"},
                "ok": {"type": "boolean"},
                "unit": {"type": "string", "default": "ms"},
                "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}
            },
            "$defs": {"Item": {"type": "object", "properties": {"score": {"type": "number"}}}}
        });
        let mut value = json!({"count": "3", "ok": "true", "items": [{"score": "0.5"}]});
        let repairs = repair(&mut value, &schema);
        assert_eq!(
            value,
            json!({"count": 3, "ok": true, "unit": "ms", "items": [{"score": 0.5}]})
        );
        assert_eq!(repairs.len(), 4, "{repairs:?}");
        // A required field without a default is not invented.
        let schema =
            json!({"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}});
        let mut value = json!({});
        assert!(repair(&mut value, &schema).is_empty());
        assert_eq!(value, json!({}));
        // Words are not numbers.
        let mut value = json!({"count": "three"});
        assert!(
            repair(
                &mut value,
                &json!({"properties": {"count": {"type": "integer"}}})
            )
            .is_empty()
        );
    }
}
