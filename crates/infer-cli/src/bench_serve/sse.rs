//! Server-sent events, as the OpenAI streaming API sends them: the body is
//! lines; `data: …` lines make up an event, a blank line ends it; lines
//! starting with `:` are comments; other fields (`event:`, `id:`,
//! `retry:`) are ignored. Lines end in LF, CRLF or CR (the WHATWG
//! specification's three). The bytes arrive in arbitrary pieces: a line,
//! and a UTF-8 character, may be split across them.

/// Incremental SSE parser: [`Parser::push`] takes each piece of the body
/// and returns the events it completed, as the `data` of each (multiple
/// `data:` lines joined by `\n`).
#[derive(Default)]
pub struct Parser {
    /// Bytes of the line not yet ended.
    line: Vec<u8>,
    /// The event's data so far (`None`: no `data:` line yet).
    data: Option<String>,
    /// The last byte was a CR: an LF right after it ends no second line.
    after_cr: bool,
}

impl Parser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes of the body; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &b in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, false);
            match b {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(ev) = self.end_line(&line) {
                        events.push(ev);
                    }
                }
                _ => self.line.push(b),
            }
        }
        events
    }

    /// The end of the body: an event whose blank line never came is
    /// returned (servers that close right after the last `data:` line
    /// still count), as is an unended last line.
    pub fn finish(&mut self) -> Option<String> {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            if let Some(ev) = self.end_line(&line) {
                return Some(ev);
            }
        }
        self.data.take()
    }

    fn end_line(&mut self, line: &[u8]) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        if line[0] == b':' {
            return None;
        }
        let (field, value) = match line.iter().position(|&c| c == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &[][..]),
        };
        if field == b"data" {
            let value = String::from_utf8_lossy(value);
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(&value);
                }
                None => self.data = Some(value.into_owned()),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        ": a comment\r\n",
        "data: {\"choices\":[{\"text\":\"Hé\"}]}\r\n\r\n",
        "event: message\n",
        "data: {\"choices\":[{\"text\":\" llo\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n",
        "data: [DONE]\n\n",
    );

    fn expected() -> Vec<String> {
        vec![
            "{\"choices\":[{\"text\":\"Hé\"}]}".to_string(),
            "{\"choices\":[{\"text\":\" llo\"}]}".to_string(),
            "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}".to_string(),
            "[DONE]".to_string(),
        ]
    }

    #[test]
    fn whole_stream_at_once() {
        let mut p = Parser::new();
        assert_eq!(p.push(STREAM.as_bytes()), expected());
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let bytes = STREAM.as_bytes();
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let mut p = Parser::new();
                let mut evs = p.push(&bytes[..i]);
                evs.extend(p.push(&bytes[i..j]));
                evs.extend(p.push(&bytes[j..]));
                evs.extend(p.finish());
                assert_eq!(evs, expected(), "split at {i}, {j}");
            }
        }
    }

    #[test]
    fn byte_by_byte() {
        let mut p = Parser::new();
        let evs: Vec<String> = STREAM.as_bytes().iter().flat_map(|b| p.push(&[*b])).collect();
        assert_eq!(evs, expected());
    }

    #[test]
    fn multi_line_data_cr_endings_and_unended_last_event() {
        let mut p = Parser::new();
        let evs = p.push(b"data: a\rdata:b\r\rdata:  c\n");
        assert_eq!(evs, vec!["a\nb".to_string()]);
        // The stream closes before the blank line: the event still counts.
        assert_eq!(p.finish(), Some(" c".to_string()));
        let mut p = Parser::new();
        assert!(p.push(b"data: [DONE]").is_empty());
        assert_eq!(p.finish(), Some("[DONE]".to_string()));
        // A blank line with no data is no event.
        let mut p = Parser::new();
        assert!(p.push(b"\n\nid: 3\n\n").is_empty());
        assert_eq!(p.finish(), None);
    }
}
