//! The AVX2 + FMA kernel (x86-64, through `pulp`'s safe intrinsics; detected at run time).
//!
//! Every format presents a weight row as blocks of 32 weights widened to four f32 vectors, so one
//! register tile serves all three: `R` weight rows × `MR` rows of `x`, each pair accumulating an
//! 8-lane partial dot product, reduced once at the end of the row.

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::ops::Range;

    use pulp::bytemuck::cast_slice;
    use pulp::x86::V3;
    use pulp::{NullaryFnOnce, Simd, cast, f32x8, i32x8, u32x8};

    use crate::pack::{BLOCK, PackedMatrix, Storage};

    /// Weight rows a tile holds.
    const R: usize = 4;
    /// Rows of `x` a tile holds (the tail of `m` runs with fewer).
    const MR: usize = 2;

    pub(crate) fn available() -> bool {
        V3::is_available()
    }

    /// A weight row as 32-weight blocks the tile can widen to f32.
    trait Row: Copy {
        fn block(self, simd: V3, b: usize) -> [f32x8; 4];
    }

    #[derive(Clone, Copy)]
    struct F32Row<'a>(&'a [[f32x8; 4]]);

    impl Row for F32Row<'_> {
        #[inline(always)]
        fn block(self, _simd: V3, b: usize) -> [f32x8; 4] {
            self.0[b]
        }
    }

    #[derive(Clone, Copy)]
    struct Bf16Row<'a>(&'a [[u32x8; 2]]);

    impl Row for Bf16Row<'_> {
        #[inline(always)]
        fn block(self, simd: V3, b: usize) -> [f32x8; 4] {
            let [w0, w1] = self.0[b];
            let mask = simd.splat_u32x8(0xFFFF_0000);
            // High halves are weights 0..8 of each 16-chunk, low halves 8..16.
            [
                cast(simd.and_u32x8(w0, mask)),
                cast(simd.shl_const_u32x8::<16>(w0)),
                cast(simd.and_u32x8(w1, mask)),
                cast(simd.shl_const_u32x8::<16>(w1)),
            ]
        }
    }

    #[derive(Clone, Copy)]
    struct Q8Row<'a> {
        quants: &'a [i32x8],
        scales: &'a [f32],
    }

    impl Row for Q8Row<'_> {
        #[inline(always)]
        fn block(self, simd: V3, b: usize) -> [f32x8; 4] {
            let w = self.quants[b];
            let scale = simd.splat_f32x8(self.scales[b]);
            // Byte j of every lane is the quant of weight 8j + lane: sign-extend it in place.
            let q: [i32x8; 4] = [
                simd.shr_const_i32x8::<24>(simd.shl_const_i32x8::<24>(w)),
                simd.shr_const_i32x8::<24>(simd.shl_const_i32x8::<16>(w)),
                simd.shr_const_i32x8::<24>(simd.shl_const_i32x8::<8>(w)),
                simd.shr_const_i32x8::<24>(w),
            ];
            q.map(|q| simd.mul_f32x8(simd.convert_i32x8_to_f32x8(q), scale))
        }
    }

    /// The dot products of `rows` with `xs`, `out[r][i] = rows[r] · xs[i]`.
    #[inline(always)]
    fn tile<W: Row, const RR: usize, const M: usize>(
        simd: V3,
        rows: [W; RR],
        xs: [&[[f32x8; 4]]; M],
        blocks: usize,
    ) -> [[f32; M]; RR] {
        let zero = simd.splat_f32x8(0.0);
        let mut acc = [[zero; M]; RR];
        for b in 0..blocks {
            let xb: [[f32x8; 4]; M] = xs.map(|x| x[b]);
            for r in 0..RR {
                let w = rows[r].block(simd, b);
                for i in 0..M {
                    let mut a = acc[r][i];
                    for j in 0..4 {
                        a = simd.mul_add_f32x8(w[j], xb[i][j], a);
                    }
                    acc[r][i] = a;
                }
            }
        }
        acc.map(|row| row.map(|a| simd.reduce_sum_f32s(a)))
    }

    /// Runs the tiles over weight rows `rows` for every row of `x`.
    #[inline(always)]
    fn sweep<W: Row>(
        simd: V3,
        row: impl Fn(usize) -> W,
        rows: Range<usize>,
        x: &[[f32x8; 4]],
        blocks: usize,
        m: usize,
        outs: &mut [&mut [f32]],
    ) {
        let x_row = |i: usize| &x[i * blocks..(i + 1) * blocks];
        let start = rows.start;
        let mut r = rows.start;
        while r < rows.end {
            if rows.end - r >= R {
                let ws: [W; R] = std::array::from_fn(|t| row(r + t));
                let mut i = 0;
                while i + MR <= m {
                    let out = tile(simd, ws, [x_row(i), x_row(i + 1)], blocks);
                    for (t, o) in out.iter().enumerate() {
                        outs[i][r - start + t] = o[0];
                        outs[i + 1][r - start + t] = o[1];
                    }
                    i += MR;
                }
                if i < m {
                    let out = tile(simd, ws, [x_row(i)], blocks);
                    for (t, o) in out.iter().enumerate() {
                        outs[i][r - start + t] = o[0];
                    }
                }
                r += R;
            } else {
                let ws = [row(r)];
                for (i, out_row) in outs.iter_mut().enumerate().take(m) {
                    let out = tile(simd, ws, [x_row(i)], blocks);
                    out_row[r - start] = out[0][0];
                }
                r += 1;
            }
        }
    }

    struct Job<'a, 'b> {
        simd: V3,
        mat: &'a PackedMatrix,
        rows: Range<usize>,
        x: &'a [f32],
        m: usize,
        outs: &'a mut [&'b mut [f32]],
    }

    impl NullaryFnOnce for Job<'_, '_> {
        type Output = ();

        #[inline(always)]
        fn call(self) {
            let Job {
                simd,
                mat,
                rows,
                x,
                m,
                outs,
            } = self;
            let kp = mat.padded_cols();
            let blocks = kp / BLOCK;
            let x: &[[f32x8; 4]] = cast_slice(x);
            match &mat.storage {
                Storage::F32(w) => {
                    let w: &[[f32x8; 4]] = cast_slice(w);
                    let row = |r: usize| F32Row(&w[r * blocks..(r + 1) * blocks]);
                    sweep(simd, row, rows, x, blocks, m, outs);
                }
                Storage::Bf16(w) => {
                    let w: &[[u32x8; 2]] = cast_slice(w);
                    let row = |r: usize| Bf16Row(&w[r * blocks..(r + 1) * blocks]);
                    sweep(simd, row, rows, x, blocks, m, outs);
                }
                Storage::Q8_0 { quants, scales } => {
                    let quants: &[i32x8] = cast_slice(quants);
                    let row = |r: usize| Q8Row {
                        quants: &quants[r * blocks..(r + 1) * blocks],
                        scales: &scales[r * blocks..(r + 1) * blocks],
                    };
                    sweep(simd, row, rows, x, blocks, m, outs);
                }
            }
        }
    }

    /// `outs[i][r - rows.start] = x[i] · W[r]`; `x` is `[m, padded_cols]`.
    pub(crate) fn run(
        mat: &PackedMatrix,
        rows: Range<usize>,
        x: &[f32],
        m: usize,
        outs: &mut [&mut [f32]],
    ) {
        match V3::try_new() {
            Some(simd) => simd.vectorize(Job {
                simd,
                mat,
                rows,
                x,
                m,
                outs,
            }),
            None => crate::scalar::run(mat, rows, x, m, outs),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use std::ops::Range;

    use crate::pack::PackedMatrix;

    pub(crate) fn available() -> bool {
        false
    }

    pub(crate) fn run(
        mat: &PackedMatrix,
        rows: Range<usize>,
        x: &[f32],
        m: usize,
        outs: &mut [&mut [f32]],
    ) {
        crate::scalar::run(mat, rows, x, m, outs);
    }
}

pub(crate) use imp::{available, run};
