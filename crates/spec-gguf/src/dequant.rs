//! Dequantization of ggml tensor data to f32.
//!
//! Each quantized type stores a run of elements as a block: one or two f16 (or f32) scales and
//! packed small integers. Formulas, with `q` the unpacked integer of an element:
//!
//! | type | block | value |
//! |---|---|---|
//! | Q4_0 | 32: `d`, 16 bytes of nibbles | `d·(q − 8)` |
//! | Q4_1 | 32: `d`, `m`, nibbles | `d·q + m` |
//! | Q5_0 | 32: `d`, 32 high bits, nibbles | `d·(q − 16)` |
//! | Q5_1 | 32: `d`, `m`, 32 high bits, nibbles | `d·q + m` |
//! | Q8_0 | 32: `d`, 32 × i8 | `d·q` |
//! | Q2_K | 256: 16 scale/min bytes (4+4 bits), 2-bit quants, `d`, `dmin` | `(d·sc)·q − dmin·m` |
//! | Q3_K | 256: high-bit mask, 2-bit quants, 16 six-bit scales, `d` | `(d·(sc − 32))·q`, `q ∈ [−4, 3]` |
//! | Q4_K | 256: `d`, `dmin`, 8 six-bit scale/min pairs, nibbles | `(d·sc)·q − dmin·m` |
//! | Q5_K | 256: as Q4_K plus a 32-byte high-bit plane | `(d·sc)·q − dmin·m` |
//! | Q6_K | 256: low nibbles, high 2 bits, 16 × i8 scales, `d` | `(d·sc)·(q − 32)` |
//! | Q8_K | 256: f32 `d`, 256 × i8, 16 × i16 sums | `d·q` |
//!
//! Nibble order: in the 32-element types, byte `j` holds element `j` in its low nibble and
//! element `j + 16` in its high nibble. In the k-quants, each run of 32 bytes holds 64 elements
//! (low nibbles first, then high nibbles). The products are evaluated in the order above, in f32,
//! without fused multiply-add, so results equal ggml's reference (and the Python `gguf` package)
//! bit for bit.

// Index loops over fixed-size block arrays mirror the bit layouts, and LLVM vectorizes them.
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::error::GgufError;
use crate::types::{GgmlType, QK_K};

/// Dequantizes `n_elements` elements of type `ty` from `bytes` (which must hold exactly that many
/// elements' blocks) into a new vector.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n_elements: usize) -> Result<Vec<f32>, GgufError> {
    check(ty, bytes.len(), n_elements)?;
    let mut out = vec![0f32; n_elements];
    dequantize_into(ty, bytes, &mut out)?;
    Ok(out)
}

/// Dequantizes `bytes` into `out`; `out.len()` elements are written and `bytes` must hold exactly
/// their blocks (`out.len() / block_size · type_size` bytes). Use it to convert one row or block
/// range at a time into a caller's buffer.
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    check(ty, bytes.len(), out.len())?;
    match ty {
        GgmlType::F32 => {
            let (src, _) = bytes.as_chunks::<4>();
            for (o, b) in out.iter_mut().zip(src) {
                *o = f32::from_le_bytes(*b);
            }
        }
        GgmlType::F64 => {
            let (src, _) = bytes.as_chunks::<8>();
            for (o, b) in out.iter_mut().zip(src) {
                *o = f64::from_le_bytes(*b) as f32;
            }
        }
        GgmlType::BF16 => {
            let (src, _) = bytes.as_chunks::<2>();
            for (o, b) in out.iter_mut().zip(src) {
                *o = bf16::from_le_bytes(*b).to_f32();
            }
        }
        GgmlType::F16 => f16_slice(bytes, out),
        GgmlType::Q4_0 => blocks::<18, 32>(bytes, out, q4_0),
        GgmlType::Q4_1 => blocks::<20, 32>(bytes, out, q4_1),
        GgmlType::Q5_0 => blocks::<22, 32>(bytes, out, q5_0),
        GgmlType::Q5_1 => blocks::<24, 32>(bytes, out, q5_1),
        GgmlType::Q8_0 => blocks::<34, 32>(bytes, out, q8_0),
        GgmlType::Q2_K => blocks::<84, QK_K>(bytes, out, q2_k),
        GgmlType::Q3_K => blocks::<110, QK_K>(bytes, out, q3_k),
        GgmlType::Q4_K => blocks::<144, QK_K>(bytes, out, q4_k),
        GgmlType::Q5_K => blocks::<176, QK_K>(bytes, out, q5_k),
        GgmlType::Q6_K => blocks::<210, QK_K>(bytes, out, q6_k),
        GgmlType::Q8_K => blocks::<292, QK_K>(bytes, out, q8_k),
        _ => return Err(GgufError::UnsupportedDequant(ty)),
    }
    Ok(())
}

