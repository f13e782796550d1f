//! Native functions: the registry of the local host, and the execution context a
//! running native function sees.

use std::ffi::c_void;
use std::sync::{Arc, Weak};

use colocated_core::{Error, ExecutionContext, Result};

use crate::boundary;
use crate::buffer::colocated_buffer;
use crate::client::{colocated_client, ClientShell};
use crate::device::colocated_device;
use crate::error::colocated_error;
use crate::handle::{
    colocated_string_view, get, handle, lend, put, put_box, read_versioned, slice, tagged,
    versioned,
};
use crate::host_callback::colocated_bytes;

/// A native function. It runs on an executor thread of the host (possibly several
/// at once, for different streams): it reads its host's input shards (`inputs`,
/// `num_inputs` borrowed buffers, argument-major), sets every output shard with
/// `colocated_execution_context_set_output`, and returns NULL, or an error it owns
/// no longer (the runtime takes it). `context` and the input handles are valid only
/// during the call.
pub type colocated_native_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        context: *mut colocated_execution_context,
        inputs: *const *const colocated_buffer,
        num_inputs: usize,
    ) -> *mut colocated_error,
>;

/// Destructor of user data, called exactly once.
pub type colocated_destructor = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// Arguments of `colocated_client_register_native_function`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_native_function_args {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// The name programs use (`payload` of a `native` program). Copied.
    pub name: colocated_string_view,
    /// The function (required).
    pub function: colocated_native_fn,
    /// Passed to every call.
    pub user_data: *mut c_void,
    /// Called once with `user_data` when the client is gone (may be NULL).
    pub destructor: colocated_destructor,
}
versioned!(colocated_native_function_args, required: function, fields: [struct_size, name, function, user_data, destructor]);

/// Owns user data and runs its destructor exactly once — unless disarmed because
/// the call that was to take ownership failed (the caller still owns it then).
pub(crate) struct UserData {
    pub ptr: *mut c_void,
    pub destructor: colocated_destructor,
    armed: std::sync::atomic::AtomicBool,
}

impl UserData {
    pub fn new(ptr: *mut c_void, destructor: colocated_destructor) -> UserData {
        UserData {
            ptr,
            destructor,
            armed: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// The registration failed: ownership stays with the caller.
    pub fn disarm(&self) {
        self.armed.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
// SAFETY: the C contract of every registration says user data is used from any
// thread (documented on each registering function).
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}
impl Drop for UserData {
    fn drop(&mut self) {
        if !self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Some(d) = self.destructor {
            // SAFETY: the caller gave this destructor for this pointer.
            unsafe { d(self.ptr) };
        }
    }
}

/// Adds a native function to the local host's registry. `user_data` must be
/// usable from any thread; on success the library owns it and `destructor` runs
/// once when the client and everything made from it are gone. On error the
/// caller keeps ownership (the destructor is not called). User data that holds a
/// handle of this client (or of anything made from it) keeps the client alive
/// through the registry, so its destructor would never run: keep such handles
/// elsewhere. Errors:
/// `invalid_argument` (no function, bad name), `already_exists`.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_register_native_function(
    client: *const colocated_client,
    args: *const colocated_native_function_args,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let a = read_versioned(args, false)?;
        let name = a.name.to_str("name")?.to_string();
        let Some(function) = a.function else {
            return Err(Error::invalid_argument(
                "colocated_native_function_args.function is NULL",
            ));
        };
        let data = Arc::new(UserData::new(a.user_data, a.destructor));
        let captured = data.clone();
        let shell = Arc::downgrade(&c.shell);
        let registered = c.shell.client.register_native_function(&name, move |ctx| {
            call_native(function, &captured, &shell, ctx)
        });
        if registered.is_err() {
            data.disarm();
        }
        registered
    })
}

