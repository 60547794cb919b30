//! The flex backend's skinny path (spec-kernels) against burn's matmul: same logits for f32
//! weights, close ones for bf16 and Q8_0, for passes of any length, trees, hidden states and
//! layer ranges; and a packed model holding no second copy of its weights.

// A failure in a test or measurement helper is a failure of the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use burn::backend::Flex;
use burn::tensor::Tensor;
use spec_core::tree::TokenTree;
use spec_runtime::model::{
    ForwardOutput, HOST_PASS_ROWS, Head, LoadOptions, SKINNY_MAX_ROWS, Weight, WeightFormat,
};
use spec_runtime::{
    Architecture, ForwardRequest, KvCache, LogitRows, ModelConfig, RandomSource, Transformer,
};

/// Positions of the test models and of their caches: room for requests longer than
/// [`HOST_PASS_ROWS`], which the host path splits into passes.
const CAPACITY: usize = 160;

fn config(architecture: Architecture) -> ModelConfig {
    ModelConfig {
        architecture,
        vocab_size: 67,
        hidden_size: 48,
        intermediate_size: 80,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 12,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: CAPACITY,
        tie_word_embeddings: architecture == Architecture::Qwen2,
        qkv_bias: architecture == Architecture::Qwen2,
    }
}

fn model(architecture: Architecture, skinny_format: Option<WeightFormat>) -> Transformer<Flex> {
    model_with(
        architecture,
        LoadOptions {
            skinny_format,
            ..Default::default()
        },
    )
}

fn model_with(architecture: Architecture, options: LoadOptions) -> Transformer<Flex> {
    let config = config(architecture);
    let mut source = RandomSource::new(config.clone(), 5);
    Transformer::load_with(&config, &mut source, &Default::default(), options).unwrap()
}

/// Logits of every token of `tokens` fed `chunk` tokens at a time.
fn logits(model: &Transformer<Flex>, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut cache = model.new_cache(CAPACITY);
    let mut out = Vec::new();
    for part in tokens.chunks(chunk) {
        let y: Tensor<Flex, 2> = model
            .forward(
                ForwardRequest::tokens(part).logits(LogitRows::All),
                &mut cache,
            )
            .unwrap()
            .logits
            .unwrap();
        out.extend(y.into_data().to_vec::<f32>().unwrap());
    }
    out
}

/// Asserts `got` within `tolerance` of `want`, relative to `want`'s largest magnitude (or 1).
fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    let (diff, scale) = max_diff(got, want);
    assert!(
        diff <= tolerance * scale.max(1.0),
        "{what}: max |Δ| {diff} (max |value| {scale})"
    );
}

fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    let scale = b.iter().fold(0.0f32, |m, y| m.max(y.abs()));
    (diff, scale)
}

#[test]
fn skinny_path_is_built_on_flex() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let m = model(arch, Some(WeightFormat::F32));
        assert!(m.blocks.iter().all(|b| b.packed().is_some()));
        // The packed copy is the block's only one: its own projections hold none.
        assert!(m.blocks[0].attention.q_proj.packed().is_none());
        assert!(m.head.packed().is_some());
        assert_eq!(matches!(m.head, Head::Tied(_)), arch == Architecture::Qwen2);
        let off = model(arch, None);
        assert!(off.blocks[0].packed().is_none());
        assert!(off.head.packed().is_none());
    }
}

#[test]
fn f32_skinny_path_matches_burn() {
    let tokens: Vec<u32> = (0..HOST_PASS_ROWS as u32 + 8)
        .map(|i| (i * 7 + 3) % 67)
        .collect();
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let burn = logits(&model(arch, None), &tokens, 4);
        let skinny = model(arch, Some(WeightFormat::F32));
        for chunk in [1, 3, 4, SKINNY_MAX_ROWS] {
            assert_close(
                &logits(&skinny, &tokens, chunk),
                &burn,
                1e-4,
                &format!("{arch:?} chunks of {chunk}"),
            );
        }
        // One request longer than a pass runs on the host too (in two passes), close to
        // burn's result and not equal to it (rounding differs between the paths).
        let n = tokens.len();
        let long = logits(&skinny, &tokens, n);
        let burn_long = logits(&model(arch, None), &tokens, n);
        assert_close(
            &long,
            &burn_long,
            1e-4,
            &format!("{arch:?} one request of {n}"),
        );
        assert_ne!(long, burn_long, "{arch:?}: {n} rows ran through burn");
    }
}

