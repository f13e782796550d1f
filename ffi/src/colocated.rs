//! Colocated functions and objects over core's protocol: the call rules, the
//! cache per input spec, discovery of outputs, and objects destroyed on every
//! host they ran on. C supplies what the Python SDK's decorator supplies: a
//! payload (a native function's name and data) and, optionally, the outputs
//! every call produces.

use std::sync::Arc;

use colocated_core::{
    flat_tree_key, native_payload, ArraySpec, CallSite, CallSpec, ColocatedFunction,
    ColocatedObject, Device, Error, Event, Outputs, Payload, Result, LANGUAGE_NATIVE,
};

use crate::array::colocated_array;
use crate::client::{colocated_client, device_list, ClientShell};
use crate::device::colocated_device;
use crate::error::colocated_error;
use crate::event::colocated_event;
use crate::executable::{colocated_array_spec, specs};
use crate::handle::{
    colocated_string_view, get, handle, put, put_box, read_versioned, slice, tagged, take,
    versioned,
};
use crate::{boundary, boundary_void};

/// Arguments of `colocated_function_create`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_function_args {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// The client that compiles the function's programs (required).
    pub client: *const colocated_client,
    /// A name for traces and errors. Copied.
    pub name: colocated_string_view,
    /// The hosts' language (default `"native"`). Copied.
    pub language: colocated_string_view,
    /// For `native`: the function's name in the hosts' registries (required
    /// then). Copied.
    pub native_function: colocated_string_view,
    /// Bytes the hosts' program gets: for `native`, what
    /// `colocated_execution_context_native_data` returns; for another
    /// language, its whole payload. Copied.
    pub data: *const u8,
    /// Bytes at `data`.
    pub data_size: usize,
    /// Specializes the function to these devices (borrowed during the call):
    /// calls without inputs run there, and calls with inputs must use them.
    pub devices: *const *const colocated_device,
    /// Entries at `devices` (0: not specialized).
    pub num_devices: usize,
    /// When not NULL: the outputs every call produces (`num_out_specs` of
    /// them, read during the call), and calls never run to discover them.
    /// When NULL, the first call of each input spec runs synchronously and
    /// learns the outputs from what the hosts set with
    /// `colocated_execution_context_set_host_outputs`.
    pub out_specs: *const *const colocated_array_spec,
    /// Entries at `out_specs`.
    pub num_out_specs: usize,
}
versioned!(colocated_function_args, required: client, fields: [struct_size, client, name, language, native_function, data, data_size, devices, num_devices, out_specs, num_out_specs]);

/// What a C function supplies to core for a call without a compiled program.
struct FixedSite {
    payload: Vec<u8>,
    outputs: Option<Vec<ArraySpec>>,
}

impl CallSite for FixedSite {
    type Entry = ();

    fn payload(&self, _: &[Device]) -> Result<Payload> {
        Ok(Payload {
            bytes: self.payload.clone(),
            host_callbacks: Vec::new(),
        })
    }

    fn declared_outputs(&self) -> Result<Option<Outputs>> {
        Ok(self
            .outputs
            .as_ref()
            .map(|specs| Outputs::declared(Vec::new(), specs.clone())))
    }

    fn entry(&self, _: &Outputs) -> Result<()> {
        Ok(())
    }
}

/// A colocated function: its specialization and its cache of compiled
/// programs per input spec. Owned by the caller; destroy with
/// `colocated_function_destroy`.
///
/// Thread-safety: any thread; calls may run concurrently (two first calls of
/// one input spec made at once may both run to discover the outputs).
#[repr(C)]
pub struct colocated_function {
    tag: u64,
    function: ColocatedFunction<()>,
    site: FixedSite,
    shell: Arc<ClientShell>,
}

/// The result of one call: its output arrays (ready later), its status, and
/// the output structure the hosts reported. Owned by the caller; destroy
/// with `colocated_call_destroy`.
///
/// Thread-safety: any thread.
#[repr(C)]
pub struct colocated_call {
    tag: u64,
    outputs: Vec<colocated_core::Array>,
    status: Event,
    structure: Vec<u8>,
    shell: Arc<ClientShell>,
}

