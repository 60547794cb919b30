//! Single-threaded dequantization throughput per ggml type, on synthetic blocks held in memory,
//! and optionally the time to dequantize every tensor of a real model file.
//!
//! `cargo run --release -p spec-gguf --example dequant_speed [-- MODEL.gguf ...]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use spec_gguf::{GgmlType, GgufFile, dequantize_into};

const ELEMENTS: usize = 1 << 24;

/// Pseudo-random bytes with every f16/f32 scale field set to a finite value, so the timings do
/// not depend on NaN or subnormal arithmetic.
fn synthetic(ty: GgmlType) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let n_blocks = ELEMENTS / ty.block_size();
    let mut bytes: Vec<u8> = (0..n_blocks * ty.type_size())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    // Byte offsets of the f16 scales (high byte is overwritten), or of the f32 scale.
    let f16_at: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    let ts = ty.type_size();
    for blk in bytes.chunks_exact_mut(ts) {
        for &o in f16_at {
            blk[o + 1] = 0x2C; // exponent of ~0.06
        }
        if ty == GgmlType::Q8_K {
            blk[..4].copy_from_slice(&0.01f32.to_le_bytes());
        }
    }
    match ty {
        GgmlType::F32 => bytes
            .chunks_exact(4)
            .flat_map(|c| (f32::from(c[0]) - 128.0).to_le_bytes())
            .collect(),
        GgmlType::F16 | GgmlType::BF16 => {
            for c in bytes.chunks_exact_mut(2) {
                c[1] &= 0xBF; // no inf/NaN
            }
            bytes
        }
        _ => bytes,
    }
}

fn time<F: FnMut()>(mut f: F) -> Duration {
    f(); // warm up
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
    }
    best
}

fn main() {
    println!(
        "{:<6} {:>10} {:>10} {:>10}   ({} elements, best of 5, one thread)",
        "type", "Melem/s", "in GB/s", "out GB/s", ELEMENTS
    );
    let mut out = vec![0f32; ELEMENTS];
    for ty in GgmlType::ALL.into_iter().filter(|t| t.can_dequantize()) {
        let bytes = synthetic(ty);
        let dt = time(|| {
            dequantize_into(ty, black_box(&bytes), black_box(&mut out)).expect("valid sizes");
        });
        let s = dt.as_secs_f64();
        println!(
            "{:<6} {:>10.0} {:>10.2} {:>10.2}",
            ty.to_string(),
            ELEMENTS as f64 / s / 1e6,
            bytes.len() as f64 / s / 1e9,
            (ELEMENTS * 4) as f64 / s / 1e9
        );
    }

    for path in std::env::args().skip(1) {
        let f = match GgufFile::open(&path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("{path}: {e}");
                continue;
            }
        };
        let t = Instant::now();
        let mut n = 0u64;
        let mut buf = Vec::new();
        for ti in f.tensors() {
            buf.resize(ti.n_elements() as usize, 0f32);
            f.dequantize_rows_into(ti, 0, &mut buf).expect("dequantize");
            n += ti.n_elements();
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "{path}: all {} tensors, {n} elements in {s:.2} s ({:.0} Melem/s, file read included)",
            f.tensors().len(),
            n as f64 / s / 1e6
        );
    }
}
