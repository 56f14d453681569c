//! A byte-level recognizer of one JSON object (RFC 8259), for JSON mode.
//!
//! A pushdown automaton whose stack of open containers is a bit string, so that a whole state
//! is a small `Copy` value: the token mask branches from it once per vocabulary trie node.
//! Limits keep a constrained model from running away, and its output readable by common
//! parsers: at most [`MAX_DEPTH`] nested containers, [`MAX_BLANKS`] whitespace bytes in a row,
//! numbers of at most [`MAX_NUMBER`] bytes with two exponent digits, strings of valid UTF-8
//! with paired surrogate escapes.

/// Deepest nesting of objects and arrays.
pub(crate) const MAX_DEPTH: u8 = 64;

/// Most whitespace bytes in a row (enough for pretty-printing a few levels deep).
pub(crate) const MAX_BLANKS: u8 = 32;

/// Longest number, in bytes; exponents have at most two digits. Together they keep every
/// number a finite double, which is what parsers (serde_json, JavaScript) read it as.
pub(crate) const MAX_NUMBER: u8 = 32;

/// Where a JSON text is after the bytes fed so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct JsonState {
    mode: Mode,
    /// Bit `i`: open container `i` (from the outside) is an object (1) or an array (0).
    stack: u64,
    depth: u8,
    blanks: u8,
    /// UTF-8 continuation bytes still due inside a string, and the range of the next one
    /// (narrower after some leading bytes, against overlong forms and surrogates).
    utf8_due: u8,
    utf8_next: (u8, u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mode {
    /// Before the top-level object: `{` only.
    Start,
    /// A value must start.
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object.
    Key,
    /// After a key.
    Colon,
    /// After a value in a container: `,` or the container's end.
    CommaOrClose,
    /// Inside a string; `key` for an object's key.
    Str { key: bool, escape: Escape },
    /// Inside a number: its last part, and its length so far.
    Number(Number, u8),
    /// Inside `true`, `false` or `null`: which word, and how many of its bytes are seen.
    Word { word: u8, seen: u8 },
    /// The object is complete: blanks only.
    Done,
}

/// Escapes, with UTF-16 surrogates paired as serde_json (and most parsers) require.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Escape {
    None,
    /// After `\`; `low` when the low half of a surrogate pair must follow.
    Backslash {
        low: bool,
    },
    /// After `\u`.
    U {
        low: bool,
    },
    /// After `\uD` (or `\ud`).
    UD {
        low: bool,
    },
    /// Hex digits still due.
    Hex(u8),
    /// Hex digits still due of a high surrogate.
    High(u8),
    /// After a high surrogate: `\uDC00` to `\uDFFF` must follow.
    NeedLow,
}

/// The part of a number last seen; the complete ones (`Zero`, `Int`, `Frac`, `Exp`) may end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Number {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
    Exp2,
}

const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];

impl JsonState {
    /// Before the first byte of a JSON object.
    pub(crate) fn new() -> Self {
        Self {
            mode: Mode::Start,
            stack: 0,
            depth: 0,
            blanks: 0,
            utf8_due: 0,
            utf8_next: (0x80, 0xBF),
        }
    }

    /// Whether the bytes so far are a whole JSON object (plus blanks).
    pub(crate) fn is_complete(&self) -> bool {
        self.mode == Mode::Done
    }

    /// The state after `bytes`, or `None` if they cannot continue a JSON object.
    #[cfg(test)]
    fn feed(self, bytes: &[u8]) -> Option<Self> {
        bytes.iter().try_fold(self, |s, &b| s.advance(b))
    }

    /// The state after byte `b`, or `None` if no JSON object continues with it.
    pub(crate) fn advance(mut self, b: u8) -> Option<Self> {
        let blank = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        match self.mode {
            Mode::Str { key, escape } => return self.string(key, escape, b),
            Mode::Number(n, len) => match number(n, b) {
                Some(_) if len >= MAX_NUMBER => return None,
                Some(next) => {
                    self.mode = Mode::Number(next, len + 1);
                    return Some(self);
                }
                // A complete number ends at the first byte that is not part of it.
                None if matches!(
                    n,
                    Number::Zero | Number::Int | Number::Frac | Number::Exp | Number::Exp2
                ) =>
                {
                    self.end_value();
                }
                None => return None,
            },
            Mode::Word { word, seen } => {
                let w = WORDS[usize::from(word)];
                if w[usize::from(seen)] != b {
                    return None;
                }
                if usize::from(seen) + 1 == w.len() {
                    self.end_value();
                } else {
                    self.mode = Mode::Word {
                        word,
                        seen: seen + 1,
                    };
                }
                return Some(self);
            }
            _ => {}
        }
        if blank {
            self.blanks += 1;
            return (self.blanks <= MAX_BLANKS).then_some(self);
        }
        self.blanks = 0;
        match (self.mode, b) {
            (Mode::Start, b'{') => self.open(true),
            (Mode::ValueOrClose, b']') => self.close(false),
            (Mode::Value | Mode::ValueOrClose, _) => self.start_value(b),
            (Mode::KeyOrClose, b'}') => self.close(true),
            (Mode::KeyOrClose | Mode::Key, b'"') => {
                self.mode = Mode::Str {
                    key: true,
                    escape: Escape::None,
                };
                Some(self)
            }
            (Mode::Colon, b':') => {
                self.mode = Mode::Value;
                Some(self)
            }
            (Mode::CommaOrClose, b',') => {
                self.mode = if self.top_is_object() {
                    Mode::Key
                } else {
                    Mode::Value
                };
                Some(self)
            }
            (Mode::CommaOrClose, b'}' | b']') => self.close(b == b'}'),
            _ => None,
        }
    }

