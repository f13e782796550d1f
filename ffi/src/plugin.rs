//! Plugin libraries: shared libraries that add native functions to a host's
//! registry when the host loads them (`colocated worker --plugin LIB`, or
//! `colocated_client_load_plugin`).
//!
//! The plugin ABI is self-contained: a plugin uses the types and constants of
//! `colocated.h` but calls no function of libcolocated, so it links against
//! nothing and works in any process that loads it — the worker executable, which
//! cannot export the C ABI's symbols, as well as an application that embeds the
//! library. Everything a plugin needs arrives through the registrar and the call
//! structs, and the data it reads and writes is plain memory.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::c_void;
use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Mutex;

use colocated_core::{
    Buffer, Client, DType, Device, Error, ExecutionContext, ExternalReference, HostBufferSemantics,
    OutputShard, Result,
};

use crate::boundary;
use crate::client::colocated_client;
use crate::error::{colocated_error, colocated_error_code};
use crate::handle::{colocated_string_view, handle, slice};
use crate::COLOCATED_API_VERSION;

/// One shard a plugin function reads or writes, on a device of this host.
///
/// Its layout is fixed for a major API version (`inputs` and `outputs` of
/// `colocated_plugin_call` are arrays of it, indexed with the plugin's
/// `sizeof`); `struct_size` lets a plugin check that.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_plugin_array {
    /// `sizeof(colocated_plugin_array)`.
    pub struct_size: usize,
    /// Element type: a `colocated_dtype` value (never `COLOCATED_DTYPE_STRING`:
    /// plugin functions take and make dense arrays only).
    pub dtype: u32,
    /// The shard's dimensions, `num_dims` of them (borrowed for the call).
    pub dims: *const i64,
    /// Number of dimensions (0 for a scalar).
    pub num_dims: usize,
    /// The elements, row-major, valid only during the call; NULL when `size` is
    /// 0. An input's data is read-only, and aligned for its dtype unless an
    /// application made that buffer zero-copy from less aligned memory. An
    /// output's data is memory the host allocated for this call, zero-filled and
    /// 64-byte aligned, that the function fills.
    pub data: *mut c_void,
    /// Bytes at `data`: the dtype's size times the product of `dims`.
    pub size: usize,
    /// The device the shard lives on: its index among this host's devices (as
    /// `colocated_device_local_hardware_id`).
    pub device: u32,
}

/// What a plugin function sees of one call; valid only during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_plugin_call {
    /// `sizeof(colocated_plugin_call)` of the host; fields may be appended in
    /// later minor versions.
    pub struct_size: usize,
    /// This host's input shards, argument-major: argument 0's shards in its
    /// sharding's device order, then argument 1's, ...
    pub inputs: *const colocated_plugin_array,
    /// Number of `inputs`.
    pub num_inputs: usize,
    /// For each argument, how many of `inputs` belong to it.
    pub input_shard_counts: *const usize,
    /// Number of arguments (entries of `input_shard_counts`).
    pub num_arguments: usize,
    /// The output shards this host must produce, in the program's order (output
    /// 0's shards in its sharding's device order, then output 1's, ...). Every
    /// one is allocated and zero-filled; the function writes their `data` only.
    pub outputs: *mut colocated_plugin_array,
    /// Number of `outputs`.
    pub num_outputs: usize,
    /// Where a failing function writes a NUL-terminated UTF-8 message (truncated
    /// to `message_capacity` bytes, NUL included).
    pub message: *mut c_char,
    /// Bytes available at `message`.
    pub message_capacity: usize,
}

/// A plugin's native function: returns 0 when it filled every output, else a
/// `colocated_error_code` after writing a message into `call->message`; the
/// execution then fails with that code and message. It may run on several
/// executor threads at once (see `colocated_plugin_registrar`).
pub type colocated_plugin_function =
    Option<unsafe extern "C" fn(user_data: *mut c_void, call: *const colocated_plugin_call) -> u32>;

/// The type of the function every plugin exports as `colocated_plugin_init`
/// (declare it with `COLOCATED_PLUGIN_EXPORT`).
pub type colocated_plugin_init_fn =
    Option<unsafe extern "C" fn(registrar: *const colocated_plugin_registrar) -> u32>;

