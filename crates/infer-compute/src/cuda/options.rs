//! The CUDA backend's choices of layouts, kernels and fusions, as data: one
//! [`CudaOptions`] per backend ([`super::CudaBackend::with_options`]), so
//! that one process can run the fused and the unfused paths side by side
//! (the conformance suite does). The `INFER_CUDA_*` environment variables
//! fill it for [`super::CudaBackend::new`] ([`CudaOptions::from_env`]).

/// Input precision of the prefill GEMMs (f32 accumulation in both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPrecision {
    /// f32 operands, TF32 tensor-core products (10-bit mantissas).
    Tf32,
    /// bf16 operands (8-bit mantissas, f32's range): half the bytes and
    /// twice the tensor-core rate of TF32.
    Bf16,
}

impl GemmPrecision {
    /// Bytes of one operand value.
    pub(crate) fn bytes(self) -> usize {
        match self {
            GemmPrecision::Tf32 => 4,
            GemmPrecision::Bf16 => 2,
        }
    }
}

/// What a CUDA backend runs. [`Default`] is the tuned path (every fusion
/// on where the shape allows it); each field names its environment
/// variable and what turning it off runs instead, to compare and to test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Q4_0/Q5_0/Q8_0/Q4_K/Q6_K rows repacked into aligned planes at
    /// `prepare` (`repack.rs`); off keeps GGUF's blocks. `INFER_CUDA_REPACK=0`.
    pub repack: bool,
    /// Steps of one token per sequence replay captured CUDA graphs
    /// (`model.rs`, `GraphKey`); off: launched from the host.
    /// `INFER_CUDA_GRAPHS=0`.
    pub graphs: bool,
    /// Programmatic dependent launches on compute capability 9.0 and later
    /// (`device.rs`); off launches plainly. `INFER_CUDA_PDL=0`.
    pub pdl: bool,
    /// One-token products ask L2 for their weight rows before waiting for
    /// the previous kernel (`mv_prefetch`). `INFER_CUDA_PREFETCH=0`.
    pub prefetch: bool,
    /// The residual add + norm before the q/k/v product inside its blocks
    /// (`mvn_*`); off runs `residual_norm` first. `INFER_CUDA_FUSE_NORM=0`.
    pub fuse_norm: bool,
    /// A layer's q/k/v of two weight types in one launch (`mvn2_*`); off:
    /// two launches. `INFER_CUDA_MIXED_QKV=0`.
    pub mixed_qkv: bool,
    /// The GLU output quantized for ffn_down by the gate/up product
    /// (`mv_*_t1q`); off: by a kernel of its own. `INFER_CUDA_GLU_Q8=0`.
    pub glu_q8: bool,
    /// One-token attention as one kernel (`attn_decode_hd*`, head_dim 64,
    /// 128, 256; over two TurboQuant caches `attn_decode_tq`); off: the
    /// split-K kernels. `INFER_CUDA_ATTN_DECODE=0`.
    pub attn_decode: bool,
    /// That kernel with a softmax per thread (`attn_decode_flat_hd*`,
    /// kv heads of at most 4 query heads): the cache streamed through
    /// registers, no barrier per position, against the spans staged in
    /// shared memory (`attn_decode_hd*`). `None`: for heads of 64 values,
    /// flat where the staged kernel's blocks would each stream two or more
    /// 32-position spans (deep in the cache, or many sequences at once),
    /// where it was faster (H100, llama 1B: tg128 at depth 16 384 +9%, 64
    /// sequences +4.6%), and staged where each block takes one span (one
    /// sequence at depth 0: flat −2%); heads of 128 and 256 values staged
    /// (not yet measured); `Some(true)`: flat wherever the shape allows;
    /// `Some(false)`: never. `INFER_CUDA_ATTN_FLAT=1|0`.
    pub attn_flat: Option<bool>,
    /// Blocks per kv head of that kernel (`Some(n)`, 1 or more); `None`:
    /// about 1024 threads per multiprocessor over the launch. Up to that many
    /// 32-position spans each has a block; deeper, each block streams
    /// several with the online softmax. `INFER_CUDA_ATTN_BLOCKS=N`.
    pub attn_decode_blocks: Option<usize>,
    /// Without the one-launch kernel: the q/k/v post-processing inside the
    /// split-K attention (`Some(true)`), as its own kernel (`Some(false)`),
    /// or inside it for 2 or more KV heads (`None`). `INFER_CUDA_FUSE_QKV=1|0`.
    pub fuse_qkv: Option<bool>,
    /// Prefill attention as the tiled tensor-core kernel
    /// (`attention_prefill.cu`) from `FLASH_MIN_TOKENS` tokens; off: the
    /// split-K kernels. `INFER_CUDA_FLASH=0`.
    pub flash: bool,
    /// Projections of `gemm_min_tokens` or more tokens as cuBLAS GEMMs of
    /// this precision; `None`: the mat-vec kernels only.
    /// `INFER_CUDA_PREFILL_GEMM=tf32|0` (default bf16).
    pub prefill_gemm: Option<GemmPrecision>,
    /// Fewest tokens whose projections run as cuBLAS GEMMs over
    /// dequantized matrices (65: from there the `mmq_*` kernels, which
    /// read the quantized matrix once per 64 tokens, lose to them).
    /// `INFER_CUDA_GEMM_MIN`.
    pub gemm_min_tokens: usize,
    /// Quantized projections of at least this many tokens, and fewer than
    /// `gemm_min_tokens`, on the tensor cores straight from the quantized
    /// blocks (`mmq_*`, matmul_quant.cu); `None`: the mat-vec kernels up to
    /// the GEMMs. Default 24: on an H200 (llama 1B Q4_K_M) the 4-rows-per-
    /// warp mat-vec kernels win at 16 tokens (7.7k vs 6.5k tokens/s), these
    /// from 24 (9.2k). `INFER_CUDA_MMQ=N` (2 or more; `0`: `None`).
    pub mmq_min_tokens: Option<usize>,
    /// Those products over at most `MMQ_TOK / 2` (32) tokens in the
    /// narrow tile (`mmq_*_n`: 256 rows × 32 tokens, two weight chunks per
    /// thread per K-step) instead of the 128 × 64 one, whose warps of the
    /// second 32 tokens have nothing to multiply there: on an H100 (llama
    /// 1B Q4_K_M, S_TG of `infer bench --npl`) +5% at 24 and 32 sequences.
    /// `INFER_CUDA_MMQ_NARROW=0` turns it off.
    pub mmq_narrow: bool,
    /// Quantized products of at least this many tokens with 4 weight rows
    /// per warp (`mv_*_tr`, each activation chunk loaded once for the
    /// warp's rows; gate/up pairs from `mv_rows_glu_min_tokens`); fewer
    /// tokens run one row per warp (`mv_*_t8`) but in products of 32 768+ rows
    /// (the vocabulary), which run 4 rows per warp from 2 tokens; `None`:
    /// one row per warp everywhere. Default 2: on an H100 (synthetic Q4_K_M,
    /// S_TG of `infer bench --npl`) 4 rows per warp from 2 tokens against
    /// from 12 gave gemma3 4B +4% at 2 sequences, +12% at 4, +24% at 8, and
    /// llama 1B +0–3%, +7%, +15%; equal from 12 on.
    /// `INFER_CUDA_MV_ROWS=N` (2 or more; `0`: `None`).
    pub mv_rows_min_tokens: Option<usize>,
    /// Gate/up pairs (GLU products) of at least this many tokens in the
    /// 4-rows-per-warp kernels too (two pairs per warp); fewer: one pair
    /// per warp (`mv_*_t8`), which already loads each activation chunk
    /// once for two rows; `None`: never. Default 16: on an H100 (synthetic
    /// Q4_K_M, `infer bench --npl`) two pairs per warp were 3–9% slower at
    /// 2 and 4 sequences (a quarter of the warps hide fewer loads), within
    /// a few percent either way at 8 and 12, and 2–3% faster at 16 and 23
    /// on gemma3 4B.
    /// `INFER_CUDA_MV_ROWS_GLU=N` (2 or more; `0`: `None`).
    pub mv_rows_glu_min_tokens: Option<usize>,
    /// Warps per row of one-token products of long rows, and per row
    /// group of the `mv_*_tr` products: 1, 2 or 4, or `None` for the most
    /// that keeps the launch resident. `INFER_CUDA_MV_WPR`.
    pub mv_warps_per_row: Option<usize>,
    /// Rows of at least this many values count as long (4096).
    /// `INFER_CUDA_MV_LONG`.
    pub mv_long_row: usize,
    /// Extra NVRTC options for every module (e.g. `-DMV_T1S_MIN_BLOCKS=8`,
    /// another register budget without a rebuild); part of the compile
    /// cache's key. `INFER_CUDA_NVRTC_OPTS`.
    pub nvrtc_opts: Vec<String>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            repack: true,
            graphs: true,
            pdl: true,
            prefetch: true,
            fuse_norm: true,
            mixed_qkv: true,
            glu_q8: true,
            attn_decode: true,
            attn_flat: None,
            attn_decode_blocks: None,
            fuse_qkv: None,
            flash: true,
            prefill_gemm: Some(GemmPrecision::Bf16),
            gemm_min_tokens: 65,
            mmq_min_tokens: Some(24),
            mmq_narrow: true,
            mv_rows_min_tokens: Some(2),
            mv_rows_glu_min_tokens: Some(16),
            mv_warps_per_row: None,
            mv_long_row: 4096,
            nvrtc_opts: Vec::new(),
        }
    }
}

