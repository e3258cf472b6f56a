//! Stop strings: ending generation at a piece of text, as llama.cpp's
//! `-r/--reverse-prompt` and the OpenAI API's `stop` do.
//!
//! A stop string can arrive split across tokens (`"\nUs"` then `"er:"`), so
//! text cannot be shown as soon as it is decoded: [`StopMatcher`] holds
//! back the longest tail of the text that could still become the start of
//! a stop string, and releases it once it no longer can. When a stop
//! string is complete, the text before it is released and the stop string
//! itself (and anything after it) is not.
//!
//! ```
//! use infer_model::stop::StopMatcher;
//!
//! let mut m = StopMatcher::new(["User:"]);
//! let a = m.push("Hello.\nUs");
//! assert_eq!((a.text.as_str(), a.stopped), ("Hello.\n", false)); // "Us" is held back
//! let b = m.push("er: hi");
//! assert_eq!((b.text.as_str(), b.stopped), ("", true));
//! assert_eq!(m.matched(), Some("User:"));
//!
//! let mut m = StopMatcher::new(["User:"]);
//! assert_eq!(m.push("Use").text, "");
//! assert_eq!(m.push("ful").text, "Useful"); // no longer a stop string's start
//! assert_eq!(m.push(" U").text, " ");
//! assert_eq!(m.finish(), "U"); // the end of generation releases what was held
//! ```
//!
//! Matching is on bytes of valid UTF-8, and what is released always ends
//! on a character boundary, so multibyte characters are never split.

/// Matches stop strings in a stream of text pieces; see the module
/// documentation.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    /// The stop strings, in the order given (empty ones dropped).
    stops: Vec<String>,
    /// Text received but not yet released: a tail that could begin a stop
    /// string.
    held: String,
    /// Index into `stops` of the string that was hit.
    matched: Option<usize>,
}