#[test]
fn a_packed_model_holds_its_projections_once() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let packed = model(arch, Some(WeightFormat::F32));
        for block in &packed.blocks {
            for linear in block.projections() {
                assert!(matches!(linear.weight(), Weight::InBlock(_)), "{arch:?}");
            }
        }
        if let Head::Own(head) = &packed.head {
            assert!(matches!(head.weight(), Weight::Packed(_)), "{arch:?}");
        }
        let kept = model_with(
            arch,
            LoadOptions {
                skinny_format: Some(WeightFormat::F32),
                keep_unpacked: true,
                ..Default::default()
            },
        );
        let down = kept.blocks[1].mlp.down_proj.weight();
        assert!(matches!(down, Weight::Dense(_)), "{arch:?}");
        assert!(kept.blocks[1].packed().is_some(), "{arch:?}");
        if let Head::Own(head) = &kept.head {
            assert!(matches!(head.weight(), Weight::Both(_)), "{arch:?}");
        }
        // A projection that only its block's packed copy holds cannot run by itself, and an
        // input of the wrong width is refused: errors, not panics.
        let x = Tensor::<Flex, 2>::zeros([2, 48], &Default::default());
        assert!(packed.blocks[0].mlp.forward(x.clone()).is_err(), "{arch:?}");
        assert!(kept.blocks[0].mlp.down_proj.forward(x).is_err(), "{arch:?}");
        // The same bits either way: a kept copy is not used for a pass.
        let tokens: Vec<u32> = (0..HOST_PASS_ROWS as u32 + 4)
            .map(|i| (i * 7 + 3) % 67)
            .collect();
        assert_eq!(
            logits(&packed, &tokens, tokens.len()),
            logits(&kept, &tokens, tokens.len()),
            "{arch:?}"
        );
    }
}

/// A tree of [`HOST_PASS_ROWS`] + 4 tokens: the root and two branches under it, pushed
/// alternately (so in topological order, and two passes on the host path). Also returns the
/// longer branch, root first.
fn two_branch_tree() -> (TokenTree, Vec<usize>) {
    let longer = HOST_PASS_ROWS as u32 / 2 + 2;
    let mut tree = TokenTree::new(3);
    let (mut a, mut b) = (0, 0);
    let mut branch = vec![0];
    for i in 0..longer {
        if i + 1 < longer {
            a = tree.push(a, (i * 5 + 1) % 67).unwrap();
        }
        b = tree.push(b, (i * 3 + 7) % 67).unwrap();
        branch.push(b);
    }
    assert_eq!(tree.tokens().len(), HOST_PASS_ROWS + 4);
    (tree, branch)
}

/// `tree` after what `cache` holds: its ancestor mask and positions, `logits` and the hidden
/// states after `hidden_after`.
fn run_tree(
    model: &Transformer<Flex>,
    tree: &TokenTree,
    cache: &mut KvCache<Flex>,
    logits: LogitRows,
    hidden_after: Vec<usize>,
) -> ForwardOutput<Flex> {
    let mask = tree.ancestor_mask();
    let positions = tree.positions(cache.len());
    model
        .forward(
            ForwardRequest::tokens(tree.tokens())
                .positions(&positions)
                .mask(&mask)
                .logits(logits)
                .hidden_after(hidden_after),
            cache,
        )
        .unwrap()
}

