//! The forward pass gives the same logits however the tokens are grouped: one pass or many, a
//! tree or its paths, after a rollback or fresh, one layer range at a time or all at once.
//! Small seeded random models; run on flex always, on wgpu in CI (Mesa's software Vulkan), on
//! cuda where a GPU is lent.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

mod common;

use burn::tensor::{Tensor, backend::Backend};
use spec_core::tree::TokenTree;
use spec_runtime::{
    Architecture, ForwardRequest, Input, LogitRows, ModelConfig, RandomSource, RuntimeError,
    Transformer,
};

use common::*;

fn config(architecture: Architecture) -> ModelConfig {
    ModelConfig {
        architecture,
        vocab_size: 61,
        hidden_size: 32,
        intermediate_size: 48,
        num_layers: 3,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: architecture == Architecture::Qwen2,
        qkv_bias: architecture == Architecture::Qwen2,
    }
}

fn model<B: Backend>(architecture: Architecture, device: &B::Device) -> Transformer<B> {
    let config = config(architecture);
    let mut source = RandomSource::new(config.clone(), 7);
    Transformer::load(&config, &mut source, device).unwrap()
}

fn rows<B: Backend>(t: Tensor<B, 2>) -> Vec<Vec<f32>> {
    let [r, c] = t.dims();
    let data: Vec<f32> = t.into_data().convert::<f32>().to_vec().unwrap();
    (0..r).map(|i| data[i * c..(i + 1) * c].to_vec()).collect()
}

const PROMPT: [u32; 5] = [3, 17, 42, 8, 60];
const CONTINUATION: [u32; 4] = [11, 5, 29, 33];

fn one_pass_equals_single_steps<B: Backend>(device: &B::Device, tolerance: f32) {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let m = model::<B>(arch, device);
        let mut cache = m.new_cache(64);
        m.forward(ForwardRequest::tokens(&PROMPT), &mut cache)
            .unwrap();
        let batched = m
            .forward(
                ForwardRequest::tokens(&CONTINUATION).logits(LogitRows::All),
                &mut cache,
            )
            .unwrap();
        let batched = rows(batched.logits.unwrap());
        assert_eq!(cache.len(), PROMPT.len() + CONTINUATION.len());

        let mut cache = m.new_cache(64);
        // The prompt one token at a time too.
        for t in PROMPT {
            m.forward(ForwardRequest::tokens(&[t]), &mut cache).unwrap();
        }
        for (i, t) in CONTINUATION.iter().enumerate() {
            let out = m
                .forward(ForwardRequest::tokens(&[*t]), &mut cache)
                .unwrap();
            let row = rows(out.logits.unwrap()).remove(0);
            assert_close(&row, &batched[i], tolerance, &format!("{arch:?} step {i}"));
        }
    }
}

fn tree_equals_paths<B: Backend>(device: &B::Device, tolerance: f32) {
    let m = model::<B>(Architecture::Qwen2, device);
    // Root = the last accepted token (not cached yet); two branches, one of depth 3.
    let mut tree = TokenTree::new(9);
    let a = tree.push(0, 14).unwrap();
    let b = tree.push(0, 27).unwrap();
    let a1 = tree.push(a, 50).unwrap();
    let a2 = tree.push(a, 2).unwrap();
    let a11 = tree.push(a1, 36).unwrap();
    let b1 = tree.push(b, 19).unwrap();

    let mut cache = m.new_cache(64);
    m.forward(ForwardRequest::tokens(&PROMPT), &mut cache)
        .unwrap();
    let base = cache.len();
    let mask = tree.ancestor_mask();
    let positions = tree.positions(base);
    let out = m
        .forward(
            ForwardRequest::tokens(tree.tokens())
                .positions(&positions)
                .mask(&mask)
                .logits(LogitRows::All),
            &mut cache,
        )
        .unwrap();
    let tree_logits = rows(out.logits.unwrap());

    for leaf in [a11, a2, b1] {
        // `path_to` starts below the root; the root is the first token of the chain.
        let mut path = vec![0];
        path.extend(tree.path_to(leaf));
        let tokens: Vec<u32> = path.iter().map(|&n| tree.token(n)).collect();
        let mut chain_cache = m.new_cache(64);
        m.forward(ForwardRequest::tokens(&PROMPT), &mut chain_cache)
            .unwrap();
        let chain = m
            .forward(
                ForwardRequest::tokens(&tokens).logits(LogitRows::All),
                &mut chain_cache,
            )
            .unwrap();
        let chain = rows(chain.logits.unwrap());
        for (i, &node) in path.iter().enumerate() {
            assert_close(
                &tree_logits[node],
                &chain[i],
                tolerance,
                &format!("node {node} on the path to {leaf}"),
            );
        }
    }

    // Keep the path root → a → a1 → a11, then decode one more token: equals the chain.
    let mut path = vec![0];
    path.extend(tree.path_to(a11));
    cache.keep_path(base, &path).unwrap();
    assert_eq!(cache.len(), base + path.len());
    let next = m
        .forward(ForwardRequest::tokens(&[44]), &mut cache)
        .unwrap();
    let mut chain_cache = m.new_cache(64);
    let mut tokens = PROMPT.to_vec();
    tokens.extend(path.iter().map(|&n| tree.token(n)));
    tokens.push(44);
    let fresh = m
        .forward(ForwardRequest::tokens(&tokens), &mut chain_cache)
        .unwrap();
    assert_close(
        &rows(next.logits.unwrap())[0],
        &rows(fresh.logits.unwrap())[0],
        tolerance,
        "after keep_path",
    );
}

