//! [`TextTokenizer`]: encode, decode, stream, special ids and the chat template of one model.

use tokenizers::Tokenizer;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::processors::template::{SpecialToken, Template, TemplateProcessing};

use crate::bytes::Pieces;
use crate::chat::{ChatTemplate, Message};
use crate::error::{Result, TokenizerError};
use crate::stream::StreamDecoder;

/// Control tokens that end a turn: whichever of these a vocabulary has (as a control token) stop
/// generation, besides `tokenizer.ggml.eos_token_id` and `eot_token_id`. llama.cpp keeps a similar
/// list, because GGUF stores only one end-of-sequence id while chat models end turns with another.
pub(crate) const END_OF_TURN_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<EOT>",
];

/// What kind of entry a token id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenKind {
    /// An ordinary BPE token.
    Normal,
    /// A control token such as `<|im_start|>` or `<|endoftext|>` (special: skipped by
    /// [`TextTokenizer::decode_skip_special`]).
    Control,
    /// A user-defined added token such as Qwen's `<tool_call>`: matched whole like a control
    /// token, but ordinary text when decoding.
    UserDefined,
    /// An unused slot (vocabulary padding); never produced by encoding.
    Unused,
}

/// The special ids of a tokenizer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SpecialIds {
    pub(crate) bos: Option<u32>,
    /// Every id that ends generation, the declared EOS first.
    pub(crate) eos: Vec<u32>,
    pub(crate) pad: Option<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
}

/// A model's tokenizer: a `tokenizers::Tokenizer` for encoding, the byte string of every token for
/// exact decoding and streaming, the special ids, and the chat template.
///
/// Build it with [`TextTokenizer::from_gguf`], [`TextTokenizer::from_gguf_path`],
/// [`crate::GgufTokenizerData::build`] or [`TextTokenizer::from_tokenizer_json`].
#[derive(Debug, Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    pieces: Pieces,
    kinds: Vec<TokenKind>,
    special: SpecialIds,
    chat_template: Option<ChatTemplate>,
}

impl TextTokenizer {
    pub(crate) fn from_parts(
        inner: Tokenizer,
        pieces: Pieces,
        kinds: Vec<TokenKind>,
        special: SpecialIds,
        chat_template: Option<ChatTemplate>,
    ) -> Result<Self> {
        if kinds.len() != pieces.len() {
            return Err(TokenizerError::LengthMismatch {
                key: "token kinds",
                expected: pieces.len(),
                found: kinds.len(),
            });
        }
        Ok(Self {
            inner,
            pieces,
            kinds,
            special,
            chat_template,
        })
    }

