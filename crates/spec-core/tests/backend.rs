//! The backend implementation agrees with the f64 reference on the same uniforms: same accepted
//! path, same next token, same errors, and distributions within f32 rounding.
//!
//! Runs on flex always; on wgpu with `--features wgpu` (CI runs it through Mesa's software
//! Vulkan); on cuda with `--features cuda` where a GPU is present.

#![allow(clippy::unwrap_used)] // test helpers: a failure should panic with its message

use burn::tensor::{Tensor, TensorData, backend::Backend};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spec_core::error::{Source, SpecError};
use spec_core::reference::{self, HostProposal};
use spec_core::rng::SpecRng;
use spec_core::sampling::{self, SamplingConfig};
use spec_core::tree::{ChildDraw, ROOT, TokenTree};
use spec_core::verify::{Proposal, Verifier};

fn configs() -> Vec<SamplingConfig> {
    let t = SamplingConfig::with_temperature;
    vec![
        SamplingConfig::greedy(),
        t(1.0),
        t(0.7).top_p(0.9),
        t(1.3).top_k(5),
        t(1.0).top_k(3).top_p(0.8).min_p(0.05),
        t(0.9).min_p(0.1),
    ]
}

fn random_logits(rng: &mut ChaCha8Rng, rows: usize, vocab: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * vocab);
    for _ in 0..rows {
        let keep = rng.random_range(0..vocab);
        for j in 0..vocab {
            let masked = j != keep && rng.random_bool(0.1);
            out.push(if masked {
                f32::NEG_INFINITY
            } else {
                rng.random_range(-3.0f32..3.0) * 2.0
            });
        }
    }
    out
}

fn tensor<B: Backend>(
    values: &[f32],
    rows: usize,
    vocab: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values.to_vec(), [rows, vocab]), device)
}

fn rows_f64(values: &[f32], vocab: usize) -> Vec<Vec<f64>> {
    values
        .chunks(vocab)
        .map(|r| r.iter().map(|&x| f64::from(x)).collect())
        .collect()
}

fn read_rows<B: Backend>(t: Tensor<B, 2>) -> Vec<Vec<f64>> {
    let vocab = t.dims()[1];
    let flat: Vec<f64> = t.into_data().iter::<f64>().collect();
    flat.chunks(vocab).map(<[f64]>::to_vec).collect()
}

/// Processing logits: the backend's distributions equal the reference's within f32 rounding.
fn check_probabilities<B: Backend>(device: &B::Device) {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for vocab in [2, 7, 64, 1000] {
        let logits = random_logits(&mut rng, 5, vocab);
        for config in configs() {
            let got = read_rows(
                sampling::probabilities(tensor::<B>(&logits, 5, vocab, device), &config).unwrap(),
            );
            for (row, (got, logits)) in got.iter().zip(rows_f64(&logits, vocab)).enumerate() {
                let want = reference::probabilities(&logits, &config, Source::Target, row).unwrap();
                // NaN compares false, so a NaN anywhere fails this.
                let within = got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 2e-6);
                assert!(
                    within,
                    "{config:?} vocab {vocab} row {row}: {got:?} vs {want:?}"
                );
            }
        }
    }
}

/// A row's top probability: the reference's largest probability at temperature 1, NaN for
/// invalid rows. Rows of Qwen's vocabulary one at a time, as a drafter asks (several such rows
/// hit burn's wgpu reductions' fault on lavapipe: `check_wide_reductions`).
fn check_top_probabilities<B: Backend>(device: &B::Device) {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let config = SamplingConfig::with_temperature(1.0);
    for (rows, vocab) in [(4, 1), (4, 2), (4, 7), (4, 1000), (1, 151_936)] {
        let logits = random_logits(&mut rng, rows, vocab);
        let got = sampling::top_probabilities(tensor::<B>(&logits, rows, vocab, device));
        assert_eq!(got.len(), rows);
        for (row, (got, logits)) in got.iter().zip(rows_f64(&logits, vocab)).enumerate() {
            let want = reference::probabilities(&logits, &config, Source::Draft, row)
                .unwrap()
                .into_iter()
                .fold(0.0, f64::max);
            assert!(
                (got - want).abs() <= 1e-4 * want,
                "vocab {vocab} row {row}: {got} vs {want}"
            );
        }
    }
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let rows = [
        [0.0, 0.0, 0.0, -inf],
        [1.0, nan, 0.0, 0.0],
        [1.0, inf, 0.0, 0.0],
        [-inf, -inf, -inf, -inf],
    ];
    let got = sampling::top_probabilities(tensor::<B>(rows.as_flattened(), 4, 4, device));
    assert!((got[0] - 1.0 / 3.0).abs() < 1e-6, "{got:?}");
    assert!(got[1..].iter().all(|p| p.is_nan()), "{got:?}");
}

