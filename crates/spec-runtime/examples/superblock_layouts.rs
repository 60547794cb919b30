//! A GGUF model in `q4-a8` two ways, alternated round by round in one process: per block of 32
//! (Q4_K matrices as Q4 blocks with an f32 scale and minimum, Q6_K ones rounded to Q8_0, `x`
//! rounded a block at a time; `LoadOptions::keep_superblocks` false) and as the checkpoint's
//! superblocks (`x` rounded a superblock at a time; the default). First the projections alone
//! at several row counts (real weights, the loader's own decoding; each projection is its own
//! product here, where the decoder stacks q/k/v and gate/up and keeps a stack of mixed Q4_K
//! and Q6_K parts per block), then plain greedy decoding of both whole models.
//!
//! `cargo run --release -p spec-runtime --example superblock_layouts [MODEL] [ROWS] [ROUNDS]`:
//! MODEL a reference model's name or a GGUF path (default `qwen2.5-coder-1.5b`), ROWS a list
//! such as `1,2,5,8` (default), ROUNDS 10 after a warm-up round.

use std::error::Error;
use std::time::Instant;

use burn::backend::Flex;
use spec_core::sampling::SamplingConfig;
use spec_kernels::{PackedMatrix, WeightFormat};
use spec_runtime::model::{BLOCK_PROJECTIONS, LoadOptions};
use spec_runtime::{
    GenerateOptions, GgufSource, ModelConfig, Superblocks, WeightSource, generate_plain,
    load_model_with,
};

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
    let path = spec_models::resolve(model)?;
    let file = spec_gguf::GgufFile::open(&path)?;
    let config = ModelConfig::from_gguf(&file)?;
    let mut source = GgufSource::new(&file, config.clone());

    let mut names: Vec<String> = Vec::new();
    for layer in 0..config.num_layers {
        for part in BLOCK_PROJECTIONS {
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
        println!(
            "| {m} | {:.1} | {:.1} | {:.3} |",
            median(times[t][0].clone()),
            median(times[t][1].clone()),
            median_ratio(&times[t][1], &times[t][0])
        );
    }
    drop(pairs);

    // Whole models: plain greedy decoding of 32 tokens after a short prompt, alternated.
    let models = [false, true].map(|keep_superblocks| {
        let options = LoadOptions {
            skinny_format: Some(WeightFormat::Q4A8),
            keep_superblocks,
            ..Default::default()
        };
        load_model_with::<Flex>(&path, &Default::default(), options)
    });
    let [per_block, kept] = models;
    let models = [per_block?, kept?];
    let vocab = config.vocab_size as u32;
    let prompt: Vec<u32> = (1..=24).map(|i| (i * 7919) % vocab).collect();
    let options = GenerateOptions::new(32, SamplingConfig::greedy());
    let mut decode = [Vec::new(), Vec::new()];
    let mut same = 0;
    for round in 0..=rounds {
        let mut tokens = [Vec::new(), Vec::new()];
        for l in [round % 2, 1 - round % 2] {
            let out = generate_plain(&models[l].model, &prompt, &options, &mut |_| {})?;
            if round > 0 {
                decode[l].push(out.stats.decode_tokens_per_second);
            }
            tokens[l] = out.tokens;
        }
        same += usize::from(tokens[0] == tokens[1]);
    }
    println!(
        "decode tok/s, median of {rounds} rounds: per-block {:.2}, superblocks {:.2}; \
         superblocks ÷ per-block {:.3} (median of rounds); same 32 tokens in {same} of {} rounds",
        median(decode[0].clone()),
        median(decode[1].clone()),
        median_ratio(&decode[1], &decode[0]),
        rounds + 1
    );
    Ok(())
}

/// The median of the ratios `a[i] / b[i]` (taken within a round).
fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    median(a.iter().zip(b).map(|(a, b)| a / b).collect())
}
