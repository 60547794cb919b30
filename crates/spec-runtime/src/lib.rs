//! The model runtime every method shares: Llama and Qwen2 decoders on burn, a KV cache that rolls
//! back and keeps tree paths, and loading of GGUF and Hugging Face safetensors checkpoints.
//!
//! [`Transformer::forward`] is the one entry point: new tokens (or a hidden state) with their
//! positions and how they attend to each other; it returns logits for the rows asked for and
//! optionally hidden states of chosen layers, and can run a range of layers only.

pub mod cache;
pub mod config;
pub mod error;
pub mod generate;
mod host;
pub mod load;
pub mod model;
mod pack;
pub mod weights;

pub use cache::KvCache;
pub use config::{Architecture, HfConfig, ModelConfig};
pub use error::{Result, RuntimeError};
pub use generate::{GenerateOptions, Generation, GenerationStats, StopReason, generate_plain};
pub use load::{LoadedModel, load_model, load_model_with};
pub use model::{ForwardOutput, ForwardRequest, Input, LogitRows, NewTokens, Transformer};
pub use weights::{
    GgufSource, HostTensor, RandomSource, SafetensorsSource, Superblocks, WeightSource,
};
