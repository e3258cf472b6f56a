// The cache-type hooks of a cache read and written where its layout file
// puts a position's row (f32, f16, q8_0, q4_0): rows at word
// (slot · n_ctx + pos) · KV_row, read as stored whatever the query, no
// factor around the rotation. Composed per role after the type's layout;
// needs the kernel's uniform `p` (fields n_ctx, n_kv, hd and KV_row, the
// words of a row). The TurboQuant files (`kv/tq.wgsl`) define the same
// three functions.

// Head g of position pos of a slot, as token t of the pass writes it.
fn KV_at(slot: u32, pos: u32, t: u32, g: u32) -> vec2<u32> {
    return KV_head((slot * p.n_ctx + pos) * p.KV_row, g, p.hd, p.n_kv * p.hd);
}

// Head g of row j of a slot, as the query of token t at position pos
// reads it: as stored.
fn KV_read(slot: u32, j: u32, pos: u32, t: u32, g: u32) -> vec2<u32> {
    return KV_at(slot, j, t, g);
}

// The factor of value i of a head before its rotation into the cache's
// basis (query: of a query meeting these keys), and of the output after
// the rotation back: none.
fn KV_mul(i: u32, query: bool) -> f32 {
    return 1.0;
}
