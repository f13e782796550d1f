//! Programs, the compiler, loaded executables, host callbacks and byte blobs.

use std::ffi::CString;
use std::sync::Arc;

use colocated_core::{
    ArraySpec, CompileOptions, Error, ExecuteOptions, LoadedExecutable, Program, Result,
};

use crate::array::{colocated_array, colocated_sharding};
use crate::buffer::{colocated_buffer, dtype_of};
use crate::client::{colocated_client, device_list, ClientShell};
use crate::device::colocated_device;
use crate::error::colocated_error;
use crate::event::colocated_event;
use crate::handle::{
    colocated_string_view, get, get_list, get_str, handle, put_box, read_versioned, slice, tagged,
    take, versioned,
};
use crate::host_callback::{colocated_bytes, colocated_loaded_host_callback};
use crate::stream::colocated_stream;
use crate::{boundary, boundary_void};

/// A compiled program, ready to run. Owned by the caller; destroy with
/// `colocated_loaded_executable_destroy` (executions in flight finish).
///
/// Thread-safety: every executable function may be called from any thread.
#[repr(C)]
pub struct colocated_loaded_executable {
    tag: u64,
    executable: LoadedExecutable,
    shell: Arc<ClientShell>,
    name: CString,
    fingerprint: CString,
    devices: Vec<*const colocated_device>,
}

// SAFETY: device pointers are borrowed from the shell this handle keeps alive.
unsafe impl Send for colocated_loaded_executable {}
// SAFETY: as above; immutable.
unsafe impl Sync for colocated_loaded_executable {}

tagged! { colocated_loaded_executable => 0xC010_CA7E_0000_0043 }

/// The spec of an array: dtype, global dims and sharding.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_array_spec {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// Element type (`colocated_dtype`).
    pub dtype: u32,
    /// Global dimensions (NULL for a scalar).
    pub dims: *const i64,
    /// Number of dimensions.
    pub num_dims: usize,
    /// Layout (required).
    pub sharding: *const colocated_sharding,
}
versioned!(colocated_array_spec, required: sharding, fields: [struct_size, dtype, dims, num_dims, sharding]);

/// A colocated program (SPEC: name, language, payload, specs, devices).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_program {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// A name for people and traces.
    pub name: colocated_string_view,
    /// Language tag: `"native"` (payload: the registered function's name).
    pub language: colocated_string_view,
    /// Payload bytes.
    pub payload: *const u8,
    /// Payload size.
    pub payload_size: usize,
    /// Input specs, one pointer per argument.
    pub input_specs: *const *const colocated_array_spec,
    /// Number of inputs.
    pub num_input_specs: usize,
    /// Output specs, one pointer per result.
    pub output_specs: *const *const colocated_array_spec,
    /// Number of outputs.
    pub num_output_specs: usize,
    /// The devices the program runs on (every spec's sharding uses exactly these).
    pub devices: *const *const colocated_device,
    /// Number of devices.
    pub num_devices: usize,
}
versioned!(colocated_program, required: num_devices,
    fields: [struct_size, name, language, payload, payload_size, input_specs, num_input_specs, output_specs, num_output_specs, devices, num_devices]);

/// Options of compilation and loading.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_compile_options {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// Host callbacks programs call by index (borrowed; the executable takes its own
    /// references).
    pub host_callbacks: *const *const colocated_loaded_host_callback,
    /// Number of host callbacks.
    pub num_host_callbacks: usize,
}
versioned!(colocated_compile_options, required: struct_size, fields: [struct_size, host_callbacks, num_host_callbacks]);

unsafe fn compile_options(options: *const colocated_compile_options) -> Result<CompileOptions> {
    let o = read_versioned(options, true)?;
    let host_callbacks = slice(o.host_callbacks, o.num_host_callbacks, "host_callbacks")?
        .iter()
        .enumerate()
        .map(|(i, c)| handle(*c, &format!("host_callbacks[{i}]")).map(|c| c.callback.clone()))
        .collect::<Result<Vec<_>>>()?;
    Ok(CompileOptions { host_callbacks })
}