fn truncate_and_rerun_equals_fresh<B: Backend>(device: &B::Device, tolerance: f32) {
    let m = model::<B>(Architecture::Llama, device);
    let mut cache = m.new_cache(64);
    m.forward(ForwardRequest::tokens(&PROMPT), &mut cache)
        .unwrap();
    // Draft three tokens that get rejected, roll back, continue differently.
    m.forward(ForwardRequest::tokens(&[1, 2, 3]), &mut cache)
        .unwrap();
    cache.truncate(PROMPT.len());
    let rerun = m
        .forward(
            ForwardRequest::tokens(&CONTINUATION).logits(LogitRows::All),
            &mut cache,
        )
        .unwrap();

    let mut fresh_cache = m.new_cache(64);
    let mut all = PROMPT.to_vec();
    all.extend(CONTINUATION);
    let fresh = m
        .forward(
            ForwardRequest::tokens(&all).logits(LogitRows::Rows(vec![5, 6, 7, 8])),
            &mut fresh_cache,
        )
        .unwrap();
    let (rerun, fresh) = (rows(rerun.logits.unwrap()), rows(fresh.logits.unwrap()));
    for i in 0..CONTINUATION.len() {
        assert_close(
            &rerun[i],
            &fresh[i],
            tolerance,
            &format!("row {i} after truncate"),
        );
    }
}

fn layer_ranges_compose<B: Backend>(device: &B::Device, tolerance: f32) {
    let m = model::<B>(Architecture::Qwen2, device);
    let mut full_cache = m.new_cache(64);
    let full = m
        .forward(
            ForwardRequest::tokens(&PROMPT)
                .logits(LogitRows::All)
                .hidden_after(vec![0, 1, 3]),
            &mut full_cache,
        )
        .unwrap();

    let mut cache = m.new_cache(64);
    let first = m
        .forward(
            ForwardRequest::tokens(&PROMPT)
                .layers(0..1)
                .logits(LogitRows::None),
            &mut cache,
        )
        .unwrap();
    assert_eq!(cache.layer_len(0), PROMPT.len());
    assert_eq!(cache.layer_len(1), 0);
    let rest = m
        .forward(
            ForwardRequest {
                input: Input::Hidden(first.last_hidden.clone()),
                ..ForwardRequest::tokens(&[])
            }
            .layers(1..3)
            .logits(LogitRows::All),
            &mut cache,
        )
        .unwrap();
    let (a, b) = (rows(rest.logits.unwrap()), rows(full.logits.unwrap()));
    for i in 0..PROMPT.len() {
        assert_close(
            &a[i],
            &b[i],
            tolerance,
            &format!("row {i} through split layers"),
        );
    }
    let hidden: Vec<_> = full.hidden.into_iter().map(rows).collect();
    assert_eq!(hidden.len(), 3);
    for i in 0..PROMPT.len() {
        assert_close(
            &rows(first.last_hidden.clone())[i],
            &hidden[1][i],
            tolerance,
            "after 1",
        );
        assert_close(
            &rows(full.last_hidden.clone())[i],
            &hidden[2][i],
            tolerance,
            "after 3",
        );
    }
    // The embeddings (after 0 layers) differ from after 1 layer: the hook is not a copy.
    assert_ne!(hidden[0][0], hidden[1][0]);
}

