//! Loading a plugin: the library, its API table and its version.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Code, Error, Result};
use crate::sys;
use crate::types::{self, Value};

/// The oldest PJRT API minor version accepted. 0.57 was the last minor bump
/// that broke the ABI (argument structs rearranged); every entry this crate
/// calls exists since then, and an entry newer than a plugin is refused with
/// `unimplemented` (see [`Api::entry`]).
pub const MIN_API_MINOR: i32 = 57;

/// The API minor version of the vendored header the bindings come from.
pub const HEADER_API_MINOR: i32 = sys::PJRT_API_MINOR as i32;

/// A plugin's API table. Lives as long as the process (plugins are never
/// unloaded: none supports it).
pub(crate) struct Api {
    table: &'static sys::PJRT_Api,
}

/// An all-zero argument struct: every field of PJRT's argument structs is an
/// integer, a raw pointer, an optional function pointer or a union of those,
/// for which all zeros is a valid value (null, none, 0). The caller sets
/// `struct_size`.
pub(crate) fn args<T: Copy>() -> T {
    // SAFETY: see above; only instantiated with `sys` argument structs.
    unsafe { std::mem::zeroed() }
}

/// Calls the table entry `$name` with `&mut $args` (whose `struct_size` is set
/// here), turning the plugin's error into an [`Error`].
macro_rules! call {
    ($api:expr, $name:ident, $args:expr) => {{
        let api: &$crate::plugin::Api = $api;
        match $crate::plugin::entry!(api, $name) {
            Ok(f) => {
                let args = $args;
                // SAFETY: `f` is the plugin's entry for this argument struct,
                // and the struct is fully initialised.
                let raw = unsafe { f(args) };
                api.check(raw, stringify!($name))
            }
            Err(e) => Err(e),
        }
    }};
}

/// The table entry `$name`, or `unimplemented` when the plugin's table is too
/// short to hold it (an older plugin) or leaves it empty.
macro_rules! entry {
    ($api:expr, $name:ident) => {{
        let api: &$crate::plugin::Api = $api;
        let end = std::mem::offset_of!($crate::sys::PJRT_Api, $name) + std::mem::size_of::<usize>();
        match api.table().$name {
            Some(f) if end <= api.table().struct_size => Ok(f),
            _ => Err($crate::error::Error::unimplemented(format!(
                "{} is not implemented by this PJRT plugin (API 0.{})",
                stringify!($name),
                api.minor()
            ))),
        }
    }};
}

/// A zeroed argument struct `$ty` whose `struct_size` is `$size` (the
/// header's `*_STRUCT_SIZE`: the offset of its last field plus that field's
/// size, as plugins expect).
macro_rules! new_args {
    ($ty:ident, $size:ident) => {{
        let mut a: $crate::sys::$ty = $crate::plugin::args();
        a.struct_size = $crate::sys::$size as usize;
        a
    }};
}

pub(crate) use {call, entry, new_args};

impl Api {
    pub(crate) fn table(&self) -> &'static sys::PJRT_Api {
        self.table
    }

    pub(crate) fn minor(&self) -> i32 {
        self.table.pjrt_api_version.minor_version
    }

    /// `Ok` for a null error, else the error (destroyed here) with the call's name.
    pub(crate) fn check(&self, raw: *mut sys::PJRT_Error, call: &str) -> Result<()> {
        if raw.is_null() {
            Ok(())
        } else {
            // SAFETY: a non-null error the plugin just returned to us.
            Err(unsafe { Error::from_raw(self, raw, call) })
        }
    }

    /// Destroys a plugin error (null is allowed).
    pub(crate) fn destroy_error(&self, raw: *mut sys::PJRT_Error) {
        if raw.is_null() {
            return;
        }
        if let Some(f) = self.table.PJRT_Error_Destroy {
            let mut a: sys::PJRT_Error_Destroy_Args = args();
            a.struct_size = sys::PJRT_Error_Destroy_Args_STRUCT_SIZE as usize;
            a.error = raw;
            // SAFETY: `raw` is an error of this plugin that we own.
            unsafe { f(&mut a) };
        }
    }
}

/// A loaded and initialised PJRT plugin. Loaded once per path and process,
/// and never unloaded.
pub struct Plugin {
    api: Api,
    path: PathBuf,
    _library: libloading::Library,
}

// SAFETY: the API table is immutable and PJRT entries are thread-safe.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

/// Plugins loaded so far, by the path they were loaded from (canonical).
static LOADED: Mutex<Vec<Arc<Plugin>>> = Mutex::new(Vec::new());

