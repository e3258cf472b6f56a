//! Recording dispatches into one command buffer ([`Step`]): each dispatch
//! names its kernel, its buffers by binding index and its parameter words;
//! [`Step::encode`] uploads every dispatch's parameters as one uniform
//! buffer (one block per dispatch at the adapter's offset alignment),
//! creates the bind groups (or reuses those of the previous step,
//! [`BindCache`]) and records one compute pass. Dispatches see the
//! writes of the ones before them (WebGPU orders storage accesses between
//! dispatches of a pass).

use wgpu::util::DeviceExt;

use super::context::Gpu;
use super::shaders::{Kernel, Variant};
use crate::error::Result;

/// Parameter words of one dispatch (u32 or f32 bits, in the order of the
/// kernel's `Params` struct).
pub const MAX_PARAMS: usize = 20;

/// A parameter word.
#[derive(Clone, Copy)]
pub enum P {
    U(u32),
    F(f32),
}

impl From<u32> for P {
    fn from(v: u32) -> Self {
        P::U(v)
    }
}

impl From<f32> for P {
    fn from(v: f32) -> Self {
        P::F(v)
    }
}

/// What a dispatch is, for profiles: op, weight type, weight shape, weight
/// bytes read.
#[derive(Clone, Debug, Default)]
pub struct Tag {
    pub op: String,
    pub ty: String,
    pub shape: String,
    pub bytes: u64,
}

struct Item {
    tag: Tag,
    pipeline: wgpu::ComputePipeline,
    bufs: Vec<(u32, wgpu::Buffer)>,
    param_slot: u32,
    param_block: usize,
    groups: [u32; 3],
}

impl Item {
    /// The dispatch into `pass`, with its bind group `bg`.
    fn record(&self, pass: &mut wgpu::ComputePass<'_>, bg: &wgpu::BindGroup) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, bg, &[]);
        pass.dispatch_workgroups(self.groups[0], self.groups[1], self.groups[2]);
    }
}

/// The dispatches of one command buffer, in order.
pub struct Step<'g> {
    pub gpu: &'g Gpu,
    params: Vec<[u32; MAX_PARAMS]>,
    items: Vec<Item>,
    next_tag: Option<Tag>,
}

impl<'g> Step<'g> {
    /// An empty step on `gpu`.
    pub fn new(gpu: &'g Gpu) -> Self {
        Step { gpu, params: Vec::new(), items: Vec::new(), next_tag: None }
    }

    /// Names the next dispatch in profiles (else it is named by its kernel).
    pub fn tag(&mut self, tag: Tag) {
        self.next_tag = Some(tag);
    }

    /// Records `kernel` (composed for `variant`) over `groups` workgroups,
    /// with `bufs` at their binding indices and `params` as the uniform at
    /// binding `param_slot`.
    ///
    /// # Errors
    /// Those of [`Gpu::pipeline`].
    pub fn dispatch(
        &mut self,
        kernel: Kernel,
        variant: Variant,
        bufs: &[(u32, &wgpu::Buffer)],
        param_slot: u32,
        params: &[P],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let pipeline = self.gpu.pipeline(kernel, variant)?;
        let mut words = [0u32; MAX_PARAMS];
        for (w, p) in words.iter_mut().zip(params) {
            *w = match *p {
                P::U(u) => u,
                P::F(f) => f.to_bits(),
            };
        }
        self.params.push(words);
        let tag = self.next_tag.take().unwrap_or_else(|| Tag { op: kernel.name().into(), ..Default::default() });
        self.items.push(Item {
            tag,
            pipeline,
            bufs: bufs.iter().map(|&(i, b)| (i, b.clone())).collect(),
            param_slot,
            param_block: self.params.len() - 1,
            groups,
        });
        Ok(())
    }

    /// A 1-D grid of `n` workgroups as (x, y) within the per-dimension
    /// limit (kernels number them `x + y · nwg.x`).
    pub fn grid(&self, n: usize) -> [u32; 2] {
        let max = self.gpu.caps.max_groups.max(1) as usize;
        let x = n.min(max);
        [x as u32, n.div_ceil(x.max(1)) as u32]
    }

    /// The number of dispatches recorded.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no dispatch was recorded.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The command encoder holding every recorded dispatch in one compute
    /// pass (submitted by the caller, usually through [`Gpu::read_back`]).
    ///
    /// # Errors
    /// Device errors creating the parameter buffer or the bind groups.
    pub fn encode(self) -> Result<wgpu::CommandEncoder> {
        self.encode_cached(&mut BindCache::default())
    }