fn call_native(
    function: unsafe extern "C" fn(
        *mut c_void,
        *mut colocated_execution_context,
        *const *const colocated_buffer,
        usize,
    ) -> *mut colocated_error,
    data: &UserData,
    shell: &Weak<ClientShell>,
    ctx: &mut ExecutionContext<'_>,
) -> Result<()> {
    // Work in flight keeps the core client alive; if every C handle of it is gone
    // meanwhile, the program still runs, with a fresh C view of that client.
    let shell = shell
        .upgrade()
        .unwrap_or_else(|| ClientShell::new(ctx.client().clone()));
    // Lent handles: valid during the call; destroying one by mistake is a no-op.
    let mut client = colocated_client::new(shell.clone());
    lend::<colocated_client>(&mut client.tag);
    let inputs: Vec<colocated_buffer> = ctx
        .inputs()
        .iter()
        .map(|b| {
            let mut lent = colocated_buffer::new(b.clone(), shell.clone());
            lend::<colocated_buffer>(&mut lent.tag);
            lent
        })
        .collect();
    let input_ptrs: Vec<*const colocated_buffer> = inputs.iter().map(|b| b as *const _).collect();
    let output_devices = ctx
        .output_shards()
        .iter()
        .map(|s| shell.device_handle(&s.device))
        .collect();
    let mut c_ctx = colocated_execution_context {
        tag: <colocated_execution_context as crate::handle::Tagged>::TAG,
        ctx: (ctx as *mut ExecutionContext<'_>).cast(),
        client: &client,
        output_devices,
        devices: std::cell::OnceCell::new(),
        held: std::cell::RefCell::new(Vec::new()),
        host_inputs: std::cell::OnceCell::new(),
    };
    // SAFETY: the C function's contract; every pointer passed is valid during the
    // call.
    let err = unsafe { function(data.ptr, &mut c_ctx, input_ptrs.as_ptr(), input_ptrs.len()) };
    // SAFETY: the function returns NULL or an error it hands over.
    match unsafe { colocated_error::take(err) } {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What a running native function sees; valid only during the call.
#[repr(C)]
pub struct colocated_execution_context {
    tag: u64,
    ctx: *mut c_void,
    client: *const colocated_client,
    output_devices: Vec<*const colocated_device>,
    /// The program's devices on this host (made when first asked for).
    devices: std::cell::OnceCell<Vec<*const colocated_device>>,
    /// Values of colocated objects handed out during the call: kept alive
    /// until it returns, whatever happens to their objects meanwhile.
    pub(crate) held: std::cell::RefCell<Vec<colocated_core::HostValue>>,
    /// This host's input arrays (assembled when first asked for).
    pub(crate) host_inputs: std::cell::OnceCell<Result<Vec<colocated_core::Array>>>,
}

impl colocated_execution_context {
    /// The C view of the running program's client.
    pub(crate) fn shell(&self) -> Arc<ClientShell> {
        // SAFETY: `client` points to the lent client handle of the running
        // call, which outlives this struct (both live in `call_native`).
        unsafe { (*self.client).shell.clone() }
    }

    pub(crate) fn core(&self) -> &ExecutionContext<'static> {
        // SAFETY: `ctx` points to the ExecutionContext of the running call, which
        // outlives this struct (created and dropped inside `call_native`).
        unsafe { &*self.ctx.cast::<ExecutionContext<'static>>() }
    }

    pub(crate) fn core_mut(&mut self) -> &mut ExecutionContext<'static> {
        // SAFETY: as in `core`; `&mut self` makes the access exclusive.
        unsafe { &mut *self.ctx.cast::<ExecutionContext<'static>>() }
    }
}

/// The client (borrowed, valid during the call) — to create output buffers.
///
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_client(
    handle_: *const colocated_execution_context,
    out: *mut *const colocated_client,
) -> *mut colocated_error {
    get(handle_, out, |c| c.client)
}
/// How many output shards the function must set.
///
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_num_outputs(
    handle_: *const colocated_execution_context,
    out: *mut usize,
) -> *mut colocated_error {
    get(handle_, out, |c| c.core().output_shards().len())
}

/// For each argument, how many of the function's `inputs` belong to it
/// (`*counts` is borrowed, `*num_args` entries).
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_input_shard_counts(
    context: *const colocated_execution_context,
    counts: *mut *const usize,
    num_args: *mut usize,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let list = c.core().input_shard_counts();
        put(counts, list.as_ptr(), "counts")?;
        put(num_args, list.len(), "num_args")
    })
}

/// Describes output shard `index`: its dtype, dims (borrowed), and device
/// (borrowed). Any out-parameter may be NULL. Errors: `invalid_argument` for an
/// index out of range.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_output_spec(
    context: *const colocated_execution_context,
    index: usize,
    dtype: *mut crate::buffer::colocated_dtype,
    dims: *mut *const i64,
    num_dims: *mut usize,
    device: *mut *const colocated_device,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let shards = c.core().output_shards();
        let s = shards.get(index).ok_or_else(|| {
            Error::invalid_argument(format!(
                "output shard {index} is out of range ({} shards)",
                shards.len()
            ))
        })?;
        if !dtype.is_null() {
            *dtype = crate::buffer::colocated_dtype::from_core(s.dtype);
        }
        if !dims.is_null() {
            *dims = s.dims.as_ptr();
        }
        if !num_dims.is_null() {
            *num_dims = s.dims.len();
        }
        if !device.is_null() {
            *device = c.output_devices[index];
        }
        Ok(())
    })
}

/// Sets output shard `index` to `buffer`. The runtime takes its own reference;
/// the caller still destroys its handle. Errors: `invalid_argument` for an index
/// out of range, a shard already set, or a buffer whose dtype, dims or device
/// differ from `colocated_execution_context_output_spec`.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_set_output(
    context: *mut colocated_execution_context,
    index: usize,
    buffer: *const colocated_buffer,
) -> *mut colocated_error {
    boundary(|| {
        handle(context, "context")?;
        let b = handle(buffer, "buffer")?;
        // SAFETY: checked non-NULL and of the right type just above.
        let c = unsafe { &mut *context };
        c.core_mut().set_output(index, b.buffer.clone())
    })
}

/// Calls host callback `index` (of the executable's compile options) with `input`
/// and returns its answer in `*out` (owned by the caller; destroy with
/// `colocated_bytes_destroy`). Errors: `invalid_argument` for an index out of
/// range; whatever the callback returned.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_call_host_callback(
    context: *const colocated_execution_context,
    index: usize,
    input: *const u8,
    input_size: usize,
    out: *mut *mut colocated_bytes,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let input = slice(input, input_size, "input")?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let answer = c.core().call_host_callback(index, input)?;
        put_box(out, colocated_bytes::make(answer), "out")
    })
}

/// The program's devices on this host, in the program's order (`*devices`
/// is borrowed, valid during the call): where a function without inputs, or
/// a discovery run, puts its outputs.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_devices(
    context: *const colocated_execution_context,
    devices: *mut *const *const colocated_device,
    num_devices: *mut usize,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let list = c.devices.get_or_init(|| {
            let shell = c.shell();
            c.core()
                .devices()
                .iter()
                .map(|d| shell.device_handle(d))
                .collect()
        });
        put(devices, list.as_ptr(), "devices")?;
        put(num_devices, list.len(), "num_devices")
    })
}

tagged! { colocated_execution_context => 0xC010_CA7E_0000_0006 }