    fn start_value(mut self, b: u8) -> Option<Self> {
        self.mode = match b {
            b'{' => return self.open(true),
            b'[' => return self.open(false),
            b'"' => Mode::Str {
                key: false,
                escape: Escape::None,
            },
            b'-' => Mode::Number(Number::Minus, 1),
            b'0' => Mode::Number(Number::Zero, 1),
            b'1'..=b'9' => Mode::Number(Number::Int, 1),
            b't' | b'f' | b'n' => Mode::Word {
                word: match b {
                    b't' => 0,
                    b'f' => 1,
                    _ => 2,
                },
                seen: 1,
            },
            _ => return None,
        };
        Some(self)
    }

    fn string(mut self, key: bool, escape: Escape, b: u8) -> Option<Self> {
        let hex = |b: u8| char::from(b).to_digit(16);
        let escape = match escape {
            Escape::NeedLow if b == b'\\' => Escape::Backslash { low: true },
            Escape::NeedLow => return None,
            Escape::Backslash { low: true } if b == b'u' => Escape::U { low: true },
            Escape::Backslash { low: true } => return None,
            Escape::Backslash { low: false } => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Escape::None,
                b'u' => Escape::U { low: false },
                _ => return None,
            },
            Escape::U { low } if b == b'd' || b == b'D' => Escape::UD { low },
            Escape::U { low: false } if hex(b).is_some() => Escape::Hex(3),
            Escape::U { .. } => return None,
            Escape::UD { low } => match (hex(b)?, low) {
                (0x8..=0xB, false) => Escape::High(2),
                (0xC..=0xF, true) | (0x0..=0x7, false) => Escape::Hex(2),
                _ => return None,
            },
            Escape::Hex(due) | Escape::High(due) => {
                hex(b)?;
                match (escape, due) {
                    (Escape::High(_), 1) => Escape::NeedLow,
                    (Escape::High(_), _) => Escape::High(due - 1),
                    (_, 1) => Escape::None,
                    _ => Escape::Hex(due - 1),
                }
            }
            Escape::None if self.utf8_due > 0 => {
                let (lo, hi) = self.utf8_next;
                if !(lo..=hi).contains(&b) {
                    return None;
                }
                self.utf8_due -= 1;
                self.utf8_next = (0x80, 0xBF);
                Escape::None
            }
            Escape::None => {
                let (due, next) = match b {
                    b'"' => {
                        if key {
                            self.mode = Mode::Colon;
                        } else {
                            self.end_value();
                        }
                        return Some(self);
                    }
                    b'\\' => {
                        self.mode = Mode::Str {
                            key,
                            escape: Escape::Backslash { low: false },
                        };
                        return Some(self);
                    }
                    0x00..=0x1F => return None,
                    0x20..=0x7F => (0, (0x80, 0xBF)),
                    0xC2..=0xDF => (1, (0x80, 0xBF)),
                    0xE0 => (2, (0xA0, 0xBF)),
                    0xED => (2, (0x80, 0x9F)),
                    0xE1..=0xEF => (2, (0x80, 0xBF)),
                    0xF0 => (3, (0x90, 0xBF)),
                    0xF4 => (3, (0x80, 0x8F)),
                    0xF1..=0xF3 => (3, (0x80, 0xBF)),
                    _ => return None,
                };
                self.utf8_due = due;
                self.utf8_next = next;
                Escape::None
            }
        };
        self.mode = Mode::Str { key, escape };
        Some(self)
    }

    fn open(mut self, object: bool) -> Option<Self> {
        if self.depth >= MAX_DEPTH {
            return None;
        }
        if object {
            self.stack |= 1 << self.depth;
        } else {
            self.stack &= !(1 << self.depth);
        }
        self.depth += 1;
        self.mode = if object {
            Mode::KeyOrClose
        } else {
            Mode::ValueOrClose
        };
        Some(self)
    }

    fn close(mut self, object: bool) -> Option<Self> {
        if self.depth == 0 || self.top_is_object() != object {
            return None;
        }
        self.depth -= 1;
        self.end_value();
        Some(self)
    }

    fn top_is_object(&self) -> bool {
        self.depth > 0 && self.stack & (1 << (self.depth - 1)) != 0
    }

    fn end_value(&mut self) {
        self.mode = if self.depth == 0 {
            Mode::Done
        } else {
            Mode::CommaOrClose
        };
    }
}

