//! AVX512-VNNI for the grouped layouts: `vpdpbusd` ([`Vnni`]), the target features its tiles
//! are compiled with ([`V4Vnni`]), the tile of a panel's two rows side by side in 16 lanes
//! ([`paired_grouped_tile`]) and a job per row count ([`VnniJob`]).

use core::arch::x86_64::{__m256i, __m512i};
use pulp::bytemuck::cast_slice;
use pulp::core_arch::x86::Avx512vnni;
use pulp::x86::{V3, V4};
use pulp::{NullaryFnOnce, cast, f32x8};

use crate::pack::{BLOCK, GROUP, PANEL};

use super::Product;
use super::grouped::{GroupRow, IntDot, grouped_sweep};
use super::hints::Hint;
use super::int8::Int8Row;
use super::wide_spans::{pair_halves, split_halves};

/// AVX512-VNNI's `vpdpbusd` (unsigned by signed bytes, 4 a lane, into 32 bits without
/// saturation): a group's stored quants `q + 128` times `x` in one instruction, no sign
/// juggling (the 128 · Σ x it adds is taken off by starting from the group's offsets).
#[derive(Clone, Copy)]
pub(super) struct Vnni(Avx512vnni, V4);

impl Vnni {
    #[inline(always)]
    #[allow(unsafe_code)]
    fn dpbusd(self, acc: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i {
        let Vnni(_proof, _) = self;
        // SAFETY: an `Avx512vnni` exists only where the CPU has AVX512-VNNI and AVX512-VL
        // (`Avx512vnni::try_new` detects both), the features this intrinsic needs; it reads
        // no memory. pulp wraps no VNNI instruction, hence this one call of our own.
        unsafe { core::arch::x86_64::_mm256_dpbusd_epi32(acc, unsigned, signed) }
    }

    /// [`Vnni::dpbusd`] on 16 lanes.
    #[inline(always)]
    #[allow(unsafe_code)]
    fn dpbusd_pair(self, acc: __m512i, unsigned: __m512i, signed: __m512i) -> __m512i {
        let Vnni(_proof, _) = self;
        // SAFETY: as for `dpbusd`; `V4` (AVX512F), which this intrinsic also needs, is
        // detected with it (`vnni`).
        unsafe { core::arch::x86_64::_mm512_dpbusd_epi32(acc, unsigned, signed) }
    }
}

impl IntDot for Vnni {
    const BIASED: bool = true;
    type Unit = __m256i;

    #[inline(always)]
    fn unit(self, _simd: V3, stored: __m256i) -> __m256i {
        stored
    }

    #[inline(always)]
    fn group_dot(self, _simd: V3, acc: __m256i, unit: __m256i, x: __m256i) -> __m256i {
        self.dpbusd(acc, unit, x)
    }

