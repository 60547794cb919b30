//! `WeightFormat::Q4` on a 4-bit checkpoint keeps its weights: SmolLM2-135M's projections are
//! Q4_1 blocks in the GGUF file, so packed as Q4 they compute what the f32 copy computes (to
//! summation rounding), where Q8_0 rounds them once more. Needs the cached model; without it
//! the test says so and passes, unless `SPEC_REQUIRE_MODELS=1`.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use burn::backend::Flex;
use spec_core::sampling::SamplingConfig;
use spec_runtime::model::{LoadOptions, WeightFormat};
use spec_runtime::{
    ForwardRequest, GenerateOptions, LoadedModel, LogitRows, generate_plain, load_model_with,
};

fn load(path: &std::path::Path, format: WeightFormat) -> LoadedModel<Flex> {
    let options = LoadOptions {
        skinny_format: Some(format),
        ..Default::default()
    };
    load_model_with::<Flex>(path, &Default::default(), options).unwrap()
}

/// Logits of every position of `tokens`, fed as one request of at most 16 rows (the packed
/// path), as one `[rows × vocab]` vector.
fn logits(model: &LoadedModel<Flex>, tokens: &[u32]) -> Vec<f32> {
    let mut cache = model.model.new_cache(tokens.len());
    let out = model
        .model
        .forward(
            ForwardRequest::tokens(tokens).logits(LogitRows::Rows((0..tokens.len()).collect())),
            &mut cache,
        )
        .unwrap();
    out.logits.unwrap().into_data().to_vec().unwrap()
}

