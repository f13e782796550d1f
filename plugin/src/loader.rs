//! The loader: opens a plugin library, runs its `colocated_plugin_init` with a
//! registrar, and registers each function it registered as a native function of
//! a client, which runs it over the call structs of [`crate::abi`].

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use colocated_core::{
    Buffer, Client, DType, Device, Error, ErrorCode, ExecutionContext, ExternalReference,
    HostMemory, Result,
};

use crate::abi::{
    colocated_plugin_array, colocated_plugin_call, colocated_plugin_function,
    colocated_plugin_init_fn, colocated_plugin_registrar,
};
use crate::COLOCATED_API_VERSION;

/// The symbol every plugin exports.
const INIT_SYMBOL: &str = "colocated_plugin_init";

/// Bytes a failing plugin function may write into `colocated_plugin_call::message`
/// (on the stack of every call).
const MESSAGE_CAPACITY: usize = 1024;

/// Loads the plugin library at `path` and adds the native functions it
/// registers to `client`'s local host; returns their names, in the order the
/// plugin registered them.
///
/// A path without a directory (`libfoo.so`) names a file in the current
/// directory: the loader's search path is never consulted. The library stays
/// loaded for the life of the process once its `colocated_plugin_init` has run.
///
/// Blocking: runs the plugin's initialisers and `colocated_plugin_init` on the
/// calling thread.
/// Errors: `not_found` for a file that does not exist; `invalid_argument` for an
/// empty path, a file the loader refuses (with its message), or a library that
/// does not export `colocated_plugin_init`; the code `colocated_plugin_init`
/// returned when it fails; `already_exists` for a name the registry holds already
/// (functions registered before it stay). Every message names the path.
pub fn load_plugin(client: &Client, path: &Path) -> Result<Vec<String>> {
    let path = plugin_path(path)?;
    let shown = path.display();
    let library = open_library(&path)?;
    // SAFETY: the plugin contract gives the symbol the type of
    // `colocated_plugin_init_fn`, whose `Option` also covers a symbol at address 0.
    let init = match unsafe { library.get::<colocated_plugin_init_fn>(INIT_SYMBOL.as_bytes()) } {
        Ok(symbol) => *symbol,
        Err(e) => {
            return Err(Error::invalid_argument(format!(
                "plugin library {shown} does not export {INIT_SYMBOL}: {e}"
            )))
        }
    };
    let Some(init) = init else {
        return Err(Error::invalid_argument(format!(
            "plugin library {shown} exports {INIT_SYMBOL} at address 0"
        )));
    };
    // From here on the plugin's code runs on our behalf and may keep anything of
    // it alive (threads, the functions it registers): the library is never
    // unloaded.
    std::mem::forget(library);
    let collector = Collector::default();
    let registrar = colocated_plugin_registrar {
        struct_size: std::mem::size_of::<colocated_plugin_registrar>(),
        api_version: COLOCATED_API_VERSION,
        context: (&collector as *const Collector).cast_mut().cast(),
        register_function: Some(register_function),
    };
    // SAFETY: the plugin contract: `init` takes a registrar that is valid during
    // the call, which `registrar` and `collector` are.
    let code = unsafe { init(&registrar) };
    let Collected {
        registrations,
        refused,
    } = collector
        .0
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if code != 0 {
        let mut message = format!("{INIT_SYMBOL} of plugin library {shown} failed");
        if !refused.is_empty() {
            message.push_str(&format!(" (refused: {})", refused.join("; ")));
        }
        return Err(match ErrorCode::from_u32(code) {
            Some(code) => Error::new(code, message),
            None => Error::internal(format!(
                "{message} with {code}, which is not a colocated_error_code"
            )),
        });
    }
    for reason in &refused {
        tracing::warn!(plugin = %shown, "a registration was refused: {reason}");
    }
    let mut names = Vec::with_capacity(registrations.len());
    for Registration { name, function } in registrations {
        let captured = name.clone();
        client
            .register_native_function(&name, move |ctx| {
                call_plugin_function(&captured, function, ctx)
            })
            .map_err(|e| e.context(format!("plugin library {shown}")))?;
        names.push(name);
    }
    Ok(names)
}