/// Row maxima, argmaxes and sums of `[rows, 151936]` (Qwen's vocabulary: a verification's
/// logits) against the host's. burn 0.21's wgpu reductions on Mesa's lavapipe fail this at 2,
/// 4, 6 and 8 rows (docs/notes/wgpu-lavapipe.md, "Row reductions over Qwen-sized rows are
/// wrong"), so it runs on wgpu only when asked (`--ignored`).
fn check_wide_reductions<B: Backend>(device: &B::Device) {
    let vocab = 151_936;
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for rows in 1..=9 {
        let values: Vec<f32> = (0..rows * vocab)
            .map(|_| rng.random_range(-6.0f32..6.0))
            .collect();
        let logits = tensor::<B>(&values, rows, vocab, device);
        let max: Vec<f32> = logits
            .clone()
            .max_dim(1)
            .into_data()
            .iter::<f32>()
            .collect();
        let argmax: Vec<i64> = logits.clone().argmax(1).into_data().iter::<i64>().collect();
        let ones: Vec<f32> = Tensor::<B, 2>::ones([rows, vocab], device)
            .sum_dim(1)
            .into_data()
            .iter::<f32>()
            .collect();
        for (row, values) in values.chunks(vocab).enumerate() {
            let want = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let at = values.iter().position(|&v| v == want);
            assert_eq!(max[row], want, "{rows} rows: row {row}'s max");
            assert_eq!(
                Some(argmax[row] as usize),
                at,
                "{rows} rows: row {row}'s argmax"
            );
            assert_eq!(
                ones[row], vocab as f32,
                "{rows} rows: row {row}'s sum of ones"
            );
        }
    }
}

/// Random trees, settings and proposals: backend verdicts equal reference verdicts.
fn check_verification<B: Backend>(device: &B::Device, cases: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    let mut accepted_total = 0;
    for case in 0..cases {
        let vocab = *[2usize, 5, 16, 50, 300].get(case % 5).unwrap_or(&16);
        let config = configs()[rng.random_range(0..configs().len())];
        let sampled = rng.random_bool(0.6);
        let nodes = rng.random_range(0..9usize);
        let chain = rng.random_bool(0.4);

        // Draft distributions for every potential parent, then a tree whose children come from
        // them (sampled) or are arbitrary candidates (deterministic).
        let draft_logits = random_logits(&mut rng, nodes + 1, vocab);
        let q_tensor = sampling::probabilities(
            tensor::<B>(&draft_logits, nodes + 1, vocab, device),
            &config,
        )
        .unwrap();
        let q = read_rows(q_tensor.clone());
        let mut tree = TokenTree::new(rng.random_range(0..vocab as u32));
        for n in 1..=nodes {
            let parent = if chain { n - 1 } else { rng.random_range(0..n) };
            let token = if sampled {
                reference::inverse_cdf(&q[parent], rng.random::<f64>()) as u32
            } else {
                rng.random_range(0..vocab as u32)
            };
            tree.push(parent, token).unwrap();
        }
        let target_logits = random_logits(&mut rng, tree.len(), vocab);

        let seed = rng.random::<u64>();
        let verifier = Verifier::new(config).unwrap();
        let (proposal, host_proposal) = if sampled {
            (Proposal::Sampled(q_tensor), HostProposal::Sampled(q))
        } else {
            (Proposal::Deterministic, HostProposal::Deterministic)
        };
        let got = verifier.verify_tree(
            &tree,
            tensor::<B>(&target_logits, tree.len(), vocab, device),
            proposal,
            &mut SpecRng::new(seed),
        );
        let want = reference::verify_tree(
            &config,
            &tree,
            &rows_f64(&target_logits, vocab),
            &host_proposal,
            &mut SpecRng::new(seed),
        );
        assert_eq!(
            got, want,
            "case {case}: {config:?}, sampled {sampled}, tree {tree:?}"
        );
        accepted_total += got.map_or(0, |v| v.accepted.len());
    }
    // The cases must exercise acceptance, not only rejection at the root.
    assert!(
        accepted_total > cases / 4,
        "only {accepted_total} accepted drafts in {cases} cases"
    );
}

/// Drafting from the target's own distribution: every draft is accepted.
fn check_self_draft<B: Backend>(device: &B::Device) {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let vocab = 40;
    for config in configs() {
        let verifier = Verifier::new(config).unwrap();
        let mut spec_rng = SpecRng::new(9);
        for _ in 0..20 {
            let k = 4;
            let logits = random_logits(&mut rng, k + 1, vocab);
            let target = tensor::<B>(&logits, k + 1, vocab, device);
            let q = sampling::probabilities(target.clone(), &config).unwrap();
            // Draft token i is sampled from q_i, the target's distribution after drafts 0..i.
            let drafted = sampling::sample_probabilities(
                q.clone().narrow(0, 0, k),
                &mut spec_rng,
                Source::Draft,
            )
            .unwrap();
            let verdict = verifier
                .verify_chain(
                    &drafted,
                    target,
                    Proposal::Sampled(q.narrow(0, 0, k)),
                    &mut spec_rng,
                )
                .unwrap();
            assert_eq!(verdict.accepted.len(), k, "{config:?}");
        }
    }
}

