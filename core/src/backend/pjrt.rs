//! A PJRT plugin as a device backend: its devices and memories join a host,
//! and buffers on them hold the plugin's buffers.

use std::path::PathBuf;
use std::sync::Arc;

use colocated_pjrt as pjrt;

use crate::dtype::DType;
use crate::error::{Error, ErrorCode, Result};

/// A value of a PJRT plugin's create option.
pub use colocated_pjrt::Value as PjrtValue;

/// A PJRT plugin for a host's devices: the library and its client's create
/// options.
#[derive(Clone, Debug)]
pub struct PjrtOptions {
    /// The plugin library (`pjrt_c_api_cpu_plugin.so`, `xla_cuda_plugin.so`, ...).
    pub plugin: PathBuf,
    /// The plugin client's create options (for XLA's CPU plugin
    /// `cpu_device_count`; for the CUDA plugin its allocator's).
    pub options: Vec<(String, PjrtValue)>,
}

/// The environment variable naming the PJRT plugin of a process's default
/// client (and of a worker without `--pjrt-plugin`): a library path, or a
/// name that `PJRT_NAMES_AND_LIBRARY_PATHS` maps to one.
pub const PJRT_PLUGIN_ENV: &str = "COLOCATED_PJRT_PLUGIN";

/// JAX's list of plugins: `name:path,name:path`.
pub const PJRT_NAMES_ENV: &str = "PJRT_NAMES_AND_LIBRARY_PATHS";

/// The library of the plugin `spec`: a path (it has a `/` or ends in `.so`),
/// or a name in `names_and_paths` (JAX's `PJRT_NAMES_AND_LIBRARY_PATHS` form,
/// `name:path,...`). `not_found`, listing the names there are, for a name
/// that is not among them.
pub fn find_plugin(spec: &str, names_and_paths: Option<&str>) -> Result<PathBuf> {
    if spec.is_empty() {
        return Err(Error::invalid_argument(
            "a PJRT plugin's name or path is empty",
        ));
    }
    if spec.contains('/') || spec.ends_with(".so") || spec.ends_with(".dylib") {
        return Ok(PathBuf::from(spec));
    }
    let pairs: Vec<(&str, &str)> = names_and_paths
        .unwrap_or("")
        .split(',')
        .filter_map(|pair| pair.split_once(':'))
        .map(|(n, p)| (n.trim(), p.trim()))
        .collect();
    pairs
        .iter()
        .find(|(name, _)| *name == spec)
        .map(|(_, path)| PathBuf::from(path))
        .ok_or_else(|| {
            let names: Vec<&str> = pairs.iter().map(|(n, _)| *n).collect();
            Error::not_found(format!(
                "no PJRT plugin named '{spec}': {PJRT_NAMES_ENV} names {names:?}; give the \
                 plugin library's path instead"
            ))
        })
}

impl PjrtOptions {
    /// The options of the plugin `spec` (a path, or a name that
    /// [`PJRT_NAMES_ENV`] maps to one, as [`find_plugin`] reads it) with the
    /// create `options`: the one rule every SDK applies to what its caller
    /// gives. `None` without a plugin; `invalid_argument` for options without
    /// one; `not_found` for an unknown name.
    pub fn of(
        spec: Option<&str>,
        options: Vec<(String, PjrtValue)>,
    ) -> Result<Option<PjrtOptions>> {
        let Some(spec) = spec else {
            if !options.is_empty() {
                return Err(Error::invalid_argument(
                    "PJRT create options need a PJRT plugin",
                ));
            }
            return Ok(None);
        };
        let names = std::env::var(PJRT_NAMES_ENV).ok();
        Ok(Some(PjrtOptions {
            plugin: find_plugin(spec, names.as_deref())?,
            options,
        }))
    }
}

