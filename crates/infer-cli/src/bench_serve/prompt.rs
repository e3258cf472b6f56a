//! The prompts: pseudo-random common English words, a sequence of its
//! own for every request.

use rand::{Rng, SeedableRng};

/// Common English words, most one token in the usual vocabularies.
#[rustfmt::skip]
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "that", "with", "as", "on", "by", "at", "from", "his", "it",
    "an", "were", "are", "which", "this", "be", "or", "has", "had", "first", "one", "their", "its", "new", "after",
    "but", "who", "not", "they", "have", "her", "she", "two", "been", "other", "when", "there", "all", "during",
    "into", "school", "time", "may", "years", "more", "most", "only", "over", "city", "some", "world", "would",
    "where", "later", "up", "such", "used", "many", "can", "state", "about", "national", "out", "known", "university",
    "united", "then", "made", "high", "film", "three", "under", "year", "part", "second", "team", "between", "him",
    "both", "through", "war", "being", "music", "than", "also", "each", "season", "early", "book", "house", "game",
    "river", "song", "group", "family", "life", "north", "south", "water", "long", "work", "name", "place", "day",
    "small", "large", "old", "great", "good", "light", "road", "line", "number", "people", "way", "back", "end",
    "home", "area", "power", "history", "land", "form", "market", "field", "story", "night", "party", "church",
];

/// The prompt of request `r` of client `c` in level `level`: `words` words,
/// a sequence of its own.
pub fn prompt_text(seed: u64, level: u64, c: u64, r: u64, words: usize) -> String {
    let key = seed
        ^ level.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ c.wrapping_mul(0xbf58_476d_1ce4_e5b9)
        ^ r.wrapping_mul(0x94d0_49bb_1331_11eb);
    let mut rng = rand::rngs::StdRng::seed_from_u64(key);
    let mut s = String::with_capacity(words * 7);
    for i in 0..words {
        let w = WORDS[rng.gen_range(0..WORDS.len())];
        if i > 0 {
            s.push(' ');
        }
        if i == 0 {
            let mut ch = w.chars();
            if let Some(f) = ch.next() {
                s.extend(f.to_uppercase());
                s.push_str(ch.as_str());
            }
        } else {
            s.push_str(w);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_deterministic_and_distinct() {
        let a = prompt_text(1, 0, 0, 0, 50);
        assert_eq!(a, prompt_text(1, 0, 0, 0, 50));
        assert_eq!(a.split(' ').count(), 50);
        assert!(a.starts_with(|c: char| c.is_uppercase()));
        assert_ne!(a, prompt_text(1, 0, 0, 1, 50));
        assert_ne!(a, prompt_text(1, 0, 1, 0, 50));
        assert_ne!(a, prompt_text(1, 1, 0, 0, 50));
        assert_ne!(a, prompt_text(2, 0, 0, 0, 50));
    }
}
