//! Plugin libraries (`colocated_client_load_plugin`). The plugin ABI's types and
//! the loader live in `colocated-plugin`, which the worker executable and the
//! Python SDK use too; this file translates the C call.

use std::path::Path;

use colocated_plugin::load_plugin;

use crate::boundary;
use crate::client::colocated_client;
use crate::error::colocated_error;
use crate::handle::{colocated_string_view, handle};

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
