//! An incremental server-sent-events parser: bytes in (split anywhere), events out.
//!
//! Follows the WHATWG rules that matter for OpenAI-style streams: lines end in `\n` or
//! `\r\n`; `data:` lines accumulate (joined by `\n`) until a blank line dispatches the event;
//! lines starting with `:` are comments (keep-alives); `event:` names the event; a single
//! space after the colon is dropped; other fields are ignored. An event still pending when
//! the body ends is dispatched by [`SseParser::finish`].

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined by `\n`.
    pub data: String,
}

/// A line that is not UTF-8 (the event it belonged to is dropped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server-sent event line is not UTF-8 ({len} bytes)")]
pub struct InvalidLine {
    /// The line's length in bytes.
    pub len: usize,
}

/// The parser's state between chunks of the body.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Option<String>,
    event: Option<String>,
    poisoned: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the events (or invalid lines) completed by them, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Result<SseEvent, InvalidLine>> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            let mut line_end = end;
            if line_end > start && self.buf[line_end - 1] == b'\r' {
                line_end -= 1;
            }
            let line = self.buf[start..line_end].to_vec();
            start = end + 1;
            if let Some(item) = self.line(&line) {
                out.push(item);
            }
        }
        self.buf.drain(..start);
        out
    }

    /// Ends the stream: dispatches a pending event (a last line without its newline
    /// included). Bodies that end mid-event still yield what they carried.
    pub fn finish(&mut self) -> Option<Result<SseEvent, InvalidLine>> {
        let mut out = None;
        if !self.buf.is_empty() {
            let mut line = std::mem::take(&mut self.buf);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            out = self.line(&line);
        }
        out.or_else(|| self.line(b""))
    }

    fn line(&mut self, line: &[u8]) -> Option<Result<SseEvent, InvalidLine>> {
        if line.is_empty() {
            let poisoned = std::mem::take(&mut self.poisoned);
            let event = self.event.take();
            let data = self.data.take()?;
            return (!poisoned).then_some(Ok(SseEvent { event, data }));
        }
        let Ok(line) = std::str::from_utf8(line) else {
            self.poisoned = true;
            return Some(Err(InvalidLine { len: line.len() }));
        };
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            "event" => self.event = Some(value.to_string()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(events: Vec<Result<SseEvent, InvalidLine>>) -> Vec<String> {
        events.into_iter().map(|e| e.unwrap().data).collect()
    }

    #[test]
    fn events_split_at_every_byte() {
        let body = b": keep-alive\n\ndata: {\"a\":1}\r\n\r\ndata:{\"b\":2}\n\nevent: x\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n";
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for b in body.iter() {
            out.extend(data(p.push(std::slice::from_ref(b))));
        }
        assert!(p.finish().is_none());
        assert_eq!(out, ["{\"a\":1}", "{\"b\":2}", "l1\nl2", "[DONE]"]);
    }

    #[test]
    fn event_name_and_unterminated_last_event() {
        let mut p = SseParser::new();
        let out = p.push(b"event: error\ndata: {}\n\ndata: tail");
        assert_eq!(
            out,
            vec![Ok(SseEvent {
                event: Some("error".into()),
                data: "{}".into()
            })]
        );
        assert_eq!(p.finish().unwrap().unwrap().data, "tail");
        assert!(p.finish().is_none());
    }

    #[test]
    fn invalid_utf8_reports_and_drops_the_event() {
        let mut p = SseParser::new();
        let out = p.push(b"data: \xff\xfe\n\ndata: ok\n\n");
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], Err(InvalidLine { len: 8 }));
        assert_eq!(out[1].as_ref().unwrap().data, "ok");
    }

    #[test]
    fn blank_lines_without_data_dispatch_nothing() {
        let mut p = SseParser::new();
        assert!(p.push(b"\n\n\r\nid: 3\n\n").is_empty());
    }
}
