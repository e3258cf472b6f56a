//! The kernel modules' images: the embedded sources of each module
//! (`kernels::Module`: the common kernels, and the products of each
//! quantized layout) compiled by NVRTC for the device's exact
//! architecture (a CUBIN, so the driver has nothing to JIT), once per
//! machine. A process compiles only the modules its models use, several
//! at once on threads of their own. Each image is kept in the cache
//! directory (`cuda/sm_XY-<module>-<key>.cubin` under
//! [`crate::cache_dir::cache_dir`]) under a key of everything that makes
//! it (sources, options, NVRTC version, architecture), so a later process
//! starts its CUDA backend in about 0.6 s where the first spent 34 s
//! compiling everything (H200 host, 2026-12-02). Where a CUBIN cannot be
//! made or loaded, PTX for the virtual architecture is the fallback (the
//! driver JIT-compiles it, and keeps its own cache).

use std::collections::HashMap;
use std::ffi::CString;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::nvrtc::{result as nvrtc, sys, Ptx};

use super::kernels::Module;
use crate::error::{Error, Result};

/// A compiled module: a CUBIN for the exact architecture, or PTX.
#[derive(Clone)]
pub(crate) enum Image {
    Cubin(Arc<Vec<u8>>),
    Ptx(Arc<String>),
}

impl Image {
    /// The image in cudarc's form, for `CudaContext::load_module`.
    pub(crate) fn to_ptx(&self) -> Ptx {
        match self {
            Image::Cubin(b) => Ptx::from_binary(b.to_vec()),
            Image::Ptx(s) => Ptx::from_src(s.as_str()),
        }
    }
}

/// NVRTC options for `arch` (`sm_90` for a CUBIN, `compute_90` for PTX):
/// C++17 and `extra` (`CudaOptions::nvrtc_opts`: tuning, e.g.
/// `-DMV_T1S_MIN_BLOCKS=8` in matvec.cu without a rebuild).
fn options(arch: &str, extra: &[String]) -> Vec<String> {
    [format!("--gpu-architecture={arch}"), "--std=c++17".into()].into_iter().chain(extra.iter().cloned()).collect()
}

/// The CUBINs of `modules` for compute capability `cc` with the extra
/// NVRTC options `extra`, in that order:
/// from this process's memory, from the disk cache, or compiled (the
/// missing ones in parallel, with one progress line on stderr) and stored
/// there (written to a temporary name then renamed, so that a concurrent
/// process never reads half a file). [`ptx`] is the fallback when this
/// fails.
pub(crate) fn cubins(cc: (i32, i32), modules: &[Module], extra: &[String]) -> Result<Vec<Image>> {
    /// Images by (compute capability, module, extra options).
    type Images = HashMap<((i32, i32), Module, Vec<String>), Image>;
    static CACHE: OnceLock<Mutex<Images>> = OnceLock::new();
    let mut map = CACHE
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .map_err(|_| Error::Device("kernel image cache lock poisoned".into()))?;
    let arch = format!("sm_{}{}", cc.0, cc.1);
    let opts = options(&arch, extra);
    let key = |m: Module| (cc, m, extra.to_vec());
    let mut missing = Vec::new();
    for &m in modules {
        if map.contains_key(&key(m)) || missing.iter().any(|&(n, _, _)| n == m) {
            continue;
        }
        let src = m.source();
        let path = cache_path(&arch, m, &src, &opts);
        match path.as_deref().and_then(|p| std::fs::read(p).ok()).filter(|b| !b.is_empty()) {
            Some(b) => {
                map.insert(key(m), Image::Cubin(Arc::new(b)));
            }
            None => missing.push((m, src, path)),
        }
    }
    if !missing.is_empty() {
        let t0 = Instant::now();
        let labels: Vec<_> = missing.iter().map(|(m, _, _)| m.label()).collect();
        let dir = missing.iter().find_map(|(_, _, p)| p.as_deref().and_then(Path::parent));
        match dir {
            Some(d) => eprintln!(
                "compiling the CUDA kernels for {arch}: {} (once; cached in {})",
                labels.join(", "),
                d.display()
            ),
            None => eprintln!("compiling the CUDA kernels for {arch}: {}", labels.join(", ")),
        }
        let built: Vec<Result<Vec<u8>>> = std::thread::scope(|s| {
            let jobs: Vec<_> = missing.iter().map(|(_, src, _)| s.spawn(|| compile(src, &opts, true))).collect();
            jobs.into_iter()
                .map(|j| j.join().unwrap_or_else(|_| Err(Error::Device("NVRTC compile thread panicked".into()))))
                .collect()
        });
        for ((m, _, path), bytes) in missing.into_iter().zip(built) {
            let bytes = bytes?;
            if let Some(p) = &path {
                // A cache that cannot be written only costs the next
                // process a compile.
                let _ = store(p, &bytes);
            }
            map.insert(key(m), Image::Cubin(Arc::new(bytes)));
        }
        eprintln!("compiled the CUDA kernels in {:.1} s", t0.elapsed().as_secs_f64());
    }
    modules
        .iter()
        .map(|&m| map.get(&key(m)).cloned().ok_or_else(|| Error::Device("kernel image missing".into())))
        .collect()
}

