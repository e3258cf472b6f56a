//! The device: instance, adapter, device and queue opened once
//! ([`Gpu::open`]), the adapter's limits and features read once
//! ([`Caps`]), buffers, the compiled pipelines (cached per kernel and
//! weight type), error scopes that turn wgpu's validation and out-of-memory
//! reports into [`Error`]s, and the one checked read-back ([`Gpu::read_back`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use super::shaders::{self, Kernel, Variant};
use crate::error::{Error, Result};

/// Storage buffers the widest kernels bind at once (`rope.wgsl`, and
/// `attention.wgsl` over TurboQuant keys and values).
const MAX_STORAGE_BINDINGS: u32 = 10;

/// What the adapter offers, read once when the device is opened.
#[derive(Clone, Debug)]
pub struct Caps {
    /// The adapter's name, driver and API.
    pub name: String,
    pub driver: String,
    pub backend: String,
    /// `DeviceType::Cpu`: a software rasterizer (lavapipe, WARP, SwiftShader).
    pub software: bool,
    /// `shader-f16` (f16 arithmetic in shaders; not needed by these kernels,
    /// which unpack f16 with `unpack2x16float`).
    pub shader_f16: bool,
    /// Subgroup operations (`subgroupAdd`, `subgroupMax`): the reductions
    /// use them when on, workgroup memory otherwise.
    pub subgroups: bool,
    /// Largest range one storage binding may cover, in bytes (weight
    /// matrices larger than this are split into row blocks).
    pub max_storage_binding: u64,
    /// Largest buffer, in bytes.
    pub max_buffer: u64,
    /// Workgroups per grid dimension.
    pub max_groups: u32,
    /// Alignment of a uniform binding's offset, in bytes.
    pub uniform_align: u64,
    /// Timestamp queries at compute-pass boundaries (`timestamp-query`):
    /// profiles time each dispatch on the device's clock when on, by wall
    /// time around a submit of each dispatch otherwise.
    pub timestamps: bool,
}

/// How to open the device.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Use the workgroup-memory reductions even where the adapter has
    /// subgroups (to test the fallback).
    pub no_subgroups: bool,
    /// Accept only a hardware adapter (what `default_backend` asks).
    pub hardware_only: bool,
    /// Tokens per forward pass at most, below the default (`PASS_TOKENS`);
    /// small values make short prompts run in several passes (tests).
    pub pass_tokens: Option<usize>,
    /// Bytes per buffer of a weight matrix at most, below the binding
    /// limit; small values split even small matrices into row blocks
    /// (tests).
    pub weight_part_bytes: Option<u64>,
}

/// An open wgpu device with its queue, capabilities and pipelines.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub caps: Caps,
    /// Whether the kernels were composed with the subgroup reductions.
    pub subgroups: bool,
    /// [`Options::pass_tokens`].
    pub pass_tokens: Option<usize>,
    /// [`Options::weight_part_bytes`].
    pub weight_part_bytes: Option<u64>,
    pipelines: Mutex<HashMap<(Kernel, Variant), wgpu::ComputePipeline>>,
    /// A small storage buffer bound where a kernel's optional operand is absent.
    pub dummy: wgpu::Buffer,
    /// Uncaptured errors (outside any scope), reported by the next scope.
    stray: Arc<Mutex<Vec<String>>>,
}

fn device_type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::Other => "other",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Cpu => "software (CPU)",
    }
}

