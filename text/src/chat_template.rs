//! Chat templates: the Jinja templates of Hugging Face tokenizers, rendered with minijinja the
//! way transformers renders them (`trim_blocks` and `lstrip_blocks` on, `raise_exception`,
//! `strftime_now`, a Python-compatible `tojson`, Python string and dict methods).
//!
//! Message contents are values handed to the template, never template source: `{{ }}` in a
//! message is printed literally.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Serde, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation. The optional fields are absent from the template's view
/// when unset, as transformers leaves them, since templates test them with `is defined`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, …
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant's tool calls, as templates read them: `{"id", "type": "function",
    /// "function": {"name", "arguments"}}` with `arguments` a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool message's function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant's thinking before its answer, under the name templates read it by
    /// (Qwen3's and DeepSeek's show it for the turns after the last user message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same thinking under the name gpt-oss's template reads it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    /// A message with this role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning_content: None,
            thinking: None,
        }
    }
}

/// What a conversation is rendered with besides its messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// End with the header of the assistant's turn.
    pub add_generation_prompt: bool,
    /// The tool definitions the template sees as `tools`.
    pub tools: Option<&'a serde_json::Value>,
    /// More variables for the template (`chat_template_kwargs`, e.g. `enable_thinking`); they
    /// cannot replace `messages`, `tools`, `add_generation_prompt` or the special tokens.
    pub extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatTemplateError {
    /// The template source does not parse.
    #[error("chat template syntax error{}: {message}", at_line(*line))]
    Syntax {
        /// The template line, 1-based, when known.
        line: Option<usize>,
        /// What the parser found.
        message: String,
    },
    /// The template called `raise_exception(message)`: it rejects this conversation (for
    /// example roles that do not alternate). The message is the template's own.
    #[error("{0}")]
    Raised(String),
    /// Rendering failed for another reason (a bad operation, an undefined function).
    #[error("chat template error{}: {message}", at_line(*line))]
    Render {
        /// The template line, 1-based, when known.
        line: Option<usize>,
        /// What went wrong.
        message: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

/// The error `raise_exception` attaches as the source of its minijinja error, so that the
/// message comes back unchanged.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token` and `eos_token` are the texts the template sees as
    /// `bos_token` and `eos_token`.
    pub fn new(
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| syntax_error(&e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| syntax_error(&e))?;
        Ok(Self {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    /// The texts the template sees as `bos_token` and `eos_token`.
    pub fn special_tokens(&self) -> (Option<String>, Option<String>) {
        (self.bos_token.clone(), self.eos_token.clone())
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template renders tool definitions (reads a `tools` variable).
    pub fn renders_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// Renders the conversation; with `add_generation_prompt` the template ends with the
    /// header of the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let options = RenderOptions {
            add_generation_prompt,
            ..RenderOptions::default()
        };
        self.render_with(messages, &options)
    }

    /// Renders the conversation with tools and extra variables.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| render_error(&e))?;
        let mut vars: std::collections::BTreeMap<String, Value> = options
            .extra
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), Value::from(Serde(v))))
            .collect();
        let fixed = [
            ("messages", Value::from(Serde(messages))),
            (
                "add_generation_prompt",
                Value::from(options.add_generation_prompt),
            ),
            (
                "bos_token",
                Value::from(self.bos_token.clone().unwrap_or_default()),
            ),
            (
                "eos_token",
                Value::from(self.eos_token.clone().unwrap_or_default()),
            ),
            (
                "tools",
                Value::from(options.tools.map(|t| Value::from(Serde(t)))),
            ),
        ];
        for (name, value) in fixed {
            vars.insert(name.to_owned(), value);
        }
        template
            .render(Value::from(vars))
            .map_err(|e| render_error(&e))
    }
}

fn syntax_error(e: &Error) -> ChatTemplateError {
    ChatTemplateError::Syntax {
        line: e.line(),
        message: describe(e),
    }
}

fn render_error(e: &Error) -> ChatTemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(Raised(message)) = err.downcast_ref::<Raised>() {
            return ChatTemplateError::Raised(message.clone());
        }
        source = err.source();
    }
    if e.kind() == ErrorKind::SyntaxError {
        return syntax_error(e);
    }
    ChatTemplateError::Render {
        line: e.line(),
        message: describe(e),
    }
}

/// The error's kind and detail without minijinja's location suffix (the line is reported
/// separately).
fn describe(e: &Error) -> String {
    match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, "raise_exception").with_source(Raised(message)))
}

