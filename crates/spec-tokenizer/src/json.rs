//! Tokenizers from a Hugging Face `tokenizer.json` (and its `tokenizer_config.json` /
//! `generation_config.json`, when they sit beside it).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use tokenizers::Tokenizer;
use tokenizers::decoders::DecoderWrapper;

use crate::bytes::Pieces;
use crate::chat::ChatTemplate;
use crate::error::{Result, TokenizerError};
use crate::text::{END_OF_TURN_TEXTS, SpecialIds, TextTokenizer, TokenKind};

impl TextTokenizer {
    /// Loads a `tokenizer.json`. Encoding uses it as it is (its normalizer, pre-tokenizer and
    /// post-processor). If `tokenizer_config.json` lies beside it, its `chat_template`,
    /// `bos_token`, `eos_token` and `add_bos_token` are used; if `generation_config.json` does,
    /// its `eos_token_id`s are added to the end-of-generation ids.
    ///
    /// # Errors
    /// The files cannot be read or parsed, or the tokenizer does not decode byte-level (the only
    /// kind whose token bytes this crate derives).
    pub fn from_tokenizer_json(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_owned(),
            source,
        })?;
        let inner = Tokenizer::from_bytes(&bytes)?;
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        let config = read_json_if_present(&dir.join("tokenizer_config.json"))?;
        let generation = read_json_if_present(&dir.join("generation_config.json"))?;
        from_hf(inner, config.as_ref(), generation.as_ref())
    }
}

fn read_json_if_present(path: &Path) -> Result<Option<Json>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizerError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| TokenizerError::Json {
            path: PathBuf::from(path),
            source,
        })
}

/// A token given in tokenizer_config.json either as its text or as `{"content": text, …}`.
fn token_text(v: Option<&Json>) -> Option<&str> {
    match v? {
        Json::String(s) => Some(s),
        Json::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which `default` is the chat one.
fn chat_template_source(config: &Json) -> Option<&str> {
    match config.get("chat_template")? {
        Json::String(s) => Some(s),
        Json::Array(list) => {
            fn template(item: &Json) -> Option<&str> {
                item.get("template").and_then(Json::as_str)
            }
            list.iter()
                .find(|item| item.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(template)
                .or_else(|| list.first().and_then(template))
        }
        _ => None,
    }
}

pub(crate) fn from_hf(
    inner: Tokenizer,
    config: Option<&Json>,
    generation: Option<&Json>,
) -> Result<TextTokenizer> {
    match inner.get_decoder() {
        Some(DecoderWrapper::ByteLevel(_)) => {}
        other => {
            return Err(TokenizerError::UnsupportedDecoder {
                found: other.map_or_else(|| "none".to_owned(), |d| format!("{d:?}")),
            });
        }
    }
    let added = inner.get_added_tokens_decoder();
    // Ids may have holes (and added tokens may repeat model entries), so size by the largest id.
    let n = inner
        .get_vocab(true)
        .values()
        .max()
        .map_or(0, |&max| max as usize + 1);
    let mut kinds = Vec::with_capacity(n);
    let mut texts = Vec::with_capacity(n);
    for i in 0..n {
        let id = u32::try_from(i).unwrap_or(u32::MAX);
        if let Some(tok) = added.get(&id) {
            kinds.push(if tok.special {
                TokenKind::Control
            } else {
                TokenKind::UserDefined
            });
            texts.push((tok.content.clone(), true));
        } else if let Some(t) = inner.id_to_token(id) {
            kinds.push(TokenKind::Normal);
            texts.push((t, false));
        } else {
            // A hole in the id space: no text, never produced.
            kinds.push(TokenKind::Unused);
            texts.push((String::new(), true));
        }
    }
    let pieces = Pieces::new(texts.iter().map(|(t, raw)| (t.as_str(), *raw)));

    let id_of = |text: &str| inner.token_to_id(text);
    let bos = config
        .and_then(|c| token_text(c.get("bos_token")))
        .and_then(id_of);
    let mut eos: Vec<u32> = config
        .and_then(|c| token_text(c.get("eos_token")))
        .and_then(id_of)
        .into_iter()
        .collect();
    if let Some(ids) = generation.and_then(|g| g.get("eos_token_id")) {
        let list: Vec<u64> = match ids {
            Json::Array(a) => a.iter().filter_map(Json::as_u64).collect(),
            other => other.as_u64().into_iter().collect(),
        };
        for id in list.into_iter().filter_map(|x| u32::try_from(x).ok()) {
            if (id as usize) < n && !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    for (i, kind) in kinds.iter().enumerate() {
        let id = u32::try_from(i).unwrap_or(u32::MAX);
        if *kind == TokenKind::Control
            && texts
                .get(i)
                .is_some_and(|(t, _)| END_OF_TURN_TEXTS.contains(&t.as_str()))
            && !eos.contains(&id)
        {
            eos.push(id);
        }
    }
    let pad = config
        .and_then(|c| token_text(c.get("pad_token")))
        .and_then(id_of);
    let flag = |key: &str| config.and_then(|c| c.get(key)).and_then(Json::as_bool);
    let chat_template = config
        .and_then(chat_template_source)
        .map(ChatTemplate::new)
        .transpose()?;
    TextTokenizer::from_parts(
        inner,
        pieces,
        kinds,
        SpecialIds {
            bos,
            eos,
            pad,
            add_bos: flag("add_bos_token").unwrap_or(false),
            add_eos: flag("add_eos_token").unwrap_or(false),
        },
        chat_template,
    )
}