impl Gpu {
    /// Opens the best adapter (a discrete GPU, then an integrated or
    /// virtual one, then a software adapter unless `hardware_only`) with
    /// the adapter's own limits (WebGPU's defaults are too small for model
    /// weights: 128 MiB bindings, 8 storage buffers per stage).
    ///
    /// # Errors
    /// [`Error::Device`] when no adapter is found (naming why) or the
    /// device cannot be created, or naming the limit when the adapter has
    /// fewer storage bindings per stage than the kernels need.
    pub fn open(opts: Options) -> Result<Self> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12,
            ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
        });
        let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Other => 3,
            wgpu::DeviceType::Cpu => 4,
        };
        adapters.sort_by_key(rank);
        let found: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        let adapter = adapters
            .into_iter()
            .find(|a| !opts.hardware_only || a.get_info().device_type != wgpu::DeviceType::Cpu)
            .ok_or_else(|| {
                Error::Device(if found.is_empty() {
                    "no Vulkan, Metal or DirectX 12 adapter (on Linux: install a Vulkan driver, e.g. Debian's mesa-vulkan-drivers and libvulkan1)".into()
                } else {
                    format!("no hardware adapter (found only software ones: {})", found.join(", "))
                })
            })?;
        let info = adapter.get_info();
        let features = adapter.features();
        let limits = adapter.limits();
        if limits.max_storage_buffers_per_shader_stage < MAX_STORAGE_BINDINGS {
            return Err(Error::Device(format!(
                "{}: max_storage_buffers_per_shader_stage is {}, the kernels need {MAX_STORAGE_BINDINGS}",
                info.name, limits.max_storage_buffers_per_shader_stage
            )));
        }
        let caps = Caps {
            name: info.name.clone(),
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            backend: format!("{:?}", info.backend),
            software: info.device_type == wgpu::DeviceType::Cpu,
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            max_storage_binding: limits.max_storage_buffer_binding_size,
            max_buffer: limits.max_buffer_size,
            max_groups: limits.max_compute_workgroups_per_dimension,
            uniform_align: limits.min_uniform_buffer_offset_alignment as u64,
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
        };
        let subgroups = caps.subgroups && !opts.no_subgroups;
        let mut required_features = wgpu::Features::empty();
        if subgroups {
            required_features |= wgpu::Features::SUBGROUP;
        }
        if caps.timestamps {
            required_features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("infer-compute"),
            required_features,
            required_limits: limits,
            memory_hints: wgpu::MemoryHints::Performance,
            ..Default::default()
        }))
        .map_err(|e| Error::Device(format!("{}: cannot open the device: {e}", info.name)))?;
        let stray = Arc::new(Mutex::new(Vec::new()));
        let sink = stray.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dummy"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Ok(Gpu {
            device,
            queue,
            caps,
            subgroups,
            pass_tokens: opts.pass_tokens,
            weight_part_bytes: opts.weight_part_bytes,
            pipelines: Mutex::new(HashMap::new()),
            dummy,
            stray,
        })
    }

    /// One line: adapter, type, API, driver, the reductions in use.
    pub fn describe(&self) -> String {
        let c = &self.caps;
        let kind = if c.software { device_type_name(wgpu::DeviceType::Cpu) } else { "hardware" };
        format!(
            "{} ({kind}, {}, {}), {} reductions, max binding {} MiB",
            c.name,
            c.backend,
            c.driver,
            if self.subgroups { "subgroup" } else { "workgroup-memory" },
            c.max_storage_binding >> 20
        )
    }

    /// Runs `f` inside out-of-memory and validation error scopes and
    /// reports what they caught (or an uncaptured error seen since).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] naming `what`; [`Error::Device`] for a
    /// validation or internal error; those of `f`.
    pub fn scoped<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let r = f();
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            return Err(Error::OutOfMemory { what: format!("{what} ({e})"), bytes: 0 });
        }
        if let Some(e) = v {
            return Err(Error::Device(format!("{what}: {e}")));
        }
        if let Some(e) = self.stray.lock().ok().and_then(|mut s| s.pop()) {
            return Err(Error::Device(format!("{what}: {e}")));
        }
        r
    }

    /// A storage buffer of `bytes` (rounded up to 4), zeroed.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when it exceeds `max_buffer_size` or the
    /// device refuses it.
    pub fn storage(&self, what: &str, bytes: u64) -> Result<wgpu::Buffer> {
        let size = bytes.max(4).div_ceil(4) * 4;
        if size > self.caps.max_buffer {
            return Err(Error::OutOfMemory { what: format!("{what} (past max_buffer_size)"), bytes: size });
        }
        self.scoped(what, || {
            Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(what),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }))
        })
    }

    /// A storage buffer holding `data` (padded with zeros to a multiple of
    /// 4 bytes, and by 4 more so that an unaligned word read of the last
    /// bytes stays inside).
    ///
    /// # Errors
    /// As [`Gpu::storage`].
    pub fn upload(&self, what: &str, data: &[u8]) -> Result<wgpu::Buffer> {
        let size = (data.len() as u64).div_ceil(4) * 4 + 4;
        if size > self.caps.max_buffer {
            return Err(Error::OutOfMemory { what: format!("{what} (past max_buffer_size)"), bytes: size });
        }
        self.scoped(what, || {
            let mut padded = Vec::new();
            padded
                .try_reserve_exact(size as usize)
                .map_err(|_| Error::OutOfMemory { what: what.into(), bytes: size })?;
            padded.extend_from_slice(data);
            padded.resize(size as usize, 0);
            Ok(self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(what),
                contents: &padded,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            }))
        })
    }

    /// [`Gpu::upload`] of f32 values.
    ///
    /// # Errors
    /// As [`Gpu::storage`].
    pub fn upload_f32(&self, what: &str, data: &[f32]) -> Result<wgpu::Buffer> {
        self.upload(what, bytemuck::cast_slice(data))
    }

    /// The pipeline of `kernel` composed for `variant` (its weight type,
    /// or its KV cache types), compiled on first use and cached.
    ///
    /// # Errors
    /// As [`shaders::compose`]: [`Error::Unsupported`] for a weight type
    /// without a kernel;
    /// [`Error::Device`] when the shader fails to compile (a bug, which the
    /// naga test catches first).
    pub fn pipeline(&self, kernel: Kernel, variant: Variant) -> Result<wgpu::ComputePipeline> {
        let mut cache = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = cache.get(&(kernel, variant)) {
            return Ok(p.clone());
        }
        let src = shaders::compose(kernel, variant, self.subgroups)?;
        let p = self.scoped(kernel.name(), || {
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(kernel.name()),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            };
            // Bounds checks stay on. naga's loop bounding (a counter and an
            // exit test added to every loop) is off: it keeps drivers from
            // unrolling the kernels' fixed loops, so their small arrays
            // (a quarter's four weights, a tile's accumulators) went to
            // local memory and the products ran at a tenth of the H200's
            // bandwidth.
            let checks =
                wgpu::ShaderRuntimeChecks { force_loop_bounding: false, ..wgpu::ShaderRuntimeChecks::checked() };
            // SAFETY: `create_shader_module_trusted` requires that no loop
            // of these shaders runs forever once loop bounding is off. Every
            // loop of `shaders/` counts a u32 up to a bound taken from its
            // parameters, by a positive step: sizes the host derives from
            // buffers below 2^31 bytes and positions it checks against the
            // context, so no counter can wrap past its bound (or, in
            // `kv/rotation.wgsl`, doubles a u32 from 1 up to a Hadamard
            // block of at most 512, a power of two the host derives from
            // head_dim).
            let module = unsafe { self.device.create_shader_module_trusted(desc, checks) };
            Ok(self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.name()),
                layout: None,
                module: &module,
                entry_point: Some(kernel.entry()),
                // Every kernel writes the workgroup memory it reads first
                // (a barrier between), so wgpu's zero fill of it is waste.
                compilation_options: wgpu::PipelineCompilationOptions {
                    zero_initialize_workgroup_memory: false,
                    ..Default::default()
                },
                cache: None,
            }))
        })?;
        cache.insert((kernel, variant), p.clone());
        Ok(p)
    }

    /// Submits `encoder` after appending a copy of `out.len()` values of
    /// `T` from byte `offset` of `src` to a staging buffer, waits, and
    /// copies them into `out`: the one way results come back to the host.
    ///
    /// # Errors
    /// [`Error::Shape`] when `offset` is not a multiple of 4 or the range
    /// passes the end of `src`; [`Error::Device`] when the wait or the
    /// mapping fails (device lost, timeout).
    pub fn read_back<T: bytemuck::Pod>(
        &self,
        encoder: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        offset: u64,
        out: &mut [T],
    ) -> Result<()> {
        self.read_back_during(encoder, src, offset, out, || Ok(()))
    }

    /// [`Gpu::read_back`], running `during` on the host between the submit
    /// and the wait (the next step's encoding, while the GPU runs this
    /// one). The wait happens whatever `during` returns; its error, if
    /// any, is returned after.
    ///
    /// # Errors
    /// As [`Gpu::read_back`], or `during`'s.
    pub fn read_back_during<T: bytemuck::Pod>(
        &self,
        mut encoder: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        offset: u64,
        out: &mut [T],
        during: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let bytes = std::mem::size_of_val(out) as u64;
        let bad = |d: String| Err(crate::error::shape_err("wgpu read_back", d));
        if !offset.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) || !bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
            return bad(format!("offset {offset} and length {bytes} must be multiples of 4 bytes"));
        }
        if offset.checked_add(bytes).is_none_or(|end| end > src.size()) {
            return bad(format!("{bytes} bytes from {offset} pass the end of a buffer of {}", src.size()));
        }
        if bytes == 0 {
            self.queue.submit([encoder.finish()]);
            return during();
        }
        let staging = self.scoped("read-back staging buffer", || {
            Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("read-back"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }))
        })?;
        encoder.copy_buffer_to_buffer(src, offset, &staging, 0, bytes);
        self.queue.submit([encoder.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        let meanwhile = during();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::Device(format!("mapping the read-back buffer: {e}"))),
            Err(_) => return Err(Error::Device("the read-back mapping never completed".into())),
        }
        {
            let view = staging.get_mapped_range(..).map_err(|e| Error::Device(format!("read-back view: {e}")))?;
            bytemuck::cast_slice_mut::<T, u8>(out).copy_from_slice(&view);
        }
        staging.unmap();
        meanwhile
    }
}