fn check_errors<B: Backend>(device: &B::Device) {
    let vocab = 6;
    let sampled = Verifier::new(SamplingConfig::with_temperature(1.0)).unwrap();
    let greedy = Verifier::new(SamplingConfig::greedy()).unwrap();
    let tree = TokenTree::chain(0, &[1, 2]);
    let good = vec![0.5f32; 3 * vocab];
    let mut rng = SpecRng::new(0);

    for bad_value in [f32::NAN, f32::INFINITY] {
        let mut logits = good.clone();
        logits[vocab + 2] = bad_value; // row 1
        for verifier in [&sampled, &greedy] {
            // Deterministic proposal: row 0 accepts token 1 with p = 1/6 or rejects; either way
            // row 1 is needed only if token 1 is accepted, so make row 0 certain.
            let mut logits = logits.clone();
            logits[..vocab].copy_from_slice(&[
                f32::NEG_INFINITY,
                0.0,
                f32::NEG_INFINITY,
                f32::NEG_INFINITY,
                f32::NEG_INFINITY,
                f32::NEG_INFINITY,
            ]);
            let err = verifier
                .verify_tree(
                    &tree,
                    tensor::<B>(&logits, 3, vocab, device),
                    Proposal::Deterministic,
                    &mut rng,
                )
                .unwrap_err();
            assert_eq!(
                err,
                SpecError::NonFiniteLogits {
                    what: Source::Target,
                    row: 1
                },
                "{bad_value}"
            );
        }
    }
    let all_masked = vec![f32::NEG_INFINITY; 3 * vocab];
    let err = sampled.verify_tree(
        &tree,
        tensor::<B>(&all_masked, 3, vocab, device),
        Proposal::Deterministic,
        &mut rng,
    );
    assert!(
        matches!(
            err,
            Err(SpecError::NonFiniteLogits {
                what: Source::Target,
                ..
            })
        ),
        "{err:?}"
    );

    // A drafted token the draft gave probability 0.
    let mut q = vec![1.0f32 / 5.0; 2 * vocab];
    q[1] = 0.0;
    q[0] = 0.4;
    let err = sampled.verify_tree(
        &tree,
        tensor::<B>(&good, 3, vocab, device),
        Proposal::Sampled(tensor::<B>(&q, 2, vocab, device)),
        &mut rng,
    );
    assert_eq!(err, Err(SpecError::ImpossibleDraft { node: 1, token: 1 }));

    // A draft that produced NaN.
    let q = vec![f32::NAN; 2 * vocab];
    let err = sampled.verify_tree(
        &tree,
        tensor::<B>(&good, 3, vocab, device),
        Proposal::Sampled(tensor::<B>(&q, 2, vocab, device)),
        &mut rng,
    );
    assert_eq!(
        err,
        Err(SpecError::NonFiniteLogits {
            what: Source::Draft,
            row: 0
        })
    );

    // Shapes and vocabulary.
    let err = sampled.verify_tree(
        &tree,
        tensor::<B>(&good[..2 * vocab], 2, vocab, device),
        Proposal::Deterministic,
        &mut rng,
    );
    assert!(matches!(err, Err(SpecError::Shape(_))), "{err:?}");
    let q = vec![0.25f32; 4];
    let err = sampled.verify_tree(
        &tree,
        tensor::<B>(&good, 3, vocab, device),
        Proposal::Sampled(tensor::<B>(&q, 1, 4, device)),
        &mut rng,
    );
    assert!(matches!(err, Err(SpecError::Shape(_))), "{err:?}");
    let far = TokenTree::chain(0, &[1, 99]);
    let err = sampled.verify_tree(
        &far,
        tensor::<B>(&good, 3, vocab, device),
        Proposal::Deterministic,
        &mut rng,
    );
    assert_eq!(
        err,
        Err(SpecError::TokenOutOfVocabulary { token: 99, vocab })
    );

    // Plain sampling reports bad rows too.
    let mut logits = good.clone();
    logits[2 * vocab] = f32::NAN;
    for config in [
        SamplingConfig::greedy(),
        SamplingConfig::with_temperature(0.8).top_p(0.9),
    ] {
        let err = sampling::sample_logits(
            tensor::<B>(&logits, 3, vocab, device),
            &config,
            &mut rng,
            Source::Draft,
        );
        assert_eq!(
            err,
            Err(SpecError::NonFiniteLogits {
                what: Source::Draft,
                row: 2
            }),
            "{config:?}"
        );
    }
}

/// Seeds whose step uniforms reject one of `nodes`, each tested with a probability in
/// `[1 − band.0, 1 − band.1)`: at least one of their uniforms is `≥ 1 − band.1` (rejected however
/// the probability rounds) and none lies in that band (so f32 and f64 decide alike).
fn rejecting_seeds(tree_len: usize, nodes: &[usize], band: (f64, f64), count: usize) -> Vec<u64> {
    let (low, high) = (1.0 - band.0, 1.0 - band.1);
    let mut seeds = Vec::new();
    for seed in 0..50_000_000u64 {
        let uniforms = SpecRng::new(seed).step_uniforms(tree_len);
        let us = nodes.iter().map(|&n| uniforms.for_node(n));
        if us.clone().any(|u| u >= high) && !us.clone().any(|u| (low..high).contains(&u)) {
            seeds.push(seed);
            if seeds.len() == count {
                return seeds;
            }
        }
    }
    panic!(
        "found only {} seeds rejecting a near-certain candidate",
        seeds.len()
    );
}

