//! `spec bench-forward`: what one forward pass costs as the number of new tokens grows, and how
//! plain decoding compares with the memory-bandwidth bound of the weight format.
//!
//! A verification step feeds K + 1 tokens through the target where a decode step feeds one; on
//! a CPU both read every weight once, so forward(K + 1) ÷ forward(1) says whether verifying is
//! as cheap as it should be. Runs on flex, where the skinny-kernel formats apply.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::backend::Flex;
use serde::Serialize;
use spec_core::sampling::SamplingConfig;
use spec_runtime::model::{LoadOptions, WeightFormat};
use spec_runtime::{
    ForwardRequest, GenerateOptions, GgufSource, LogitRows, ModelConfig, Transformer,
    generate_plain,
};

/// New-token counts timed by default, as the table asks.
const DEFAULT_ROWS: &str = "1,2,4,8,16";
/// Tokens in the context before each timed pass by default (attention then reads a realistic
/// cache).
const DEFAULT_CONTEXT: usize = 64;
/// The most new tokens one timed pass may take.
const MAX_ROWS: usize = 64;
/// Tokens generated for the decode-speed figure.
const DECODE_TOKENS: usize = 32;
/// Prompt tokens of the prefill figures.
const PREFILL: usize = 128;
/// Timed prefills of each kind (the median is reported).
const PREFILL_REPS: usize = 3;

#[derive(clap::Args)]
pub(crate) struct BenchForwardArgs {
    /// A GGUF file or a reference model name (smollm2-135m, qwen2.5-coder-0.5b,
    /// qwen2.5-coder-1.5b).
    #[arg(long)]
    model: String,
    /// Weight formats of the skinny kernel, comma-separated: f32, bf16, q8_0, q4, q8_0-a8, q4-a8, q4-a8-lossy, or `off`
    /// (burn's matmul everywhere, f32).
    #[arg(long, default_value = "f32")]
    weights: String,
    /// Timed rounds (each times every n once; medians are reported).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// New-token counts to time, comma-separated, each 1..=64 (1 is always timed: the ratios
    /// are to it); e.g. `1,5` for a K = 4 verification.
    #[arg(long, default_value = DEFAULT_ROWS)]
    rows: String,
    /// Tokens of context before each timed pass and before the decode (at least 1): attention's
    /// share of a pass grows with it.
    #[arg(long, default_value_t = DEFAULT_CONTEXT)]
    context: usize,
    /// KV-cache capacity in positions (default: just what the run needs).
    #[arg(long)]
    capacity: Option<usize>,
    /// Print one JSON object per format instead of a table.
    #[arg(long)]
    json: bool,
}

/// One format's figures (the `--json` schema).
#[derive(Debug, Serialize)]
struct ForwardReport {
    model: String,
    weights: String,
    /// Median milliseconds of one forward pass over `n` new tokens, keyed by `n`.
    forward_ms: std::collections::BTreeMap<String, f64>,
    /// Median over the timed rounds of forward(n) ÷ forward(1) within the round, keyed by `n`:
    /// the passes of one round run back to back, so the ratio holds on a machine whose speed
    /// drifts between rounds (a shared one), where a ratio of medians may not.
    forward_ratio: std::collections::BTreeMap<String, f64>,
    /// Tokens in the cache before each timed pass and before the decode (`--context`).
    context_tokens: usize,
    /// Greedy plain decoding, tokens after the first per second.
    decode_tokens_per_second: f64,
    /// A 128-token prompt in one forward request (which the runtime runs in passes of at most
    /// `HOST_PASS_ROWS`), prompt tokens per second.
    prefill_tokens_per_second: f64,
    /// Read bandwidth (`read_gb_per_second`) ÷ bytes of weights one token reads.
    bandwidth_bound_tokens_per_second: f64,
    /// Bytes of projection and head weights one forward reads in this format.
    weight_bytes: u64,
    /// The machine's read bandwidth, GB/s: the mean of probes just before and just after this
    /// format's decode, so that the ratio to the bound holds on a machine whose speed drifts.
    read_gb_per_second: f64,
    /// The instruction set the products ran on (`spec_kernels::instruction_set`).
    kernels: &'static str,
}

