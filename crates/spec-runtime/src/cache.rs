//! The key/value cache: per layer, preallocated to a capacity and written in place.
//!
//! Speculative decoding appends drafted tokens and then drops the rejected ones, so the cache's
//! operations are the ones that needs: [`KvCache::truncate`] is O(1) (only the length moves; the
//! stale rows are overwritten by the next append), and [`KvCache::keep_path`] keeps the accepted
//! root-to-leaf path of a token tree by moving its rows next to the prefix.
//!
//! On the flex backend the rows live in host vectors that the decoder's host path
//! (`crate::host`) reads and writes directly; burn's path copies the valid rows into a tensor
//! when it needs them (a prompt). Elsewhere they are backend tensors written with
//! `slice_assign`.

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use crate::error::{Result, RuntimeError};
use crate::host::is_flex;

/// Device backends attend over key counts that are multiples of this (see
/// [`KvCache::attended_len`]): cubek's matmul autotune keys stop at a power-of-two factor of 16.
pub(crate) const ATTENDED_MULTIPLE: usize = 16;

/// `len` rounded up to a multiple of [`ATTENDED_MULTIPLE`], at most `capacity`.
fn padded_len(len: usize, capacity: usize) -> usize {
    len.next_multiple_of(ATTENDED_MULTIPLE).min(capacity)
}

/// One layer's keys and values `[kv_heads, capacity, head_dim]`.
#[derive(Debug, Clone)]
enum Rows<B: Backend> {
    /// Backend tensors. `Option` so a write can take the tensor by value: a uniquely owned
    /// tensor is updated in place by the backend instead of copied.
    Device {
        keys: Option<Tensor<B, 3>>,
        values: Option<Tensor<B, 3>>,
    },
    /// Host memory, row-major `[kv_heads, capacity, head_dim]`.
    Host { keys: Vec<f32>, values: Vec<f32> },
}

/// One layer's rows and how many positions are valid.
#[derive(Debug, Clone)]
struct LayerCache<B: Backend> {
    rows: Rows<B>,
    len: usize,
}

/// One layer's host rows, borrowed by the host path (see [`KvCache::host_layer`]).
pub(crate) struct HostLayer<'a> {
    /// `[kv_heads, capacity, head_dim]`.
    pub keys: &'a mut [f32],
    pub values: &'a mut [f32],
    pub len: &'a mut usize,
}

