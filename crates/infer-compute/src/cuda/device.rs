//! One CUDA device as the backend uses it: the context, one stream (all
//! work is ordered on it, so no cross-stream events are needed and event
//! tracking is switched off), cuBLAS, and the kernel modules compiled from
//! the embedded sources by NVRTC (`compile.rs`: once per machine and
//! architecture, cached on disk): the common one when the device opens,
//! each quantized layout's products when a model first needs them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchArgs,
    LaunchConfig, ValidAsZeroBits,
};

use super::compile;
use super::kernels::{self, DevPtr, KernelName, Module, PRODUCTS};
use super::options::CudaOptions;
use crate::error::{Error, Result};

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
    /// Threads one multiprocessor holds at once (2048 on sm_80 and sm_90,
    /// 1536 on sm_86 and sm_89).
    pub max_threads_per_multiprocessor: i32,
}

/// Serializes, across the process, graph captures with the driver and
/// library calls that may synchronize the whole device (cuBLAS handle
/// creation and destruction, page-locked host allocation and release): such
/// a call on one thread while another thread captures a stream invalidates
/// that capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`). Captures are rare
/// (once per KV cache), so the lock costs nothing in steady decoding.
pub(crate) fn device_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// Whether this thread is capturing a graph under [`device_lock`] (see
    /// [`CaptureGuard`]): a module must not be loaded then.
    static CAPTURING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`device_lock`] held for a graph capture on this thread; while it
/// lives, a kernel whose module is not loaded is an error instead of a
/// load (which would wait for the lock this thread holds).
pub(crate) struct CaptureGuard(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl CaptureGuard {
    pub(crate) fn new() -> Self {
        let lock = device_lock();
        CAPTURING.with(|c| c.set(true));
        CaptureGuard(lock)
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURING.with(|c| c.set(false));
    }
}

/// A CUDA device with its stream, cuBLAS handle and kernels.
pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// Released under [`device_lock`] (see `Drop`).
    pub blas: std::mem::ManuallyDrop<CudaBlas>,
    /// The kernels of [`Module::Common`].
    funcs: HashMap<&'static str, CudaFunction>,
    /// The product modules, shared by every stream of the device.
    products: Arc<ProductModules>,
    pub info: DeviceInfo,
    /// What this device's kernels and fusions are (the backend's).
    pub opts: CudaOptions,
    /// When set, every launch is timed (synchronously) and summed per kernel.
    profile: Mutex<Option<HashMap<&'static str, (f64, usize)>>>,
    /// Whether [`Device::launch`] asks for programmatic dependent launch
    /// (see [`pdl_enabled`]).
    pdl: bool,
}

/// The kernels of each [`Module::Products`] module, slot `i` for
/// `PRODUCTS[i]`, filled when first needed ([`Device::load_products`]).
#[derive(Default)]
struct ProductModules {
    slots: [OnceLock<HashMap<&'static str, CudaFunction>>; PRODUCTS.len()],
    /// Held while slots are filled, so that a module is compiled and
    /// loaded once.
    filling: Mutex<()>,
}

/// Loads `module` from `image` into `ctx` and looks up its kernels; where
/// a CUBIN fails to load, forgets it and falls back to PTX.
fn load_module(
    ctx: &Arc<CudaContext>,
    cc: (i32, i32),
    module: Module,
    image: compile::Image,
    extra: &[String],
) -> Result<HashMap<&'static str, CudaFunction>> {
    let loaded: Arc<CudaModule> = {
        let _device = device_lock();
        match ctx.load_module(image.to_ptx()) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("warning: loading the CUDA kernels ({}): {e}; compiling them as PTX instead", module.label());
                compile::forget_cubin(cc, module, extra);
                ctx.load_module(compile::ptx(cc, module, extra)?.to_ptx())
                    .map_err(dev_err("loading a kernel module"))?
            }
        }
    };
    module
        .kernels()
        .into_iter()
        .map(|k| {
            let f = loaded.load_function(k.name).map_err(|e| Error::Device(format!("kernel {}: {e}", k.name)))?;
            Ok((k.name, f))
        })
        .collect()
}

