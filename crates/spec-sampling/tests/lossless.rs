//! Greedy speculative sampling reproduces plain greedy decoding token for token; a draft equal to
//! the target is always accepted.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{B, config, model, scaled_model};
use spec_core::sampling::SamplingConfig;
use spec_core::tree::TokenTree;
use spec_core::verify::Verdict;
use spec_engine::{DraftRequest, Drafter, SpecGeneration, StepOutcome, generate_speculative};
use spec_runtime::{GenerateOptions, generate_plain};
use spec_sampling::{DraftLength, DraftModelDrafter};

const PROMPTS: [&[u32]; 4] = [&[5, 61, 17, 88], &[1], &[90, 2, 2, 2, 2, 7], &[33, 34, 35]];

#[test]
fn self_draft_greedy_accepts_everything_and_equals_plain() {
    let c = config(97, 32, 2, 128);
    let target = model(&c, 3);
    let options = GenerateOptions::new(30, SamplingConfig::greedy());
    for k in [1, 3, 5] {
        let mut drafter =
            DraftModelDrafter::<B>::new(model(&c, 3), c.vocab_size, DraftLength::Fixed(k)).unwrap();
        for prompt in PROMPTS {
            let plain = generate_plain(&target, prompt, &options, &mut |_| {}).unwrap();
            let spec =
                generate_speculative(&target, &mut drafter, prompt, &options, &mut |_| {}).unwrap();
            assert_eq!(spec.tokens, plain.tokens, "k={k} prompt={prompt:?}");
            let m = &spec.metrics;
            assert!(m.drafted > 0);
            assert_eq!(m.accepted, m.drafted, "k={k}: α must be 1 for a self-draft");
            // Every step but possibly the last produced k + 1 tokens.
            assert!(m.target_forwards <= 30u64.div_ceil(k as u64 + 1) + 1);
            assert_eq!(
                m.draft_forwards, m.drafted,
                "one draft forward per drafted token"
            );
        }
    }
}

#[test]
fn self_draft_sampled_is_always_accepted() {
    // The draft's q equals the target's p up to float rounding (one token at a time vs a batch of
    // K + 1), so min(1, p/q) ≈ 1 and essentially every draft is accepted. The output is not the
    // token sequence plain sampling gives for the same seed (drafting and verification draw their
    // own uniforms from the stream); that it has the same law is tests/statistical.rs's job.
    let c = config(97, 32, 2, 128);
    let target = model(&c, 3);
    let mut total = (0, 0);
    for (seed, sampling) in [
        (1, SamplingConfig::with_temperature(1.0)),
        (2, SamplingConfig::with_temperature(0.7).top_p(0.9)),
    ] {
        let options = GenerateOptions::new(40, sampling.seed(seed));
        let mut drafter =
            DraftModelDrafter::<B>::new(model(&c, 3), c.vocab_size, DraftLength::Fixed(4)).unwrap();
        let spec =
            generate_speculative(&target, &mut drafter, PROMPTS[0], &options, &mut |_| {}).unwrap();
        assert_eq!(spec.tokens.len(), 40);
        total.0 += spec.metrics.accepted;
        total.1 += spec.metrics.drafted;
        // Same seed, same output: the run is reproducible.
        let again =
            generate_speculative(&target, &mut drafter, PROMPTS[0], &options, &mut |_| {}).unwrap();
        assert_eq!(again.tokens, spec.tokens);
    }
    assert!(total.1 > 40);
    assert!(
        total.0 as f64 >= 0.98 * total.1 as f64,
        "accepted {} of {}",
        total.0,
        total.1
    );
}

