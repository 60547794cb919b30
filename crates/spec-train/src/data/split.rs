//! The held-out split: decided by a hash of each prompt's text, so it needs no seed, does not
//! depend on which other prompts are loaded, and stays put across runs and limits.

use super::prompts::{Prompt, text_hash};
use super::{DataError, Result};

/// Prompts to train on and prompts kept apart for measuring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptSplit {
    pub train: Vec<Prompt>,
    pub held_out: Vec<Prompt>,
}

/// Where a text's hash falls in `[0, 1)`.
fn unit_hash(text: &str) -> f64 {
    let hash = text_hash("spec-train held-out", text.trim());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash[..8]);
    // The top 53 bits: exactly representable.
    (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether the hash rule alone puts `text` in the held-out part at `fraction`.
pub fn is_held_out(text: &str, fraction: f64) -> bool {
    unit_hash(text) < fraction
}

/// Splits `prompts` (their order kept within each part): a prompt is held out when the hash of
/// its text falls below `fraction` ([`is_held_out`]). With a positive fraction and at least two
/// prompts, each part gets at least one: where the rule leaves a part empty, the prompt whose
/// hash is nearest the boundary moves over.
///
/// # Errors
/// A fraction outside `[0, 1)`.
pub fn split_held_out(prompts: Vec<Prompt>, fraction: f64) -> Result<PromptSplit> {
    if !(0.0..1.0).contains(&fraction) {
        return Err(DataError::Settings(format!(
            "the held-out fraction must be in [0, 1), not {fraction}"
        )));
    }
    let n = prompts.len();
    let hashes: Vec<f64> = prompts.iter().map(|p| unit_hash(&p.text)).collect();
    let mut held: Vec<bool> = hashes.iter().map(|&h| h < fraction).collect();
    let held_count = held.iter().filter(|&&h| h).count();
    if fraction > 0.0 && n >= 2 {
        let nearest = |want_held: bool, pick_min: bool| {
            (0..n).filter(|&i| held[i] == want_held).min_by(|&a, &b| {
                let order = hashes[a].total_cmp(&hashes[b]);
                if pick_min { order } else { order.reverse() }
            })
        };
        if held_count == 0 {
            if let Some(i) = nearest(false, true) {
                held[i] = true;
            }
        } else if held_count == n
            && let Some(i) = nearest(true, false)
        {
            held[i] = false;
        }
    }
    let mut split = PromptSplit::default();
    for (prompt, held) in prompts.into_iter().zip(held) {
        if held {
            split.held_out.push(prompt);
        } else {
            split.train.push(prompt);
        }
    }
    Ok(split)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn prompts(n: usize) -> Vec<Prompt> {
        (0..n)
            .map(|i| Prompt {
                id: format!("p:{i}"),
                text: format!("prompt number {i}"),
                reply: None,
            })
            .collect()
    }

    #[test]
    fn the_split_is_deterministic_disjoint_and_complete() {
        let all = prompts(2000);
        let a = split_held_out(all.clone(), 0.05).unwrap();
        let b = split_held_out(all.clone(), 0.05).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.train.len() + a.held_out.len(), all.len());
        for p in &a.held_out {
            assert!(!a.train.contains(p));
            assert!(is_held_out(&p.text, 0.05));
        }
        // About the fraction asked for.
        let share = a.held_out.len() as f64 / all.len() as f64;
        assert!((0.03..0.07).contains(&share), "{share}");
        // A prompt's side does not depend on the others loaded with it.
        let fewer = split_held_out(all[..500].to_vec(), 0.05).unwrap();
        assert!(fewer.held_out.iter().all(|p| a.held_out.contains(p)));
        assert!(fewer.train.iter().all(|p| a.train.contains(p)));
    }

    #[test]
    fn each_part_gets_at_least_one_prompt() {
        for n in 2..12 {
            let tiny = split_held_out(prompts(n), 1e-9).unwrap();
            assert_eq!(tiny.held_out.len(), 1, "n {n}");
            let most = split_held_out(prompts(n), 0.999_999).unwrap();
            assert!(!most.train.is_empty(), "n {n}");
        }
        let one = split_held_out(prompts(1), 0.5).unwrap();
        assert_eq!(one.train.len() + one.held_out.len(), 1);
        let none = split_held_out(prompts(5), 0.0).unwrap();
        assert!(none.held_out.is_empty());
        assert!(split_held_out(prompts(5), 1.0).is_err());
        assert!(split_held_out(prompts(5), f64::NAN).is_err());
    }
}
