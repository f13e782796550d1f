//! The plugin ABI: the `#[repr(C)]` structs and function types a plugin compiles
//! against (`include/colocated.h` declares them, generated from this file).
//! Their layout is fixed for a major API version.

use std::ffi::c_void;
use std::os::raw::c_char;

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
