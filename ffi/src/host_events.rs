//! What happens to a client's worker hosts, for C: listeners of the host
//! events core tells (a link broke and came back, a session lost for good, a
//! new session that replaced it), the counters of those events per host, and
//! closing a client's sessions with its workers.

use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

use colocated_core::{Error, HostEvent};

use crate::boundary;
use crate::client::colocated_client;
use crate::error::colocated_error;
use crate::handle::{field_end, handle, put};
use crate::native::{colocated_destructor, UserData};

/// A listener of host events: called with `user_data`, the host's index in the
/// client (`host`), what happened (`kind`: `"disconnected"`, `"reconnected"`,
/// `"lost"` or `"reopened"`, NUL-terminated) and why (`error`: set for
/// `"disconnected"` and `"lost"`, else NULL). `kind` and `error` are borrowed
/// for the call only: copy what must outlive it, and never destroy `error`.
/// Called in order, one event at a time, on a thread of the client's own; it
/// may call the library (remove itself, read the counters) but should return
/// soon, as later events wait for it.
pub type colocated_host_event_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        host: usize,
        kind: *const c_char,
        error: *const colocated_error,
    ),
>;

/// How often each host event happened to a host since the client started
/// (`colocated_client_host_stats`). The caller sets `struct_size` to
/// `sizeof(colocated_host_stats)` (or `COLOCATED_STRUCT_SIZE`); the library
/// writes the counters that fit in it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_host_stats {
    /// Size of the caller's struct (set by the caller).
    pub struct_size: usize,
    /// Links that broke (`"disconnected"` events).
    pub disconnects: u64,
    /// Links that came back, their session resumed (`"reconnected"`).
    pub reconnects: u64,
    /// Sessions lost for good (`"lost"`).
    pub sessions_lost: u64,
    /// Sessions opened to replace a lost one (`"reopened"`).
    pub sessions_reopened: u64,
}

/// Calls `callback` with every event of the client's worker hosts from now on
/// (see `colocated_host_event_fn`), first with the loss of each host whose
/// current session was lost before it came; `*listener_id` receives its id, for
/// `colocated_client_remove_host_listener`. `user_data` must be usable from
/// any thread; on success the library owns it, and `destructor` (may be NULL)
/// runs once with it, on any thread, after the listener is removed and its
/// last call has returned, or once the client and everything made from it are
/// gone. On error the caller keeps it and the destructor is not called. User
/// data that holds a handle of this client keeps the client alive, so its
/// destructor would run only after removal. Errors: `invalid_argument` (NULL
/// client, callback or `listener_id`), `resource_exhausted` (the client's
/// thread of events cannot start). Since API 1.5.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_on_host_event(
    client: *const colocated_client,
    callback: colocated_host_event_fn,
    user_data: *mut c_void,
    destructor: colocated_destructor,
    listener_id: *mut u64,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let callback = callback.ok_or_else(|| Error::invalid_argument("callback is NULL"))?;
        if listener_id.is_null() {
            return Err(Error::invalid_argument("out-parameter listener_id is NULL"));
        }
        // Every check is done: from here the library owns `user_data`.
        let data = Arc::new(UserData::new(user_data, destructor));
        let captured = data.clone();
        let listened = c.shell.client.on_host_event(move |event: &HostEvent| {
            // Names have no NUL: the default (an empty name) is never used.
            let kind = CString::new(event.kind.name()).unwrap_or_default();
            let error = event.error.clone().map(colocated_error::new);
            let error = error
                .as_ref()
                .map_or(std::ptr::null(), |e| e as *const colocated_error);
            // SAFETY: the callback's contract; `kind` and `error` live
            // through the call.
            unsafe { callback(captured.ptr, event.host, kind.as_ptr(), error) };
        });
        match listened {
            Ok(id) => put(listener_id, id, "listener_id"),
            Err(e) => {
                data.disarm();
                Err(e)
            }
        }
    })
}

/// Stops calling listener `listener_id` of the client; a call of it already
/// under way finishes (its destructor runs after). `*removed` (may be NULL)
/// receives whether it was listening. Errors: `invalid_argument` (NULL
/// client). Since API 1.5.
/// Thread-safety: any thread, the listener's own call included.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_remove_host_listener(
    client: *const colocated_client,
    listener_id: u64,
    removed: *mut bool,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let was = c.shell.client.remove_host_listener(listener_id);
        if removed.is_null() {
            return Ok(());
        }
        put(removed, was, "removed")
    })
}

/// Writes into `*out` how often each host event happened to host `host_index`
/// (its index in `colocated_client_hosts`) since the client started: zeros
/// for the in-process host. Errors: `invalid_argument` (NULL client or `out`,
/// an `out->struct_size` too small, a host index out of range). Since API 1.5.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_host_stats(
    client: *const colocated_client,
    host_index: usize,
    out: *mut colocated_host_stats,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let size = std::ptr::read_unaligned(std::ptr::addr_of!((*out).struct_size));
        let needed = field_end!(colocated_host_stats, sessions_reopened);
        if size < needed {
            return Err(Error::invalid_argument(format!(
                "colocated_host_stats.struct_size is {size}, smaller than the {needed} bytes of its counters"
            )));
        }
        let stats = c.shell.client.host_stats(host_index)?;
        // The caller's struct has room for every counter of this version;
        // `struct_size` stays as the caller set it.
        std::ptr::addr_of_mut!((*out).disconnects).write_unaligned(stats.disconnects);
        std::ptr::addr_of_mut!((*out).reconnects).write_unaligned(stats.reconnects);
        std::ptr::addr_of_mut!((*out).sessions_lost).write_unaligned(stats.sessions_lost);
        std::ptr::addr_of_mut!((*out).sessions_reopened).write_unaligned(stats.sessions_reopened);
        Ok(())
    })
}

/// Ends the client's sessions with its workers now, instead of when the last
/// object of the client goes: the workers free what the sessions hold, work in
/// flight there and every later use of a worker's device fail with
/// `cancelled`, and listeners hear a `"lost"` event with that error for each
/// worker host. The in-process host stays usable. Closing twice does nothing.
/// Does not wait for the workers. Errors: `invalid_argument` (NULL client).
/// Since API 1.5.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_close(
    client: *const colocated_client,
) -> *mut colocated_error {
    boundary(|| {
        handle(client, "client")?.shell.client.close();
        Ok(())
    })
}
