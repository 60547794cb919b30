//! A token tree fed one level at a time (`NewTokens::MaskWithCached`: each level's nodes see
//! their ancestors among the levels already cached) scores every node as the whole tree fed in
//! one pass does, on the host path and on burn's, and a bad mask is an error.

#![allow(clippy::unwrap_used)]

use burn::backend::Flex;
use spec_core::tree::TokenTree;
use spec_runtime::model::{LoadOptions, WeightFormat};
use spec_runtime::{
    Architecture, ForwardRequest, LogitRows, ModelConfig, RandomSource, RuntimeError, Transformer,
};

fn model(skinny_format: Option<WeightFormat>) -> Transformer<Flex> {
    let config = ModelConfig {
        architecture: Architecture::Qwen2,
        vocab_size: 53,
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
        qkv_bias: true,
    };
    let mut source = RandomSource::new(config.clone(), 9);
    let options = LoadOptions {
        skinny_format,
        ..Default::default()
    };
    Transformer::load_with(&config, &mut source, &Default::default(), options).unwrap()
}

/// Root 7 with three children, two grandchildren under the first and one under the third, and
/// a great-grandchild: nodes are numbered level by level.
fn tree() -> TokenTree {
    let mut t = TokenTree::new(7);
    let a = t.push(0, 11).unwrap();
    let _b = t.push(0, 12).unwrap();
    let c = t.push(0, 13).unwrap();
    let d = t.push(a, 21).unwrap();
    let _e = t.push(a, 22).unwrap();
    let _f = t.push(c, 23).unwrap();
    t.push(d, 31).unwrap();
    t
}

fn rows(t: burn::tensor::Tensor<Flex, 2>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

const PROMPT: [u32; 6] = [1, 5, 9, 14, 2, 40];

/// Every node's logits from the whole tree in one masked pass after the prompt.
fn one_pass(m: &Transformer<Flex>, t: &TokenTree) -> Vec<f32> {
    let mut cache = m.new_cache(64);
    m.forward(
        ForwardRequest::tokens(&PROMPT).logits(LogitRows::None),
        &mut cache,
    )
    .unwrap();
    let mask = t.ancestor_mask();
    let positions = t.positions(cache.len());
    rows(
        m.forward(
            ForwardRequest::tokens(t.tokens())
                .positions(&positions)
                .mask(&mask)
                .logits(LogitRows::All),
            &mut cache,
        )
        .unwrap()
        .logits
        .unwrap(),
    )
}

/// The same logits, one level per pass, each level masked over the levels cached before it.
fn by_levels(m: &Transformer<Flex>, t: &TokenTree) -> Vec<f32> {
    let mut cache = m.new_cache(64);
    m.forward(
        ForwardRequest::tokens(&PROMPT).logits(LogitRows::None),
        &mut cache,
    )
    .unwrap();
    let base = cache.len();
    let all = t.ancestor_mask();
    let n_all = t.len();
    let mut out = Vec::new();
    let mut start = 0;
    while start < n_all {
        let depth = t.depth(start);
        let end = (start..n_all)
            .find(|&i| t.depth(i) != depth)
            .unwrap_or(n_all);
        // Columns: the nodes cached before this level, then this level's.
        let width = end;
        let mask: Vec<bool> = (start..end)
            .flat_map(|i| (0..width).map(move |j| (i, j)))
            .map(|(i, j)| all[i * n_all + j])
            .collect();
        let tokens = &t.tokens()[start..end];
        let positions: Vec<usize> = (start..end).map(|i| base + t.depth(i)).collect();
        let logits = m
            .forward(
                ForwardRequest::tokens(tokens)
                    .positions(&positions)
                    .mask_with_cached(start, &mask)
                    .logits(LogitRows::All),
                &mut cache,
            )
            .unwrap()
            .logits
            .unwrap();
        out.extend(rows(logits));
        start = end;
    }
    out
}

#[test]
fn a_tree_fed_level_by_level_scores_as_one_pass() {
    let t = tree();
    for format in [Some(WeightFormat::F32), None] {
        let m = model(format);
        let want = one_pass(&m, &t);
        let got = by_levels(&m, &t);
        assert_eq!(got.len(), want.len());
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "{format:?}: largest difference {worst}");
    }
}

#[test]
fn a_cached_span_longer_than_the_cache_or_a_bad_mask_is_an_error() {
    let m = model(Some(WeightFormat::F32));
    let mut cache = m.new_cache(64);
    m.forward(
        ForwardRequest::tokens(&[1, 2]).logits(LogitRows::None),
        &mut cache,
    )
    .unwrap();
    let try_mask = |span: usize, mask: &[bool], cache: &mut _| {
        m.forward(
            ForwardRequest::tokens(&[3, 4])
                .mask_with_cached(span, mask)
                .logits(LogitRows::None),
            cache,
        )
    };
    // Span 3 over a cache of 2.
    let mask = [true; 2 * 5];
    assert!(matches!(
        try_mask(3, &mask, &mut cache),
        Err(RuntimeError::InvalidRequest(_))
    ));
    // A mask of the wrong size.
    assert!(try_mask(1, &[true; 4], &mut cache).is_err());
    // A new token that does not see itself.
    let mut mask = [true; 2 * 3];
    mask[1] = false;
    assert!(try_mask(1, &mask, &mut cache).is_err());
    assert_eq!(cache.len(), 2, "a refused request writes nothing");
}
