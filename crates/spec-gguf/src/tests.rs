//! Parser tests on synthetic files built byte by byte.

use half::f16;

use crate::{GgmlType, GgufError, GgufFile, Value};

/// A minimal GGUF writer for tests.
struct Builder {
    version: u32,
    kv: Vec<(String, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    alignment: u64,
}

fn s(x: &str) -> Vec<u8> {
    let mut v = (x.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(x.as_bytes());
    v
}

impl Builder {
    fn new() -> Self {
        Self {
            version: 3,
            kv: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
        }
    }

    /// Adds a key with a raw value encoding (type id + payload).
    fn kv(mut self, key: &str, ty: u32, payload: &[u8]) -> Self {
        let mut v = ty.to_le_bytes().to_vec();
        v.extend_from_slice(payload);
        self.kv.push((key.to_owned(), v));
        self
    }

    fn kv_str(self, key: &str, val: &str) -> Self {
        self.kv(key, 8, &s(val))
    }

    fn kv_u32(self, key: &str, val: u32) -> Self {
        self.kv(key, 4, &val.to_le_bytes())
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_owned(), dims.to_vec(), ty.id(), data));
        self
    }

    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            out.extend(s(k));
            out.extend(v);
        }
        let align = |x: u64| x.div_ceil(self.alignment) * self.alignment;
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            out.extend(s(name));
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = align(offset + data.len() as u64);
        }
        out.resize(align(out.len() as u64) as usize, 0);
        let base = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(base + off as usize, 0);
            out.extend(data);
        }
        out
    }
}

fn f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A small file with every kind of metadata value and three tensors, the last one ending at the
/// last byte of the file.
fn sample() -> Builder {
    let mut arr_str = 8u32.to_le_bytes().to_vec();
    arr_str.extend(3u64.to_le_bytes());
    for t in ["<s>", "a", "Ġb"] {
        arr_str.extend(s(t));
    }
    let mut arr_i32 = 5u32.to_le_bytes().to_vec();
    arr_i32.extend(2u64.to_le_bytes());
    arr_i32.extend((-1i32).to_le_bytes());
    arr_i32.extend(7i32.to_le_bytes());
    // array of arrays of u8
    let mut nested = 9u32.to_le_bytes().to_vec();
    nested.extend(2u64.to_le_bytes());
    for n in [1u8, 2] {
        nested.extend(0u32.to_le_bytes());
        nested.extend((n as u64).to_le_bytes());
        nested.extend(std::iter::repeat_n(n, n as usize));
    }
    let q8: Vec<u8> = {
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        b
    };
    Builder::new()
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", 2)
        .kv("llama.rope.freq_base", 6, &10000.0f32.to_le_bytes())
        .kv("flag", 7, &[1])
        .kv("u8", 0, &[200])
        .kv("i8", 1, &[0xFF])
        .kv("u16", 2, &500u16.to_le_bytes())
        .kv("i16", 3, &(-500i16).to_le_bytes())
        .kv("i32", 5, &(-5i32).to_le_bytes())
        .kv("u64", 10, &(1u64 << 40).to_le_bytes())
        .kv("i64", 11, &(-(1i64 << 40)).to_le_bytes())
        .kv("f64", 12, &0.125f64.to_le_bytes())
        .kv("tokenizer.ggml.tokens", 9, &arr_str)
        .kv("tokenizer.ggml.token_type", 9, &arr_i32)
        .kv("nested", 9, &nested)
        .tensor(
            "norm.weight",
            &[4],
            GgmlType::F32,
            f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
        )
        .tensor(
            "w.weight",
            &[2, 3],
            GgmlType::F16,
            [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
        )
        .tensor("q.weight", &[32, 1], GgmlType::Q8_0, q8)
}

#[test]
fn parses_metadata_and_tensor_table() {
    let f = GgufFile::from_bytes(sample().build()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.arch_get("block_count").and_then(Value::as_u64), Some(2));
    assert_eq!(
        f.get("llama.rope.freq_base").and_then(Value::as_f64),
        Some(10000.0)
    );
    assert_eq!(f.get("flag").and_then(Value::as_bool), Some(true));
    assert_eq!(f.get("u8"), Some(&Value::U8(200)));
    assert_eq!(f.get("i8"), Some(&Value::I8(-1)));
    assert_eq!(f.get("u16"), Some(&Value::U16(500)));
    assert_eq!(f.get("i16"), Some(&Value::I16(-500)));
    assert_eq!(f.get("i32").and_then(Value::as_i64), Some(-5));
    assert_eq!(f.get("u64").and_then(Value::as_u64), Some(1 << 40));
    assert_eq!(f.get("i64").and_then(Value::as_i64), Some(-(1 << 40)));
    assert_eq!(f.get("f64"), Some(&Value::F64(0.125)));
    assert_eq!(
        f.get("tokenizer.ggml.tokens").and_then(Value::as_str_array),
        Some(vec!["<s>", "a", "Ġb"])
    );
    assert_eq!(
        f.get("tokenizer.ggml.token_type")
            .and_then(Value::as_i64_array),
        Some(vec![-1, 7])
    );
    assert_eq!(
        f.get("nested"),
        Some(&Value::Array(vec![
            Value::Array(vec![Value::U8(1)]),
            Value::Array(vec![Value::U8(2), Value::U8(2)]),
        ]))
    );
    assert_eq!(f.metadata().len(), 15);

    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["norm.weight", "w.weight", "q.weight"]);
    let w = f.tensor("w.weight").unwrap();
    assert_eq!(
        (w.n_elements(), w.n_bytes(), w.row_len(), w.n_rows()),
        (6, 12, 2, 3)
    );
    assert_eq!(w.shape(), vec![3, 2]);
    assert_eq!(w.offset % 32, 0);
    assert_eq!(f.data_offset() % 32, 0);
    assert!(f.tensor("missing").is_none());
}