/// What a plugin's `colocated_plugin_init` receives: the means to register its
/// native functions in the registry of the host that loads it.
///
/// The plugin contract:
/// - A plugin is a shared library that exports `colocated_plugin_init` (type
///   `colocated_plugin_init_fn`). It uses this header's types and constants but
///   calls no libcolocated function, so it needs no symbol of the process that
///   loads it and need not link against libcolocated.
/// - Who loads it: a worker loads the libraries its operator names at start
///   (`colocated worker --plugin LIB`), an application those it passes to
///   `colocated_client_load_plugin`. A controller can never make a host load a
///   library.
/// - Init: `colocated_plugin_init` runs once per load, on the loading thread,
///   before any function it registers runs; the same plugin loaded into several
///   clients of one process is initialised once per client. It should check
///   that `api_version >> 16` equals `COLOCATED_API_VERSION_MAJOR` and that
///   `struct_size` covers the fields it uses, then call `register_function` for
///   each function. The registrar and its `context` are valid only during the
///   call, and only on that thread. It returns 0, or a `colocated_error_code` to
///   fail the load: then none of its functions is added.
/// - `register_function` copies `name` (`name_size` bytes of UTF-8, not empty;
///   programs name it in the payload of a `native` program) and returns 0,
///   `COLOCATED_INVALID_ARGUMENT` for a bad name or a NULL function, or
///   `COLOCATED_ALREADY_EXISTS` for a name this plugin registered already. A name
///   the host's registry holds already fails the load, after init, with
///   `COLOCATED_ALREADY_EXISTS`; functions of the plugin added before that one
///   stay registered.
/// - Functions run on the host's executor threads, several at once (executions
///   of different streams run concurrently), each with the `user_data` it was
///   registered with: a function and its user data must be thread-safe.
/// - Errors: a function returns 0 or a `colocated_error_code` with a message (see
///   `colocated_plugin_function`). Neither init nor a function may let a C++
///   exception or a `longjmp` out.
/// - Lifetime: the library is never unloaded, and user data is never released:
///   the host may call a function until the process ends.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_plugin_registrar {
    /// `sizeof(colocated_plugin_registrar)` of the host; fields may be appended
    /// in later minor versions.
    pub struct_size: usize,
    /// The host's `colocated_api_version()`: `(major << 16) | minor`.
    pub api_version: u32,
    /// The host's state, passed back to `register_function`.
    pub context: *mut c_void,
    /// Adds `function` (called with `user_data`) under `name`; see above.
    pub register_function: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            name: *const u8,
            name_size: usize,
            function: colocated_plugin_function,
            user_data: *mut c_void,
        ) -> u32,
    >,
}

/// The symbol every plugin exports.
const INIT_SYMBOL: &str = "colocated_plugin_init";

/// Bytes a failing plugin function may write into `colocated_plugin_call::message`
/// (on the stack of every call).
const MESSAGE_CAPACITY: usize = 1024;

/// Alignment of the output memory the host allocates (a cache line; enough for
/// any dtype and for vector loads).
const OUTPUT_ALIGNMENT: usize = 64;

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
        return Err(match colocated_error_code::to_core(code) {
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

/// Loads the plugin library `path` (UTF-8; a path without a directory names a
/// file in the current directory) and adds the native functions it registers to
/// the local host of `client` (see `colocated_plugin_registrar` for the plugin
/// contract). Nothing is taken over; `path` is read during the call. The library
/// stays loaded for the life of the process once its `colocated_plugin_init` has
/// run.
///
/// Blocking: runs the library's initialisers and its `colocated_plugin_init` on
/// the calling thread.
/// Errors: `invalid_argument` for a NULL client, an empty or non-UTF-8 path, a
/// file the loader refuses (with the loader's message) or a library that does
/// not export `colocated_plugin_init`; `not_found` for a file that does not
/// exist; the code `colocated_plugin_init` returned when it fails;
/// `already_exists` for a function name the registry holds already (the plugin's
/// functions registered before it stay). Messages name the path.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_load_plugin(
    client: *const colocated_client,
    path: colocated_string_view,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let path = path.to_str("path")?;
        load_plugin(&c.shell.client, Path::new(path)).map(drop)
    })
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
            let bytes = slice(name, name_size, "name")?;
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