/// The path handed to the loader: a bare file name is made relative to the
/// current directory, so the loader's search path is never consulted.
fn plugin_path(path: &Path) -> Result<PathBuf> {
    if path.as_os_str().is_empty() {
        return Err(Error::invalid_argument("a plugin library's path is empty"));
    }
    Ok(match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => path.to_path_buf(),
        _ => Path::new(".").join(path),
    })
}

fn open_library(path: &Path) -> Result<libloading::Library> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::not_found(format!(
                "plugin library {shown} does not exist"
            )))
        }
        Err(e) => {
            return Err(Error::invalid_argument(format!(
                "cannot read plugin library {shown}: {e}"
            )))
        }
        Ok(metadata) if metadata.is_dir() => {
            return Err(Error::invalid_argument(format!(
                "plugin library {shown} is a directory"
            )))
        }
        Ok(_) => {}
    }
    // SAFETY: loading a library runs its initialisers. Which library is loaded is
    // the choice of the worker's operator or of the embedding application (never
    // of a controller), who vouch for its code.
    unsafe { load(path) }
        .map_err(|e| Error::invalid_argument(format!("cannot load plugin library {shown}: {e}")))
}

/// Binds every symbol now (a library with an unresolved symbol fails to load
/// instead of failing in the middle of a call), and keeps the plugin's symbols
/// out of the process's global namespace.
#[cfg(unix)]
unsafe fn load(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    Library::open(Some(path), RTLD_NOW | RTLD_LOCAL).map(Into::into)
}

#[cfg(not(unix))]
unsafe fn load(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    libloading::Library::new(path)
}

/// A function a plugin registered, with its user data.
#[derive(Clone, Copy)]
struct PluginFunction {
    function: unsafe extern "C" fn(*mut c_void, *const colocated_plugin_call) -> u32,
    user_data: *mut c_void,
}

// SAFETY: the plugin contract (`colocated_plugin_registrar`) requires a
// registered function to be callable with its user data from any thread,
// concurrently, and the library is never unloaded, so both pointers stay valid
// for the life of the process.
unsafe impl Send for PluginFunction {}
// SAFETY: as above.
unsafe impl Sync for PluginFunction {}

struct Registration {
    name: String,
    function: PluginFunction,
}

#[derive(Default)]
struct Collected {
    registrations: Vec<Registration>,
    /// Why each refused registration was refused (the plugin only sees a code).
    refused: Vec<String>,
}

/// The registrar's context: what `colocated_plugin_init` registers. A mutex,
/// although the contract keeps registration on the loading thread, so that a
/// plugin breaking it cannot cause a data race.
#[derive(Default)]
struct Collector(Mutex<Collected>);

impl Collector {
    /// Records a registration, or says why it is refused.
    ///
    /// # Safety
    /// `name` is valid for `name_size` reads (or NULL).
    unsafe fn add(
        &self,
        name: *const u8,
        name_size: usize,
        function: colocated_plugin_function,
        user_data: *mut c_void,
    ) -> Result<()> {
        let mut collected = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let outcome = (|| {
            let bytes = name_bytes(name, name_size)?;
            let name = std::str::from_utf8(bytes).map_err(|e| {
                Error::invalid_argument(format!(
                    "the name \"{}\" is not UTF-8: {e}",
                    bytes.escape_ascii()
                ))
            })?;
            if name.is_empty() {
                return Err(Error::invalid_argument("a function name must not be empty"));
            }
            let Some(function) = function else {
                return Err(Error::invalid_argument(format!(
                    "the function of '{name}' is NULL"
                )));
            };
            if collected.registrations.iter().any(|r| r.name == name) {
                return Err(Error::already_exists(format!(
                    "'{name}' was registered twice"
                )));
            }
            Ok(Registration {
                name: name.to_string(),
                function: PluginFunction {
                    function,
                    user_data,
                },
            })
        })();
        match outcome {
            Ok(registration) => {
                collected.registrations.push(registration);
                Ok(())
            }
            Err(e) => {
                collected.refused.push(e.message().to_string());
                Err(e)
            }
        }
    }
}

