//! Q4_K superblocks kept as they are against the same weights in the per-block Q4 layout, both
//! `q4-a8`, over a reference model's products of one pass (those whose rows are whole
//! superblocks), alternated round by round in one process, at several row counts.
//!
//! `cargo run --release -p spec-kernels --example q4k_layouts [MODEL] [ROWS] [ROUNDS]`:
//! MODEL a reference model's name (default `qwen2.5-coder-1.5b`), ROWS a list such as
//! `1,2,5,8` (default), ROUNDS 12 after a warm-up round. Prints each layout's stored bytes, its
//! median time a pass at each row count, and the median of the per-round ratios.

use std::error::Error;
use std::time::Instant;

use spec_kernels::{PackedMatrix, Q4Superblock, SUPERBLOCK, WeightFormat};

#[path = "../benches/common/models.rs"]
mod models;

use models::{MODELS, ReferenceModel};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Superblocks with checkpoint-like fields from a cheap hash of their index (the values do not
/// change the time; their layout does).
fn superblocks(count: usize, seed: usize) -> Vec<Q4Superblock> {
    let hash = |i: usize| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 29) as u32;
    (0..count)
        .map(|s| {
            let base = (seed + s) * 300;
            Q4Superblock {
                scale: 1e-3 * (1 + hash(base) % 7) as f32,
                min_scale: 1e-3 * (1 + hash(base + 1) % 5) as f32,
                scales: std::array::from_fn(|j| (hash(base + 2 + j) % 64) as u8),
                mins: std::array::from_fn(|j| (hash(base + 10 + j) % 64) as u8),
                quants: std::array::from_fn(|e| (hash(base + 20 + e) % 16) as u8),
            }
        })
        .collect()
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().map_or("qwen2.5-coder-1.5b", String::as_str);
    let rows: Vec<usize> = args
        .get(1)
        .map_or("1,2,5,8", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let rounds: usize = args.get(2).map_or(Ok(12), |a| a.parse())?;
    let Some(reference) = ReferenceModel::by_name(model) else {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        return Err(format!("unknown model {model:?}: one of {names:?}").into());
    };
    if rows.iter().any(|&m| m == 0 || m > 16) || rounds == 0 {
        return Err("rows must be 1..=16 and rounds at least 1".into());
    }

    // (per-block layout, superblocks kept) for each product whose rows are whole superblocks.
    let mut pairs = Vec::new();
    for (i, (_, n, k)) in reference.pass_products().into_iter().enumerate() {
        if !k.is_multiple_of(SUPERBLOCK) {
            continue;
        }
        let blocks = superblocks(n * k / SUPERBLOCK, i * 1000);
        let weights: Vec<f32> = blocks.iter().flat_map(Q4Superblock::dequantize).collect();
        let per_block = PackedMatrix::pack(&weights, n, k, WeightFormat::Q4A8)?;
        let kept = PackedMatrix::pack_q4_superblocks(&blocks, n, k, WeightFormat::Q4A8)?;
        if per_block.format() != WeightFormat::Q4A8 {
            return Err("the per-block layout did not hold the superblocks' weights".into());
        }
        pairs.push([per_block, kept]);
    }
    let bytes = |l: usize| pairs.iter().map(|p| p[l].stored_bytes()).sum::<usize>() as f64 / 1e9;
    println!(
        "{model}: {} products; per-block layout {:.3} GB, superblocks kept {:.3} GB",
        pairs.len(),
        bytes(0),
        bytes(1)
    );

    let widest = pairs
        .iter()
        .map(|p| p[0].rows().max(p[0].cols()))
        .max()
        .unwrap_or(0);
    let x: Vec<f32> = (0..16 * widest)
        .map(|i| ((i * 37) % 11) as f32 * 0.01 - 0.05)
        .collect();
    let mut y = vec![0.0f32; 16 * widest];
    // times[row count][layout][round]
    let mut times = vec![[Vec::new(), Vec::new()]; rows.len()];
    for round in 0..=rounds {
        for (t, &m) in rows.iter().enumerate() {
            // Alternate which layout goes first, so neither always follows the other.
            for l in [round % 2, 1 - round % 2] {
                let start = Instant::now();
                for p in &pairs {
                    let mat = &p[l];
                    let (n, k) = (mat.rows(), mat.cols());
                    mat.matmul_into(&x[..m * k], m, &mut y[..m * n])?;
                }
                if round > 0 {
                    times[t][l].push(start.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
    }
    println!("| rows | per-block ms | kept ms | kept ÷ per-block (median of rounds) |");
    println!("|---|---|---|---|");
    for (t, &m) in rows.iter().enumerate() {
        let ratio = median(
            times[t][1]
                .iter()
                .zip(&times[t][0])
                .map(|(a, b)| a / b)
                .collect(),
        );
        println!(
            "| {m} | {:.1} | {:.1} | {ratio:.3} |",
            median(times[t][0].clone()),
            median(times[t][1].clone())
        );
    }
    Ok(())
}