impl CudaOptions {
    /// Every fusion and alternative layout off: GGUF rows, plain launches,
    /// separate norm, post-processing, quantize and attention kernels, the
    /// mat-vec kernels for prefill. The reference path the conformance
    /// suite runs beside the default.
    pub fn unfused() -> Self {
        CudaOptions {
            repack: false,
            graphs: false,
            pdl: false,
            prefetch: false,
            fuse_norm: false,
            mixed_qkv: false,
            glu_q8: false,
            attn_decode: false,
            attn_flat: Some(false),
            fuse_qkv: Some(false),
            flash: false,
            prefill_gemm: None,
            mmq_min_tokens: None,
            mv_rows_min_tokens: None,
            mv_rows_glu_min_tokens: None,
            mv_warps_per_row: Some(1),
            ..Default::default()
        }
    }

    /// The defaults, with each `INFER_CUDA_*` variable that is set applied
    /// (`0` turns a switch off; any other value leaves it on; values that do
    /// not parse leave the default).
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`CudaOptions::from_env`] over any source of variables.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let d = CudaOptions::default();
        let on = |k: &str, default: bool| var(k).map_or(default, |v| v != "0");
        CudaOptions {
            repack: on("INFER_CUDA_REPACK", d.repack),
            graphs: on("INFER_CUDA_GRAPHS", d.graphs),
            pdl: on("INFER_CUDA_PDL", d.pdl),
            prefetch: on("INFER_CUDA_PREFETCH", d.prefetch),
            fuse_norm: on("INFER_CUDA_FUSE_NORM", d.fuse_norm),
            mixed_qkv: on("INFER_CUDA_MIXED_QKV", d.mixed_qkv),
            glu_q8: on("INFER_CUDA_GLU_Q8", d.glu_q8),
            attn_decode: on("INFER_CUDA_ATTN_DECODE", d.attn_decode),
            attn_flat: match var("INFER_CUDA_ATTN_FLAT").as_deref() {
                Some("0") => Some(false),
                Some(_) => Some(true),
                None => d.attn_flat,
            },
            attn_decode_blocks: var("INFER_CUDA_ATTN_BLOCKS")
                .and_then(|v| v.parse().ok())
                .filter(|&n| n >= 1)
                .or(d.attn_decode_blocks),
            fuse_qkv: match var("INFER_CUDA_FUSE_QKV").as_deref() {
                Some("0") => Some(false),
                Some("1") => Some(true),
                _ => d.fuse_qkv,
            },
            flash: on("INFER_CUDA_FLASH", d.flash),
            prefill_gemm: match var("INFER_CUDA_PREFILL_GEMM").as_deref() {
                Some("0") => None,
                Some("tf32") => Some(GemmPrecision::Tf32),
                _ => d.prefill_gemm,
            },
            gemm_min_tokens: var("INFER_CUDA_GEMM_MIN")
                .and_then(|v| v.parse().ok())
                .filter(|&n| n >= 2)
                .unwrap_or(d.gemm_min_tokens),
            mmq_min_tokens: match var("INFER_CUDA_MMQ").map(|v| v.parse::<usize>()) {
                Some(Ok(0)) => None,
                Some(Ok(n)) if n >= 2 => Some(n),
                _ => d.mmq_min_tokens,
            },
            mmq_narrow: on("INFER_CUDA_MMQ_NARROW", d.mmq_narrow),
            mv_rows_min_tokens: match var("INFER_CUDA_MV_ROWS").map(|v| v.parse::<usize>()) {
                Some(Ok(0)) => None,
                Some(Ok(n)) if n >= 2 => Some(n),
                _ => d.mv_rows_min_tokens,
            },
            mv_rows_glu_min_tokens: match var("INFER_CUDA_MV_ROWS_GLU").map(|v| v.parse::<usize>()) {
                Some(Ok(0)) => None,
                Some(Ok(n)) if n >= 2 => Some(n),
                _ => d.mv_rows_glu_min_tokens,
            },
            mv_warps_per_row: var("INFER_CUDA_MV_WPR")
                .and_then(|v| v.parse().ok())
                .filter(|w| matches!(w, 1 | 2 | 4))
                .or(d.mv_warps_per_row),
            mv_long_row: var("INFER_CUDA_MV_LONG").and_then(|v| v.parse().ok()).unwrap_or(d.mv_long_row),
            nvrtc_opts: var("INFER_CUDA_NVRTC_OPTS")
                .map(|v| v.split_whitespace().map(String::from).collect())
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_fill_the_options() {
        assert_eq!(CudaOptions::from_vars(|_| None), CudaOptions::default());
        let vars = [
            ("INFER_CUDA_REPACK", "0"),
            ("INFER_CUDA_FUSE_QKV", "1"),
            ("INFER_CUDA_PREFILL_GEMM", "tf32"),
            ("INFER_CUDA_MV_WPR", "3"),
            ("INFER_CUDA_MV_LONG", "2048"),
            ("INFER_CUDA_NVRTC_OPTS", " -DA=1  -DB=2 "),
            ("INFER_CUDA_PDL", "1"),
            ("INFER_CUDA_MV_ROWS", "0"),
            ("INFER_CUDA_GEMM_MIN", "1"),
            ("INFER_CUDA_MMQ", "8"),
            ("INFER_CUDA_MV_ROWS_GLU", "0"),
            ("INFER_CUDA_ATTN_BLOCKS", "3"),
            ("INFER_CUDA_MMQ_NARROW", "0"),
            ("INFER_CUDA_ATTN_FLAT", "0"),
        ];
        let o = CudaOptions::from_vars(|k| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string()));
        assert!(!o.repack && o.pdl && o.flash);
        assert_eq!(o.fuse_qkv, Some(true));
        assert_eq!(o.prefill_gemm, Some(GemmPrecision::Tf32));
        assert_eq!(o.mv_warps_per_row, None, "3 warps per row is not a choice");
        assert_eq!(o.mv_long_row, 2048);
        assert_eq!(o.mv_rows_min_tokens, None);
        assert_eq!(o.mv_rows_glu_min_tokens, None);
        assert_eq!(o.gemm_min_tokens, 65, "a GEMM of one token is not a choice");
        assert_eq!(o.mmq_min_tokens, Some(8));
        assert_eq!(o.attn_decode_blocks, Some(3));
        assert!(!o.mmq_narrow);
        assert_eq!(o.attn_flat, Some(false));
        let zero = CudaOptions::from_vars(|k| (k == "INFER_CUDA_ATTN_BLOCKS").then(|| "0".into()));
        assert_eq!(zero.attn_decode_blocks, None, "no blocks is not a choice");
        let no_mmq = CudaOptions::from_vars(|k| (k == "INFER_CUDA_MMQ").then(|| "0".into()));
        assert_eq!(no_mmq.mmq_min_tokens, None);
        assert_eq!(o.nvrtc_opts, ["-DA=1", "-DB=2"]);
        let off = CudaOptions::from_vars(|k| (k == "INFER_CUDA_PREFILL_GEMM").then(|| "0".into()));
        assert_eq!(off.prefill_gemm, None);
    }

    #[test]
    fn unfused_turns_every_switch_off() {
        let u = CudaOptions::unfused();
        assert!(
            !(u.repack
                || u.graphs
                || u.pdl
                || u.prefetch
                || u.fuse_norm
                || u.mixed_qkv
                || u.glu_q8
                || u.attn_decode
                || u.attn_flat != Some(false)
                || u.flash
                || u.mv_rows_min_tokens.is_some()
                || u.mv_rows_glu_min_tokens.is_some()
                || u.mmq_min_tokens.is_some())
        );
        assert_eq!((u.fuse_qkv, u.prefill_gemm, u.mv_warps_per_row), (Some(false), None, Some(1)));
    }
}
