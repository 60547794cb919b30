//! Exact acceptance math for speculative decoding.
pub mod error;
pub mod length;
pub mod metrics;
pub mod reference;
pub mod rng;
pub mod sampling;
pub mod step;
pub mod tree;
mod truncate;
pub mod verify;
