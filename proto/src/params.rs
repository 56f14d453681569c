//! What a request asks of generation, domain ↔ wire: [`SamplingParams`] and
//! [`OutputConstraint`] to their `tessera.v1` messages and back, both directions in one place
//! so that a new field is added once.

use tessera_params::{OutputConstraint, SamplingParams};

use crate::v1 as pb;

impl From<&SamplingParams> for pb::SamplingParameters {
    fn from(p: &SamplingParams) -> Self {
        pb::SamplingParameters {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            typical_p: p.typical_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            frequency_penalty: p.frequency_penalty,
            presence_penalty: p.presence_penalty,
            logit_bias: p
                .logit_bias
                .iter()
                .map(|&(token_id, bias)| pb::LogitBias { token_id, bias })
                .collect(),
            seed: p.seed,
            top_n_tokens: p.top_n_tokens,
        }
    }
}

impl From<pb::SamplingParameters> for SamplingParams {
    fn from(p: pb::SamplingParameters) -> Self {
        SamplingParams {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            typical_p: p.typical_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            frequency_penalty: p.frequency_penalty,
            presence_penalty: p.presence_penalty,
            logit_bias: p
                .logit_bias
                .into_iter()
                .map(|b| (b.token_id, b.bias))
                .collect(),
            seed: p.seed,
            top_n_tokens: p.top_n_tokens,
        }
    }
}

impl From<&OutputConstraint> for pb::OutputConstraint {
    fn from(c: &OutputConstraint) -> Self {
        use pb::output_constraint::Kind;
        let kind = match c {
            OutputConstraint::JsonObject => Kind::JsonObject(pb::JsonObject {}),
            OutputConstraint::OneOf(choices) => Kind::OneOf(pb::Choices {
                choices: choices.clone(),
            }),
            OutputConstraint::Pattern(p) => Kind::Pattern(p.clone()),
            OutputConstraint::JsonSchema(s) => Kind::JsonSchema(s.clone()),
            OutputConstraint::Lark(g) => Kind::Lark(g.clone()),
        };
        pb::OutputConstraint { kind: Some(kind) }
    }
}

/// A constraint message without a kind carries no constraint, so only the kind converts.
impl From<pb::output_constraint::Kind> for OutputConstraint {
    fn from(kind: pb::output_constraint::Kind) -> Self {
        use pb::output_constraint::Kind;
        match kind {
            Kind::JsonObject(pb::JsonObject {}) => OutputConstraint::JsonObject,
            Kind::OneOf(c) => OutputConstraint::OneOf(c.choices),
            Kind::Pattern(p) => OutputConstraint::Pattern(p),
            Kind::JsonSchema(s) => OutputConstraint::JsonSchema(s),
            Kind::Lark(g) => OutputConstraint::Lark(g),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_params_survive_the_wire() {
        let params = SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            typical_p: 0.8,
            min_p: 0.05,
            repetition_penalty: 1.1,
            frequency_penalty: -0.5,
            presence_penalty: 0.25,
            logit_bias: vec![(3, -100.0), (9, 2.5), (3, 1.0)],
            seed: Some(u64::MAX),
            top_n_tokens: 5,
        };
        let back = SamplingParams::from(pb::SamplingParameters::from(&params));
        assert_eq!(back, params);
        let greedy = SamplingParams::default();
        assert_eq!(
            SamplingParams::from(pb::SamplingParameters::from(&greedy)),
            greedy
        );
    }

    #[test]
    fn every_constraint_kind_survives_the_wire() {
        let constraints = [
            OutputConstraint::JsonObject,
            OutputConstraint::OneOf(vec!["yes".into(), "no".into()]),
            OutputConstraint::Pattern("[a-z]+".into()),
            OutputConstraint::JsonSchema(r#"{"type": "integer"}"#.into()),
            OutputConstraint::Lark("start: \"x\"".into()),
        ];
        for c in constraints {
            let kind = pb::OutputConstraint::from(&c).kind.expect("a kind");
            assert_eq!(OutputConstraint::from(kind), c);
        }
    }
}
