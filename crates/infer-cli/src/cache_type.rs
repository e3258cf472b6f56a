//! `-ctk/--cache-type-k` and `-ctv/--cache-type-v`: the element types of
//! the KV cache, as llama.cpp names them (`llama_args` maps the
//! multi-letter short forms).

use clap::Args;
use infer_compute::{DeviceModel, KvCacheType, KvTypes};

/// The KV cache's element types.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct CacheTypeArgs {
    /// KV cache type of the keys: f32, f16, q8_0, q4_0, or TurboQuant tq4 or tq3 (also -ctk) [default: f16; f32 with --precision exact].
    #[arg(long = "cache-type-k", value_name = "TYPE", value_parser = parse_type)]
    pub cache_type_k: Option<KvCacheType>,
    /// KV cache type of the values: f32, f16, q8_0, q4_0, or TurboQuant tq4 or tq3 (also -ctv) [default: f16; f32 with --precision exact].
    #[arg(long = "cache-type-v", value_name = "TYPE", value_parser = parse_type)]
    pub cache_type_v: Option<KvCacheType>,
}

impl CacheTypeArgs {
    /// The chosen types; where none is given, `model`'s default (f16, f32
    /// in `--precision exact`).
    pub fn types_for(&self, model: &dyn DeviceModel) -> KvTypes {
        let d = model.default_kv_types();
        KvTypes { k: self.cache_type_k.unwrap_or(d.k), v: self.cache_type_v.unwrap_or(d.v) }
    }
}

fn parse_type(s: &str) -> Result<KvCacheType, String> {
    s.parse().map_err(|e: infer_compute::Error| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        c: CacheTypeArgs,
    }

    #[test]
    fn parses_llama_cpp_names() {
        let t = T::try_parse_from(["t", "--cache-type-k", "q8_0", "--cache-type-v", "Q4_0"]).unwrap();
        assert_eq!((t.c.cache_type_k, t.c.cache_type_v), (Some(KvCacheType::Q8_0), Some(KvCacheType::Q4_0)));
        let t = T::try_parse_from(["t"]).unwrap();
        assert_eq!((t.c.cache_type_k, t.c.cache_type_v), (None, None));
        let e = T::try_parse_from(["t", "--cache-type-k", "q4_k"]).err().unwrap().to_string();
        assert!(e.contains("unknown KV cache type 'q4_k'"), "{e}");
    }
}
