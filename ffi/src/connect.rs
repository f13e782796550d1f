//! Making a client: `colocated_client_create_local` (this process as the only
//! host, with CPU devices and optionally a PJRT plugin's) and
//! `colocated_client_connect` (worker hosts), with their options structs.

use std::time::Duration;

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::{Client, ClientOptions, ClusterOptions, Error, Result};

use crate::boundary;
use crate::client::{colocated_client, ClientShell};
use crate::error::colocated_error;
use crate::handle::{colocated_string_view, put_box, read_versioned, slice, versioned};

/// Options of `colocated_client_create_local`. Zero fields mean "default".
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_client_options {
    /// `sizeof` (or `COLOCATED_STRUCT_SIZE(colocated_client_options, F)` for the
    /// last field `F` the caller knows: `executor_threads` in API 1.0 and 1.1).
    pub struct_size: usize,
    /// CPU devices of the local host (0: the number of cores).
    pub num_cpu_devices: u32,
    /// Executor threads the local host keeps running (0: the number of cores, at
    /// least 2).
    pub executor_threads: u32,
    /// The most executor threads the local host runs at once (0: 256, and never
    /// fewer than `executor_threads`; at most 4096). While every thread is busy
    /// (a program blocked in I/O or waiting for another stream) and a stream has
    /// work, one more starts; those beyond `executor_threads` exit after 10 s
    /// idle. Since API 1.2.
    pub max_executor_threads: u32,
    /// Must be zero (room for a later field; keeps the struct free of padding).
    /// Since API 1.2.
    pub reserved: u32,
    /// A PJRT plugin whose devices join the CPU devices, as the default
    /// backend: the plugin library's path, or a name in
    /// `PJRT_NAMES_AND_LIBRARY_PATHS` (`name:path,...`). Empty: none. Borrowed
    /// for the call. Since API 1.5.
    pub pjrt_plugin: colocated_string_view,
    /// The plugin client's create options, `KEY=VALUE` each (an integer, a
    /// number, `true` or `false`, or text: `cpu_device_count=4`). Borrowed for
    /// the call. Since API 1.5.
    pub pjrt_options: *const colocated_string_view,
    /// Number of `pjrt_options`. Since API 1.5.
    pub num_pjrt_options: usize,
}
versioned!(colocated_client_options, required: struct_size, fields: [struct_size, num_cpu_devices, executor_threads, max_executor_threads, reserved, pjrt_plugin, pjrt_options, num_pjrt_options]);

/// `invalid_argument` unless a struct's `reserved` field is zero.
fn check_reserved(reserved: u32, what: &str) -> Result<()> {
    if reserved != 0 {
        return Err(Error::invalid_argument(format!(
            "{what}.reserved must be zero, got {reserved}"
        )));
    }
    Ok(())
}

/// The local host's core options from the C fields (0: default).
fn local_options(
    num_cpu_devices: u32,
    executor_threads: u32,
    max_executor_threads: u32,
) -> ClientOptions {
    let given = |n: u32| (n != 0).then_some(n as usize);
    ClientOptions {
        num_cpu_devices: given(num_cpu_devices),
        executor_threads: given(executor_threads),
        max_executor_threads: given(max_executor_threads),
        pjrt: None,
    }
}

/// Creates a client whose only host is this process, with CPU devices and,
/// when `options` names a PJRT plugin, that plugin's devices. `options` may be
/// NULL (defaults). On success `*out` is a new client the caller owns (destroy
/// with `colocated_client_destroy`).
///
/// Errors: `invalid_argument` for a bad options struct, out-of-range counts, a
/// malformed PJRT option, or a file that is not a PJRT plugin; `not_found` for a
/// missing plugin; `failed_precondition` for a plugin of an API version this
/// library does not accept; the plugin's own errors.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_create_local(
    options: *const colocated_client_options,
    out: *mut *mut colocated_client,
) -> *mut colocated_error {
    boundary(|| {
        let o = read_versioned(options, true)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        check_reserved(o.reserved, "colocated_client_options")?;
        let mut options = local_options(
            o.num_cpu_devices,
            o.executor_threads,
            o.max_executor_threads,
        );
        options.pjrt = pjrt_options(&o)?;
        let client = Client::new_local(options)?;
        put_box(out, colocated_client::new(ClientShell::new(client)), "out")
    })
}

