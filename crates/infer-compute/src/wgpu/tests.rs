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
    assert!(modules.len() >= 2 * (shaders::KERNELS.len() + 2 * (shaders::WEIGHT_TYPES.len() - 1)));
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
    use crate::{Error, GgmlType};
    assert!(matches!(
        shaders::compose(shaders::Kernel::Matvec, Some(GgmlType::Q8_K), false),
        Err(Error::Unsupported { ty: GgmlType::Q8_K, .. })
    ));
    assert!(matches!(shaders::compose(shaders::Kernel::Matvec, None, true), Err(Error::Unsupported { .. })));
}
