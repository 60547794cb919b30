//! How tiles ask for their weights ahead of use: the prefetch instruction this CPU takes
//! ([`Hint`]), how far ahead, and from how many rows of `x` on.

use pulp::x86::V3;

use crate::pack::PANEL;

use super::rows::Row;

/// How far ahead of a tile its panels' weights are asked for: 4 KB of each panel. Measured
/// on a 1.5B-sized product streamed from memory by both cores (docs/benchmarks.md at 720c219,
/// "Q8_0 quants in order, prefetch 4 KB ahead"): Q8_0 at one row 1.9 → 1.2 ms and bf16
/// 2.4–2.9 → 2.2–2.3 ms against 8 blocks ahead for tiles of two or more rows only; 0.5–2 KB
/// ahead was too little for the narrow formats, whose tiles consume few bytes per cycle, to
/// cover memory latency.
pub(super) const PREFETCH_AHEAD_BYTES: usize = 4096;

/// How far ahead the grouped tiles (`grouped::tile_grouped`) ask for their panels' weights: 8 KB
/// of each panel. Measured with these hints into L2 (`T1`) against 4 KB into L1, on a
/// 1.5B-sized product streamed from memory by both cores: 1536 × 8960 at 4 rows 66 → 101 G
/// multiply-adds a second, 8960 × 1536 105 → 122, one row 29 → 37 and 33 → 38
/// (docs/benchmarks.md at 4a6a8de, "One tile of all the rows, a job per row count"). The
/// instruction is the CPU vendor's ([`weights_hint_non_temporal`]).
pub(super) const GROUPED_PREFETCH_AHEAD_BYTES: usize = 8192;

/// How tiles hint their weights, chosen once a process by the CPU's vendor
/// ([`weights_hint_non_temporal`]).
///
/// On AMD, non-temporal (`prefetchnta`). A decode step reads each weight once, and weights
/// hinted into L1 or L2 (`T0`, `T1`) are written back into L2 and AMD's victim L3 on
/// eviction, pushing out what the next product and the next step read again (the KV
/// cache, the rows of `x`, the outputs); AMD describes a non-temporal prefetch that misses
/// L2 as filling L1 alone, dropped on eviction (its K8 guide). Against `T0` / `T1` on the
/// Zen 5 (`spec bench-forward`, alternated builds, docs/benchmarks.md at 42b0690, "weights
/// prefetched non-temporal"; docs/notes/cpu-kernels.md, "Prefetch hints"): SmolLM2 in
/// `q8_0-a8` one row 3.69 → 3.48 ms, the 0.5B one row 12.5 → 11.7 ms; the 1.5B in f32 (hints
/// from 3 rows on) level.
///
/// Elsewhere into L1 (`prefetcht0`): on an Intel Xeon (family 6, model 207) non-temporal
/// hints took the 0.5B's one-row pass in `q8_0-a8` from 31-34 ms to 50-62 ms and the 1.5B's
/// 9-row pass in f32 from 1.05-1.10 of a one-row pass to 2.46 (docs/notes/cpu-kernels.md,
/// "Prefetch hints"; docs/benchmarks.md at 0139f5c, "non-temporal weight hints starve the
/// streams"): Intel's non-temporal prefetch fills L1 without the L2 streamer's help, and a
/// core's few L1 fill buffers then bound the bytes in flight.
fn weights_hint_non_temporal() -> bool {
    static NON_TEMPORAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NON_TEMPORAL.get_or_init(|| {
        // The vendor's name, "AuthenticAMD", in EBX, EDX, ECX.
        let vendor = core::arch::x86_64::__cpuid(0);
        let word = |name: &[u8; 4]| u32::from_le_bytes(*name);
        (vendor.ebx, vendor.edx, vendor.ecx) == (word(b"Auth"), word(b"enti"), word(b"cAMD"))
    })
}

