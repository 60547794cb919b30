//! The in-memory training set: the target's own answers with its hidden states.

/// One prompt answered by the target.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DistilledSequence {
    /// The prompt as the target saw it (chat template applied, maybe truncated), then the
    /// answer. A stop token that ended the answer is not kept: the engine hands over no hidden
    /// state for the step that produces it.
    pub tokens: Vec<u32>,
    /// Where the answer starts in `tokens` (the prompt's length).
    pub answer_start: usize,
    /// `[tokens.len() - answer_start, hidden_size]`, row-major: row `i` is the target's
    /// last-layer hidden state after its final norm at position `answer_start - 1 + i`, the
    /// state that predicted `tokens[answer_start + i]`.
    pub hidden: Vec<f32>,
    /// Whether the prompt is in the held-out split (for measuring, not training).
    pub held_out: bool,
}

impl DistilledSequence {
    /// The answer's tokens.
    pub fn answer(&self) -> &[u32] {
        &self.tokens[self.answer_start.min(self.tokens.len())..]
    }

    /// Row `i` of [`DistilledSequence::hidden`].
    pub fn hidden_row(&self, i: usize, hidden_size: usize) -> &[f32] {
        &self.hidden[i * hidden_size..(i + 1) * hidden_size]
    }
}

/// Distilled sequences of one target, train and held-out together (see
/// [`DistilledSequence::held_out`], [`DistilledSet::train`], [`DistilledSet::held_out`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DistilledSet {
    pub hidden_size: usize,
    /// The target's output vocabulary (its head's rows).
    pub vocab_size: usize,
    /// The train split's prompts first, then the held-out ones, each in the split's order.
    pub sequences: Vec<DistilledSequence>,
}

impl DistilledSet {
    /// The sequences to train on.
    pub fn train(&self) -> impl Iterator<Item = &DistilledSequence> {
        self.sequences.iter().filter(|s| !s.held_out)
    }

    /// The sequences kept apart for measuring.
    pub fn held_out(&self) -> impl Iterator<Item = &DistilledSequence> {
        self.sequences.iter().filter(|s| s.held_out)
    }

    /// Answer tokens over all sequences (each has a hidden row).
    pub fn answer_tokens(&self) -> usize {
        self.sequences.iter().map(|s| s.answer().len()).sum()
    }
}
