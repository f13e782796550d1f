//! Streams: ordering domains for executions and transfers, made by a client.

use colocated_core::Stream;

use crate::client::colocated_client;
use crate::error::colocated_error;
use crate::handle::{get, handle, put_box, tagged, take};
use crate::{boundary, boundary_void};

/// An ordering domain for executions and transfers (see `colocated_execute_options`).
/// Owned by the caller; destroy with `colocated_stream_destroy`. Work already
/// submitted on it still runs.
#[repr(C)]
pub struct colocated_stream {
    tag: u64,
    pub(crate) stream: Stream,
}

tagged! {
    colocated_stream => 0xC010_CA7E_0000_0005,
}

/// Creates a stream (an ordering domain) for `client`. The caller owns `*out`.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_create_stream(
    client: *const colocated_client,
    out: *mut *mut colocated_stream,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let stream = c.shell.client.create_stream();
        let tag = <colocated_stream as crate::handle::Tagged>::TAG;
        put_box(out, colocated_stream { tag, stream }, "out")
    })
}

/// The stream's id (also its track id in traces).
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_stream_id(
    handle_: *const colocated_stream,
    out: *mut u64,
) -> *mut colocated_error {
    get(handle_, out, |s| s.stream.id())
}

/// Destroys a stream handle; work already submitted on it still runs. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_stream_destroy(stream: *mut colocated_stream) {
    boundary_void(|| drop(take(stream)));
}