/// The plugin the environment names ([`PJRT_PLUGIN_ENV`]), if any.
pub fn plugin_from_env() -> Result<Option<PjrtOptions>> {
    let Some(spec) = std::env::var_os(PJRT_PLUGIN_ENV) else {
        return Ok(None);
    };
    let spec = spec
        .to_str()
        .ok_or_else(|| Error::invalid_argument(format!("{PJRT_PLUGIN_ENV} is not valid UTF-8")))?;
    let names = std::env::var(PJRT_NAMES_ENV).ok();
    Ok(Some(PjrtOptions {
        plugin: find_plugin(spec, names.as_deref())?,
        options: Vec::new(),
    }))
}

/// A plugin's client on this host, and the name its devices go by.
pub(crate) struct PjrtBackend {
    client: pjrt::Client,
    name: String,
    identity: String,
}

impl PjrtBackend {
    /// Loads the plugin (once per process) and makes a client on it.
    pub(crate) fn open(options: &PjrtOptions) -> Result<Arc<PjrtBackend>> {
        let plugin = pjrt::Plugin::load(&options.plugin).map_err(to_error)?;
        let client = pjrt::Client::create(&plugin, &options.options).map_err(|e| {
            to_error(e).context(format!("PJRT plugin {}", options.plugin.display()))
        })?;
        if client.devices().is_empty() {
            return Err(Error::failed_precondition(format!(
                "PJRT plugin {} has no devices here",
                options.plugin.display()
            )));
        }
        // "cpu" names this runtime's CPU devices; a plugin whose platform is
        // "cpu" too (XLA's CPU plugin) goes by "pjrt_cpu".
        let name = match client.platform_name() {
            "cpu" => "pjrt_cpu".to_string(),
            other => other.to_string(),
        };
        let (major, minor) = plugin.api_version();
        let xla = plugin
            .attributes()
            .unwrap_or_default()
            .into_iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("xla_version", PjrtValue::Int64(n)) => Some(n.to_string()),
                ("xla_version", PjrtValue::String(s)) => Some(s),
                _ => None,
            })
            .unwrap_or_else(|| "unknown".to_string());
        let identity = format!(
            "{} plugin {} (PJRT API {major}.{minor}, XLA {xla})",
            client.platform_name(),
            match client.platform_version() {
                "" => "of no stated version",
                v => v,
            }
        );
        Ok(Arc::new(PjrtBackend {
            client,
            name,
            identity,
        }))
    }

    /// The plugin's client.
    pub(crate) fn client(&self) -> &pjrt::Client {
        &self.client
    }

    /// The backend's name (its platform, or `pjrt_cpu`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The platform (`"cpu"`, `"cuda"`, ...).
    pub(crate) fn platform(&self) -> &str {
        self.client.platform_name()
    }

    /// Which plugin this is, as far as its compiled executables go: its
    /// platform, platform version, PJRT API version and XLA version. An
    /// executable it serialized loads only where this is the same.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }
}

/// A plugin device of a host: the plugin's device, and the memory of each of
/// the device's memory spaces.
pub(crate) struct PjrtDevice {
    backend: Arc<PjrtBackend>,
    device: pjrt::Device,
    /// `(memory space id, the plugin's memory)`.
    memories: Vec<(u32, pjrt::Memory)>,
}

impl PjrtDevice {
    pub(crate) fn new(
        backend: Arc<PjrtBackend>,
        device: pjrt::Device,
        memories: Vec<(u32, pjrt::Memory)>,
    ) -> PjrtDevice {
        PjrtDevice {
            backend,
            device,
            memories,
        }
    }

    pub(crate) fn backend(&self) -> &Arc<PjrtBackend> {
        &self.backend
    }

    /// The plugin's device.
    pub(crate) fn device(&self) -> &pjrt::Device {
        &self.device
    }

    /// The plugin's memory of memory space `space` of this device.
    pub(crate) fn memory_for(&self, space: u32) -> Result<&pjrt::Memory> {
        self.memories
            .iter()
            .find(|(id, _)| *id == space)
            .map(|(_, m)| m)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "memory space {space} is not a memory of PJRT device {}",
                    self.device.id()
                ))
            })
    }
}

