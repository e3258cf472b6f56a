//! One CUDA device as the backend uses it: the context, one stream (all
//! work is ordered on it, so no cross-stream events are needed and event
//! tracking is switched off), cuBLAS, and the kernel module compiled from
//! the embedded sources by NVRTC once per process and architecture.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::kernels::{self, names, DevPtr, KernelName};
use crate::error::{Error, Result};
use crate::GgmlType;

/// Maps any displayable CUDA error to [`Error::Device`] with context.
pub(crate) fn dev_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Device(format!("{what}: {e}"))
}

/// What the device says about itself.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_mem: usize,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
}

/// PTX per compute capability, compiled once per process.
fn ptx_for(cc: (i32, i32)) -> Result<Arc<String>> {
    static CACHE: OnceLock<Mutex<HashMap<(i32, i32), Arc<String>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache.lock().map_err(|_| Error::Device("PTX cache lock poisoned".into()))?;
    if let Some(p) = map.get(&cc) {
        return Ok(p.clone());
    }
    let src: String = kernels::SOURCES.iter().map(|(_, s)| format!("{s}\n")).collect();
    // A virtual architecture: the driver compiles the PTX for the exact
    // device when the module is loaded.
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1), "--std=c++17".into()],
        name: Some("infer_compute.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            Error::Device(format!("NVRTC failed to compile the kernels:\n{}", log.to_string_lossy()))
        }
        other => Error::Device(format!("NVRTC: {other}")),
    })?;
    let p = Arc::new(ptx.to_src());
    map.insert(cc, p.clone());
    Ok(p)
}

/// A CUDA device with its stream, cuBLAS handle and kernels.
pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    funcs: HashMap<&'static str, CudaFunction>,
    pub info: DeviceInfo,
}

impl Device {
    /// Opens device `ordinal`. Assumes the driver library is present (the
    /// caller checks, and catches the loader's panics).
    pub fn open(ordinal: usize) -> Result<Self> {
        let count = CudaContext::device_count().map_err(dev_err("cuInit / device count"))?;
        if count <= 0 {
            return Err(Error::Device("the CUDA driver reports no device".into()));
        }
        if ordinal >= count as usize {
            return Err(Error::Device(format!("no CUDA device {ordinal}: the driver reports {count}")));
        }
        let ctx = CudaContext::new(ordinal).map_err(dev_err("creating the CUDA context"))?;
        // SAFETY: every buffer of this backend is used on its one stream
        // only, so cudarc's cross-stream events are not needed (and would
        // get in the way of graph capture). Set before any allocation.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(dev_err("creating a stream"))?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(dev_err("device name"))?,
            total_mem: ctx.total_mem().map_err(dev_err("device memory"))?,
            compute_capability: ctx.compute_capability().map_err(dev_err("compute capability"))?,
            multiprocessors: ctx
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(dev_err("multiprocessor count"))?,
        };
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::Device("cuBLAS (libcublas) not found".into()));
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| Error::Device(format!("cuBLAS: {e:?}")))?;
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::Device("NVRTC (libnvrtc) not found".into()));
        }
        let ptx = ptx_for(info.compute_capability)?;
        let module = ctx.load_module(Ptx::from_src(ptx.as_str())).map_err(dev_err("loading the kernel module"))?;
        let mut funcs = HashMap::new();
        let mv = GgmlType::ALL.iter().filter_map(|&t| kernels::matvec_kernels(t)).flat_map(|k| [k.t1, k.t8]);
        for KernelName(name) in names::ALL.into_iter().chain(mv) {
            let f = module.load_function(name).map_err(|e| Error::Device(format!("kernel {name}: {e}")))?;
            funcs.insert(name, f);
        }
        Ok(Device { ctx, stream, blas, funcs, info })
    }

    /// The loaded kernel `k`.
    pub fn func(&self, k: KernelName) -> Result<&CudaFunction> {
        self.funcs.get(k.0).ok_or_else(|| Error::Device(format!("kernel {} is not loaded", k.0)))
    }

    /// The device address of `s` (event tracking is off, so the guard
    /// cudarc returns has nothing to do).
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> DevPtr {
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    /// Launches kernel `k` with one by-value argument struct.
    pub fn launch<A: DeviceRepr>(&self, k: KernelName, grid: (u32, u32, u32), block: u32, smem: u32, args: &A) -> Result<()> {
        let f = self.func(k)?;
        let cfg = LaunchConfig { grid_dim: grid, block_dim: (block, 1, 1), shared_mem_bytes: smem };
        let mut b = self.stream.launch_builder(f);
        b.arg(args);
        // SAFETY: `A` mirrors the kernel's parameter struct (layout asserted
        // in kernels.rs and common.cuh); every pointer in it was taken from
        // a live allocation of this device sized by the caller for the grid.
        unsafe { b.launch(cfg) }.map_err(|e| Error::Device(format!("launching {}: {e}", k.0)))?;
        Ok(())
    }

    /// Allocates `n` zeroed values.
    pub fn zeros<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros::<T>(n.max(1)).map_err(dev_err("device allocation"))
    }

    /// An uninitialized-free allocation of `n` values for types without a
    /// zero bit pattern guarantee (only used for empty uploads).
    fn zeros_raw<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: the buffer is a placeholder for an empty upload and is
        // never read.
        unsafe { self.stream.alloc::<T>(n) }.map_err(dev_err("device allocation"))
    }

    /// Copies host data to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        if data.is_empty() {
            return self.zeros_raw(1);
        }
        self.stream.clone_htod(data).map_err(dev_err("host to device copy"))
    }

    /// Copies host data into an existing device buffer (from its start).
    pub fn write<T: DeviceRepr>(&self, dst: &mut CudaSlice<T>, data: &[T]) -> Result<()> {
        if data.len() > dst.len() {
            return Err(Error::Device(format!("write of {} values into a buffer of {}", data.len(), dst.len())));
        }
        let mut view = dst.slice_mut(0..data.len());
        self.stream.memcpy_htod(data, &mut view).map_err(dev_err("host to device copy"))
    }

    /// The one checked device-to-host read: copies `out.len()` values of
    /// `src` from `offset`, waits for the stream, and reports any error
    /// recorded by the context (including faults of earlier kernels).
    pub fn read_back<T: DeviceRepr>(&self, src: &CudaSlice<T>, offset: usize, out: &mut [T]) -> Result<()> {
        let end = offset.checked_add(out.len()).filter(|&e| e <= src.len()).ok_or_else(|| {
            Error::Device(format!("read of {}+{} values from a buffer of {}", offset, out.len(), src.len()))
        })?;
        if out.is_empty() {
            return self.sync();
        }
        let view = src.slice(offset..end);
        self.stream.memcpy_dtoh(&view, out).map_err(dev_err("device to host copy"))?;
        self.sync()
    }

    /// Waits for the stream and surfaces errors recorded asynchronously.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(dev_err("stream synchronize"))?;
        self.ctx.check_err().map_err(dev_err("deferred CUDA error"))
    }
}
