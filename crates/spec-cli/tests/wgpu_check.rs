//! `spec --backend wgpu` asks wgpu for an adapter before burn's backend starts (which panics
//! without one): run as a program, with the Vulkan driver hidden, a device named that is not
//! there, and (with Mesa's software driver, which `cargo xtask test` installs) one that is.
//! Nothing here loads a model: a missing model's own error shows that the check let it by.
#![cfg(feature = "wgpu")]

mod wgpu {
    use std::process::{Command, Output};

    /// `spec generate --backend wgpu` on a model that does not exist, with `env` set.
    fn generate(env: &[(&str, &str)]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_spec"))
            .args(["generate", "--backend", "wgpu", "--prompt", "hi", "--model"])
            .arg("/nonexistent/model.gguf")
            .env_remove("CUBECL_WGPU_DEFAULT_DEVICE")
            .envs(env.iter().copied())
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("running spec")
    }

    /// The exit status and the message of a run that failed cleanly.
    fn failure(output: &Output) -> String {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    }

    const MODEL_ERROR: &str = "is neither an existing file nor a reference model";

    #[test]
    fn without_a_vulkan_driver_the_error_says_so() {
        let stderr = failure(&generate(&[("VK_ICD_FILENAMES", "/nonexistent/icd.json")]));
        assert!(stderr.contains("wgpu found no Vulkan adapter"), "{stderr}");
        assert!(stderr.contains("--backend flex"), "{stderr}");
        assert!(!stderr.contains(MODEL_ERROR), "{stderr}");
    }

    #[test]
    fn with_the_software_driver_the_check_lets_it_by() {
        let stderr = failure(&generate(&[]));
        assert!(stderr.contains(MODEL_ERROR), "{stderr}");
        let stderr = failure(&generate(&[("CUBECL_WGPU_DEFAULT_DEVICE", "Cpu")]));
        assert!(stderr.contains(MODEL_ERROR), "{stderr}");
    }

    #[test]
    fn a_named_device_that_is_not_there_is_an_error() {
        let stderr = failure(&generate(&[(
            "CUBECL_WGPU_DEFAULT_DEVICE",
            "DiscreteGpu(3)",
        )]));
        assert!(
            stderr.contains("wgpu has no Vulkan adapter DiscreteGpu(3)"),
            "{stderr}"
        );
        assert!(!stderr.contains(MODEL_ERROR), "{stderr}");
    }
}
