//! Parsing the GGUF header, metadata and tensor table, and reading tensor data.
//!
//! Layout (all little-endian): magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata
//! count, the metadata key/value pairs, the tensor table (name, `u32` rank, `u64` dims, `u32`
//! ggml type, `u64` offset), padding to `general.alignment`, then the data section the tensor
//! offsets point into. Strings are a `u64` byte length followed by UTF-8 bytes.
//!
//! Every length the file states is checked against the bytes left in the file before anything
//! is allocated, so a corrupt header costs an error, not memory.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::dequant;
use crate::error::GgufError;
use crate::types::GgmlType;
use crate::value::{Value, ValueType};

/// Alignment of the data section and of every tensor offset when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The most dimensions a ggml tensor can have.
pub const MAX_DIMS: usize = 4;

/// Arrays of arrays deeper than this are rejected (real files use at most one level).
const MAX_ARRAY_DEPTH: usize = 8;

/// Read buffer for the header; the tokenizer arrays make the header a few MiB.
const HEADER_BUF: usize = 1 << 20;

/// Raw bytes read at a time when dequantizing a tensor, so a whole-tensor dequantization never
/// holds the raw copy of a large tensor next to its f32 copy.
const DEQUANT_CHUNK_BYTES: u64 = 8 << 20;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order: `dims[0]` is the innermost (contiguous) one, the row length.
    /// A PyTorch `[out, in]` weight is stored as `dims = [in, out]`.
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (product of the dims; saturates instead of overflowing for a
    /// hand-built `TensorInfo`, which [`GgufFile::open`] never produces).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Bytes of data this tensor occupies in the file.
    pub fn n_bytes(&self) -> u64 {
        let t = self.ggml_type;
        (self.n_elements() / t.block_size() as u64).saturating_mul(t.type_size() as u64)
    }

    /// Elements per row: `dims[0]` (1 for a tensor of rank 0).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of all dims but the first.
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        let t = self.ggml_type;
        (self.row_len() / t.block_size() as u64).saturating_mul(t.type_size() as u64)
    }

    /// The shape in row-major order, outermost first (the reverse of `dims`): a `[out, in]`
    /// matrix gives `[out, in]`. This is the shape of the vector [`GgufFile::dequantize`] returns.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// Where the bytes come from.
enum Backing {
    File(File),
    Memory(Vec<u8>),
}

/// An open GGUF file: header, metadata and tensor table in memory, tensor data read on demand
/// with positioned reads (so `&GgufFile` can be shared between threads that read tensors).
pub struct GgufFile {
    version: u32,
    alignment: u64,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    data_offset: u64,
    file_len: u64,
    path: Option<PathBuf>,
    backing: Backing,
}

impl fmt::Debug for GgufFile {
    // The metadata holds the whole vocabulary; print a summary instead.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("architecture", &self.architecture())
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .field("file_len", &self.file_len)
            .finish()
    }
}