/// The `name_size` bytes of a name a plugin registers.
///
/// # Safety
/// `name` is valid for `name_size` reads (or NULL).
unsafe fn name_bytes<'a>(name: *const u8, name_size: usize) -> Result<&'a [u8]> {
    if name_size == 0 {
        return Ok(&[]);
    }
    if name.is_null() {
        return Err(Error::invalid_argument(format!(
            "name is NULL but its count is {name_size}"
        )));
    }
    if name_size > isize::MAX as usize {
        return Err(Error::invalid_argument(format!(
            "name has an impossible count ({name_size})"
        )));
    }
    // SAFETY: the caller's guarantee; the pointer is not NULL.
    Ok(unsafe { std::slice::from_raw_parts(name, name_size) })
}

/// The registrar's `register_function`.
unsafe extern "C" fn register_function(
    context: *mut c_void,
    name: *const u8,
    name_size: usize,
    function: colocated_plugin_function,
    user_data: *mut c_void,
) -> u32 {
    if context.is_null() {
        return ErrorCode::InvalidArgument as u32;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `context` is the `Collector` of the `load_plugin` call whose
        // `colocated_plugin_init` is running (the contract allows no other use).
        let collector = unsafe { &*context.cast::<Collector>() };
        // SAFETY: the caller passes `name_size` readable bytes at `name`.
        unsafe { collector.add(name, name_size, function, user_data) }
    }));
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e.code() as u32,
        Err(_) => ErrorCode::Internal as u32,
    }
}

/// Runs plugin function `name` over the context's shards: pins each input, gives
/// the function zero-filled memory for each output shard, and makes the filled
/// memory the output buffers.
fn call_plugin_function(
    name: &str,
    function: PluginFunction,
    ctx: &mut ExecutionContext<'_>,
) -> Result<()> {
    let inputs = ctx.inputs();
    let mut pins: Vec<ExternalReference> = Vec::with_capacity(inputs.len());
    let mut input_arrays = Vec::with_capacity(inputs.len());
    for (i, buffer) in inputs.iter().enumerate() {
        check_dense_cpu(name, "input", i, buffer.dtype(), buffer.device())?;
        let pin = buffer.acquire_external_reference()?;
        let data = if pin.is_empty() {
            std::ptr::null_mut()
        } else {
            pin.data_ptr().cast()
        };
        input_arrays.push(plugin_array(
            buffer.dtype(),
            buffer.dims(),
            data,
            pin.len(),
            buffer.device(),
        ));
        pins.push(pin);
    }
    let shards = ctx.output_shards();
    let mut memory = Vec::with_capacity(shards.len());
    for (i, shard) in shards.iter().enumerate() {
        check_dense_cpu(name, "output shard", i, shard.dtype, &shard.device)?;
        memory.push(HostMemory::zeroed(
            shard.dtype.dense_byte_size(&shard.dims)?,
        )?);
    }
    let mut output_arrays: Vec<colocated_plugin_array> = shards
        .iter()
        .zip(&mut memory)
        .map(|(shard, m)| {
            // The plugin sees NULL for no bytes, never a dangling pointer.
            let data = if m.is_empty() {
                std::ptr::null_mut()
            } else {
                m.as_mut_slice().as_mut_ptr().cast()
            };
            plugin_array(shard.dtype, &shard.dims, data, m.len(), &shard.device)
        })
        .collect();
    let counts = ctx.input_shard_counts();
    let mut message = [0u8; MESSAGE_CAPACITY];
    let call = colocated_plugin_call {
        struct_size: std::mem::size_of::<colocated_plugin_call>(),
        inputs: input_arrays.as_ptr(),
        num_inputs: input_arrays.len(),
        input_shard_counts: counts.as_ptr(),
        num_arguments: counts.len(),
        outputs: output_arrays.as_mut_ptr(),
        num_outputs: output_arrays.len(),
        message: message.as_mut_ptr().cast(),
        message_capacity: message.len(),
    };
    // SAFETY: the plugin contract for `function`; every pointer in `call` is
    // valid during the call: the inputs' data is pinned by `pins`, the outputs'
    // memory is owned by `memory`, and the arrays, counts and message buffer live
    // in this frame.
    let code = unsafe { (function.function)(function.user_data, &call) };
    drop(pins);
    if code != 0 {
        return Err(call_error(name, code, &message));
    }
    // The descriptors in `output_arrays` are the plugin's to scribble on; the
    // buffers are made from `memory` and the shard specs alone, each in the
    // memory its output's sharding names.
    let client = ctx.client();
    for (i, (shard, memory)) in shards.iter().zip(memory).enumerate() {
        let buffer = Buffer::from_host_memory_in(
            client,
            memory,
            shard.dtype,
            &shard.dims,
            &shard.device,
            Some(&shard.memory),
        )?;
        ctx.set_output(i, buffer)?;
    }
    Ok(())
}

