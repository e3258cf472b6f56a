// KV cache of f32 values: one `KvPair` holds values 2i and 2i + 1 of a
// row (head_dim is even).
alias KvPair = vec2<f32>;

fn kv_unpack(w: KvPair) -> vec2<f32> {
    return w;
}

fn kv_pack(v: vec2<f32>) -> KvPair {
    return v;
}
