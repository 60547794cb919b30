//! CPU kernels for decoding.
//!
//! Besides the product below, [`attention`] and [`swiglu`] run the rest of a decoder layer's
//! host step with the same AVX2 + FMA dispatch (module `ops`). A gate/up matrix packed in
//! [`swiglu_row_order`] runs SwiGLU inside the product
//! ([`PackedMatrix::matmul_swiglu_into`]): each thread's block of outputs holds both halves of
//! its features, so it hands on `silu(gate) · up` (half the values) and no separate pass over
//! the gate/up outputs follows; the bits are those of the stacked product then [`swiglu`].
//!
//! The main kernel is a *skinny* matrix product `y[M, n] = x[M, k] · Wᵀ` for the few rows
//! (`M ≤ 16`) that a decode step or a speculative verification step feeds through a projection
//! (`spec-runtime` also runs a prompt through it, in passes of up to 64 rows).
//! `W` is stored `[n, k]` (one row per output), as checkpoints and `spec-runtime` keep it.
//!
//! At these sizes the product is bound by reading `W`: a general matrix product either reads the
//! weights once per row of `x` or spends its time packing them. Here the weights are packed once,
//! at load time, into a [`PackedMatrix`], and each call streams every weight row once for all `M`
//! rows of `x`:
//!
//! - a register tile (one panel of 2 weight rows × 1 to 5 rows of `x`, read as one sequential
//!   stream) accumulates up to 10 dot products in 8-lane vectors (AVX2 + FMA through `pulp`, detected
//!   at run time; a scalar loop elsewhere), so each weight loaded from memory is used `M`
//!   times (from cache after the first pass); f32 rows stored in spans take two panels × up
//!   to 3 rows of `x` a tile (12 sums), which loads fewer vectors a multiply-add. On a CPU
//!   with AVX-512 (F, BW, CD, DQ, VL) the integer tiles of the `*A8` formats are compiled for it ([`Isa::Auto`]): the operations
//!   and their results are the same, but 32 vector registers hold the tiles that spill from
//!   16 ([`Isa::Avx2`] keeps 16); there, weights widened to f32 also take tiles of two panels
//!   (4 weight rows × 3 to 5 rows of `x`; for f32 at up to 5 rows three panels, 6 weight rows)
//!   where several rows of `x` no longer fit in L1 beside a panel (f32 and bf16 from 24 KB of
//!   `x`, Q4 from 3 rows, Q8_0 from 16), so each vector of `x` read serves two or three times
//!   the multiply-adds. The grouped integer layouts with VNNI run one job per row count up to
//!   8, each a tile of one panel × all the rows, more rows in near-equal chunks of at most 8,
//!   the panel's two rows side by side in 16-lane `vpdpbusd` (exact sums: the same bits). So
//!   do f32 rows of more than 1024 inputs (stored in spans) at 6 to 16 rows of `x` (a
//!   verification of K = 5 to 15, which 16 registers take in two tiles or more): one tile of
//!   all the rows, the panel's two rows in 16-lane vectors, lane for lane the same operations
//!   (up to 14 rows two panels a tile, each broadcast vector of `x` serving both). At 4 to 14
//!   rows such a product's tile ([`SpanTile`]: AVX2's 8-lane tiles, or the 16-lane tile
//!   with one stream of hints or a stream a panel) is picked by timing the candidates on its
//!   shape, since which is fastest changed with the state of the machine's memory (module
//!   `tiles`);
//! - tiles ask for their weights 4 KB of a panel ahead (for f32 on AMD only from three rows
//!   of `x` on), which measured faster for Q8_0 and bf16 at every row count, the grouped tiles 8 KB
//!   ahead; on AMD the hints are non-temporal (`prefetchnta`, which AMD describes as filling
//!   L1 alone), so that weights read once a step do not push the KV cache and the rows of `x`
//!   out of L2 and L3; elsewhere they go into L1 (`prefetcht0`): on an Intel Xeon
//!   non-temporal hints made the passes of 2 to 9 rows 1.2-2.5 times as long;
//! - the output rows are split into blocks run by the calling thread and helper threads that spin
//!   between jobs (`team`; as many threads as rayon's global pool), since a decode step is
//!   hundreds of products of tens of microseconds each and waking a sleeping worker costs about
//!   as much as one;
//! - weights may be kept as f32, bf16 (half the bytes), Q8_0 blocks (32 int8 and one f32 scale,
//!   1.125 bytes a weight) or, for weights that are 4-bit already (a GGUF's Q4_0, Q4_1 or Q4_K
//!   blocks: at most 16 evenly spaced values a block), Q4 blocks (32 nibbles with an f32 scale
//!   and minimum, 0.75 bytes a weight) that keep them exactly. Narrow formats are widened to f32
//!   inside the kernel and every sum is accumulated in f32, so the result equals the f32 product
//!   with the *stored* (rounded) weights, which [`PackedMatrix::dequantize`] returns;
//! - the `*A8` formats (`Q8_0A8`, `Q4A8`) instead round each block of 32 inputs of a row of `x`
//!   to int8 before the product (llama.cpp's arithmetic): a block's 32 products are summed
//!   exactly in integers and scaled into f32 once, so no weight is widened to f32. The result
//!   is the f32 product of the *rounded* `x` ([`PackedMatrix::rounded_input`]) with the stored
//!   weights: a different model from the checkpoint's, offered by name only. `Q8_0A8` and the
//!   superblocks below are stored in *groups* of 8 blocks whose 32-byte units hold 4 quants of
//!   each block, `x` interleaved the same way for the product: one integer multiply-add
//!   (`vpdpbusd` where the CPU has AVX512-VNNI, else `vpmaddubsw` + `vpmaddwd`, the same exact
//!   sums) then adds 4 products of each of the 8 blocks into the block's own lane, and a
//!   group's 8 sums are scaled into f32 with one multiply-add instead of one a block;
//! - a GGUF's Q4_K and Q6_K matrices may instead be packed from their superblocks as they are
//!   ([`PackedMatrix::pack_q4_superblocks`], [`PackedMatrix::pack_q6_superblocks`], in
//!   `Q4A8`): 256 weights share an f32 step and each block of 32 keeps small integer factors
//!   of it (0.59 bytes a weight for Q4_K instead of Q4's 0.75, 0.83 for Q6_K instead of
//!   Q8_0's 1.125). `x` is then rounded with one step a superblock (llama.cpp's Q8_K); a
//!   superblock is one group (Q6_K's block halves with scales of their own, two runs of 4
//!   units), each block's integer sum scaled by its scale times the superblock's step.
//!
//! Layouts: each row is padded with zeros to a multiple of 32 columns (one block), and rows are
//! stored in panels of 2, block by block (block `b` of rows `2p` and `2p + 1`, then block
//! `b + 1`, …), so the weight rows a tile reads come from one to four sequential streams instead
//! of one short stream per row; within a block:
//! - f32: the row as is. Rows longer than 32 blocks are stored in *spans* of at most 16
//!   blocks: groups of 16 rows, each group span by span and each span panel by panel, so that
//!   2 to 16 rows of `x` (one span of them fits L1 up to 8 rows) serve the group's 8 panels,
//!   whose pieces are read in the order they are stored; the sums are carried from span to
//!   span, so each output gets the same operations in the same order as from whole rows;
//! - bf16: chunks of 16 weights in 8 `u32` words; word `l` holds weight `l` in its high half and
//!   weight `8 + l` in its low half, so one 256-bit load gives two f32 vectors with a shift and
//!   a mask;
//! - Q8_0: per block of 32 weights the 32 int8 quants in order (four `u64` words of 8), so one
//!   sign-extending load (`vpmovsxbd`) gives a vector of 8 consecutive weights; one f32 scale a
//!   block. `Q8_0A8`: in each whole group of 8 blocks of a row, unit `t` (32 bytes) holds quants
//!   `4 t .. 4 t + 4` of each block in turn, stored plus 128 (unsigned, as `vpdpbusd` takes
//!   them), and the group's 8 scales lie together; blocks after the last whole group as Q8_0;
//! - Q4: per block two `u64` words of 16 nibbles, byte `l` of word `h` holding weight `8 h + l`
//!   (low nibble) and `16 + 8 h + l` (high nibble), so one zero-extending load (`vpmovzxbd`)
//!   gives two vectors of 8 consecutive weights with a mask and a shift; `[scale, min]` a block
//!   in the panels, except for `Q4A8`, which keeps a scale a block in the panels and the blocks'
//!   minimums apart, row after row, so that a row's minimums enter its product once, 8 blocks a
//!   multiply-add against the rounded `x`'s block sums;
//! - Q4_K superblocks: the nibbles grouped, 4 loads of 32 bytes a superblock and row, load `u`
//!   holding unit `2 u` (as for `Q8_0A8`) in its low nibbles and `2 u + 1` in its high ones, the
//!   panel's rows' loads in turn; a superblock's 8 scales as one word and its step in the
//!   panels, its 8 minimums as one word and its minimum step apart, row after row;
//! - Q6_K superblocks: the low 4 bits grouped as Q4_K's nibbles, the high 2 bits in 2 loads a
//!   superblock and row (load `v` holds units `4 v .. 4 v + 4` at bits 0, 2, 4, 6), a
//!   superblock's 16 scales as two words and its step, all in the panels.

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
// Elsewhere the same entry points run the portable loop.
#[cfg(not(target_arch = "x86_64"))]
#[path = "avx2_fallback.rs"]
mod avx2;
mod error;
mod ops;
mod pack;
mod scalar;
mod team;
mod tiles;

