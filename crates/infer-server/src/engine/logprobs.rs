//! Log-probabilities of a row of logits for OpenAI's `logprobs`: the
//! log-softmax of the row, the sampled token's entry and the `n` most
//! likely tokens; from the whole row, or from its most likely tokens and
//! its statistics ([`TopKRow`]).

use infer_compute::backend::TopKRow;
use infer_model::tokenizer::Tokenizer;

use super::request::TokenLogprob;

/// The log-probability of `token` and the `top_n` most likely tokens under
/// the softmax of `logits` (most likely first, the lower id first on a
/// tie); texts from `tokenizer`.
pub fn token_logprob(tokenizer: &Tokenizer, logits: &[f32], token: u32, top_n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
    let log_z = max + sum.ln() as f32;
    let lp = |id: usize| logits.get(id).map_or(f32::NEG_INFINITY, |&x| x - log_z);
    let entry = |id: u32| {
        let bytes = tokenizer.token_bytes(id).unwrap_or_default().to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes, lp(id as usize))
    };
    let top = top_ids(logits, top_n).into_iter().map(entry).collect();
    let (text, bytes, logprob) = entry(token);
    TokenLogprob { token: text, bytes, logprob, top }
}

/// [`token_logprob`] from a row's most likely tokens (`row.ids`, at least
/// `top_n` of them, `token` among them) and its statistics: the normalizer
/// is `max + log_sum_exp`, so on the host reference's statistics the values
/// are [`token_logprob`]'s bits. A token not among the candidates gets
/// `-inf`.
pub fn candidates_logprob(tokenizer: &Tokenizer, row: &TopKRow<'_>, token: u32, top_n: usize) -> TokenLogprob {
    let log_z = row.stats.max + row.stats.log_sum_exp;
    let entry = |j: Option<usize>, id: u32| {
        let bytes = tokenizer.token_bytes(id).unwrap_or_default().to_vec();
        let lp = j.map_or(f32::NEG_INFINITY, |j| row.logits[j] - log_z);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes, lp)
    };
    let top = row.ids.iter().take(top_n).enumerate().map(|(j, &id)| entry(Some(j), id)).collect();
    let (text, bytes, logprob) = entry(row.ids.iter().position(|&id| id == token), token);
    TokenLogprob { token: text, bytes, logprob, top }
}

/// Ids of the `n` largest logits, largest first (lower id first on a tie).
fn top_ids(logits: &[f32], n: usize) -> Vec<u32> {
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(n + 1);
    for (id, &x) in logits.iter().enumerate() {
        if best.len() == n && best.last().is_none_or(|&(b, _)| !(x > b)) {
            continue;
        }
        let at = best.iter().position(|&(b, _)| x > b).unwrap_or(best.len());
        best.insert(at, (x, id as u32));
        best.truncate(n);
    }
    best.into_iter().map(|(_, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_ids_are_ordered_and_stable() {
        assert_eq!(top_ids(&[0.0, 3.0, 1.0, 3.0, -1.0], 3), [1, 3, 2]);
        assert_eq!(top_ids(&[0.0, 1.0], 5), [1, 0]);
        assert!(top_ids(&[0.0, 1.0], 0).is_empty());
    }
}