impl GgufFile {
    /// Opens `path` and reads the header, metadata and tensor table (not the tensor data).
    ///
    /// Checks that every tensor's data lies inside the file, so a truncated download fails here.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io_err)?;
        let file_len = file.metadata().map_err(io_err)?.len();
        let reader = BufReader::with_capacity(HEADER_BUF, file.try_clone().map_err(io_err)?);
        let header = Parser::new(reader, file_len, Some(&path)).parse()?;
        Ok(Self::assemble(
            header,
            file_len,
            Some(path.clone()),
            Backing::File(file),
        ))
    }

    /// Parses a GGUF image held in memory (tests, small synthetic files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        let file_len = bytes.len() as u64;
        let header = Parser::new(bytes.as_slice(), file_len, None).parse()?;
        Ok(Self::assemble(
            header,
            file_len,
            None,
            Backing::Memory(bytes),
        ))
    }

    fn assemble(h: Header, file_len: u64, path: Option<PathBuf>, backing: Backing) -> Self {
        let by_name = h
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Self {
            version: h.version,
            alignment: h.alignment,
            metadata: h.metadata,
            tensors: h.tensors,
            by_name,
            data_offset: h.data_offset,
            file_len,
            path,
            backing,
        }
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and tensor offsets (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// `general.architecture` (`"llama"`, `"qwen2"`, …).
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture")?.as_str()
    }

    /// The architecture-prefixed key `"{architecture}.{suffix}"`, e.g.
    /// `arch_get("attention.head_count")` reads `qwen2.attention.head_count` in a Qwen2 file.
    pub fn arch_get(&self, suffix: &str) -> Option<&Value> {
        let arch = self.architecture()?;
        self.get(&format!("{arch}.{suffix}"))
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// One tensor's table entry.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The path this file was opened from (`None` for [`GgufFile::from_bytes`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The tensor's bytes exactly as stored.
    pub fn read_raw(&self, t: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        self.read_rows_raw(t, 0, t.n_rows())
    }

    /// The stored bytes of rows `start..start + n_rows` of `t` (a row is `dims[0]` elements).
    pub fn read_rows_raw(
        &self,
        t: &TensorInfo,
        start: u64,
        n_rows: u64,
    ) -> Result<Vec<u8>, GgufError> {
        let (pos, len) = self.rows_span(t, start, n_rows)?;
        let len = usize::try_from(len).map_err(|_| too_big(t))?;
        let mut buf = vec![0u8; len];
        self.read_at(pos, &mut buf)?;
        Ok(buf)
    }

    /// The whole tensor as f32, row-major with `dims[0]` contiguous (shape [`TensorInfo::shape`]).
    pub fn dequantize(&self, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        self.dequantize_rows(t, 0, t.n_rows())
    }

    /// Rows `start..start + n_rows` of `t` as f32.
    pub fn dequantize_rows(
        &self,
        t: &TensorInfo,
        start: u64,
        n_rows: u64,
    ) -> Result<Vec<f32>, GgufError> {
        // Validate before allocating the output.
        self.rows_span(t, start, n_rows)?;
        let n = n_rows
            .checked_mul(t.row_len())
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| too_big(t))?;
        let mut out = vec![0f32; n];
        self.dequantize_rows_into(t, start, &mut out)?;
        Ok(out)
    }

    /// Dequantizes rows starting at `start` into `out`; `out.len()` must be a whole number of
    /// rows (`k * dims[0]`), and rows `start..start + k` are written. Reads the file in chunks
    /// of a few MiB, so converting a large tensor needs no full raw copy.
    pub fn dequantize_rows_into(
        &self,
        t: &TensorInfo,
        start: u64,
        out: &mut [f32],
    ) -> Result<(), GgufError> {
        if !t.ggml_type.can_dequantize() {
            return Err(GgufError::UnsupportedDequant(t.ggml_type));
        }
        let row_len = t.row_len();
        if row_len == 0 {
            return if out.is_empty() {
                Ok(())
            } else {
                Err(GgufError::InvalidTensor {
                    name: t.name.clone(),
                    reason: "rows are empty but output space was given".into(),
                })
            };
        }
        let row_len_us = usize::try_from(row_len).map_err(|_| too_big(t))?;
        if !out.len().is_multiple_of(row_len_us) {
            return Err(GgufError::SizeMismatch {
                ty: t.ggml_type,
                reason: format!(
                    "output length {} is not a whole number of rows of {row_len} elements (tensor {:?})",
                    out.len(),
                    t.name
                ),
            });
        }
        let n_rows = (out.len() / row_len_us) as u64;
        let (pos, _) = self.rows_span(t, start, n_rows)?;
        let row_bytes = t.row_bytes();
        let rows_per_chunk = (DEQUANT_CHUNK_BYTES / row_bytes.max(1)).max(1);
        let mut buf = Vec::new();
        let mut done = 0u64;
        for out_chunk in out.chunks_mut((rows_per_chunk as usize).saturating_mul(row_len_us)) {
            let rows = (out_chunk.len() / row_len_us) as u64;
            let bytes = usize::try_from(rows * row_bytes).map_err(|_| too_big(t))?;
            buf.resize(bytes, 0);
            self.read_at(pos + done * row_bytes, &mut buf)?;
            dequant::dequantize_into(t.ggml_type, &buf, out_chunk)?;
            done += rows;
        }
        Ok(())
    }

    /// Absolute position and byte length of a row range, checked against the tensor and the file.
    fn rows_span(&self, t: &TensorInfo, start: u64, n_rows: u64) -> Result<(u64, u64), GgufError> {
        let total = t.n_rows();
        let end = start
            .checked_add(n_rows)
            .filter(|&e| e <= total)
            .ok_or_else(|| GgufError::RowsOutOfRange {
                name: t.name.clone(),
                start,
                end: start.saturating_add(n_rows),
                n_rows: total,
            })?;
        let row_bytes = t.row_bytes();
        let oob = || GgufError::TensorOutOfBounds {
            name: t.name.clone(),
            start: self.data_offset.saturating_add(t.offset),
            end: self
                .data_offset
                .saturating_add(t.offset)
                .saturating_add(t.n_bytes()),
            file_len: self.file_len,
        };
        let tensor_start = self.data_offset.checked_add(t.offset).ok_or_else(oob)?;
        let tensor_end = tensor_start.checked_add(t.n_bytes()).ok_or_else(oob)?;
        if tensor_end > self.file_len {
            return Err(oob());
        }
        // Both fit below tensor_end, so no overflow.
        let pos = tensor_start + start * row_bytes;
        let len = (end - start) * row_bytes;
        Ok((pos, len))
    }

    fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        match &self.backing {
            Backing::Memory(bytes) => {
                let src = usize::try_from(pos)
                    .ok()
                    .and_then(|p| bytes.get(p..p.checked_add(buf.len())?))
                    .ok_or(GgufError::Truncated {
                        what: "tensor data".into(),
                        offset: pos,
                        needed: buf.len() as u64,
                        file_len: self.file_len,
                    })?;
                buf.copy_from_slice(src);
                Ok(())
            }
            Backing::File(file) => read_exact_at(file, buf, pos).map_err(|source| GgufError::Io {
                path: self.path.clone().unwrap_or_default(),
                source,
            }),
        }
    }
}