/// A deterministic candidate `x` of probability `1 − ε` (`ε` about 9.5e-7 and 1.2e-7) that its
/// uniform rejects is never emitted: the residual of a point mass is `p` without `x`,
/// renormalized, however little mass that leaves. Chains of such rows, and trees where each
/// chain node also offers a sibling `y` (tested against the rest of the mass, where its exact
/// probability is 1/3), on seeds picked to reject somewhere and on plain seeds; the backend's
/// verdicts equal the reference's.
fn check_near_certain_rejections<B: Backend>(device: &B::Device) {
    let (vocab, x, y, depth) = (8, 5u32, 2u32, 512);
    let config = SamplingConfig::with_temperature(1.0);
    let verifier = Verifier::new(config).unwrap();
    let chain = TokenTree::chain(0, &vec![x; depth]);
    // The chain's nodes first (ids 1..=depth, so both shapes test x with the same uniforms),
    // then a sibling after each.
    let mut forked = chain.clone();
    for parent in 0..depth {
        forked.push(parent, y).unwrap();
    }
    let x_nodes: Vec<usize> = (1..=depth).collect();
    // p(x) = 1 / (1 + 3 e^tail): 1 − 9.2e-7 and 1 − 1.2e-7 (in f32, 1 − 9.5e-7 and 1 − 1.2e-7).
    for (tail, band, count) in [(-15.0f32, (1.2e-6, 6e-7), 6), (-17.0, (2e-7, 6e-8), 3)] {
        let row: Vec<f32> = (0..vocab)
            .map(|j| match j {
                5 => 0.0,
                1 | 2 | 6 => tail,
                _ => f32::NEG_INFINITY,
            })
            .collect();
        let picked = rejecting_seeds(forked.len(), &x_nodes, band, count);
        for tree in [&chain, &forked] {
            let logits: Vec<f32> = row.repeat(tree.len());
            for (seed, must_reject) in picked
                .iter()
                .map(|&s| (s, true))
                .chain((0..40).map(|s| (s, false)))
            {
                let got = verifier
                    .verify_tree(
                        tree,
                        tensor::<B>(&logits, tree.len(), vocab, device),
                        Proposal::Deterministic,
                        &mut SpecRng::new(seed),
                    )
                    .unwrap();
                let want = reference::verify_tree(
                    &config,
                    tree,
                    &rows_f64(&logits, vocab),
                    &HostProposal::Deterministic,
                    &mut SpecRng::new(seed),
                )
                .unwrap();
                let case = format!("tail {tail}, {} nodes, seed {seed}", tree.len());
                let accepted_x = got.accepted.iter().filter(|&&n| n <= depth).count();
                if must_reject {
                    assert!(accepted_x < depth, "{case}: x was never rejected");
                }
                let last = got.last_node();
                let rejected: Vec<u32> =
                    tree.children(last).iter().map(|&c| tree.token(c)).collect();
                assert!(
                    !rejected.contains(&got.next_token),
                    "{case}: the step ends with {}, a candidate it rejected at node {last}",
                    got.next_token
                );
                assert_eq!(got, want, "{case}");
            }
        }
    }
}

/// The smallest temperature `validate` accepts keeps rows with logits up to ±1e4 finite: each
/// row is a point mass on its argmax (or an even split among tied maxima), on its own and with
/// truncation, and sampling and verification run.
fn check_smallest_temperature<B: Backend>(device: &B::Device) {
    let vocab = 6;
    let rows: [[f32; 6]; 4] = [
        [1e4, -1e4, 0.0, 9_999.0, -3.0, f32::NEG_INFINITY],
        [-1e4, -9_999.5, -1e4, -1e4, -1e4, -1e4],
        [-1e4, 1e4, 1e4, -1e4, 2.5, 1e4 - 1.0],
        [0.0, 1e-3, -1e-3, 0.0, f32::NEG_INFINITY, 1e4],
    ];
    let flat = rows.as_flattened();
    let t = SamplingConfig::with_temperature(sampling::MIN_TEMPERATURE);
    for config in [t, t.top_p(0.9), t.top_k(2).min_p(0.1)] {
        let got = read_rows(
            sampling::probabilities(tensor::<B>(flat, rows.len(), vocab, device), &config).unwrap(),
        );
        for (row, (got, logits)) in got.iter().zip(rows_f64(flat, vocab)).enumerate() {
            let want = reference::probabilities(&logits, &config, Source::Target, row).unwrap();
            assert!(
                got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
                "{config:?} row {row}: {got:?} vs {want:?}"
            );
        }
        let tokens = sampling::sample_logits(
            tensor::<B>(flat, rows.len(), vocab, device),
            &config,
            &mut SpecRng::new(3),
            Source::Target,
        )
        .unwrap();
        assert_eq!(tokens[..2], [0, 1], "{config:?}");
        assert!([1, 2].contains(&tokens[2]), "{config:?}: {tokens:?}");
        assert_eq!(tokens[3], 5, "{config:?}");
        // Rows 0 and 1 accept their candidates; row 2 accepts token 1 or, rejecting it, ends
        // with the other tied token; row 3 gives the bonus.
        let tree = TokenTree::chain(0, &[0, 1, 1]);
        let verdict = Verifier::new(config)
            .unwrap()
            .verify_tree(
                &tree,
                tensor::<B>(flat, rows.len(), vocab, device),
                Proposal::Deterministic,
                &mut SpecRng::new(4),
            )
            .unwrap();
        let tokens = verdict.tokens(&tree);
        assert!(
            tokens == [0, 1, 2] || tokens == [0, 1, 1, 5],
            "{config:?}: {tokens:?}"
        );
    }
}

