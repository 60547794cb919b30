//! Text tokenizers for the reference models, built from what a GGUF file stores (or from a
//! Hugging Face `tokenizer.json`), plus streaming detokenization and chat templates.
//!
//! # From GGUF
//! GGUF keeps a tokenizer as metadata: `tokenizer.ggml.model` (`gpt2` = byte-level BPE), the
//! vocabulary (`.tokens`, `.token_type`), the BPE `.merges`, the special ids, and
//! `tokenizer.ggml.pre`, llama.cpp's name for how text is split into words before BPE. We build a
//! real [`tokenizers::Tokenizer`] from it:
//! - model: BPE over the vocabulary and merges, no unknown token, no byte fallback (every byte is
//!   in a byte-level vocabulary);
//! - pre-tokenizer: the regex list llama.cpp uses for that `pre` value
//!   ([`PreTokenizerKind`]: `smollm` = each digit alone, then GPT-2's word regex; `qwen2` = Qwen2's
//!   word regex), then the byte-level mapping. Unknown values are an error naming the value;
//! - control (type 3) and user-defined (type 4) tokens as special added tokens, matched in the
//!   raw text before splitting, so `<|im_start|>` is always one token;
//! - a post-processor adding BOS/EOS only when `add_bos_token` / `add_eos_token` say so;
//! - a byte-level decoder; for exact decoding and streaming we also keep the byte string of every
//!   token ([`TextTokenizer::token_bytes`]).
//!
//! The result is checked token for token against llama.cpp's own tokenizer on both reference
//! models (`tests/upstream.rs`).
//!
//! # Using it
//! ```no_run
//! # fn main() -> Result<(), spec_tokenizer::TokenizerError> {
//! use spec_tokenizer::{Message, TextTokenizer};
//! let tok = TextTokenizer::from_gguf_path("qwen2.5-coder-0.5b.gguf")?;
//! let prompt = tok.apply_chat_template(&[Message::user("Hi!")], true)?;
//! let ids = tok.encode(&prompt, true)?;
//! let mut stream = tok.stream();
//! for &id in &ids {
//!     if tok.is_eos(id) { break; }
//!     print!("{}", stream.push(id)?);
//! }
//! print!("{}", stream.finish());
//! # Ok(()) }
//! ```

mod bytes;
mod chat;
mod error;
mod gguf;
mod json;
mod pretokenize;
mod stream;
mod text;

pub use chat::{ChatTemplate, Message};
pub use error::{Result, TokenizerError};
pub use gguf::{GgufTokenizerData, token_type};
pub use pretokenize::PreTokenizerKind;
pub use stream::StreamDecoder;
pub use text::{TextTokenizer, TokenKind};
