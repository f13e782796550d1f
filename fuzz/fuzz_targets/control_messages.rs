//! Control-plane requests a worker receives: a `Control` stream of
//! `ControlRequest`s, a `LoadExecutableRequest` or an `OpenSessionRequest`,
//! as arbitrary gRPC bodies on a throwaway session (the input format is in
//! `colocated_core::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colocated_core::fuzzing::control_messages(data);
});
