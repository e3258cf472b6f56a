//! Per-pass helpers of the wgpu TurboQuant caches, whose buffer layout is
//! [`crate::turboquant::TqLayout`].

/// Per token of a pass of positions `pos` in slots `slot`, the index of
/// the first token of its span (the tokens before it of consecutive
/// positions of its slot), as `Batch::spans` cuts them.
pub(super) fn span_starts(pos: &[u32], slot: &[u32]) -> Vec<u32> {
    let mut v = Vec::with_capacity(pos.len());
    for i in 0..pos.len() {
        let cont = i > 0 && slot[i] == slot[i - 1] && pos[i - 1].checked_add(1) == Some(pos[i]);
        v.push(if cont { v[i - 1] } else { i as u32 });
    }
    v
}