/// PTX of `module` for the virtual architecture of `cc` (the driver
/// JIT-compiles it at load): the fallback when a CUBIN cannot be made or
/// loaded.
pub(crate) fn ptx(cc: (i32, i32), module: Module, extra: &[String]) -> Result<Image> {
    let opts = options(&format!("compute_{}{}", cc.0, cc.1), extra);
    let b = compile(&module.source(), &opts, false)?;
    let s = String::from_utf8(b).map_err(|_| Error::Device("NVRTC returned PTX that is not UTF-8".into()))?;
    Ok(Image::Ptx(Arc::new(s)))
}

/// Removes the cached CUBIN of `module` for `cc` (it failed to load:
/// stale or damaged), so the next process compiles afresh.
pub(crate) fn forget_cubin(cc: (i32, i32), module: Module, extra: &[String]) {
    let arch = format!("sm_{}{}", cc.0, cc.1);
    if let Some(p) = cache_path(&arch, module, &module.source(), &options(&arch, extra)) {
        let _ = std::fs::remove_file(p);
    }
}

/// `<cache>/cuda/<arch>-<module>-<key>.cubin`, the key a hash of the
/// sources, the options and the NVRTC version (None when NVRTC cannot say
/// its version: then nothing is cached).
fn cache_path(arch: &str, module: Module, src: &str, opts: &[String]) -> Option<PathBuf> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return None;
    }
    let mut h = std::hash::DefaultHasher::new();
    (src, opts, major, minor).hash(&mut h);
    Some(crate::cache_dir::cache_dir().join("cuda").join(format!(
        "{arch}-{}-{:016x}.cubin",
        module.label(),
        h.finish()
    )))
}

fn store(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().ok_or(std::io::ErrorKind::InvalidInput)?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.{}", std::process::id(), path.file_name().unwrap_or_default().to_string_lossy()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Compiles `src` with `opts`; returns the CUBIN (`cubin`) or the PTX
/// text's bytes.
fn compile(src: &str, opts: &[String], cubin: bool) -> Result<Vec<u8>> {
    let nv = |what: &'static str| move |e: nvrtc::NvrtcError| Error::Device(format!("NVRTC {what}: {e:?}"));
    let c_src = CString::new(src).map_err(|_| Error::Device("kernel source holds a NUL byte".into()))?;
    let prog = nvrtc::create_program(&c_src, Some(c"infer_compute.cu")).map_err(nv("creating the program"))?;
    // Destroys the program on every path out.
    struct Prog(sys::nvrtcProgram);
    impl Drop for Prog {
        fn drop(&mut self) {
            // SAFETY: the program was created above and is destroyed once.
            let _ = unsafe { nvrtc::destroy_program(self.0) };
        }
    }
    let prog = Prog(prog);
    // SAFETY: `prog.0` is a live program; the options are plain strings.
    if let Err(e) = unsafe { nvrtc::compile_program(prog.0, opts) } {
        // SAFETY: as above; the log is a NUL-terminated buffer.
        let log = unsafe { nvrtc::get_program_log(prog.0) }
            .map(|l| l.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect::<String>())
            .unwrap_or_default();
        return Err(Error::Device(format!("NVRTC failed to compile the kernels ({e:?}):\n{log}")));
    }
    if !cubin {
        // SAFETY: as above, after a successful compile.
        let ptx = unsafe { nvrtc::get_ptx(prog.0) }.map_err(nv("reading the PTX"))?;
        return Ok(ptx.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect());
    }
    let mut n = 0usize;
    // SAFETY: as above; `n` receives the size.
    let rc = unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut n) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS || n == 0 {
        return Err(Error::Device(format!("NVRTC gave no CUBIN ({rc:?})")));
    }
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` holds the `n` bytes NVRTC said the CUBIN has.
    let rc = unsafe { sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr().cast()) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Device(format!("NVRTC could not copy the CUBIN ({rc:?})")));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module compiles to a CUBIN for sm_90 (NVRTC needs no GPU, so
    /// a kernel source error shows on any machine with libnvrtc). Skipped,
    /// saying why, where libnvrtc cannot be loaded, unless
    /// `INFER_REQUIRE_CUDA=1`.
    #[test]
    fn every_module_compiles_for_sm_90() {
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            assert!(
                std::env::var("INFER_REQUIRE_CUDA").as_deref() != Ok("1"),
                "INFER_REQUIRE_CUDA=1 but libnvrtc cannot be loaded"
            );
            eprintln!("skipped: libnvrtc cannot be loaded (set LD_LIBRARY_PATH to a CUDA 13 NVRTC)");
            return;
        }
        let opts = &options("sm_90", &[]);
        let modules = std::iter::once(Module::Common)
            .chain((0..super::super::kernels::PRODUCTS.len()).map(|i| Module::Products(i as u8)));
        std::thread::scope(|s| {
            let compiles: Vec<_> = modules.map(|m| (m, s.spawn(move || compile(&m.source(), opts, true)))).collect();
            for (m, h) in compiles {
                let image = h.join().expect("compile thread").unwrap_or_else(|e| panic!("{m:?}: {e}"));
                assert!(!image.is_empty(), "{m:?}");
            }
        });
    }
}
