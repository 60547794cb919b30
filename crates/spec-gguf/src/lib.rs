//! A reader for GGUF model files and dequantization of ggml tensor data to `f32`.
//!
//! [`GgufFile::open`] reads the header, the metadata and the tensor table, and checks that every
//! tensor's data lies inside the file. Tensor data is read on demand with positioned reads (no
//! memory map), whole ([`GgufFile::read_raw`], [`GgufFile::dequantize`]) or a range of rows at a
//! time ([`GgufFile::read_rows_raw`], [`GgufFile::dequantize_rows_into`]).
//!
//! Supported: GGUF versions 2 and 3, little-endian. Dequantization: F32, F16, BF16, F64, Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K (see [`dequant`] for the block
//! layouts); the i-quants and other types can be read raw but not dequantized.
//!
//! Element order: GGUF lists dims innermost first, so `dims = [in, out]` for a PyTorch
//! `[out, in]` weight; dequantized data is row-major with `dims[0]` contiguous, i.e. shape
//! [`TensorInfo::shape`] = `[out, in]`.
//!
//! ```no_run
//! # fn main() -> Result<(), spec_gguf::GgufError> {
//! let f = spec_gguf::GgufFile::open("model.gguf")?;
//! let n_layers = f.arch_get("block_count").and_then(|v| v.as_u64());
//! let t = f.tensor("token_embd.weight").expect("present");
//! let first_rows = f.dequantize_rows(t, 0, 4)?; // 4 × dims[0] floats
//! # let _ = (n_layers, first_rows); Ok(()) }
//! ```

pub mod dequant;
mod error;
mod file;
mod types;
mod value;

pub use dequant::{
    Q4KBlock, Q6KBlock, decode_q4_k, decode_q4_k_blocks, decode_q6_k, decode_q6_k_blocks,
    dequantize, dequantize_into,
};
pub use error::GgufError;
pub use file::{DEFAULT_ALIGNMENT, GgufFile, MAX_DIMS, TensorInfo};
pub use types::GgmlType;
pub use value::Value;

#[cfg(test)]
mod tests;