impl Plugin {
    /// Loads the plugin at `path` (or returns the one already loaded from that
    /// file): opens the library, finds `GetPjrtApi`, checks the API version and
    /// calls `PJRT_Plugin_Initialize`.
    ///
    /// Errors: `not_found` for a missing file; `invalid_argument` for a
    /// directory, a file that is not a loadable library, or a library without
    /// `GetPjrtApi`; `failed_precondition` for a plugin of another major
    /// version or a minor version older than [`MIN_API_MINOR`]; the plugin's
    /// own error if initialisation fails.
    pub fn load(path: &Path) -> Result<Arc<Plugin>> {
        let shown = path.display().to_string();
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::new(
                    Code::NotFound,
                    format!("PJRT plugin {shown} does not exist"),
                ))
            }
            Err(e) => {
                return Err(Error::invalid_argument(format!(
                    "cannot read PJRT plugin {shown}: {e}"
                )))
            }
            Ok(m) if m.is_dir() => {
                return Err(Error::invalid_argument(format!(
                    "PJRT plugin {shown} is a directory"
                )))
            }
            Ok(_) => {}
        }
        let canonical = std::fs::canonicalize(path).map_err(|e| {
            Error::invalid_argument(format!("cannot resolve PJRT plugin {shown}: {e}"))
        })?;
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = loaded.iter().find(|p| p.path == canonical) {
            return Ok(p.clone());
        }
        // SAFETY: loading a library runs its initialisers. Which plugin is
        // loaded is the choice of the process's operator or embedding
        // application (never of a remote controller).
        let library = unsafe { open(&canonical) }.map_err(|e| {
            Error::invalid_argument(format!("cannot load PJRT plugin {shown}: {e}"))
        })?;
        type GetPjrtApi = unsafe extern "C" fn() -> *const sys::PJRT_Api;
        // SAFETY: the symbol, when present, has this signature (the PJRT ABI).
        let get = unsafe { library.get::<GetPjrtApi>(b"GetPjrtApi\0") }.map_err(|_| {
            Error::invalid_argument(format!(
                "{shown} is not a PJRT plugin: it exports no GetPjrtApi"
            ))
        })?;
        // SAFETY: as above; the table it returns lives as long as the library,
        // which is never unloaded.
        let table = unsafe { get() };
        if table.is_null() {
            return Err(Error::internal(format!(
                "PJRT plugin {shown}: GetPjrtApi returned no API table"
            )));
        }
        // SAFETY: non-null, and valid for the process's life (see above).
        let table: &'static sys::PJRT_Api = unsafe { &*table };
        let version_end = std::mem::offset_of!(sys::PJRT_Api, pjrt_api_version)
            + std::mem::size_of::<sys::PJRT_Api_Version>();
        if table.struct_size < version_end {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!("PJRT plugin {shown} has an API table too short to carry its version"),
            ));
        }
        let (major, minor) = (
            table.pjrt_api_version.major_version,
            table.pjrt_api_version.minor_version,
        );
        if major != sys::PJRT_API_MAJOR as i32 {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!(
                    "PJRT plugin {shown} implements PJRT API {major}.{minor}; this build accepts \
                     API {}.{MIN_API_MINOR} and newer minor versions of major {}",
                    sys::PJRT_API_MAJOR,
                    sys::PJRT_API_MAJOR
                ),
            ));
        }
        if minor < MIN_API_MINOR {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!(
                    "PJRT plugin {shown} implements PJRT API {major}.{minor}, older than the \
                     oldest this build accepts (0.{MIN_API_MINOR})"
                ),
            ));
        }
        let plugin = Arc::new(Plugin {
            api: Api { table },
            path: canonical,
            _library: library,
        });
        let mut init: sys::PJRT_Plugin_Initialize_Args = args();
        init.struct_size = sys::PJRT_Plugin_Initialize_Args_STRUCT_SIZE as usize;
        call!(&plugin.api, PJRT_Plugin_Initialize, &mut init)
            .map_err(|e| Error::new(e.code(), format!("PJRT plugin {shown}: {}", e.message())))?;
        loaded.push(plugin.clone());
        Ok(plugin)
    }

    /// The file it was loaded from (canonical).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The PJRT API version it implements, `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        let v = &self.api.table.pjrt_api_version;
        (v.major_version, v.minor_version)
    }

    /// The plugin's attributes (`xla_version`, `stablehlo_current_version`,
    /// `stablehlo_minimum_version`, ...); empty where the plugin has none.
    pub fn attributes(&self) -> Result<Vec<(String, Value)>> {
        let mut a: sys::PJRT_Plugin_Attributes_Args = args();
        a.struct_size = sys::PJRT_Plugin_Attributes_Args_STRUCT_SIZE as usize;
        match call!(&self.api, PJRT_Plugin_Attributes, &mut a) {
            Ok(()) => {}
            Err(e) if e.code() == Code::Unimplemented => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
        // SAFETY: the plugin returned `num_attributes` values living as long
        // as the process.
        Ok(unsafe { types::named_values(a.attributes, a.num_attributes) })
    }

    pub(crate) fn api(&self) -> &Api {
        &self.api
    }
}

/// Binds every symbol now and keeps the plugin's symbols out of the process's
/// global namespace (two plugins built from different XLA versions coexist).
#[cfg(unix)]
unsafe fn open(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    Library::open(Some(path), RTLD_NOW | RTLD_LOCAL).map(Into::into)
}

#[cfg(not(unix))]
unsafe fn open(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    libloading::Library::new(path)
}
