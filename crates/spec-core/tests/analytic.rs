//! Exactness by enumeration: for random target and draft distributions over small vocabularies,
//! the law of the first token a verification step emits is computed exactly, in f64, over every
//! draft draw and every random branch of the reference walk, and must equal the target's
//! distribution (after the same sampling settings) to 1e-9.
//!
//! The walk under test is `spec_core::reference::walk` itself, driven by a chooser that replays
//! every branch; the backend implementation is held to that walk in `tests/backend.rs`.

#![allow(clippy::unwrap_used)] // test helpers: a failure should panic with its message

use proptest::prelude::*;
use spec_core::error::Source;
use spec_core::reference::{self, Chooser, HostProposal};
use spec_core::sampling::SamplingConfig;
use spec_core::tree::{NodeId, ROOT, TokenTree};
use spec_core::verify::Verdict;

const TOLERANCE: f64 = 1e-9;

/// A chooser that follows a script of branch indices and records each decision it makes: the
/// branch taken, how many there were, and the probability of the one taken.
struct Replay {
    script: Vec<usize>,
    taken: Vec<(usize, usize, f64)>,
}

impl Replay {
    fn next_choice(&self) -> usize {
        self.script.get(self.taken.len()).copied().unwrap_or(0)
    }
}

impl Chooser for Replay {
    fn accept(&mut self, _node: NodeId, probability: f64) -> bool {
        let choice = self.next_choice();
        let p = probability.clamp(0.0, 1.0);
        self.taken
            .push((choice, 2, if choice == 0 { p } else { 1.0 - p }));
        choice == 0
    }

    fn choose(&mut self, weights: &[f64]) -> usize {
        let choice = self.next_choice();
        let total: f64 = weights.iter().sum();
        self.taken
            .push((choice, weights.len(), weights[choice] / total));
        choice
    }
}

/// Every outcome of `run` with its probability, by depth-first replay of all branches.
fn enumerate(mut run: impl FnMut(&mut Replay) -> Verdict) -> Vec<(Verdict, f64)> {
    let mut outcomes = Vec::new();
    let mut script = Vec::new();
    loop {
        let mut replay = Replay {
            script,
            taken: Vec::new(),
        };
        let verdict = run(&mut replay);
        let weight = replay.taken.iter().map(|t| t.2).product();
        outcomes.push((verdict, weight));
        let mut taken = replay.taken;
        loop {
            match taken.last_mut() {
                None => return outcomes,
                Some(last) if last.0 + 1 < last.1 => {
                    last.0 += 1;
                    break;
                }
                Some(_) => {
                    taken.pop();
                }
            }
        }
        script = taken.iter().map(|t| t.0).collect();
    }
}

/// Law of the first emitted token of one step over `tree`'s root children.
fn first_token_law(
    tree: &TokenTree,
    target: &[Vec<f64>],
    proposal: &HostProposal,
    vocab: usize,
) -> Vec<f64> {
    let mut law = vec![0.0; vocab];
    for (verdict, weight) in enumerate(|c| reference::walk(tree, target, proposal, c).unwrap()) {
        law[verdict.tokens(tree)[0] as usize] += weight;
    }
    law
}

/// All `vocab^m` tuples of `m` tokens.
fn tuples(vocab: usize, m: usize) -> Vec<Vec<u32>> {
    (0..vocab.pow(m as u32))
        .map(|mut code| {
            (0..m)
                .map(|_| {
                    let t = (code % vocab) as u32;
                    code /= vocab;
                    t
                })
                .collect()
        })
        .collect()
}

/// A depth-1 tree: the root with `children`, each a leaf.
fn fan(children: &[u32]) -> TokenTree {
    let mut tree = TokenTree::new(0);
    for &c in children {
        tree.push(ROOT, c).unwrap();
    }
    tree
}

fn assert_close(law: &[f64], p: &[f64]) -> Result<(), TestCaseError> {
    for (i, (a, b)) in law.iter().zip(p).enumerate() {
        prop_assert!(
            (a - b).abs() < TOLERANCE,
            "token {i}: emitted {a}, target {b}; law {law:?} target {p:?}"
        );
    }
    Ok(())
}

/// Target and draft logits: random, with masked (-inf) entries, one-hot rows, equal and
/// near-equal pairs among the cases.
fn logit_pair() -> impl Strategy<Value = (Vec<f64>, Vec<f64>)> {
    (2usize..=5).prop_flat_map(|vocab| {
        let row = proptest::collection::vec(
            prop_oneof![8 => -4.0f64..4.0, 1 => Just(f64::NEG_INFINITY)],
            vocab,
        )
        .prop_filter("at least one finite logit", |r| {
            r.iter().any(|x| x.is_finite())
        });
        let one_hot = (0..vocab).prop_map(move |i| {
            (0..vocab)
                .map(|j| if i == j { 0.0 } else { f64::NEG_INFINITY })
                .collect::<Vec<_>>()
        });
        let any_row = prop_oneof![4 => row.clone(), 1 => one_hot];
        prop_oneof![
            3 => (any_row.clone(), any_row.clone()),
            1 => any_row.clone().prop_map(|r| (r.clone(), r)),
            1 => (any_row, proptest::collection::vec(-1e-6f64..1e-6, vocab)).prop_map(|(r, noise)| {
                let near = r.iter().zip(&noise).map(|(x, n)| x + n).collect();
                (r, near)
            }),
        ]
    })
}

