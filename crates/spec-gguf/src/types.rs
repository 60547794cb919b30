//! ggml tensor element types: ids, block sizes and bytes per block.

use std::fmt;

/// A ggml tensor type, as stored in the GGUF tensor table.
///
/// Quantized types store elements in blocks of [`GgmlType::block_size`] elements taking
/// [`GgmlType::type_size`] bytes each; plain types have a block size of 1. The discriminants are
/// ggml's type ids (ids 4, 5, 31–33 and 36–38 belonged to types ggml has since removed).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
}

/// Elements per super-block of the k-quants.
pub(crate) const QK_K: usize = 256;

impl GgmlType {
    /// Every type this crate knows, in id order.
    pub const ALL: [GgmlType; 34] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ2_S,
        Self::IQ4_XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
        Self::NVFP4,
        Self::Q1_0,
    ];

    /// The type with ggml id `id`, or `None` for an id this crate does not know.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// ggml's numeric id of this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name of this type (`"Q4_K"`, `"F16"`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::Q8_K => "Q8_K",
            Self::IQ2_XXS => "IQ2_XXS",
            Self::IQ2_XS => "IQ2_XS",
            Self::IQ3_XXS => "IQ3_XXS",
            Self::IQ1_S => "IQ1_S",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ3_S => "IQ3_S",
            Self::IQ2_S => "IQ2_S",
            Self::IQ4_XS => "IQ4_XS",
            Self::I8 => "I8",
            Self::I16 => "I16",
            Self::I32 => "I32",
            Self::I64 => "I64",
            Self::F64 => "F64",
            Self::IQ1_M => "IQ1_M",
            Self::BF16 => "BF16",
            Self::TQ1_0 => "TQ1_0",
            Self::TQ2_0 => "TQ2_0",
            Self::MXFP4 => "MXFP4",
            Self::NVFP4 => "NVFP4",
            Self::Q1_0 => "Q1_0",
        }
    }

    /// Elements per block (1 for plain types such as F32).
    pub fn block_size(self) -> usize {
        match self {
            Self::F32
            | Self::F16
            | Self::BF16
            | Self::F64
            | Self::I8
            | Self::I16
            | Self::I32
            | Self::I64 => 1,
            Self::Q4_0
            | Self::Q4_1
            | Self::Q5_0
            | Self::Q5_1
            | Self::Q8_0
            | Self::Q8_1
            | Self::IQ4_NL
            | Self::MXFP4 => 32,
            Self::NVFP4 => 64,
            Self::Q1_0 => 128,
            Self::Q2_K
            | Self::Q3_K
            | Self::Q4_K
            | Self::Q5_K
            | Self::Q6_K
            | Self::Q8_K
            | Self::IQ2_XXS
            | Self::IQ2_XS
            | Self::IQ3_XXS
            | Self::IQ1_S
            | Self::IQ3_S
            | Self::IQ2_S
            | Self::IQ4_XS
            | Self::IQ1_M
            | Self::TQ1_0
            | Self::TQ2_0 => QK_K,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 | Self::I16 => 2,
            Self::F64 | Self::I64 => 8,
            Self::I8 => 1,
            // f16 scale + 32 nibbles
            Self::Q4_0 | Self::IQ4_NL => 2 + 16,
            // f16 scale, f16 min, 32 nibbles
            Self::Q4_1 => 2 + 2 + 16,
            // f16 scale, 32 high bits, 32 nibbles
            Self::Q5_0 => 2 + 4 + 16,
            Self::Q5_1 => 2 + 2 + 4 + 16,
            Self::Q8_0 => 2 + 32,
            // f16 scale and f16 sum (ggml's current layout), 32 bytes
            Self::Q8_1 => 2 + 2 + 32,
            // 16 packed scale/min bytes, 64 bytes of 2-bit quants, f16 d, f16 dmin
            Self::Q2_K => QK_K / 16 + QK_K / 4 + 2 + 2,
            // high-bit mask, 2-bit quants, 12 bytes of 6-bit scales, f16 d
            Self::Q3_K => QK_K / 8 + QK_K / 4 + 12 + 2,
            // f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, nibbles
            Self::Q4_K => 2 + 2 + 12 + QK_K / 2,
            Self::Q5_K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            // low nibbles, high 2 bits, 16 i8 scales, f16 d
            Self::Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            // f32 d, 256 i8, 16 i16 block sums
            Self::Q8_K => 4 + QK_K + 2 * (QK_K / 16),
            Self::IQ2_XXS => 2 + QK_K / 4,
            Self::IQ2_XS => 2 + QK_K / 4 + QK_K / 32,
            Self::IQ3_XXS => 2 + QK_K / 4 + QK_K / 8,
            Self::IQ1_S => 2 + QK_K / 8 + QK_K / 16,
            Self::IQ3_S => 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
            Self::IQ2_S => 2 + QK_K / 4 + QK_K / 16,
            Self::IQ4_XS => 2 + 2 + QK_K / 2 + QK_K / 64,
            Self::IQ1_M => QK_K / 8 + QK_K / 16 + QK_K / 32,
            Self::TQ1_0 => 2 + 4 * 13,
            Self::TQ2_0 => 2 + 64,
            Self::MXFP4 => 1 + 16,
            Self::NVFP4 => 4 + 32,
            Self::Q1_0 => 2 + 16,
        }
    }

    /// Whether [`crate::dequantize`] implements this type.
    pub fn can_dequantize(self) -> bool {
        matches!(
            self,
            Self::F32
                | Self::F16
                | Self::BF16
                | Self::F64
                | Self::Q4_0
                | Self::Q4_1
                | Self::Q5_0
                | Self::Q5_1
                | Self::Q8_0
                | Self::Q2_K
                | Self::Q3_K
                | Self::Q4_K
                | Self::Q5_K
                | Self::Q6_K
                | Self::Q8_K
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 42, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn sizes_match_ggml_block_structs() {
        // Sizes of ggml's block structs, written out independently of the formulas above.
        let expected = [
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::Q8_K, 256, 292),
            (GgmlType::BF16, 1, 2),
        ];
        for (t, bs, ts) in expected {
            assert_eq!((t.block_size(), t.type_size()), (bs, ts), "{t}");
        }
    }
}