/// A tree of [`HOST_PASS_ROWS`] + 4 new tokens (two passes), all their logits, the hidden state
/// after each layer, then [`HOST_PASS_ROWS`] + 2 tokens that all attend to each other (a mask
/// that cannot be split: one pass), and the output head applied to their rows directly.
fn long_requests(model: &Transformer<Flex>) -> Vec<f32> {
    let read = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
    let prompt: Vec<u32> = (0..5).map(|i| (i * 11 + 2) % 67).collect();
    let mut cache = model.new_cache(CAPACITY);
    model
        .forward(ForwardRequest::tokens(&prompt), &mut cache)
        .unwrap();
    let (tree, _) = two_branch_tree();
    let step = run_tree(model, &tree, &mut cache, LogitRows::All, vec![0, 1, 2]);
    let mut out = read(step.logits.unwrap());
    for h in step.hidden {
        out.extend(read(h));
    }
    let n = HOST_PASS_ROWS + 2;
    let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 13 + 4) % 67).collect();
    let everyone = vec![true; n * n];
    let step = model
        .forward(
            ForwardRequest::tokens(&tokens)
                .mask(&everyone)
                .logits(LogitRows::Rows(vec![n - 1, 0, 9])),
            &mut cache,
        )
        .unwrap();
    out.extend(read(step.logits.unwrap()));
    let x = step.last_hidden.slice([0..n, 0..48]);
    out.extend(read(model.logits(x).unwrap()));
    out
}

/// The logits of every node on one branch of a long tree (two passes on the host path)
/// equal those of the branch decoded as a plain chain after the same prompt.
#[test]
fn a_branch_of_a_long_tree_scores_as_its_chain() {
    let read = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
    let vocab = 67;
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let model = model(arch, Some(WeightFormat::F32));
        let prompt: Vec<u32> = (0..5).map(|i| (i * 11 + 2) % 67).collect();
        let mut cache = model.new_cache(CAPACITY);
        model
            .forward(ForwardRequest::tokens(&prompt), &mut cache)
            .unwrap();
        let (tree, branch) = two_branch_tree();
        let step = run_tree(&model, &tree, &mut cache, LogitRows::All, Vec::new());
        let logits = read(step.logits.unwrap());
        let on_branch: Vec<f32> = branch
            .iter()
            .flat_map(|&node| logits[node * vocab..(node + 1) * vocab].to_vec())
            .collect();
        let chain_tokens: Vec<u32> = branch.iter().map(|&node| tree.tokens()[node]).collect();
        let mut chain_cache = model.new_cache(CAPACITY);
        model
            .forward(ForwardRequest::tokens(&prompt), &mut chain_cache)
            .unwrap();
        let chain = model
            .forward(
                ForwardRequest::tokens(&chain_tokens).logits(LogitRows::All),
                &mut chain_cache,
            )
            .unwrap()
            .logits
            .unwrap();
        assert_close(&on_branch, &read(chain), 1e-5, &format!("{arch:?}"));
    }
}

#[test]
fn long_trees_hidden_states_and_all_logits_match_burn() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let burn = long_requests(&model(arch, None));
        let host = long_requests(&model(arch, Some(WeightFormat::F32)));
        assert_close(&host, &burn, 1e-4, &format!("{arch:?}"));
        assert_ne!(host, burn, "{arch:?}: nothing ran on the host");
    }
}

/// On the host path a token's logits do not depend on how many tokens share its pass: one pass
/// of several tokens (a verification) gives the bits of single decode steps, which greedy
/// speculative decoding needs at near-ties. Heads of 32 so that attention takes its SIMD loops.
#[test]
fn a_pass_of_several_tokens_equals_single_steps_bit_for_bit() {
    let tokens: Vec<u32> = (0..HOST_PASS_ROWS as u32 + 6)
        .map(|i| (i * 5 + 1) % 67)
        .collect();
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let config = ModelConfig {
            hidden_size: 128,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
            ..config(arch)
        };
        for format in [WeightFormat::F32, WeightFormat::Q8_0A8] {
            let mut source = RandomSource::new(config.clone(), 9);
            let model = Transformer::<Flex>::load_with(
                &config,
                &mut source,
                &Default::default(),
                LoadOptions {
                    skinny_format: Some(format),
                    ..Default::default()
                },
            )
            .unwrap();
            let single: Vec<u32> = logits(&model, &tokens, 1)
                .iter()
                .map(|v| v.to_bits())
                .collect();
            for chunk in [2, 5, SKINNY_MAX_ROWS, tokens.len()] {
                let batched: Vec<u32> = logits(&model, &tokens, chunk)
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert!(
                    batched == single,
                    "{arch:?} {format}: passes of {chunk} differ from single steps"
                );
            }
        }
    }
}

