//! Chat templates rendered as transformers renders them.

use tessera_text::{ChatMessage, ChatTemplate, RenderOptions};

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Llama 3 style, with the alternation check Llama 2 / Mistral templates use.
const LLAMA3: &str = r#"{{- bos_token }}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs
        .iter()
        .map(|(r, c)| ChatMessage::new(*r, *c))
        .collect()
}

fn template(source: &str) -> ChatTemplate {
    ChatTemplate::new(source.to_string(), Some("<s>".into()), Some("</s>".into()))
        .expect("template compiles")
}

#[test]
fn chatml_renders_with_and_without_generation_prompt() {
    let t = template(CHATML);
    let m = msgs(&[("system", "Be brief."), ("user", "Hi")]);
    assert_eq!(
        t.render(&m, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&m, false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
fn llama3_template_renders_and_raises_on_bad_roles() {
    let t = template(LLAMA3);
    let ok = msgs(&[("user", "  Hello  "), ("assistant", "Hi!"), ("user", "Bye")]);
    assert_eq!(
        t.render(&ok, true).unwrap(),
        "<s><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let bad = msgs(&[("user", "a"), ("user", "b")]);
    let err = t.render(&bad, true).unwrap_err();
    assert!(format!("{err:?}").starts_with("Raised("), "{err:?}");
    assert_eq!(
        err.to_string(),
        "Conversation roles must alternate user/assistant/user/assistant/..."
    );
}

#[test]
fn python_string_methods_and_tojson() {
    let source = r#"{% for m in messages %}{{ m.role.upper() }}|{{ m.content.strip() }}|{{ m.content.strip().split(' ') | tojson }}|{{ m.content.lstrip().startswith('Hi') }}|{{ m.content.rstrip().endswith('?') }}|{{ m.content.strip().title() }}|{{ m.content.replace('you', 'YOU').lower() }}
{% endfor %}{{ {'name': 'get_weather', 'parameters': {'city': 'Paris', 'days': [1, 2.5, none, true]}} | tojson }}
{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2) }}
{{ "quote \" and <tag> & é \n" | tojson }}"#;
    let t = template(source);
    let out = t
        .render(&msgs(&[("user", "  Hi how are you?  ")]), false)
        .unwrap();
    assert_eq!(
        out,
        "USER|Hi how are you?|[\"Hi\", \"how\", \"are\", \"you?\"]|True|True|Hi How Are You?|  hi how are you?  \n\
         {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": [1, 2.5, null, true]}}\n\
         {\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ]\n}\n\
         \"quote \\\" and <tag> & é \\n\""
    );
}

#[test]
fn trim_and_lstrip_blocks_are_on() {
    let source = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    let t = template(source);
    // transformers: trim_blocks drops the newline after a block tag, lstrip_blocks the
    // indentation before it, and the final newline of the template is dropped.
    assert_eq!(
        t.render(&msgs(&[("user", "a"), ("user", "b")]), false)
            .unwrap(),
        "a\nb\n"
    );
}

#[test]
fn hostile_content_is_rendered_literally() {
    let t = template(CHATML);
    let evil = "{{ raise_exception('boom') }}{% for x in range(10) %}x{% endfor %}{# c #}";
    let out = t.render(&msgs(&[("user", evil)]), false).unwrap();
    assert_eq!(out, format!("<|im_start|>user\n{evil}<|im_end|>\n"));
    let huge = "x".repeat(4 << 20);
    let out = t.render(&msgs(&[("user", &huge)]), false).unwrap();
    assert_eq!(
        out.len(),
        huge.len() + "<|im_start|>user\n<|im_end|>\n".len()
    );
}

#[test]
fn syntax_error_names_the_line() {
    let err = ChatTemplate::new(
        "line one\n{% for m in messages %}\n{{ m.content }\n".into(),
        None,
        None,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("syntax error"), "{text}");
    assert!(text.contains("line 3"), "{text}");
}

#[test]
fn render_errors_say_what_failed() {
    let t = template("{{ messages[0].content.nonexistent_method() }}");
    let err = t.render(&msgs(&[("user", "hi")]), false).unwrap_err();
    assert!(err.to_string().contains("line 1"), "{err}");
}

#[test]
fn strftime_now_and_special_tokens() {
    let t = ChatTemplate::new(
        "{{ bos_token }}{{ strftime_now('%Y') | length }}{{ eos_token }}{{ tools is none }}".into(),
        Some("<|begin_of_text|>".into()),
        None,
    )
    .unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "<|begin_of_text|>4True");
}

#[test]
fn tools_are_visible_to_the_template() {
    let t = template("{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}");
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    assert_eq!(
        t.render_with(
            &[],
            &RenderOptions {
                tools: Some(&tools),
                ..RenderOptions::default()
            }
        )
        .unwrap(),
        "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}"
    );
}

#[test]
fn messages_round_trip_through_serde() {
    let m: Vec<ChatMessage> =
        serde_json::from_str(r#"[{"role":"user","content":"What is the capital of France?"}]"#)
            .unwrap();
    assert_eq!(m, msgs(&[("user", "What is the capital of France?")]));
}
