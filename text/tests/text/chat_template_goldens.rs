//! The chat templates of the families Tessera loads (Qwen 2.5/3, DeepSeek-R1 distills,
//! Gemma 2/3, Phi-3.5/4, Mixtral, Mistral Nemo, Llama 3.1/3.2, SmolLM3, gpt-oss) render as
//! transformers renders them: system prompts, turns, tools, tool results, reasoning, and the
//! messages templates raise. Goldens: `scripts/make_chat_template_goldens.py`.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};
use tessera_text::{ChatMessage, ChatTemplate, ChatTemplateError, RenderOptions};

#[derive(Deserialize)]
struct Goldens {
    templates: std::collections::BTreeMap<String, TemplateEntry>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct TemplateEntry {
    file: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

#[derive(Deserialize)]
struct Case {
    template: String,
    case: String,
    messages: Vec<ChatMessage>,
    tools: Option<Value>,
    add_generation_prompt: bool,
    extra: Map<String, Value>,
    expected: Expected,
}

#[derive(Deserialize, Debug, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Expected {
    /// What the template printed.
    Text(String),
    /// The message the template passed to `raise_exception`.
    Raised(String),
}

/// What the goldens print in place of the day they were made (templates that print the date).
const TODAY: &str = "{{today}}";

/// Today as `strftime_now("%Y-%m-%d")` prints it.
fn today() -> String {
    let template = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}".into(), None, None)
        .expect("a template that prints the date");
    template.render(&[], false).expect("the date")
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/chat-templates")
}

#[test]
fn family_templates_render_as_transformers_renders_them() {
    let text = std::fs::read_to_string(dir().join("goldens.json")).expect("goldens.json");
    let goldens: Goldens = serde_json::from_str(&text).expect("goldens.json parses");
    let mut failures = Vec::new();
    let mut per_template = std::collections::BTreeMap::<&str, usize>::new();
    for case in &goldens.cases {
        let entry = &goldens.templates[&case.template];
        let source = std::fs::read_to_string(dir().join(&entry.file)).expect("template file");
        let template = ChatTemplate::new(source, entry.bos_token.clone(), entry.eos_token.clone())
            .unwrap_or_else(|e| panic!("{}: {e}", case.template));
        let options = RenderOptions {
            add_generation_prompt: case.add_generation_prompt,
            tools: case.tools.as_ref(),
            extra: Some(&case.extra),
        };
        let got = match template.render_with(&case.messages, &options) {
            Ok(text) => Expected::Text(text.replace(&today(), TODAY)),
            Err(ChatTemplateError::Raised(message)) => Expected::Raised(message),
            Err(other) => {
                failures.push(format!("{} / {}: {other}", case.template, case.case));
                continue;
            }
        };
        if got != case.expected {
            failures.push(format!(
                "{} / {}:\n  transformers {:?}\n  tessera      {got:?}",
                case.template, case.case, case.expected
            ));
        }
        *per_template.entry(&case.template).or_default() += 1;
    }
    assert!(
        per_template.len() >= 12 && goldens.cases.len() >= 100,
        "goldens lost templates or cases: {per_template:?}"
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from transformers:\n{}",
        failures.len(),
        goldens.cases.len(),
        failures.join("\n")
    );
}
