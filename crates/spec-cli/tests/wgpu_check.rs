//! `spec --backend wgpu` asks wgpu for an adapter before burn's backend starts (which panics
//! without one): run as a program, with the Vulkan driver hidden, a device named that is not
//! there, and (with Mesa's software driver, which `cargo xtask test` installs) one that is.
//! A missing model's own error shows that the check let it by. The adapter's buffer limit
//! reaches the model's load: the Qwen2.5 0.5B, whose embedding outgrows lavapipe's buffers, is
//! refused there with the weight named.
#![cfg(feature = "wgpu")]

mod wgpu {
    use std::process::{Command, Output};

    /// `spec generate --backend wgpu` on a model that does not exist, with `env` set.
    fn generate(env: &[(&str, &str)]) -> Output {
        generate_with("/nonexistent/model.gguf", env)
    }

    /// `spec generate --backend wgpu --model model`, with `env` set.
    fn generate_with(model: &str, env: &[(&str, &str)]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_spec"))
            .args(["generate", "--backend", "wgpu", "--prompt", "hi", "--model"])
            .arg(model)
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

    #[test]
    fn a_model_too_large_for_the_adapters_buffers_is_refused_at_load() {
        let model = "qwen2.5-coder-0.5b";
        if let Err(e) = spec_models::resolve(model) {
            assert!(
                std::env::var("SPEC_REQUIRE_MODELS").as_deref() != Ok("1"),
                "SPEC_REQUIRE_MODELS=1 but {e}"
            );
            eprintln!("skipping: {e}");
            return;
        }
        // lavapipe's largest storage buffer binding is 134,217,728 bytes; the embedding is
        // 151,936 × 896 values, 544,538,624 bytes in f32.
        let stderr = failure(&generate_with(model, &[]));
        assert!(
            stderr.contains("token embedding takes 544538624 bytes in f32"),
            "{stderr}"
        );
        assert!(
            stderr.contains("134217728 bytes this device holds"),
            "{stderr}"
        );
    }
}