/// A colocated object: an id the hosts key their state by (see
/// `colocated_execution_context_host_object`). Destroying the handle
/// destroys the object on every host a call using it ran on, after those
/// calls. Owned by the caller.
///
/// Thread-safety: any thread.
#[repr(C)]
pub struct colocated_object {
    tag: u64,
    object: ColocatedObject,
}

tagged! {
    colocated_function => 0xC010_CA7E_0000_0050,
    colocated_call => 0xC010_CA7E_0000_0051,
    colocated_object => 0xC010_CA7E_0000_0052,
}

/// Creates a colocated function. The caller owns `*out`. Errors:
/// `invalid_argument` (no client; an empty, non-UTF-8 or `colocated`
/// language; `native` without a function name or with a NUL byte in it; an
/// empty device list given as not NULL; bad out specs).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_function_create(
    args: *const colocated_function_args,
    out: *mut *mut colocated_function,
) -> *mut colocated_error {
    boundary(|| {
        let a = read_versioned(args, false)?;
        let client = handle(a.client, "client")?;
        let name = a.name.to_str("name")?;
        let language = match a.language.to_str("language")? {
            "" => LANGUAGE_NATIVE,
            language => language,
        };
        let data = slice(a.data, a.data_size, "data")?;
        if language != LANGUAGE_NATIVE && a.native_function.size > 0 {
            return Err(Error::invalid_argument(format!(
                "native_function is for native functions; a '{language}' function's payload is its data"
            )));
        }
        let payload = if language == LANGUAGE_NATIVE {
            let function = a.native_function.to_str("native_function")?;
            native_payload(function, data).map_err(|e| e.context("native_function"))?
        } else {
            data.to_vec()
        };
        // NULL means "not given"; NULL with a count is refused (`slice`).
        let given = |list_is_null: bool, count: usize| !list_is_null || count > 0;
        let devices = given(a.devices.is_null(), a.num_devices)
            .then(|| device_list(a.devices, a.num_devices))
            .transpose()?;
        let outputs = given(a.out_specs.is_null(), a.num_out_specs)
            .then(|| specs(a.out_specs, a.num_out_specs, "out_specs"))
            .transpose()?;
        let function = ColocatedFunction::new(name, language, devices, None)?;
        let tag = <colocated_function as crate::handle::Tagged>::TAG;
        put_box(
            out,
            colocated_function {
                tag,
                function,
                site: FixedSite { payload, outputs },
                shell: client.shell.clone(),
            },
            "out",
        )
    })
}

/// Destroys a function handle; calls already made still run. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_function_destroy(function: *mut colocated_function) {
    boundary_void(|| drop(take(function)));
}

/// The counts of a function's cache of compiled programs: calls that took a
/// program compiled for their input spec (`hits`), calls that compiled one
/// (`misses`), and programs held (`size`). Each out-parameter may be NULL.
/// Since API 1.5.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_function_cache_info(
    function: *const colocated_function,
    hits: *mut u64,
    misses: *mut u64,
    size: *mut usize,
) -> *mut colocated_error {
    boundary(|| {
        let info = handle(function, "function")?.function.cache_info();
        for (out, value) in [(hits, info.hits), (misses, info.misses)] {
            if !out.is_null() {
                put(out, value, "out")?;
            }
        }
        if !size.is_null() {
            put(size, info.currsize, "size")?;
        }
        Ok(())
    })
}

/// Arguments of `colocated_function_call`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_function_call_args {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// The inputs (borrowed during the call), all on one device set.
    pub inputs: *const *const colocated_array,
    /// Entries at `inputs`.
    pub num_inputs: usize,
    /// The objects the call uses (borrowed during the call): each is
    /// destroyed only after this call has run.
    pub objects: *const *const colocated_object,
    /// Entries at `objects`.
    pub num_objects: usize,
}
versioned!(colocated_function_call_args, required: struct_size, fields: [struct_size, inputs, num_inputs, objects, num_objects]);