/// A tree with no drafts still ends the step with one token from the root's distribution.
fn check_empty_tree<B: Backend>(device: &B::Device) {
    let logits = [0.0f32, 5.0, f32::NEG_INFINITY];
    for config in configs() {
        let verdict = Verifier::new(config)
            .unwrap()
            .verify_tree(
                &TokenTree::new(0),
                tensor::<B>(&logits, 1, 3, device),
                Proposal::Deterministic,
                &mut SpecRng::new(1),
            )
            .unwrap();
        assert!(verdict.accepted.is_empty());
        assert_ne!(verdict.next_token, 2, "a masked token was drawn");
        assert_eq!(verdict.last_node(), ROOT);
    }
}

/// Greedy on rows that stress the argmax and the validity check: ties (to the lowest index, also
/// across SIMD lanes and workgroups), masked entries, signed zeros, logits whose sum overflows.
fn check_greedy_edges<B: Backend>(device: &B::Device) {
    let vocab = 5_000;
    let row = |f: &dyn Fn(usize) -> f32| -> Vec<f32> { (0..vocab).map(f).collect() };
    let valid = [
        row(&|j| {
            if j == 3_001 || j == 4_990 {
                2.0
            } else {
                (j % 7) as f32 * 0.1
            }
        }),
        row(&|j| {
            if j == 7 || j == 4_999 || j == 2_048 {
                1.5
            } else {
                -1.0
            }
        }),
        row(&|_| 0.25),
        row(&|j| if j == 0 { -0.0 } else { 0.0 }),
        row(&|j| match j {
            900 | 901 => 1.0,
            _ if j % 2 == 0 => f32::NEG_INFINITY,
            _ => 0.5,
        }),
        // Sums that overflow: valid rows that only the full check can clear.
        row(&|j| if j % 3 == 0 { 3e38 } else { 1e38 }),
        row(&|j| match j {
            4_321 => -1e38,
            _ if j % 5 == 0 => f32::NEG_INFINITY,
            _ => -3e38,
        }),
        row(&|j| match j {
            17 => 3e38,
            _ if j % 2 == 0 => f32::NEG_INFINITY,
            _ => 2e38,
        }),
    ];
    let flat: Vec<f32> = valid.iter().flatten().copied().collect();
    let rows = valid.len();
    let want: Vec<u32> = valid
        .iter()
        .map(|r| reference::argmax(&r.iter().map(|&x| f64::from(x)).collect::<Vec<_>>()) as u32)
        .collect();
    let greedy = SamplingConfig::greedy();
    let got = sampling::sample_logits(
        tensor::<B>(&flat, rows, vocab, device),
        &greedy,
        &mut SpecRng::new(0),
        Source::Target,
    )
    .unwrap();
    assert_eq!(got, want);
    let one_hot = read_rows(
        sampling::probabilities(tensor::<B>(&flat, rows, vocab, device), &greedy).unwrap(),
    );
    for (row, &token) in one_hot.iter().zip(&want) {
        let hot: Vec<usize> = (0..vocab).filter(|&j| row[j] != 0.0).collect();
        assert_eq!(hot, vec![token as usize]);
        assert_eq!(row[token as usize], 1.0);
    }

    let invalid = [
        row(&|_| f32::NEG_INFINITY),
        row(&|j| if j == 4_000 { f32::NAN } else { 1.0 }),
        row(&|j| if j == 10 { f32::INFINITY } else { 1.0 }),
        row(&|j| {
            if j == 10 {
                f32::INFINITY
            } else {
                f32::NEG_INFINITY
            }
        }),
        row(&|j| if j == 2 { f32::NAN } else { f32::NEG_INFINITY }),
    ];
    for (case, bad) in invalid.iter().enumerate() {
        // The bad row second, after a valid one.
        let logits: Vec<f32> = valid[0].iter().chain(bad).copied().collect();
        let err = sampling::sample_logits(
            tensor::<B>(&logits, 2, vocab, device),
            &greedy,
            &mut SpecRng::new(0),
            Source::Draft,
        );
        assert_eq!(
            err,
            Err(SpecError::NonFiniteLogits {
                what: Source::Draft,
                row: 1
            }),
            "invalid row {case}"
        );
        let probs = read_rows(
            sampling::probabilities(tensor::<B>(&logits, 2, vocab, device), &greedy).unwrap(),
        );
        assert!(probs[1].iter().all(|p| p.is_nan()), "invalid row {case}");
        assert!(probs[0].iter().all(|p| !p.is_nan()), "invalid row {case}");
    }
}