/// A plugin buffer as a buffer's data. The plugin frees it when the last
/// holder lets go.
pub(crate) struct DeviceData {
    pub(crate) buffer: pjrt::Buffer,
    backend: Arc<PjrtBackend>,
}

impl DeviceData {
    pub(crate) fn new(buffer: pjrt::Buffer, backend: &Arc<PjrtBackend>) -> DeviceData {
        DeviceData {
            buffer,
            backend: backend.clone(),
        }
    }

    /// Whether the data lives in `backend`'s client.
    pub(crate) fn is_of(&self, backend: &Arc<PjrtBackend>) -> bool {
        Arc::ptr_eq(&self.backend, backend)
    }
}

/// The runtime's error for a plugin's.
pub(crate) fn to_error(e: pjrt::Error) -> Error {
    use pjrt::Code;
    let code = match e.code() {
        Code::Cancelled => ErrorCode::Cancelled,
        Code::InvalidArgument | Code::OutOfRange => ErrorCode::InvalidArgument,
        Code::DeadlineExceeded => ErrorCode::DeadlineExceeded,
        Code::NotFound => ErrorCode::NotFound,
        Code::AlreadyExists => ErrorCode::AlreadyExists,
        Code::PermissionDenied => ErrorCode::PermissionDenied,
        Code::ResourceExhausted => ErrorCode::ResourceExhausted,
        Code::FailedPrecondition | Code::Aborted => ErrorCode::FailedPrecondition,
        Code::Unimplemented => ErrorCode::Unimplemented,
        Code::Unavailable => ErrorCode::Unavailable,
        Code::Unauthenticated => ErrorCode::Unauthenticated,
        Code::Unknown | Code::Internal | Code::DataLoss => ErrorCode::Internal,
    };
    Error::new(code, e.message())
}

/// The plugin's element type of `dtype`; strings have none.
pub(crate) fn element_type(dtype: DType) -> Result<pjrt::ElementType> {
    use pjrt::ElementType as E;
    Ok(match dtype {
        DType::Bool => E::Pred,
        DType::I8 => E::S8,
        DType::I16 => E::S16,
        DType::I32 => E::S32,
        DType::I64 => E::S64,
        DType::U8 => E::U8,
        DType::U16 => E::U16,
        DType::U32 => E::U32,
        DType::U64 => E::U64,
        DType::F16 => E::F16,
        DType::BF16 => E::BF16,
        DType::F32 => E::F32,
        DType::F64 => E::F64,
        DType::String => {
            return Err(Error::invalid_argument(
                "string buffers live on CPU devices only, not on a PJRT plugin's devices",
            ))
        }
    })
}

/// The dtype of a plugin element type.
pub(crate) fn dtype_of(t: pjrt::ElementType) -> DType {
    use pjrt::ElementType as E;
    match t {
        E::Pred => DType::Bool,
        E::S8 => DType::I8,
        E::S16 => DType::I16,
        E::S32 => DType::I32,
        E::S64 => DType::I64,
        E::U8 => DType::U8,
        E::U16 => DType::U16,
        E::U32 => DType::U32,
        E::U64 => DType::U64,
        E::F16 => DType::F16,
        E::BF16 => DType::BF16,
        E::F32 => DType::F32,
        E::F64 => DType::F64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_is_found_by_path_or_by_jax_s_name() {
        let names = Some("cuda:/opt/cuda_plugin.so, tpu:/opt/libtpu.so");
        assert_eq!(
            find_plugin("./p.so", None).unwrap(),
            PathBuf::from("./p.so")
        );
        assert_eq!(
            find_plugin("tpu", names).unwrap(),
            PathBuf::from("/opt/libtpu.so")
        );
        let e = find_plugin("rocm", names).unwrap_err();
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert!(e.message().contains("\"cuda\""), "{e}");
        assert_eq!(
            find_plugin("", None).unwrap_err().code(),
            ErrorCode::InvalidArgument
        );
    }
}
