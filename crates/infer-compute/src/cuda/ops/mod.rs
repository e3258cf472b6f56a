//! Launch wrappers: one function per kernel family, taking device
//! addresses and shapes, checking what the kernels assume, and choosing
//! grid and block sizes. Used by the decode pipeline ([`super::model`]) and
//! by the single-op entry points of [`super::CudaBackend`].

mod attention;
mod elementwise;
mod gemm;
mod matvec;
mod sampling;

pub(crate) use super::options::GemmPrecision;
use crate::error::{Error, Result};
pub(crate) use attention::*;
pub(crate) use elementwise::*;
pub(crate) use gemm::*;
pub(crate) use matvec::*;
pub(crate) use sampling::*;

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Device(format!("{what} = {v} does not fit the kernels' 32-bit indices")))
}

fn to_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Device(format!("{what} = {v} does not fit a launch dimension")))
}