    #[inline(always)]
    fn dot(self, _simd: V3, acc: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i {
        self.dpbusd(acc, unsigned, signed)
    }

    #[inline(always)]
    fn paired(self) -> Option<Vnni> {
        Some(self)
    }
}

/// The context and the instruction the grouped tiles take `vpdpbusd` in, where the CPU
/// has AVX512-VNNI (with AVX-512's F, BW, CD, DQ and VL): what [`run`] dispatches on and
/// [`instruction_set`] reports.
///
/// [`run`]: super::run
/// [`instruction_set`]: super::instruction_set
pub(super) fn vnni() -> Option<(V4Vnni, Vnni)> {
    Some((
        V4Vnni::try_new()?,
        Vnni(Avx512vnni::try_new()?, V4::try_new()?),
    ))
}

pulp::simd_type! {
    /// `V4` with AVX512-VNNI: the target features [`Vnni`]'s tiles are compiled with, so
    /// that its intrinsic is inlined into them.
    pub(super) struct V4Vnni {
        pub sse: "sse",
        pub sse2: "sse2",
        pub fxsr: "fxsr",
        pub sse3: "sse3",
        pub ssse3: "ssse3",
        pub sse4_1: "sse4.1",
        pub sse4_2: "sse4.2",
        pub popcnt: "popcnt",
        pub avx: "avx",
        pub avx2: "avx2",
        pub bmi1: "bmi1",
        pub bmi2: "bmi2",
        pub fma: "fma",
        pub lzcnt: "lzcnt",
        pub avx512f: "avx512f",
        pub avx512bw: "avx512bw",
        pub avx512cd: "avx512cd",
        pub avx512dq: "avx512dq",
        pub avx512vl: "avx512vl",
        pub avx512vnni: "avx512vnni",
    }
}

/// `grouped::tile_grouped`'s groups for one panel's two rows side by side in 16-lane vectors:
/// lanes 0-7 hold row 0's sums, lanes 8-15 row 1's, and each unit of `x` is broadcast to
/// both halves, so one `vpdpbusd` on 16 lanes does what two on 8 lanes do (exact integer
/// sums), and the f32 scaling is lane for lane the same multiply and multiply-add: the
/// same bits in half the instructions. Q8_0's blocks after the last whole group go the
/// same way ([`GroupRow::pair_tail`]), each 32-bit lane of a block's sums starting from
/// `−128 ·` the 4 values of `x` it multiplies. Returns each row's accumulators, for
/// `grouped::finish_grouped`, and the first block left to it.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) fn paired_grouped_tile<W: GroupRow, const M: usize>(
    simd: V3,
    vnni: Vnni,
    hint: Hint,
    rows: &[W; PANEL],
    xs: &[Int8Row<'_>; M],
    blocks: usize,
) -> ([[f32x8; M]; PANEL], usize) {
    let v4 = vnni.1;
    let (f, dq) = (v4.avx512f, v4.avx512dq);
    let mut acc = [f._mm512_setzero_ps(); M];
    let groups = blocks / GROUP;
    let quads = 2 / W::SEGMENTS;
    for g in 0..groups {
        rows[0].prefetch(simd, hint, g);
        let mut x_units = [&[[0i8; BLOCK]; GROUP]; M];
        for i in 0..M {
            x_units[i] = &xs[i].quants.as_chunks::<GROUP>().0[g];
        }
        for seg in 0..W::SEGMENTS {
            let mut sums = [f._mm512_setzero_si512(); M];
            for i in 0..M {
                let start = W::start(simd, &xs[i], g, seg, Vnni::BIASED);
                sums[i] = f._mm512_broadcast_i64x4(start);
            }
            for quad in 0..quads {
                let q = seg * quads + quad;
                let pair = W::pair_quad(*rows, simd, v4, g, q);
                for (u, &w) in pair.iter().enumerate() {
                    let t = 4 * q + u;
                    for i in 0..M {
                        let x = f._mm512_broadcast_i64x4(cast(x_units[i][t]));
                        sums[i] = vnni.dpbusd_pair(sums[i], w, x);
                    }
                }
            }
            let scales = pair_halves(
                v4,
                rows[0].scales(simd, g, seg),
                rows[1].scales(simd, g, seg),
            );
            for i in 0..M {
                let steps: f32x8 = cast(xs[i].steps.as_chunks::<GROUP>().0[g]);
                let steps = dq._mm512_broadcast_f32x8(cast(steps));
                acc[i] = f._mm512_fmadd_ps(
                    f._mm512_cvtepi32_ps(sums[i]),
                    f._mm512_mul_ps(scales, steps),
                    acc[i],
                );
            }
        }
    }
    let mut tail_from = groups * GROUP;
    if tail_from < blocks {
        rows[0].prefetch(simd, hint, groups);
        // Unsigned bytes of 128: `vpdpbusd` of these by `x` is what the stored quants'
        // offset adds to each lane, taken off first.
        let offset = f._mm512_set1_epi8(i8::MIN);
        let zero = f._mm512_setzero_si512();
        while tail_from < blocks {
            let Some((w, [low, high])) = W::pair_tail(*rows, tail_from) else {
                break;
            };
            let scales = pair_halves(v4, simd.splat_f32x8(low), simd.splat_f32x8(high));
            for i in 0..M {
                let x = f._mm512_broadcast_i64x4(cast(xs[i].quants[tail_from]));
                let start = f._mm512_sub_epi32(zero, vnni.dpbusd_pair(zero, offset, x));
                // Lane for lane [`finish_grouped`]'s sums (exact) and its f32 operations.
                let sums = vnni.dpbusd_pair(start, w, x);
                let steps = f._mm512_set1_ps(xs[i].steps[tail_from]);
                acc[i] = f._mm512_fmadd_ps(
                    f._mm512_cvtepi32_ps(sums),
                    f._mm512_mul_ps(scales, steps),
                    acc[i],
                );
            }
            tail_from += 1;
        }
    }
    let mut out = [[simd.splat_f32x8(0.0); M]; PANEL];
    for i in 0..M {
        (out[0][i], out[1][i]) = split_halves(v4, acc[i]);
    }
    (out, tail_from)
}

/// [`grouped_sweep`] with `vpdpbusd` for `M` rows of `x` (1 to [`GROUPED_JOB_MAX_ROWS`]),
/// run inside [`V4Vnni`]: a job of its own, so that neither the other layouts' tiles nor
/// the other row counts' are compiled into its function.
///
/// [`GROUPED_JOB_MAX_ROWS`]: super::GROUPED_JOB_MAX_ROWS
pub(super) struct VnniJob<'a, 'b, const M: usize> {
    pub(super) simd: V3,
    pub(super) vnni: Vnni,
    pub(super) product: Product<'a, 'b>,
}

impl<const M: usize> NullaryFnOnce for VnniJob<'_, '_, M> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let VnniJob {
            simd,
            vnni,
            product:
                Product {
                    mat,
                    rows,
                    x,
                    int8,
                    first,
                    m,
                    outs,
                },
        } = self;
        grouped_sweep::<_, M>(simd, vnni, mat, rows, cast_slice(x), int8, first, m, outs);
    }
}