fn plugin_array(
    dtype: DType,
    dims: &[i64],
    data: *mut c_void,
    size: usize,
    device: &Device,
) -> colocated_plugin_array {
    colocated_plugin_array {
        struct_size: std::mem::size_of::<colocated_plugin_array>(),
        dtype: dtype as u32,
        dims: dims.as_ptr(),
        num_dims: dims.len(),
        data,
        size,
        device: device.local_hardware_id(),
    }
}

fn check_dense_cpu(
    name: &str,
    what: &str,
    index: usize,
    dtype: DType,
    device: &Device,
) -> Result<()> {
    if dtype == DType::String {
        return Err(Error::invalid_argument(format!(
            "plugin function '{name}': {what} {index} is a string array; plugin functions take and make dense arrays only"
        )));
    }
    if device.kind() != "cpu" {
        return Err(Error::invalid_argument(format!(
            "plugin function '{name}': {what} {index} is on {device}; plugin functions run on CPU devices only"
        )));
    }
    Ok(())
}

/// The error of a plugin function that returned `code` with `message` (its
/// buffer; NUL-terminated unless the plugin filled all of it).
fn call_error(name: &str, code: u32, message: &[u8]) -> Error {
    let end = message
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(message.len());
    let text = String::from_utf8_lossy(&message[..end]);
    match ErrorCode::from_u32(code) {
        Some(code) if text.is_empty() => Error::new(
            code,
            format!("plugin function '{name}' failed without a message"),
        ),
        Some(code) => Error::new(code, format!("plugin function '{name}': {text}")),
        None => Error::internal(format!(
            "plugin function '{name}' returned {code}, which is not a colocated_error_code: {text}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_file_name_is_taken_from_the_current_directory() {
        assert_eq!(
            plugin_path(Path::new("libfoo.so")).unwrap(),
            Path::new("./libfoo.so")
        );
        assert_eq!(
            plugin_path(Path::new("/opt/x/libfoo.so")).unwrap(),
            Path::new("/opt/x/libfoo.so")
        );
        assert_eq!(
            plugin_path(Path::new("lib/libfoo.so")).unwrap(),
            Path::new("lib/libfoo.so")
        );
        let err = plugin_path(Path::new("")).unwrap_err();
        assert_eq!(err.code(), colocated_core::ErrorCode::InvalidArgument);
    }

    #[test]
    fn a_plugin_message_is_read_up_to_its_nul_and_within_its_buffer() {
        let mut message = b"disk on fire\0garbage".to_vec();
        let e = call_error("f", 9, &message);
        assert_eq!(e.code(), colocated_core::ErrorCode::FailedPrecondition);
        assert_eq!(e.message(), "plugin function 'f': disk on fire");
        message = b"no terminator".to_vec();
        assert_eq!(
            call_error("f", 3, &message).message(),
            "plugin function 'f': no terminator"
        );
        assert!(call_error("f", 3, &[0; 8])
            .message()
            .contains("without a message"));
        let e = call_error("f", 42, b"odd\0");
        assert_eq!(e.code(), colocated_core::ErrorCode::Internal);
        assert!(
            e.message()
                .contains("42, which is not a colocated_error_code: odd"),
            "{e}"
        );
    }
}