/// Options of `colocated_client_connect`. Zero fields mean "default"; the fields
/// through `num_workers` are required.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_connect_options {
    /// `sizeof` (or `COLOCATED_STRUCT_SIZE(colocated_connect_options, F)` for the
    /// last field `F` the caller knows: `executor_threads` in API 1.1).
    pub struct_size: usize,
    /// The workers' addresses, `HOST:PORT` each (borrowed for the call); worker `i`
    /// becomes process `i + 1`.
    pub workers: *const colocated_string_view,
    /// Number of workers (0 with `include_local`: a client of this process only).
    pub num_workers: usize,
    /// The workers' token (empty: none, only for a worker started as insecure).
    pub token: colocated_string_view,
    /// CA certificate(s), PEM, that the workers' TLS certificates must chain to
    /// (copied). Empty: plain TCP.
    pub tls_ca: *const u8,
    /// Size of `tls_ca` in bytes.
    pub tls_ca_size: usize,
    /// The name the workers' certificates must carry (empty: the host part of
    /// each address). Used only with `tls_ca`.
    pub tls_domain: colocated_string_view,
    /// Bound, in milliseconds, of connecting to each worker and of each later
    /// request to it (0: 10 seconds).
    pub timeout_ms: u32,
    /// 1: this process is a host too (process 0, first in `colocated_client_hosts`);
    /// 0: only the workers are. Other values are `invalid_argument`.
    pub include_local: u32,
    /// CPU devices of the local host, when `include_local` (0: the number of cores).
    pub num_cpu_devices: u32,
    /// Executor threads this process keeps running (0: the number of cores, at
    /// least 2).
    pub executor_threads: u32,
    /// The most executor threads this process runs at once (0: 256), as in
    /// `colocated_client_options`. Since API 1.2.
    pub max_executor_threads: u32,
    /// Must be zero (room for a later field; keeps the struct free of padding).
    /// Since API 1.2.
    pub reserved: u32,
}
versioned!(colocated_connect_options, required: num_workers,
    fields: [struct_size, workers, num_workers, token, tls_ca, tls_ca_size, tls_domain, timeout_ms, include_local, num_cpu_devices, executor_threads, max_executor_threads, reserved]);

/// The core options of a caller's `colocated_connect_options`.
unsafe fn cluster_options(o: &colocated_connect_options) -> Result<ClusterOptions> {
    check_reserved(o.reserved, "colocated_connect_options")?;
    let include_local = match o.include_local {
        0 => false,
        1 => true,
        n => {
            return Err(Error::invalid_argument(format!(
                "include_local must be 0 or 1, got {n}"
            )))
        }
    };
    let token = match o.token.to_str("token")? {
        "" => None,
        text => Some(Token::new(text)?),
    };
    let tls_ca = slice(o.tls_ca, o.tls_ca_size, "tls_ca")?;
    let tls_ca = (!tls_ca.is_empty()).then(|| tls_ca.to_vec());
    let tls_domain = match o.tls_domain.to_str("tls_domain")? {
        "" => None,
        domain => Some(domain.to_string()),
    };
    let addresses = slice(o.workers, o.num_workers, "workers")?
        .iter()
        .enumerate()
        .map(|(i, address)| address.to_str(&format!("workers[{i}]")))
        .collect::<Result<Vec<_>>>()?;
    let mut connect = ConnectOptions::new("", token);
    if o.timeout_ms != 0 {
        connect.timeout = Duration::from_millis(u64::from(o.timeout_ms));
    }
    connect.tls_ca = tls_ca;
    connect.tls_domain = tls_domain;
    let local = local_options(
        o.num_cpu_devices,
        o.executor_threads,
        o.max_executor_threads,
    );
    Ok(ClusterOptions::uniform(
        addresses,
        &connect,
        include_local,
        local,
    ))
}

/// Creates a client of worker hosts (and of this process too, with
/// `include_local`): connects to every worker and opens a session on each.
/// Devices get global ids host after host. `options` is required and only read
/// during the call. On success `*out` is a new client the caller owns (destroy
/// with `colocated_client_destroy`; the sessions close, without blocking, once
/// every object made from the client is gone); on error `*out` is not written.
///
/// Blocking: connects to the workers at once, waiting up to `timeout_ms` for
/// each (a worker that refuses connections, still starting, is tried again
/// until then).
/// Errors: `invalid_argument` for a bad options struct, an address that does not
/// parse, a bad token, out-of-range counts or no host at all (no workers and
/// `include_local` 0); `unavailable` for a worker that cannot be reached (for
/// several failing workers, one error names each);
/// `unauthenticated` for a token a worker refuses; `failed_precondition` for a
/// worker that speaks no common protocol version or release, or has no devices;
/// `unimplemented` for a worker with devices this build cannot drive. Messages
/// about a worker name its address.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_connect(
    options: *const colocated_connect_options,
    out: *mut *mut colocated_client,
) -> *mut colocated_error {
    boundary(|| {
        let o = read_versioned(options, false)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let client = Client::connect(&cluster_options(&o)?)?;
        put_box(out, colocated_client::new(ClientShell::new(client)), "out")
    })
}

/// The PJRT options of `o` (core's rules, as a worker's flags), or none.
unsafe fn pjrt_options(
    o: &colocated_client_options,
) -> Result<Option<colocated_core::PjrtOptions>> {
    let plugin = o.pjrt_plugin.to_str("pjrt_plugin")?;
    let options = crate::handle::slice(o.pjrt_options, o.num_pjrt_options, "pjrt_options")?
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let text = s.to_str(&format!("pjrt_options[{i}]"))?;
            colocated_core::worker::parse_pjrt_option(text)
        })
        .collect::<Result<Vec<_>>>()?;
    colocated_core::PjrtOptions::of((!plugin.is_empty()).then_some(plugin), options)
}