/// A prompt of [`HOST_PASS_ROWS`] + 24 tokens (logits of the last only) and then a 3-token
/// step: the prompt runs in two passes on the host path in the packed model, in one pass through
/// burn in the other.
fn prompt_then_step(model: &Transformer<Flex>) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let prompt: Vec<u32> = (0..HOST_PASS_ROWS as u32 + 24)
        .map(|i| (i * 11 + 2) % 67)
        .collect();
    let mut cache = model.new_cache(CAPACITY);
    let out = model
        .forward(
            ForwardRequest::tokens(&prompt).logits(LogitRows::Last),
            &mut cache,
        )
        .unwrap();
    assert_eq!(out.last_hidden.dims()[0], prompt.len());
    assert_eq!(cache.len(), prompt.len());
    let last = out.logits.unwrap().into_data().to_vec::<f32>().unwrap();
    let hidden = out.last_hidden.into_data().to_vec::<f32>().unwrap();
    let step = model
        .forward(
            ForwardRequest::tokens(&[5, 6, 7]).logits(LogitRows::All),
            &mut cache,
        )
        .unwrap();
    let step = step.logits.unwrap().into_data().to_vec::<f32>().unwrap();
    (last, hidden, step)
}

#[test]
fn long_prompts_run_in_host_passes_that_match_one_burn_pass() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let (burn_last, burn_hidden, burn_step) = prompt_then_step(&model(arch, None));
        let (last, hidden, step) = prompt_then_step(&model(arch, Some(WeightFormat::F32)));
        for (what, got, want) in [
            ("last logits", &last, &burn_last),
            ("hidden states", &hidden, &burn_hidden),
            ("next step's logits", &step, &burn_step),
        ] {
            assert_close(got, want, 1e-4, &format!("{arch:?} {what}"));
        }
        // Rounding differs between the paths, so a bit-for-bit match would mean the packed
        // model did not take the host passes.
        assert_ne!(hidden, burn_hidden, "{arch:?}: the prompt ran through burn");

        // Q8_0 prompts take the host passes too, within its rounding of burn's result; through
        // burn (f32 weights) the last logits would equal burn's exactly.
        let (q8_last, _, q8_step) = prompt_then_step(&model(arch, Some(WeightFormat::Q8_0)));
        for (what, got, want) in [
            ("last logits", &q8_last, &burn_last),
            ("next step's logits", &q8_step, &burn_step),
        ] {
            let (diff, scale) = max_diff(got, want);
            assert!(
                diff > 0.0,
                "{arch:?} Q8_0 {what}: equal to burn's, no host passes"
            );
            assert!(
                diff <= 0.05 * scale.max(1.0),
                "{arch:?} Q8_0 {what}: max |Δ| {diff} (max |value| {scale})"
            );
        }
    }
}

#[test]
fn narrow_formats_are_close_but_not_exact() {
    let tokens: Vec<u32> = (0..12).map(|i| (i * 5 + 1) % 67).collect();
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let burn = logits(&model(arch, None), &tokens, 4);
        for format in [WeightFormat::Bf16, WeightFormat::Q8_0] {
            let got = logits(&model(arch, Some(format)), &tokens, 4);
            let (diff, scale) = max_diff(&got, &burn);
            assert!(diff > 0.0, "{arch:?} {format}: rounding had no effect");
            assert!(
                diff <= 0.05 * scale.max(1.0),
                "{arch:?} {format}: max |Δ| {diff} (max |logit| {scale})"
            );
        }
    }
}