/// A cuBLAS handle on `stream`, created under [`device_lock`].
fn new_blas(stream: &Arc<CudaStream>) -> Result<std::mem::ManuallyDrop<CudaBlas>> {
    let _device = device_lock();
    let blas = CudaBlas::new(stream.clone()).map_err(|e| Error::Device(format!("cuBLAS: {e:?}")))?;
    Ok(std::mem::ManuallyDrop::new(blas))
}

impl Drop for Device {
    fn drop(&mut self) {
        let _device = device_lock();
        // SAFETY: dropped once, here; nothing uses `blas` after `drop`.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.blas) };
    }
}

/// Programmatic dependent launch (compute capability 9.0 and later): a
/// kernel launched with the programmatic-stream-serialization attribute may
/// be scheduled while the kernel before it on the stream is still running,
/// so its launch latency overlaps the predecessor's tail. Every kernel of
/// the module starts with `pdl_wait()` (`griddepcontrol.wait`, common.cuh),
/// which blocks until the predecessor grid has completed and its memory is
/// visible, before any memory access: the order of memory effects is that
/// of a plain launch. Captured graphs keep the attribute as programmatic
/// edges. `CudaOptions::pdl` off turns it off (plain launches).
fn pdl_enabled(cc: (i32, i32), opts: &CudaOptions) -> bool {
    cc.0 >= 9 && opts.pdl
}

/// Page-locked host memory of `len` values of `T` (not write-combined, so
/// the host reads it at full speed), for copies that a captured graph
/// performs and for the logits.
pub(crate) struct PinnedBuf<T> {
    ptr: *mut T,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory owned by this value; the device writes it only
// in copies ordered before the stream synchronizations that precede any
// host access (see `CudaModel`).
unsafe impl<T: Send> Send for PinnedBuf<T> {}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> PinnedBuf<T> {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let len = len.max(1);
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or(Error::Overflow("pinned buffer size"))?;
        ctx.bind_to_thread().map_err(dev_err("binding the context"))?;
        let _device = device_lock();
        // SAFETY: a fresh allocation of `bytes` bytes, zeroed below before
        // any read (T is valid as zero bits).
        let ptr = unsafe { result::malloc_host(bytes, 0) }.map_err(dev_err("pinned host allocation"))? as *mut T;
        // SAFETY: `ptr` points to `bytes` writable bytes.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        Ok(PinnedBuf { ptr, len, ctx: ctx.clone() })
    }

