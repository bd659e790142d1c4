//! Problems as the document types them: one schema per `code`, with the
//! members that code always carries required (`insufficient_tokens`:
//! `available` and `reserved`; `too_many_active_reservations`: its
//! `max_active_reservations`; …), and each error answer typed by its
//! status: the one code of that status, or a `oneOf` of its codes
//! discriminated by `code`. Read from `ApiError` itself
//! (`ApiError::problem_shapes`), so a new error variant is documented where
//! it is answered.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// `insufficient_tokens` → `InsufficientTokensProblem`.
pub fn code_component(code: &str) -> String {
    let mut name: String = code
        .split('_')
        .map(|word| {
            let mut letters = word.chars();
            letters
                .next()
                .map(|first| first.to_uppercase().chain(letters).collect::<String>())
                .unwrap_or_default()
        })
        .collect();
    name.push_str("Problem");
    name
}

/// The component of a status's problems: `Problem409`.
pub fn status_component(status: u16) -> String {
    format!("Problem{status}")
}

/// The extension members of one code: (in every shape of it, in some).
type Members = (BTreeSet<String>, BTreeSet<String>);

/// Adds the per-code and per-status problem schemas, and points every
/// error answer of an operation at its status's.
pub fn add(document: &mut Value) {
    let mut by_status: BTreeMap<u16, BTreeMap<&str, Members>> = BTreeMap::new();
    for (status, code, members) in ApiError::problem_shapes() {
        let members: BTreeSet<String> = members.into_iter().collect();
        by_status
            .entry(status)
            .or_default()
            .entry(code)
            .and_modify(|(always, some)| {
                *always = always.intersection(&members).cloned().collect();
                some.extend(members.iter().cloned());
            })
            .or_insert_with(|| (members.clone(), members));
    }
    let Some(schemas) = document
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let Some(generic) = schemas.get("Problem").cloned() else {
        return;
    };
    let common = ["type", "title", "status", "detail", "code", "request_id"];
    let mut statuses = BTreeSet::new();
    for (status, codes) in &by_status {
        let mut variants = Vec::new();
        let mut mapping = Map::new();
        for (code, (always, some)) in codes {
            let mut properties = Map::new();
            for (name, property) in generic["properties"].as_object().into_iter().flatten() {
                if common.contains(&name.as_str()) || some.contains(name) {
                    properties.insert(name.clone(), property.clone());
                }
            }
            properties.insert("code".to_owned(), json!({"type": "string", "enum": [code]}));
            properties.insert(
                "status".to_owned(),
                json!({"type": "integer", "enum": [status],
                       "description": "The HTTP status code of the answer."}),
            );
            let mut required: Vec<Value> = ["type", "title", "status", "detail", "code"]
                .iter()
                .map(|name| json!(name))
                .collect();
            required.extend(always.iter().map(|name| json!(name)));
            let name = code_component(code);
            let description = generic["description"].as_str().unwrap_or_default();
            schemas.insert(
                name.clone(),
                json!({
                    "type": "object",
                    "description": format!("`{code}` ({status}). {description}"),
                    "required": required,
                    "properties": properties,
                }),
            );
            let target = format!("#/components/schemas/{name}");
            mapping.insert((*code).to_owned(), json!(target));
            variants.push(json!({"$ref": target}));
        }
        let union = if variants.len() == 1 {
            variants.remove(0)
        } else {
            json!({
                "description": format!("The problems a {status} answers, by `code`."),
                "oneOf": variants,
                "discriminator": {"propertyName": "code", "mapping": mapping}
            })
        };
        schemas.insert(status_component(*status), union);
        statuses.insert(status.to_string());
    }
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for operation in paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
    {
        let Some(responses) = operation
            .get_mut("responses")
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        for (status, response) in responses.iter_mut() {
            if !statuses.contains(status) {
                continue;
            }
            let Some(schema) = response.pointer_mut("/content/application~1problem+json/schema")
            else {
                continue;
            };
            if schema["$ref"] == "#/components/schemas/Problem" {
                *schema = json!({"$ref": format!("#/components/schemas/Problem{status}")});
            }
        }
    }
}