/// One run of a prompt, a token tree after it, the kept path and a layer-range pass, returning
/// every logit and hidden state it produced.
fn tree_and_ranges(model: &Transformer<Flex>) -> Vec<f32> {
    use spec_runtime::Input;
    let read = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 11 + 2) % 67).collect();
    let mut cache = model.new_cache(CAPACITY);
    let mut out = Vec::new();
    model
        .forward(ForwardRequest::tokens(&prompt), &mut cache)
        .unwrap();
    let base = cache.len();
    let mut tree = TokenTree::new(5);
    let a = tree.push(0, 14).unwrap();
    let b = tree.push(0, 27).unwrap();
    let a1 = tree.push(a, 50).unwrap();
    tree.push(b, 19).unwrap();
    let step = run_tree(
        model,
        &tree,
        &mut cache,
        LogitRows::Rows(vec![3, 0]),
        vec![1],
    );
    out.extend(read(step.logits.unwrap()));
    out.extend(read(step.hidden[0].clone()));
    cache.keep_path(base, &[0, a, a1]).unwrap();
    // Two layers by themselves, then the rest from their hidden state.
    let first = model
        .forward(
            ForwardRequest::tokens(&[33, 8])
                .layers(0..1)
                .logits(LogitRows::None),
            &mut cache,
        )
        .unwrap();
    let rest = model
        .forward(
            ForwardRequest {
                input: Input::Hidden(first.last_hidden),
                ..ForwardRequest::tokens(&[])
            }
            .layers(1..2)
            .logits(LogitRows::All),
            &mut cache,
        )
        .unwrap();
    out.extend(read(rest.logits.unwrap()));
    out.extend(read(rest.last_hidden));
    out
}

#[test]
fn host_path_matches_burn_on_trees_kept_paths_and_layer_ranges() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let burn = tree_and_ranges(&model(arch, None));
        let host = tree_and_ranges(&model(arch, Some(WeightFormat::F32)));
        assert_close(&host, &burn, 1e-4, &format!("{arch:?}"));
    }
}

#[test]
fn packing_after_load_equals_packing_at_load() {
    let tokens: Vec<u32> = (0..10).map(|i| (i * 13 + 4) % 67).collect();
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let at_load = logits(&model(arch, Some(WeightFormat::Bf16)), &tokens, 3);
        let mut later = model(arch, None);
        later.pack(WeightFormat::Bf16).unwrap();
        assert_eq!(logits(&later, &tokens, 3), at_load, "{arch:?}");
        // From a packed f32 copy alone (burn's tensors dropped): the same weights.
        let mut from_f32 = model(arch, Some(WeightFormat::F32));
        from_f32.pack(WeightFormat::Bf16).unwrap();
        assert_eq!(logits(&from_f32, &tokens, 3), at_load, "{arch:?}");
        // A rounded copy alone cannot give the checkpoint's weights back: an error, and the
        // model keeps its Q8_0 copy; with burn's tensors kept it repacks.
        let mut from_q8 = model(arch, Some(WeightFormat::Q8_0));
        let before = logits(&from_q8, &tokens, 3);
        let err = from_q8.pack(WeightFormat::Bf16).unwrap_err().to_string();
        assert!(err.contains("reload"), "{arch:?}: {err}");
        assert_eq!(logits(&from_q8, &tokens, 3), before, "{arch:?}");
        let mut kept = model_with(
            arch,
            LoadOptions {
                skinny_format: Some(WeightFormat::Q8_0),
                keep_unpacked: true,
                ..Default::default()
            },
        );
        kept.pack(WeightFormat::Bf16).unwrap();
        assert_eq!(logits(&kept, &tokens, 3), at_load, "{arch:?}");
    }
}