#[test]
fn reads_and_dequantizes_tensors() {
    let f = GgufFile::from_bytes(sample().build()).unwrap();
    let norm = f.tensor("norm.weight").unwrap();
    assert_eq!(f.read_raw(norm).unwrap(), f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
    assert_eq!(f.dequantize(norm).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    let w = f.tensor("w.weight").unwrap();
    assert_eq!(f.dequantize(w).unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(
        f.dequantize_rows(w, 1, 2).unwrap(),
        vec![3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(f.read_rows_raw(w, 2, 1).unwrap().len(), 4);
    let q = f.tensor("q.weight").unwrap();
    let y = f.dequantize(q).unwrap();
    assert_eq!(
        y,
        (0..32).map(|i| 0.5 * (i as f32 - 16.0)).collect::<Vec<_>>()
    );
    assert!(matches!(
        f.dequantize_rows(w, 2, 2),
        Err(GgufError::RowsOutOfRange { .. })
    ));
    let mut odd = [0f32; 3];
    assert!(matches!(
        f.dequantize_rows_into(w, 0, &mut odd),
        Err(GgufError::SizeMismatch { .. })
    ));
}

#[test]
fn same_through_a_real_file() {
    let bytes = sample().build();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.path(), Some(path.as_path()));
    assert_eq!(f.file_len(), bytes.len() as u64);
    let w = f.tensor("w.weight").unwrap();
    assert_eq!(f.dequantize_rows(w, 1, 1).unwrap(), vec![3.0, 4.0]);
    // A tensor description that does not belong to this file is still bounds-checked.
    let mut bogus = w.clone();
    bogus.offset = 1 << 40;
    assert!(matches!(
        f.read_raw(&bogus),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
    assert!(matches!(
        GgufFile::open(dir.path().join("absent.gguf")),
        Err(GgufError::Io { .. })
    ));
}

/// Every proper prefix of a valid file must fail to open with an error, never panic.
#[test]
fn every_truncation_is_an_error() {
    let bytes = sample().build();
    for cut in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..cut].to_vec());
        assert!(
            r.is_err(),
            "prefix of {cut} of {} bytes parsed",
            bytes.len()
        );
    }
    assert!(GgufFile::from_bytes(bytes).is_ok());
}

/// Flipping bytes anywhere in the header must never panic (errors or odd values are both fine).
#[test]
fn corrupted_bytes_never_panic() {
    let bytes = sample().build();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let header_len = f.data_offset() as usize;
    for i in 0..header_len {
        for v in [0x00, 0xFF, 0x7F, 0x80] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Ok(f) = GgufFile::from_bytes(b) {
                for t in f.tensors() {
                    let _ = f.dequantize(t);
                }
            }
        }
    }
}

#[test]
fn wrong_magic_and_versions() {
    let mut b = sample().build();
    b[0] = b'X';
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::BadMagic { .. })
    ));
    for (v, want) in [
        (1u32, "obsolete"),
        (4, "versions 2 and 3"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut s = sample();
        s.version = v;
        match GgufFile::from_bytes(s.build()) {
            Err(e @ GgufError::UnsupportedVersion { .. }) => {
                assert!(e.to_string().contains(want), "{e}")
            }
            other => panic!("version {v}: {other:?}"),
        }
    }
    let mut s = sample();
    s.version = 2;
    assert!(GgufFile::from_bytes(s.build()).is_ok());
}

#[test]
fn absurd_counts_are_rejected_without_allocating() {
    // metadata count u64::MAX
    let mut b = sample().build();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::ImplausibleLength { .. })
    ));
    // tensor count 2^60
    let mut b = sample().build();
    b[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::ImplausibleLength { .. })
    ));
    // an array claiming 2^62 u32 elements
    let mut arr = 4u32.to_le_bytes().to_vec();
    arr.extend((1u64 << 62).to_le_bytes());
    let b = Builder::new().kv("big", 9, &arr).build();
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::ImplausibleLength { .. })
    ));
    // a string claiming u64::MAX bytes
    let b = Builder::new().kv("big", 8, &u64::MAX.to_le_bytes()).build();
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::Truncated { .. })
    ));
}