#[test]
fn different_draft_greedy_equals_plain() {
    let c = config(97, 32, 2, 128);
    let target = model(&c, 3);
    // A different model of the same vocabulary, and a sharper one; both disagree with the target
    // often, so rejections and corrections are exercised.
    let drafts = [
        model(&config(97, 16, 1, 128), 8),
        scaled_model(&config(97, 32, 3, 128), 9, 3.0),
    ];
    let options = GenerateOptions::new(24, SamplingConfig::greedy());
    for (d, draft) in drafts.into_iter().enumerate() {
        for length in [
            DraftLength::Fixed(1),
            DraftLength::Fixed(2),
            DraftLength::Fixed(4),
            DraftLength::Fixed(7),
            DraftLength::Confident {
                max: 6,
                threshold: 0.3,
            },
            DraftLength::Auto { max: 8 },
        ] {
            let mut drafter =
                DraftModelDrafter::<B>::new(draft.clone(), c.vocab_size, length).unwrap();
            let (mut drafted, mut accepted) = (0, 0);
            for prompt in PROMPTS {
                let plain = generate_plain(&target, prompt, &options, &mut |_| {}).unwrap();
                let spec =
                    generate_speculative(&target, &mut drafter, prompt, &options, &mut |_| {})
                        .unwrap();
                assert_eq!(spec.tokens, plain.tokens, "draft {d} {length:?} {prompt:?}");
                drafted += spec.metrics.drafted;
                accepted += spec.metrics.accepted;
            }
            assert!(drafted > 0);
            assert!(
                accepted < drafted,
                "draft {d} {length:?}: a different model must miss"
            );
            let estimates = drafter.estimates();
            assert!(estimates.alpha > 0.0 && estimates.alpha < 1.0);
            assert!(estimates.cost_ratio.is_some_and(|c| c > 0.0));
            // The same, by name, for reports; `hopeless` is `auto`'s alone.
            let named: std::collections::BTreeMap<_, _> =
                drafter.report_estimates().into_iter().collect();
            assert_eq!(named["alpha"], estimates.alpha);
            assert_eq!(named["verify_slope"], estimates.verify_slope);
            assert_eq!(named.get("cost_ratio").copied(), estimates.cost_ratio);
            assert_eq!(
                named.contains_key("hopeless"),
                matches!(length, DraftLength::Auto { .. })
            );
        }
    }
}

/// `auto` told that the draft is far too slow for its target (a guess of `c` 5: no draft length
/// pays even with every draft accepted) neither prefills nor runs the draft for 8 plain steps,
/// then times one draft forward (whether drafting follows depends on that time; another after
/// 16 more steps if it stays hopeless); with a guess of 0.1 it prefills and drafts from the
/// first step. The output is plain decoding's always.
#[test]
fn auto_times_a_draft_guessed_hopeless_only_now_and_then() {
    let c = config(97, 32, 2, 128);
    let target = model(&c, 3);
    let prompt = PROMPTS[0];
    for (guess, new_tokens) in [(5.0, 7), (5.0, 40), (0.1, 40)] {
        let options = GenerateOptions::new(new_tokens, SamplingConfig::greedy());
        let plain = generate_plain(&target, prompt, &options, &mut |_| {}).unwrap();
        let mut drafter =
            DraftModelDrafter::<B>::new(model(&c, 3), c.vocab_size, DraftLength::Auto { max: 8 })
                .unwrap()
                .with_cost_prior(guess);
        let spec =
            generate_speculative(&target, &mut drafter, prompt, &options, &mut |_| {}).unwrap();
        assert_eq!(
            spec.tokens, plain.tokens,
            "guess {guess}, {new_tokens} tokens"
        );
        let forwards = drafter.draft_forwards();
        let hopeless = drafter
            .report_estimates()
            .into_iter()
            .find(|(name, _)| *name == "hopeless")
            .map(|(_, v)| v);
        if guess > 1.0 && new_tokens == 7 {
            // The draft not yet timed, the guess decides.
            assert_eq!(hopeless, Some(1.0));
        }
        match (guess > 1.0, new_tokens) {
            // 7 plain steps and no timing yet.
            (true, 7) => assert_eq!((forwards, spec.metrics.drafted), (0, 0)),
            // The timing after 8 plain steps, and drafts only if it found the draft cheap.
            (true, _) => assert!(
                forwards >= 1 && (forwards > 1 || spec.metrics.drafted == 0),
                "{forwards}"
            ),
            // The prompt's prefill, then drafts from the first step.
            (false, _) => assert!(forwards > 1 && spec.metrics.steps < 40, "{forwards}"),
        }
    }
}

