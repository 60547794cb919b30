//! Which target a trained artefact belongs to: heads, checkpoints and cached answers carry the
//! target's identity and are refused for another model.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Bytes hashed at each end of a model file.
const END_BYTES: u64 = 4 << 20;

/// A target model's shape and a fingerprint of its file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetIdentity {
    pub hidden_size: usize,
    pub vocab_size: usize,
    /// sha256 of the file's length, its first and its last 4 MiB (a directory: of each
    /// `*.safetensors` and `config.json` in name order, the same way). Hashing a 3 GB file whole
    /// takes seconds at every load; the ends hold the header (names, shapes, metadata) and the
    /// first and last tensors' bytes, which differ between any two checkpoints.
    pub fingerprint: String,
}

impl TargetIdentity {
    /// The identity of the model at `path` (a GGUF file or a Hugging Face directory) with the
    /// given shape.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn of(path: &Path, hidden_size: usize, vocab_size: usize) -> std::io::Result<Self> {
        Ok(Self {
            hidden_size,
            vocab_size,
            fingerprint: fingerprint(path)?,
        })
    }

    /// Why `self` (what an artefact was made for) is not `target`, if it is not.
    pub fn mismatch(&self, target: &TargetIdentity) -> Option<String> {
        if self.hidden_size != target.hidden_size {
            return Some(format!(
                "hidden size {} against the target's {}",
                self.hidden_size, target.hidden_size
            ));
        }
        if self.vocab_size != target.vocab_size {
            return Some(format!(
                "vocabulary of {} against the target's {}",
                self.vocab_size, target.vocab_size
            ));
        }
        if self.fingerprint != target.fingerprint {
            return Some(format!(
                "fingerprint {} against the target's {}",
                short(&self.fingerprint),
                short(&target.fingerprint)
            ));
        }
        None
    }
}

fn short(hex: &str) -> &str {
    &hex[..hex.len().min(12)]
}

/// [`TargetIdentity::fingerprint`] of `path`.
pub fn fingerprint(path: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|x| x == "safetensors")
                    || p.file_name().is_some_and(|n| n == "config.json")
            })
            .collect();
        files.sort();
        for file in files {
            hash_ends(&file, &mut hasher)?;
        }
    } else {
        hash_ends(path, &mut hasher)?;
    }
    Ok(format!("{:x}", hasher.finalize()))
}

fn hash_ends(path: &Path, hasher: &mut Sha256) -> std::io::Result<()> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    hasher.update(len.to_le_bytes());
    let mut buf = Vec::new();
    (&mut file).take(END_BYTES).read_to_end(&mut buf)?;
    hasher.update(&buf);
    if len > END_BYTES {
        let start = (len - END_BYTES).max(END_BYTES);
        file.seek(SeekFrom::Start(start))?;
        buf.clear();
        file.take(END_BYTES).read_to_end(&mut buf)?;
        hasher.update(&buf);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn fingerprints_tell_files_apart_and_mismatches_name_the_difference() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.gguf");
        let b = dir.path().join("b.gguf");
        let mut bytes = vec![7u8; (3 * END_BYTES) as usize];
        std::fs::write(&a, &bytes).unwrap();
        // A change near the end of a file longer than the hashed ends.
        let last = bytes.len() - 10;
        bytes[last] = 8;
        std::fs::write(&b, &bytes).unwrap();
        let ia = TargetIdentity::of(&a, 4, 10).unwrap();
        let ib = TargetIdentity::of(&b, 4, 10).unwrap();
        assert_eq!(ia, TargetIdentity::of(&a, 4, 10).unwrap());
        assert!(ia.mismatch(&ib).unwrap().starts_with("fingerprint"));
        let other_vocab = TargetIdentity {
            vocab_size: 11,
            ..ia.clone()
        };
        assert_eq!(
            other_vocab.mismatch(&ia).unwrap(),
            "vocabulary of 11 against the target's 10"
        );
        assert!(ia.mismatch(&ia).is_none());
    }
}