fn too_big(t: &TensorInfo) -> GgufError {
    GgufError::InvalidTensor {
        name: t.name.clone(),
        reason: "too large for this platform's address space".into(),
    }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, pos)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut pos: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, pos) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                pos += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(not(any(unix, windows)))]
fn read_exact_at(file: &File, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    // A fresh handle per read keeps `&self` reads free of shared cursor state.
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(pos))?;
    f.read_exact(buf)
}

/// What the parser produces.
struct Header {
    version: u32,
    alignment: u64,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    data_offset: u64,
}

/// A sequential reader that knows how many bytes the file has left.
struct Parser<'p, R> {
    r: R,
    pos: u64,
    len: u64,
    path: Option<&'p Path>,
}

impl<'p, R: Read> Parser<'p, R> {
    fn new(r: R, len: u64, path: Option<&'p Path>) -> Self {
        Self {
            r,
            pos: 0,
            len,
            path,
        }
    }

    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    /// Fails unless `n` more bytes exist; `what` is only built on failure.
    fn need(&self, n: u64, what: impl FnOnce() -> String) -> Result<(), GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos,
                needed: n,
                file_len: self.len,
            });
        }
        Ok(())
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<(), GgufError> {
        self.r.read_exact(buf).map_err(|source| GgufError::Io {
            path: self.path.map(Path::to_path_buf).unwrap_or_default(),
            source,
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        self.need(N as u64, what)?;
        let mut b = [0u8; N];
        self.fill(&mut b)?;
        Ok(b)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(|| format!("the length of {}", what()))?;
        self.need(len, &what)?;
        let start = self.pos;
        // `need` bounded len by the file size, which fits in memory only if usize can index it.
        let mut bytes =
            vec![0u8; usize::try_from(len).map_err(|_| self.implausible(&what, len, 1))?];
        self.fill(&mut bytes)?;
        String::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            what: what(),
            offset: start,
        })
    }

    fn implausible(&self, what: impl FnOnce() -> String, count: u64, elem: u64) -> GgufError {
        GgufError::ImplausibleLength {
            what: what(),
            count,
            min_bytes: u128::from(count) * u128::from(elem),
            offset: self.pos,
            remaining: self.remaining(),
        }
    }

    /// Checks that `count` items of at least `elem` bytes each fit in the rest of the file.
    fn plausible_count(
        &self,
        count: u64,
        elem: u64,
        what: impl FnOnce() -> String,
    ) -> Result<usize, GgufError> {
        if u128::from(count) * u128::from(elem) > u128::from(self.remaining()) {
            return Err(self.implausible(what, count, elem));
        }
        usize::try_from(count).map_err(|_| self.implausible(String::new, count, elem))
    }

    fn parse(mut self) -> Result<Header, GgufError> {
        let magic: [u8; 4] = self.array(|| "the magic number".into())?;
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = self.u32(|| "the version".into())?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(GgufError::UnsupportedVersion {
                    version,
                    hint: "GGUF v1 (32-bit lengths) is obsolete; re-convert the model with a current \
                           llama.cpp converter to get v3",
                });
            }
            v if matches!(v.swap_bytes(), 1..=3) => {
                return Err(GgufError::UnsupportedVersion {
                    version,
                    hint: "this looks like a big-endian GGUF file; only little-endian files are supported",
                });
            }
            _ => {
                return Err(GgufError::UnsupportedVersion {
                    version,
                    hint: "this reader implements versions 2 and 3",
                });
            }
        }
        let n_tensors = self.u64(|| "the tensor count".into())?;
        let n_kv = self.u64(|| "the metadata count".into())?;
        // key length (8) + value type (4) + at least one byte of value
        self.plausible_count(n_kv, 13, || "the metadata table".into())?;

        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = self.string(|| format!("metadata key #{i}"))?;
            let ty_id = self.u32(|| format!("the type of metadata key {key:?}"))?;
            let ty = ValueType::from_id(ty_id).ok_or_else(|| GgufError::UnknownValueType {
                key: key.clone(),
                id: ty_id,
            })?;
            let value = self.value(ty, &key, 0)?;
            if metadata.contains_key(&key) {
                return Err(GgufError::DuplicateKey { key });
            }
            metadata.insert(key, value);
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= u64::from(u32::MAX) => a,
                _ => {
                    return Err(GgufError::BadAlignment {
                        found: format!("{v:?}"),
                    });
                }
            },
        };

        // name length (8) + rank (4) + type (4) + offset (8)
        let n = self.plausible_count(n_tensors, 24, || "the tensor table".into())?;
        let mut tensors = Vec::with_capacity(n);
        let mut seen = HashMap::with_capacity(n);
        for i in 0..n_tensors {
            let t = self.tensor_info(i, alignment)?;
            if seen.insert(t.name.clone(), ()).is_some() {
                return Err(GgufError::DuplicateTensor { name: t.name });
            }
            tensors.push(t);
        }

        let data_offset = self.pos.div_ceil(alignment).saturating_mul(alignment);
        for t in &tensors {
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.n_bytes()));
            match end {
                Some(e) if e <= self.len => {}
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        start: data_offset.saturating_add(t.offset),
                        end: data_offset
                            .saturating_add(t.offset)
                            .saturating_add(t.n_bytes()),
                        file_len: self.len,
                    });
                }
            }
        }
        Ok(Header {
            version,
            alignment,
            metadata,
            tensors,
            data_offset,
        })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, GgufError> {
        let what = || format!("the value of metadata key {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => {
                let [b] = self.array(what)?;
                match b {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    _ => {
                        return Err(GgufError::InvalidBool {
                            key: key.to_owned(),
                            byte: b,
                        });
                    }
                }
            }
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        key: key.to_owned(),
                        max: MAX_ARRAY_DEPTH,
                    });
                }
                let elem_id = self.u32(|| format!("the element type of array {key:?}"))?;
                let elem =
                    ValueType::from_id(elem_id).ok_or_else(|| GgufError::UnknownValueType {
                        key: key.to_owned(),
                        id: elem_id,
                    })?;
                let count = self.u64(|| format!("the length of array {key:?}"))?;
                let n = self
                    .plausible_count(count, elem.min_encoded_size(), || format!("array {key:?}"))?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
        })
    }

    fn tensor_info(&mut self, i: u64, alignment: u64) -> Result<TensorInfo, GgufError> {
        let name = self.string(|| format!("the name of tensor #{i}"))?;
        let invalid = |reason: String| GgufError::InvalidTensor {
            name: name.clone(),
            reason,
        };
        let n_dims = self.u32(|| format!("the rank of tensor {name:?}"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(invalid(format!(
                "rank {n_dims} exceeds ggml's maximum of {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(self.u64(|| format!("dimension {d} of tensor {name:?}"))?);
        }
        let ty_id = self.u32(|| format!("the type of tensor {name:?}"))?;
        let ggml_type = GgmlType::from_id(ty_id).ok_or_else(|| GgufError::UnknownGgmlType {
            tensor: name.clone(),
            id: ty_id,
        })?;
        let offset = self.u64(|| format!("the data offset of tensor {name:?}"))?;

        let n_elements = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| invalid(format!("dims {dims:?} overflow the element count")))?;
        let row_len = dims.first().copied().unwrap_or(1);
        if !row_len.is_multiple_of(ggml_type.block_size() as u64) {
            return Err(invalid(format!(
                "row length {row_len} is not a multiple of the {ggml_type} block size {}",
                ggml_type.block_size()
            )));
        }
        (n_elements / ggml_type.block_size() as u64)
            .checked_mul(ggml_type.type_size() as u64)
            .ok_or_else(|| invalid(format!("dims {dims:?} overflow the byte count")))?;
        if !offset.is_multiple_of(alignment) {
            return Err(invalid(format!(
                "data offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        Ok(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        })
    }
}