fn bad_requests_are_errors<B: Backend>(device: &B::Device) {
    let m = model::<B>(Architecture::Llama, device);
    let mut cache = m.new_cache(8);
    assert!(matches!(
        m.forward(ForwardRequest::tokens(&[61]), &mut cache),
        Err(RuntimeError::TokenOutOfVocabulary { token: 61, .. })
    ));
    assert!(matches!(
        m.forward(ForwardRequest::tokens(&[1; 9]), &mut cache),
        Err(RuntimeError::ContextOverflow {
            needed: 9,
            capacity: 8
        })
    ));
    assert!(matches!(
        m.forward(
            ForwardRequest::tokens(&[1, 2]).mask(&[true, false, false, false]),
            &mut cache
        ),
        Err(RuntimeError::InvalidRequest(_))
    ));
    assert!(matches!(
        m.forward(ForwardRequest::tokens(&[1]).layers(1..5), &mut cache),
        Err(RuntimeError::InvalidRequest(_))
    ));
    assert!(cache.is_empty(), "failed requests wrote nothing");
    m.forward(ForwardRequest::tokens(&[1; 8]), &mut cache)
        .unwrap();
    assert!(matches!(
        m.forward(ForwardRequest::tokens(&[1]), &mut cache),
        Err(RuntimeError::ContextOverflow {
            needed: 9,
            capacity: 8
        })
    ));
}

macro_rules! backend_tests {
    ($name:ident, $backend:ty, $device:expr, $tolerance:ident) => {
        mod $name {
            type B = $backend;
            #[test]
            fn one_pass_equals_single_steps() {
                super::one_pass_equals_single_steps::<B>(&$device, super::$tolerance);
            }
            #[test]
            fn tree_equals_paths() {
                super::tree_equals_paths::<B>(&$device, super::$tolerance);
            }
            #[test]
            fn truncate_and_rerun_equals_fresh() {
                super::truncate_and_rerun_equals_fresh::<B>(&$device, super::$tolerance);
            }
            #[test]
            fn layer_ranges_compose() {
                super::layer_ranges_compose::<B>(&$device, super::$tolerance);
            }
            #[test]
            fn bad_requests_are_errors() {
                super::bad_requests_are_errors::<B>(&$device);
            }
        }
    };
}

#[cfg(feature = "flex")]
backend_tests!(flex, burn::backend::Flex, Default::default(), F32_TOLERANCE);
#[cfg(feature = "wgpu")]
backend_tests!(
    wgpu,
    burn::backend::Wgpu,
    burn::backend::wgpu::WgpuDevice::default(),
    F32_TOLERANCE
);
#[cfg(feature = "cuda")]
backend_tests!(
    cuda,
    burn::backend::Cuda,
    burn::backend::cuda::CudaDevice::default(),
    TF32_TOLERANCE
);

/// A weight larger than the device's buffers is refused at load, naming it, rather than failing
/// later in the backend's device thread; at the limit the model loads.
#[cfg(feature = "flex")]
#[test]
fn a_weight_over_the_buffer_limit_is_refused_at_load() {
    use spec_runtime::model::LoadOptions;
    type B = burn::backend::Flex;
    let config = config(Architecture::Qwen2);
    // The largest weight: the 61 × 32 embedding, 7,808 bytes in f32.
    let load = |limit: u64| {
        let mut source = RandomSource::new(config.clone(), 7);
        let options = LoadOptions {
            max_buffer_bytes: Some(limit),
            ..LoadOptions::default()
        };
        Transformer::<B>::load_with(&config, &mut source, &Default::default(), options)
    };
    match load(7_807) {
        Err(RuntimeError::WeightTooLarge { name, bytes, limit }) => {
            assert_eq!((name, bytes, limit), ("token embedding", 7_808, 7_807));
        }
        other => panic!("expected WeightTooLarge, got {:?}", other.map(|_| ())),
    }
    assert!(load(7_808).is_ok());
}