/// The cache of every layer of one model for one sequence.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    capacity: usize,
    kv_heads: usize,
    head_dim: usize,
    device: B::Device,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `num_layers` layers of `kv_heads × head_dim`, holding up to `capacity`
    /// positions.
    pub fn new(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        device: &B::Device,
    ) -> Self {
        let host = is_flex::<B>();
        let layers = (0..num_layers)
            .map(|_| LayerCache {
                rows: if host {
                    // Zeroed pages are mapped lazily: a large capacity costs nothing until used.
                    let size = kv_heads * capacity * head_dim;
                    Rows::Host {
                        keys: vec![0.0; size],
                        values: vec![0.0; size],
                    }
                } else {
                    Rows::Device {
                        keys: Some(Tensor::zeros([kv_heads, capacity, head_dim], device)),
                        values: Some(Tensor::zeros([kv_heads, capacity, head_dim], device)),
                    }
                },
                len: 0,
            })
            .collect();
        Self {
            layers,
            capacity,
            kv_heads,
            head_dim,
            device: device.clone(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Valid positions in layer 0 (all layers agree unless a partial forward ran only some).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Valid positions in `layer`.
    pub fn layer_len(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, |l| l.len)
    }

    /// Whether the rows live in host memory (the flex backend), where the host path runs.
    pub(crate) fn is_host(&self) -> bool {
        self.layers
            .iter()
            .all(|l| matches!(l.rows, Rows::Host { .. }))
    }

    /// Key positions burn's attention reads when `len` are valid: `len` on the host, and on
    /// device backends `len` rounded up to a multiple of [`ATTENDED_MULTIPLE`] (at most the
    /// capacity), the rows past `len` masked out by the caller. Why: cubecl autotunes a matmul
    /// per shape class, and the class of `weights · values` includes the largest power of two
    /// dividing the key count, so an exact count made it autotune again at most steps of a
    /// generation (seen on wgpu; on an H100 the GPU sat idle most of a fresh generation).
    pub(crate) fn attended_len(&self, len: usize) -> usize {
        if self.is_host() {
            len
        } else {
            padded_len(len, self.capacity)
        }
    }

    /// `(kv_heads, head_dim)`.
    pub(crate) fn head_shape(&self) -> (usize, usize) {
        (self.kv_heads, self.head_dim)
    }

    /// The host rows of `layer`, or `None` when they are backend tensors.
    pub(crate) fn host_layer(&mut self, layer: usize) -> Option<HostLayer<'_>> {
        let cache = self.layers.get_mut(layer)?;
        match &mut cache.rows {
            Rows::Host { keys, values } => Some(HostLayer {
                keys,
                values,
                len: &mut cache.len,
            }),
            Rows::Device { .. } => None,
        }
    }

    /// Forgets every position from `len` on, in every layer. O(1).
    pub fn truncate(&mut self, len: usize) {
        for layer in &mut self.layers {
            layer.len = layer.len.min(len);
        }
    }

    /// Forgets every position from `len` on in the layers `layers`.
    pub fn truncate_layers(&mut self, layers: std::ops::Range<usize>, len: usize) {
        for layer in self.layers.iter_mut().take(layers.end).skip(layers.start) {
            layer.len = layer.len.min(len);
        }
    }

    /// Keeps, after the first `base` positions, only the positions `base + offsets[i]` (in that
    /// order), moved to `base + i`; drops the rest. This is how an accepted tree path replaces
    /// the whole tree that was written after the prefix. `offsets` must be increasing.
    pub fn keep_path(&mut self, base: usize, offsets: &[usize]) -> Result<()> {
        if offsets.windows(2).any(|w| w[0] >= w[1]) {
            return Err(RuntimeError::InvalidRequest(format!(
                "path offsets must increase: {offsets:?}"
            )));
        }
        let (kv_heads, head_dim, capacity) = (self.kv_heads, self.head_dim, self.capacity);
        for layer in &mut self.layers {
            if let Some(&last) = offsets.last()
                && base + last >= layer.len
            {
                return Err(RuntimeError::InvalidRequest(format!(
                    "path position {} is beyond the cached {}",
                    base + last,
                    layer.len
                )));
            }
            // Offsets equal to their index are already in place.
            let moved = offsets.iter().enumerate().position(|(i, &o)| o != i);
            if let Some(first) = moved {
                match &mut layer.rows {
                    Rows::Host { keys, values } => {
                        // Increasing offsets move every row down (or not at all), so copying
                        // in order never overwrites a row still to be read.
                        for rows in [keys, values] {
                            for head in rows.chunks_exact_mut(capacity * head_dim) {
                                for (i, &o) in offsets.iter().enumerate().skip(first) {
                                    let from = (base + o) * head_dim;
                                    head.copy_within(from..from + head_dim, (base + i) * head_dim);
                                }
                            }
                        }
                    }
                    Rows::Device { keys, values } => {
                        let src: Vec<i64> = offsets[first..]
                            .iter()
                            .map(|&o| (base + o) as i64)
                            .collect();
                        let count = src.len();
                        let index = Tensor::<B, 1, Int>::from_data(
                            TensorData::new(src, [count]),
                            &self.device,
                        );
                        let start = base + first;
                        for slot in [keys, values] {
                            if let Some(t) = slot.take() {
                                let rows = t.clone().select(1, index.clone());
                                *slot = Some(t.slice_assign(
                                    [0..kv_heads, start..start + count, 0..head_dim],
                                    rows,
                                ));
                            }
                        }
                    }
                }
            }
            layer.len = base + offsets.len();
        }
        Ok(())
    }

    /// Writes `keys`/`values` `[kv_heads, n, head_dim]` at the end of `layer` and returns the
    /// keys and values attention reads, `[kv_heads, attended_len(len + n), head_dim]`: every
    /// valid one, then on device backends stale or zero rows that the caller must mask.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        keys: Tensor<B, 3>,
        values: Tensor<B, 3>,
    ) -> Result<(Tensor<B, 3>, Tensor<B, 3>)> {
        let (capacity, kv_heads, head_dim) = (self.capacity, self.kv_heads, self.head_dim);
        let device = self.device.clone();
        let cache = self.layers.get_mut(layer).ok_or_else(|| {
            RuntimeError::InvalidRequest(format!("the cache has no layer {layer}"))
        })?;
        let n = keys.dims()[1];
        let end = cache.len + n;
        if end > capacity {
            return Err(RuntimeError::ContextOverflow {
                needed: end,
                capacity,
            });
        }
        let start = cache.len;
        let out = match &mut cache.rows {
            Rows::Host {
                keys: key_rows,
                values: value_rows,
            } => {
                let mut out = Vec::with_capacity(2);
                for (rows, new) in [(key_rows, keys), (value_rows, values)] {
                    let new = new
                        .into_data()
                        .convert::<f32>()
                        .into_vec::<f32>()
                        .map_err(|e| {
                            RuntimeError::InvalidRequest(format!("reading keys back: {e:?}"))
                        })?;
                    let mut valid = Vec::with_capacity(kv_heads * end * head_dim);
                    for (head, new_rows) in rows
                        .chunks_exact_mut(capacity * head_dim)
                        .zip(new.chunks_exact(n * head_dim))
                    {
                        head[start * head_dim..end * head_dim].copy_from_slice(new_rows);
                        valid.extend_from_slice(&head[..end * head_dim]);
                    }
                    out.push(Tensor::<B, 3>::from_data(
                        TensorData::new(valid, [kv_heads, end, head_dim]),
                        &device,
                    ));
                }
                out
            }
            Rows::Device {
                keys: key_slot,
                values: value_slot,
            } => {
                let mut out = Vec::with_capacity(2);
                for (slot, new) in [(key_slot, keys), (value_slot, values)] {
                    let Some(t) = slot.take() else {
                        return Err(RuntimeError::InvalidRequest("cache slot missing".into()));
                    };
                    let t = t.slice_assign([0..kv_heads, start..end, 0..head_dim], new);
                    out.push(t.clone().narrow(1, 0, padded_len(end, capacity)));
                    *slot = Some(t);
                }
                out
            }
        };
        cache.len = end;
        let mut out = out.into_iter();
        match (out.next(), out.next()) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(RuntimeError::InvalidRequest("cache slot missing".into())),
        }
    }
}