    /// The values (no device copy into them may be in flight).
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialized values; device writes are
        // finished whenever the host holds `&self` (see the Send note).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The values, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as `as_slice`, with exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T> Drop for PinnedBuf<T> {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _device = device_lock();
        // SAFETY: allocated by `malloc_host` in `new`, freed once.
        let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

impl Device {
    /// Opens device `ordinal`. Assumes the driver library is present (the
    /// caller checks, and catches the loader's panics).
    pub fn open(ordinal: usize, opts: CudaOptions) -> Result<Self> {
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
            max_threads_per_multiprocessor: ctx
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
                .map_err(dev_err("threads per multiprocessor"))?,
        };
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::Device("cuBLAS (libcublas) not found".into()));
        }
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::Device("NVRTC (libnvrtc) not found".into()));
        }
        let cc = info.compute_capability;
        // The cached or freshly compiled CUBIN; PTX when that fails.
        let image = match compile::cubins(cc, &[Module::Common], &opts.nvrtc_opts) {
            Ok(mut v) if v.len() == 1 => v.remove(0),
            Ok(_) => return Err(Error::Device("kernel image missing".into())),
            Err(e) => {
                eprintln!("warning: {e}; compiling the CUDA kernels as PTX instead");
                compile::ptx(cc, Module::Common, &opts.nvrtc_opts)?
            }
        };
        let funcs = load_module(&ctx, cc, Module::Common, image, &opts.nvrtc_opts)?;
        let pdl = pdl_enabled(info.compute_capability, &opts);
        // Last, so that no earlier error leaves the handle behind.
        let blas = new_blas(&stream)?;
        Ok(Device { ctx, stream, blas, funcs, products: Arc::default(), info, opts, profile: Mutex::new(None), pdl })
    }

    /// The same device, context and kernels on a stream (and cuBLAS handle)
    /// of its own. Every prepared model runs on one: a model captures its
    /// decode step as a CUDA graph, and a capture on a stream that another
    /// thread also launches on fails (`CUDA_ERROR_STREAM_CAPTURE_*`), so
    /// models used from different threads must not share a stream.
    pub fn with_own_stream(&self) -> Result<Self> {
        let stream = self.ctx.new_stream().map_err(dev_err("creating a stream"))?;
        let blas = new_blas(&stream)?;
        Ok(Device {
            ctx: self.ctx.clone(),
            stream,
            blas,
            funcs: self.funcs.clone(),
            products: self.products.clone(),
            info: self.info.clone(),
            opts: self.opts.clone(),
            profile: Mutex::new(None),
            pdl: self.pdl,
        })
    }

    /// Compiles (or takes from the cache) and loads the product modules of
    /// `layouts` that are not loaded yet, the missing ones compiled in
    /// parallel. Layouts without quantized products (the float types) are
    /// skipped. A model calls this when it is prepared, so that nothing is
    /// loaded while a graph is captured.
    pub fn load_products(&self, layouts: &[kernels::Layout]) -> Result<()> {
        let mut wanted: Vec<u8> =
            layouts.iter().filter_map(|&l| PRODUCTS.iter().position(|p| p.layout == l)).map(|i| i as u8).collect();
        wanted.sort_unstable();
        wanted.dedup();
        wanted.retain(|&i| self.products.slots[i as usize].get().is_none());
        if wanted.is_empty() {
            return Ok(());
        }
        let _filling = self.products.filling.lock().map_err(|_| Error::Device("kernel module lock poisoned".into()))?;
        wanted.retain(|&i| self.products.slots[i as usize].get().is_none());
        let modules: Vec<Module> = wanted.iter().map(|&i| Module::Products(i)).collect();
        let cc = self.info.compute_capability;
        let extra = &self.opts.nvrtc_opts;
        let images = match compile::cubins(cc, &modules, extra) {
            Ok(v) => v.into_iter().map(Ok).collect(),
            Err(e) => {
                eprintln!("warning: {e}; compiling the CUDA kernels as PTX instead");
                modules.iter().map(|&m| compile::ptx(cc, m, extra)).collect::<Vec<_>>()
            }
        };
        for ((&i, &m), image) in wanted.iter().zip(&modules).zip(images) {
            let funcs = load_module(&self.ctx, cc, m, image?, extra)?;
            let _ = self.products.slots[i as usize].set(funcs);
        }
        Ok(())
    }

    /// The modules loaded so far: `common`, then the loaded products'
    /// layouts in `PRODUCTS` order.
    pub fn loaded_modules(&self) -> Vec<&'static str> {
        let loaded = self.products.slots.iter().enumerate().filter(|(_, s)| s.get().is_some());
        std::iter::once(Module::Common.label()).chain(loaded.map(|(i, _)| Module::Products(i as u8).label())).collect()
    }

    /// `(kernel, registers per thread, local memory bytes per thread)` of
    /// every kernel, sorted by name (spills show as local memory); loads
    /// every module first.
    pub fn kernel_resources(&self) -> Result<Vec<(&'static str, i32, i32)>> {
        self.load_products(&PRODUCTS.iter().map(|p| p.layout).collect::<Vec<_>>())?;
        let products = self.products.slots.iter().filter_map(OnceLock::get).flatten();
        let mut v: Vec<_> = self
            .funcs
            .iter()
            .chain(products)
            .map(|(&k, f)| (k, f.num_regs().unwrap_or(-1), f.local_size_bytes().unwrap_or(-1)))
            .collect();
        v.sort();
        Ok(v)
    }

    /// The kernel `k`, its module loaded first if it is not yet (see
    /// [`Device::load_products`]).
    pub fn func(&self, k: KernelName) -> Result<&CudaFunction> {
        let funcs = match k.module {
            Module::Common => &self.funcs,
            Module::Products(i) => {
                let slot =
                    self.products.slots.get(i as usize).ok_or_else(|| Error::Device(format!("no module {i}")))?;
                match slot.get() {
                    Some(f) => f,
                    None if CAPTURING.with(|c| c.get()) => {
                        return Err(Error::Device(format!(
                            "kernel {}: its module ({}) was not loaded before the graph capture",
                            k.name,
                            k.module.label()
                        )))
                    }
                    None => {
                        self.load_products(&[PRODUCTS[i as usize].layout])?;
                        slot.get()
                            .ok_or_else(|| Error::Device(format!("kernel module {} not loaded", k.module.label())))?
                    }
                }
            }
        };
        funcs.get(k.name).ok_or_else(|| Error::Device(format!("kernel {} is not loaded", k.name)))
    }

    /// The device address of `s` (event tracking is off, so the guard
    /// cudarc returns has nothing to do).
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> DevPtr {
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    /// Launches kernel `k` with one by-value argument struct, as a
    /// programmatic dependent launch where the device supports it (see
    /// [`pdl_enabled`]; the kernel must begin with `pdl_wait()`).
    pub fn launch<A: DeviceRepr>(
        &self,
        k: KernelName,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &A,
    ) -> Result<()> {
        use cudarc::driver::sys;
        let f = self.func(k)?.cu_function();
        let stream = self.stream.cu_stream();
        self.timed(k.name, || {
            self.ctx.bind_to_thread().map_err(dev_err("binding the context"))?;
            // SAFETY: a union of plain integers and structs of integers, for
            // which all-zero bytes are a valid value.
            let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
            value.programmaticStreamSerializationAllowed = 1;
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value,
            };
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: stream,
                attrs: &mut attr,
                numAttrs: u32::from(self.pdl),
            };
            let mut params = [args as *const A as *mut std::ffi::c_void];
            // SAFETY: `A` mirrors the kernel's parameter struct (layout
            // asserted in kernels.rs and common.cuh); every pointer in it was
            // taken from a live allocation of this device sized by the caller
            // for the grid; `cfg`, `attr` and `params` outlive the call, which
            // copies the parameters before it returns.
            unsafe { sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
                .map_err(|e| Error::Device(format!("launching {}: {e}", k.name)))
        })
    }

    /// Launches kernel `k`, `push` adding its arguments. Every launch of the
    /// backend goes through here (and is timed when profiling is on).
    ///
    /// # Safety
    /// The pushed arguments must match the kernel's parameters in number,
    /// size and order, and every device pointer among them must cover what
    /// the kernel reads and writes for `cfg`.
    pub unsafe fn launch_with<'a>(
        &'a self,
        k: KernelName,
        cfg: LaunchConfig,
        push: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> Result<()> {
        let f = self.func(k)?;
        let mut b = self.stream.launch_builder(f);
        push(&mut b);
        // SAFETY: the caller's contract.
        self.timed(k.name, || {
            unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| Error::Device(format!("launching {}: {e}", k.name)))
        })
    }

    /// Runs `f` (which enqueues work on the stream), timing it under `name`
    /// while profiling is on (see [`Device::set_profiling`]).
    pub(crate) fn timed(&self, name: &'static str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut prof = self.profile.lock().map_err(|_| Error::Device("profile lock poisoned".into()))?;
        let t0 = if prof.is_some() {
            self.stream.synchronize().map_err(dev_err("profile sync"))?;
            Some(Instant::now())
        } else {
            None
        };
        f()?;
        if let (Some(t0), Some(map)) = (t0, prof.as_mut()) {
            self.stream.synchronize().map_err(dev_err("profile sync"))?;
            let e = map.entry(name).or_insert((0.0, 0));
            e.0 += t0.elapsed().as_secs_f64();
            e.1 += 1;
        }
        Ok(())
    }

    /// Starts (`true`) or stops collecting per-kernel times; stopping
    /// returns `(kernel, total seconds, launches)`, slowest first. Timing
    /// synchronizes around every launch, so graph capture must be off.
    pub fn set_profiling(&self, on: bool) -> Vec<(&'static str, f64, usize)> {
        let Ok(mut p) = self.profile.lock() else { return Vec::new() };
        let old = std::mem::replace(&mut *p, on.then(HashMap::new));
        let mut v: Vec<_> = old.unwrap_or_default().into_iter().map(|(k, (t, n))| (k, t, n)).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }

    /// Page-locked host memory for `len` values.
    pub fn pinned<T: DeviceRepr + ValidAsZeroBits + Copy>(&self, len: usize) -> Result<PinnedBuf<T>> {
        PinnedBuf::new(&self.ctx, len)
    }

    /// Enqueues a copy of `dst.len()` values from `src` (device address) to
    /// pinned host memory: the one device-to-host path of the pipeline,
    /// checked by the [`Device::sync`] that must follow before `dst` is read.
    pub fn enqueue_read<T: DeviceRepr + ValidAsZeroBits + Copy>(
        &self,
        src: DevPtr,
        dst: &mut PinnedBuf<T>,
    ) -> Result<()> {
        let dst = dst.as_mut_slice();
        // SAFETY: `dst` is pinned host memory of `dst.len()` values that
        // stays allocated until after the sync; `src` covers as many values.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }.map_err(dev_err("device to host copy"))
    }

    /// [`Device::enqueue_read`] of `count` values into `dst` from value
    /// `offset` on.
    ///
    /// # Errors
    /// [`Error::Device`] when `offset + count` passes `dst`'s length.
    pub fn enqueue_read_at<T: DeviceRepr + ValidAsZeroBits + Copy>(
        &self,
        src: DevPtr,
        dst: &mut PinnedBuf<T>,
        offset: usize,
        count: usize,
    ) -> Result<()> {
        let len = dst.len;
        let dst = offset
            .checked_add(count)
            .filter(|&end| end <= len)
            .map(|end| &mut dst.as_mut_slice()[offset..end])
            .ok_or_else(|| Error::Device(format!("read of {offset}+{count} values into a buffer of {len}")))?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `enqueue_read`: `dst` is pinned host memory that
        // stays allocated until after the sync; `src` covers `count` values.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }.map_err(dev_err("device to host copy"))
    }

    /// Enqueues a copy of `bytes` bytes from device address `src` to `dst`
    /// (regions that do not overlap, inside allocations of this context).
    ///
    /// # Safety
    /// `src..src + bytes` and `dst..dst + bytes` must lie inside live
    /// device allocations and must not overlap.
    pub unsafe fn enqueue_copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(dev_err("device to device copy"))
    }

    /// Enqueues a copy of the first `count` pinned host values to device
    /// address `dst`.
    pub fn enqueue_write<T: DeviceRepr + ValidAsZeroBits + Copy>(
        &self,
        src: &PinnedBuf<T>,
        dst: DevPtr,
        count: usize,
    ) -> Result<()> {
        let src = &src.as_slice()[..count.min(src.len)];
        // SAFETY: `src` is pinned host memory that outlives the copy (and
        // any graph that captured it); `dst` covers `count` values.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }.map_err(dev_err("host to device copy"))
    }

    /// Allocates `n` zeroed values.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
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
