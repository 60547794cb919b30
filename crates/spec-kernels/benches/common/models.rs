//! The reference models' shapes (from each GGUF's metadata), for the benchmarks and examples
//! that time their products and layers with synthetic weights. Included by path
//! (`#[path = …] mod models;`): each user takes the part it needs.
#![allow(dead_code)]

/// One reference model's dimensions.
pub(crate) struct ReferenceModel {
    pub(crate) name: &'static str,
    pub(crate) hidden: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) intermediate: usize,
    pub(crate) layers: usize,
    pub(crate) vocab: usize,
}

pub(crate) const MODELS: [ReferenceModel; 3] = [
    ReferenceModel {
        name: "smollm2-135m",
        hidden: 576,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        intermediate: 1536,
        layers: 30,
        vocab: 49152,
    },
    ReferenceModel {
        name: "qwen2.5-coder-0.5b",
        hidden: 896,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        intermediate: 4864,
        layers: 24,
        vocab: 151936,
    },
    ReferenceModel {
        name: "qwen2.5-coder-1.5b",
        hidden: 1536,
        heads: 12,
        kv_heads: 2,
        head_dim: 128,
        intermediate: 8960,
        layers: 28,
        vocab: 151936,
    },
];

/// The projections of a pass: q/k/v stacked, o, gate/up stacked, down, the output head.
pub(crate) const PASS_PROJECTIONS: [&str; 5] = ["qkv", "o", "gate_up", "down", "head"];

impl ReferenceModel {
    pub(crate) fn by_name(name: &str) -> Option<&'static ReferenceModel> {
        MODELS.iter().find(|m| m.name == name)
    }

    /// `(projection, out, in)` of each distinct projection shape, as `Linear` holds them
    /// unstacked (q and o, k and v, gate and up share shapes, so each is listed once).
    pub(crate) fn projection_shapes(&self) -> [(&'static str, usize, usize); 5] {
        let (h, kv) = (self.hidden, self.kv_heads * self.head_dim);
        [
            ("q_o", self.heads * self.head_dim, h),
            ("k_v", kv, h),
            ("gate_up", self.intermediate, h),
            ("down", h, self.intermediate),
            ("head", self.vocab, h),
        ]
    }

    /// `(index into PASS_PROJECTIONS, out, in)` of every product of one forward pass, in
    /// order, as the runtime's host path packs them (q/k/v and gate/up stacked).
    pub(crate) fn pass_products(&self) -> Vec<(usize, usize, usize)> {
        let h = self.hidden;
        let q = self.heads * self.head_dim;
        let kv = self.kv_heads * self.head_dim;
        let mut products = Vec::with_capacity(4 * self.layers + 1);
        for _ in 0..self.layers {
            products.push((0, q + 2 * kv, h));
            products.push((1, h, q));
            products.push((2, 2 * self.intermediate, h));
            products.push((3, h, self.intermediate));
        }
        products.push((4, self.vocab, h));
        products
    }
}
