//! `cargo xtask train-bigram`: counts token bigrams over text corpora with a model's tokenizer
//! and writes the bigram draft model of `spec generate --method bigram` (format: the docs of
//! `spec_ngram::bigram`).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use spec_gguf::GgufFile;
use spec_ngram::BigramCounts;
use spec_tokenizer::TextTokenizer;

#[derive(clap::Args)]
pub(crate) struct TrainBigramArgs {
    /// The target model (reference name or GGUF path): its tokenizer and vocabulary size.
    #[arg(long)]
    pub(crate) model: String,
    /// Plain-text corpus files (UTF-8; invalid bytes are replaced). Without `--corpus` and
    /// `--tagged-corpus`: the project's corpora (Austen, Shakespeare, Brown), fetched with
    /// `cargo xtask fetch-corpora` if missing.
    #[arg(long, num_args = 1..)]
    pub(crate) corpus: Vec<PathBuf>,
    /// Corpus files of tagged `word/TAG` text (the Brown corpus): only the words are counted.
    #[arg(long, num_args = 1..)]
    pub(crate) tagged_corpus: Vec<PathBuf>,
    /// Where to write the model.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

pub(crate) fn run(args: TrainBigramArgs) -> Result<()> {
    let path = spec_models::resolve(&args.model)?;
    let gguf = GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    // The drafter's rows must match the target's logits, i.e. its embedding rows.
    let vocab = match gguf.tensor("token_embd.weight").map(|t| t.dims.as_slice()) {
        Some([_, vocab]) => *vocab as usize,
        _ => bail!("{}: no 2-D token_embd.weight tensor", path.display()),
    };
    let tokenizer = TextTokenizer::from_gguf(&gguf)?;
    let mut counts = BigramCounts::new(vocab)?;

    let (plain, tagged) = if args.corpus.is_empty() && args.tagged_corpus.is_empty() {
        let corpora = crate::corpora::fetch(&crate::corpora::default_dir()?)?;
        (corpora.plain, corpora.tagged)
    } else {
        (args.corpus, args.tagged_corpus)
    };
    let files: Vec<(PathBuf, bool)> = plain
        .into_iter()
        .map(|f| (f, false))
        .chain(tagged.into_iter().map(|f| (f, true)))
        .collect();
    let mut total = 0;
    for (file, _) in &files {
        let meta =
            std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?;
        if !meta.is_file() {
            bail!(
                "{} is not a file (pass the corpus files themselves)",
                file.display()
            );
        }
        total += meta.len();
    }
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:24}] {bytes}/{total_bytes} {bytes_per_sec} {eta} {wide_msg}",
        )?
        .progress_chars("=> "),
    );
    bar.set_prefix("tokenizing");
    let mut tokens_seen = 0usize;
    for (file, tagged) in &files {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        bar.set_message(file.display().to_string());
        // Paragraphs are the documents: bounded tokenizer calls, no pairs across blank lines.
        for paragraph in text.split("\n\n") {
            let paragraph = if *tagged {
                strip_tags(paragraph)
            } else {
                paragraph.trim().to_owned()
            };
            if paragraph.is_empty() {
                continue;
            }
            let ids = tokenizer.encode(&paragraph, false)?;
            tokens_seen += ids.len();
            counts.add_sequence(&ids)?;
        }
        bar.inc(bytes.len() as u64);
    }
    bar.finish_and_clear();
    let distinct = counts.distinct_bigrams();
    let model = counts.finish();
    model.save(&args.out)?;
    println!(
        "{}: {} files, {tokens_seen} tokens, {distinct} distinct bigrams, vocabulary {vocab} ({})",
        args.out.display(),
        files.len(),
        path.display()
    );
    Ok(())
}

/// `The/at jury/nn said/vbd` → `The jury said`.
fn strip_tags(paragraph: &str) -> String {
    let words: Vec<&str> = paragraph
        .split_whitespace()
        .map(|w| w.rsplit_once('/').map_or(w, |(word, _)| word))
        .collect();
    words.join(" ")
}
