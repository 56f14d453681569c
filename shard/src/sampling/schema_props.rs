//! A property of constrained sampling: over random JSON Schemas (objects with optional
//! properties, arrays, enums, bounded integers, `$ref` to `$defs`) and random logits, every
//! output that ends is JSON its schema accepts, whether its tokens were sampled one by one,
//! accepted from speculative proposals, or replayed into a new sampler after a preemption.
//! The vocabulary has special tokens (the end, and one that does not end) and tokens that
//! cross JSON's structure (`"}`, `}`, `"]`), the shapes that let an output end inside a string.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value, json};

use super::constraint::TokenVocab;
use super::{Sampler, SamplingParams};
use crate::speculative::verify;

const EOS: u32 = 0;

/// The end, a special token that does not end, every byte, then tokens across structure.
fn vocab() -> Vec<Option<Vec<u8>>> {
    let mut v = vec![None, None];
    v.extend((0..=255u8).map(|b| Some(vec![b])));
    for t in [
        "{\"", "\": ", "\", \"", "\"}", "\"]", "}", "]", "}, ", "[\"", "true", "false", "null",
        "12", "-3", "France}", " \"", "\"", "ab", "{}", "[]", ", ",
    ] {
        v.push(Some(t.as_bytes().to_vec()));
    }
    v
}

/// A random schema of at most `depth` more levels; `defs` collects the `$defs` it refers to.
fn schema(rng: &mut ChaCha8Rng, depth: u32, defs: &mut Map<String, Value>) -> Value {
    let kinds = if depth == 0 { 6 } else { 9 };
    match rng.random_range(0..kinds) {
        0 => json!({"type": "string", "maxLength": rng.random_range(1..6)}),
        1 => json!({"type": "string"}),
        2 => {
            let lo = rng.random_range(-5..5);
            json!({"type": "integer", "minimum": lo, "maximum": lo + rng.random_range(0..20)})
        }
        5 => json!({"type": "boolean"}),
        3 => json!({"enum": ["red", "blue", 7, null]}),
        4 => json!({"type": "string", "enum": ["a", "b\"c", "}"]}),
        6 => {
            let min = rng.random_range(0..2);
            json!({"type": "array", "items": schema(rng, depth - 1, defs),
                   "minItems": min, "maxItems": min + rng.random_range(0..3)})
        }
        7 => {
            let name = format!("D{}", defs.len());
            defs.insert(name.clone(), Value::Null);
            let def = schema(rng, depth - 1, defs);
            defs.insert(name.clone(), def);
            json!({"$ref": format!("#/$defs/{name}")})
        }
        _ => {
            let mut properties = Map::new();
            let mut required = Vec::new();
            for i in 0..rng.random_range(1..4) {
                let key = format!("k{i}");
                properties.insert(key.clone(), schema(rng, depth - 1, defs));
                if rng.random_bool(0.6) {
                    required.push(Value::from(key));
                }
            }
            json!({"type": "object", "properties": properties, "required": required})
        }
    }
}

/// Why `v` is not accepted by `s` (objects without `additionalProperties` take only their
/// declared keys, as Tessera compiles them).
fn check(s: &Value, defs: &Map<String, Value>, v: &Value) -> Result<(), String> {
    let bad = || Err(format!("{v} does not satisfy {s}"));
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let def = r.strip_prefix("#/$defs/").and_then(|n| defs.get(n));
        return def.map_or_else(bad, |d| check(d, defs, v));
    }
    if let Some(list) = s.get("enum").and_then(Value::as_array) {
        return if list.contains(v) { Ok(()) } else { bad() };
    }
    match s["type"].as_str() {
        Some("string") => {
            let max = s["maxLength"].as_u64().unwrap_or(u64::MAX);
            match v.as_str() {
                Some(t) if t.chars().count() as u64 <= max => Ok(()),
                _ => bad(),
            }
        }
        // JSON Schema's integers are numbers without a fraction (`-0` among them).
        Some("integer") => match v.as_f64() {
            Some(n)
                if n.fract() == 0.0
                    && s["minimum"].as_f64() <= Some(n)
                    && Some(n) <= s["maximum"].as_f64() =>
            {
                Ok(())
            }
            _ => bad(),
        },
        Some("boolean") if v.is_boolean() => Ok(()),
        Some("array") => {
            let items = v.as_array().ok_or_else(|| format!("{v} is not an array"))?;
            let n = items.len() as u64;
            if s["minItems"].as_u64() > Some(n) || s["maxItems"].as_u64() < Some(n) {
                return bad();
            }
            items.iter().try_for_each(|x| check(&s["items"], defs, x))
        }
        Some("object") => {
            let obj = v
                .as_object()
                .ok_or_else(|| format!("{v} is not an object"))?;
            let props = s["properties"].as_object().cloned().unwrap_or_default();
            for key in s["required"].as_array().into_iter().flatten() {
                if !key.as_str().is_some_and(|k| obj.contains_key(k)) {
                    return Err(format!("{v} lacks {key}"));
                }
            }
            for (key, x) in obj {
                let sub = props
                    .get(key)
                    .ok_or_else(|| format!("{v}: undeclared {key}"))?;
                check(sub, defs, x)?;
            }
            Ok(())
        }
        _ => bad(),
    }
}