    /// Token ids of `text`. Control and user-defined tokens written in the text (for example
    /// `<|im_start|>` in a rendered chat prompt) become their single ids. With `add_special`, the
    /// BOS (and EOS) the model asks for (`add_bos_token`) are added; neither reference model asks
    /// for any.
    ///
    /// # Errors
    /// Only if the underlying tokenizer fails, which does not happen for valid UTF-8 input.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode_fast(text, add_special)?
            .get_ids()
            .to_vec())
    }

    /// The text of `ids`, control tokens included (so `decode(encode(s)) == s`). Byte sequences
    /// that are not valid UTF-8 become U+FFFD.
    ///
    /// # Errors
    /// [`TokenizerError::UnknownId`] for an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_impl(ids, false)
    }

    /// Like [`TextTokenizer::decode`] but without control tokens (`<|im_end|>` …); user-defined
    /// tokens are kept, since they are part of the text.
    ///
    /// # Errors
    /// [`TokenizerError::UnknownId`] for an id outside the vocabulary.
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<String> {
        self.decode_impl(ids, true)
    }

    fn decode_impl(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if skip_special && self.token_kind(id) == Some(TokenKind::Control) {
                continue;
            }
            bytes.extend_from_slice(self.token_bytes_checked(id)?);
        }
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// A decoder for generated tokens that returns text only once its UTF-8 is complete.
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, false)
    }

    /// Like [`TextTokenizer::stream`], leaving control tokens out of the text.
    pub fn stream_skip_special(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, true)
    }

    /// The bytes token `id` stands for (a token may hold part of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id)
    }

    pub(crate) fn token_bytes_checked(&self, id: u32) -> Result<&[u8]> {
        self.pieces.get(id).ok_or(TokenizerError::UnknownId {
            id,
            vocab_size: self.vocab_size(),
        })
    }

    /// The text of token `id` alone (lossy where the token holds part of a character).
    pub fn token_to_piece(&self, id: u32) -> Option<String> {
        self.pieces
            .get(id)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// The vocabulary entry of `id` as stored (byte-level form, e.g. `Ġthe`; control tokens as
    /// written). Two models share a vocabulary when these agree id by id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary entry given in its stored form (see [`TextTokenizer::id_to_token`]).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// What kind of token `id` is.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(usize::try_from(id).ok()?).copied()
    }

    /// The number of token ids (including control and unused slots): ids are `0..vocab_size`.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The first id at which `self` and `other` stand for different bytes, or `None` when the two
    /// vocabularies are interchangeable for speculative decoding: every common id means the same
    /// bytes, and any ids beyond the shorter vocabulary are unused padding.
    pub fn first_vocab_difference(&self, other: &Self) -> Option<u32> {
        let common = self.vocab_size().min(other.vocab_size());
        let id_of = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
        for i in 0..common {
            let id = id_of(i);
            if self.token_bytes(id) != other.token_bytes(id) {
                return Some(id);
            }
        }
        let longer = if self.vocab_size() > common {
            self
        } else {
            other
        };
        (common..longer.vocab_size())
            .map(id_of)
            .find(|&id| longer.token_kind(id) != Some(TokenKind::Unused))
    }

    /// The beginning-of-sequence id, if the model declares one.
    pub fn bos_id(&self) -> Option<u32> {
        self.special.bos
    }

    /// Whether [`TextTokenizer::encode`] with `add_special` prepends the BOS.
    pub fn adds_bos(&self) -> bool {
        self.special.add_bos && self.special.bos.is_some()
    }

    /// Every id that ends generation: the declared EOS first, then end-of-turn control tokens such
    /// as `<|im_end|>` and `<|endoftext|>`.
    pub fn eos_ids(&self) -> &[u32] {
        &self.special.eos
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.special.eos.contains(&id)
    }

    /// The padding id, if declared.
    pub fn pad_id(&self) -> Option<u32> {
        self.special.pad
    }

    /// The model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Replaces the chat template (for models without one, or to try another).
    pub fn set_chat_template(&mut self, template: Option<ChatTemplate>) {
        self.chat_template = template;
    }

    /// Renders `messages` with the model's chat template; with `add_generation_prompt` the
    /// prompt ends with the header of the assistant's turn. `bos_token` / `eos_token` in the
    /// template are the texts of the declared BOS / EOS ids.
    ///
    /// # Errors
    /// [`TokenizerError::NoChatTemplate`], or the template's own rendering error.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self
            .chat_template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        let text_of = |id: Option<u32>| id.and_then(|i| self.token_to_piece(i)).unwrap_or_default();
        template.render(
            messages,
            add_generation_prompt,
            &text_of(self.special.bos),
            &text_of(self.special.eos.first().copied()),
        )
    }

    /// The underlying `tokenizers::Tokenizer` (encoding gives the same ids as
    /// [`TextTokenizer::encode`]).
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }
}

/// A post-processor adding `bos` before and `eos` after a sequence (`None` if neither).
pub(crate) fn bos_post_processor(
    bos: Option<(u32, String)>,
    eos: Option<(u32, String)>,
) -> Result<Option<PostProcessorWrapper>> {
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    // The template refers to the tokens by these names, not by their texts, so any text works.
    let mut single = Vec::new();
    let mut specials = Vec::new();
    if let Some((id, text)) = bos {
        single.push("BOS");
        specials.push(SpecialToken::new("BOS".into(), vec![id], vec![text])?);
    }
    single.push("$A");
    if let Some((id, text)) = eos {
        single.push("EOS");
        specials.push(SpecialToken::new("EOS".into(), vec![id], vec![text])?);
    }
    let mut pair = single.clone();
    pair.extend(single.iter().map(|p| if *p == "$A" { "$B:1" } else { *p }));
    let single = Template::try_from(single.join(" ")).map_err(TokenizerError::Hf)?;
    let pair = Template::try_from(pair.join(" ")).map_err(TokenizerError::Hf)?;
    let pp = TemplateProcessing::builder()
        .single(single)
        .pair(pair)
        .special_tokens(specials)
        .build()
        .map_err(|e| TokenizerError::Hf(e.to_string()))?;
    Ok(Some(pp.into()))
}