/// The cached model `name`, or `None` after saying why it is skipped (a failure instead with
/// `SPEC_REQUIRE_MODELS=1`).
fn cached(name: &str) -> Option<std::path::PathBuf> {
    match spec_models::resolve(name) {
        Ok(p) => Some(p),
        Err(e) => {
            assert!(
                std::env::var("SPEC_REQUIRE_MODELS").as_deref() != Ok("1"),
                "SPEC_REQUIRE_MODELS=1 but {e}"
            );
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// The largest `|a − b|` over the largest `|b|`.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let scale = b.iter().fold(0f32, |m, y| m.max(y.abs()));
    diff / scale
}

#[test]
fn q4_keeps_smollm2s_four_bit_weights() {
    let Some(path) = cached("smollm2-135m") else {
        return;
    };
    let f32_model = load(&path, WeightFormat::F32);
    let q4 = load(&path, WeightFormat::Q4);
    let q8 = load(&path, WeightFormat::Q8_0);

    // Every projection is 4-bit in the file and stays so; the tied head (the Q8_0 token
    // embedding) is not on 16 levels and is stored as Q8_0.
    for block in &q4.model.blocks {
        let packed = block.packed().unwrap();
        for linear in [&packed.qkv, &packed.o, &packed.gate_up, &packed.down] {
            assert_eq!(linear.matrix.format(), WeightFormat::Q4);
        }
    }
    let head = q4.model.head.packed().unwrap();
    assert_eq!(head.matrix.format(), WeightFormat::Q8_0);

    let vocab = q4.config.vocab_size as u32;
    let tokens: Vec<u32> = (1..=12).map(|i| (i * 7919) % vocab).collect();
    let exact = logits(&f32_model, &tokens);
    let q4_error = relative_error(&logits(&q4, &tokens), &exact);
    let q8_error = relative_error(&logits(&q8, &tokens), &exact);
    eprintln!("logits' largest error against f32: q4 {q4_error:e}, q8_0 {q8_error:e}");
    assert!(q4_error <= 1e-4, "q4 logits off f32's by {q4_error}");
    assert!(
        q8_error > 10.0 * q4_error,
        "q8_0 {q8_error} against q4 {q4_error}: rounding the weights again should show"
    );

    // Rounding the activations too (llama.cpp's arithmetic) is a different model: close to
    // the checkpoint's, not equal.
    let q4_a8 = load(&path, WeightFormat::Q4A8);
    let packed = q4_a8.model.blocks[0].packed().unwrap();
    assert_eq!(packed.gate_up.matrix.format(), WeightFormat::Q4A8);
    let a8_error = relative_error(&logits(&q4_a8, &tokens), &exact);
    eprintln!("q4-a8: {a8_error:e}");
    assert!(
        a8_error > 0.0 && a8_error < 0.1,
        "q4-a8 logits off f32's by {a8_error}"
    );

    let options = GenerateOptions::new(24, SamplingConfig::greedy());
    let greedy = |m: &LoadedModel<Flex>| {
        generate_plain(&m.model, &tokens, &options, &mut |_| {})
            .unwrap()
            .tokens
    };
    assert_eq!(greedy(&q4), greedy(&f32_model));
}

/// In `q4-a8`, a checkpoint's Q4_K and Q6_K matrices are packed from their superblocks as
/// they are (152 and 212 bytes a superblock of 256 weights); Qwen2.5-Coder-0.5B's `ffn_down` is
/// Q4_K in half its layers and Q6_K in the others. The model stays close to the f32 one.
#[test]
fn q4_a8_keeps_k_quant_superblocks() {
    let Some(path) = cached("qwen2.5-coder-0.5b") else {
        return;
    };
    let q4_a8 = load(&path, WeightFormat::Q4A8);
    let (mut four, mut six) = (0, 0);
    for block in &q4_a8.model.blocks {
        let down = &block.packed().unwrap().down.matrix;
        assert_eq!(down.format(), WeightFormat::Q4A8);
        let superblocks = down.rows() * down.cols() / 256;
        if down.stored_bytes() == superblocks * 152 {
            four += 1;
        } else if down.stored_bytes() == superblocks * 212 {
            six += 1;
        }
    }
    let layers = q4_a8.model.blocks.len();
    assert_eq!(
        (four, six),
        (layers / 2, layers / 2),
        "layers whose down is Q4_K, Q6_K"
    );

    // Without superblocks, the same matrices as Q4 blocks (0.75 bytes a weight) and Q8_0.
    let per_block = load_model_with::<Flex>(
        &path,
        &Default::default(),
        LoadOptions {
            skinny_format: Some(WeightFormat::Q4A8),
            keep_superblocks: false,
            ..Default::default()
        },
    )
    .unwrap();
    let formats: Vec<WeightFormat> = per_block
        .model
        .blocks
        .iter()
        .map(|b| b.packed().unwrap().down.matrix.format())
        .collect();
    let q4 = formats.iter().filter(|f| **f == WeightFormat::Q4A8).count();
    let q8 = formats
        .iter()
        .filter(|f| **f == WeightFormat::Q8_0A8)
        .count();
    assert_eq!((q4, q8), (layers / 2, layers / 2));
    drop(per_block);

    let f32_model = load(&path, WeightFormat::F32);
    let vocab = q4_a8.config.vocab_size as u32;
    let tokens: Vec<u32> = (1..=12).map(|i| (i * 7919) % vocab).collect();
    let exact = logits(&f32_model, &tokens);
    let a8_error = relative_error(&logits(&q4_a8, &tokens), &exact);
    eprintln!("q4-a8 with k-quant superblocks: {a8_error:e}");
    assert!(
        a8_error > 0.0 && a8_error < 0.1,
        "q4-a8 logits off f32's by {a8_error}"
    );
}

/// `q4-a8-lossy` (meant for drafts) keeps the k-quant superblocks as `q4-a8` does and rounds
/// every other matrix of Qwen2.5-Coder-0.5B (Q5_0 and Q8_0 in the file) to 4-bit blocks
/// instead of keeping them as Q8_0: fewer bytes, a model still near the f32 one.
#[test]
fn q4_a8_lossy_rounds_the_other_matrices_to_four_bits() {
    let Some(path) = cached("qwen2.5-coder-0.5b") else {
        return;
    };
    let q4_a8 = load(&path, WeightFormat::Q4A8);
    let lossy = load(&path, WeightFormat::Q4A8Lossy);
    for (exact, rounded) in q4_a8.model.blocks.iter().zip(&lossy.model.blocks) {
        let (exact, rounded) = (exact.packed().unwrap(), rounded.packed().unwrap());
        assert_eq!(rounded.down.matrix.format(), WeightFormat::Q4A8);
        assert_eq!(
            rounded.down.matrix.stored_bytes(),
            exact.down.matrix.stored_bytes()
        );
        for (e, r) in [
            (&exact.qkv, &rounded.qkv),
            (&exact.o, &rounded.o),
            (&exact.gate_up, &rounded.gate_up),
        ] {
            assert_eq!(e.matrix.format(), WeightFormat::Q8_0A8);
            assert_eq!(r.matrix.format(), WeightFormat::Q4A8Lossy);
            assert!(r.matrix.stored_bytes() * 3 <= e.matrix.stored_bytes() * 2);
        }
    }
    let (exact_bytes, lossy_bytes) = (
        q4_a8.model.packed_bytes().unwrap(),
        lossy.model.packed_bytes().unwrap(),
    );
    eprintln!("packed bytes: q4-a8 {exact_bytes}, q4-a8-lossy {lossy_bytes}");
    assert!(lossy_bytes * 4 < exact_bytes * 3);
    drop(q4_a8);

    let f32_model = load(&path, WeightFormat::F32);
    let vocab = lossy.config.vocab_size;
    let tokens: Vec<u32> = (1..=24).map(|i| (i * 7919) % vocab as u32).collect();
    let (rounded, exact) = (logits(&lossy, &tokens), logits(&f32_model, &tokens));
    let error = relative_error(&rounded, &exact);
    let argmax = |row: &[f32]| {
        row.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
    };
    let agree = rounded
        .chunks(vocab)
        .zip(exact.chunks(vocab))
        .filter(|(r, e)| argmax(r) == argmax(e))
        .count();
    eprintln!("q4-a8-lossy: logits off by {error:e}, top token as f32's at {agree} of 24");
    assert!(error > 0.0, "q4-a8-lossy rounded nothing");
    assert!(
        agree >= 12,
        "q4-a8-lossy agrees with f32 at {agree} of 24 positions"
    );
}
