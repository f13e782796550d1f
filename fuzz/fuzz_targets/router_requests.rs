//! Requests as a stranger sends them, through a worker's router: without the
//! token, or without an open session where one is needed, each must be
//! refused before a byte of its body is read (the input format is in
//! `colocated_core::fuzzing::router_requests`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colocated_core::fuzzing::router_requests(data);
});
