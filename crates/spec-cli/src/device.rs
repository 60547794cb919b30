//! The devices `spec` runs on: checks that a GPU backend can start before burn's runtime
//! panics for want of one, and the limits a device puts on the models loaded onto it.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use anyhow::{Result, bail};
use spec_runtime::model::{LoadOptions, WeightFormat};

/// Checks that the NVIDIA driver's library loads and sees a GPU. burn's cuda runtime starts
/// its device in a thread of its own and panics there on a machine without either (the caller
/// then sees only a closed channel), so `--backend cuda` asks first.
#[cfg(feature = "cuda")]
pub(crate) fn check_cuda() -> Result<()> {
    const HINT: &str = "--backend cuda needs an NVIDIA GPU and its driver; use --backend flex \
                        (the CPU) or wgpu instead";
    // SAFETY: only tries to open the driver's shared library with `libloading`, which runs its
    // initialisers; no symbol is called.
    #[allow(unsafe_code)]
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !present {
        bail!("the NVIDIA driver's library (libcuda) was not found: {HINT}");
    }
    cudarc::driver::result::init()
        .map_err(|e| anyhow::anyhow!("the NVIDIA driver did not start ({e:?}): {HINT}"))?;
    let gpus = cudarc::driver::result::device::get_count()
        .map_err(|e| anyhow::anyhow!("the NVIDIA driver could not count GPUs ({e:?}): {HINT}"))?;
    if gpus < 1 {
        bail!("the NVIDIA driver sees no GPU: {HINT}");
    }
    Ok(())
}

/// Checks that wgpu finds an adapter for the graphics API of burn's wgpu backend (Vulkan on
/// Linux), asked for as cubecl asks when the backend starts: cubecl panics where there is none
/// ("No possible adapter available"), so `--backend wgpu` asks first. Where
/// [`WGPU_DEVICE_VAR`] names a device, cubecl takes it from the list of adapters instead
/// (panicking where that one is missing), and so does this check. Returns the limits of the
/// adapter cubecl will pick, which bound the models' buffers.
#[cfg(feature = "wgpu")]
pub(crate) fn check_wgpu() -> Result<DeviceLimits> {
    use burn::backend::wgpu::graphics::{AutoGraphicsApi, GraphicsApi};
    let api = AutoGraphicsApi::backend();
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: api.into(),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let named = std::env::var(WGPU_DEVICE_VAR)
        .ok()
        .and_then(|var| NamedAdapter::parse(&var).map(|named| (var, named)));
    if let Some((var, named)) = named {
        let adapters = futures_lite::future::block_on(instance.enumerate_adapters(api.into()));
        let Some(adapter) = named.pick(&adapters, adapter_kind) else {
            let seen: Vec<String> = adapters
                .iter()
                .map(|adapter| format!("{:?}", adapter.get_info().device_type))
                .collect();
            bail!(
                "wgpu has no {api:?} adapter {var}, which {WGPU_DEVICE_VAR} names (it sees [{}]): \
                 name one it sees, or unset {WGPU_DEVICE_VAR} for wgpu's default",
                seen.join(", ")
            );
        };
        return Ok(DeviceLimits::of_adapter(adapter));
    }
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        force_fallback_adapter: false,
        compatible_surface: None,
    };
    let adapter =
        futures_lite::future::block_on(instance.request_adapter(&options)).map_err(|e| {
            anyhow::anyhow!(
                "wgpu found no {api:?} adapter ({e}): --backend wgpu needs a {api:?} driver (on a \
                 machine without a GPU, Mesa's software one: Debian's mesa-vulkan-drivers); use \
                 --backend flex (the CPU) instead"
            )
        })?;
    Ok(DeviceLimits::of_adapter(&adapter))
}

#[cfg(feature = "wgpu")]
fn adapter_kind(adapter: &wgpu::Adapter) -> Option<AdapterKind> {
    use wgpu::DeviceType;
    match adapter.get_info().device_type {
        DeviceType::DiscreteGpu => Some(AdapterKind::Discrete),
        DeviceType::IntegratedGpu => Some(AdapterKind::Integrated),
        DeviceType::VirtualGpu => Some(AdapterKind::Virtual),
        DeviceType::Cpu => Some(AdapterKind::Cpu),
        DeviceType::Other => None,
    }
}

/// What loading a model must respect of the device it goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceLimits {
    /// The largest buffer the device allows, where it has a limit `spec` knows of.
    max_buffer_bytes: Option<u64>,
}

impl DeviceLimits {
    /// No limit known (flex; cuda, whose buffers are bounded by the GPU's memory alone).
    pub(crate) const NONE: Self = Self {
        max_buffer_bytes: None,
    };

    /// The limits of the wgpu adapter cubecl starts on: its largest storage buffer binding,
    /// which cubecl takes as its largest allocation. cubecl's Vulkan path lifts that limit on a
    /// device with 64-bit shader indexing, where this may then refuse a model the device could
    /// hold; lavapipe has none.
    #[cfg(feature = "wgpu")]
    fn of_adapter(adapter: &wgpu::Adapter) -> Self {
        Self {
            max_buffer_bytes: Some(adapter.limits().max_storage_buffer_binding_size),
        }
    }

    /// How `spec` loads a model whose projections the host path keeps in `format` onto this
    /// device: a model with a weight too large for its buffers is a clear error at load.
    pub(crate) fn load_options(self, format: WeightFormat) -> LoadOptions {
        LoadOptions {
            skinny_format: Some(format),
            max_buffer_bytes: self.max_buffer_bytes,
            ..Default::default()
        }
    }
}

