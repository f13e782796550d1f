//! Bytes on a connection to a worker's port, as a lane's: after a valid
//! opening for a throwaway session (frames of `ControlRequest`s), or the
//! whole opening itself (the input format is in
//! `colocated_core::fuzzing::lane_bytes`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colocated_core::fuzzing::lane_bytes(data);
});
