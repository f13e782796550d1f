//! Buffer uploads a worker receives: a `PutBuffer` stream of `PutBufferChunk`s
//! as an arbitrary gRPC body on a throwaway session (the input format is in
//! `colocated_core::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colocated_core::fuzzing::buffer_chunks(data);
});