/// Validates type support and that `n_bytes` is exactly the data of `n_elements` elements.
fn check(ty: GgmlType, n_bytes: usize, n_elements: usize) -> Result<(), GgufError> {
    if !ty.can_dequantize() {
        return Err(GgufError::UnsupportedDequant(ty));
    }
    let bs = ty.block_size();
    if !n_elements.is_multiple_of(bs) {
        return Err(GgufError::SizeMismatch {
            ty,
            reason: format!("{n_elements} elements is not a whole number of {bs}-element blocks"),
        });
    }
    let want = (n_elements / bs).checked_mul(ty.type_size());
    if want != Some(n_bytes) {
        return Err(GgufError::SizeMismatch {
            ty,
            reason: format!(
                "{n_elements} elements need {} bytes, got {n_bytes}",
                want.map_or_else(|| "more than usize::MAX".to_owned(), |w| w.to_string())
            ),
        });
    }
    Ok(())
}

/// Applies `f` to each (block bytes, block output) pair; sizes were checked by the caller.
#[inline(always)]
fn blocks<const TS: usize, const BS: usize>(
    bytes: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; TS], &mut [f32; BS]),
) {
    let (src, _) = bytes.as_chunks::<TS>();
    let (dst, _) = out.as_chunks_mut::<BS>();
    for (b, o) in src.iter().zip(dst) {
        f(b, o);
    }
}

/// F16 → f32 through `half`'s slice conversion (SIMD where the CPU has it), via a small buffer
/// because the bytes are not necessarily 2-byte aligned.
fn f16_slice(bytes: &[u8], out: &mut [f32]) {
    const CHUNK: usize = 512;
    let mut tmp = [f16::ZERO; CHUNK];
    let (src, _) = bytes.as_chunks::<2>();
    for (s, o) in src.chunks(CHUNK).zip(out.chunks_mut(CHUNK)) {
        let t = &mut tmp[..s.len()];
        for (h, b) in t.iter_mut().zip(s) {
            *h = f16::from_le_bytes(*b);
        }
        t.convert_to_f32_slice(o);
    }
}

#[inline(always)]
fn h(lo: u8, hi: u8) -> f32 {
    f16::from_le_bytes([lo, hi]).to_f32()
}

#[inline(always)]
fn q4_0(b: &[u8; 18], o: &mut [f32; 32]) {
    let d = h(b[0], b[1]);
    let (lo, hi) = o.split_at_mut(16);
    for j in 0..16 {
        let q = b[2 + j];
        lo[j] = d * (i32::from(q & 0x0F) - 8) as f32;
        hi[j] = d * (i32::from(q >> 4) - 8) as f32;
    }
}

#[inline(always)]
fn q4_1(b: &[u8; 20], o: &mut [f32; 32]) {
    let d = h(b[0], b[1]);
    let m = h(b[2], b[3]);
    let (lo, hi) = o.split_at_mut(16);
    for j in 0..16 {
        let q = b[4 + j];
        lo[j] = d * f32::from(q & 0x0F) + m;
        hi[j] = d * f32::from(q >> 4) + m;
    }
}

#[inline(always)]
fn q5_0(b: &[u8; 22], o: &mut [f32; 32]) {
    let d = h(b[0], b[1]);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let (lo, hi) = o.split_at_mut(16);
    for j in 0..16 {
        let q = b[6 + j];
        let x0 = u32::from(q & 0x0F) | (((qh >> j) & 1) << 4);
        let x1 = u32::from(q >> 4) | (((qh >> (j + 16)) & 1) << 4);
        lo[j] = d * (x0 as i32 - 16) as f32;
        hi[j] = d * (x1 as i32 - 16) as f32;
    }
}

