//! Exactness by sampling: whole generations of 3 tokens by speculative steps, repeated with a
//! seeded RNG; the empirical joint law of the 3 tokens must be within the 99.9% total-variation
//! bound of the exact law, which is the product of the target's (processed) conditionals.
//!
//! Bound: with `n` runs over cells of probability `p_i`, E[TV] ≤ ½ Σ √(p_i (1 − p_i) / n)
//! (Jensen), and TV moves by at most 1/n per run, so P(TV ≥ E[TV] + ε) ≤ exp(−2nε²)
//! (McDiarmid). With δ = 0.001: bound = ½ Σ √(p_i (1 − p_i) / n) + √(ln(1/δ) / (2n)).

#![allow(clippy::unwrap_used)] // test helpers: a failure should panic with its message

use std::collections::HashMap;

use burn::tensor::{Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spec_core::error::Source;
use spec_core::reference::{self, HostProposal};
use spec_core::rng::SpecRng;
use spec_core::sampling::SamplingConfig;
use spec_core::tree::{NodeId, ROOT, TokenTree};
use spec_core::verify::{Proposal, Verdict, Verifier};

const VOCAB: usize = 8;
const LENGTH: usize = 3;
const BOS: u32 = 0;

/// A toy language model: logits depend on the whole prefix, through a hash.
struct ToyModel {
    seed: u64,
    scale: f64,
    cache: HashMap<Vec<u32>, Vec<f64>>,
}

impl ToyModel {
    fn new(seed: u64, scale: f64) -> Self {
        Self {
            seed,
            scale,
            cache: HashMap::new(),
        }
    }

    fn logits(&mut self, prefix: &[u32]) -> Vec<f64> {
        let (seed, scale) = (self.seed, self.scale);
        self.cache
            .entry(prefix.to_vec())
            .or_insert_with(|| {
                let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
                for &t in prefix {
                    h = (h ^ u64::from(t) ^ 0x9e37).wrapping_mul(0x0100_0000_01b3);
                }
                let mut rng = ChaCha8Rng::seed_from_u64(h);
                (0..VOCAB)
                    .map(|_| rng.random_range(-1.0..1.0) * scale)
                    .collect()
            })
            .clone()
    }

    fn probs(&mut self, prefix: &[u32], config: &SamplingConfig) -> Vec<f64> {
        reference::probabilities(&self.logits(prefix), config, Source::Target, 0).unwrap()
    }
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    /// K drafted tokens in a chain, each sampled from the draft.
    Chain(usize),
    /// Every node up to depth 2 gets `n` children sampled i.i.d. from the draft.
    SampledTree(usize),
    /// Every node up to depth 2 gets the draft's `n` most likely tokens as fixed candidates.
    TopTree(usize),
}

/// One verification step: the implementation under test.
trait Engine {
    fn step(
        &mut self,
        tree: &TokenTree,
        target_logits: &[Vec<f64>],
        q: Option<&[Vec<f64>]>,
        rng: &mut SpecRng,
    ) -> Verdict;
}

struct Reference(SamplingConfig);

impl Engine for Reference {
    fn step(
        &mut self,
        tree: &TokenTree,
        target_logits: &[Vec<f64>],
        q: Option<&[Vec<f64>]>,
        rng: &mut SpecRng,
    ) -> Verdict {
        let proposal = q.map_or(HostProposal::Deterministic, |q| {
            HostProposal::Sampled(q.to_vec())
        });
        reference::verify_tree(&self.0, tree, target_logits, &proposal, rng).unwrap()
    }
}

struct Backend<B: burn::tensor::backend::Backend>(Verifier, B::Device);

impl<B: burn::tensor::backend::Backend> Engine for Backend<B> {
    fn step(
        &mut self,
        tree: &TokenTree,
        target_logits: &[Vec<f64>],
        q: Option<&[Vec<f64>]>,
        rng: &mut SpecRng,
    ) -> Verdict {
        let tensor = |rows: &[Vec<f64>]| {
            let flat: Vec<f32> = rows.iter().flatten().map(|&x| x as f32).collect();
            Tensor::<B, 2>::from_data(TensorData::new(flat, [rows.len(), VOCAB]), &self.1)
        };
        let proposal = q.map_or(Proposal::Deterministic, |q| Proposal::Sampled(tensor(q)));
        self.0
            .verify_tree(tree, tensor(target_logits), proposal, rng)
            .unwrap()
    }
}

/// A rule that is *not* exact: on rejection it draws from p instead of the residual.
struct ResampleFromP(SamplingConfig);

impl Engine for ResampleFromP {
    fn step(
        &mut self,
        tree: &TokenTree,
        target_logits: &[Vec<f64>],
        q: Option<&[Vec<f64>]>,
        rng: &mut SpecRng,
    ) -> Verdict {
        let verdict = Reference(self.0).step(tree, target_logits, q, rng);
        let node = verdict.last_node();
        if tree.children(node).is_empty() {
            return verdict;
        }
        let p = reference::probabilities(&target_logits[node], &self.0, Source::Target, 0).unwrap();
        Verdict {
            next_token: reference::inverse_cdf(&p, rng.uniform()) as u32,
            ..verdict
        }
    }
}

struct Outcome {
    tv: f64,
    bound: f64,
}

fn run(engine: &mut dyn Engine, config: SamplingConfig, shape: Shape, runs: usize) -> Outcome {
    let mut target = ToyModel::new(1, 2.5);
    let mut draft = ToyModel::new(2, 2.0);
    let mut rng = SpecRng::new(config.seed);
    let mut draft_rng = ChaCha8Rng::seed_from_u64(config.seed ^ 0xd7af7);
    let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];

    for _ in 0..runs {
        let mut sequence: Vec<u32> = Vec::new();
        while sequence.len() < LENGTH {
            let context: Vec<u32> = std::iter::once(BOS)
                .chain(sequence.iter().copied())
                .collect();
            let context_of = |tree: &TokenTree, node: NodeId| -> Vec<u32> {
                let mut c = context.clone();
                c.extend(tree.path_to(node).iter().map(|&n| tree.token(n)));
                c
            };
            // Draft the tree, keeping q at every node.
            let mut tree = TokenTree::new(*context.last().unwrap_or(&BOS));
            let mut q_rows: Vec<Vec<f64>> = Vec::new();
            let mut frontier = vec![ROOT];
            let (depth, width) = match shape {
                Shape::Chain(k) => (k, 1),
                Shape::SampledTree(n) | Shape::TopTree(n) => (2, n),
            };
            for _ in 0..depth {
                let mut next = Vec::new();
                for &node in &frontier {
                    let q = draft.probs(&context_of(&tree, node), &config);
                    while q_rows.len() <= node {
                        q_rows.push(vec![0.0; VOCAB]);
                    }
                    q_rows[node] = q.clone();
                    let tokens: Vec<u32> = match shape {
                        Shape::TopTree(_) => {
                            let mut order: Vec<usize> = (0..VOCAB).collect();
                            order.sort_by(|&a, &b| q[b].total_cmp(&q[a]).then(a.cmp(&b)));
                            order.iter().take(width).map(|&t| t as u32).collect()
                        }
                        _ => (0..width)
                            .map(|_| reference::inverse_cdf(&q, draft_rng.random()) as u32)
                            .collect(),
                    };
                    for token in tokens {
                        next.push(tree.push(node, token).unwrap_or(ROOT));
                    }
                }
                frontier = next;
            }
            let target_logits: Vec<Vec<f64>> = (0..tree.len())
                .map(|n| target.logits(&context_of(&tree, n)))
                .collect();
            let q = matches!(shape, Shape::Chain(_) | Shape::SampledTree(_))
                .then_some(q_rows.as_slice());
            let verdict = engine.step(&tree, &target_logits, q, &mut rng);
            sequence.extend(verdict.tokens(&tree));
        }
        let cell = sequence[..LENGTH]
            .iter()
            .fold(0usize, |acc, &t| acc * VOCAB + t as usize);
        counts[cell] += 1;
    }

    // The exact law: product of the target's processed conditionals.
    let n = runs as f64;
    let (mut tv, mut spread) = (0.0, 0.0);
    for (cell, &count) in counts.iter().enumerate() {
        let tokens: Vec<u32> = (0..LENGTH)
            .rev()
            .map(|i| ((cell / VOCAB.pow(i as u32)) % VOCAB) as u32)
            .collect();
        let mut p = 1.0;
        for t in 0..LENGTH {
            let context: Vec<u32> = std::iter::once(BOS)
                .chain(tokens[..t].iter().copied())
                .collect();
            p *= target.probs(&context, &config)[tokens[t] as usize];
        }
        tv += (count as f64 / n - p).abs() / 2.0;
        spread += (p * (1.0 - p) / n).sqrt() / 2.0;
    }
    let bound = spread + (1000f64.ln() / (2.0 * n)).sqrt();
    Outcome { tv, bound }
}

