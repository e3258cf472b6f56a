// KV cache of f16 values: one `KvPair` (a u32, low half first) holds
// values 2i and 2i + 1 of a row (head_dim is even). Values past f16's
// range are stored as ±65504, as the CPU and CUDA caches do, rather than
// as infinities.
alias KvPair = u32;

fn kv_unpack(w: KvPair) -> vec2<f32> {
    return unpack2x16float(w);
}

fn kv_pack(v: vec2<f32>) -> KvPair {
    return pack2x16float(clamp(v, vec2<f32>(-65504.0), vec2<f32>(65504.0)));
}
