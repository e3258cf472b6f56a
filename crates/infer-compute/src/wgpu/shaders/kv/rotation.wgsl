// One head of the KV cache staged in workgroup memory, and its rotation.
// A kernel that writes the cache puts a k or v head's final values in
// `head_buf`, which the cache type's `*_store` reads (`kv/*_store.wgsl`);
// the rotation of a quantized cache (cpu::kv_rotation, the same for every
// backend) works on it in place: `hadamard` for keys, the queries that meet
// them and values when written, and for the attention output of rotated
// values, which it rotates back (H/√n is its own inverse).

// Largest head_dim of the kernels (`wgpu::model`'s MAX_HEAD_DIM).
const MAX_HD: u32 = 512u;

// The staged head: values 0..hd.
var<workgroup> head_buf: array<f32, MAX_HD>;

// head_buf[0..hd] ← (H/√n) x on each block of n values (hd a multiple of
// n, n a power of two; n = 0: nothing), in the order of the CPU's
// `hadamard`: butterflies of span 1, 2, 4, ..., n/2, then the scale
// `s = 1/√n` (computed by the host in f32, as the CPU computes it), which
// the last butterfly applies to the sums it writes, so every value is the
// same f32 as the CPU's. The whole workgroup calls it (uniform control
// flow) after a barrier that makes head_buf visible; it ends with one
// (when n > 1).
fn hadamard(n: u32, s: f32, hd: u32, lid: u32) {
    for (var span = 1u; span < n; span *= 2u) {
        for (var t = lid; t < hd / 2u; t += WG) {
            let j = (t / span) * 2u * span + t % span;
            let a = head_buf[j];
            let b = head_buf[j + span];
            if 2u * span == n {
                head_buf[j] = (a + b) * s;
                head_buf[j + span] = (a - b) * s;
            } else {
                head_buf[j] = a + b;
                head_buf[j + span] = a - b;
            }
        }
        workgroupBarrier();
    }
}