fn sampling_config() -> impl Strategy<Value = SamplingConfig> {
    (
        prop_oneof![Just(1.0f64), Just(0.7), Just(1.6)],
        proptest::option::of(1usize..=5),
        proptest::option::of(prop_oneof![Just(0.9f64), 0.3f64..1.0]),
        proptest::option::of(0.0f64..0.3),
    )
        .prop_map(|(t, k, p, m)| SamplingConfig {
            temperature: t,
            top_k: k,
            top_p: p,
            min_p: m,
            seed: 0,
        })
}

fn process(logits: &[f64], config: &SamplingConfig, what: Source) -> Vec<f64> {
    reference::probabilities(logits, config, what, 0).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Children drawn i.i.d. from q (a chain of length 1 is the case of one child).
    #[test]
    fn sampled_children_emit_the_target_distribution(
        (target_logits, draft_logits) in logit_pair(),
        config in sampling_config(),
        children in 1usize..=4,
    ) {
        let vocab = target_logits.len();
        let p = process(&target_logits, &config, Source::Target);
        let q = process(&draft_logits, &config, Source::Draft);
        let mut law = vec![0.0; vocab];
        for draw in tuples(vocab, children) {
            let weight: f64 = draw.iter().map(|&t| q[t as usize]).product();
            if weight == 0.0 {
                continue;
            }
            let tree = fan(&draw);
            let target = vec![p.clone(); tree.len()];
            let proposal = HostProposal::Sampled(vec![q.clone(); tree.len()]);
            for (i, x) in first_token_law(&tree, &target, &proposal, vocab).into_iter().enumerate() {
                law[i] += weight * x;
            }
        }
        assert_close(&law, &p)?;
    }

    /// Fixed candidates (prompt lookup, top-k heads), possibly repeated.
    #[test]
    fn deterministic_children_emit_the_target_distribution(
        (target_logits, _) in logit_pair(),
        config in sampling_config(),
        picks in proptest::collection::vec(0usize..64, 1..=4),
    ) {
        let vocab = target_logits.len();
        let p = process(&target_logits, &config, Source::Target);
        let children: Vec<u32> = picks.iter().map(|&i| (i % vocab) as u32).collect();
        let tree = fan(&children);
        let target = vec![p.clone(); tree.len()];
        let law = first_token_law(&tree, &target, &HostProposal::Deterministic, vocab);
        assert_close(&law, &p)?;
    }

    /// Greedy: the emitted tokens are exactly the target's argmax chain.
    #[test]
    fn greedy_follows_the_argmax(
        rows in proptest::collection::vec(proptest::collection::vec(-3i32..3, 4), 4),
        children in proptest::collection::vec(0u32..4, 3),
    ) {
        // Integer logits make ties common, so the tie-break is exercised.
        let logits: Vec<Vec<f64>> = rows.iter().map(|r| r.iter().map(|&x| f64::from(x)).collect()).collect();
        let tree = TokenTree::chain(0, &children);
        let verdict = reference::walk_greedy(&tree, &logits);
        let mut expected = Vec::new();
        for row in &logits {
            let best = reference::argmax(row) as u32;
            expected.push(best);
            if tree.children(expected.len() - 1).first().map(|&c| tree.token(c)) != Some(best) {
                break;
            }
        }
        prop_assert_eq!(verdict.tokens(&tree), expected);
    }
}

/// The harness must be able to fail: a walk that judges every sibling against the original `p`
/// (skipping the residual update) is not exact, and the same enumeration catches it.
#[test]
fn enumeration_catches_a_walk_without_residual_update() {
    fn wrong_walk(tree: &TokenTree, p: &[f64], q: &[f64], chooser: &mut Replay) -> u32 {
        for &child in tree.children(ROOT) {
            let token = tree.token(child) as usize;
            if chooser.accept(child, (p[token] / q[token]).min(1.0)) {
                return token as u32;
            }
        }
        chooser.choose(&reference::residual(p, q)) as u32
    }
    let p = vec![0.6, 0.3, 0.1];
    let q = vec![0.2, 0.3, 0.5];
    let vocab = 3;
    let (mut right, mut wrong) = (vec![0.0; vocab], vec![0.0; vocab]);
    for draw in tuples(vocab, 2) {
        let weight: f64 = draw.iter().map(|&t| q[t as usize]).product();
        let tree = fan(&draw);
        let target = vec![p.clone(); tree.len()];
        let proposal = HostProposal::Sampled(vec![q.clone(); tree.len()]);
        for (i, x) in first_token_law(&tree, &target, &proposal, vocab)
            .into_iter()
            .enumerate()
        {
            right[i] += weight * x;
        }
        for (verdict, w) in enumerate(|c| Verdict {
            accepted: vec![],
            next_token: wrong_walk(&tree, &p, &q, c),
        }) {
            wrong[verdict.next_token as usize] += weight * w;
        }
    }
    assert!(
        right.iter().zip(&p).all(|(a, b)| (a - b).abs() < TOLERANCE),
        "{right:?}"
    );
    assert!(
        wrong.iter().zip(&p).any(|(a, b)| (a - b).abs() > 0.01),
        "{wrong:?}"
    );
}