fn number(n: Number, b: u8) -> Option<Number> {
    let digit = b.is_ascii_digit();
    let exp = b == b'e' || b == b'E';
    Some(match n {
        Number::Minus if b == b'0' => Number::Zero,
        Number::Minus if digit => Number::Int,
        Number::Zero | Number::Int | Number::Frac if exp => Number::E,
        Number::Zero | Number::Int if b == b'.' => Number::Dot,
        Number::Int if digit => Number::Int,
        Number::Dot | Number::Frac if digit => Number::Frac,
        Number::E if b == b'+' || b == b'-' => Number::ESign,
        Number::E | Number::ESign if digit => Number::Exp,
        Number::Exp if digit => Number::Exp2,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(text: &str) -> bool {
        JsonState::new()
            .feed(text.as_bytes())
            .is_some_and(|s| s.is_complete())
    }

    fn prefix(text: &str) -> bool {
        JsonState::new().feed(text.as_bytes()).is_some()
    }

    #[test]
    fn accepts_objects_serde_json_accepts() {
        for text in [
            "{}",
            " {\n}\n",
            r#"{"a": 1}"#,
            r#"{"a":-0.5e+10,"b":[true,false,null,[],{}],"c":"x\"\\\/\b\f\n\r\t\u00e9"}"#,
            r#"{"name": "Zoë", "日本": [0, 1E3, -12.25E-2, 7e9]}"#,
            "{\"deep\": [[[{\"x\": [1]}]]]}",
        ] {
            assert!(complete(text), "{text}");
            assert!(
                serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object()),
                "{text}"
            );
        }
    }

    #[test]
    fn rejects_what_is_not_an_object() {
        for text in [
            "[]",
            "1",
            "\"a\"",
            "{,}",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":-}"#,
            r#"{"a":1e}"#,
            r#"{"a":tru}"#,
            r#"{"a":nul1}"#,
            r#"{"a":"x\q"}"#,
            r#"{"a":"\u12g4"}"#,
            "{\"a\":\"line\nbreak\"}",
            r#"{"a":[1}"#,
            r#"{"a":{]}"#,
            r#"{1:2}"#,
            "{} x",
            "{}{}",
        ] {
            assert!(!complete(text), "{text}");
            assert!(
                serde_json::from_str::<serde_json::Value>(text).map_or(true, |v| !v.is_object()),
                "{text}"
            );
        }
    }

    #[test]
    fn prefixes_of_valid_objects_continue() {
        let text = r#"{"a": [1, -2.5e3, "x\u00e9y", {"b": null}], "c": true}"#;
        for end in 0..text.len() {
            assert!(prefix(&text[..end]), "{}", &text[..end]);
            assert!(!complete(&text[..end]), "{}", &text[..end]);
        }
        assert!(complete(text));
    }

    #[test]
    fn strings_hold_utf8_only() {
        let s = |bytes: &[u8]| {
            let mut all = b"{\"a\":\"".to_vec();
            all.extend_from_slice(bytes);
            all.extend_from_slice(b"\"}");
            JsonState::new().feed(&all).is_some_and(|s| s.is_complete())
        };
        assert!(s("é日🙂".as_bytes()));
        assert!(!s(&[0xC3]), "a truncated character");
        assert!(!s(&[0x80]), "a lone continuation byte");
        assert!(!s(&[0xFF]));
        assert!(!s(&[0xE6, 0x97, b'a']), "ASCII inside a character");
        assert!(!s(&[0xE0, 0x80, 0x80]), "overlong");
        assert!(!s(&[0xED, 0xA0, 0x80]), "a surrogate");
        assert!(!s(&[0xF4, 0x90, 0x80, 0x80]), "past U+10FFFF");
        assert!(s(&[0xED, 0x9F, 0xBF]) && s(&[0xF4, 0x8F, 0xBF, 0xBF]));
    }

    #[test]
    fn surrogate_escapes_come_in_pairs() {
        let s = |esc: &str| complete(&format!("{{\"a\":\"{esc}\"}}"));
        assert!(s(r"\ud83d\ude00") && s(r"\uD7FF") && s(r"\uE000") && s(r"\u00e9"));
        assert!(!s(r"\ud83d"), "a lone high surrogate");
        assert!(!s(r"\ude00"), "a lone low surrogate");
        assert!(!s(r"\ud83dx"));
        assert!(!s(r"\ud83d\u0041"), "a high surrogate, then no low one");
        for ok in [r"\ud83d\ude00", r"\uD7FF", r"\u00e9"] {
            let text = format!("{{\"a\":\"{ok}\"}}");
            assert!(
                serde_json::from_str::<serde_json::Value>(&text).is_ok(),
                "{text}"
            );
        }
    }

    #[test]
    fn numbers_stay_finite_doubles() {
        let n = |text: &str| complete(&format!("{{\"a\":{text}}}"));
        assert!(n("1e99") && n("-1.5E-07") && n(&"9".repeat(usize::from(MAX_NUMBER))));
        assert!(!n("1e100"), "three exponent digits");
        assert!(!n(&"9".repeat(usize::from(MAX_NUMBER) + 1)));
    }

    fn random_value(rng: &mut rand_chacha::ChaCha8Rng, depth: usize) -> serde_json::Value {
        use rand::Rng;
        use serde_json::{Value, json};
        const CHARS: &[char] = &[
            'a', 'Z', ' ', '"', '\\', '/', '\n', '\t', '\u{1}', 'é', '日', '🙂',
        ];
        let string = |rng: &mut rand_chacha::ChaCha8Rng| -> String {
            (0..rng.random_range(0..6))
                .map(|_| CHARS[rng.random_range(0..CHARS.len())])
                .collect()
        };
        match rng.random_range(0..if depth == 0 { 5 } else { 7 }) {
            0 => Value::Null,
            1 => json!(rng.random::<bool>()),
            2 => json!(rng.random_range(-1_000_000i64..1_000_000)),
            3 => json!(rng.random_range(-1e30f64..1e30) * 10f64.powi(rng.random_range(-60..0))),
            4 => json!(string(rng)),
            5 => Value::Array(
                (0..rng.random_range(0..4))
                    .map(|_| random_value(rng, depth - 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.random_range(0..4))
                    .map(|_| (string(rng), random_value(rng, depth - 1)))
                    .collect(),
            ),
        }
    }

    /// Against serde_json: every object it writes (compact or pretty) is accepted, with every
    /// prefix; every one-byte mutation that we call complete, it parses as an object.
    #[test]
    fn agrees_with_serde_json() {
        use rand::{Rng, SeedableRng};
        const INSERT: &[u8] = b"{}[]\":,0-.e \\u";
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        for _ in 0..2000 {
            let mut v = random_value(&mut rng, 4);
            if !v.is_object() {
                v = serde_json::json!({ "k": v });
            }
            for text in [
                serde_json::to_string(&v).unwrap(),
                serde_json::to_string_pretty(&v).unwrap(),
            ] {
                let bytes = text.as_bytes();
                let mut s = Some(JsonState::new());
                for (i, &b) in bytes.iter().enumerate() {
                    s = s.and_then(|s| s.advance(b));
                    assert!(s.is_some(), "rejected at byte {i}: {text}");
                }
                assert!(s.is_some_and(|s| s.is_complete()), "{text}");
                for _ in 0..20 {
                    let mut m = bytes.to_vec();
                    let at = rng.random_range(0..m.len());
                    match rng.random_range(0..3) {
                        0 => {
                            m.remove(at);
                        }
                        1 => m.insert(at, INSERT[rng.random_range(0..INSERT.len())]),
                        _ => m[at] = rng.random(),
                    }
                    if JsonState::new().feed(&m).is_some_and(|s| s.is_complete()) {
                        let parsed = serde_json::from_slice::<serde_json::Value>(&m);
                        assert!(
                            parsed.is_ok_and(|p| p.is_object()),
                            "accepted {:?}",
                            String::from_utf8_lossy(&m)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn limits_depth_and_blanks() {
        let deep = |n: usize| format!("{{\"a\":{}{}}}", "[".repeat(n), "]".repeat(n));
        assert!(complete(&deep(usize::from(MAX_DEPTH) - 1)));
        assert!(!prefix(&deep(usize::from(MAX_DEPTH))));
        let blanks = |n: usize| format!("{{{}}}", " ".repeat(n));
        assert!(complete(&blanks(usize::from(MAX_BLANKS))));
        assert!(!prefix(&blanks(usize::from(MAX_BLANKS) + 1)));
        // Blanks inside strings are text, not counted.
        let long = format!("{{\"a\":\"{}\"}}", " ".repeat(200));
        assert!(complete(&long));
    }
}