/// Whether a tile of `rows` rows of `x` over weight rows `W` hints its weights ahead.
/// Non-temporal hints (AMD) pay only from [`Row::NON_TEMPORAL_FROM_ROWS`]; hints into L1
/// or L2 ([`SpanRow::hint`]) from one row. Into L1, against none: on the Intel Xeon
/// (family 6, model 207) f32 passes of one row took 312-319 ms against 334-377 ms unhinted
/// for the 1.5B (whose spans hint into L2), 22-28 ms against 27-33 ms for SmolLM2
/// (`spec bench-forward`, alternated, docs/benchmarks.md at abb6088, "f32 tiles hint their
/// weights from one row").
///
/// [`SpanRow::hint`]: super::rows::SpanRow::hint
#[inline(always)]
pub(super) fn hints_weights<W: Row>(hint: Hint, rows: usize) -> bool {
    matches!(hint, Hint::IntoL1 | Hint::IntoL2) || rows >= W::NON_TEMPORAL_FROM_ROWS
}

/// The instruction a tile hints its weights with ([`weights_hint_non_temporal`]), looked
/// up once a tile, outside its loops: looked up at each hint, the lookup's first-use path
/// (a call) stays in the loops, which then keep their sums on the stack across it; so the
/// one-row `q8_0-a8` group loop took 186 instructions against 80, and on the Intel Xeon
/// (family 6, model 207) ran 26.8 against 37.7 GB/s held in L2 (docs/notes/cpu-kernels.md,
/// "Prefetch hints").
#[derive(Clone, Copy)]
pub(super) enum Hint {
    /// `prefetchnta` (AMD).
    NonTemporal,
    /// `prefetcht0` (elsewhere).
    IntoL1,
    /// `prefetcht1`: f32 rows in spans ([`SpanRow::hint`]).
    ///
    /// [`SpanRow::hint`]: super::rows::SpanRow::hint
    IntoL2,
}

impl Hint {
    #[inline(always)]
    pub(super) fn of_cpu() -> Hint {
        if weights_hint_non_temporal() {
            Hint::NonTemporal
        } else {
            Hint::IntoL1
        }
    }
}

/// Hints the cache lines of the `bytes` bytes from `start` with `hint`'s instruction. Only
/// an address: nothing is read, so a hint past the end of the weights is harmless.
#[inline(always)]
pub(super) fn prefetch_lines(simd: V3, hint: Hint, start: *const u8, bytes: usize) {
    use core::arch::x86_64::{_MM_HINT_NTA, _MM_HINT_T0, _MM_HINT_T1};
    let lines = (0..bytes)
        .step_by(64)
        .map(|line| start.wrapping_add(line).cast());
    match hint {
        Hint::NonTemporal => lines.for_each(|a| simd.sse._mm_prefetch::<_MM_HINT_NTA>(a)),
        Hint::IntoL1 => lines.for_each(|a| simd.sse._mm_prefetch::<_MM_HINT_T0>(a)),
        Hint::IntoL2 => lines.for_each(|a| simd.sse._mm_prefetch::<_MM_HINT_T1>(a)),
    }
}

/// Asks for block `b` of a quantized panel: its quants (`PANEL` units of `Q` a block) and,
/// once a cache line, its per-block scales (`PANEL` units of `S` a block; Q8_0's 8 bytes a
/// block fill a line every 8 blocks, Q4's 16 bytes every 4).
#[inline(always)]
pub(super) fn prefetch_quantized<Q, S>(simd: V3, hint: Hint, quants: &[Q], side: &[S], b: usize) {
    prefetch_lines(
        simd,
        hint,
        quants.as_ptr().wrapping_add(b * PANEL).cast(),
        PANEL * size_of::<Q>(),
    );
    let blocks_a_line = (64 / (PANEL * size_of::<S>())).max(1);
    if b.is_multiple_of(blocks_a_line) {
        prefetch_lines(simd, hint, side.as_ptr().wrapping_add(b * PANEL).cast(), 64);
    }
}
