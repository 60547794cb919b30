//! Incremental detokenization for streaming generated text.
//!
//! A byte-level token can end in the middle of a UTF-8 character (CJK and emoji often take two or
//! three tokens), so the decoder keeps the bytes of an unfinished character until the tokens that
//! complete it arrive. Concatenating everything [`StreamDecoder::push`] and
//! [`StreamDecoder::finish`] return gives exactly [`TextTokenizer::decode`] of all pushed ids.

use crate::error::Result;
use crate::text::{TextTokenizer, TokenKind};

/// Turns generated token ids into text as soon as the text is complete UTF-8.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tok: &'a TextTokenizer,
    pending: Vec<u8>,
    skip_special: bool,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tok: &'a TextTokenizer, skip_special: bool) -> Self {
        Self {
            tok,
            pending: Vec::new(),
            skip_special,
        }
    }

    /// Adds one token and returns the text that became complete (often empty while a multi-byte
    /// character is still being assembled). Bytes that can never become valid UTF-8 are returned
    /// as U+FFFD, as [`TextTokenizer::decode`] does.
    ///
    /// # Errors
    /// [`crate::TokenizerError::UnknownId`] for an id outside the vocabulary; the decoder is left
    /// unchanged.
    pub fn push(&mut self, id: u32) -> Result<String> {
        let piece = self.tok.token_bytes_checked(id)?;
        if self.skip_special && self.tok.token_kind(id) == Some(TokenKind::Control) {
            return Ok(String::new());
        }
        self.pending.extend_from_slice(piece);
        Ok(self.take_complete())
    }

    /// Adds several tokens; returns the text that became complete.
    ///
    /// # Errors
    /// As [`StreamDecoder::push`]; tokens before the bad id are kept.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.push(id)?);
        }
        Ok(out)
    }

    /// The number of bytes held back, waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: returns the held-back bytes (as U+FFFD, since they are an incomplete
    /// character) and empties the decoder.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Removes and returns the longest complete prefix of `pending`.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // An unfinished character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Bytes that no continuation can repair.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }
}
