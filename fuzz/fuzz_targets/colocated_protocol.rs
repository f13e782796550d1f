//! The colocated protocol's decoders: a host loading a `colocated` program of
//! arbitrary payload, and a controller deriving a call's global outputs from
//! arbitrary discovery reports (the input format is in
//! `colocated_core::fuzzing::colocated_protocol`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colocated_core::fuzzing::colocated_protocol(data);
});