/// How the tokens of one output are chosen.
#[derive(Clone, Copy, Debug)]
enum Decoding {
    OneByOne,
    /// Random proposals of 1 to 3 tokens, verified by the rejection rule.
    Speculative,
    /// One by one, with the sampler rebuilt from the tokens so far halfway.
    Preempted,
}

/// Samples one output of `schema` under `decoding`; its bytes if it ended.
fn sample_output(
    vocab: &Arc<TokenVocab>,
    tokens: &[Option<Vec<u8>>],
    schema_text: &str,
    seed: u64,
    decoding: Decoding,
) -> Option<Vec<u8>> {
    let params = SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..Default::default()
    };
    let source = || tessera_text::GrammarSource::JsonSchema(schema_text);
    let fresh = || {
        Sampler::new(params.clone(), &[])
            .with_grammar(vocab.clone(), source())
            .unwrap()
    };
    let mut sampler = fresh();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let mut ids: Vec<u32> = Vec::new();
    let logits = |rng: &mut ChaCha8Rng, step: usize| -> Vec<f32> {
        (0..tokens.len())
            .map(|id| {
                let x = rng.random_range(-3.0f32..3.0);
                // The end and the special token grow likelier, so that most outputs end and
                // the grammar is what keeps them from ending early.
                if id <= 1 { x + step as f32 / 30.0 } else { x }
            })
            .collect()
    };
    while ids.len() < 400 {
        let step = ids.len();
        let chosen: Vec<u32> = match decoding {
            Decoding::Speculative => {
                let proposals: Vec<u32> = (0..rng.random_range(1..4))
                    .map(|_| rng.random_range(0..tokens.len() as u32))
                    .collect();
                let rows: Vec<Vec<f32>> = (0..=proposals.len())
                    .map(|_| logits(&mut rng, step))
                    .collect();
                let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
                let verdict = verify(&mut sampler, &rows, &proposals, None);
                verdict.tokens.iter().map(|t| t.id).collect()
            }
            Decoding::OneByOne | Decoding::Preempted => {
                if matches!(decoding, Decoding::Preempted) && step == 20 {
                    sampler = fresh();
                    ids.iter().for_each(|&id| sampler.record(id));
                }
                vec![sampler.sample(&logits(&mut rng, step)).id]
            }
        };
        for id in chosen {
            if id == EOS {
                let bytes = ids
                    .iter()
                    .flat_map(|&i| tokens[i as usize].clone().unwrap());
                return Some(bytes.collect());
            }
            assert!(tokens[id as usize].is_some(), "drew special token {id}");
            ids.push(id);
        }
    }
    None
}

#[test]
fn every_ended_output_validates_against_its_random_schema() {
    let tokens = vocab();
    let vocab = Arc::new(TokenVocab::new(&tokens, &[EOS]));
    let mut rng = ChaCha8Rng::seed_from_u64(40);
    let mut ended = 0;
    let pairs = 240;
    for pair in 0..pairs {
        let mut defs = Map::new();
        let mut root = schema(&mut rng, 3, &mut defs);
        if !defs.is_empty() {
            root["$defs"] = Value::Object(defs.clone());
        }
        let text = root.to_string();
        let decoding = [
            Decoding::OneByOne,
            Decoding::Speculative,
            Decoding::Preempted,
        ][pair % 3];
        let Some(out) = sample_output(&vocab, &tokens, &text, pair as u64, decoding) else {
            continue;
        };
        let out = String::from_utf8(out).expect("UTF-8");
        let value: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{decoding:?} {text}: {e}: {out:?}"));
        check(&root, &defs, &value).unwrap_or_else(|e| panic!("{decoding:?} {text}: {e}"));
        ended += 1;
    }
    assert!(
        ended >= pairs * 3 / 4,
        "only {ended} of {pairs} outputs ended"
    );
}