/// Truncation on rows where the candidate pre-filter and the tie rule matter: flat rows, many
/// ties at every cut-off, a point mass, a flat background under a few strong tokens, `top_p = 1`.
fn check_truncation_edges<B: Backend>(device: &B::Device) {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let vocab = 4_999;
    let flat = vec![0.5f32; vocab];
    let levels: Vec<f32> = (0..vocab).map(|_| rng.random_range(0..4) as f32).collect();
    let mut one_hot = vec![f32::NEG_INFINITY; vocab];
    one_hot[2_500] = 1.0;
    let mut peaked: Vec<f32> = (0..vocab).map(|_| rng.random_range(-4.0f32..4.0)).collect();
    for _ in 0..8 {
        let at = rng.random_range(0..vocab);
        peaked[at] += rng.random_range(6.0f32..12.0);
    }
    let rows = [&flat, &levels, &one_hot, &peaked];
    let logits: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    let t = SamplingConfig::with_temperature;
    for config in [
        t(1.0).top_p(0.9),
        t(0.7).top_p(0.9),
        t(1.0).top_p(1.0),
        t(1.0).top_p(0.3),
        t(1.0).top_p(0.999_999),
        t(1.0).top_k(2),
        // Not 0.5: on the flat row that lands exactly on 500 of the 1,000 tokens, a tie
        // that f32 and f64 rounding may break differently.
        t(1.0).top_k(1_000).top_p(0.5005),
        t(1.0).min_p(0.5),
        t(1.0).top_p(0.95).min_p(0.01),
    ] {
        let got = read_rows(
            sampling::probabilities(tensor::<B>(&logits, rows.len(), vocab, device), &config)
                .unwrap(),
        );
        for (row, (got, logits)) in got.iter().zip(rows_f64(&logits, vocab)).enumerate() {
            let want = reference::probabilities(&logits, &config, Source::Target, row).unwrap();
            // The kept sets agree, except that a cut-off within f32 rounding of a token's
            // cumulative mass (top-p 0.999999 on a long tail) may fall on either side of it on
            // backends that sum in f32 (a cumulative f32 sum over 5,000 tokens drifts by a few
            // 1e-6): such tokens together hold at most 1e-5.
            let differing: f64 = (0..vocab)
                .filter(|&j| (got[j] > 0.0) != (want[j] > 0.0))
                .map(|j| got[j].max(want[j]))
                .sum();
            assert!(
                differing <= 1e-5,
                "{config:?} row {row}: kept sets differ by mass {differing}"
            );
            let within = got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 2e-6);
            assert!(within, "{config:?} row {row}");
        }
    }
}

macro_rules! backend_tests {
    ($name:ident, $backend:ty, $device:expr, $cases:expr) => {
        mod $name {
            use super::*;
            type B = $backend;

            #[test]
            fn probabilities_match_reference() {
                check_probabilities::<B>(&$device);
            }

            #[test]
            fn verification_matches_reference() {
                check_verification::<B>(&$device, $cases);
            }

            #[test]
            fn self_draft_accepts_everything() {
                check_self_draft::<B>(&$device);
            }

            #[test]
            fn bad_input_is_a_typed_error() {
                check_errors::<B>(&$device);
            }

            #[test]
            fn top_probabilities_match_reference() {
                check_top_probabilities::<B>(&$device);
            }

            #[test]
            fn greedy_ties_and_validity_edges() {
                check_greedy_edges::<B>(&$device);
            }

            #[test]
            fn truncation_edges_match_reference() {
                check_truncation_edges::<B>(&$device);
            }

            #[test]
            fn rejected_near_certain_candidate_is_never_emitted() {
                check_near_certain_rejections::<B>(&$device);
            }

            #[test]
            fn smallest_temperature_gives_finite_probabilities() {
                check_smallest_temperature::<B>(&$device);
            }

            #[test]
            fn empty_tree_draws_one_token() {
                check_empty_tree::<B>(&$device);
            }
        }
    };
}

#[cfg(feature = "flex")]
backend_tests!(flex, burn::backend::Flex, Default::default(), 600);

#[cfg(feature = "flex")]
#[test]
fn flex_wide_reductions() {
    check_wide_reductions::<burn::backend::Flex>(&Default::default());
}

#[cfg(feature = "wgpu")]
#[test]
#[ignore = "burn 0.21's wgpu reductions of [2|4|6|8, 151936] are wrong on Mesa's lavapipe"]
fn wgpu_wide_reductions() {
    check_wide_reductions::<burn::backend::Wgpu>(&burn::backend::wgpu::WgpuDevice::default());
}

#[cfg(feature = "wgpu")]
backend_tests!(
    wgpu,
    burn::backend::Wgpu,
    burn::backend::wgpu::WgpuDevice::default(),
    150
);

#[cfg(feature = "cuda")]
backend_tests!(
    cuda,
    burn::backend::Cuda,
    burn::backend::cuda::CudaDevice::default(),
    600
);

/// A random tree whose nodes are drawn each their own way from `q` (rows per node): i.i.d.,
/// without replacement (from the parent's row without its earlier such siblings' tokens; a
/// parent with nothing left gets a fixed child instead) or fixed (any token).
fn random_per_child_tree(
    rng: &mut ChaCha8Rng,
    q: &[Vec<f64>],
    nodes: usize,
    vocab: usize,
) -> (TokenTree, Vec<ChildDraw>) {
    let mut tree = TokenTree::new(rng.random_range(0..vocab as u32));
    let mut draws = vec![ChildDraw::Fixed];
    let mut left: Vec<Vec<f64>> = q.to_vec();
    let chain = rng.random_bool(0.2);
    for n in 1..=nodes {
        let parent = if chain { n - 1 } else { rng.random_range(0..n) };
        let mut draw = [
            ChildDraw::Iid,
            ChildDraw::WithoutReplacement,
            ChildDraw::Fixed,
        ][rng.random_range(0..3)];
        if draw == ChildDraw::WithoutReplacement && left[parent].iter().sum::<f64>() <= 0.0 {
            draw = ChildDraw::Fixed;
        }
        let token = match draw {
            ChildDraw::Iid => reference::inverse_cdf(&q[parent], rng.random::<f64>()),
            ChildDraw::WithoutReplacement => {
                let token = reference::inverse_cdf(&left[parent], rng.random::<f64>());
                left[parent][token] = 0.0;
                token
            }
            ChildDraw::Fixed => rng.random_range(0..vocab),
        };
        tree.push(parent, token as u32).unwrap();
        draws.push(draw);
    }
    (tree, draws)
}

