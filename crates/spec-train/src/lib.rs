//! Training machinery shared by the trained drafting methods: Medusa heads (`spec-medusa`),
//! early-exit heads and distilled drafts.
//!
//! - [`data`]: training text from packages (ShareGPT conversations, HumanEval problems), answered
//!   by the target itself and cached on disk with the target's last-layer hidden states.
//! - [`identity`]: which target a trained artefact belongs to.

pub mod data;
pub mod identity;
