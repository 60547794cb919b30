//! How weights are stored: [`WeightFormat`], its names and its bytes a weight.

use std::str::FromStr;

use crate::error::KernelError;

use super::BLOCK;

/// How weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    /// 4 bytes a weight, exact.
    #[default]
    F32,
    /// 2 bytes a weight; bf16 rounding (8 significant bits).
    Bf16,
    /// 1.125 bytes a weight: blocks of 32 int8 quants with one f32 scale (`max |w| / 127`).
    Q8_0,
    /// 0.75 bytes a weight: blocks of 32 unsigned 4-bit quants with an f32 scale and minimum,
    /// `w = scale · q + min`, for weights that are 4-bit already (a GGUF's Q4_0, Q4_1 or Q4_K
    /// blocks): each block's values must lie on 16 or fewer evenly spaced levels, which are
    /// kept exactly (to f32 rounding). Nothing is rounded to 4 bits: a matrix with any block
    /// off such a grid is stored as [`WeightFormat::Q8_0`] instead ([`PackedMatrix::format`]
    /// says which).
    ///
    /// [`PackedMatrix::format`]: crate::PackedMatrix::format
    Q4,
    /// [`WeightFormat::Q8_0`] weights multiplied by activations rounded to int8 too (each
    /// block of 32 inputs of a row of `x` to `max |x| / 127` steps), with integer
    /// multiply-adds, as llama.cpp computes: less work a weight than widening to f32, but the
    /// result is no longer the f32 product with the stored weights (`x` is rounded, to about
    /// 0.4% of its block's largest value). A different, faster model; never chosen by default.
    Q8_0A8,
    /// [`WeightFormat::Q4`] weights with activations rounded to int8 (as for
    /// [`WeightFormat::Q8_0A8`]; a matrix Q4 cannot hold exactly is stored as `Q8_0A8`). A
    /// GGUF's Q4_K and Q6_K matrices can also be kept as their superblocks in this format
    /// ([`PackedMatrix::pack_q4_superblocks`], [`PackedMatrix::pack_q6_superblocks`]), with
    /// activations rounded one step a superblock of 256 (llama.cpp's Q8_K).
    ///
    /// [`PackedMatrix::pack_q4_superblocks`]: crate::PackedMatrix::pack_q4_superblocks
    /// [`PackedMatrix::pack_q6_superblocks`]: crate::PackedMatrix::pack_q6_superblocks
    Q4A8,
    /// [`WeightFormat::Q4A8`] with every block that is not 4-bit already *rounded* to 16
    /// evenly spaced levels from its smallest to its largest weight (`scale = (max − min) /
    /// 15`, each weight to the nearest level), so no matrix falls back to Q8_0: 0.75 bytes a
    /// weight where a 5- or 8-bit checkpoint's blocks took 1.125. Lossy — a weight moves by up
    /// to half a step — and never chosen by default: meant for a draft model, whose weights
    /// decide how many of its tokens the target accepts, never which tokens are produced.
    /// Blocks already on such a grid and superblocks kept as they are stay exact.
    Q4A8Lossy,
}

impl WeightFormat {
    /// Every format, in declaration order.
    pub const ALL: [Self; 7] = [
        Self::F32,
        Self::Bf16,
        Self::Q8_0,
        Self::Q4,
        Self::Q8_0A8,
        Self::Q4A8,
        Self::Q4A8Lossy,
    ];

    /// Bytes stored per weight, scales included.
    pub fn bytes_per_weight(self) -> f64 {
        match self {
            Self::F32 => 4.0,
            Self::Bf16 => 2.0,
            Self::Q8_0 | Self::Q8_0A8 => 1.0 + 4.0 / BLOCK as f64,
            Self::Q4 | Self::Q4A8 | Self::Q4A8Lossy => 0.5 + 8.0 / BLOCK as f64,
        }
    }

    /// Whether products round the activations to int8 ([`WeightFormat::Q8_0A8`],
    /// [`WeightFormat::Q4A8`], [`WeightFormat::Q4A8Lossy`]).
    pub fn rounds_activations(self) -> bool {
        matches!(self, Self::Q8_0A8 | Self::Q4A8 | Self::Q4A8Lossy)
    }

    /// Whether [`PackedMatrix::pack_q4_superblocks`] and [`PackedMatrix::pack_q6_superblocks`]
    /// keep a GGUF's Q4_K and Q6_K superblocks as they are in this format.
    ///
    /// [`PackedMatrix::pack_q4_superblocks`]: crate::PackedMatrix::pack_q4_superblocks
    /// [`PackedMatrix::pack_q6_superblocks`]: crate::PackedMatrix::pack_q6_superblocks
    pub fn keeps_superblocks(self) -> bool {
        matches!(self, Self::Q4A8 | Self::Q4A8Lossy)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Q8_0 => "q8_0",
            Self::Q4 => "q4",
            Self::Q8_0A8 => "q8_0-a8",
            Self::Q4A8 => "q4-a8",
            Self::Q4A8Lossy => "q4-a8-lossy",
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightFormat {
    type Err = KernelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            "q8_0" | "q8" => Ok(Self::Q8_0),
            "q4" => Ok(Self::Q4),
            "q8_0-a8" | "q8-a8" => Ok(Self::Q8_0A8),
            "q4-a8" => Ok(Self::Q4A8),
            "q4-a8-lossy" => Ok(Self::Q4A8Lossy),
            _ => Err(KernelError::UnknownFormat(s.to_owned())),
        }
    }
}