#[inline(always)]
fn q5_1(b: &[u8; 24], o: &mut [f32; 32]) {
    let d = h(b[0], b[1]);
    let m = h(b[2], b[3]);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let (lo, hi) = o.split_at_mut(16);
    for j in 0..16 {
        let q = b[8 + j];
        let x0 = u32::from(q & 0x0F) | (((qh >> j) & 1) << 4);
        let x1 = u32::from(q >> 4) | (((qh >> (j + 16)) & 1) << 4);
        lo[j] = d * x0 as f32 + m;
        hi[j] = d * x1 as f32 + m;
    }
}

#[inline(always)]
fn q8_0(b: &[u8; 34], o: &mut [f32; 32]) {
    let d = h(b[0], b[1]);
    for (y, &q) in o.iter_mut().zip(&b[2..]) {
        *y = f32::from(q as i8) * d;
    }
}

#[inline(always)]
fn q8_k(b: &[u8; 292], o: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in o.iter_mut().zip(&b[4..4 + QK_K]) {
        *y = d * f32::from(q as i8);
    }
}

/// Writes `o[16·g + l] = (d·scale[g])·q[16·g + l]` style results: one f32 factor and one offset
/// per group of 16 elements. Kept as a flat loop over fixed-size arrays so it vectorizes.
#[inline(always)]
fn scale16(q: &[i8; QK_K], mul: &[f32; 16], sub: &[f32; 16], o: &mut [f32; QK_K]) {
    for g in 0..16 {
        let (m, s) = (mul[g], sub[g]);
        for l in 0..16 {
            o[16 * g + l] = m * f32::from(q[16 * g + l]) - s;
        }
    }
}