/// Calls `function` on the calling thread's stream. With a program compiled
/// for the inputs' spec (or declared outputs), it returns at once and
/// `colocated_call_status` is ready when the call has run; otherwise the
/// call first runs synchronously on every host to discover its outputs.
/// The caller owns `*out`. Errors: `invalid_argument` for inputs on
/// different device sets, inputs off the specialized devices, a call
/// without inputs of a function not specialized with devices, outputs that
/// differ between hosts or that the rules cannot place (see the SPEC);
/// whatever the hosts' programs returned during discovery.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_function_call(
    function: *const colocated_function,
    args: *const colocated_function_call_args,
    out: *mut *mut colocated_call,
) -> *mut colocated_error {
    boundary(|| {
        let f = handle(function, "function")?;
        let a = read_versioned(args, true)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let inputs = slice(a.inputs, a.num_inputs, "inputs")?
            .iter()
            .enumerate()
            .map(|(i, x)| handle(*x, &format!("inputs[{i}]")).map(|x| x.array.clone()))
            .collect::<Result<Vec<_>>>()?;
        let objects = slice(a.objects, a.num_objects, "objects")?
            .iter()
            .enumerate()
            .map(|(i, o)| handle(*o, &format!("objects[{i}]")).map(|o| &o.object))
            .collect::<Result<Vec<_>>>()?;
        let spec = CallSpec {
            tree: flat_tree_key(inputs.len()),
            leaves: inputs.iter().map(|x| x.spec().clone()).collect(),
        };
        let call = f
            .function
            .call(&f.shell.client, &spec, &inputs, &f.site, &objects)?;
        let tag = <colocated_call as crate::handle::Tagged>::TAG;
        put_box(
            out,
            colocated_call {
                tag,
                outputs: call.outputs,
                status: call.status.unwrap_or_else(Event::ready_ok),
                structure: call.entry.outputs().structure.clone(),
                shell: f.shell.clone(),
            },
            "out",
        )
    })
}

/// The number of output arrays of a call.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_call_num_outputs(
    call: *const colocated_call,
    out: *mut usize,
) -> *mut colocated_error {
    get(call, out, |c| c.outputs.len())
}

/// Output `index` of a call, as a new array handle the caller owns (ready
/// when the call has run). Errors: `invalid_argument` for an index out of
/// range.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_call_output(
    call: *const colocated_call,
    index: usize,
    out: *mut *mut colocated_array,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(call, "call")?;
        let array = c.outputs.get(index).ok_or_else(|| {
            Error::invalid_argument(format!(
                "output {index} is out of range (the call has {})",
                c.outputs.len()
            ))
        })?;
        put_box(
            out,
            colocated_array::make(array.clone(), c.shell.clone()),
            "out",
        )
    })
}

/// The call's status: an event the caller owns, ready (with the call's
/// error, if any) when the call has run on every host.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_call_status(
    call: *const colocated_call,
    out: *mut *mut colocated_event,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(call, "call")?;
        put_box(out, colocated_event::make(c.status.clone()), "out")
    })
}

/// The structure of the call's outputs as the hosts reported it to
/// `colocated_execution_context_set_host_outputs` during discovery (empty
/// for declared outputs): `*data` is borrowed from the call (NULL when
/// `*size` is 0).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_call_structure(
    call: *const colocated_call,
    data: *mut *const u8,
    size: *mut usize,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(call, "call")?;
        put(data, non_empty(&c.structure), "data")?;
        put(size, c.structure.len(), "size")
    })
}

/// Destroys a call handle; its outputs and status stay valid in the handles
/// taken from it. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_call_destroy(call: *mut colocated_call) {
    boundary_void(|| drop(take(call)));
}

/// Creates a colocated object with a fresh id. The caller owns `*out`.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_object_create(
    out: *mut *mut colocated_object,
) -> *mut colocated_error {
    boundary(|| {
        let tag = <colocated_object as crate::handle::Tagged>::TAG;
        put_box(
            out,
            colocated_object {
                tag,
                object: ColocatedObject::new(),
            },
            "out",
        )
    })
}

/// The object's id: what its functions' hosts pass to
/// `colocated_execution_context_host_object` (put it in the function's
/// `data`).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_object_id(
    object: *const colocated_object,
    out: *mut u64,
) -> *mut colocated_error {
    get(object, out, |o| o.object.id())
}

/// Destroys the object: on every host a call using it ran on, once those
/// calls have run, its value's destructor runs. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_object_destroy(object: *mut colocated_object) {
    boundary_void(|| drop(take(object)));
}

/// A borrowed byte string for C: NULL when empty (never a dangling pointer).
pub(crate) fn non_empty(bytes: &[u8]) -> *const u8 {
    if bytes.is_empty() {
        std::ptr::null()
    } else {
        bytes.as_ptr()
    }
}