/// Per-child proposals: backend verdicts equal reference verdicts on the same uniforms, over
/// random trees mixing the three ways of drawing, every sampling setting and vocabularies up to
/// 300, drafting from random rows or from the target's own. Where every drawn child is i.i.d. (or every child fixed) the verdict also equals the one
/// of `Proposal::Sampled` (or `Deterministic`).
fn check_per_child_verification<B: Backend>(device: &B::Device, cases: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(2025);
    let (mut accepted_total, mut host_draws, mut leaf_draws, mut same_as_special) = (0, 0, 0, 0);
    for case in 0..cases {
        let vocab = [2usize, 5, 16, 50, 300][case % 5];
        let config = configs()[rng.random_range(0..configs().len())];
        let nodes = rng.random_range(0..10usize);
        let target_logits = random_logits(&mut rng, nodes + 1, vocab);
        // Drafting from the target's own rows now and then: long accepted paths.
        let draft_logits = if rng.random_bool(0.3) {
            target_logits.clone()
        } else {
            random_logits(&mut rng, nodes + 1, vocab)
        };
        let q_tensor = sampling::probabilities(
            tensor::<B>(&draft_logits, nodes + 1, vocab, device),
            &config,
        )
        .unwrap();
        let q = read_rows(q_tensor.clone());
        let (tree, draws) = random_per_child_tree(&mut rng, &q, nodes, vocab);
        let all_fixed = draws[1..].iter().all(|&d| d == ChildDraw::Fixed);
        // Without draft rows where none is needed, now and then.
        let with_q = !all_fixed || rng.random_bool(0.5);

        let seed = rng.random::<u64>();
        let verifier = Verifier::new(config).unwrap();
        let verify = |proposal: Proposal<B>| {
            verifier.verify_tree(
                &tree,
                tensor::<B>(&target_logits, tree.len(), vocab, device),
                proposal,
                &mut SpecRng::new(seed),
            )
        };
        let got = verify(Proposal::PerChild {
            q: with_q.then(|| q_tensor.clone()),
            draws: draws.clone(),
        });
        let want = reference::verify_tree(
            &config,
            &tree,
            &rows_f64(&target_logits, vocab),
            &HostProposal::PerChild {
                q: with_q.then(|| q.clone()),
                draws: draws.clone(),
            },
            &mut SpecRng::new(seed),
        );
        let what = format!("case {case}: {config:?}, draws {draws:?}, tree {tree:?}");
        assert_eq!(got, want, "{what}");
        let verdict = got.unwrap();
        accepted_total += verdict.accepted.len();
        if !config.is_greedy() {
            if tree.children(verdict.last_node()).is_empty() {
                leaf_draws += 1;
            } else {
                host_draws += 1;
            }
        }
        let special = if all_fixed {
            Some(Proposal::Deterministic)
        } else if draws[1..].iter().all(|&d| d == ChildDraw::Iid) {
            Some(Proposal::Sampled(q_tensor.clone()))
        } else {
            None
        };
        if let Some(special) = special {
            assert_eq!(verify(special).unwrap(), verdict, "{what}");
            same_as_special += 1;
        }
    }
    assert!(
        accepted_total > cases / 4,
        "only {accepted_total} accepted drafts in {cases} cases"
    );
    eprintln!(
        "{accepted_total} accepted, {host_draws} residual draws, {leaf_draws} bonus draws, {same_as_special} special cases in {cases} cases"
    );
    // Both ends of a step are exercised: the host's draw from a residual, the device's bonus.
    assert!(
        host_draws > cases / 10 && leaf_draws > cases / 10 && same_as_special > cases / 20,
        "{host_draws} residual draws, {leaf_draws} bonus draws, {same_as_special} special cases in {cases} cases"
    );
}

