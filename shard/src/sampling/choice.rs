//! A byte-level recognizer of one string out of a list (vLLM's `guided_choice`).

use super::byte_language::ByteLanguage;

/// Most choices: the live ones are a bit set in the state.
pub const MAX_CHOICES: usize = 64;

/// The strings the output must be one of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choices(Vec<Vec<u8>>);

impl Choices {
    /// `choices`, or why they cannot be: 1 to [`MAX_CHOICES`] of them, none empty.
    pub fn new(choices: &[String]) -> Result<Self, String> {
        if choices.is_empty() || choices.len() > MAX_CHOICES {
            return Err(format!(
                "between 1 and {MAX_CHOICES} choices are needed, {} given",
                choices.len()
            ));
        }
        if choices.iter().any(String::is_empty) {
            return Err("a choice cannot be empty".into());
        }
        Ok(Self(
            choices.iter().map(|c| c.as_bytes().to_vec()).collect(),
        ))
    }
}

impl ByteLanguage for Choices {
    type State = ChoiceState;

    /// Before the first byte.
    fn start(&self) -> ChoiceState {
        ChoiceState {
            seen: 0,
            live: if self.0.len() == MAX_CHOICES {
                u64::MAX
            } else {
                (1 << self.0.len()) - 1
            },
        }
    }

    /// The state after byte `b`, or `None` if no choice continues with it.
    fn advance(&self, s: ChoiceState, b: u8) -> Option<ChoiceState> {
        let at = usize::from(s.seen);
        let live = self
            .0
            .iter()
            .enumerate()
            .filter(|&(i, c)| s.live & (1 << i) != 0 && c.get(at) == Some(&b))
            .fold(0u64, |m, (i, _)| m | (1 << i));
        (live != 0).then_some(ChoiceState {
            seen: s.seen + 1,
            live,
        })
    }

    /// Whether the bytes so far are one of the choices.
    fn is_complete(&self, s: ChoiceState) -> bool {
        self.0
            .iter()
            .enumerate()
            .any(|(i, c)| s.live & (1 << i) != 0 && c.len() == usize::from(s.seen))
    }
}

/// How many bytes are seen, and which choices they are still a prefix of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ChoiceState {
    seen: u16,
    live: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choices(list: &[&str]) -> Choices {
        Choices::new(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn feed(c: &Choices, text: &str) -> Option<ChoiceState> {
        text.bytes().try_fold(c.start(), |s, b| c.advance(s, b))
    }

    #[test]
    fn prefixes_and_whole_choices() {
        let c = choices(&["yes", "yes!", "no"]);
        assert!(!c.is_complete(c.start()));
        assert!(feed(&c, "ye").is_some_and(|s| !c.is_complete(s)));
        assert!(feed(&c, "yes").is_some_and(|s| c.is_complete(s)));
        assert!(feed(&c, "yes!").is_some_and(|s| c.is_complete(s)));
        assert!(feed(&c, "no").is_some_and(|s| c.is_complete(s)));
        assert!(
            feed(&c, "yes!!").is_none() && feed(&c, "n o").is_none() && feed(&c, "x").is_none()
        );
        let many: Vec<String> = (0..MAX_CHOICES).map(|i| format!("c{i}")).collect();
        let c = Choices::new(&many).unwrap();
        assert!(feed(&c, "c63").is_some_and(|s| c.is_complete(s)));
    }

    #[test]
    fn refuses_bad_lists() {
        assert!(Choices::new(&[]).is_err());
        assert!(Choices::new(&["a".into(), String::new()]).is_err());
        let many: Vec<String> = (0..=MAX_CHOICES).map(|i| i.to_string()).collect();
        assert!(Choices::new(&many).is_err());
    }
}
