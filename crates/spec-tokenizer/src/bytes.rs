//! The byte-level alphabet of GPT-2 style BPE, and the byte string each token stands for.
//!
//! Byte-level vocabularies store every byte as a printable character: the bytes that already are
//! printable (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for themselves, the other 68 are moved to
//! U+0100 onwards in byte order (so a space is `Ġ`, U+0120, and a newline `Ċ`, U+010A).

use std::collections::HashMap;

/// True for the bytes that the alphabet keeps as the character of the same number.
fn is_kept(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The character that stands for each byte.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[usize::from(b)] = if is_kept(b) {
            char::from(b)
        } else {
            // 256..=323: all valid scalar values, so the fallback never happens.
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
    }
    table
}

/// The inverse of [`byte_to_char_table`].
pub(crate) fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .filter_map(|(b, &c)| u8::try_from(b).ok().map(|b| (c, b)))
        .collect()
}

/// The bytes of every token, stored flat: the piece of token `i` is
/// `bytes[offsets[i]..offsets[i + 1]]`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pieces {
    bytes: Vec<u8>,
    offsets: Vec<usize>,
}

impl Pieces {
    /// Builds the table from each token's text and whether that text is raw (special and
    /// user-defined tokens are stored as they appear in text) or byte-level encoded.
    pub(crate) fn new<'a>(tokens: impl IntoIterator<Item = (&'a str, bool)>) -> Self {
        let map = char_to_byte_map();
        let mut bytes = Vec::new();
        let mut offsets = vec![0];
        for (text, raw) in tokens {
            push_piece(&mut bytes, &map, text, raw);
            offsets.push(bytes.len());
        }
        Self { bytes, offsets }
    }

    /// The number of tokens.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The bytes of token `id`, if it exists.
    pub(crate) fn get(&self, id: u32) -> Option<&[u8]> {
        let i = usize::try_from(id).ok()?;
        let start = *self.offsets.get(i)?;
        let end = *self.offsets.get(i + 1)?;
        self.bytes.get(start..end)
    }
}

fn push_piece(out: &mut Vec<u8>, map: &HashMap<char, u8>, text: &str, raw: bool) {
    if !raw {
        let start = out.len();
        let mut all_mapped = true;
        for c in text.chars() {
            match map.get(&c) {
                Some(&b) => out.push(b),
                None => {
                    all_mapped = false;
                    break;
                }
            }
        }
        if all_mapped {
            return;
        }
        // A token outside the byte alphabet (malformed vocabulary): keep its text as it is,
        // which is also what the reference decoders do.
        out.truncate(start);
    }
    out.extend_from_slice(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection_with_the_known_anchors() {
        let table = byte_to_char_table();
        let map = char_to_byte_map();
        assert_eq!(map.len(), 256, "256 distinct characters");
        for (b, &c) in table.iter().enumerate() {
            assert_eq!(usize::from(map[&c]), b);
        }
        assert_eq!(table[usize::from(b' ')], 'Ġ');
        assert_eq!(table[usize::from(b'\n')], 'Ċ');
        assert_eq!(table[usize::from(b'\t')], 'ĉ');
        assert_eq!(table[0], 'Ā');
        assert_eq!(table[0xAD], 'Ń');
        assert_eq!(table[usize::from(b'a')], 'a');
        assert_eq!(table[0xFF], 'ÿ');
    }

    #[test]
    fn pieces_decode_byte_level_and_keep_raw_text() {
        let p = Pieces::new([
            ("Ġhello", false),
            ("<|im_end|>", true),
            ("Ċ", false),
            ("ä½ł", false),
        ]);
        assert_eq!(p.len(), 4);
        assert_eq!(p.get(0), Some(&b" hello"[..]));
        assert_eq!(p.get(1), Some(&b"<|im_end|>"[..]));
        assert_eq!(p.get(2), Some(&b"\n"[..]));
        assert_eq!(p.get(3), Some("你".as_bytes()));
        assert_eq!(p.get(4), None);
    }
}
