//! One f32 product small enough to stay in L2, run over and over on one thread: how fast the
//! tiles themselves go at each row count when memory is not what they wait on. Next to
//! `model_products` (the same tiles with the weights streamed from memory) it tells a tile that
//! issues too slowly from one that waits on memory. On a Zen 5 at 2c5975c a 9-row product of the
//! one-panel 16-lane tile runs at 25–31 GB/s here, no faster than one core streams weights from
//! memory at the machine's faster moments (~32 GB/s: the 1.5B's one-row products in 97 ms on two
//! cores), so that tile's time at 9 rows does not shrink when memory gets faster.
//!
//! `cargo run --release -p spec-kernels --example hot_product [ROWS_OUT] [INPUTS] [ROWS] [REPS]
//! [THREADS] [FORMAT]`: an output-rows × inputs matrix (default 32 × 1536, 196 KB in f32: a slice
//! of the 1.5B's projections), ROWS a list of row counts of `x` (default `1,9`; each 1..=16), REPS
//! products a measurement (default 6000); three rounds, each row count in turn. FORMAT is a
//! weight format as `spec --weights` names it (default `f32`; `q8_0-a8` times the integer tiles,
//! the rounding of `x` to int8 included). Prints GB/s of the weights as stored, each row count's
//! time against the first's, and what the f32 rate (one thread's on both cores) would take for
//! the 1.5B's 6.17 GB.
//! THREADS `all` splits each product over the machine's threads as the models' products are:
//! with a matrix far larger than the caches (200000 × 1536, 1.2 GB) that is the weights
//! streamed from memory by every core, one product instead of the model's 113.

use std::error::Error;
use std::time::Instant;

use spec_kernels::{Exec, Isa, PackedMatrix, WeightFormat};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: usize| -> Result<usize, Box<dyn Error>> {
        Ok(args.get(i).map_or(Ok(default), |a| a.parse())?)
    };
    let (n, k) = (arg(0, 32)?, arg(1, 1536)?);
    let rows: Vec<usize> = args
        .get(2)
        .map_or("1,9", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let reps = arg(3, 6000)?;
    let parallel = match args.get(4).map(String::as_str) {
        None | Some("1") => false,
        Some("all") => true,
        Some(other) => return Err(format!("THREADS is 1 or all, not {other}").into()),
    };
    let format: WeightFormat = args.get(5).map_or("f32", String::as_str).parse()?;
    if n == 0 || k == 0 || reps == 0 || rows.iter().any(|&m| m == 0 || m > 16) {
        return Err("sizes and reps must be positive, rows 1..=16".into());
    }
    let raw: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 16) as f32 * 0.01 - 0.08)
        .collect();
    let mat = PackedMatrix::pack(&raw, n, k, format)?;
    let stored = mat.stored_bytes();
    let x: Vec<f32> = (0..16 * k).map(|i| (i % 5) as f32 * 0.01 - 0.02).collect();
    let mut y = vec![0.0f32; 16 * n];
    let exec = Exec {
        isa: Isa::Auto,
        parallel,
        span_tile: None,
    };
    println!(
        "{n} × {k} {format:?} ({:.0} KB stored), {}, kernels {}",
        stored as f64 / 1e3,
        if parallel {
            "all threads"
        } else {
            "one thread"
        },
        spec_kernels::instruction_set()
    );
    for round in 0..3 {
        let mut first = None;
        for &m in &rows {
            let start = Instant::now();
            for _ in 0..reps {
                mat.matmul_with(&x[..m * k], m, &mut y[..m * n], exec)?;
            }
            let seconds = start.elapsed().as_secs_f64();
            let first = *first.get_or_insert(seconds);
            let rate = (stored * reps) as f64 / seconds;
            // One thread's rate is doubled for the two cores; all threads' is the machine's.
            let cores = if parallel { 1.0 } else { 2.0 };
            let f32_rate = rate * (n * k * 4) as f64 / stored as f64;
            println!(
                "round {round}, {m} rows: {:.1} GB/s ({:.2}× the first row count's time), \
                 {:.1} ms for 6.17 GB of f32 on two cores",
                rate / 1e9,
                seconds / first,
                6.17e9 / (cores * f32_rate) * 1e3
            );
        }
    }
    Ok(())
}
