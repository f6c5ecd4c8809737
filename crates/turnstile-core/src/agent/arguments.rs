//! A tool call's arguments checked against the JSON schema the tool
//! declares, before the tool runs: valid JSON of the wrong shape never
//! reaches it. The schema is compiled once, when the tool is added.

use std::sync::Arc;

use serde_json::Value;

/// The most schema errors told to the model for one call, and the most
/// characters of each (an error quotes the offending value, which can be
/// the model's whole argument object).
const MAX_REPORTED: usize = 5;
const MAX_ERROR_CHARS: usize = 200;

/// The compiled parameter schema of one tool.
#[derive(Clone)]
pub(crate) struct ArgumentCheck(Arc<Result<jsonschema::Validator, String>>);

impl ArgumentCheck {
    pub(crate) fn compile(schema: &Value) -> Self {
        Self(Arc::new(
            jsonschema::validator_for(schema).map_err(|e| e.to_string()),
        ))
    }

    /// `Err` with what to tell the model when the arguments do not match
    /// (or the tool's own schema is invalid, so nothing can be checked: the
    /// call is refused rather than run unchecked).
    pub(crate) fn check(&self, arguments: &Value) -> Result<(), String> {
        let validator = match self.0.as_ref() {
            Ok(validator) => validator,
            Err(why) => return Err(format!("the tool's parameter schema is invalid: {why}")),
        };
        let errors: Vec<String> = validator
            .iter_errors(arguments)
            .take(MAX_REPORTED)
            .map(|e| {
                let text = match e.instance_path().to_string() {
                    path if path.is_empty() => e.to_string(),
                    path => format!("{path}: {e}"),
                };
                match text.char_indices().nth(MAX_ERROR_CHARS) {
                    Some((cut, _)) => format!("{}…", &text[..cut]),
                    None => text,
                }
            })
            .collect();
        match errors.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "arguments do not match the tool's parameters: {}",
                errors.join("; ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn arguments_of_the_wrong_shape_are_named_and_the_right_ones_pass() {
        let check = ArgumentCheck::compile(&json!({
            "type": "object",
            "properties": { "a": { "type": "integer" } },
            "required": ["a"]
        }));
        assert_eq!(check.check(&json!({"a": 2})), Ok(()));
        let wrong = check.check(&json!({"a": "two"})).unwrap_err();
        assert!(wrong.contains("/a") && wrong.contains("integer"), "{wrong}");
        let missing = check.check(&json!({})).unwrap_err();
        assert!(
            missing.contains("\"a\" is a required property"),
            "{missing}"
        );
    }

    #[test]
    fn an_invalid_schema_refuses_every_call() {
        let check = ArgumentCheck::compile(&json!({"type": "no-such-type"}));
        let refused = check.check(&json!({})).unwrap_err();
        assert!(refused.contains("schema is invalid"), "{refused}");
    }
}
