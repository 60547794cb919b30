//! What this machine allows a skinny product at all: the simplest AVX2 + FMA tiles over a
//! weight matrix of a model's size, with no packing, prefetch or helper threads, on both cores.
//! Each tile streams its weight rows once for every row of `x` (the rows of `x` sit in L1).
//!
//! Two modes, alternated round after round (the machine's speed drifts from minute to minute):
//! - `stream`: every weight row read from memory once, as a decode step or a verification does;
//! - `cached`: the tile's own weight rows read again and again from L1, the same arithmetic
//!   with no memory traffic: the arithmetic's own time (L2 for the 8 × 1 tile, whose 8 rows
//!   take 48 KB).
//!
//! If the two overlapped, forward(m) ÷ forward(1) would stay near 1 until the arithmetic took as
//! long as the streaming; where they add, it is 1 + cached(m) ÷ stream(1).
//!
//! `cargo run --release -p spec-kernels --example stream_ceiling [GB] [ROUNDS]` (default 6.1 GB,
//! Qwen2.5-Coder-1.5B's f32 weights, and 9 rounds, the first not counted).

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::time::Instant;

    use pulp::bytemuck::cast_slice;
    use pulp::x86::V3;
    use pulp::{NullaryFnOnce, Simd, f32x8};

    /// Inner dimension of every weight row (Qwen2.5-Coder-1.5B's hidden size).
    const K: usize = 1536;

    /// `RR` weight rows starting at `w` against `M` rows of `x`, `P` passes over the same weights
    /// (the second finding them in L1); returns the sum of the dot products.
    #[inline(always)]
    fn tile<const RR: usize, const M: usize, const P: usize>(
        simd: V3,
        w: &[f32x8],
        x: &[f32x8],
    ) -> f32 {
        let kv = K / 8;
        let mut total = 0.0;
        for pass in 0..P {
            let mut acc = [[simd.splat_f32x8(0.0); M]; RR];
            for c in 0..kv {
                let mut xv = [simd.splat_f32x8(0.0); M];
                for (i, xv) in xv.iter_mut().enumerate() {
                    *xv = x[(pass * M + i) * kv + c];
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = w[r * kv + c];
                    for (a, &xv) in acc.iter_mut().zip(&xv) {
                        *a = simd.mul_add_f32x8(wv, xv, *a);
                    }
                }
            }
            for acc in &acc {
                for &a in acc {
                    total += simd.reduce_sum_f32s(a);
                }
            }
        }
        total
    }

    struct Sweep<'a, const RR: usize, const M: usize, const P: usize> {
        simd: V3,
        w: &'a [f32x8],
        x: &'a [f32x8],
        cached: bool,
    }

    impl<const RR: usize, const M: usize, const P: usize> NullaryFnOnce for Sweep<'_, RR, M, P> {
        type Output = f32;

        #[inline(always)]
        fn call(self) -> f32 {
            let kv = K / 8;
            let groups = self.w.len() / (RR * kv);
            let mut total = 0.0;
            for g in 0..groups {
                let at = if self.cached { 0 } else { g * RR * kv };
                total += tile::<RR, M, P>(self.simd, &self.w[at..at + RR * kv], self.x);
            }
            total
        }
    }

    /// Milliseconds of one sweep over `w`, its two halves on two threads.
    fn time<const RR: usize, const M: usize, const P: usize>(
        simd: V3,
        w: &[f32x8],
        x: &[f32x8],
        cached: bool,
    ) -> f64 {
        let start = Instant::now();
        let (a, b) = w.split_at(w.len() / 2);
        let sum = std::thread::scope(|s| {
            let other = s.spawn(move || {
                simd.vectorize(Sweep::<RR, M, P> {
                    simd,
                    w: a,
                    x,
                    cached,
                })
            });
            let mine = simd.vectorize(Sweep::<RR, M, P> {
                simd,
                w: b,
                x,
                cached,
            });
            // A time without the other half would mislead: its panic is the probe's own.
            match other.join() {
                Ok(theirs) => mine + theirs,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        });
        std::hint::black_box(sum);
        start.elapsed().as_secs_f64() * 1e3
    }

    /// The tiles timed: rows of `x`, name, and one sweep in a mode.
    type Case = (usize, &'static str, fn(V3, &[f32x8], &[f32x8], bool) -> f64);

    const CASES: [Case; 6] = [
        (1, "8 × 1", time::<8, 1, 1>),
        (2, "4 × 2", time::<4, 2, 1>),
        (2, "8 × 1, 2 passes", time::<8, 1, 2>),
        (4, "2 × 4", time::<2, 4, 1>),
        (8, "2 × 4, 2 passes", time::<2, 4, 2>),
        (8, "1 × 8", time::<1, 8, 1>),
    ];

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    pub(crate) fn main() {
        let Some(simd) = V3::try_new() else {
            eprintln!("stream_ceiling: this CPU has no AVX2 + FMA");
            return;
        };
        let mut args = std::env::args().skip(1);
        let gb: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(6.1);
        let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(9).max(2);
        // Whole groups of 8 rows of K weights, so every tile divides both halves.
        let rows = ((gb * 1e9 / 4.0 / K as f64) as usize / 16 * 16).max(16);
        let w: Vec<f32> = (0..rows * K).map(|i| (i % 7) as f32 * 0.01).collect();
        let x: Vec<f32> = (0..16 * K).map(|i| (i % 5) as f32 * 0.01).collect();
        let (w, x): (&[f32x8], &[f32x8]) = (cast_slice(&w), cast_slice(&x));
        println!(
            "{rows} weight rows of {K} f32 ({:.2} GB), {} rounds after a warm-up round",
            (rows * K * 4) as f64 / 1e9,
            rounds - 1
        );
        let mut ms = vec![[Vec::new(), Vec::new()]; CASES.len()];
        for round in 0..rounds {
            for (case, times) in CASES.iter().zip(&mut ms) {
                for (mode, cached) in [false, true].into_iter().enumerate() {
                    let t = (case.2)(simd, w, x, cached);
                    if round > 0 {
                        times[mode].push(t);
                    }
                }
            }
        }
        // Ratios within each round, to the one-row stream of the same round.
        let base: Vec<f64> = ms[0][0].clone();
        println!(
            "| rows | tile | stream ms | stream ÷ stream(1) | cached ms | 1 + cached ÷ stream(1) |"
        );
        println!("|---|---|---|---|---|---|");
        for (case, times) in CASES.iter().zip(&ms) {
            let ratio = |mode: usize| -> Vec<f64> {
                times[mode].iter().zip(&base).map(|(t, b)| t / b).collect()
            };
            println!(
                "| {} | {} | {:.1} | {:.2} | {:.1} | {:.2} |",
                case.0,
                case.1,
                median(times[0].clone()),
                median(ratio(0)),
                median(times[1].clone()),
                1.0 + median(ratio(1)),
            );
        }
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    imp::main();
    #[cfg(not(target_arch = "x86_64"))]
    eprintln!("stream_ceiling: x86-64 only (AVX2 + FMA)");
}
