// TurboQuant KV caches (tq3, tq4) on the device: one buffer per layer and
// role (K or V) of 32-bit words, laid out as turboquant::TqLayout says (the
// same buffer as the wgpu backend's): a header (the fields below, the
// Lloyd–Max centroids and boundaries, per channel the factor applied before
// the rotation), then the codes, the exact rows, the centres, the ring of
// recent rows and its tags. The type codes KV_TQ3 and KV_TQ4 are the bits
// per index.
//
// A query at position pos of a pass whose span (one slot's consecutive
// positions) starts at p0 reads row j of its slot:
//   j >= p0 and j < n_exact or pos - j < window: the pass's own row (f32,
//                              rounded to f16 as it is read: the values its
//                              exact row or ring entry gets);
//   j < n_exact:               the exact row (f16; the slot's first rows);
//   pos - j < window, j < p0:  the ring's entry j % window if its tag says
//                              it holds j, else the code;
//   otherwise:                 the code, n * c[idx], plus the slot's centre.
// The same choice per (query, row) as the CPU's (cpu::tq_window). Values
// are in the rotated basis: the head times the factors of word TQ_F_MUL
// (random signs times the keys' or values' channel scale), then H/sqrt(hd).

#define KV_TQ3 3
#define KV_TQ4 4

// Header fields (word indices; turboquant::Field).
#define TQ_F_N_CTX 0
#define TQ_F_N_KV 1
#define TQ_F_HD 2
#define TQ_F_N_EXACT 3
#define TQ_F_WINDOW 4
#define TQ_F_HEAD_WORDS 5
#define TQ_F_ROW_WORDS 6
#define TQ_F_CODES 7
#define TQ_F_EXACT 8
#define TQ_F_CENTRE 9
#define TQ_F_RING 10
#define TQ_F_TAGS 11
#define TQ_F_CENTRE_INV 12
#define TQ_F_HAS_CENTRE 13
#define TQ_F_CENTRE_FROM 14
#define TQ_F_PASSES 15
// The 2^bits centroids (f32), then the 2^bits - 1 boundaries.
#define TQ_F_CENTROIDS 16
#define TQ_F_BOUNDS 32
// hd factors for the cached heads, then hd for the queries that meet keys.
#define TQ_F_MUL 48

// Largest head dimension of a TurboQuant cache on the device.
#define TQ_MAX_HD 1024

__device__ __forceinline__ bool kv_is_tq(int type) { return type == KV_TQ3 || type == KV_TQ4; }

__device__ __forceinline__ float tq_f(const u32* c, int w) { return __uint_as_float(c[w]); }

// Factor of value i of a head before the rotation (query: the inverse, of
// a query that meets these keys, or of attention's output over these
// values after it is rotated back).
__device__ __forceinline__ float tq_mul(const u32* c, int i, bool query) {
    return tq_f(c, TQ_F_MUL + (query ? (int)c[TQ_F_HD] : 0) + i);
}

// f32 rounded to f16 and back, saturating (the exact rows' values).
__device__ __forceinline__ float f16_round(float x) { return f16_to_f32(f32_to_f16_sat(x)); }

// Word i of the exact row r of a slot, head g (two f16 values, the even one
// low).
__device__ __forceinline__ const u32* tq_exact_row(const u32* c, int slot, int r) {
    const size_t half = (size_t)c[TQ_F_N_KV] * c[TQ_F_HD] / 2;
    return c + c[TQ_F_EXACT] + ((size_t)slot * c[TQ_F_N_EXACT] + r) * half;
}

// The slot's centre (f32, kv_dim values), or null when the cache has none.
__device__ __forceinline__ const float* tq_centre_row(const u32* c, int slot) {
    if (!c[TQ_F_HAS_CENTRE]) return nullptr;
    return (const float*)(c + c[TQ_F_CENTRE]) + (size_t)slot * c[TQ_F_N_KV] * c[TQ_F_HD];
}

// One slot of a TurboQuant cache as attention reads it: the header's
// fields in registers, the slot's areas, the codebook staged in shared
// memory (tq_view).
struct TqView {
    const u32* codes;    // the slot's codes: row j, head g at j * row_words + g * head_words
    const u32* exact;    // the slot's exact rows, kv_dim / 2 words each
    const u32* ring;     // the ring's entries, kv_dim / 2 words each
    const u32* tags;     // the slot's tags
    const float* centre; // the slot's centre, or null
    const float* cent;   // the 2^bits centroids
    int bits, kv_dim, w, n_exact, row_words, head_words, slot;
};

