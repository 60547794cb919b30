/// What can go wrong packing weights or running a product.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KernelError {
    #[error(
        "a {rows}×{cols} matrix needs {expected} values, got {found}; pass the weights row-major [out, in]"
    )]
    WeightLength {
        rows: usize,
        cols: usize,
        expected: usize,
        found: usize,
    },
    #[error("weight [{row}, {col}] is {value}; only finite weights can be packed")]
    NonFinite { row: usize, col: usize, value: f32 },
    #[error("x has {found} values for {rows} rows of {cols} columns (expected {expected})")]
    InputLength {
        rows: usize,
        cols: usize,
        expected: usize,
        found: usize,
    },
    #[error(
        "the output has {found} values for {rows} rows of {cols} columns (expected {expected})"
    )]
    OutputLength {
        rows: usize,
        cols: usize,
        expected: usize,
        found: usize,
    },
    #[error(
        "a gate/up matrix of {0} rows cannot be run with SwiGLU: it needs a positive multiple of twice the run of 16"
    )]
    SwigluRows(usize),
    #[error("attention inputs do not match their shape: {0}")]
    AttentionShape(String),
    #[error("Q4_K superblocks cannot be packed: {0}")]
    Superblocks(String),
    #[error("unknown weight format {0:?}; expected f32, bf16, q8_0, q4, q8_0-a8 or q4-a8")]
    UnknownFormat(String),
}