#[inline(always)]
fn q2_k(b: &[u8; 84], o: &mut [f32; QK_K]) {
    let d = h(b[80], b[81]);
    let dmin = h(b[82], b[83]);
    // Element 128·half + 32·j + l is bits 2j..2j+2 of qs[32·half + l]; one scale byte per 16
    // elements (low nibble scales d, high nibble scales dmin).
    for half in 0..2 {
        let q = &b[16 + 32 * half..48 + 32 * half];
        for j in 0..4 {
            let shift = 2 * j;
            for k in 0..2 {
                let sc = b[8 * half + 2 * j + k];
                let dl = d * f32::from(sc & 0x0F);
                let ml = dmin * f32::from(sc >> 4);
                let out = &mut o[128 * half + 32 * j + 16 * k..][..16];
                for (y, &x) in out.iter_mut().zip(&q[16 * k..16 * k + 16]) {
                    // 32-bit lanes: x86 has no 8-bit vector shifts.
                    *y = dl * ((u32::from(x) >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// The sixteen 6-bit scales of a Q3_K block, minus 32: low nibbles in bytes 0..8 (all low
/// nibbles, then all high nibbles), the 2 high bits in bytes 8..12.
#[inline(always)]
fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, v) in out.iter_mut().enumerate() {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *v = (low | (high << 4)) as i8 - 32;
    }
    out
}

#[inline(always)]
fn q3_k(b: &[u8; 110], o: &mut [f32; QK_K]) {
    let sc = q3_k_scales(&b[96..108]);
    let d = h(b[108], b[109]);
    // Element 128·half + 32·j + l: low 2 bits are bits 2j of qs[32·half + l]; bit (4·half + j)
    // of hmask[l] is the high bit, and a clear high bit means "subtract 4".
    let mut q = [0i8; QK_K];
    for half in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let low = (b[32 + 32 * half + l] >> (2 * j)) & 3;
                let clear = ((b[l] >> (4 * half + j)) & 1) ^ 1;
                q[128 * half + 32 * j + l] = low as i8 - (clear << 2) as i8;
            }
        }
    }
    let mut mul = [0f32; 16];
    for g in 0..16 {
        mul[g] = d * f32::from(sc[g]);
    }
    scale16(&q, &mul, &[0.0; 16], o);
}

/// Scale and min `j` (0..8) of a Q4_K/Q5_K block: 6 bits each, packed into 12 bytes.
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// A Q4_K block's fields, decoded from its 144 bytes: element `32 j + l` is
/// `(d · scales[j]) · quants[32 j + l] − dmin · mins[j]`, with `d`, `dmin` the block's f16
/// steps, `scales`, `mins` its 6-bit sub-block factors and `quants` its nibbles in element order.
#[derive(Debug, Clone, PartialEq)]
pub struct Q4KBlock {
    pub d: f32,
    pub dmin: f32,
    pub scales: [u8; 8],
    pub mins: [u8; 8],
    pub quants: [u8; QK_K],
}

/// The fields of one Q4_K block.
#[inline(always)]
pub fn decode_q4_k(b: &[u8; 144]) -> Q4KBlock {
    let packed = &b[4..16];
    let qs = &b[16..144];
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..8 {
        (scales[j], mins[j]) = scale_min_k4(j, packed);
    }
    // Each run of 32 bytes holds sub-block 2g in its low nibbles and 2g + 1 in its high ones.
    let mut quants = [0u8; QK_K];
    for (q, out) in qs.chunks_exact(32).zip(quants.chunks_exact_mut(64)) {
        let (lo, hi) = out.split_at_mut(32);
        for l in 0..32 {
            lo[l] = q[l] & 0x0F;
            hi[l] = q[l] >> 4;
        }
    }
    Q4KBlock {
        d: h(b[0], b[1]),
        dmin: h(b[2], b[3]),
        scales,
        mins,
        quants,
    }
}

/// Every block of Q4_K data (`bytes` a whole number of 144-byte blocks), decoded.
pub fn decode_q4_k_blocks(bytes: &[u8]) -> Result<Vec<Q4KBlock>, GgufError> {
    let (blocks, rest) = bytes.as_chunks::<144>();
    if !rest.is_empty() {
        return Err(GgufError::SizeMismatch {
            ty: GgmlType::Q4_K,
            reason: format!(
                "{} bytes is not a whole number of 144-byte blocks",
                bytes.len()
            ),
        });
    }
    Ok(blocks.iter().map(decode_q4_k).collect())
}

#[inline(always)]
fn q4_k(b: &[u8; 144], o: &mut [f32; QK_K]) {
    let block = decode_q4_k(b);
    for (j, (q, out)) in block
        .quants
        .chunks_exact(32)
        .zip(o.chunks_exact_mut(32))
        .enumerate()
    {
        let step = block.d * f32::from(block.scales[j]);
        let min = block.dmin * f32::from(block.mins[j]);
        for l in 0..32 {
            out[l] = step * f32::from(q[l]) - min;
        }
    }
}

#[inline(always)]
fn q5_k(b: &[u8; 176], o: &mut [f32; QK_K]) {
    let d = h(b[0], b[1]);
    let dmin = h(b[2], b[3]);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    // Sub-block s (32 elements) takes nibble s % 2 of qs[32·(s/2) + l] and bit s of qh[l].
    for (g, (q, out)) in qs.chunks_exact(32).zip(o.chunks_exact_mut(64)).enumerate() {
        let (s1, m1) = scale_min_k4(2 * g, scales);
        let (s2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1) = (d * f32::from(s1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(s2), dmin * f32::from(m2));
        let (bit1, bit2) = (1u8 << (2 * g), 2u8 << (2 * g));
        let (lo, hi) = out.split_at_mut(32);
        for l in 0..32 {
            // Bit tests rather than variable shifts: x86 has no 8-bit vector shifts.
            let h1 = if qh[l] & bit1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & bit2 != 0 { 16 } else { 0 };
            lo[l] = d1 * f32::from((q[l] & 0x0F) | h1) - m1;
            hi[l] = d2 * f32::from((q[l] >> 4) | h2) - m2;
        }
    }
}

/// A Q6_K block's fields, decoded from its 210 bytes: element `e` is
/// `(d · scales[e / 16]) · (quants[e] − 32)`, with `d` the block's f16 step, `scales` its signed
/// 8-bit sub-block factors and `quants` its 6-bit values (0..64) in element order.
#[derive(Debug, Clone, PartialEq)]
pub struct Q6KBlock {
    pub d: f32,
    pub scales: [i8; 16],
    pub quants: [u8; QK_K],
}

/// The fields of one Q6_K block.
#[inline(always)]
pub fn decode_q6_k(b: &[u8; 210]) -> Q6KBlock {
    // Per 128 elements: 64 bytes of low nibbles (elements 0..32 and 32..64 in the low nibbles of
    // bytes 0..32 and 32..64, elements 64..128 in their high nibbles) and 32 bytes holding the
    // high bit pairs of elements l, l + 32, l + 64, l + 96 at shifts 0, 2, 4, 6.
    let mut quants = [0u8; QK_K];
    for half in 0..2 {
        for part in 0..4 {
            for l in 0..32 {
                let nib = (b[64 * half + 32 * (part % 2) + l] >> (4 * (part / 2))) & 0x0F;
                let hi = (b[128 + 32 * half + l] >> (2 * part)) & 3;
                quants[128 * half + 32 * part + l] = nib | (hi << 4);
            }
        }
    }
    Q6KBlock {
        d: h(b[208], b[209]),
        scales: std::array::from_fn(|g| b[192 + g] as i8),
        quants,
    }
}

/// Every block of Q6_K data (`bytes` a whole number of 210-byte blocks), decoded.
pub fn decode_q6_k_blocks(bytes: &[u8]) -> Result<Vec<Q6KBlock>, GgufError> {
    let (blocks, rest) = bytes.as_chunks::<210>();
    if !rest.is_empty() {
        return Err(GgufError::SizeMismatch {
            ty: GgmlType::Q6_K,
            reason: format!(
                "{} bytes is not a whole number of 210-byte blocks",
                bytes.len()
            ),
        });
    }
    Ok(blocks.iter().map(decode_q6_k).collect())
}

#[inline(always)]
fn q6_k(b: &[u8; 210], o: &mut [f32; QK_K]) {
    let block = decode_q6_k(b);
    let q: [i8; QK_K] = std::array::from_fn(|e| block.quants[e] as i8 - 32);
    let mut mul = [0f32; 16];
    for g in 0..16 {
        mul[g] = block.d * f32::from(block.scales[g]);
    }
    scale16(&q, &mul, &[0.0; 16], o);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn size_checks() {
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0; 18], 16),
            Err(GgufError::SizeMismatch { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0; 17], 32),
            Err(GgufError::SizeMismatch { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::IQ2_XXS, &[0; 66], 256),
            Err(GgufError::UnsupportedDequant(GgmlType::IQ2_XXS))
        ));
        assert_eq!(
            dequantize(GgmlType::Q4_K, &[], 0).map(|v| v.len()).ok(),
            Some(0)
        );
    }

    #[test]
    fn plain_types() {
        let mut b = Vec::new();
        for x in [1.5f32, -2.25, 0.0] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        assert_eq!(
            dequantize(GgmlType::F32, &b, 3).ok(),
            Some(vec![1.5, -2.25, 0.0])
        );
        let b: Vec<u8> = [0.5f32, -3.0, 65504.0]
            .iter()
            .flat_map(|&x| f16b(x))
            .collect();
        assert_eq!(
            dequantize(GgmlType::F16, &b, 3).ok(),
            Some(vec![0.5, -3.0, 65504.0])
        );
        // bf16 of 1.0 is 0x3F80; of -2.5 is 0xC020.
        let b = [0x80, 0x3F, 0x20, 0xC0];
        assert_eq!(
            dequantize(GgmlType::BF16, &b, 2).ok(),
            Some(vec![1.0, -2.5])
        );
        let b: Vec<u8> = [0.25f64, -8.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(
            dequantize(GgmlType::F64, &b, 2).ok(),
            Some(vec![0.25, -8.0])
        );
    }

    #[test]
    fn f16_longer_than_one_chunk() {
        let xs: Vec<f32> = (0..1500).map(|i| (i as f32 - 700.0) * 0.5).collect();
        let b: Vec<u8> = xs.iter().flat_map(|&x| f16b(x)).collect();
        assert_eq!(dequantize(GgmlType::F16, &b, xs.len()).ok(), Some(xs));
    }

    /// Q4_0 with d = 0.5 and byte j = (j % 16) | (15 - j % 16) << 4: element j (< 16) has nibble
    /// j, element j + 16 has nibble 15 - j.
    #[test]
    fn q4_0_nibble_order() {
        let mut b = f16b(0.5).to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], 0.5 * (j as f32 - 8.0), "low {j}");
            assert_eq!(y[j + 16], 0.5 * ((15 - j) as f32 - 8.0), "high {j}");
        }
    }

    #[test]
    fn q4_1_scale_and_min() {
        let mut b = f16b(2.0).to_vec();
        b.extend(f16b(-1.0));
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize(GgmlType::Q4_1, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], 2.0 * j as f32 - 1.0);
            assert_eq!(y[j + 16], 2.0 * (15 - j) as f32 - 1.0);
        }
    }

    /// The 5th bit of element i is bit i of the u32 `qh`; set it for elements 1, 17 and 31 only.
    #[test]
    fn q5_high_bits() {
        let qh: u32 = (1 << 1) | (1 << 17) | (1 << 31);
        let nibbles: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
        let mut b0 = f16b(1.0).to_vec();
        b0.extend(qh.to_le_bytes());
        b0.extend(&nibbles);
        let mut b1 = f16b(1.0).to_vec();
        b1.extend(f16b(0.5));
        b1.extend(qh.to_le_bytes());
        b1.extend(&nibbles);
        let y0 = dequantize(GgmlType::Q5_0, &b0, 32).unwrap();
        let y1 = dequantize(GgmlType::Q5_1, &b1, 32).unwrap();
        for i in 0..32 {
            let nib = if i < 16 { i } else { 15 - (i - 16) } as f32;
            let high = if [1, 17, 31].contains(&i) { 16.0 } else { 0.0 };
            assert_eq!(y0[i], nib + high - 16.0, "q5_0 element {i}");
            assert_eq!(y1[i], nib + high + 0.5, "q5_1 element {i}");
        }
    }

    #[test]
    fn q8_0_and_q8_k_signed() {
        let mut b = f16b(0.25).to_vec();
        b.extend((0..32).map(|j| (j as i8 * 4 - 64) as u8));
        let y = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        for (j, v) in y.iter().enumerate() {
            assert_eq!(*v, 0.25 * (j as f32 * 4.0 - 64.0));
        }
        let mut b = 0.5f32.to_le_bytes().to_vec();
        b.extend((0..256).map(|j| (j - 128) as i8 as u8));
        b.extend([0u8; 32]);
        let y = dequantize(GgmlType::Q8_K, &b, 256).unwrap();
        for (j, v) in y.iter().enumerate() {
            assert_eq!(*v, 0.5 * (j as f32 - 128.0));
        }
    }

    /// Q2_K with distinct scales per 16-element group and distinct 2-bit codes per shift.
    #[test]
    fn q2_k_layout() {
        // scale g: low nibble = g % 16 (1..), high nibble (min) = 15 - g
        let scales: Vec<u8> = (0..16u8)
            .map(|g| ((g % 15) + 1) | ((15 - g) << 4))
            .collect();
        // qs[i]: codes (i%4, (i+1)%4, (i+2)%4, (i+3)%4) at shifts 0, 2, 4, 6
        let qs: Vec<u8> = (0..64u8)
            .map(|i| (0..4).fold(0u8, |a, s| a | (((i + s) % 4) << (2 * s))))
            .collect();
        let mut b = scales.clone();
        b.extend(&qs);
        b.extend(f16b(0.5));
        b.extend(f16b(0.25));
        let y = dequantize(GgmlType::Q2_K, &b, 256).unwrap();
        for e in 0..256 {
            let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
            let g = e / 16;
            let code = ((32 * half + l) + j) % 4;
            let sc = scales[g];
            let want = 0.5 * f32::from(sc & 15) * code as f32 - 0.25 * f32::from(sc >> 4);
            assert_eq!(y[e], want, "element {e}");
        }
    }

    #[test]
    fn q3_k_layout() {
        // 16 scales 0..64 (6 bits), stored as ggml packs them.
        let want_sc: Vec<u8> = (0..16u8).map(|i| (i * 7 + 3) % 64).collect();
        let mut s = [0u8; 12];
        for (i, &v) in want_sc.iter().enumerate() {
            if i < 8 {
                s[i] |= v & 15;
            } else {
                s[i - 8] |= (v & 15) << 4;
            }
            s[8 + i % 4] |= (v >> 4) << (2 * (i / 4));
        }
        let hmask: Vec<u8> = (0..32u8).map(|l| l.wrapping_mul(37) ^ 0x5A).collect();
        let qs: Vec<u8> = (0..64u8)
            .map(|i| i.wrapping_mul(113).wrapping_add(7))
            .collect();
        let mut b = hmask.clone();
        b.extend(&qs);
        b.extend(s);
        b.extend(f16b(0.125));
        let y = dequantize(GgmlType::Q3_K, &b, 256).unwrap();
        for e in 0..256 {
            let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = i32::from((qs[32 * half + l] >> (2 * j)) & 3);
            let hi = (hmask[l] >> (4 * half + j)) & 1;
            let q = low - if hi == 1 { 0 } else { 4 };
            let sc = f32::from(want_sc[e / 16]) - 32.0;
            assert_eq!(y[e], 0.125 * sc * q as f32, "element {e}");
        }
    }

    /// Packs 8 six-bit (scale, min) pairs the way ggml's Q4_K/Q5_K do.
    fn pack_k4(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
        let mut s = [0u8; 12];
        for j in 0..4 {
            s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
        }
        s
    }

    #[test]
    fn q4_k_and_q5_k_layout() {
        let sc = [1u8, 63, 17, 40, 33, 62, 5, 48];
        let mn = [60u8, 2, 45, 19, 50, 7, 31, 63];
        let qs: Vec<u8> = (0..128u32).map(|i| ((i * 29 + 11) % 256) as u8).collect();
        let qh: Vec<u8> = (0..32u32).map(|i| ((i * 151 + 77) % 256) as u8).collect();
        let (d, dmin) = (0.5f32, 0.125f32);
        let mut b4 = f16b(d).to_vec();
        b4.extend(f16b(dmin));
        b4.extend(pack_k4(&sc, &mn));
        b4.extend(&qs);
        let mut b5 = f16b(d).to_vec();
        b5.extend(f16b(dmin));
        b5.extend(pack_k4(&sc, &mn));
        b5.extend(&qh);
        b5.extend(&qs);
        let y4 = dequantize(GgmlType::Q4_K, &b4, 256).unwrap();
        let y5 = dequantize(GgmlType::Q5_K, &b5, 256).unwrap();
        for e in 0..256 {
            let sub = e / 32; // sub-block 0..8, one (scale, min) pair each
            let (g, l) = (e / 64, e % 32);
            let byte = qs[32 * g + l];
            let nib = if sub % 2 == 0 { byte & 15 } else { byte >> 4 };
            let high = (qh[l] >> sub) & 1;
            let (dl, ml) = (d * f32::from(sc[sub]), dmin * f32::from(mn[sub]));
            assert_eq!(y4[e], dl * f32::from(nib) - ml, "q4_k element {e}");
            assert_eq!(
                y5[e],
                dl * f32::from(nib | (high << 4)) - ml,
                "q5_k element {e}"
            );
        }
    }

    #[test]
    fn q6_k_layout() {
        let ql: Vec<u8> = (0..128u32).map(|i| ((i * 73 + 5) % 256) as u8).collect();
        let qh: Vec<u8> = (0..64u32).map(|i| ((i * 101 + 33) % 256) as u8).collect();
        let sc: Vec<i8> = (0..16i32).map(|i| (i * 9 - 70) as i8).collect();
        let mut b = ql.clone();
        b.extend(&qh);
        b.extend(sc.iter().map(|&s| s as u8));
        b.extend(f16b(0.25));
        let y = dequantize(GgmlType::Q6_K, &b, 256).unwrap();
        for e in 0..256 {
            let (half, r) = (e / 128, e % 128);
            let (part, l) = (r / 32, r % 32);
            let nbyte = ql[64 * half + 32 * (part % 2) + l];
            let low = if part < 2 { nbyte & 15 } else { nbyte >> 4 };
            let high = (qh[32 * half + l] >> (2 * part)) & 3;
            let q = i32::from(low | (high << 4)) - 32;
            let want = 0.25 * f32::from(sc[e / 16]) * q as f32;
            assert_eq!(y[e], want, "element {e}");
        }
    }

    #[test]
    fn into_matches_alloc_variant_over_a_block_range() {
        let bytes: Vec<u8> = (0..144 * 3).map(|i| (i * 31 % 251) as u8).collect();
        // keep the f16 scales finite: zero their high (exponent) bytes
        let mut bytes = bytes;
        for blk in 0..3 {
            bytes[blk * 144 + 1] = 0x3C;
            bytes[blk * 144 + 3] = 0x30;
        }
        let all = dequantize(GgmlType::Q4_K, &bytes, 768).unwrap();
        let mut mid = vec![0f32; 256];
        dequantize_into(GgmlType::Q4_K, &bytes[144..288], &mut mid).unwrap();
        assert_eq!(&all[256..512], &mid[..]);
    }
}