/// `strftime_now(format)`: the current UTC time formatted with C `strftime` directives.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime(&format, secs)))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats a Unix time (UTC) with the common `strftime` directives (`%Y %m %d %e %H %I %M %S
/// %p %y %b %B %h %a %A %j %u %w %F %T %D %R %%`); `%-d` style unpadded forms are accepted.
fn strftime(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday; 0 = Monday
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let unpadded = spec == Some('-');
        if unpadded {
            spec = chars.next();
        }
        let num = |out: &mut String, v: i64, width: usize| {
            if unpadded {
                let _ = write!(out, "{v}");
            } else {
                let _ = write!(out, "{v:0width$}");
            }
        };
        match spec {
            Some('Y') => num(&mut out, year, 4),
            Some('y') => num(&mut out, year.rem_euclid(100), 2),
            Some('m') => num(&mut out, month, 2),
            Some('d') => num(&mut out, day, 2),
            Some('e') => {
                let _ = write!(out, "{day:>2}");
            }
            Some('H') => num(&mut out, hour, 2),
            Some('I') => num(&mut out, hour12, 2),
            Some('M') => num(&mut out, minute, 2),
            Some('S') => num(&mut out, second, 2),
            Some('j') => num(&mut out, day_of_year, 3),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('u') => num(&mut out, weekday as i64 + 1, 1),
            Some('w') => num(&mut out, (weekday as i64 + 1) % 7, 1),
            Some('F') => {
                let _ = write!(out, "{year:04}-{month:02}-{day:02}");
            }
            Some('T') => {
                let _ = write!(out, "{hour:02}:{minute:02}:{second:02}");
            }
            Some('R') => {
                let _ = write!(out, "{hour:02}:{minute:02}");
            }
            Some('D') => {
                let _ = write!(out, "{month:02}/{day:02}/{:02}", year.rem_euclid(100));
            }
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `tojson` as transformers defines it: `json.dumps(value, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`. Python's default separators are `", "` and
/// `": "` (`","` between items when indenting), which templates' outputs depend on;
/// minijinja's own `tojson` writes compact JSON and HTML-escapes, so it is replaced.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(
                v.as_i64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::InvalidOperation,
                            "tojson: indent must be a number or a string",
                        )
                    })?,
            ),
        }),
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let mut parts = v.try_iter()?;
            let item = parts.next().and_then(|p| p.as_str().map(str::to_string));
            let key = parts.next().and_then(|p| p.as_str().map(str::to_string));
            match (item, key) {
                (Some(i), Some(k)) => (i, k),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ));
                }
            }
        }
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let writer = JsonWriter {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    writer.write(&mut out, &value, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonWriter {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonWriter {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        if depth > 512 {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: value nested too deeply",
            ));
        }
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(out, value),
            ValueKind::String => write_string(out, value.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    match key.as_str() {
                        Some(s) => write_string(out, s),
                        None => write_string(out, &key.to_string()),
                    }
                    out.push_str(&self.key_sep);
                    self.write(out, &value.get_item(key)?, depth + 1)?;
                }
                self.newline(out, depth);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write(out, item, depth + 1)?;
                }
                self.newline(out, depth);
                out.push(']');
            }
            _ => write_string(out, &value.to_string()),
        }
        Ok(())
    }
}

/// Numbers as Python's `json.dumps` writes them (`1`, `1.0`, `0.5`, `1e+20`).
fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let Ok(f) = f64::try_from(value.clone()) else {
        let _ = write!(out, "{value}");
        return;
    };
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f.fract() == 0.0 && f.abs() < 1e16 {
        let _ = write!(out, "{f:.1}");
    } else if f.abs() >= 1e16 || f.abs() < 1e-4 {
        // Python's repr: shortest digits, exponent with sign and at least two digits.
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((mantissa, exp)) => {
                let (sign, digits) = match exp.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', exp),
                };
                let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
            }
            None => out.push_str(&s),
        }
    } else {
        let _ = write!(out, "{f}");
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-26 13:25:09 UTC, a Friday.
        let t = 1_722_000_309;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-07-26 13:25:09");
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime("%A, %B %-d, %y %I%p %j %%", t),
            "Friday, July 26, 24 01PM 208 %"
        );
        assert_eq!(strftime("%a %F %T", 0), "Thu 1970-01-01 00:00:00");
        assert_eq!(strftime("%d %b %Y", 951_782_400), "29 Feb 2000");
    }

    #[test]
    fn json_numbers_match_python() {
        let render = |v: Value| {
            let mut s = String::new();
            write_number(&mut s, &v);
            s
        };
        assert_eq!(render(Value::from(3)), "3");
        assert_eq!(render(Value::from(1.0)), "1.0");
        assert_eq!(render(Value::from(0.5)), "0.5");
        assert_eq!(render(Value::from(1e20)), "1e+20");
        assert_eq!(render(Value::from(1.5e-7)), "1.5e-07");
    }
}