/// The registrar's `register_function`.
unsafe extern "C" fn register_function(
    context: *mut c_void,
    name: *const u8,
    name_size: usize,
    function: colocated_plugin_function,
    user_data: *mut c_void,
) -> u32 {
    if context.is_null() {
        return colocated_error_code::COLOCATED_INVALID_ARGUMENT as u32;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `context` is the `Collector` of the `load_plugin` call whose
        // `colocated_plugin_init` is running (the contract allows no other use).
        let collector = unsafe { &*context.cast::<Collector>() };
        // SAFETY: the caller passes `name_size` readable bytes at `name`.
        unsafe { collector.add(name, name_size, function, user_data) }
    }));
    match outcome {
        Ok(Ok(())) => colocated_error_code::COLOCATED_OK as u32,
        Ok(Err(e)) => colocated_error_code::from_core(e.code()) as u32,
        Err(_) => colocated_error_code::COLOCATED_INTERNAL as u32,
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
        memory.push(OutputMemory::zeroed(
            shard.dtype.dense_byte_size(&shard.dims)?,
        )?);
    }
    let mut output_arrays: Vec<colocated_plugin_array> = shards
        .iter()
        .zip(&memory)
        .map(|(shard, m)| plugin_array(shard.dtype, &shard.dims, m.data(), m.len, &shard.device))
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
    // buffers are made from `memory` and the shard specs alone.
    let client = ctx.client();
    for (i, (shard, memory)) in shards.iter().zip(memory).enumerate() {
        ctx.set_output(i, memory.into_buffer(client, shard)?)?;
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
    match colocated_error_code::to_core(code) {
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

/// Zero-filled, aligned memory for one output shard. It becomes the shard's
/// buffer without a copy and is freed when that buffer's last user lets go.
struct OutputMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the memory is owned exclusively by this value; nothing else frees it.
unsafe impl Send for OutputMemory {}

impl OutputMemory {
    fn zeroed(len: usize) -> Result<OutputMemory> {
        let Some(layout) = OutputMemory::layout(len)? else {
            return Ok(OutputMemory {
                ptr: NonNull::dangling(),
                len: 0,
            });
        };
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::resource_exhausted(format!("cannot allocate {len} bytes for an output shard"))
        })?;
        Ok(OutputMemory { ptr, len })
    }

    /// The allocation's layout; `None` for no bytes (nothing is allocated).
    fn layout(len: usize) -> Result<Option<Layout>> {
        if len == 0 {
            return Ok(None);
        }
        Layout::from_size_align(len, OUTPUT_ALIGNMENT)
            .map(Some)
            .map_err(|_| {
                Error::invalid_argument(format!("an output shard of {len} bytes is too large"))
            })
    }

    /// The pointer handed to the plugin: NULL when there are no bytes.
    fn data(&self) -> *mut c_void {
        if self.len == 0 {
            std::ptr::null_mut()
        } else {
            self.ptr.as_ptr().cast()
        }
    }

    /// The buffer of `shard` over this memory (no copy).
    fn into_buffer(self, client: &Client, shard: &OutputShard) -> Result<Buffer> {
        // SAFETY: the memory is valid for `len` bytes until `self` is dropped,
        // which the "done with host buffer" callback below does once nothing
        // reads the buffer's data; nothing writes it after the plugin's call. On
        // an error `self` is dropped here and the memory freed.
        let (buffer, done) = unsafe {
            Buffer::from_host_raw(
                client,
                self.ptr.as_ptr(),
                self.len,
                shard.dtype,
                &shard.dims,
                &shard.device,
                None,
                HostBufferSemantics::ImmutableZeroCopy,
            )
        }?;
        done.on_ready(move |_| drop(self));
        Ok(buffer)
    }
}

impl Drop for OutputMemory {
    fn drop(&mut self) {
        if let Ok(Some(layout)) = OutputMemory::layout(self.len) {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
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