/// `auto` (at most 8 drafts, costs given: a draft token `c` target steps, `s` more a token
/// verified) with a tiny draft that seldom agrees, against a 2-layer target: its greedy run of
/// `tokens` tokens, checked equal to plain decoding's, and the drafter after it.
fn auto_with_a_tiny_draft(tokens: usize, c: f64, s: f64) -> (SpecGeneration, DraftModelDrafter<B>) {
    let config_target = config(97, 32, 2, 128);
    let target = model(&config_target, 3);
    let options = GenerateOptions::new(tokens, SamplingConfig::greedy());
    let plain = generate_plain(&target, PROMPTS[0], &options, &mut |_| {}).unwrap();
    let mut drafter = DraftModelDrafter::<B>::new(
        model(&config(97, 16, 1, 128), 8),
        config_target.vocab_size,
        DraftLength::Auto { max: 8 },
    )
    .unwrap()
    .with_fixed_costs(c, s);
    let spec =
        generate_speculative(&target, &mut drafter, PROMPTS[0], &options, &mut |_| {}).unwrap();
    assert_eq!(spec.tokens, plain.tokens);
    (spec, drafter)
}

/// `auto` at costs where drafting does not pay at the run's rate (given: a draft token half a
/// target step, 0.3 more a token verified; a tiny draft that seldom agrees) decodes plainly and
/// probes now and then. A probe was chosen to draft, so it computes its first draft row
/// whatever the mean rate says (the chain rule's check at the mean rate comes after a first
/// draft); the row's confidence may still decline it. The output is plain decoding's.
#[test]
fn auto_probes_compute_a_draft_row() {
    let (spec, _) = auto_with_a_tiny_draft(150, 0.5, 0.3);
    let m = &spec.metrics;
    assert!(m.steps > 100, "mostly plain steps: {} steps", m.steps);
    assert!(
        m.draft_forwards >= 2,
        "probes ran {} draft rows",
        m.draft_forwards
    );
}

/// A computed row is paid for whether or not its draft is proposed, so with a verification
/// that costs nothing more per token (given costs: a draft token 0.3 of a target step, 0 a
/// token verified) `auto` proposes every row it computes, however seldom the tiny draft agrees:
/// no chain ends at its row's confidence (pricing the row again, as one more draft, would end
/// chains at every row whose rate is under 0.3). The output is plain decoding's.
#[test]
fn auto_proposes_every_row_it_computes_when_verifying_more_is_free() {
    let (spec, drafter) = auto_with_a_tiny_draft(60, 0.3, 0.0);
    assert!(spec.metrics.drafted > 0, "nothing was drafted");
    assert_eq!(drafter.estimates().chains_stopped, 0);
}

/// A draft that fell behind (here: five tokens the drafter never saw) catches up in
/// `accepted`, before the step that drafts, so that step's forwards are its drafts' only (the
/// engine times `draft` calls as the draft's steps).
#[test]
fn a_catch_up_is_fed_before_the_drafting_step() {
    let c = config(97, 32, 2, 128);
    let mut drafter =
        DraftModelDrafter::<B>::new(model(&c, 3), c.vocab_size, DraftLength::Fixed(2)).unwrap();
    let prompt = [5, 61, 17, 88];
    drafter.begin(&prompt).unwrap();
    assert_eq!(drafter.draft_forwards(), 1);
    let mut context = prompt.to_vec();
    context.extend([7, 8, 9, 10, 11]);
    let plain = TokenTree::new(88);
    let verdict = Verdict {
        accepted: Vec::new(),
        next_token: 7,
    };
    drafter
        .accepted(&context, &StepOutcome::new(plain, verdict, 0.0))
        .unwrap();
    assert_eq!(drafter.draft_forwards(), 2);
    let greedy = SamplingConfig::greedy();
    let mut rng = greedy.rng();
    let draft = drafter
        .draft(DraftRequest::new(&context, 4, &greedy, &mut rng))
        .unwrap();
    assert_eq!((draft.tree.drafted(), draft.draft_forwards), (2, 2));
}

#[test]
fn short_draft_cache_falls_back_to_plain_steps() {
    let c = config(97, 32, 2, 128);
    let target = model(&c, 3);
    let options = GenerateOptions::new(20, SamplingConfig::greedy());
    let plain = generate_plain(&target, PROMPTS[0], &options, &mut |_| {}).unwrap();
    // Room for the prompt and a few drafts only: later steps go without drafts.
    let mut drafter =
        DraftModelDrafter::<B>::new(model(&c, 3), c.vocab_size, DraftLength::Fixed(3))
            .unwrap()
            .with_cache_capacity(10);
    let spec =
        generate_speculative(&target, &mut drafter, PROMPTS[0], &options, &mut |_| {}).unwrap();
    assert_eq!(spec.tokens, plain.tokens);
    assert!(spec.metrics.drafted > 0);
    assert!(spec.metrics.drafted < 20);
}