pub(crate) unsafe fn specs(
    list: *const *const colocated_array_spec,
    n: usize,
    what: &str,
) -> Result<Vec<ArraySpec>> {
    slice(list, n, what)?
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let s = read_versioned(*s, false).map_err(|e| e.context(format!("{what}[{i}]")))?;
            let sharding = handle(s.sharding, "sharding")?;
            let dims = slice(s.dims, s.num_dims, "dims")?.to_vec();
            ArraySpec::new(dims, dtype_of(s.dtype)?, sharding.sharding.clone())
                .map_err(|e| e.context(format!("{what}[{i}]")))
        })
        .collect()
}

fn executable_handle(
    executable: LoadedExecutable,
    shell: Arc<ClientShell>,
) -> colocated_loaded_executable {
    let cstr = |s: &str| CString::new(s).unwrap_or_default();
    let devices = executable
        .devices()
        .iter()
        .map(|d| shell.device_handle(d))
        .collect();
    colocated_loaded_executable {
        tag: <colocated_loaded_executable as crate::handle::Tagged>::TAG,
        name: cstr(executable.name()),
        fingerprint: cstr(executable.fingerprint()),
        executable,
        shell,
        devices,
    }
}

/// Compiles `program` (`options` may be NULL). `*out` is caller owned.
/// Errors: `invalid_argument` (bad structs, specs not on the program's devices,
/// uneven splits, devices of another client), `unimplemented` (a language the
/// hosts lack), `not_found` (an unknown native function).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_compile(
    client: *const colocated_client,
    program: *const colocated_program,
    options: *const colocated_compile_options,
    out: *mut *mut colocated_loaded_executable,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let p = read_versioned(program, false)?;
        let program = Program {
            name: p.name.to_str("name")?.to_string(),
            language: p.language.to_str("language")?.to_string(),
            payload: slice(p.payload, p.payload_size, "payload")?.to_vec(),
            input_specs: specs(p.input_specs, p.num_input_specs, "input_specs")?,
            output_specs: specs(p.output_specs, p.num_output_specs, "output_specs")?,
            devices: device_list(p.devices, p.num_devices)?,
            output_structure: Vec::new(),
        };
        let options = compile_options(options)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let exe = c.shell.client.compile(program, options)?;
        put_box(out, executable_handle(exe, c.shell.clone()), "out")
    })
}

/// Compiles a StableHLO module (`module`, `module_size` bytes of MLIR text, as
/// `jax.jit(f).lower(...).as_text()` gives) for `devices` of one PJRT plugin
/// on one host: one device, or as many as the module's `mhlo.num_partitions`
/// for an SPMD module. The executable's inputs and outputs have the shapes,
/// dtypes and shardings of the module's `@main`. `*out` is caller owned.
/// Since API 1.5.
///
/// Errors: `invalid_argument` for a module the compiler refuses (its message),
/// CPU devices, or a device count the module does not take; `unimplemented`
/// for bytecode, replicas, dynamic shapes or devices of several hosts.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_compile_stablehlo(
    client: *const colocated_client,
    module: *const u8,
    module_size: usize,
    devices: *const *const colocated_device,
    num_devices: usize,
    out: *mut *mut colocated_loaded_executable,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let module = slice(module, module_size, "module")?;
        let devices = device_list(devices, num_devices)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let exe = c.shell.client.compile_stablehlo(module, &devices)?;
        put_box(out, executable_handle(exe, c.shell.clone()), "out")
    })
}

/// Checks whether `data` (`size` bytes) is a serialized executable this library can
/// load. Returns NULL if so, else an `invalid_argument` error whose message gives the
/// precise reason (truncated, magic, format version, non-zero reserved bytes,
/// corrupted).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_executable_is_compatible(
    data: *const u8,
    size: usize,
) -> *mut colocated_error {
    boundary(|| colocated_core::check_compatible(slice(data, size, "data")?))
}