    /// [`Step::encode`] with the bind groups of `cache` when it holds
    /// those of the same dispatches, else new ones, which replace them.
    ///
    /// # Errors
    /// As [`Step::encode`].
    pub fn encode_cached(self, cache: &mut BindCache) -> Result<wgpu::CommandEncoder> {
        let key = self.key();
        if cache.key != key {
            *cache = BindCache { groups: self.bind()?, key };
        }
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for (it, bg) in self.items.iter().zip(&cache.groups) {
                it.record(&mut pass, bg);
            }
        }
        Ok(enc)
    }

    /// Each dispatch in a compute pass of its own that writes the device's
    /// timestamps at its start and end (queries `2i` and `2i + 1` of
    /// `queries`, which holds at least `2 · len()`), all in one command
    /// encoder; with each dispatch's tag, in order.
    ///
    /// # Errors
    /// As [`Step::encode`]; [`Error::Overflow`](crate::Error::Overflow)
    /// past 2³¹ dispatches.
    pub fn encode_timed(self, queries: &wgpu::QuerySet) -> Result<(Vec<Tag>, wgpu::CommandEncoder)> {
        let gpu = self.gpu;
        let groups = self.bind()?;
        let items = self.items;
        let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("timed step") });
        for (i, (it, bg)) in items.iter().zip(&groups).enumerate() {
            let q = u32::try_from(2 * i).map_err(|_| crate::Error::Overflow("timestamp queries"))?;
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: queries,
                    beginning_of_pass_write_index: Some(q),
                    end_of_pass_write_index: Some(q + 1),
                }),
            });
            it.record(&mut pass, bg);
        }
        Ok((items.into_iter().map(|it| it.tag).collect(), enc))
    }

    /// Each dispatch in a command buffer of its own with its tag, for
    /// timing one at a time.
    ///
    /// # Errors
    /// As [`Step::encode`].
    pub fn encode_each(self) -> Result<Vec<(Tag, wgpu::CommandBuffer)>> {
        let gpu = self.gpu;
        let groups = self.bind()?;
        Ok(self
            .items
            .into_iter()
            .zip(&groups)
            .map(|(it, bg)| {
                let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                    it.record(&mut pass, bg);
                }
                (it.tag, enc.finish())
            })
            .collect())
    }

    /// Each dispatch's bind group, over one new parameter buffer (which
    /// the bind groups keep alive).
    fn bind(&self) -> Result<Vec<wgpu::BindGroup>> {
        let gpu = self.gpu;
        gpu.scoped("recording a step", || {
            let align = (4 * MAX_PARAMS as u64).next_multiple_of(gpu.caps.uniform_align.max(1)) as usize;
            let mut bytes = vec![0u8; align * self.params.len().max(1)];
            for (i, words) in self.params.iter().enumerate() {
                bytes[i * align..i * align + 4 * MAX_PARAMS].copy_from_slice(bytemuck::cast_slice(words));
            }
            let ubuf = gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("step parameters"),
                contents: &bytes,
                usage: wgpu::BufferUsages::UNIFORM,
            });
            Ok(self
                .items
                .iter()
                .map(|it| {
                    let mut entries: Vec<wgpu::BindGroupEntry<'_>> = it
                        .bufs
                        .iter()
                        .map(|(i, b)| wgpu::BindGroupEntry { binding: *i, resource: b.as_entire_binding() })
                        .collect();
                    entries.push(wgpu::BindGroupEntry {
                        binding: it.param_slot,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &ubuf,
                            offset: (it.param_block * align) as u64,
                            size: wgpu::BufferSize::new(4 * MAX_PARAMS as u64),
                        }),
                    });
                    gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: None,
                        layout: &it.pipeline.get_bind_group_layout(0),
                        entries: &entries,
                    })
                })
                .collect())
        })
    }

    /// What the bind groups of this step depend on, per dispatch.
    fn key(&self) -> Vec<BindKey> {
        self.items
            .iter()
            .map(|it| BindKey {
                pipeline: it.pipeline.clone(),
                bufs: it.bufs.clone(),
                param_slot: it.param_slot,
                params: self.params[it.param_block],
            })
            .collect()
    }
}

/// What one dispatch's bind group was made for.
#[derive(PartialEq, Eq)]
struct BindKey {
    pipeline: wgpu::ComputePipeline,
    bufs: Vec<(u32, wgpu::Buffer)>,
    param_slot: u32,
    params: [u32; MAX_PARAMS],
}

/// The bind groups of the last step encoded through it, with what they
/// were made for, reused by the next step that records the same
/// dispatches with the same parameters. Decode steps of one shape do
/// (token ids, positions and slots live in buffers), so a steady decode
/// creates no bind group and no parameter buffer. It keeps the buffers of
/// that step alive until a different step replaces it.
#[derive(Default)]
pub struct BindCache {
    key: Vec<BindKey>,
    groups: Vec<wgpu::BindGroup>,
}
