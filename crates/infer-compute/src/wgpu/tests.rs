//! The shaders as Metal and DirectX would see them, without any GPU: every
//! composed module ([`shaders::all_modules`]) is parsed and validated by
//! naga (wgpu's own shader compiler) and translated to MSL 2.4 and HLSL
//! shader model 6.0, so a shader Metal would reject fails here.

use naga::valid::{Capabilities, ShaderStages, SubgroupOperationSet, ValidationFlags, Validator};

use super::shaders;

fn validate(name: &str, src: &str, subgroups: bool) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
    // `unpack2x16float` (core WGSL) is a capability in naga; Metal, DX12
    // and Vulkan all have it, and wgpu enables it there.
    let base = Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    let caps = if subgroups { base | Capabilities::SUBGROUP } else { base };
    let mut v = Validator::new(ValidationFlags::all(), caps);
    if subgroups {
        v.subgroup_stages(ShaderStages::COMPUTE).subgroup_operations(SubgroupOperationSet::all());
    }
    let info = v.validate(&module).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
    (module, info)
}

#[test]
fn every_shader_validates_and_translates_to_msl_and_hlsl() {
    let modules = shaders::all_modules().expect("compose");
    let kv_pairs = shaders::KV_TYPES.len() * shaders::KV_TYPES.len();
    assert!(modules.len() >= 2 * (shaders::KERNELS.len() + 2 * (shaders::WEIGHT_TYPES.len() - 1) + 2 * (kv_pairs - 1)));
    for (name, kernel, src) in &modules {
        let subgroups = name.ends_with("_subgroup");
        let (module, info) = validate(name, src, subgroups);
        assert!(
            module.entry_points.iter().any(|e| e.name == kernel.entry()),
            "{name}: no entry point {}",
            kernel.entry()
        );

        let msl_opts = naga::back::msl::Options { lang_version: (2, 4), ..Default::default() };
        let (msl, _) = naga::back::msl::write_string(&module, &info, &msl_opts, &Default::default())
            .unwrap_or_else(|e| panic!("{name}: MSL: {e}"));
        assert!(msl.contains("kernel void"), "{name}: no MSL kernel");

        let hlsl_opts =
            naga::back::hlsl::Options { shader_model: naga::back::hlsl::ShaderModel::V6_0, ..Default::default() };
        let pipeline = Default::default();
        let mut hlsl = String::new();
        naga::back::hlsl::Writer::new(&mut hlsl, &hlsl_opts, &pipeline)
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{name}: HLSL: {e}"));
        assert!(hlsl.contains("[numthreads("), "{name}: no HLSL compute entry");
    }
}

#[test]
fn compose_refuses_types_without_kernels() {
    use crate::{Error, GgmlType, KvCacheType, KvTypes};
    use shaders::{compose, Kernel, Variant};
    assert!(matches!(
        compose(Kernel::Matvec, Variant::Weight(GgmlType::Q8_K), false),
        Err(Error::Unsupported { ty: GgmlType::Q8_K, .. })
    ));
    assert!(matches!(compose(Kernel::Matvec, Variant::Plain, true), Err(Error::Unsupported { .. })));
    let kv = Variant::Kv(KvTypes::both(KvCacheType::F16));
    assert!(matches!(compose(Kernel::Matvec, kv, true), Err(Error::Unsupported { .. })));
    assert!(matches!(compose(Kernel::Gemm, kv, true), Err(Error::Unsupported { .. })));
    // TurboQuant caches compose with the KV kernels; the kernels over one
    // such cache take only a TurboQuant type.
    for ty in [KvCacheType::Tq3, KvCacheType::Tq4] {
        let tq = Variant::Kv(KvTypes { k: KvCacheType::F16, v: ty });
        assert!(compose(Kernel::Attention, tq, true).is_ok());
        assert!(matches!(compose(Kernel::TqEncode, tq, true), Err(Error::Unsupported { .. })));
        assert!(compose(Kernel::TqEncode, Variant::Tq(ty), false).is_ok());
        assert!(matches!(compose(Kernel::Attention, Variant::Tq(ty), true), Err(Error::Unsupported { .. })));
    }
    assert!(matches!(
        compose(Kernel::TqKeep, Variant::Tq(KvCacheType::Q8_0), true),
        Err(Error::UnsupportedKvCache { ty: KvCacheType::Q8_0, .. })
    ));
}

/// A KV-typed module holds K's and V's files once each, renamed for their
/// role, and no `KV_` identifier is left; a kernel that only reads the
/// cache has no store.
#[test]
fn kv_files_are_composed_per_role() {
    use crate::{KvCacheType, KvTypes};
    use shaders::{compose, Kernel, Variant};
    let types = KvTypes { k: KvCacheType::Q8_0, v: KvCacheType::Q4_0 };
    let rope = compose(Kernel::Rope, Variant::Kv(types), false).unwrap();
    let attn = compose(Kernel::Attention, Variant::Kv(types), false).unwrap();
    for src in [&rope, &attn] {
        assert!(!src.contains("KV_"));
        assert_eq!(src.matches("fn k_load2(").count(), 1);
        assert_eq!(src.matches("fn v_load2(").count(), 1);
        assert!(src.contains("fn hadamard("));
    }
    assert_eq!(rope.matches("fn k_store(").count(), 1);
    assert_eq!(rope.matches("fn v_store(").count(), 1);
    assert!(!attn.contains("_store(") && !attn.contains("fn q4_code("));
    // TurboQuant: each role's index bits, and the kernels over one cache
    // under the role `c_`.
    let tq = KvTypes { k: KvCacheType::Tq3, v: KvCacheType::Tq4 };
    let attn = compose(Kernel::Attention, Variant::Kv(tq), false).unwrap();
    assert!(attn.contains("const k_BITS: u32 = 3u;") && attn.contains("const v_BITS: u32 = 4u;"));
    assert_eq!(attn.matches("fn k_read(").count(), 1);
    let enc = compose(Kernel::TqEncode, Variant::Tq(KvCacheType::Tq3), false).unwrap();
    assert!(!enc.contains("KV_") && enc.contains("const c_BITS: u32 = 3u;"));
}
