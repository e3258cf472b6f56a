//! The kernel module's image: the embedded sources compiled by NVRTC for
//! the device's exact architecture (a CUBIN, so the driver has nothing to
//! JIT), once per machine. The image is kept in the cache directory
//! (`cuda/sm_XY-<key>.cubin` under [`crate::cache_dir::cache_dir`]) under
//! a key of everything that makes it (sources, options, NVRTC version,
//! architecture), so a later process starts its CUDA backend in about
//! 0.6 s where the first spent 34 s compiling (H200 host, 2026-12-02). Where a CUBIN cannot be made or loaded, PTX for the
//! virtual architecture is the fallback (the driver JIT-compiles it, and
//! keeps its own cache).

use std::collections::HashMap;
use std::ffi::CString;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::nvrtc::{result as nvrtc, sys, Ptx};

use super::kernels;
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

/// The whole program: the sources concatenated in [`kernels::SOURCES`]'s
/// order (NVRTC gets no include path: the header comes first).
fn program() -> String {
    kernels::SOURCES.iter().map(|(_, s)| format!("{s}\n")).collect()
}

/// NVRTC options for `arch` (`sm_90` for a CUBIN, `compute_90` for PTX):
/// C++17 and whatever `INFER_CUDA_NVRTC_OPTS` adds (tuning, e.g.
/// `-DMV_T1S_MIN_BLOCKS=8` in matvec.cu without a rebuild).
fn options(arch: &str) -> Vec<String> {
    [format!("--gpu-architecture={arch}"), "--std=c++17".into()]
        .into_iter()
        .chain(std::env::var("INFER_CUDA_NVRTC_OPTS").unwrap_or_default().split_whitespace().map(String::from))
        .collect()
}

/// The CUBIN for compute capability `cc` from the disk cache, or compiled
/// (and stored there, written to a temporary name then renamed, so that a
/// concurrent process never reads half a file); once per process. [`ptx`]
/// is the fallback when this fails.
pub(crate) fn cubin(cc: (i32, i32)) -> Result<Image> {
    static CACHE: OnceLock<Mutex<HashMap<(i32, i32), Image>>> = OnceLock::new();
    let mut map = CACHE
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .map_err(|_| Error::Device("kernel image cache lock poisoned".into()))?;
    if let Some(img) = map.get(&cc) {
        return Ok(img.clone());
    }
    let arch = format!("sm_{}{}", cc.0, cc.1);
    let src = program();
    let opts = options(&arch);
    let path = cache_path(&arch, &src, &opts);
    let bytes = match path.as_deref().and_then(|p| std::fs::read(p).ok()).filter(|b| !b.is_empty()) {
        Some(b) => b,
        None => {
            let t0 = Instant::now();
            match &path {
                Some(p) => eprintln!("compiling the CUDA kernels for {arch} (once; cached in {})", p.display()),
                None => eprintln!("compiling the CUDA kernels for {arch}"),
            }
            let b = compile(&src, &opts, true)?;
            eprintln!("compiled the CUDA kernels in {:.1} s", t0.elapsed().as_secs_f64());
            if let Some(p) = &path {
                // A cache that cannot be written only costs the next
                // process a compile.
                let _ = store(p, &b);
            }
            b
        }
    };
    let img = Image::Cubin(Arc::new(bytes));
    map.insert(cc, img.clone());
    Ok(img)
}

/// PTX for the virtual architecture of `cc` (the driver JIT-compiles it
/// at load): the fallback when a CUBIN cannot be made or loaded.
pub(crate) fn ptx(cc: (i32, i32)) -> Result<Image> {
    let opts = options(&format!("compute_{}{}", cc.0, cc.1));
    let b = compile(&program(), &opts, false)?;
    let s = String::from_utf8(b).map_err(|_| Error::Device("NVRTC returned PTX that is not UTF-8".into()))?;
    Ok(Image::Ptx(Arc::new(s)))
}

/// Removes the cached CUBIN of `cc` (it failed to load: stale or
/// damaged), so the next process compiles afresh.
pub(crate) fn forget_cubin(cc: (i32, i32)) {
    let arch = format!("sm_{}{}", cc.0, cc.1);
    if let Some(p) = cache_path(&arch, &program(), &options(&arch)) {
        let _ = std::fs::remove_file(p);
    }
}

/// `<cache>/cuda/<arch>-<key>.cubin`, the key a hash of the sources, the
/// options and the NVRTC version (None when NVRTC cannot say its version:
/// then nothing is cached).
fn cache_path(arch: &str, src: &str, opts: &[String]) -> Option<PathBuf> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return None;
    }
    let mut h = std::hash::DefaultHasher::new();
    (src, opts, major, minor).hash(&mut h);
    Some(crate::cache_dir::cache_dir().join("cuda").join(format!("{arch}-{:016x}.cubin", h.finish())))
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
