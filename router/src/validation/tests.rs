use super::parameters::{TopLogprobs, check_openai_temperature, random_u64};
use super::*;
use crate::detokenizer::tests::byte_level;
use tessera_params::SamplingParams;
use tessera_text::ChatMessage;

fn validation() -> Validation {
    Validation::new(
        ValidationConfig {
            max_input_tokens: 10,
            max_total_tokens: 16,
            max_stop_sequences: 2,
            max_top_n_tokens: 5,
            max_best_of: 3,
            ..ValidationConfig::default()
        },
        byte_level(),
    )
}

fn validate(params: RequestParameters) -> Result<ValidGenerateRequest, ValidationError> {
    validation().validate_tokenized("abc".into(), vec![1, 2, 3], params, None)
}

fn err(params: RequestParameters) -> String {
    validate(params).unwrap_err().to_string()
}

#[tokio::test]
async fn tokenizes_with_and_without_special_tokens() {
    let v = validation();
    let text = |add_special_tokens| GenerateInput {
        prompt: Prompt::Text {
            text: "hello".into(),
            add_special_tokens,
        },
        parameters: RequestParameters::default(),
        truncate: None,
    };
    let r = v.validate(text(true)).await.unwrap();
    assert_eq!(r.input_ids, vec![261, 259]);
    assert_eq!(r.inputs, "hello");
    assert_eq!(r.stopping.max_new_tokens, 14);
    let r = v.validate(text(false)).await.unwrap();
    assert_eq!(r.input_ids, vec![259]);
    let ids = GenerateInput {
        prompt: Prompt::Ids(vec![259]),
        ..text(true)
    };
    assert_eq!(v.validate(ids).await.unwrap().inputs, "hello");
}

#[tokio::test]
async fn empty_and_out_of_vocabulary_prompts() {
    let v = validation();
    let input = |prompt| GenerateInput {
        prompt,
        parameters: RequestParameters::default(),
        truncate: None,
    };
    let e = v
        .validate(input(Prompt::Text {
            text: String::new(),
            add_special_tokens: true,
        }))
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "`inputs` cannot be empty");
    let e = v.validate(input(Prompt::Ids(vec![]))).await.unwrap_err();
    assert_eq!(e, ValidationError::EmptyInput("inputs"));
    let e = v
        .validate(input(Prompt::Ids(vec![9999])))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "`prompt` token id 9999 is not in the vocabulary (size 263)"
    );
}

#[test]
fn input_length_and_total_tokens() {
    let v = validation();
    let p = RequestParameters::default;
    let e = v
        .validate_tokenized("x".into(), vec![1; 11], p(), None)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "`inputs` must have at most 10 tokens. Given: 11"
    );
    // Truncation keeps the last tokens.
    let r = v
        .validate_tokenized("x".into(), (0..11).collect(), p(), Some(4))
        .unwrap();
    assert_eq!(r.input_ids, vec![7, 8, 9, 10]);
    let e = v
        .validate_tokenized("x".into(), vec![1], p(), Some(11))
        .unwrap_err();
    assert_eq!(e.param(), Some("truncate"));
    let e = err(RequestParameters {
        max_new_tokens: Some(14),
        ..p()
    });
    assert_eq!(
        e,
        "`inputs` tokens + `max_new_tokens` must be <= 16. Given: 3 `inputs` tokens and 14 `max_new_tokens`"
    );
    let e = err(RequestParameters {
        max_new_tokens: Some(0),
        ..p()
    });
    assert_eq!(e, "`max_new_tokens` must be strictly positive. Given: 0");
    let r = validate(RequestParameters {
        max_new_tokens: Some(13),
        ..p()
    })
    .unwrap();
    assert_eq!(r.stopping.max_new_tokens, 13);
    // Default: what the context allows, capped by the configured default.
    assert_eq!(validate(p()).unwrap().stopping.max_new_tokens, 13);
    let mut v = validation();
    v.config.default_max_new_tokens = Some(5);
    let r = v
        .validate_tokenized("x".into(), vec![1], p(), None)
        .unwrap();
    assert_eq!(r.stopping.max_new_tokens, 5);
}

