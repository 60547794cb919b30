//! The products of one forward pass of a reference model's shapes, packed in one format and
//! run at several row counts in one process, round after round (the machine's speed drifts from
//! minute to minute, so ratios are taken within a round). Weights are synthetic, on a 4-bit grid
//! so that every format (Q4 included) packs them as asked; only the shapes and the format
//! matter for the time.
//!
//! `cargo run --release -p spec-kernels --example model_products [MODEL] [FORMAT] [ROWS]
//! [ROUNDS]`: MODEL `smollm2`, `qwen0.5b` or `qwen1.5b` (default), FORMAT as `--weights`
//! takes it (default f32), ROWS a list such as `1,2,4,5,8` (default), ROUNDS 12 after a warm-up
//! round. Per row count: the median time of all products, its median ratio to one row in the
//! same round, and the same split by projection (q/k/v stacked, o, gate/up stacked, down, the
//! output head).

use std::error::Error;
use std::time::Instant;

use spec_kernels::{PackedMatrix, WeightFormat};

/// Hidden size, q + k + v outputs, feed-forward size, layers, vocabulary.
type Shape = (usize, usize, usize, usize, usize);

fn shape(model: &str) -> Result<Shape, String> {
    match model {
        "smollm2" => Ok((576, 576 + 2 * 192, 1536, 30, 49152)),
        "qwen0.5b" => Ok((896, 896 + 2 * 128, 4864, 24, 151936)),
        "qwen1.5b" => Ok((1536, 1536 + 2 * 256, 8960, 28, 151936)),
        other => Err(format!(
            "unknown model {other:?}: smollm2, qwen0.5b or qwen1.5b"
        )),
    }
}

const CLASSES: [&str; 5] = ["qkv", "o", "gate_up", "down", "head"];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().map_or("qwen1.5b", String::as_str);
    let format: WeightFormat = args.get(1).map_or("f32", String::as_str).parse()?;
    let rows: Vec<usize> = args
        .get(2)
        .map_or("1,2,4,5,8", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let rounds: usize = args.get(3).map_or(Ok(12), |a| a.parse())?;
    let (hidden, qkv, ff, layers, vocab) = shape(model)?;
    if rows.iter().any(|&m| m == 0 || m > 16) || rounds == 0 {
        return Err("rows must be 1..=16 and rounds at least 1".into());
    }

    // Values on a grid of 16 levels in every block of 32.
    let raw: Vec<f32> = (0..vocab * hidden)
        .map(|i| ((i * 7919) % 16) as f32 * 0.01 - 0.08)
        .collect();
    let pack = |n: usize, k: usize| PackedMatrix::pack(&raw[..n * k], n, k, format);
    // (class, matrix) in the order of a forward pass.
    let mut products = Vec::new();
    for _ in 0..layers {
        products.push((0, pack(qkv, hidden)?));
        products.push((1, pack(hidden, hidden)?));
        products.push((2, pack(2 * ff, hidden)?));
        products.push((3, pack(hidden, ff)?));
    }
    products.push((4, pack(vocab, hidden)?));
    drop(raw);
    let bytes: usize = products.iter().map(|(_, m)| m.stored_bytes()).sum();
    println!(
        "{model}, {format:?}: {} products, {:.2} GB stored; {rounds} rounds after a warm-up",
        products.len(),
        bytes as f64 / 1e9
    );

    let widest = products
        .iter()
        .map(|(_, m)| m.rows().max(m.cols()))
        .max()
        .unwrap_or(0);
    let x: Vec<f32> = (0..16 * widest)
        .map(|i| (i % 5) as f32 * 0.01 - 0.02)
        .collect();
    let mut y = vec![0.0f32; 16 * widest];
    // times[row count][class or total][round]
    let mut times = vec![vec![Vec::new(); CLASSES.len() + 1]; rows.len()];
    for round in 0..=rounds {
        for (t, &m) in rows.iter().enumerate() {
            let mut spent = [0.0f64; CLASSES.len() + 1];
            for (class, mat) in &products {
                let (n, k) = (mat.rows(), mat.cols());
                let start = Instant::now();
                mat.matmul_into(&x[..m * k], m, &mut y[..m * n])?;
                let ms = start.elapsed().as_secs_f64() * 1e3;
                spent[*class] += ms;
                spent[CLASSES.len()] += ms;
            }
            if round > 0 {
                for (all, s) in times[t].iter_mut().zip(spent) {
                    all.push(s);
                }
            }
        }
    }

    let ratio = |t: usize, c: usize| -> f64 {
        median(
            times[t][c]
                .iter()
                .zip(&times[0][c])
                .map(|(a, b)| a / b)
                .collect(),
        )
    };
    let header: String = CLASSES.iter().map(|c| format!(" {c} |")).collect();
    println!("| rows | all products ms | ÷ rows[0] |{header}");
    println!("|---|---|---|{}", "---|".repeat(CLASSES.len()));
    for (t, &m) in rows.iter().enumerate() {
        let classes: String = (0..CLASSES.len())
            .map(|c| format!(" {:.1} ({:.2}) |", median(times[t][c].clone()), ratio(t, c)))
            .collect();
        println!(
            "| {m} | {:.1} | {:.2} |{classes}",
            median(times[t][CLASSES.len()].clone()),
            ratio(t, CLASSES.len())
        );
    }
    Ok(())
}