#[test]
fn malformed_values_and_tensors() {
    let err = |b: Builder| GgufFile::from_bytes(b.build()).err();
    assert!(matches!(
        err(Builder::new().kv("k", 13, &[0])),
        Some(GgufError::UnknownValueType { id: 13, .. })
    ));
    assert!(matches!(
        err(Builder::new().kv("k", 7, &[2])),
        Some(GgufError::InvalidBool { byte: 2, .. })
    ));
    assert!(matches!(
        err(Builder::new()
            .kv("k", 8, &s("\u{1F600}")[..11])
            .kv_u32("x", 1)),
        Some(GgufError::InvalidUtf8 { .. })
    ));
    let mut bad_utf8 = 2u64.to_le_bytes().to_vec();
    bad_utf8.extend([0xC3, 0x28]);
    assert!(matches!(
        err(Builder::new().kv("k", 8, &bad_utf8)),
        Some(GgufError::InvalidUtf8 { .. })
    ));
    assert!(matches!(
        err(Builder::new().kv_u32("k", 1).kv_u32("k", 2)),
        Some(GgufError::DuplicateKey { .. })
    ));
    // arrays nested 9 deep
    let mut deep = Vec::new();
    for _ in 0..9 {
        deep.extend(9u32.to_le_bytes());
        deep.extend(1u64.to_le_bytes());
    }
    deep.extend(0u32.to_le_bytes());
    deep.extend(0u64.to_le_bytes());
    assert!(matches!(
        err(Builder::new().kv("deep", 9, &deep)),
        Some(GgufError::NestingTooDeep { .. })
    ));
    for bad in [0u32, 3, 48] {
        assert!(matches!(
            err(Builder::new().kv_u32("general.alignment", bad)),
            Some(GgufError::BadAlignment { .. })
        ));
    }
    assert!(matches!(
        err(Builder::new().kv_str("general.alignment", "32")),
        Some(GgufError::BadAlignment { .. })
    ));

    let t = |dims: &[u64], ty: GgmlType, n: usize| Builder::new().tensor("t", dims, ty, vec![0; n]);
    assert!(matches!(
        err(t(&[16], GgmlType::Q4_0, 18)),
        Some(GgufError::InvalidTensor { .. })
    ));
    assert!(matches!(
        err(t(&[1, 1, 1, 1, 1], GgmlType::F32, 4)),
        Some(GgufError::InvalidTensor { .. })
    ));
    assert!(matches!(
        err(t(&[u64::MAX, 4], GgmlType::F32, 4)),
        Some(GgufError::InvalidTensor { .. })
    ));
    assert!(matches!(
        err(t(&[1 << 40], GgmlType::F32, 4)),
        Some(GgufError::TensorOutOfBounds { .. })
    ));
    let mut unknown = t(&[4], GgmlType::F32, 16);
    unknown.tensors[0].2 = 4; // Q4_2, removed from ggml
    assert!(matches!(
        err(unknown),
        Some(GgufError::UnknownGgmlType { id: 4, .. })
    ));
    let dup = t(&[4], GgmlType::F32, 16).tensor("t", &[4], GgmlType::F32, vec![0; 16]);
    assert!(matches!(err(dup), Some(GgufError::DuplicateTensor { .. })));
}

#[test]
fn custom_alignment_and_misaligned_offsets() {
    let mut b = Builder::new()
        .kv_u32("general.alignment", 64)
        .tensor("a", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0]))
        .tensor("b", &[2], GgmlType::F32, f32_bytes(&[4.0, 5.0]));
    b.alignment = 64;
    let f = GgufFile::from_bytes(b.build()).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor("b").unwrap().offset, 64);
    assert_eq!(
        f.dequantize(f.tensor("b").unwrap()).unwrap(),
        vec![4.0, 5.0]
    );

    // The same file read with the default alignment of 32 has a data offset 32 bytes early or
    // equal; write offsets that are not multiples of 64 to check the offset rule.
    let mut b = Builder::new()
        .kv_u32("general.alignment", 64)
        .tensor("a", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0]))
        .tensor("b", &[2], GgmlType::F32, f32_bytes(&[4.0, 5.0]));
    b.alignment = 32; // the builder now places "b" at offset 32, not a multiple of 64
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::InvalidTensor { .. })
    ));
}

#[test]
fn unsupported_dequant_type_reads_raw() {
    let f = GgufFile::from_bytes(
        Builder::new()
            .tensor("iq", &[256], GgmlType::IQ2_XXS, vec![7; 66])
            .build(),
    )
    .unwrap();
    let t = f.tensor("iq").unwrap();
    assert_eq!(f.read_raw(t).unwrap(), vec![7; 66]);
    assert!(matches!(
        f.dequantize(t),
        Err(GgufError::UnsupportedDequant(GgmlType::IQ2_XXS))
    ));
}

#[test]
fn debug_is_a_summary() {
    let f = GgufFile::from_bytes(sample().build()).unwrap();
    let d = format!("{f:?}");
    assert!(d.contains("metadata_keys: 15") && !d.contains("Ġb"), "{d}");
}

/// Loaders share one `&GgufFile` between threads that dequantize different tensors.
#[test]
fn gguf_file_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<GgufFile>();
}
