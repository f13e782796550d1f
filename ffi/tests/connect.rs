//! `colocated_client_connect` against workers served in this process over real
//! loopback sockets (the C tests start no workers): the hosts it reports and the
//! errors of a refused token.

use std::ptr;
use std::time::{Duration, Instant};

use colocated::*;
use colocated_core::transport::Token;
use colocated_core::worker::{Worker, WorkerOptions};
use colocated_core::{Client, ClientOptions};

fn start_worker(token: &Token, devices: usize) -> Worker {
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(devices),
        executor_threads: Some(2),
        ..Default::default()
    })
    .unwrap();
    Worker::start(client, WorkerOptions::new(Some(token.clone()))).unwrap()
}

fn view(s: &str) -> colocated_string_view {
    colocated_string_view {
        data: s.as_ptr().cast(),
        size: s.len(),
    }
}

fn text(v: colocated_string_view) -> String {
    // SAFETY: the library returns views of `size` valid bytes.
    let bytes = unsafe { std::slice::from_raw_parts(v.data.cast::<u8>(), v.size) };
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn options(
    workers: &[colocated_string_view],
    token: &str,
    include_local: bool,
) -> colocated_connect_options {
    colocated_connect_options {
        struct_size: std::mem::size_of::<colocated_connect_options>(),
        workers: workers.as_ptr(),
        num_workers: workers.len(),
        token: view(token),
        tls_ca: ptr::null(),
        tls_ca_size: 0,
        tls_domain: view(""),
        timeout_ms: 5000,
        include_local: u32::from(include_local),
        num_cpu_devices: 1,
        executor_threads: 2,
        max_executor_threads: 0,
        reserved: 0,
    }
}

/// `Ok(())` for NULL, else the error's code and message (the error is destroyed).
fn outcome(err: *mut colocated_error) -> Result<(), (colocated_error_code, String)> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: `err` is an error the library returned, destroyed once.
    unsafe {
        let found = (
            colocated_error_get_code(err),
            text(colocated_error_message(err)),
        );
        colocated_error_destroy(err);
        Err(found)
    }
}

struct HostView {
    process_index: u32,
    name: String,
    remote: bool,
    device_ids: Vec<u32>,
}

fn hosts(client: *const colocated_client) -> Vec<HostView> {
    // SAFETY: `client` is live; the lists are borrowed from it.
    unsafe {
        let mut items = ptr::null();
        let mut count = 0;
        outcome(colocated_client_hosts(client, &mut items, &mut count)).unwrap();
        std::slice::from_raw_parts(items, count)
            .iter()
            .map(|&h| {
                let mut process_index = 0;
                let mut name = colocated_string_view {
                    data: ptr::null(),
                    size: 0,
                };
                let mut remote = false;
                let mut devices = ptr::null();
                let mut num_devices = 0;
                outcome(colocated_host_process_index(h, &mut process_index)).unwrap();
                outcome(colocated_host_name(h, &mut name)).unwrap();
                outcome(colocated_host_is_remote(h, &mut remote)).unwrap();
                outcome(colocated_host_devices(h, &mut devices, &mut num_devices)).unwrap();
                let device_ids = std::slice::from_raw_parts(devices, num_devices)
                    .iter()
                    .map(|&d| {
                        let mut id = 0;
                        outcome(colocated_device_id(d, &mut id)).unwrap();
                        id
                    })
                    .collect();
                HostView {
                    process_index,
                    name: text(name),
                    remote,
                    device_ids,
                }
            })
            .collect()
    }
}

#[test]
fn connect_reports_the_local_host_then_each_worker_as_a_remote_host() {
    let token = Token::generate().unwrap();
    let (a, b) = (start_worker(&token, 2), start_worker(&token, 3));
    let (addr_a, addr_b) = (a.local_addr().to_string(), b.local_addr().to_string());
    let workers = [view(&addr_a), view(&addr_b)];
    let o = options(&workers, token.expose(), true);
    let mut client = ptr::null_mut();
    // SAFETY: valid options and out-parameter.
    outcome(unsafe { colocated_client_connect(&o, &mut client) }).unwrap();
    assert!(!client.is_null());
    let hosts = hosts(client);
    let described: Vec<(u32, &str, bool, &[u32])> = hosts
        .iter()
        .map(|h| {
            (
                h.process_index,
                h.name.as_str(),
                h.remote,
                h.device_ids.as_slice(),
            )
        })
        .collect();
    assert_eq!(
        described,
        vec![
            (0, "local", false, &[0][..]),
            (1, addr_a.as_str(), true, &[1, 2][..]),
            (2, addr_b.as_str(), true, &[3, 4, 5][..]),
        ]
    );
    assert_eq!((a.session_count(), b.session_count()), (1, 1));
    // SAFETY: the client is destroyed once.
    unsafe { colocated_client_destroy(client) };
    // The sessions close in the background (destroy never blocks).
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.session_count() + b.session_count() > 0 {
        assert!(
            Instant::now() < deadline,
            "the sessions of a destroyed client stay open"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn connect_without_the_local_host_has_only_remote_hosts() {
    let token = Token::generate().unwrap();
    let worker = start_worker(&token, 2);
    let address = worker.local_addr().to_string();
    let workers = [view(&address)];
    let o = options(&workers, token.expose(), false);
    let mut client = ptr::null_mut();
    // SAFETY: valid options and out-parameter.
    outcome(unsafe { colocated_client_connect(&o, &mut client) }).unwrap();
    let hosts = hosts(client);
    assert_eq!(hosts.len(), 1);
    assert!(hosts[0].remote);
    assert_eq!(hosts[0].process_index, 1);
    assert_eq!(hosts[0].device_ids, vec![0, 1]);
    // SAFETY: the client is destroyed once.
    unsafe { colocated_client_destroy(client) };
}

#[test]
fn a_token_the_worker_refuses_is_unauthenticated_and_makes_nothing() {
    let worker = start_worker(&Token::generate().unwrap(), 1);
    let address = worker.local_addr().to_string();
    let workers = [view(&address)];
    let mut client = ptr::null_mut();
    for token in ["wrong-token", ""] {
        let o = options(&workers, token, true);
        // SAFETY: valid options and out-parameter.
        let (code, message) =
            outcome(unsafe { colocated_client_connect(&o, &mut client) }).unwrap_err();
        assert_eq!(
            code,
            colocated_error_code::COLOCATED_UNAUTHENTICATED,
            "{message}"
        );
        assert!(message.contains(&address), "{message}");
        assert!(!message.contains("wrong-token"), "{message}");
    }
    assert!(client.is_null());
    assert_eq!(worker.session_count(), 0);
}
