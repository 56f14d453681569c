//! Output patterns, shared by the APIs' constraint fields (`guided_regex`, TGI's `grammar`):
//! the pattern's text, and the pattern compiled as the shard will compile it.

use tessera_params::OutputConstraint;

use super::ValidationError;

/// An output pattern's text: a non-empty string ([`check_pattern`] compiles it).
pub(super) fn output_pattern(
    param: &'static str,
    v: &serde_json::Value,
) -> Result<String, ValidationError> {
    v.as_str()
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| ValidationError::Pattern {
            param,
            message: "must be a non-empty regular expression".into(),
        })
}

/// Compiles a pattern constraint as the shard will, off the async runtime (a pattern near the
/// size cap takes a few hundred milliseconds), so that one the shard could not honour is
/// refused here.
pub(super) async fn check_pattern(
    param: &'static str,
    constraint: Option<&OutputConstraint>,
) -> Result<(), ValidationError> {
    let Some(OutputConstraint::Pattern(pattern)) = constraint else {
        return Ok(());
    };
    let owned = pattern.to_owned();
    tokio::task::spawn_blocking(move || tessera_formats::compile_output_pattern(&owned).map(drop))
        .await
        .unwrap_or_else(|e| Err(format!("the pattern check failed: {e}")))
        .map_err(|message| ValidationError::Pattern { param, message })
}
