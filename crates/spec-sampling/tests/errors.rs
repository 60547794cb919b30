//! Bad setups and bad drafts give clear, typed errors.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{B, cached_model, config, model, poisoned_model};
use spec_core::error::{Source, SpecError};
use spec_core::sampling::SamplingConfig;
use spec_engine::{EngineError, generate_speculative};
use spec_runtime::GenerateOptions;
use spec_sampling::{DraftLength, DraftModelDrafter, SamplingError, check_vocabularies};
use spec_tokenizer::TextTokenizer;

#[test]
fn zero_draft_length_is_rejected() {
    let c = config(32, 16, 1, 64);
    for length in [
        DraftLength::Fixed(0),
        DraftLength::Auto { max: 0 },
        DraftLength::Confident {
            max: 0,
            threshold: 0.5,
        },
    ] {
        let err = DraftModelDrafter::<B>::new(model(&c, 1), 32, length).unwrap_err();
        assert!(matches!(err, SamplingError::ZeroDraftLength), "{err}");
        assert!(err.to_string().contains("at least 1"));
    }
    let err = DraftModelDrafter::<B>::new(
        model(&c, 1),
        32,
        DraftLength::Confident {
            max: 3,
            threshold: 0.0,
        },
    )
    .unwrap_err();
    assert!(matches!(err, SamplingError::InvalidThreshold(_)), "{err}");
}

#[test]
fn different_model_widths_need_tokenizers() {
    let draft = model(&config(24, 16, 1, 64), 1);
    let err = DraftModelDrafter::<B>::new(draft, 32, DraftLength::Fixed(2)).unwrap_err();
    assert!(
        matches!(
            err,
            SamplingError::VocabularySize {
                draft: 24,
                target: 32
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("with_tokenizers"), "{err}");
}

#[test]
fn nan_draft_gives_the_typed_error() {
    let c = config(32, 16, 1, 64);
    let target = model(&c, 1);
    let mut drafter =
        DraftModelDrafter::<B>::new(poisoned_model(&c, 2), 32, DraftLength::Fixed(3)).unwrap();
    for sampling in [
        SamplingConfig::greedy(),
        SamplingConfig::with_temperature(1.0),
        SamplingConfig::with_temperature(0.7).top_p(0.9),
    ] {
        let options = GenerateOptions::new(8, sampling);
        let err = generate_speculative(&target, &mut drafter, &[1, 2, 3], &options, &mut |_| {})
            .unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::Verify(SpecError::NonFiniteLogits {
                    what: Source::Draft,
                    ..
                })
            ),
            "{sampling:?}: {err}"
        );
    }
}

#[test]
fn draft_wider_or_narrower_than_the_target_is_exact() {
    // q must have the target's width: zeros where a narrower draft has no ids, the extra logits
    // of a wider draft dropped. Greedy output must still equal plain decoding.
    let c = config(32, 16, 1, 64);
    let target = model(&c, 1);
    let options = GenerateOptions::new(16, SamplingConfig::greedy());
    let plain = spec_runtime::generate_plain(&target, &[1, 2, 3], &options, &mut |_| {}).unwrap();
    for width in [24, 40] {
        let draft = model(&config(width, 16, 1, 64), 5);
        let mut drafter =
            DraftModelDrafter::<B>::with_padded_vocabulary(draft, 32, DraftLength::Fixed(3))
                .unwrap();
        let spec =
            generate_speculative(&target, &mut drafter, &[1, 2, 3], &options, &mut |_| {}).unwrap();
        assert_eq!(spec.tokens, plain.tokens, "draft width {width}");
        assert!(spec.metrics.drafted > 0);
    }
    // Sampled: runs, and the verifier accepts q's shape.
    let options = GenerateOptions::new(16, SamplingConfig::with_temperature(1.0).seed(4));
    let draft = model(&config(24, 16, 1, 64), 5);
    let mut drafter =
        DraftModelDrafter::<B>::with_padded_vocabulary(draft, 32, DraftLength::Fixed(3)).unwrap();
    let spec =
        generate_speculative(&target, &mut drafter, &[1, 2, 3], &options, &mut |_| {}).unwrap();
    assert_eq!(spec.tokens.len(), 16);
}

#[test]
fn tokenizer_wider_than_its_model_is_rejected() {
    let Some(path) = cached_model("smollm2-135m") else {
        return;
    };
    let tokenizer = TextTokenizer::from_gguf_path(&path).unwrap();
    let draft = model(&config(32, 16, 1, 64), 5);
    let err = DraftModelDrafter::<B>::with_tokenizers(
        draft,
        &tokenizer,
        49152,
        &tokenizer,
        DraftLength::Fixed(2),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            SamplingError::TokenizerLargerThanModel { which: "draft", .. }
        ),
        "{err}"
    );
}

#[test]
fn mismatched_tokenizers_are_rejected() {
    let (Some(smol), Some(qwen)) = (
        cached_model("smollm2-135m"),
        cached_model("qwen2.5-coder-0.5b"),
    ) else {
        return;
    };
    let smol = TextTokenizer::from_gguf_path(&smol).unwrap();
    let qwen = TextTokenizer::from_gguf_path(&qwen).unwrap();
    let err = check_vocabularies(&smol, 49152, &qwen, 151_936).unwrap_err();
    assert!(
        matches!(err, SamplingError::VocabularyMismatch { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("differ at token id"), "{err}");
    // The same tokenizer on both sides passes; so does Qwen's 151,936-wide output layer for its
    // smaller tokenizer.
    check_vocabularies(&qwen, 151_936, &qwen, 151_936).unwrap();
    check_vocabularies(&smol, 49152, &smol, 49152).unwrap();
}