// The view of slot `slot` of cache c coded in `bits`; cent: 16 floats of
// shared memory that the block fills here (a barrier must follow before
// reads).
__device__ __forceinline__ TqView tq_view(const u32* c, int bits, int slot, float* cent) {
    TqView v;
    const int kv_dim = c[TQ_F_N_KV] * c[TQ_F_HD], w = c[TQ_F_WINDOW], n_exact = c[TQ_F_N_EXACT];
    v.bits = bits;
    v.kv_dim = kv_dim;
    v.w = w;
    v.n_exact = n_exact;
    v.row_words = c[TQ_F_ROW_WORDS];
    v.head_words = c[TQ_F_HEAD_WORDS];
    v.slot = slot;
    v.codes = c + c[TQ_F_CODES] + (size_t)slot * c[TQ_F_N_CTX] * v.row_words;
    v.exact = c + c[TQ_F_EXACT] + (size_t)slot * n_exact * (kv_dim / 2);
    v.ring = c + c[TQ_F_RING] + (size_t)slot * w * (kv_dim / 2);
    v.tags = c + c[TQ_F_TAGS] + (size_t)slot * w;
    v.centre = tq_centre_row(c, slot);
    for (int i = threadIdx.x; i < (1 << bits); i += blockDim.x) cent[i] = tq_f(c, TQ_F_CENTROIDS + i);
    v.cent = cent;
    return v;
}

// A position's code words as a lane reads them: its eight indices (from
// bit 0) and the scale's word.
struct TqRaw {
    u64 b;
    u32 scale;
};

// Whether row j is read from its code by every query at pos (below the
// ring's window and past the exact rows), without looking at the ring.
__device__ __forceinline__ bool tq_coded(const TqView& v, int j, int pos) { return j >= v.n_exact && pos - j >= v.w; }

// The code words of values d0 .. d0 + 7 of head g of row j: bits d0 * bits
// .. + 8 * bits of the stream after the scale's word (at most two words).
__device__ __forceinline__ TqRaw tq_fetch(const TqView& v, int j, int g, int d0) {
    const u32* code = v.codes + (size_t)j * v.row_words + (size_t)g * v.head_words;
    const int bit = d0 * v.bits, sh = bit % 32;
    const u32* wp = code + 1 + bit / 32;
    u64 b = wp[0];
    if (sh + 8 * v.bits > 32) b |= (u64)wp[1] << 32;
    return TqRaw{b >> sh, code[0]};
}

// The centroids and scale of a fetched code (tq_load8's coded case).
__device__ __forceinline__ void tq_unpack(const TqView& v, TqRaw r, float* x, float* n) {
    const u32 m = (1u << v.bits) - 1u;
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = v.cent[(r.b >> (e * v.bits)) & m];
    *n = f16_to_f32((u16)(r.scale & 0xFFFFu));
}

// Values col .. col + 7 (col = g * hd + d0, d0 a multiple of 8) of row j
// of a slot, as the query at pos of a pass starting at p0 reads it (see
// the top); rows: the pass's rows of this cache, [n_tok][kv_dim] f32.
// For a coded row, x gets c[idx] and *n the code's scale, neither n nor
// the centre applied (the caller adds n * (q . c[idx]) + q . centre), and
// the result is true; an exact, ring or pass row is read as it is (false).
__device__ __forceinline__ bool tq_load8(const TqView& v, int j, int pos, int p0, const float* rows, int g, int hd,
                                         int d0, float* x, float* n) {
    const int col = g * hd + d0;
    const bool exact = j < v.n_exact, recent = pos - j < v.w;
    if (j >= p0 && (exact || recent)) {
        // The pass's own row, as its exact row or ring entry holds it: f16
        // (rounded here, as a one-token step's encoder leaves it unrounded).
        const float* r = rows + (size_t)(j - p0) * v.kv_dim + col;
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = f16_round(r[e]);
        return false;
    }
    const u32* h16 = nullptr;
    if (exact) {
        h16 = v.exact + (size_t)j * (v.kv_dim / 2) + col / 2;
    } else if (recent) {
        const int e = j % v.w;
        if (v.tags[e] == (u32)j + 1) h16 = v.ring + (size_t)e * (v.kv_dim / 2) + col / 2;
    }
    if (h16) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const u32 u = h16[e];
            x[2 * e] = f16_to_f32((u16)(u & 0xFFFFu));
            x[2 * e + 1] = f16_to_f32((u16)(u >> 16));
        }
        return false;
    }
    tq_unpack(v, tq_fetch(v, j, g, d0), x, n);
    return true;
}
