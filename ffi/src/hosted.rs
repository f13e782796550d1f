//! The host side of colocated functions and objects, for the native
//! functions of their programs: a host's value of an object (built once per
//! host and session), the function's data, whether a run discovers, its
//! session, its host's input arrays, and the outputs it hands back.

use std::ffi::c_void;
use std::sync::Arc;

use colocated_core::{host_object, Error, Result};

use crate::array::colocated_array;
use crate::boundary;
use crate::colocated::non_empty;
use crate::error::colocated_error;
use crate::handle::{get, handle, put, put_box, slice};
use crate::native::{colocated_destructor, colocated_execution_context};

/// Builds a host's value of a colocated object: sets `*value` (and, if it
/// needs one, `*destructor`, called once with the value when the object is
/// destroyed) and returns NULL, or returns an error the runtime takes over.
/// On error `*value` and `*destructor` are ignored: the builder frees what it
/// made.
pub type colocated_object_builder = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        value: *mut *mut c_void,
        destructor: *mut colocated_destructor,
    ) -> *mut colocated_error,
>;

/// A host's value of an object built by C.
struct CValue {
    ptr: *mut c_void,
    destructor: colocated_destructor,
}

// SAFETY: the contract of `colocated_execution_context_host_object`: values
// are used from any thread.
unsafe impl Send for CValue {}
// SAFETY: as above.
unsafe impl Sync for CValue {}

impl Drop for CValue {
    fn drop(&mut self) {
        if let Some(d) = self.destructor {
            // SAFETY: the builder gave this destructor for this value.
            unsafe { d(self.ptr) };
        }
    }
}

/// This host's value of object `id` for the running call's session: built
/// with `build(user_data, ...)` by the first call that asks on this host
/// (one at a time), then the same `*value` for every call until the object
/// is destroyed (or its session ends on a worker). If `build` failed, every
/// call gets a copy of its error, and `build` is not called again. `*value`
/// stays valid until the calling native function returns. The object is
/// destroyed on a host only after the calls that list it in
/// `colocated_function_call_args.objects`: a call must list every object its
/// hosts use. Errors: the builder's; `invalid_argument` for a value another
/// language built.
/// Thread-safety: the calling native function's thread; values must be
/// usable from any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_host_object(
    context: *const colocated_execution_context,
    id: u64,
    build: colocated_object_builder,
    user_data: *mut c_void,
    value: *mut *mut c_void,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let Some(build) = build else {
            return Err(Error::invalid_argument("build is NULL"));
        };
        if value.is_null() {
            return Err(Error::invalid_argument("out-parameter value is NULL"));
        }
        let built = host_object(c.core().session(), id, || {
            let mut made: *mut c_void = std::ptr::null_mut();
            let mut destructor: colocated_destructor = None;
            // SAFETY: the builder's contract; both out-pointers are valid.
            let err = unsafe { build(user_data, &mut made, &mut destructor) };
            // SAFETY: the builder returns NULL or an error it hands over.
            match unsafe { colocated_error::take(err) } {
                Some(e) => Err(Arc::new(e)),
                None => Ok(Arc::new(CValue {
                    ptr: made,
                    destructor,
                })),
            }
        });
        match built {
            Ok(v) => {
                let ptr = match v.downcast_ref::<CValue>() {
                    Some(c_value) => c_value.ptr,
                    None => {
                        return Err(Error::invalid_argument(format!(
                            "object {id} was built by another language on this host"
                        )))
                    }
                };
                c.held.borrow_mut().push(v);
                put(value, ptr, "value")
            }
            Err(e) => Err(e.downcast_ref::<Error>().cloned().unwrap_or_else(|| {
                Error::invalid_argument(format!(
                    "object {id} failed to build in another language on this host"
                ))
            })),
        }
    })
}

/// A native program's data: the `data` of its colocated function (see
/// `colocated_function_args`), borrowed during the call (NULL when `*size`
/// is 0); empty for a function without data.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_native_data(
    context: *const colocated_execution_context,
    data: *mut *const u8,
    size: *mut usize,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let bytes = c.core().native_data();
        put(data, non_empty(bytes), "data")?;
        put(size, bytes.len(), "size")
    })
}

/// True while the program runs to discover its outputs (the first call of a
/// colocated function of an input spec, without declared outputs): then
/// `colocated_execution_context_set_host_outputs` takes any arrays over the
/// call's devices of this host, and their structure.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_discovering(
    context: *const colocated_execution_context,
    out: *mut bool,
) -> *mut colocated_error {
    get(context, out, |c| c.core().discovering())
}

/// The session the program runs for (0 for the controller's own host): what
/// a host keys state that outlives a call by.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_session(
    context: *const colocated_execution_context,
    out: *mut u64,
) -> *mut colocated_error {
    get(context, out, |c| c.core().session().as_u64())
}

/// Input `index` of this host, as an array (a new handle the caller owns)
/// of the host's shards of that argument. Errors: `invalid_argument` for an
/// index out of range; `unimplemented` when the host's shards of an input
/// do not make one array of their own.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_host_input(
    context: *const colocated_execution_context,
    index: usize,
    out: *mut *mut colocated_array,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let arrays = c
            .host_inputs
            .get_or_init(|| c.core().host_input_arrays())
            .as_ref()
            .map_err(Clone::clone)?;
        let array = arrays.get(index).cloned().ok_or_else(|| {
            Error::invalid_argument(format!(
                "input {index} is out of range (the program has {})",
                arrays.len()
            ))
        })?;
        put_box(out, colocated_array::make(array, c.shell()), "out")
    })
}

/// Sets every output from this host's output arrays (borrowed during the
/// call), one per output, each checked against its spec. While discovering,
/// the arrays may be any arrays over the call's devices of this host, and
/// `structure` (`structure_size` bytes, the same on every host; the
/// controller hands it back with `colocated_call_structure`) describes them.
/// In later calls a non-empty `structure` must be the bytes discovery
/// reported (an empty one is not checked, nor any with declared outputs).
/// Errors: `invalid_argument` for outputs that do not match their specs, and
/// for a structure other than the one discovery reported.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_set_host_outputs(
    context: *mut colocated_execution_context,
    outputs: *const *const colocated_array,
    num_outputs: usize,
    structure: *const u8,
    structure_size: usize,
) -> *mut colocated_error {
    boundary(|| {
        handle(context, "context")?;
        let arrays = slice(outputs, num_outputs, "outputs")?
            .iter()
            .enumerate()
            .map(|(i, x)| handle(*x, &format!("outputs[{i}]")).map(|x| x.array.clone()))
            .collect::<Result<Vec<_>>>()?;
        let structure = slice(structure, structure_size, "structure")?.to_vec();
        // SAFETY: checked non-NULL and of the right type just above.
        let c = unsafe { &mut *context };
        let given = c.core().discovering() || !structure.is_empty();
        c.core_mut()
            .set_host_outputs(arrays, given.then_some(structure))
    })
}
