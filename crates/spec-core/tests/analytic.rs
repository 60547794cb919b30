//! Exactness by enumeration: for random target and draft distributions over small vocabularies,
//! the law of the first token a verification step emits is computed exactly, in f64, over every
//! draft draw and every random branch of the reference walk, and must equal the target's
//! distribution (after the same sampling settings) to 1e-9.
//!
//! The walk under test is `spec_core::reference::walk` itself, driven by a chooser that replays
//! every branch; the backend implementation is held to that walk in `tests/backend.rs`.
//!
//! Trees whose nodes mix the ways of drawing children (`HostProposal::PerChild`) are drafted by
//! the same chooser, so the enumeration covers every draft draw with its probability (draws
//! without replacement included) as well as every branch of the walk; there the law of the first
//! two tokens of depth-2 trees is checked.

#![allow(clippy::unwrap_used)] // test helpers: a failure should panic with its message

use proptest::prelude::*;
use spec_core::error::Source;
use spec_core::reference::{self, Chooser, HostProposal};
use spec_core::sampling::SamplingConfig;
use spec_core::tree::{ChildDraw, NodeId, ROOT, TokenTree};
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
    enumerate_some(|c| Some(run(c)))
}

/// [`enumerate`] for runs that may stop on a branch of probability 0 (`None`, left out).
fn enumerate_some<T>(mut run: impl FnMut(&mut Replay) -> Option<T>) -> Vec<(T, f64)> {
    let mut outcomes = Vec::new();
    let mut script = Vec::new();
    loop {
        let mut replay = Replay {
            script,
            taken: Vec::new(),
        };
        if let Some(outcome) = run(&mut replay) {
            let weight = replay.taken.iter().map(|t| t.2).product();
            outcomes.push((outcome, weight));
        }
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

/// How one child is drafted in the enumerated trees of mixed draws.
#[derive(Debug, Clone, Copy)]
enum Kid {
    /// From the parent's `q`, independently of its siblings.
    Iid,
    /// From the parent's `q` without the tokens of the earlier `Wor` siblings.
    Wor,
    /// A fixed candidate: entry `i` of the case's fixed tokens (shifted by the parent's token
    /// below the root, so candidates depend on the path).
    Fixed(usize),
}

/// A depth-2 tree: the root's children follow `root`; the root children at the positions
/// `with_children` get children following `below`.
#[derive(Debug, Clone)]
struct Pattern {
    root: Vec<Kid>,
    below: Vec<Kid>,
    with_children: Vec<usize>,
}

/// The distributions of one case: the target's and the draft's at the root (`p0`, `q0`) and
/// after each first token `t` (`p1[t]`, `q1[t]`).
#[derive(Debug, Clone)]
struct Case {
    p0: Vec<f64>,
    q0: Vec<f64>,
    p1: Vec<Vec<f64>>,
    q1: Vec<Vec<f64>>,
    fixed: Vec<u32>,
}

/// How the verifier is told the children were drawn: right, or one of the deliberate mistakes.
#[derive(Debug, Clone, Copy)]
struct Declared {
    wor: ChildDraw,
    fixed: ChildDraw,
}

const DECLARED_RIGHT: Declared = Declared {
    wor: ChildDraw::WithoutReplacement,
    fixed: ChildDraw::Fixed,
};

/// A drafted tree with each node's draw and the rows the walk reads.
struct Drafted {
    tree: TokenTree,
    draws: Vec<ChildDraw>,
}

/// Draws one token from `weights` through the chooser; `None` for a draw of probability 0.
fn draw_from(c: &mut Replay, weights: &[f64]) -> Option<u32> {
    let token = c.choose(weights);
    (weights[token] > 0.0).then_some(token as u32)
}

/// Drafts the children of `parent` following `kids`; a `Wor` child is left out when its parent's
/// `q` has no token left (the drafter then proposes fewer children).
fn draft_children(
    c: &mut Replay,
    drafted: &mut Drafted,
    parent: NodeId,
    kids: &[Kid],
    (q, fixed, shift): (&[f64], &[u32], u32),
    declared: Declared,
) -> Option<Vec<NodeId>> {
    let vocab = q.len() as u32;
    let mut q_cur = q.to_vec();
    let mut nodes = Vec::new();
    for kid in kids {
        let (token, draw) = match *kid {
            Kid::Fixed(i) => ((fixed[i % fixed.len()] + shift) % vocab, declared.fixed),
            Kid::Iid => (draw_from(c, q)?, ChildDraw::Iid),
            Kid::Wor => {
                if q_cur.iter().sum::<f64>() <= 0.0 {
                    continue;
                }
                let token = draw_from(c, &q_cur)?;
                q_cur[token as usize] = 0.0;
                (token, declared.wor)
            }
        };
        nodes.push(drafted.tree.push(parent, token).unwrap());
        drafted.draws.push(draw);
    }
    Some(nodes)
}

/// Drafts a tree of `pattern` through the chooser, then walks it with the reference; returns the
/// emitted tokens, or `None` on a draft draw of probability 0.
fn draft_and_walk(
    c: &mut Replay,
    pattern: &Pattern,
    case: &Case,
    declared: Declared,
) -> Option<Vec<u32>> {
    let mut drafted = Drafted {
        tree: TokenTree::new(0),
        draws: vec![ChildDraw::Fixed],
    };
    let first = draft_children(
        c,
        &mut drafted,
        ROOT,
        &pattern.root,
        (&case.q0, &case.fixed, 0),
        declared,
    )?;
    for &i in &pattern.with_children {
        if let Some(&node) = first.get(i) {
            let t = drafted.tree.token(node);
            draft_children(
                c,
                &mut drafted,
                node,
                &pattern.below,
                (&case.q1[t as usize], &case.fixed, t + 1),
                declared,
            )?;
        }
    }
    let tree = &drafted.tree;
    // Depth-2 rows only give the third token, which is not checked.
    let row = |first: &Vec<f64>, after: &[Vec<f64>], n: NodeId| match tree.depth(n) {
        1 => after[tree.token(n) as usize].clone(),
        _ => first.clone(),
    };
    let target: Vec<Vec<f64>> = (0..tree.len())
        .map(|n| row(&case.p0, &case.p1, n))
        .collect();
    let q: Vec<Vec<f64>> = (0..tree.len())
        .map(|n| row(&case.q0, &case.q1, n))
        .collect();
    let proposal = HostProposal::PerChild {
        q: Some(q),
        draws: drafted.draws,
    };
    let verdict = reference::walk(tree, &target, &proposal, c).unwrap();
    Some(verdict.tokens(tree))
}

/// Law of the first two tokens, `law[t1 · vocab + t2]`, over every draft draw and every branch
/// of the walk. A step that emits one token is continued by a plain draw from `p1[t1]`.
fn two_token_law(pattern: &Pattern, case: &Case, declared: Declared) -> Vec<f64> {
    let vocab = case.p0.len();
    let mut law = vec![0.0; vocab * vocab];
    for (tokens, weight) in enumerate_some(|c| draft_and_walk(c, pattern, case, declared)) {
        let t1 = tokens[0] as usize;
        match tokens.get(1) {
            Some(&t2) => law[t1 * vocab + t2 as usize] += weight,
            None => {
                for (t2, p) in case.p1[t1].iter().enumerate() {
                    law[t1 * vocab + t2] += weight * p;
                }
            }
        }
    }
    law
}

/// The target's law of the first two tokens.
fn target_two_token_law(case: &Case) -> Vec<f64> {
    let vocab = case.p0.len();
    (0..vocab * vocab)
        .map(|cell| case.p0[cell / vocab] * case.p1[cell / vocab][cell % vocab])
        .collect()
}

/// One logit row: random with masked entries, or one-hot.
fn logit_row(vocab: usize) -> impl Strategy<Value = Vec<f64>> + Clone {
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
    prop_oneof![4 => row, 1 => one_hot]
}

/// Target and draft logits of a case's `1 + vocab` rows; each draft row is independent, equal to
/// the target's or within 1e-6 of it; and the fixed tokens.
fn case_logits(vocab: usize) -> impl Strategy<Value = (Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<u32>)> {
    let rows = vocab + 1;
    (
        proptest::collection::vec(logit_row(vocab), rows),
        proptest::collection::vec(logit_row(vocab), rows),
        proptest::collection::vec(0u8..4, rows),
        proptest::collection::vec(proptest::collection::vec(-1e-6f64..1e-6, vocab), rows),
        proptest::collection::vec(0u32..8, 4),
    )
        .prop_map(|(target, independent, modes, noise, fixed)| {
            let draft = (0..target.len())
                .map(|i| match modes[i] {
                    2 => target[i].clone(),
                    3 => target[i]
                        .iter()
                        .zip(&noise[i])
                        .map(|(x, n)| x + n)
                        .collect(),
                    _ => independent[i].clone(),
                })
                .collect();
            (target, draft, fixed)
        })
}

/// Temperature 1 plain, with top-k and with top-p, and the general settings.
fn tree_config() -> impl Strategy<Value = SamplingConfig> {
    let t1 = SamplingConfig::with_temperature(1.0);
    prop_oneof![
        Just(t1),
        Just(t1.top_k(2)),
        Just(t1.top_p(0.8)),
        Just(t1.top_k(3).top_p(0.7)),
        sampling_config(),
    ]
}

fn make_case(
    (target, draft, fixed): &(Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<u32>),
    config: &SamplingConfig,
) -> Case {
    let rows = |logits: &[Vec<f64>], what| -> Vec<Vec<f64>> {
        logits.iter().map(|l| process(l, config, what)).collect()
    };
    let (p, q) = (rows(target, Source::Target), rows(draft, Source::Draft));
    Case {
        p0: p[0].clone(),
        q0: q[0].clone(),
        p1: p[1..].to_vec(),
        q1: q[1..].to_vec(),
        fixed: fixed.clone(),
    }
}

fn check_pattern(
    pattern: &Pattern,
    logits: &(Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<u32>),
    config: &SamplingConfig,
) -> Result<(), TestCaseError> {
    let case = make_case(logits, config);
    let law = two_token_law(pattern, &case, DECLARED_RIGHT);
    assert_close(&law, &target_two_token_law(&case))
}

fn pattern(root: &[Kid], below: &[Kid], with_children: &[usize]) -> Pattern {
    Pattern {
        root: root.to_vec(),
        below: below.to_vec(),
        with_children: with_children.to_vec(),
    }
}

fn kid() -> impl Strategy<Value = Kid> {
    prop_oneof![
        Just(Kid::Iid),
        Just(Kid::Wor),
        (0usize..4).prop_map(Kid::Fixed)
    ]
}

use Kid::{Fixed, Iid, Wor};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Three children i.i.d. from q at the root, two at two of them.
    #[test]
    fn iid_tree_emits_the_target_law(logits in case_logits(3), config in tree_config()) {
        check_pattern(&pattern(&[Iid; 3], &[Iid; 2], &[0, 2]), &logits, &config)?;
    }

    /// Three children without replacement at the root, two at two of them.
    #[test]
    fn without_replacement_tree_emits_the_target_law(
        logits in case_logits(3),
        config in tree_config(),
    ) {
        check_pattern(&pattern(&[Wor; 3], &[Wor; 2], &[0, 2]), &logits, &config)?;
    }

    /// Fixed candidates everywhere (repeats among them), given as per-child draws.
    #[test]
    fn fixed_tree_emits_the_target_law(logits in case_logits(4), config in tree_config()) {
        check_pattern(
            &pattern(&[Fixed(0), Fixed(1), Fixed(2)], &[Fixed(3), Fixed(0)], &[0, 1, 2]),
            &logits,
            &config,
        )?;
    }

    /// Two fixed and two without-replacement children at the root; i.i.d. and fixed below.
    #[test]
    fn fixed_and_without_replacement_siblings_emit_the_target_law(
        logits in case_logits(3),
        config in tree_config(),
    ) {
        check_pattern(
            &pattern(&[Fixed(0), Fixed(1), Wor, Wor], &[Iid, Fixed(2)], &[0, 3]),
            &logits,
            &config,
        )?;
    }

    /// The three ways interleaved at the root; without replacement around a fixed one below.
    #[test]
    fn interleaved_draws_emit_the_target_law(
        logits in case_logits(3),
        config in tree_config(),
    ) {
        check_pattern(
            &pattern(&[Wor, Iid, Fixed(0), Wor], &[Wor, Fixed(1), Wor], &[0, 1]),
            &logits,
            &config,
        )?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Random mixes of the three ways, over vocabularies of 2 to 4 tokens.
    #[test]
    fn random_mixed_trees_emit_the_target_law(
        logits in (2usize..=4).prop_flat_map(case_logits),
        config in tree_config(),
        root in proptest::collection::vec(kid(), 1..=3),
        below in proptest::collection::vec(kid(), 0..=2),
        at in 0usize..3,
    ) {
        check_pattern(&pattern(&root, &below, &[at]), &logits, &config)?;
    }
}

/// The enumeration of drawn trees must be able to fail: children drawn without replacement but
/// verified as i.i.d. (`q_cur` never loses the drawn tokens), and fixed candidates verified as
/// draws from `q`, both move the law far from the target's.
#[test]
fn enumeration_catches_wrong_per_child_rules() {
    let row = |xs: [f64; 4]| xs.to_vec();
    let case = Case {
        p0: row([0.4, 0.3, 0.2, 0.1]),
        q0: row([0.1, 0.2, 0.3, 0.4]),
        p1: vec![
            row([0.5, 0.25, 0.15, 0.1]),
            row([0.1, 0.1, 0.5, 0.3]),
            row([0.3, 0.4, 0.2, 0.1]),
            row([0.25, 0.25, 0.25, 0.25]),
        ],
        q1: vec![
            row([0.2, 0.3, 0.1, 0.4]),
            row([0.4, 0.3, 0.2, 0.1]),
            row([0.1, 0.2, 0.6, 0.1]),
            row([0.7, 0.1, 0.1, 0.1]),
        ],
        fixed: vec![1, 0, 2, 3],
    };
    let want = target_two_token_law(&case);
    let deviation = |law: &[f64]| {
        law.iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max)
    };
    let cases = [
        (
            pattern(&[Wor; 3], &[Wor; 2], &[0, 1]),
            "without replacement verified as i.i.d.",
        ),
        (
            pattern(&[Fixed(0), Iid, Fixed(1)], &[Fixed(2), Iid], &[0, 1]),
            "fixed candidates verified as draws from q",
        ),
    ];
    let wrong_ways = [
        Declared {
            wor: ChildDraw::Iid,
            ..DECLARED_RIGHT
        },
        Declared {
            fixed: ChildDraw::Iid,
            ..DECLARED_RIGHT
        },
    ];
    for ((pattern, what), wrong) in cases.iter().zip(wrong_ways) {
        let right = deviation(&two_token_law(pattern, &case, DECLARED_RIGHT));
        let wrong = deviation(&two_token_law(pattern, &case, wrong));
        eprintln!("{what}: largest deviation {wrong:.4} (right rule: {right:.1e})");
        assert!(
            right < TOLERANCE,
            "{what}: the right rule deviates by {right}"
        );
        assert!(wrong > 0.01, "{what}: not detected, deviation {wrong}");
    }
}
