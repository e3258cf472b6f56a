//! What [`super::DeviceModel::profile_step`] returns: the time of each named
//! op of one real decode step, measured by the backend that ran it.

use std::time::Duration;

/// One kind of op in a profiled step (all calls of it added up).
#[derive(Clone, Debug, PartialEq)]
pub struct OpTiming {
    /// What ran, in the field's terms: `attn_norm`, `matvec attn_qkv`,
    /// `rope`, `attention`, `ffn_down`, `output` ...
    pub op: String,
    /// Weight type(s) of a product (`Q4_K`, `Q4_K packed`), else empty.
    pub ty: String,
    /// Shape of a product's weights (`1024x640`: rows × cols), else empty.
    pub shape: String,
    /// Calls in the step.
    pub calls: usize,
    /// Time of all calls together.
    pub time: Duration,
    /// Weight bytes read by all calls together (products), else 0.
    pub bytes: u64,
}

/// The ops of one decode step, in the order they first ran, and the step's
/// wall time (which includes the time of measuring: timing each op
/// serializes the work).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepProfile {
    pub ops: Vec<OpTiming>,
    pub total: Duration,
}

impl StepProfile {
    /// Adds `time` (and `bytes`) to the op named `op` with `ty` and `shape`,
    /// creating it after the others on first use.
    pub fn record(&mut self, op: &str, ty: &str, shape: &str, time: Duration, bytes: u64) {
        let i = match self.ops.iter().position(|o| o.op == op && o.ty == ty && o.shape == shape) {
            Some(i) => i,
            None => {
                self.ops.push(OpTiming {
                    op: op.to_string(),
                    ty: ty.to_string(),
                    shape: shape.to_string(),
                    calls: 0,
                    time: Duration::ZERO,
                    bytes: 0,
                });
                self.ops.len() - 1
            }
        };
        let o = &mut self.ops[i];
        o.calls += 1;
        o.time += time;
        o.bytes += bytes;
    }

    /// Sum of the ops' times.
    pub fn ops_time(&self) -> Duration {
        self.ops.iter().map(|o| o.time).sum()
    }
}
