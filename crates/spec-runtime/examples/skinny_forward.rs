//! Time of one forward pass over `n` new tokens (logits for all of them, as a verification step
//! needs), n = 1, 2, 4, 8, 16, after a 64-token prompt, with each skinny-kernel format and with
//! burn's matmul alone (`off`). Prints the median of `reps` runs and the ratio to n = 1.
//!
//! `cargo run --release -p spec-runtime --example skinny_forward -- [model] [reps] [formats]`
//! (defaults: `smollm2-135m`, 20, `off,f32,bf16,q8_0`).

// A failure in a test or measurement helper is a failure of the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use burn::backend::Flex;
use spec_runtime::model::{LoadOptions, WeightFormat};
use spec_runtime::{ForwardRequest, GgufSource, LogitRows, ModelConfig, Transformer};

const PROMPT: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "smollm2-135m".into());
    let reps: usize = args.next().map_or(Ok(20), |s| s.parse())?;
    let formats = args.next().unwrap_or_else(|| "off,f32,bf16,q8_0".into());
    let path = spec_models::resolve(&name)?;
    let file = spec_gguf::GgufFile::open(&path)?;
    let config = ModelConfig::from_gguf(&file)?;
    let device = Default::default();
    let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| 100 + (i * 37) % 1000).collect();
    println!("model {name}, {reps} runs each, median ms per forward (ratio to n = 1)");
    println!("| format | n=1 | n=2 | n=4 | n=8 | n=16 |");
    println!("|---|---|---|---|---|---|");
    for format in formats.split(',') {
        let skinny_format = match format {
            "off" => None,
            f => Some(f.parse::<WeightFormat>()?),
        };
        let mut source = GgufSource::new(&file, config.clone());
        let model = Transformer::<Flex>::load_with(
            &config,
            &mut source,
            &device,
            LoadOptions { skinny_format },
        )?;
        let mut cache = model.new_cache(PROMPT + 32);
        model.forward(
            ForwardRequest::tokens(&prompt).logits(LogitRows::None),
            &mut cache,
        )?;
        let mut row = format!("| {format} |");
        let mut base = None;
        for n in [1, 2, 4, 8, 16] {
            let mut times: Vec<Duration> = Vec::with_capacity(reps + 2);
            for _ in 0..reps.max(1) + 2 {
                let start = Instant::now();
                let out = model.forward(
                    ForwardRequest::tokens(&prompt[..n]).logits(LogitRows::All),
                    &mut cache,
                )?;
                // Reading the logits back makes sure the whole pass ran.
                let _ = out.logits.map(|l| l.into_data());
                times.push(start.elapsed());
                cache.truncate(PROMPT);
            }
            times.drain(..2);
            times.sort();
            let ms = times[times.len() / 2].as_secs_f64() * 1e3;
            let b = *base.get_or_insert(ms);
            row.push_str(&format!(" {ms:.1} ({:.2}×) |", ms / b));
        }
        println!("{row}");
    }
    Ok(())
}