/// Per-child proposals that cannot be verified are typed errors, the same on the backend and in
/// the reference.
fn check_per_child_errors<B: Backend>(device: &B::Device) {
    let vocab = 6;
    let config = SamplingConfig::with_temperature(1.0);
    let verifier = Verifier::new(config).unwrap();
    let (iid, wor, fixed) = (
        ChildDraw::Iid,
        ChildDraw::WithoutReplacement,
        ChildDraw::Fixed,
    );
    // 0 ─┬─ 1 ── 3
    //    └─ 2
    let mut tree = TokenTree::new(0);
    for (parent, token) in [(ROOT, 1), (ROOT, 2), (1, 3)] {
        tree.push(parent, token).unwrap();
    }
    let logits = vec![0.5f32; tree.len() * vocab];
    let mut q = vec![1.0f32 / 6.0; 2 * vocab];
    let shape = |e: &Result<_, SpecError>| matches!(e, Err(SpecError::Shape(_)));
    let always_shape = |e: &Result<_, SpecError>, _greedy| shape(e);
    let check = |q: Option<(Vec<f32>, usize, usize)>,
                 draws: Vec<ChildDraw>,
                 expected: &dyn Fn(&Result<_, SpecError>, bool) -> bool| {
        for greedy in [false, true] {
            let config = if greedy {
                SamplingConfig::greedy()
            } else {
                config
            };
            let verifier = Verifier::new(config).unwrap();
            let got = verifier.verify_tree(
                &tree,
                tensor::<B>(&logits, tree.len(), vocab, device),
                Proposal::PerChild {
                    q: q.as_ref()
                        .map(|(v, rows, cols)| tensor::<B>(v, *rows, *cols, device)),
                    draws: draws.clone(),
                },
                &mut SpecRng::new(3),
            );
            let want = reference::verify_tree(
                &config,
                &tree,
                &rows_f64(&logits, vocab),
                &HostProposal::PerChild {
                    q: q.as_ref().map(|(v, _, cols)| rows_f64(v, *cols)),
                    draws: draws.clone(),
                },
                &mut SpecRng::new(3),
            );
            assert!(expected(&got, greedy), "{draws:?} greedy {greedy}: {got:?}");
            // Structure is checked whatever the settings (the messages of shape errors name
            // tensors or rows); the draft's values only by a sampled walk.
            if shape(&got) {
                assert!(shape(&want), "{draws:?} greedy {greedy}: {want:?}");
            } else if !greedy {
                assert_eq!(got, want, "{draws:?} greedy {greedy}");
            }
        }
    };
    let rows = |v: &[f32], rows| Some((v.to_vec(), rows, vocab));
    // No draft rows although node 0 and node 1 have drawn children; too few rows; another
    // vocabulary; a draw per node missing.
    check(None, vec![fixed, iid, fixed, wor], &always_shape);
    check(
        rows(&q[..vocab], 1),
        vec![fixed, fixed, fixed, wor],
        &always_shape,
    );
    check(
        Some((vec![0.25; 8], 2, 4)),
        vec![fixed, iid, iid, fixed],
        &always_shape,
    );
    check(rows(&q, 2), vec![fixed, iid, iid], &always_shape);
    // Without replacement, twice the same token: node 4 repeats node 1's token 1.
    let mut repeated = tree.clone();
    repeated.push(ROOT, 1).unwrap();
    let logits5 = vec![0.5f32; repeated.len() * vocab];
    for greedy in [false, true] {
        let config = if greedy {
            SamplingConfig::greedy()
        } else {
            config
        };
        let got = Verifier::new(config).unwrap().verify_tree(
            &repeated,
            tensor::<B>(&logits5, repeated.len(), vocab, device),
            Proposal::PerChild {
                q: Some(tensor::<B>(&q, 2, vocab, device)),
                draws: vec![fixed, wor, iid, fixed, wor],
            },
            &mut SpecRng::new(3),
        );
        assert_eq!(got, Err(SpecError::RepeatedDraw { node: 4, token: 1 }));
        let want = reference::verify_tree(
            &config,
            &repeated,
            &rows_f64(&logits5, vocab),
            &HostProposal::PerChild {
                q: Some(rows_f64(&q, vocab)),
                draws: vec![fixed, wor, iid, fixed, wor],
            },
            &mut SpecRng::new(3),
        );
        assert_eq!(got, want);
    }
    // The same token fixed and drawn is fine: only draws without replacement exclude each other.
    let ok = verifier.verify_tree(
        &repeated,
        tensor::<B>(&logits5, repeated.len(), vocab, device),
        Proposal::PerChild {
            q: Some(tensor::<B>(&q, 2, vocab, device)),
            draws: vec![fixed, fixed, iid, fixed, wor],
        },
        &mut SpecRng::new(3),
    );
    assert!(ok.is_ok(), "{ok:?}");
    // A drawn token the draft gave probability 0 (token 1 in row 0), and a draft row of NaN.
    q[1] = 0.0;
    q[0] = 1.0 / 3.0;
    check(rows(&q, 2), vec![fixed, wor, fixed, fixed], &|e, greedy| {
        greedy && e.is_ok() || *e == Err(SpecError::ImpossibleDraft { node: 1, token: 1 })
    });
    let nan = vec![f32::NAN; 2 * vocab];
    check(
        rows(&nan, 2),
        vec![fixed, iid, fixed, fixed],
        &|e, greedy| {
            let nan_row = SpecError::NonFiniteLogits {
                what: Source::Draft,
                row: 0,
            };
            greedy && e.is_ok() || *e == Err(nan_row)
        },
    );
}

#[cfg(feature = "flex")]
#[test]
fn flex_per_child_verification_matches_reference() {
    check_per_child_verification::<burn::backend::Flex>(&Default::default(), 1000);
}

#[cfg(feature = "flex")]
#[test]
fn flex_per_child_bad_input_is_a_typed_error() {
    check_per_child_errors::<burn::backend::Flex>(&Default::default());
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_per_child_verification_matches_reference() {
    check_per_child_verification::<burn::backend::Wgpu>(
        &burn::backend::wgpu::WgpuDevice::default(),
        150,
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_per_child_bad_input_is_a_typed_error() {
    check_per_child_errors::<burn::backend::Wgpu>(&burn::backend::wgpu::WgpuDevice::default());
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_per_child_verification_matches_reference() {
    check_per_child_verification::<burn::backend::Cuda>(
        &burn::backend::cuda::CudaDevice::default(),
        1000,
    );
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_per_child_bad_input_is_a_typed_error() {
    check_per_child_errors::<burn::backend::Cuda>(&burn::backend::cuda::CudaDevice::default());
}