/// Loads a serialized executable for `client` (`options` may be NULL; it must give
/// as many host callbacks as the executable was compiled with). `*out` is caller
/// owned. Errors: as `colocated_executable_is_compatible`, plus compile errors.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_deserialize_and_load(
    client: *const colocated_client,
    data: *const u8,
    size: usize,
    options: *const colocated_compile_options,
    out: *mut *mut colocated_loaded_executable,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let bytes = slice(data, size, "data")?;
        let options = compile_options(options)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let exe = c.shell.client.deserialize_and_load(bytes, options)?;
        put_box(out, executable_handle(exe, c.shell.clone()), "out")
    })
}

/// Releases the caller's handle; executions in flight finish. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_destroy(
    executable: *mut colocated_loaded_executable,
) {
    boundary_void(|| drop(take(executable)));
}

/// The program's name.
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_name(
    handle_: *const colocated_loaded_executable,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    get_str(handle_, out, |e| &e.name)
}
/// A stable hash of the serialized program (16 hex digits).
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_fingerprint(
    handle_: *const colocated_loaded_executable,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    get_str(handle_, out, |e| &e.fingerprint)
}
/// The devices the executable runs on.
///
/// `*items` is a borrowed array of `*count` borrowed handles.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_devices(
    handle_: *const colocated_loaded_executable,
    items: *mut *const *const colocated_device,
    count: *mut usize,
) -> *mut colocated_error {
    get_list(handle_, items, count, |e| &e.devices)
}
/// Number of arguments.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_num_inputs(
    handle_: *const colocated_loaded_executable,
    out: *mut usize,
) -> *mut colocated_error {
    get(handle_, out, |e| e.executable.program().input_specs.len())
}
/// Number of results.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_num_outputs(
    handle_: *const colocated_loaded_executable,
    out: *mut usize,
) -> *mut colocated_error {
    get(handle_, out, |e| e.executable.program().output_specs.len())
}

/// Serializes the executable (versioned header + payload). `*out` is caller owned.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_serialize(
    executable: *const colocated_loaded_executable,
    out: *mut *mut colocated_bytes,
) -> *mut colocated_error {
    boundary(|| {
        let e = handle(executable, "executable")?;
        put_box(out, colocated_bytes::make(e.executable.serialize()), "out")
    })
}

/// Options of an execution.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_execute_options {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// The stream that orders the execution (NULL: the calling thread's own).
    pub stream: *const colocated_stream,
}
versioned!(colocated_execute_options, required: struct_size, fields: [struct_size, stream]);

unsafe fn execute_options(options: *const colocated_execute_options) -> Result<ExecuteOptions> {
    let o = read_versioned(options, true)?;
    let stream = if o.stream.is_null() {
        None
    } else {
        Some(handle(o.stream, "stream")?.stream.clone())
    };
    Ok(ExecuteOptions { stream })
}

unsafe fn check_outputs<T>(
    outputs: *mut *mut T,
    num_outputs: usize,
    expected: usize,
) -> Result<()> {
    if num_outputs != expected {
        return Err(Error::invalid_argument(format!(
            "the executable has {expected} outputs but num_outputs is {num_outputs}"
        )));
    }
    if expected > 0 && outputs.is_null() {
        return Err(Error::invalid_argument("outputs is NULL"));
    }
    Ok(())
}

/// Runs the program once per host with that host's shards of `args`
/// (`num_args` arrays). Returns at once: `outputs` (a caller array of `num_outputs`
/// = `colocated_loaded_executable_num_outputs` entries) receives new arrays (caller
/// owned) that become ready later; `status` (may be NULL) receives a new event
/// ready when every host finished. Programs of one stream run in submission order.
///
/// Errors now: `invalid_argument` (argument count or specs, output count),
/// `failed_precondition` (a deleted argument). Failures while running arrive on the
/// outputs' events and `status`.
/// Thread-safety: any thread; never blocks on the program.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_execute(
    executable: *const colocated_loaded_executable,
    args: *const *const colocated_array,
    num_args: usize,
    options: *const colocated_execute_options,
    outputs: *mut *mut colocated_array,
    num_outputs: usize,
    status: *mut *mut colocated_event,
) -> *mut colocated_error {
    boundary(|| {
        let e = handle(executable, "executable")?;
        let arrays = slice(args, num_args, "args")?
            .iter()
            .enumerate()
            .map(|(i, a)| handle(*a, &format!("args[{i}]")).map(|a| a.array.clone()))
            .collect::<Result<Vec<_>>>()?;
        let options = execute_options(options)?;
        check_outputs(
            outputs,
            num_outputs,
            e.executable.program().output_specs.len(),
        )?;
        let run = e.executable.execute(&arrays, &options)?;
        for (i, array) in run.outputs.into_iter().enumerate() {
            *outputs.add(i) =
                Box::into_raw(Box::new(colocated_array::make(array, e.shell.clone())));
        }
        if !status.is_null() {
            *status = colocated_event::new_raw(run.status);
        }
        Ok(())
    })
}