/// The router's own rules, and the engine's ranges (`SamplingParams::validate`, tested in
/// `tessera-params`) reported under the request's field names.
#[test]
fn parameter_ranges() {
    let with = |set: fn(&mut RequestParameters)| {
        let mut p = RequestParameters::default();
        set(&mut p);
        p
    };
    let cases: Vec<(RequestParameters, &str)> = vec![
        (
            with(|p| p.temperature = Some(-0.1)),
            "`temperature` must be >= 0. Given: -0.1",
        ),
        (
            with(|p| p.temperature = Some(f32::NAN)),
            "`temperature` must be >= 0. Given: NaN",
        ),
        (
            with(|p| p.top_p = Some(0.0)),
            "`top_p` must be in (0, 1]. Given: 0",
        ),
        (
            with(|p| p.top_k = Some(0)),
            "`top_k` must be strictly positive. Given: 0",
        ),
        (
            with(|p| p.top_k = Some(-3)),
            "`top_k` must be strictly positive. Given: -3",
        ),
        (
            with(|p| p.top_n_tokens = Some(6)),
            "`top_n_tokens` must be <= 5. Given: 6",
        ),
        (
            with(|p| p.stop = vec!["a".into(), "b".into(), "c".into()]),
            "`stop` must be <= 2. Given: 3",
        ),
        (
            with(|p| p.stop = vec![String::new()]),
            "`stop` sequences cannot be empty strings",
        ),
        (
            with(|p| p.logit_bias = vec![("263".into(), 1.0)]),
            "`logit_bias` token id 263 is not in the vocabulary (size 263)",
        ),
        (
            with(|p| p.logit_bias = vec![("abc".into(), 1.0)]),
            "`logit_bias` token id abc is not in the vocabulary (size 263)",
        ),
        (
            with(|p| p.logit_bias = vec![("5".into(), 101.0)]),
            "`logit_bias` must be in [-100, 100]. Given: 101",
        ),
    ];
    for (params, message) in cases {
        assert_eq!(err(params), message);
    }
}

#[test]
fn valid_parameters_and_sampling() {
    let r = validate(RequestParameters::default()).unwrap();
    assert_eq!(r.parameters, SamplingParams::default());
    assert!(r.skip_special_tokens);
    let r = validate(RequestParameters {
        do_sample: true,
        top_k: Some(5),
        top_p: Some(1.0),
        min_p: Some(0.1),
        logit_bias: vec![("7".into(), -100.0)],
        stop: vec!["x".into(), "y".into()],
        top_n_tokens: Some(5),
        ..RequestParameters::default()
    })
    .unwrap();
    assert_eq!(r.parameters.temperature, 1.0);
    assert_eq!(r.parameters.top_k, 5);
    assert_eq!(r.parameters.logit_bias, vec![(7, -100.0)]);
    assert_eq!(r.parameters.top_n_tokens, 5);
    assert!(r.parameters.seed.is_some(), "sampling gets a seed");
    assert_eq!(r.stopping.stop_sequences, ["x", "y"]);
    let r = validate(RequestParameters {
        do_sample: true,
        temperature: Some(0.0),
        seed: Some(3),
        ..RequestParameters::default()
    })
    .unwrap();
    assert_eq!(r.parameters.temperature, 0.0);
    assert_eq!(r.parameters.seed, Some(3));
}

#[test]
fn n_and_openai_bounds() {
    let v = validation();
    assert!(v.validate_n("n", 3).is_ok());
    assert_eq!(
        v.validate_n("n", 4).unwrap_err().to_string(),
        "`n` must be <= 3. Given: 4"
    );
    assert_eq!(
        v.validate_n("n", 0).unwrap_err().to_string(),
        "`n` must be strictly positive. Given: 0"
    );
    assert_eq!(
        check_openai_temperature(Some(2.1)).unwrap_err().to_string(),
        "`temperature` must be in [0, 2]. Given: 2.1"
    );
    assert_eq!(
        TopLogprobs {
            param: "top_logprobs",
            given: 21,
            max: 20
        }
        .check()
        .unwrap_err()
        .to_string(),
        "`top_logprobs` must be <= 20. Given: 21"
    );
    assert!(
        check_openai_temperature(Some(0.0)).is_ok()
            && TopLogprobs {
                param: "logprobs",
                given: 5,
                max: 5
            }
            .check()
            .is_ok()
    );
}

#[test]
fn chat_template_errors() {
    let v = validation();
    assert_eq!(
        v.apply_chat_template(&[]).unwrap_err(),
        ValidationError::EmptyInput("messages")
    );
    assert_eq!(
        v.apply_chat_template(&[ChatMessage::new("user", "hi")])
            .unwrap_err(),
        ValidationError::NoChatTemplate
    );
}

#[test]
fn random_numbers_differ() {
    assert_ne!(random_u64(), random_u64());
}
