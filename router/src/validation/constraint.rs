//! Output constraints, shared by the APIs' constraint fields (`guided_regex`, `guided_json`,
//! `response_format`, TGI's `grammar`, the tool-call grammars): their texts, and each one
//! compiled as the shard will compile it, off the async runtime and within a time budget, so
//! that one the shard could not honour is refused here.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tessera_params::OutputConstraint;
use tessera_text::{GrammarCompiler, GrammarError, GrammarSource, ModelTokenizer};

use super::ValidationError;

/// Longest a grammar may take to compile (and compute its first mask) before the request is
/// refused; the compilation itself is bounded by llguidance's limits, this bounds the wait.
const GRAMMAR_BUDGET: Duration = Duration::from_secs(2);

/// Longest schema or grammar text accepted, in bytes.
pub(super) const MAX_GRAMMAR_BYTES: usize = 256 << 10;

/// The grammar compiler of the served vocabulary, built once on first use.
#[derive(Debug, Clone, Default)]
pub(crate) struct Grammars(Arc<OnceLock<Result<GrammarCompiler, GrammarError>>>);

impl Grammars {
    /// The compiler for `tokenizer`'s vocabulary (built now if it is the first call).
    pub(crate) fn get(&self, tokenizer: &ModelTokenizer) -> Result<&GrammarCompiler, GrammarError> {
        self.0
            .get_or_init(|| {
                GrammarCompiler::new(&tokenizer.token_bytes(), &tokenizer.eos_token_ids)
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// An output pattern's text: a non-empty string ([`check_constraint`] compiles it).
pub(super) fn output_pattern(
    param: &'static str,
    v: &serde_json::Value,
) -> Result<String, ValidationError> {
    v.as_str()
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| ValidationError::Constraint {
            param,
            message: "must be a non-empty regular expression".into(),
        })
}

/// A JSON Schema given as an object or as its text, as the schema's text.
pub(super) fn schema_text(
    param: &'static str,
    v: &serde_json::Value,
) -> Result<String, ValidationError> {
    let bad = |message: String| ValidationError::Constraint { param, message };
    let schema = match v {
        serde_json::Value::String(text) => serde_json::from_str(text)
            .map_err(|e| bad(format!("the schema text is not JSON: {e}")))?,
        other => other.clone(),
    };
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(bad("a JSON Schema is an object (or `true`)".into()));
    }
    let text = schema.to_string();
    check_size(param, &text)?;
    Ok(text)
}

/// A grammar given as its text.
pub(super) fn grammar_text(
    param: &'static str,
    v: &serde_json::Value,
) -> Result<String, ValidationError> {
    let text =
        v.as_str()
            .filter(|g| !g.trim().is_empty())
            .ok_or_else(|| ValidationError::Constraint {
                param,
                message: "must be a non-empty Lark grammar (llguidance's dialect)".into(),
            })?;
    check_size(param, text)?;
    Ok(text.to_owned())
}

fn check_size(param: &'static str, text: &str) -> Result<(), ValidationError> {
    if text.len() > MAX_GRAMMAR_BYTES {
        return Err(ValidationError::Constraint {
            param,
            message: format!(
                "is {} bytes; at most {MAX_GRAMMAR_BYTES} are accepted",
                text.len()
            ),
        });
    }
    Ok(())
}

/// Compiles `constraint` as the shard will, off the async runtime and within
/// [`GRAMMAR_BUDGET`]; the error names `param`.
pub(super) async fn check_constraint(
    param: &'static str,
    constraint: Option<&OutputConstraint>,
    grammars: &Grammars,
    tokenizer: &Arc<ModelTokenizer>,
) -> Result<(), ValidationError> {
    let bad = |message: String| ValidationError::Constraint { param, message };
    let check: Box<dyn FnOnce() -> Result<(), String> + Send> = match constraint {
        None | Some(OutputConstraint::JsonObject | OutputConstraint::OneOf(_)) => return Ok(()),
        Some(OutputConstraint::Pattern(pattern)) => {
            let pattern = pattern.clone();
            Box::new(move || tessera_text::compile_output_pattern(&pattern).map(drop))
        }
        Some(c @ (OutputConstraint::JsonSchema(_) | OutputConstraint::Lark(_))) => {
            let (c, grammars, tokenizer) = (c.clone(), grammars.clone(), tokenizer.clone());
            Box::new(move || {
                let source = match &c {
                    OutputConstraint::JsonSchema(s) => GrammarSource::JsonSchema(s),
                    OutputConstraint::Lark(g) => GrammarSource::Lark(g),
                    _ => return Ok(()),
                };
                let compiler = grammars.get(&tokenizer).map_err(|e| e.to_string())?;
                compiler
                    .compile(source)
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
        }
    };
    match tokio::time::timeout(GRAMMAR_BUDGET, tokio::task::spawn_blocking(check)).await {
        Err(_) => Err(bad(format!(
            "did not compile within {} s; simplify it",
            GRAMMAR_BUDGET.as_secs()
        ))),
        Ok(Err(e)) => Err(ValidationError::Internal(format!(
            "the constraint check failed: {e}"
        ))),
        Ok(Ok(result)) => result.map_err(bad),
    }
}