unsafe fn buffer_args(
    args: *const *const colocated_buffer,
    n: usize,
) -> Result<Vec<colocated_core::Buffer>> {
    slice(args, n, "args")?
        .iter()
        .enumerate()
        .map(|(i, b)| handle(*b, &format!("args[{i}]")).map(|b| b.buffer.clone()))
        .collect()
}

type ShardedRun = fn(
    &LoadedExecutable,
    &[colocated_core::Buffer],
    &colocated_core::Device,
    &ExecuteOptions,
) -> Result<(Vec<colocated_core::Buffer>, colocated_core::Event)>;

#[allow(clippy::too_many_arguments)]
unsafe fn run_on_device(
    run: ShardedRun,
    executable: *const colocated_loaded_executable,
    args: *const *const colocated_buffer,
    num_args: usize,
    device: *const colocated_device,
    options: *const colocated_execute_options,
    outputs: *mut *mut colocated_buffer,
    num_outputs: usize,
    status: *mut *mut colocated_event,
) -> Result<()> {
    let e = handle(executable, "executable")?;
    let d = handle(device, "device")?;
    let buffers = buffer_args(args, num_args)?;
    let options = execute_options(options)?;
    check_outputs(
        outputs,
        num_outputs,
        e.executable.program().output_specs.len(),
    )?;
    let (outs, event) = run(&e.executable, &buffers, &d.device, &options)?;
    for (i, b) in outs.into_iter().enumerate() {
        *outputs.add(i) = Box::into_raw(Box::new(colocated_buffer::make(b, e.shell.clone())));
    }
    if !status.is_null() {
        *status = colocated_event::new_raw(event);
    }
    Ok(())
}

/// Runs the part of the program that `device` owns, with that device's shard of
/// each input (`args`: one buffer per input); `outputs` receives that device's
/// shard of each output (new buffers, caller owned). Errors: as
/// `colocated_loaded_executable_execute`, and `invalid_argument` when the
/// executable does not run on `device` or a buffer is not that device's shard.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_execute_sharded(
    executable: *const colocated_loaded_executable,
    args: *const *const colocated_buffer,
    num_args: usize,
    device: *const colocated_device,
    options: *const colocated_execute_options,
    outputs: *mut *mut colocated_buffer,
    num_outputs: usize,
    status: *mut *mut colocated_event,
) -> *mut colocated_error {
    boundary(|| {
        run_on_device(
            LoadedExecutable::execute_sharded,
            executable,
            args,
            num_args,
            device,
            options,
            outputs,
            num_outputs,
            status,
        )
    })
}

/// Runs a single-device executable on any `device` of the client with whole
/// arrays as buffers on that device. Errors: as
/// `colocated_loaded_executable_execute_sharded`, and `invalid_argument` for an
/// executable compiled for several devices.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_executable_execute_portable(
    executable: *const colocated_loaded_executable,
    args: *const *const colocated_buffer,
    num_args: usize,
    device: *const colocated_device,
    options: *const colocated_execute_options,
    outputs: *mut *mut colocated_buffer,
    num_outputs: usize,
    status: *mut *mut colocated_event,
) -> *mut colocated_error {
    boundary(|| {
        run_on_device(
            LoadedExecutable::execute_portable,
            executable,
            args,
            num_args,
            device,
            options,
            outputs,
            num_outputs,
            status,
        )
    })
}
