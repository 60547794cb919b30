//! The products of one forward pass of a reference model's shapes, packed in one format and
//! run at several row counts in one process, round after round (the machine's speed drifts from
//! minute to minute, so ratios are taken within a round). Weights are synthetic, on a 4-bit grid
//! so that every format (Q4 included) packs them as asked; only the shapes and the format
//! matter for the time.
//!
//! `cargo run --release -p spec-kernels --example model_products [MODEL] [FORMAT] [ROWS]
//! [ROUNDS] [TILES]`: MODEL a reference model's name (default `qwen2.5-coder-1.5b`; also
//! `smollm2-135m`, `qwen2.5-coder-0.5b`), FORMAT as `--weights` takes it (default f32), ROWS a
//! list such as `1,2,4,5,8` (default; each 1..=64, a prompt's pass), ROUNDS 12 after a warm-up
//! round, TILES the f32 span tiles to run each row count with (`timed`, the default, picks
//! them as the models do; `eight`, `two`, `streams` fix one: `SpanTile`), in turn within each
//! round. Per row count and tile: the median time of all products, its median ratio to the
//! first row count with the first tile in the same round, and the same split by projection
//! (q/k/v stacked, o, gate/up stacked, down, the output head).

use std::error::Error;
use std::time::Instant;

use spec_kernels::{Exec, PackedMatrix, SpanTile, WeightFormat};

#[path = "../benches/common/models.rs"]
mod models;

use models::{MODELS, PASS_PROJECTIONS as CLASSES, ReferenceModel};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().map_or("qwen2.5-coder-1.5b", String::as_str);
    let format: WeightFormat = args.get(1).map_or("f32", String::as_str).parse()?;
    let rows: Vec<usize> = args
        .get(2)
        .map_or("1,2,4,5,8", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let rounds: usize = args.get(3).map_or(Ok(12), |a| a.parse())?;
    let tiles: Vec<Option<SpanTile>> = args
        .get(4)
        .map_or("timed", String::as_str)
        .split(',')
        .map(|t| match t {
            "timed" => Ok(None),
            "eight" => Ok(Some(SpanTile::EightLanes)),
            "two" => Ok(Some(SpanTile::TwoPanels)),
            "streams" => Ok(Some(SpanTile::TwoPanelStreams)),
            other => Err(format!(
                "a tile is timed, eight, two or streams, not {other}"
            )),
        })
        .collect::<Result<_, _>>()?;
    // Each (row count, tile) in turn.
    let runs: Vec<(usize, Option<SpanTile>)> = rows
        .iter()
        .flat_map(|&m| tiles.iter().map(move |&t| (m, t)))
        .collect();
    let Some(reference) = ReferenceModel::by_name(model) else {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        return Err(format!("unknown model {model:?}: one of {names:?}").into());
    };
    if rows.iter().any(|&m| m == 0 || m > 64) || rounds == 0 {
        return Err("rows must be 1..=64 and rounds at least 1".into());
    }

    // Values on a grid of 16 levels in every block of 32, enough for the largest product.
    let passes = reference.pass_products();
    let largest = passes.iter().map(|&(_, n, k)| n * k).max().unwrap_or(0);
    let raw: Vec<f32> = (0..largest)
        .map(|i| ((i * 7919) % 16) as f32 * 0.01 - 0.08)
        .collect();
    // (projection, matrix) in the order of a forward pass.
    let products = passes
        .into_iter()
        .map(|(class, n, k)| Ok((class, PackedMatrix::pack(&raw[..n * k], n, k, format)?)))
        .collect::<Result<Vec<_>, spec_kernels::KernelError>>()?;
    drop(raw);
    let bytes: usize = products.iter().map(|(_, m)| m.stored_bytes()).sum();
    println!(
        "{model}, {format:?}: {} products, {:.2} GB stored; kernels {}; {rounds} rounds after a \
         warm-up",
        products.len(),
        bytes as f64 / 1e9,
        spec_kernels::instruction_set()
    );

    let widest = products
        .iter()
        .map(|(_, m)| m.rows().max(m.cols()))
        .max()
        .unwrap_or(0);
    let x: Vec<f32> = (0..64 * widest)
        .map(|i| (i % 5) as f32 * 0.01 - 0.02)
        .collect();
    let mut y = vec![0.0f32; 64 * widest];
    // times[run][class or total][round]
    let mut times = vec![vec![Vec::new(); CLASSES.len() + 1]; runs.len()];
    for round in 0..=rounds {
        for (t, &(m, span_tile)) in runs.iter().enumerate() {
            let mut spent = [0.0f64; CLASSES.len() + 1];
            let exec = Exec {
                span_tile,
                ..Exec::default()
            };
            for (class, mat) in &products {
                let (n, k) = (mat.rows(), mat.cols());
                let start = Instant::now();
                mat.matmul_with(&x[..m * k], m, &mut y[..m * n], exec)?;
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
    println!("| rows | tile | all products ms | ÷ first |{header}");
    println!("|---|---|---|---|{}", "---|".repeat(CLASSES.len()));
    for (t, &(m, span_tile)) in runs.iter().enumerate() {
        let classes: String = (0..CLASSES.len())
            .map(|c| format!(" {:.1} ({:.2}) |", median(times[t][c].clone()), ratio(t, c)))
            .collect();
        let tile = span_tile.map_or("timed", SpanTile::name);
        println!(
            "| {m} | {tile} | {:.1} | {:.2} |{classes}",
            median(times[t][CLASSES.len()].clone()),
            ratio(t, CLASSES.len())
        );
    }
    // The memory's speed drifts between rounds: each round's totals, to read them by state.
    let names: String = runs
        .iter()
        .map(|&(m, t)| format!(" {m} {} |", t.map_or("timed", SpanTile::name)))
        .collect();
    println!("\n| round |{names}");
    println!("|---|{}", "---|".repeat(runs.len()));
    for round in 0..rounds {
        let totals: String = times
            .iter()
            .map(|run| format!(" {:.1} |", run[CLASSES.len()][round]))
            .collect();
        println!("| {} |{totals}", round + 1);
    }
    Ok(())
}