/// What [`StopMatcher::push`] releases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to show now (never a part of a stop string).
    pub text: String,
    /// Whether a stop string was completed: generation should end; `text`
    /// is everything before the stop string that had not been released.
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored (a matcher with no
    /// stop strings releases every piece at once).
    pub fn new<I, S>(stops: I) -> StopMatcher
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stops = stops.into_iter().map(Into::into).filter(|s: &String| !s.is_empty()).collect();
        StopMatcher { stops, held: String::new(), matched: None }
    }

    /// The stop strings, in the order given (without empty ones).
    pub fn stop_strings(&self) -> &[String] {
        &self.stops
    }

    /// Feeds the next decoded piece. Returns the text that can be shown
    /// now and whether a stop string is complete. The earliest stop string
    /// in the text wins; of several starting at the same place, the first
    /// given. Once stopped, further pieces release nothing.
    pub fn push(&mut self, piece: &str) -> StopStep {
        if self.matched.is_some() {
            return StopStep { text: String::new(), stopped: true };
        }
        self.held.push_str(piece);
        if let Some((at, i)) = self.earliest_match() {
            self.matched = Some(i);
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return StopStep { text, stopped: true };
        }
        let keep_from = self.partial_start();
        let rest = self.held.split_off(keep_from);
        let text = std::mem::replace(&mut self.held, rest);
        StopStep { text, stopped: false }
    }

    /// Releases the text held back at the end of generation (it never
    /// became a stop string); empty after a stop.
    pub fn finish(&mut self) -> String {
        if self.matched.is_some() {
            self.held.clear();
        }
        std::mem::take(&mut self.held)
    }

    /// Whether a stop string was hit.
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that was hit.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Text received and not yet released.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Forgets the held text and the match, for a new generation with the
    /// same stop strings.
    pub fn reset(&mut self) {
        self.held.clear();
        self.matched = None;
    }

    /// Byte offset and index of the earliest complete stop string in the
    /// held text (the first given on a tie).
    fn earliest_match(&self) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in self.stops.iter().enumerate() {
            if let Some(at) = self.held.find(s.as_str()) {
                if best.is_none_or(|(b, _)| at < b) {
                    best = Some((at, i));
                }
            }
        }
        best
    }

    /// Where the longest tail of the held text that is a proper start of
    /// some stop string begins (the held text's length when there is none).
    /// A complete stop string is not in the text (checked before), so any
    /// tail that matches a stop string's start is shorter than it.
    fn partial_start(&self) -> usize {
        let bytes = self.held.as_bytes();
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.as_bytes().starts_with(&bytes[i..])))
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and returns (all text released, stopped, matched).
    fn feed(stops: &[&str], pieces: &[&str]) -> (String, bool, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for p in pieces {
            let s = m.push(p);
            out.push_str(&s.text);
            if s.stopped {
                return (out, true, m.matched().map(str::to_string));
            }
        }
        out.push_str(&m.finish());
        (out, false, None)
    }

    #[test]
    fn no_stop_strings_release_everything_at_once() {
        let mut m = StopMatcher::new(Vec::<String>::new());
        assert_eq!(m.push("abc"), StopStep { text: "abc".into(), stopped: false });
        assert_eq!(m.finish(), "");
        // Empty stop strings are dropped, not matched everywhere.
        let mut m = StopMatcher::new([""]);
        assert!(m.stop_strings().is_empty());
        assert_eq!(m.push("x").text, "x");
    }

    #[test]
    fn a_stop_string_in_one_piece_releases_the_text_before_it() {
        assert_eq!(feed(&["STOP"], &["one two STOP three"]), ("one two ".into(), true, Some("STOP".into())));
        assert_eq!(feed(&["STOP"], &["STOP"]), ("".into(), true, Some("STOP".into())));
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_never_shown_in_part() {
        let mut m = StopMatcher::new(["</s>"]);
        let steps: Vec<StopStep> = ["Hi", " <", "/", "s", ">", "after"].iter().map(|p| m.push(p)).collect();
        let texts: Vec<&str> = steps.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(texts, ["Hi", " ", "", "", "", ""]);
        assert_eq!(steps.iter().map(|s| s.stopped).collect::<Vec<_>>(), [false, false, false, false, true, true]);
        assert_eq!(m.finish(), "");
        // One character at a time.
        let chars: Vec<String> = "abc</s>def".chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(feed(&["</s>"], &pieces), ("abc".into(), true, Some("</s>".into())));
    }

    #[test]
    fn held_text_is_released_when_it_stops_matching_and_at_the_end() {
        let mut m = StopMatcher::new(["User:"]);
        assert_eq!(m.push("a U").text, "a ");
        assert_eq!(m.held(), "U");
        assert_eq!(m.push("se").text, "");
        assert_eq!(m.push("d").text, "Used");
        assert_eq!(m.push(" Use").text, " ");
        assert!(!m.is_stopped());
        assert_eq!(m.finish(), "Use");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        assert_eq!(feed(&["world", "lo"], &["hello world"]), ("hel".into(), true, Some("lo".into())));
        assert_eq!(feed(&["b", "a"], &["xab"]), ("x".into(), true, Some("a".into())));
        // The same start: the first given.
        assert_eq!(feed(&["ab", "abc"], &["xabc"]), ("x".into(), true, Some("ab".into())));
        assert_eq!(feed(&["abc", "ab"], &["xabc"]), ("x".into(), true, Some("abc".into())));
        // A later stop string completed in a later piece, an earlier one
        // still partial: held until decided.
        assert_eq!(feed(&["abcd", "bc"], &["a", "b", "c"]), ("a".into(), true, Some("bc".into())));
    }

    #[test]
    fn overlapping_prefixes_hold_the_longest_candidate() {
        // "aab": after "aa" both "a|a" and "aa" could start it.
        let mut m = StopMatcher::new(["aab"]);
        assert_eq!(m.push("xaa").text, "x");
        assert_eq!(m.push("a").text, "a"); // "aaa": only the last "aa" can still start it
        let s = m.push("b");
        assert_eq!((s.text.as_str(), s.stopped), ("", true));
        assert_eq!(feed(&["aab"], &["xaa", "a", "c"]), ("xaaac".into(), false, None));
        // A stop string that is a prefix of another.
        assert_eq!(feed(&["ab", "abab"], &["a", "b"]), ("".into(), true, Some("ab".into())));
        assert_eq!(feed(&["\n\n", "\nUser"], &["Hi\n", "Us", "er"]), ("Hi".into(), true, Some("\nUser".into())));
    }

    #[test]
    fn multibyte_characters_are_never_split() {
        // The stop string starts with the same first byte as 'é' (0xC3 0xA9)
        // but another second byte: 'à' (0xC3 0xA0).
        let mut m = StopMatcher::new(["àb"]);
        let s = m.push("café");
        assert_eq!(s.text, "café");
        assert_eq!(m.push("à").text, "");
        assert_eq!(m.push("x").text, "àx");
        assert_eq!(feed(&["日本"], &["こんにちは日", "本語"]), ("こんにちは".into(), true, Some("日本".into())));
        assert_eq!(feed(&["😀!"], &["a😀", "?"]), ("a😀?".into(), false, None));
        // Every release is valid UTF-8 ending on a boundary by construction
        // (`String`); check the pieces add up.
        let text = "ünïcödé ✓ stop here ✓";
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(feed(&["stop"], &pieces), ("ünïcödé ✓ ".into(), true, Some("stop".into())));
    }

    #[test]
    fn after_a_stop_nothing_more_is_released_until_reset() {
        let mut m = StopMatcher::new(["x"]);
        assert!(m.push("ax").stopped);
        assert_eq!(m.push("more"), StopStep { text: String::new(), stopped: true });
        assert_eq!(m.finish(), "");
        m.reset();
        assert!(!m.is_stopped());
        assert_eq!(m.push("ab").text, "ab");
    }
}