/// The variable through which cubecl's default wgpu device can be named, spelled as its
/// `WgpuDevice`: `DiscreteGpu(0)`, `IntegratedGpu(1)`, `VirtualGpu(0)` or `Cpu`.
#[cfg(feature = "wgpu")]
const WGPU_DEVICE_VAR: &str = "CUBECL_WGPU_DEFAULT_DEVICE";

/// The kinds of adapter that `CUBECL_WGPU_DEFAULT_DEVICE` names (wgpu's `DeviceType`, less `Other`).
#[cfg(any(test, feature = "wgpu"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AdapterKind {
    Discrete,
    Integrated,
    Virtual,
    Cpu,
}

/// The adapter that `CUBECL_WGPU_DEFAULT_DEVICE` names: the `index`-th of its kind.
#[cfg(any(test, feature = "wgpu"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NamedAdapter {
    kind: AdapterKind,
    index: usize,
}

#[cfg(any(test, feature = "wgpu"))]
impl NamedAdapter {
    /// The device `var` names, as cubecl reads it; `None` where cubecl ignores the value
    /// (it then starts its default device).
    fn parse(var: &str) -> Option<Self> {
        if var == "Cpu" {
            return Some(Self {
                kind: AdapterKind::Cpu,
                index: 0,
            });
        }
        [
            ("DiscreteGpu(", AdapterKind::Discrete),
            ("IntegratedGpu(", AdapterKind::Integrated),
            ("VirtualGpu(", AdapterKind::Virtual),
        ]
        .into_iter()
        .find_map(|(prefix, kind)| {
            let index = var.strip_prefix(prefix)?.strip_suffix(')')?.parse().ok()?;
            Some(Self { kind, index })
        })
    }

    /// The adapter cubecl finds in `adapters`, whose kinds `kind` tells (`None` for wgpu's
    /// `Other`): the `index`-th of this kind, or failing that the `index`-th of no kind.
    fn pick<T>(self, adapters: &[T], kind: impl Fn(&T) -> Option<AdapterKind>) -> Option<&T> {
        let of = |wanted: Option<AdapterKind>| {
            adapters
                .iter()
                .filter(|adapter| kind(adapter) == wanted)
                .nth(self.index)
        };
        of(Some(self.kind)).or_else(|| of(None))
    }
}

#[cfg(test)]
mod tests {
    use super::{AdapterKind, NamedAdapter};

    #[test]
    fn named_wgpu_adapters_parse_as_cubecl_reads_them() {
        let named = |kind, index| Some(NamedAdapter { kind, index });
        assert_eq!(NamedAdapter::parse("Cpu"), named(AdapterKind::Cpu, 0));
        assert_eq!(
            NamedAdapter::parse("DiscreteGpu(1)"),
            named(AdapterKind::Discrete, 1)
        );
        assert_eq!(
            NamedAdapter::parse("IntegratedGpu(0)"),
            named(AdapterKind::Integrated, 0)
        );
        assert_eq!(
            NamedAdapter::parse("VirtualGpu(2)"),
            named(AdapterKind::Virtual, 2)
        );
        // cubecl ignores these (and starts its default device).
        for ignored in [
            "",
            "cpu",
            "DiscreteGpu",
            "DiscreteGpu(x)",
            "DiscreteGpu(1",
            "Gpu(0)",
        ] {
            assert_eq!(NamedAdapter::parse(ignored), None, "{ignored:?}");
        }
    }

    #[test]
    fn a_named_wgpu_adapter_is_found_as_cubecl_finds_it() {
        use AdapterKind::{Cpu, Discrete};
        // lavapipe: one adapter of the CPU kind.
        let lavapipe = [Some(Cpu)];
        let cpu = NamedAdapter::parse("Cpu").unwrap();
        let gpu0 = NamedAdapter::parse("DiscreteGpu(0)").unwrap();
        let gpu1 = NamedAdapter::parse("DiscreteGpu(1)").unwrap();
        // Whether cubecl finds the named adapter among adapters of these kinds.
        let is_among = |named: NamedAdapter, kinds: &[Option<AdapterKind>]| {
            named.pick(kinds, |&kind| kind).is_some()
        };
        assert!(is_among(cpu, &lavapipe));
        assert!(!is_among(gpu0, &lavapipe));
        assert!(!is_among(cpu, &[]));
        assert!(is_among(gpu0, &[Some(Cpu), Some(Discrete)]));
        assert!(!is_among(gpu1, &[Some(Cpu), Some(Discrete)]));
        // Adapters of no kind stand in for a missing one, by the same index.
        assert!(is_among(gpu0, &[Some(Cpu), None]));
        assert!(!is_among(gpu1, &[Some(Cpu), None]));
        assert!(is_among(gpu1, &[None, None]));
        // Which one: the second discrete adapter, or the second of no kind.
        let adapters = [
            ("cpu", Some(Cpu)),
            ("a", Some(Discrete)),
            ("b", Some(Discrete)),
        ];
        assert_eq!(gpu1.pick(&adapters, |a| a.1), Some(&adapters[2]));
        let adapters = [("cpu", Some(Cpu)), ("x", None), ("y", None)];
        assert_eq!(gpu1.pick(&adapters, |a| a.1), Some(&adapters[2]));
        assert_eq!(gpu0.pick(&adapters, |a| a.1), Some(&adapters[1]));
    }
}
