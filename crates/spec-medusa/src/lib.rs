//! Medusa heads (Cai et al., ICML 2024, arXiv 2401.10774).