pub(crate) fn run(args: &BenchForwardArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    if args.context == 0 {
        bail!("--context must be at least 1");
    }
    let rows = parse_rows(&args.rows)?;
    let path = spec_models::resolve(&args.model)?;
    let file = spec_gguf::GgufFile::open(&path).with_context(|| {
        format!(
            "bench-forward reads GGUF files; {} is not one",
            path.display()
        )
    })?;
    let config = ModelConfig::from_gguf(&file)?;
    let probe = BandwidthProbe::new();
    if !args.json {
        println!(
            "model {}, {} timed runs a point, {} tokens of context; kernels {}; read bandwidth \
             {:.1} GB/s now (each bound uses probes just before and after that format's decode)",
            args.model,
            args.reps,
            args.context,
            spec_kernels::instruction_set(),
            probe.measure() / 1e9
        );
        let columns: String = rows.iter().map(|n| format!(" n={n} |")).collect();
        println!(
            "| weights |{columns} decode tok/s | bound tok/s | decode ÷ bound | prefill tok/s \
             ({PREFILL} tokens) |"
        );
        println!("|---|{}---|---|---|---|", "---|".repeat(rows.len()));
    }
    for name in args.weights.split(',') {
        let format = match name {
            "off" => None,
            f => Some(f.parse::<WeightFormat>().map_err(anyhow::Error::msg)?),
        };
        let mut source = GgufSource::new(&file, config.clone());
        let model = Transformer::<Flex>::load_with(
            &config,
            &mut source,
            &Default::default(),
            LoadOptions {
                skinny_format: format,
                ..Default::default()
            },
        )?;
        let rounds = time_rounds(&model, &config, &rows, args)?;
        let mut forward_ms = std::collections::BTreeMap::new();
        let mut forward_ratio = std::collections::BTreeMap::new();
        for (column, n) in rows.iter().enumerate() {
            let ms = median(rounds.iter().map(|r| r[column]).collect());
            let ratio = median(rounds.iter().map(|r| r[column] / r[0]).collect());
            forward_ms.insert(n.to_string(), ms);
            forward_ratio.insert(n.to_string(), ratio);
        }
        let prompt = tokens(&config, args.context);
        let mut options = GenerateOptions::new(DECODE_TOKENS, SamplingConfig::greedy());
        options.cache_capacity = Some(args.capacity.unwrap_or(args.context + DECODE_TOKENS + 1));
        let before = probe.measure();
        let decode = generate_plain(&model, &prompt, &options, &mut |_| {})?;
        let bandwidth = (before + probe.measure()) / 2.0;
        let prefill = time_prefill(&model, &config)?;
        // What the packed copies hold (Q4 stores a matrix off 4-bit grids as Q8_0); without
        // them, burn's matmul reads f32.
        let bytes = model
            .packed_bytes()
            .map_or_else(|| weight_bytes(&config, 4.0), |b| b as f64);
        let report = ForwardReport {
            model: args.model.clone(),
            weights: name.to_owned(),
            forward_ms,
            forward_ratio,
            context_tokens: args.context,
            decode_tokens_per_second: decode.stats.decode_tokens_per_second,
            prefill_tokens_per_second: PREFILL as f64 / prefill,
            bandwidth_bound_tokens_per_second: bandwidth / bytes,
            weight_bytes: bytes as u64,
            read_gb_per_second: bandwidth / 1e9,
            kernels: spec_kernels::instruction_set(),
        };
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            let mut row = format!("| {name} |");
            for n in &rows {
                let key = n.to_string();
                row.push_str(&format!(
                    " {:.1} ms ({:.2}×) |",
                    report.forward_ms[&key], report.forward_ratio[&key]
                ));
            }
            row.push_str(&format!(
                " {:.1} | {:.1} | {:.0}% |",
                report.decode_tokens_per_second,
                report.bandwidth_bound_tokens_per_second,
                100.0 * report.decode_tokens_per_second / report.bandwidth_bound_tokens_per_second
            ));
            row.push_str(&format!(" {:.0} |", report.prefill_tokens_per_second));
            println!("{row}");
        }
    }
    Ok(())
}

/// `n` fixed, in-vocabulary tokens.
fn tokens(config: &ModelConfig, n: usize) -> Vec<u32> {
    let vocab = config.vocab_size.max(2) as u32;
    (0..n as u32).map(|i| 1 + (i * 37) % (vocab - 1)).collect()
}