fn assert_exact(engine: &mut dyn Engine, config: SamplingConfig, shape: Shape, runs: usize) {
    let Outcome { tv, bound } = run(engine, config, shape, runs);
    eprintln!("{shape:?} {config:?}: TV {tv:.5} over {runs} runs, 99.9% bound {bound:.5}");
    assert!(tv < bound, "{shape:?} {config:?}: TV {tv} ≥ bound {bound}");
}

fn settings() -> [SamplingConfig; 2] {
    [
        SamplingConfig::with_temperature(1.0).seed(17),
        SamplingConfig::with_temperature(0.7).top_p(0.9).seed(18),
    ]
}

const RUNS: usize = 200_000;

#[test]
fn reference_chain_k3() {
    for config in settings() {
        assert_exact(&mut Reference(config), config, Shape::Chain(3), RUNS);
    }
}

#[test]
fn reference_sampled_tree_depth2() {
    for config in settings() {
        assert_exact(&mut Reference(config), config, Shape::SampledTree(2), RUNS);
    }
}

#[test]
fn reference_top_candidate_tree_depth2() {
    for config in settings() {
        assert_exact(&mut Reference(config), config, Shape::TopTree(2), RUNS);
    }
}

#[cfg(feature = "flex")]
mod flex {
    use super::*;

    fn engine(config: SamplingConfig) -> Backend<burn::backend::Flex> {
        Backend(Verifier::new(config).unwrap(), Default::default())
    }

    #[test]
    fn flex_chain_k3() {
        for config in settings() {
            assert_exact(&mut engine(config), config, Shape::Chain(3), RUNS);
        }
    }

    #[test]
    fn flex_sampled_tree_depth2() {
        let config = settings()[1];
        assert_exact(&mut engine(config), config, Shape::SampledTree(2), RUNS);
    }

    #[test]
    fn flex_top_candidate_tree_depth2() {
        let config = settings()[0];
        assert_exact(&mut engine(config), config, Shape::TopTree(2), RUNS);
    }
}

/// The test has power: resampling from p after a rejection (a classic mistake) is caught.
#[test]
fn a_biased_rule_is_caught() {
    let config = settings()[0];
    let Outcome { tv, bound } = run(&mut ResampleFromP(config), config, Shape::Chain(3), RUNS);
    eprintln!("biased rule: TV {tv:.5}, bound {bound:.5}");
    assert!(
        tv > 2.0 * bound,
        "the biased rule was not detected: TV {tv}, bound {bound}"
    );
}
