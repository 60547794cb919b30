//! The heads file: what is saved loads back the same; heads of another model, a truncated file
//! and a file that is not a heads file are each one clear error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use burn::backend::Flex;
use burn::module::Param;
use burn::tensor::{Distribution, Tensor};
use spec_medusa::file::{FORMAT, load, save};
use spec_medusa::{HeadsInfo, MedusaHeads};
use spec_train::identity::TargetIdentity;

type B = Flex;

fn identity() -> TargetIdentity {
    TargetIdentity {
        hidden_size: 8,
        vocab_size: 11,
        fingerprint: "ab".repeat(32),
    }
}

fn heads(own: bool) -> MedusaHeads<B> {
    let device = Default::default();
    let out = own.then(|| Tensor::<B, 2>::random([11, 8], Distribution::Default, &device));
    let mut h = MedusaHeads::<B>::new(2, 8, out, &device);
    for block in &mut h.blocks {
        block.linear.weight = Param::from_tensor(Tensor::random(
            [8, 8],
            Distribution::Normal(0.0, 1.0),
            &device,
        ));
    }
    h
}

fn info(own: bool) -> HeadsInfo {
    HeadsInfo {
        format: FORMAT,
        heads: 2,
        own_projections: own,
        target: identity(),
        rank_accuracy: vec![vec![0.5, 0.2], vec![0.3, 0.1]],
        training: serde_json::json!({"steps": 3}),
        draft_vocab: None,
    }
}

#[test]
fn saved_heads_load_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let shared = Tensor::<B, 2>::random([11, 8], Distribution::Default, &device);
    let x = Tensor::<B, 2>::random([3, 8], Distribution::Default, &device);
    for own in [false, true] {
        let path = dir.path().join(format!("heads-{own}.safetensors"));
        let h = heads(own);
        save(&h, &info(own), &path).unwrap();
        let loaded = load::<B>(&path, &identity(), &device).unwrap();
        assert_eq!(loaded.info, info(own));
        let before = h.logits(x.clone(), Some(&shared));
        let after = loaded.heads.logits(x.clone(), Some(&shared));
        assert_eq!(before.len(), 2);
        for (a, b) in h.blocks.iter().zip(&loaded.heads.blocks) {
            let (a, b) = (a.linear.weight.val(), b.linear.weight.val());
            a.into_data().assert_eq(&b.into_data(), true);
        }
        for (a, b) in h.projections.iter().zip(&loaded.heads.projections) {
            let (a, b) = (a.weight.val(), b.weight.val());
            a.into_data().assert_eq(&b.into_data(), true);
        }
        // Logits agree to rounding: a view transposed at creation and a stored copy may take
        // different product kernels.
        for (a, b) in before.into_iter().zip(after) {
            a.into_data()
                .assert_approx_eq::<f32>(&b.into_data(), burn::tensor::Tolerance::default());
        }
    }
}

#[test]
fn a_draft_vocabulary_loads_back_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let rows = Tensor::<B, 2>::random([4, 8], Distribution::Default, &device);
    let h = MedusaHeads::<B>::new(2, 8, Some(rows), &device);
    let info = HeadsInfo {
        draft_vocab: Some(vec![1, 3, 7, 10]),
        ..info(true)
    };
    let path = dir.path().join("vocab.safetensors");
    save(&h, &info, &path).unwrap();
    let loaded = load::<B>(&path, &identity(), &device).unwrap();
    assert_eq!(
        loaded.vocab.as_ref().map(|v| v.ids().to_vec()),
        Some(vec![1, 3, 7, 10])
    );
    assert_eq!(loaded.info, info);
    // Projections of another width than the draft vocabulary.
    let wide = HeadsInfo {
        draft_vocab: Some(vec![1, 3, 7]),
        ..info.clone()
    };
    save(&h, &wide, &path).unwrap();
    let message = load::<B>(&path, &identity(), &device)
        .unwrap_err()
        .to_string();
    assert!(message.contains("expected F32 [8, 3]"), "{message}");
    // A token the target's vocabulary does not have.
    let outside = HeadsInfo {
        draft_vocab: Some(vec![1, 3, 7, 11]),
        ..info
    };
    save(&h, &outside, &path).unwrap();
    let message = load::<B>(&path, &identity(), &device)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("draft token 11 lies outside the vocabulary of 11"),
        "{message}"
    );
}

#[test]
fn heads_of_another_model_or_a_broken_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let path = dir.path().join("heads.safetensors");
    save(&heads(false), &info(false), &path).unwrap();
    let error = |target: &TargetIdentity, path: &std::path::Path| {
        load::<B>(path, target, &device).unwrap_err().to_string()
    };
    let other = TargetIdentity {
        vocab_size: 12,
        ..identity()
    };
    assert!(
        error(&other, &path)
            .contains("heads of another model: vocabulary of 11 against the target's 12"),
        "{}",
        error(&other, &path)
    );
    let other = TargetIdentity {
        fingerprint: "cd".repeat(32),
        ..identity()
    };
    assert!(error(&other, &path).contains("fingerprint"));
    let bytes = std::fs::read(&path).unwrap();
    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() - 40]).unwrap();
    let message = error(&identity(), &truncated);
    assert!(
        message.contains("truncated.safetensors: not a heads file"),
        "{message}"
    );
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"not safetensors at all").unwrap();
    assert!(error(&identity(), &junk).contains("not a heads file"));
    let missing = dir.path().join("missing.safetensors");
    assert!(error(&identity(), &missing).contains("missing.safetensors"));
}
