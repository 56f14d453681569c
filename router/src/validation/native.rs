//! The native (TGI) request's rules: `/generate` and `/generate_stream` bodies into the request
//! to run.

use tessera_params::OutputConstraint;

use super::constraint::{check_constraint, output_pattern};
use super::structured::json_schema;
use super::{
    GenerateInput, Prompt, RequestParameters, ValidNativeRequest, Validation, ValidationError,
};
use crate::native::{GenerateParameters, GenerateRequest, Grammar};

impl Validation {
    /// Validates a native request: `best_of`, `grammar` (a pattern compiled off the async
    /// runtime), `watermark`, then the prompt and parameters.
    pub(crate) async fn validate_generate(
        &self,
        req: GenerateRequest,
    ) -> Result<ValidNativeRequest, ValidationError> {
        let details = req.parameters.details;
        let full_text = req.parameters.return_full_text.unwrap_or(false);
        let input = req.into_input()?;
        let constraint = input.parameters.constraint.as_ref();
        check_constraint("grammar", constraint, &self.grammars, &self.tokenizer).await?;
        let request = self.validate(input).await?;
        let text_prefix = if full_text {
            request.inputs.clone()
        } else {
            String::new()
        };
        Ok(ValidNativeRequest {
            request,
            details,
            text_prefix,
        })
    }
}

impl GenerateRequest {
    /// The request in API-neutral terms, once what is not supported is refused.
    fn into_input(self) -> Result<GenerateInput, ValidationError> {
        let p = self.parameters;
        if p.best_of.is_some_and(|b| b > 1) {
            return Err(ValidationError::Unsupported {
                param: "best_of",
                reason: "only 1 is supported; use `n` on /v1/completions for several samples",
            });
        }
        let constraint = grammar_constraint(p.grammar.as_ref())?;
        if p.watermark {
            return Err(ValidationError::Unsupported {
                param: "watermark",
                reason: "watermarking is not implemented",
            });
        }
        Ok(GenerateInput {
            prompt: Prompt::Text {
                text: self.inputs,
                add_special_tokens: true,
            },
            truncate: p.truncate,
            parameters: RequestParameters {
                constraint,
                ..p.into_parameters()
            },
        })
    }
}

/// TGI's `grammar`: a regular expression or a JSON Schema.
fn grammar_constraint(
    grammar: Option<&Grammar>,
) -> Result<Option<OutputConstraint>, ValidationError> {
    match grammar {
        None => Ok(None),
        Some(g) => match g.kind.as_str() {
            "regex" => Ok(Some(OutputConstraint::Pattern(output_pattern(
                "grammar", &g.value,
            )?))),
            "json" | "json_schema" => Ok(Some(json_schema("grammar", &g.value)?)),
            other => Err(ValidationError::Constraint {
                param: "grammar",
                message: format!("unknown type `{other}`; expected `json` or `regex`"),
            }),
        },
    }
}

impl GenerateParameters {
    /// The sampling and stopping fields as engine parameters (no constraint).
    fn into_parameters(self) -> RequestParameters {
        // TGI: sampling when asked, or when any sampling parameter is set.
        let do_sample = self.do_sample
            || self.temperature.is_some_and(|t| t != 1.0)
            || self.top_k.is_some()
            || self.top_p.is_some()
            || self.typical_p.is_some()
            || self.min_p.is_some();
        RequestParameters {
            do_sample,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            typical_p: self.typical_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: Vec::new(),
            seed: self.seed,
            top_n_tokens: self.top_n_tokens,
            max_new_tokens: self.max_new_tokens,
            stop: self.stop,
            ignore_eos: self.ignore_eos,
            stop_token_ids: Vec::new(),
            decoder_input_details: self.decoder_input_details,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            constraint: None,
        }
    }
}
