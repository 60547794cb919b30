//! A GGUF model's projections packed in `q4-a8` two ways, alternated round by round in one
//! process at several row counts: per block of 32 (Q4_K matrices as Q4 blocks with an f32 scale
//! and minimum, Q6_K ones rounded to Q8_0, `x` rounded a block at a time) and as the
//! checkpoint's superblocks (`x` rounded a superblock at a time). Real weights, the loader's
//! own decoding; each projection is its own product here (the decoder stacks q/k/v and
//! gate/up, and keeps a stack of mixed Q4_K and Q6_K parts per block).
//!
//! `cargo run --release -p spec-runtime --example superblock_layouts [MODEL] [ROWS] [ROUNDS]`:
//! MODEL a reference model's name or a GGUF path (default `qwen2.5-coder-1.5b`), ROWS a list
//! such as `1,2,5,8` (default), ROUNDS 10 after a warm-up round.

use std::error::Error;
use std::time::Instant;

use spec_kernels::{PackedMatrix, WeightFormat};
use spec_runtime::{GgufSource, ModelConfig, Superblocks, WeightSource};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
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
    let rounds: usize = args.get(2).map_or(Ok(10), |a| a.parse())?;
    if rows.iter().any(|&m| m == 0 || m > 16) || rounds == 0 {
        return Err("rows must be 1..=16 and rounds at least 1".into());
    }
    let file = spec_gguf::GgufFile::open(spec_models::resolve(model)?)?;
    let config = ModelConfig::from_gguf(&file)?;
    let mut source = GgufSource::new(&file, config.clone());

    let mut names: Vec<String> = Vec::new();
    for layer in 0..config.num_layers {
        for part in [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ] {
            names.push(format!("model.layers.{layer}.{part}.weight"));
        }
    }
    if !config.tie_word_embeddings {
        names.push("lm_head.weight".into());
    }
    // [per-block layout, superblocks] for each projection the checkpoint holds as superblocks.
    let mut pairs = Vec::new();
    for name in &names {
        let Some(superblocks) = source.take_superblocks(name)? else {
            continue;
        };
        let weights = source.take(name)?;
        let [n, k] = weights.shape[..] else {
            return Err(format!("{name} is not a matrix").into());
        };
        let per_block = PackedMatrix::pack(&weights.data, n, k, WeightFormat::Q4A8)?;
        let kept = match &superblocks {
            Superblocks::Q4K(b) => PackedMatrix::pack_q4_superblocks(b, n, k, WeightFormat::Q4A8)?,
            Superblocks::Q6K(b) => PackedMatrix::pack_q6_superblocks(b, n, k, WeightFormat::Q4A8)?,
        };
        pairs.push([per_block, kept]);
    }
    let bytes = |l: usize| pairs.iter().map(|p| p[l].stored_bytes()).sum::<usize>() as f64 / 1e9;
    println!(
        "{model}: {} of {} projections held as superblocks; per-block layout {:.3} GB, \
         superblocks {:.3} GB",
        pairs.len(),
        names.len(),
        bytes(0),
        bytes(1)
    );

    let widest = pairs
        .iter()
        .map(|p| p[0].rows().max(p[0].cols()))
        .max()
        .unwrap_or(0);
    let x: Vec<f32> = (0..16 * widest)
        .map(|i| ((i * 37) % 11) as f32 * 0.1 - 0.5)
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
    println!(
        "| rows | per-block ms | superblocks ms | superblocks ÷ per-block (median of rounds) |"
    );
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
