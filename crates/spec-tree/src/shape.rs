//! A static tree shape: how many children each node gets at each depth (SpecInfer's expansion
//! configuration), written `4x2x2x1`.

use std::fmt;
use std::str::FromStr;

use crate::error::TreeError;

/// Children per node at each depth: `[4, 2, 2, 1]` gives the root 4 children, each of them 2,
/// each of those 2, and each of those 1 (a tree of 4 + 8 + 16 + 16 = 44 drafted nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeShape(Vec<usize>);

impl TreeShape {
    /// The most drafted nodes a shape may hold: a verification pass of more rows costs far more
    /// than one token's on every backend measured.
    pub const MAX_NODES: usize = 256;

    /// Children per node at depth `d` (0 = the root), or 0 past the shape's depth.
    pub fn children_at(&self, depth: usize) -> usize {
        self.0.get(depth).copied().unwrap_or(0)
    }

    /// The deepest a drafted node goes.
    pub fn depth(&self) -> usize {
        self.0.len()
    }

    /// Drafted nodes of the full shape.
    pub fn nodes(&self) -> usize {
        let mut level = 1usize;
        let mut total = 0usize;
        for &b in &self.0 {
            level = level.saturating_mul(b);
            total = total.saturating_add(level);
        }
        total
    }
}

impl FromStr for TreeShape {
    type Err = TreeError;

    fn from_str(text: &str) -> Result<Self, TreeError> {
        let bad = || TreeError::BadShape(text.to_owned());
        let widths = text
            .split('x')
            .map(|part| part.trim().parse::<usize>().ok().filter(|&b| b >= 1))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        let shape = Self(widths);
        if shape.0.is_empty() || shape.nodes() > Self::MAX_NODES {
            return Err(TreeError::BadShape(format!(
                "{text} ({} nodes; at most {})",
                shape.nodes(),
                Self::MAX_NODES
            )));
        }
        Ok(shape)
    }
}

impl fmt::Display for TreeShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(usize::to_string).collect();
        f.write_str(&parts.join("x"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_counts_and_prints_back() {
        let shape: TreeShape = "4x2x2x1".parse().unwrap();
        assert_eq!(shape.nodes(), 4 + 8 + 16 + 16);
        assert_eq!(shape.depth(), 4);
        assert_eq!(shape.children_at(1), 2);
        assert_eq!(shape.children_at(4), 0);
        assert_eq!(shape.to_string(), "4x2x2x1");
        assert_eq!("3".parse::<TreeShape>().unwrap().nodes(), 3);
        for bad in ["", "x", "4x0", "4xa", "-1", "16x16x16"] {
            assert!(bad.parse::<TreeShape>().is_err(), "{bad}");
        }
    }
}
