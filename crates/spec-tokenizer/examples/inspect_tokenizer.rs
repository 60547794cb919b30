//! Builds the tokenizer of a GGUF file, reports timings and special ids, and tokenizes a text.
//!
//! `cargo run --release -p spec-tokenizer --example inspect_tokenizer -- MODEL.gguf [TEXT]`

use std::time::Instant;

use spec_gguf::GgufFile;
use spec_tokenizer::{GgufTokenizerData, TextTokenizer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: inspect_tokenizer MODEL.gguf [TEXT]")?;
    let text = args
        .next()
        .unwrap_or_else(|| "Hello, world! 12345 你好 🦀".to_owned());

    let t0 = Instant::now();
    let file = GgufFile::open(&path)?;
    let t1 = Instant::now();
    let data = GgufTokenizerData::from_gguf(&file)?;
    let t2 = Instant::now();
    let tok: TextTokenizer = data.build()?;
    let t3 = Instant::now();
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    println!(
        "{path}: {} tokens, pre = {:?}; open {:.0} ms, extract {:.0} ms, build {:.0} ms",
        tok.vocab_size(),
        data.pre,
        ms(t0, t1),
        ms(t1, t2),
        ms(t2, t3)
    );
    println!(
        "bos = {:?}, eos = {:?}, adds bos: {}",
        tok.bos_id(),
        tok.eos_ids(),
        tok.adds_bos()
    );
    let t4 = Instant::now();
    let ids = tok.encode(&text, true)?;
    let t5 = Instant::now();
    println!("{text:?} -> {ids:?} ({:.2} ms)", ms(t4, t5));
    for id in ids {
        println!("  {id:>7} {:?}", tok.token_to_piece(id).unwrap_or_default());
    }
    Ok(())
}
