//! The tokenizer fields of a GGUF file and the tokenizer built from them.

use std::collections::BTreeMap;

use spec_gguf::{GgufFile, Value};
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::{AddedToken, Tokenizer};

use crate::bytes::Pieces;
use crate::chat::ChatTemplate;
use crate::error::{Result, TokenizerError};
use crate::pretokenize::PreTokenizerKind;
use crate::text::{END_OF_TURN_TEXTS, SpecialIds, TextTokenizer, TokenKind, bos_post_processor};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    /// An ordinary vocabulary entry, byte-level encoded.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// A control token (`<|im_start|>`, `<|endoftext|>`): raw text, matched before BPE.
    pub const CONTROL: i32 = 3;
    /// A user-defined (added) token: raw text, matched before BPE.
    pub const USER_DEFINED: i32 = 4;
    /// An unused slot (Qwen's `[PAD151665]` padding up to the embedding size).
    pub const UNUSED: i32 = 5;
    /// A byte token (`<0x0A>`, SentencePiece vocabularies).
    pub const BYTE: i32 = 6;
}

/// The GGUF tokenizer metadata, as plain data.
///
/// Fill it with [`GgufTokenizerData::from_gguf`] or [`GgufTokenizerData::from_metadata`], or by
/// hand in tests; then [`GgufTokenizerData::build`] makes the tokenizer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufTokenizerData {
    /// `tokenizer.ggml.model` (`gpt2` for byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name (`smollm`, `qwen2`, …).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the text of each id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (see [`token_type`]); empty means all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: `"left right"` rules, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn), where present.
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` (absent: no BOS, as llama.cpp does for these BPE models).
    pub add_bos_token: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos_token: Option<bool>,
    /// `tokenizer.chat_template`: the Jinja chat template.
    pub chat_template: Option<String>,
}

impl GgufTokenizerData {
    /// Reads the tokenizer keys from an open GGUF file.
    ///
    /// # Errors
    /// A missing required key (`tokenizer.ggml.model`, `.tokens`) or a key of the wrong type.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Self::from_metadata(file.metadata())
    }

    /// Reads the tokenizer keys from GGUF metadata.
    ///
    /// # Errors
    /// A missing required key (`tokenizer.ggml.model`, `.tokens`) or a key of the wrong type.
    pub fn from_metadata(meta: &BTreeMap<String, Value>) -> Result<Self> {
        let model = string(meta, "tokenizer.ggml.model")?
            .ok_or(TokenizerError::MissingKey {
                key: "tokenizer.ggml.model",
            })?
            .to_owned();
        let tokens = strings(meta, "tokenizer.ggml.tokens")?.ok_or(TokenizerError::MissingKey {
            key: "tokenizer.ggml.tokens",
        })?;
        let token_types = match meta.get("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(v) => v
                .as_i64_array()
                .and_then(|a| a.into_iter().map(|x| i32::try_from(x).ok()).collect())
                .ok_or_else(|| wrong("tokenizer.ggml.token_type", "an array of i32", v))?,
        };
        Ok(Self {
            model,
            pre: string(meta, "tokenizer.ggml.pre")?.map(str::to_owned),
            tokens,
            token_types,
            merges: strings(meta, "tokenizer.ggml.merges")?.unwrap_or_default(),
            bos_token_id: id(meta, "tokenizer.ggml.bos_token_id")?,
            eos_token_id: id(meta, "tokenizer.ggml.eos_token_id")?,
            eot_token_id: id(meta, "tokenizer.ggml.eot_token_id")?,
            padding_token_id: id(meta, "tokenizer.ggml.padding_token_id")?,
            add_bos_token: boolean(meta, "tokenizer.ggml.add_bos_token")?,
            add_eos_token: boolean(meta, "tokenizer.ggml.add_eos_token")?,
            chat_template: string(meta, "tokenizer.chat_template")?.map(str::to_owned),
        })
    }

    /// The type of token `i` (normal when the GGUF has no type array).
    fn type_of(&self, i: usize) -> i32 {
        self.token_types
            .get(i)
            .copied()
            .unwrap_or(token_type::NORMAL)
    }

    /// Builds the tokenizer: byte-level BPE over `tokens` and `merges`, the pre-tokenizer that
    /// `pre` names, control and user-defined tokens as special tokens matched before BPE, and a
    /// BOS/EOS post-processor per `add_bos_token` / `add_eos_token`.
    ///
    /// # Errors
    /// An unsupported model or pre-tokenizer, inconsistent arrays, ids outside the vocabulary,
    /// duplicate token texts, malformed merges, or a chat template that does not compile.
    pub fn build(&self) -> Result<TextTokenizer> {
        if self.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel {
                model: self.model.clone(),
            });
        }
        // llama.cpp calls a missing value `default` (a generic regex this crate does not build).
        let kind = PreTokenizerKind::from_gguf_name(self.pre.as_deref().unwrap_or("default"))?;
        let n = self.tokens.len();
        if !self.token_types.is_empty() && self.token_types.len() != n {
            return Err(TokenizerError::LengthMismatch {
                key: "tokenizer.ggml.token_type",
                expected: n,
                found: self.token_types.len(),
            });
        }
        let check = |key: &'static str, id: Option<u32>| -> Result<Option<u32>> {
            match id {
                Some(i) if usize::try_from(i).map_or(true, |i| i >= n) => {
                    Err(TokenizerError::IdOutOfRange {
                        key,
                        id: i.into(),
                        vocab_size: n,
                    })
                }
                other => Ok(other),
            }
        };
        let bos = check("tokenizer.ggml.bos_token_id", self.bos_token_id)?;
        let eos = check("tokenizer.ggml.eos_token_id", self.eos_token_id)?;
        let eot = check("tokenizer.ggml.eot_token_id", self.eot_token_id)?;
        let pad = check("tokenizer.ggml.padding_token_id", self.padding_token_id)?;

        let mut vocab = Vocab::default();
        vocab.reserve(n);
        for (i, t) in self.tokens.iter().enumerate() {
            let id = u32::try_from(i).map_err(|_| TokenizerError::IdOutOfRange {
                key: "tokenizer.ggml.tokens",
                id: i as u64,
                vocab_size: n,
            })?;
            if let Some(first) = vocab.insert(t.clone(), id) {
                return Err(TokenizerError::DuplicateToken {
                    text: t.clone(),
                    first,
                    second: id,
                });
            }
        }
        let merges = self
            .merges
            .iter()
            .enumerate()
            .map(|(index, rule)| split_merge(rule).ok_or_else(|| bad_merge(index, rule)))
            .collect::<Result<Vec<_>>>()?;

        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            // Bounded word cache: enough for chat-sized inputs, small next to the vocabulary.
            .cache_capacity(10_000)
            .build()
            .map_err(|e| TokenizerError::Hf(e.to_string()))?;
        let mut tok = Tokenizer::new(bpe);
        tok.with_pre_tokenizer(Some(kind.build()?));
        tok.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));

        // Control and user-defined tokens: matched in the raw text before pre-tokenization, as
        // llama.cpp does, so `<|im_start|>` is one token and never split by BPE. Unused slots
        // (type 5) are not matched, as in llama.cpp.
        let mut kinds = Vec::with_capacity(n);
        let mut specials = Vec::new();
        for (i, t) in self.tokens.iter().enumerate() {
            let kind = match self.type_of(i) {
                token_type::CONTROL => TokenKind::Control,
                token_type::USER_DEFINED => TokenKind::UserDefined,
                token_type::UNUSED => TokenKind::Unused,
                _ => TokenKind::Normal,
            };
            if matches!(kind, TokenKind::Control | TokenKind::UserDefined) && !t.is_empty() {
                // Both kinds are matched whole before splitting; only control tokens are
                // "special" (dropped by skip-special decoding), as in the models' tokenizer.json.
                let control = kind == TokenKind::Control;
                specials.push(AddedToken::from(t.clone(), control).normalized(false));
            }
            kinds.push(kind);
        }
        tok.add_special_tokens(&specials);

        let add_bos = self.add_bos_token.unwrap_or(false);
        let add_eos = self.add_eos_token.unwrap_or(false);
        let token_text = |id: Option<u32>| id.and_then(|i| self.tokens.get(i as usize)).cloned();
        if let Some(pp) = bos_post_processor(
            add_bos.then(|| bos.zip(token_text(bos))).flatten(),
            add_eos.then(|| eos.zip(token_text(eos))).flatten(),
        )? {
            tok.with_post_processor(Some(pp));
        }

        let mut eos_ids: Vec<u32> = [eos, eot].into_iter().flatten().collect();
        for (i, t) in self.tokens.iter().enumerate() {
            let Ok(id) = u32::try_from(i) else { break };
            if kinds.get(i) == Some(&TokenKind::Control)
                && END_OF_TURN_TEXTS.contains(&t.as_str())
                && !eos_ids.contains(&id)
            {
                eos_ids.push(id);
            }
        }

        // Unused slots decode to nothing, as llama.cpp's token_to_piece does.
        let pieces = Pieces::new(self.tokens.iter().zip(&kinds).map(|(t, k)| match k {
            TokenKind::Unused => ("", true),
            TokenKind::Control | TokenKind::UserDefined => (t.as_str(), true),
            _ => (t.as_str(), false),
        }));
        let chat_template = self
            .chat_template
            .as_deref()
            .map(ChatTemplate::new)
            .transpose()?;
        TextTokenizer::from_parts(
            tok,
            pieces,
            kinds,
            SpecialIds {
                bos,
                eos: eos_ids,
                pad,
                add_bos,
                add_eos,
            },
            chat_template,
        )
    }
}

impl TextTokenizer {
    /// Builds the tokenizer stored in a GGUF file (see [`GgufTokenizerData::build`]).
    ///
    /// # Errors
    /// Missing or malformed tokenizer metadata, or an unsupported tokenizer or pre-tokenizer.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        GgufTokenizerData::from_gguf(file)?.build()
    }

    /// Opens a GGUF file (metadata only) and builds its tokenizer.
    ///
    /// # Errors
    /// The file cannot be read as GGUF, or see [`TextTokenizer::from_gguf`].
    pub fn from_gguf_path(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let file = GgufFile::open(path.as_ref())?;
        Self::from_gguf(&file)
    }
}

/// Splits `"left right"` at the single space (byte-level tokens never contain a space).
fn split_merge(rule: &str) -> Option<(String, String)> {
    // Like llama.cpp, look for the separator after the first character, so a rule whose left
    // side is itself a space-like raw token still splits sensibly.
    let first_len = rule.chars().next()?.len_utf8();
    let pos = rule.get(first_len..)?.find(' ')? + first_len;
    let (a, b) = (&rule[..pos], &rule[pos + 1..]);
    (!a.is_empty() && !b.is_empty()).then(|| (a.to_owned(), b.to_owned()))
}

fn bad_merge(index: usize, rule: &str) -> TokenizerError {
    TokenizerError::BadMerge {
        index,
        rule: rule.to_owned(),
    }
}

fn wrong(key: &'static str, expected: &'static str, v: &Value) -> TokenizerError {
    TokenizerError::WrongType {
        key,
        expected,
        found: v.type_name().to_owned(),
    }
}

fn string<'a>(meta: &'a BTreeMap<String, Value>, key: &'static str) -> Result<Option<&'a str>> {
    meta.get(key)
        .map(|v| v.as_str().ok_or_else(|| wrong(key, "a string", v)))
        .transpose()
}

fn strings(meta: &BTreeMap<String, Value>, key: &'static str) -> Result<Option<Vec<String>>> {
    meta.get(key)
        .map(|v| {
            v.as_str_array()
                .map(|a| a.into_iter().map(str::to_owned).collect())
                .ok_or_else(|| wrong(key, "an array of strings", v))
        })
        .transpose()
}

fn id(meta: &BTreeMap<String, Value>, key: &'static str) -> Result<Option<u32>> {
    meta.get(key)
        .map(|v| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| wrong(key, "a token id (u32)", v))
        })
        .transpose()
}

fn boolean(meta: &BTreeMap<String, Value>, key: &'static str) -> Result<Option<bool>> {
    meta.get(key)
        .map(|v| v.as_bool().ok_or_else(|| wrong(key, "a bool", v)))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_split_at_the_separating_space() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ".to_owned(), "t".to_owned())));
        assert_eq!(
            split_merge("ĠĠ ĠĠĠ"),
            Some(("ĠĠ".to_owned(), "ĠĠĠ".to_owned()))
        );
        assert_eq!(split_merge("nospace"), None);
        assert_eq!(split_merge("a "), None);
        assert_eq!(split_merge(""), None);
    }
}
