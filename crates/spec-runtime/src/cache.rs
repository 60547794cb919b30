//! The key/value cache: per layer, preallocated to a capacity and written in place.
//!
//! Speculative decoding appends drafted tokens and then drops the rejected ones, so the cache's
//! operations are the ones that needs: [`KvCache::truncate`] is O(1) (only the length moves; the
//! stale rows are overwritten by the next append), and [`KvCache::keep_path`] keeps the accepted
//! root-to-leaf path of a token tree by moving its rows next to the prefix.

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use crate::error::{Result, RuntimeError};

/// One layer's keys and values `[kv_heads, capacity, head_dim]` and how many positions are valid.
#[derive(Debug, Clone)]
pub(crate) struct LayerCache<B: Backend> {
    // `Option` so a write can take the tensor by value: a uniquely owned tensor is updated in
    // place by the backend instead of copied.
    keys: Option<Tensor<B, 3>>,
    values: Option<Tensor<B, 3>>,
    len: usize,
}

/// The cache of every layer of one model for one sequence.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    capacity: usize,
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
        let layers = (0..num_layers)
            .map(|_| LayerCache {
                keys: Some(Tensor::zeros([kv_heads, capacity, head_dim], device)),
                values: Some(Tensor::zeros([kv_heads, capacity, head_dim], device)),
                len: 0,
            })
            .collect();
        Self { layers, capacity }
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
                let device = layer.keys.as_ref().map(|k| k.device());
                if let Some(device) = device {
                    let src: Vec<i64> = offsets[first..]
                        .iter()
                        .map(|&o| (base + o) as i64)
                        .collect();
                    let count = src.len();
                    let index =
                        Tensor::<B, 1, Int>::from_data(TensorData::new(src, [count]), &device);
                    let start = base + first;
                    for slot in [&mut layer.keys, &mut layer.values] {
                        if let Some(t) = slot.take() {
                            let [kv_heads, _, head_dim] = t.dims();
                            let rows = t.clone().select(1, index.clone());
                            *slot = Some(t.slice_assign(
                                [0..kv_heads, start..start + count, 0..head_dim],
                                rows,
                            ));
                        }
                    }
                }
            }
            layer.len = base + offsets.len();
        }
        Ok(())
    }

    /// Writes `keys`/`values` `[kv_heads, n, head_dim]` at the end of `layer` and returns every
    /// valid key and value `[kv_heads, len + n, head_dim]`.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        keys: Tensor<B, 3>,
        values: Tensor<B, 3>,
    ) -> Result<(Tensor<B, 3>, Tensor<B, 3>)> {
        let capacity = self.capacity;
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
        let mut out = Vec::with_capacity(2);
        for (slot, new) in [(&mut cache.keys, keys), (&mut cache.values, values)] {
            let Some(t) = slot.take() else {
                return Err(RuntimeError::InvalidRequest("cache slot missing".into()));
            };
            let [kv_heads, _, head_dim] = t.dims();
            let t = t.slice_assign([0..kv_heads, start..end, 0..head_dim], new);
            out.push(t.clone().narrow(1, 0, end));
            *slot = Some(t);
        }
        cache.len = end;
        let values = out.pop();
        let keys = out.pop();
        match (keys, values) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(RuntimeError::InvalidRequest("cache slot missing".into())),
        }
    }
}
