//! The pre-tokenizers that GGUF's `tokenizer.ggml.pre` names.
//!
//! `tokenizer.ggml.pre` is llama.cpp's name for how text is split into words before BPE runs. Each
//! name stands for an ordered list of regexes: the text is split by the first, every piece by the
//! second, and so on; matches and the text between matches both become pieces. We rebuild that
//! with `tokenizers` components: one `Split` (behaviour `Isolated`, which keeps matches and gaps as
//! pieces) per regex, then `ByteLevel` without its own regex, which only maps bytes to the
//! byte-level alphabet.
//!
//! Only names whose behaviour has been checked against llama.cpp token for token (see the crate's
//! `tests/upstream.rs`) are accepted; anything else is an error naming the value, because a wrong
//! guess would tokenize differently from the model's training without any visible failure.

use tokenizers::SplitDelimiterBehavior;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

use crate::error::{Result, TokenizerError};

/// GPT-2's word regex: contractions, an optional space and a run of letters, of digits or of
/// other symbols, whitespace that is not followed by a word (so the last space goes with the next
/// word), and any remaining whitespace.
const GPT2_WORDS: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Every numeric character on its own (SmolLM2 splits digits individually).
const EACH_DIGIT: &str = r"\p{N}";

/// Qwen2's regex (the same as its tokenizer.json, with the case-insensitive contractions spelled
/// out as llama.cpp does): a letter run may take one leading non-letter, non-digit character
/// (a space, punctuation); digits one at a time; punctuation runs take trailing newlines; newline
/// runs take the whitespace before them.
const QWEN2_WORDS: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer kinds this crate builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreTokenizerKind {
    /// llama.cpp's `smollm` (also StarCoder's): each digit alone, then GPT-2's word regex.
    SmolLm,
    /// llama.cpp's `qwen2` (Qwen2 / Qwen2.5 and DeepSeek-R1 distills of Qwen).
    Qwen2,
}

/// `(tokenizer.ggml.pre value, kind)` for every accepted value.
const KNOWN: &[(&str, PreTokenizerKind)] = &[
    ("smollm", PreTokenizerKind::SmolLm),
    ("qwen2", PreTokenizerKind::Qwen2),
    ("deepseek-r1-qwen", PreTokenizerKind::Qwen2),
];

impl PreTokenizerKind {
    /// The kind that a `tokenizer.ggml.pre` value names.
    ///
    /// # Errors
    /// [`TokenizerError::UnsupportedPreTokenizer`] for any other value.
    pub fn from_gguf_name(pre: &str) -> Result<Self> {
        KNOWN
            .iter()
            .find(|(name, _)| *name == pre)
            .map(|&(_, kind)| kind)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer {
                pre: pre.to_owned(),
                supported: KNOWN
                    .iter()
                    .map(|(n, _)| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The regexes applied in order, as llama.cpp lists them.
    pub fn regexes(self) -> &'static [&'static str] {
        match self {
            Self::SmolLm => &[EACH_DIGIT, GPT2_WORDS],
            Self::Qwen2 => &[QWEN2_WORDS],
        }
    }

    /// The `tokenizers` pre-tokenizer: one isolating split per regex, then the byte mapping.
    pub(crate) fn build(self) -> Result<PreTokenizerWrapper> {
        let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
        for re in self.regexes() {
            let split = Split::new(
                SplitPattern::Regex((*re).to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )?;
            steps.push(split.into());
        }
        // add_prefix_space = false: llama.cpp adds no space for BPE vocabularies;
        // trim_offsets only affects offsets; use_regex = false: the splits above replace it.
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(Sequence::new(steps).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn pieces(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let pt = kind.build().expect("builds");
        let mut s = PreTokenizedString::from(text);
        pt.pre_tokenize(&mut s).expect("splits");
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (a, b), _)| text[a..b].to_owned())
            .collect()
    }

    #[test]
    fn unknown_names_are_refused_with_the_name() {
        let err = PreTokenizerKind::from_gguf_name("llama-bpe").expect_err("unknown");
        let msg = err.to_string();
        assert!(msg.contains("`llama-bpe`"), "{msg}");
        assert!(msg.contains("`qwen2`") && msg.contains("`smollm`"), "{msg}");
    }

    #[test]
    fn smollm_splits_digits_and_gpt2_words() {
        assert_eq!(
            pieces(PreTokenizerKind::SmolLm, "I'll pay 1234 now!!  ok"),
            [
                "I", "'ll", " pay", " ", "1", "2", "3", "4", " now", "!!", " ", " ok"
            ]
        );
    }

    #[test]
    fn qwen2_keeps_leading_punctuation_with_letters_and_newlines_with_whitespace() {
        assert_eq!(
            pieces(PreTokenizerKind::Qwen2, "x.Foo's 42\n\n  y"),
            ["x", ".Foo", "'s", " ", "4", "2", "\n\n", " ", " y"]
        );
        assert_eq!(
            pieces(PreTokenizerKind::Qwen2, "A;\n  b"),
            ["A", ";\n", " ", " b"]
        );
    }
}