/// Median seconds of a [`PREFILL`]-token prompt fed in one request into an empty cache (no
/// logits), after one untimed run.
fn time_prefill(model: &Transformer<Flex>, config: &ModelConfig) -> Result<f64> {
    let prompt = tokens(config, PREFILL);
    let mut cache = model.new_cache(PREFILL);
    let mut times = Vec::with_capacity(PREFILL_REPS);
    for round in 0..=PREFILL_REPS {
        cache.truncate(0);
        let start = Instant::now();
        model.forward(
            ForwardRequest::tokens(&prompt).logits(LogitRows::None),
            &mut cache,
        )?;
        if round > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(median(times))
}

/// Milliseconds of a forward over `n` new tokens (logits for all of them) after a
/// `context`-token prefix, for each `n` of `rows` in turn, rolled back after each: one row
/// per timed round.
fn time_rounds(
    model: &Transformer<Flex>,
    config: &ModelConfig,
    rows: &[usize],
    args: &BenchForwardArgs,
) -> Result<Vec<Vec<f64>>> {
    let context = args.context;
    let prefix = tokens(config, context);
    let new_tokens = tokens(config, MAX_ROWS);
    let most = rows.iter().copied().max().unwrap_or(1);
    let mut cache = model.new_cache(args.capacity.unwrap_or(context + most));
    model.forward(
        ForwardRequest::tokens(&prefix).logits(LogitRows::None),
        &mut cache,
    )?;
    let mut rounds = Vec::with_capacity(args.reps);
    // Two untimed rounds warm the caches and the allocator.
    for round in 0..args.reps + 2 {
        let mut times = Vec::with_capacity(rows.len());
        for &n in rows {
            let start = Instant::now();
            let out = model.forward(
                ForwardRequest::tokens(&new_tokens[..n]).logits(LogitRows::All),
                &mut cache,
            )?;
            // Reading the logits back makes sure the whole pass ran.
            if let Some(logits) = out.logits {
                let _ = logits.into_data();
            }
            times.push(start.elapsed().as_secs_f64() * 1e3);
            cache.truncate(context);
        }
        if round >= 2 {
            rounds.push(times);
        }
    }
    Ok(rounds)
}

/// `--rows`: sorted, without repeats, 1 first.
fn parse_rows(text: &str) -> Result<Vec<usize>> {
    let mut rows = vec![1];
    for part in text.split(',') {
        let n: usize = part
            .trim()
            .parse()
            .with_context(|| format!("--rows: {part:?} is not a count of tokens"))?;
        if !(1..=MAX_ROWS).contains(&n) {
            bail!("--rows: {n} is outside 1..={MAX_ROWS}");
        }
        rows.push(n);
    }
    rows.sort_unstable();
    rows.dedup();
    Ok(rows)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Bytes of every projection and the output head at `bytes_per_weight` (embedding lookups
/// and norms read a few kB a token and are left out).
fn weight_bytes(c: &ModelConfig, bytes_per_weight: f64) -> f64 {
    let q = c.num_heads * c.head_dim;
    let kv = c.num_kv_heads * c.head_dim;
    let per_layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size;
    let weights = c.num_layers * per_layer + c.vocab_size * c.hidden_size;
    weights as f64 * bytes_per_weight
}

/// The machine's read bandwidth: a 512 MiB buffer (beyond any cache) summed by every thread.
struct BandwidthProbe {
    data: Vec<f32>,
}

impl BandwidthProbe {
    fn new() -> Self {
        Self {
            data: vec![1.0f32; 128 << 20],
        }
    }

    /// Bytes a second, the best of three passes.
    fn measure(&self) -> f64 {
        use rayon::prelude::*;
        /// Independent f32 lanes of the sum: eight AVX vectors, enough that the adds' latency
        /// does not set the pace (two vectors did: the figure came out below what a decode step
        /// reads).
        const LANES: usize = 64;
        let mut best = 0.0f64;
        for _ in 0..3 {
            let start = Instant::now();
            let sum: f32 = self
                .data
                .par_chunks(1 << 16)
                .map(|c| {
                    let lanes = c.chunks_exact(LANES).fold([0.0f32; LANES], |mut acc, x| {
                        for (a, x) in acc.iter_mut().zip(x) {
                            *a += x;
                        }
                        acc
                    });
                    lanes.iter().sum::<f32>()
                })
                .sum();
            let seconds = start.elapsed().as_secs_f64();
            std::hint::black_box(sum);
            best = best.max((self.data.len() * 4) as f64 / seconds);
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_sorted_deduplicated_and_start_at_one() {
        assert_eq!(parse_rows(DEFAULT_ROWS).unwrap(), vec![1, 2, 4, 8, 16]);
        assert_eq!(parse_rows("5, 3,5").unwrap(), vec![1, 3, 5]);
        assert!(parse_rows("0").is_err());
        assert!(parse_rows("65").is_err());
        assert!(parse_rows("four").is_err());
    }
}
