//! Objects hold only the properties their schema declares, unless the schema says otherwise.
//!
//! JSON Schema lets an object carry any key its `properties` do not name, and a constrained
//! model takes that freedom: it invents near-copies of real keys (`"required": "sentiment"`
//! beside `"sentiment"`). llama.cpp and xgrammar close such objects by default; so does Tessera.
//! An object schema that declares `properties` and says nothing of `additionalProperties`
//! (nor `patternProperties`, `unevaluatedProperties`) gets `"additionalProperties": false`.
//! A schema that wants other keys says so with `"additionalProperties": true` or a schema.
//!
//! Objects under `allOf` are left open: each branch names only its own keys, and closing
//! them would forbid the keys of the others.

use serde_json::{Map, Value};

/// Keywords whose value is one subschema.
const ONE: [&str; 7] = [
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
];

/// Keywords whose value is a list of subschemas.
const LIST: [&str; 3] = ["anyOf", "oneOf", "prefixItems"];

/// Keywords whose value maps names to subschemas.
const MAP: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// `schema` with every object that declares `properties`, and says nothing else of other
/// keys, closed to them (see the [module documentation](self)).
pub fn close_declared_objects(schema: &mut Value) {
    close(schema, 0);
}

/// Schemas deeper than this are left as they are (the compiler refuses them anyway).
const MAX_DEPTH: usize = 128;

fn close(schema: &mut Value, depth: usize) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if depth > MAX_DEPTH {
        return;
    }
    if obj.contains_key("properties")
        && ![
            "additionalProperties",
            "patternProperties",
            "unevaluatedProperties",
            "allOf",
        ]
        .iter()
        .any(|k| obj.contains_key(*k))
    {
        obj.insert("additionalProperties".into(), Value::Bool(false));
    }
    for key in ONE {
        if let Some(sub) = obj.get_mut(key) {
            close(sub, depth + 1);
        }
    }
    if let Some(sub) = obj.get_mut("additionalProperties") {
        close(sub, depth + 1);
    }
    for key in LIST {
        if let Some(Value::Array(list)) = obj.get_mut(key) {
            list.iter_mut().for_each(|s| close(s, depth + 1));
        }
    }
    for key in MAP {
        if let Some(Value::Object(map)) = obj.get_mut(key) {
            close_all(map, depth + 1);
        }
    }
}

fn close_all(map: &mut Map<String, Value>, depth: usize) {
    map.values_mut().for_each(|s| close(s, depth));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn closed(mut schema: Value) -> Value {
        close_declared_objects(&mut schema);
        schema
    }

    #[test]
    fn objects_with_properties_are_closed_at_every_depth() {
        let schema = closed(json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                "list": {"type": "array", "items": {"properties": {"c": {}}}},
                "either": {"anyOf": [{"properties": {"d": {}}}, {"type": "null"}]}
            },
            "$defs": {"X": {"type": "object", "properties": {"e": {}}}}
        }));
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["a"]["additionalProperties"], false);
        assert_eq!(
            schema["properties"]["list"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(
            schema["properties"]["either"]["anyOf"][0]["additionalProperties"],
            false
        );
        assert_eq!(schema["$defs"]["X"]["additionalProperties"], false);
    }

    #[test]
    fn what_the_schema_says_of_other_keys_is_kept() {
        let open = json!({"properties": {"a": {}}, "additionalProperties": true});
        assert_eq!(closed(open.clone()), open);
        let typed = json!({"properties": {"a": {}}, "additionalProperties": {"type": "string"}});
        assert_eq!(closed(typed.clone()), typed);
        let pattern = json!({"properties": {"a": {}}, "patternProperties": {"^x": {}}});
        assert_eq!(closed(pattern.clone()), pattern);
        let free = json!({"type": "object"});
        assert_eq!(closed(free.clone()), free);
    }

    #[test]
    fn branches_of_all_of_stay_open() {
        let schema = json!({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
                            "properties": {"a": {}, "b": {}}});
        assert_eq!(closed(schema.clone()), schema);
    }
}