pub use error::KernelError;
pub use ops::{AttentionShape, attention, attention_with, dot, swiglu, swiglu_with};
pub use pack::{
    BLOCK, PackedMatrix, Q4Superblock, Q6Superblock, SUPERBLOCK, SWIGLU_RUN, WeightFormat,
    swiglu_row_order,
};
pub use tiles::{SpanTile, SpanTileUse, span_tile_uses};

/// Which instruction set a product runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// The AVX2 + FMA kernel (x86-64) when the CPU has them; its integer tiles (the `*A8`
    /// formats) compiled for AVX-512 (F, BW, CD, DQ, VL) where the CPU has that too: the same
    /// operations, with 32 vector registers instead of 16, so the wider tiles keep their sums
    /// in registers; and the grouped layouts' integer sums in `vpdpbusd` where it also has
    /// AVX512-VNNI (the same exact sums, so the same bits). Otherwise the portable loop.
    Auto,
    /// The AVX2 + FMA kernel with 16 registers and no VNNI even where AVX-512 is there (to test
    /// and compare that path); the portable loop without AVX2.
    Avx2,
    /// The portable scalar loop, on any CPU.
    Scalar,
}

/// How a product is executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exec {
    pub isa: Isa,
    /// Split the output rows over the kernels' threads (for products large enough to pay).
    pub parallel: bool,
    /// The tile of a product of f32 rows stored in spans at 4 to 14 rows of `x` with
    /// [`Isa::Auto`] on a CPU with AVX-512; `None` (the default) picks it by timing the
    /// candidates on the product's shape ([`SpanTile`]). Every tile gives the same bits.
    pub span_tile: Option<SpanTile>,
}

impl Default for Exec {
    fn default() -> Self {
        Self {
            isa: Isa::Auto,
            parallel: true,
            span_tile: None,
        }
    }
}

/// The instruction set the products run on with [`Isa::Auto`] on this CPU: `AVX-512 with
/// VNNI`, `AVX-512`, `AVX2 + FMA` or `portable`. The tiles, and so the speed of each format
/// and row count, differ between them; reports name it beside their figures.
pub fn instruction_set() -> &'static str {
    avx2::instruction_set()
}

/// Runs `job(0)`, …, `job(parts - 1)` on the kernels' threads (the caller and helpers that spin
/// between jobs; sized like rayon's global pool) and returns when all are done. Meant for the
/// short parallel loops of a decode step besides the products, such as attention over heads.
pub fn run_parts(parts: usize, job: &(dyn Fn(usize) + Sync)) {
    team::Team::get().run(parts, job);
}

/// Whether [`Isa::Auto`] runs the AVX2 + FMA kernel on this CPU.
pub fn simd_available() -> bool {
    avx2::available()
}
