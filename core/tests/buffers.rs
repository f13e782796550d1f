//! Buffers: creation from host memory under each host-buffer semantics, every dtype,
//! host round trips, deletion, external references, placement errors and copies.

mod common;

use std::time::Duration;

use colocated_core::*;
use common::*;

/// `n` distinct bytes.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

fn from_host(
    client: &Client,
    data: &[u8],
    dtype: DType,
    dims: &[i64],
    device: &Device,
    memory_space: Option<&MemorySpace>,
    semantics: HostBufferSemantics,
) -> Result<(Buffer, Event)> {
    // SAFETY: every caller keeps `data` alive and unchanged until the done event is
    // ready (zero-copy tests drop the buffer before the data).
    unsafe {
        Buffer::from_host_raw(
            client,
            data.as_ptr(),
            data.len(),
            dtype,
            dims,
            device,
            memory_space,
            semantics,
        )
    }
}

/// A zero-copy buffer of `data` (as `dtype` of `dims`) on `device`, and its
/// done event (`data` must outlive it).
fn zero_copy(
    client: &Client,
    data: &[u8],
    dtype: DType,
    dims: &[i64],
    device: &Device,
) -> (Buffer, Event) {
    from_host(
        client,
        data,
        dtype,
        dims,
        device,
        None,
        HostBufferSemantics::ImmutableZeroCopy,
    )
    .unwrap()
}

/// A uint8 buffer of `data` (copied during the call) with `dims` on `device`,
/// in `memory`.
fn bytes_in(
    client: &Client,
    data: &[u8],
    dims: &[i64],
    device: &Device,
    memory: &MemorySpace,
) -> Result<(Buffer, Event)> {
    from_host(
        client,
        data,
        DType::U8,
        dims,
        device,
        Some(memory),
        HostBufferSemantics::ImmutableOnlyDuringCall,
    )
}

fn memory_of_kind(device: &Device, kind: MemoryKind) -> MemorySpace {
    device
        .memory_spaces()
        .iter()
        .find(|m| m.kind() == kind)
        .cloned()
        .expect("the device addresses a memory space of that kind")
}

#[test]
fn immutable_only_during_call_copies_so_the_caller_may_reuse_its_memory() {
    let client = client(2);
    let device = &client.devices()[0];
    let mut data = i32_bytes(&[1, 2, 3, 4]);
    let (buffer, done) = from_host(
        &client,
        &data,
        DType::I32,
        &[2, 2],
        device,
        None,
        HostBufferSemantics::ImmutableOnlyDuringCall,
    )
    .unwrap();
    assert!(done.is_ready(), "the data was copied during the call");
    done.wait().unwrap();
    data.fill(0xee);
    assert_eq!(i32_values(&buffer.to_host_vec().unwrap()), vec![1, 2, 3, 4]);
    assert!(buffer.ready_event().is_ready());
    assert_eq!(buffer.dtype(), DType::I32);
    assert_eq!(buffer.dims(), &[2, 2]);
    assert_eq!(buffer.device(), device);
    assert_eq!(buffer.memory_space(), device.default_memory_space());
    assert_eq!(buffer.client().id(), client.id());
}

#[test]
fn immutable_until_transfer_completes_keeps_the_data_after_the_done_event() {
    let client = client(2);
    let device = &client.devices()[1];
    let mut data = i32_bytes(&[5, 6, 7]);
    let (buffer, done) = from_host(
        &client,
        &data,
        DType::I32,
        &[3],
        device,
        None,
        HostBufferSemantics::ImmutableUntilTransferCompletes,
    )
    .unwrap();
    done.wait_timeout(PATIENCE).unwrap();
    data.fill(0);
    assert_eq!(i32_values(&buffer.to_host_vec().unwrap()), vec![5, 6, 7]);
    assert_eq!(buffer.device(), device);
}

#[test]
fn zero_copy_aliases_caller_memory_until_the_buffer_and_every_clone_are_dropped() {
    let client = client(2);
    let device = &client.devices()[0];
    let data = u64_bytes(&[10, 20, 30, 40]);
    let (buffer, done) = zero_copy(&client, &data, DType::U64, &[4], device);
    assert!(!done.is_ready(), "the buffer uses the caller's memory");
    {
        let pinned = buffer.acquire_external_reference().unwrap();
        assert_eq!(
            pinned.data_ptr() as *const u8,
            data.as_ptr(),
            "zero-copy must alias the caller's memory"
        );
        assert_eq!(pinned.len(), data.len());
    }
    let clone = buffer.clone();
    assert!(clone.same_as(&buffer));
    drop(buffer);
    std::thread::sleep(Duration::from_millis(10));
    assert!(!done.is_ready(), "a clone still uses the caller's memory");
    assert_eq!(clone.to_host_vec().unwrap(), data);
    drop(clone);
    done.wait_timeout(PATIENCE).unwrap();
}

#[test]
fn host_memory_is_zeroed_aligned_and_becomes_a_buffer_without_a_copy() {
    let client = client(2);
    let device = &client.devices()[0];
    let mut memory = HostMemory::zeroed(32).unwrap();
    assert_eq!(memory.len(), 32);
    assert!(memory.as_slice().iter().all(|&b| b == 0));
    let written = memory.as_mut_slice();
    assert_eq!(written.as_ptr() as usize % 64, 0, "64-byte aligned");
    written.copy_from_slice(&u64_bytes(&[1, 2, 3, 4]));
    let address = written.as_ptr();
    let buffer = Buffer::from_host_memory(&client, memory, DType::U64, &[4], device).unwrap();
    assert_eq!(
        buffer.acquire_external_reference().unwrap().data_ptr() as *const u8,
        address,
        "the buffer owns the memory it was given"
    );
    assert_eq!(buffer.to_host_vec().unwrap(), u64_bytes(&[1, 2, 3, 4]));
    let empty = HostMemory::zeroed(0).unwrap();
    assert!(empty.is_empty());
    let buffer = Buffer::from_host_memory(&client, empty, DType::F32, &[0, 3], device).unwrap();
    assert!(buffer.to_host_vec().unwrap().is_empty());
    assert_error(
        Buffer::from_host_memory(
            &client,
            HostMemory::zeroed(8).unwrap(),
            DType::U64,
            &[2],
            device,
        ),
        ErrorCode::InvalidArgument,
        "host memory is 8 bytes but uint64[2] needs 16",
    );
}

#[test]
fn zero_copy_done_event_waits_for_a_copy_that_reads_the_buffer() {
    let client = client(2);
    let data = pattern(64);
    let (buffer, done) = zero_copy(&client, &data, DType::U8, &[8, 8], &client.devices()[0]);
    let copy = buffer.copy_to_device(&client.devices()[1]).unwrap();
    drop(buffer);
    assert_eq!(copy.to_host_vec().unwrap(), data);
    done.wait_timeout(PATIENCE).unwrap();
    assert_eq!(copy.to_host_vec().unwrap(), data, "the copy owns its bytes");
}

#[test]
fn delete_does_not_release_zero_copy_memory_while_an_external_reference_is_held() {
    let client = client(1);
    let data = pattern(32);
    let (buffer, done) = zero_copy(&client, &data, DType::U8, &[32], &client.devices()[0]);
    let pinned = buffer.acquire_external_reference().unwrap();
    buffer.delete();
    assert!(buffer.is_deleted());
    std::thread::sleep(Duration::from_millis(10));
    assert!(
        !done.is_ready(),
        "the external reference still pins the data"
    );
    // SAFETY: the reference keeps the bytes valid for `len` bytes while it lives.
    let seen = unsafe { std::slice::from_raw_parts(pinned.data_ptr(), pinned.len()) };
    assert_eq!(seen, &data[..]);
    drop(pinned);
    done.wait_timeout(PATIENCE).unwrap();
    drop(buffer);
}

#[test]
fn delete_keeps_owned_bytes_valid_for_an_external_reference() {
    let client = client(1);
    let data = i32_bytes(&[9, 8, 7, 6]);
    let buffer =
        Buffer::from_bytes(&client, &data, DType::I32, &[4], &client.devices()[0]).unwrap();
    let pinned = buffer.acquire_external_reference().unwrap();
    assert!(!pinned.is_empty());
    buffer.delete();
    drop(buffer);
    // SAFETY: the reference keeps the bytes valid for `len` bytes while it lives.
    let seen = unsafe { std::slice::from_raw_parts(pinned.data_ptr(), pinned.len()) };
    assert_eq!(seen, &data[..]);
}

#[test]
fn every_dtype_round_trips_through_host_memory_for_matrices_scalars_and_empty_shapes() {
    let client = client(2);
    let device = &client.devices()[1];
    for dtype in DType::ALL {
        for dims in [&[2i64, 3][..], &[][..], &[0, 3][..]] {
            let n: usize = dims.iter().map(|d| *d as usize).product();
            let what = format!("{}{dims:?}", dtype.name());
            let (buffer, expected) = match dtype.byte_size() {
                Some(size) => {
                    let data = pattern(n * size);
                    let buffer = Buffer::from_bytes(&client, &data, dtype, dims, device)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    (buffer, data)
                }
                None => {
                    let strings: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
                    let buffer = Buffer::from_strings(&client, &strings, dims, device, None)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(buffer.to_strings().unwrap(), strings, "{what}");
                    let mut layout = Vec::new();
                    let mut at = 0u64;
                    for s in &strings {
                        layout.extend_from_slice(&at.to_le_bytes());
                        at += s.len() as u64;
                    }
                    layout.extend_from_slice(&at.to_le_bytes());
                    strings
                        .iter()
                        .for_each(|s| layout.extend_from_slice(s.as_bytes()));
                    (buffer, layout)
                }
            };
            assert_eq!(buffer.dtype(), dtype, "{what}");
            assert_eq!(buffer.dims(), dims, "{what}");
            assert_eq!(buffer.on_host_size().unwrap(), expected.len(), "{what}");
            assert_eq!(buffer.to_host_vec().unwrap(), expected, "{what}");
            let mut out = vec![0xabu8; expected.len()];
            // SAFETY: `out` is exactly on_host_size long and outlives the wait.
            let event = unsafe { buffer.to_host_raw(out.as_mut_ptr(), out.len()) }.unwrap();
            event.wait_timeout(PATIENCE).unwrap();
            assert_eq!(out, expected, "{what}");
        }
    }
}

#[test]
fn every_dense_dtype_is_accepted_under_every_host_buffer_semantics() {
    let client = client(1);
    let device = &client.devices()[0];
    for semantics in [
        HostBufferSemantics::ImmutableOnlyDuringCall,
        HostBufferSemantics::ImmutableUntilTransferCompletes,
        HostBufferSemantics::ImmutableZeroCopy,
    ] {
        for dtype in DType::ALL.into_iter().filter(|d| *d != DType::String) {
            let data = pattern(6 * dtype.byte_size().unwrap());
            let (buffer, done) =
                from_host(&client, &data, dtype, &[3, 2], device, None, semantics).unwrap();
            assert_eq!(
                buffer.to_host_vec().unwrap(),
                data,
                "{semantics:?} {dtype:?}"
            );
            drop(buffer);
            done.wait_timeout(PATIENCE).unwrap();
        }
    }
    for v in [1u32, 2, 3] {
        HostBufferSemantics::from_u32(v).unwrap();
    }
    assert_error(
        HostBufferSemantics::from_u32(0),
        ErrorCode::InvalidArgument,
        "unknown host buffer semantics 0",
    );
}

#[test]
fn string_to_host_layout_is_little_endian_offsets_then_utf8_bytes() {
    let client = client(1);
    let device = &client.devices()[0];
    let strings = ["a", "", "héllo", "xyz"];
    let buffer = Buffer::from_strings(&client, &strings, &[2, 2], device, None).unwrap();
    assert_eq!(buffer.dtype(), DType::String);
    let bytes = buffer.to_host_vec().unwrap();
    assert_eq!(buffer.on_host_size().unwrap(), 5 * 8 + 1 + 6 + 3);
    let offsets: Vec<u64> = bytes[..40]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(offsets, vec![0, 1, 1, 7, 10]);
    assert_eq!(&bytes[40..], "ahélloxyz".as_bytes());

    let scalar = Buffer::from_strings(&client, &["only"], &[], device, None).unwrap();
    let mut expected = u64_bytes(&[0, 4]);
    expected.extend_from_slice(b"only");
    assert_eq!(scalar.to_host_vec().unwrap(), expected);

    let empty = Buffer::from_strings::<&str>(&client, &[], &[0, 3], device, None).unwrap();
    assert_eq!(empty.to_host_vec().unwrap(), u64_bytes(&[0]));
    assert_eq!(empty.to_strings().unwrap(), Vec::<String>::new());
}

#[test]
fn string_to_host_raw_checks_the_destination_size() {
    let client = client(1);
    let buffer =
        Buffer::from_strings(&client, &["ab", "c"], &[2], &client.devices()[0], None).unwrap();
    let mut short = vec![0u8; 10];
    // SAFETY: `short` is 10 bytes and outlives the wait.
    let result = unsafe { buffer.to_host_raw(short.as_mut_ptr(), short.len()) }
        .and_then(|event| event.wait());
    assert_error(
        result,
        ErrorCode::InvalidArgument,
        "destination is 10 bytes",
    );
}

#[test]
fn to_host_raw_rejects_a_dense_destination_of_the_wrong_size() {
    let client = client(1);
    let buffer =
        Buffer::from_bytes(&client, &[0; 12], DType::F32, &[3], &client.devices()[0]).unwrap();
    let mut out = vec![0u8; 8];
    // SAFETY: the call fails before anything is written.
    let result = unsafe { buffer.to_host_raw(out.as_mut_ptr(), out.len()) };
    assert_error(result, ErrorCode::InvalidArgument, "destination is 8 bytes");
}

#[test]
fn to_strings_of_a_dense_buffer_is_invalid_argument() {
    let client = client(1);
    let buffer =
        Buffer::from_bytes(&client, &[1, 2], DType::U8, &[2], &client.devices()[0]).unwrap();
    assert_error(
        buffer.to_strings(),
        ErrorCode::InvalidArgument,
        "is not a string buffer",
    );
}

#[test]
fn a_deleted_buffer_reports_deleted_and_fails_later_uses_with_failed_precondition() {
    let client = client(2);
    let buffer = Buffer::from_bytes(
        &client,
        &[1, 2, 3, 4],
        DType::U8,
        &[4],
        &client.devices()[0],
    )
    .unwrap();
    let clone = buffer.clone();
    assert!(!buffer.is_deleted());
    buffer.check_live().unwrap();
    buffer.delete();
    buffer.delete();
    assert!(
        buffer.is_deleted() && clone.is_deleted(),
        "clones share state"
    );
    let fp = ErrorCode::FailedPrecondition;
    assert_error(buffer.check_live(), fp, "was deleted");
    assert_error(clone.to_host_vec(), fp, "was deleted");
    assert_error(buffer.on_host_size(), fp, "was deleted");
    let mut out = [0u8; 4];
    // SAFETY: the call fails before anything is written.
    assert_error(
        unsafe { buffer.to_host_raw(out.as_mut_ptr(), out.len()) },
        fp,
        "was deleted",
    );
    assert_error(
        buffer.acquire_external_reference().map(|_| ()),
        fp,
        "was deleted",
    );
    assert_error(
        buffer.copy_to_device(&client.devices()[1]),
        fp,
        "was deleted",
    );
    let pinned = memory_of_kind(&client.devices()[0], MemoryKind::PinnedHost);
    assert_error(buffer.copy_to_memory_space(&pinned), fp, "was deleted");

    let strings = Buffer::from_strings(&client, &["x"], &[1], &client.devices()[0], None).unwrap();
    strings.delete();
    assert_error(strings.to_strings(), fp, "was deleted");
    assert_error(strings.on_host_size(), fp, "was deleted");
}

#[test]
fn from_host_rejects_data_of_the_wrong_size() {
    let client = client(1);
    let device = &client.devices()[0];
    assert_error(
        Buffer::from_bytes(&client, &[0; 3], DType::I32, &[1], device),
        ErrorCode::InvalidArgument,
        "data is 3 bytes but int32[1] needs 4",
    );
    assert_error(
        Buffer::from_bytes(&client, &[0; 4], DType::F64, &[], device),
        ErrorCode::InvalidArgument,
        "needs 8",
    );
    assert_error(
        Buffer::from_bytes(&client, &[0; 1], DType::U8, &[0, 3], device),
        ErrorCode::InvalidArgument,
        "data is 1 bytes",
    );
    assert_error(
        Buffer::from_strings(&client, &["a", "b"], &[3], device, None),
        ErrorCode::InvalidArgument,
        "2 strings given but dims [3] need 3",
    );
}

#[test]
fn from_host_rejects_negative_dims() {
    let client = client(1);
    let device = &client.devices()[0];
    assert_error(
        Buffer::from_bytes(&client, &[], DType::F32, &[2, -1], device),
        ErrorCode::InvalidArgument,
        "dimension 1 is negative (-1)",
    );
    assert_error(
        Buffer::from_strings::<&str>(&client, &[], &[-3], device, None),
        ErrorCode::InvalidArgument,
        "negative",
    );
}

#[test]
fn from_host_rejects_overflowing_dims() {
    let client = client(1);
    let device = &client.devices()[0];
    assert_error(
        Buffer::from_bytes(&client, &[], DType::I32, &[i64::MAX, 4], device),
        ErrorCode::InvalidArgument,
        "overflow",
    );
    assert_error(
        Buffer::from_bytes(&client, &[], DType::F64, &[1 << 61], device),
        ErrorCode::InvalidArgument,
        "overflow the byte size",
    );
    assert_error(
        Buffer::from_strings::<&str>(&client, &[], &[i64::MAX, i64::MAX], device, None),
        ErrorCode::InvalidArgument,
        "overflow",
    );
}

#[test]
fn from_host_raw_rejects_strings_and_null_data() {
    let client = client(1);
    let device = &client.devices()[0];
    assert_error(
        from_host(
            &client,
            &[0; 8],
            DType::String,
            &[1],
            device,
            None,
            HostBufferSemantics::ImmutableOnlyDuringCall,
        ),
        ErrorCode::InvalidArgument,
        "string buffers are made from strings",
    );
    // SAFETY: the call fails on the NULL pointer before reading.
    let result = unsafe {
        Buffer::from_host_raw(
            &client,
            std::ptr::null(),
            4,
            DType::I32,
            &[1],
            device,
            None,
            HostBufferSemantics::ImmutableOnlyDuringCall,
        )
    };
    assert_error(result, ErrorCode::InvalidArgument, "data is NULL");
}

#[test]
fn from_host_rejects_a_device_or_memory_space_of_another_client() {
    let ours = client(2);
    let theirs = client(2);
    let foreign = &theirs.devices()[0];
    assert_error(
        Buffer::from_bytes(&ours, &[1], DType::U8, &[1], foreign),
        ErrorCode::InvalidArgument,
        "belongs to another client",
    );
    assert_error(
        Buffer::from_strings(&ours, &["x"], &[1], foreign, None),
        ErrorCode::InvalidArgument,
        "belongs to another client",
    );
    let foreign_memory = theirs.devices()[0].default_memory_space().clone();
    assert_error(
        bytes_in(&ours, &[1], &[1], &ours.devices()[0], &foreign_memory),
        ErrorCode::InvalidArgument,
        "belongs to another client",
    );
}

#[test]
fn from_host_rejects_a_memory_space_the_device_cannot_address() {
    let client = client(2);
    let (d0, d1) = (&client.devices()[0], &client.devices()[1]);
    let other_device_memory = d1.default_memory_space().clone();
    assert_eq!(other_device_memory.kind(), MemoryKind::Device);
    assert!(!other_device_memory.device_ids().contains(&d0.id()));
    assert_error(
        bytes_in(&client, &[1, 2], &[2], d0, &other_device_memory),
        ErrorCode::InvalidArgument,
        "cannot address",
    );
    assert_error(
        Buffer::from_strings(&client, &["x"], &[1], d0, Some(&other_device_memory)),
        ErrorCode::InvalidArgument,
        "cannot address",
    );
}

#[test]
fn from_host_places_the_buffer_in_the_requested_host_memory_space() {
    let client = client(2);
    let device = &client.devices()[1];
    for kind in [MemoryKind::PinnedHost, MemoryKind::UnpinnedHost] {
        let memory = memory_of_kind(device, kind);
        let (buffer, _done) = bytes_in(&client, &[4, 5], &[2], device, &memory).unwrap();
        assert_eq!(buffer.memory_space(), &memory);
        assert_eq!(buffer.memory_space().kind(), kind);
        assert_eq!(buffer.device(), device);
        assert_eq!(buffer.to_host_vec().unwrap(), vec![4, 5]);
        let strings = Buffer::from_strings(&client, &["p"], &[], device, Some(&memory)).unwrap();
        assert_eq!(strings.memory_space().kind(), kind);
    }
}

#[test]
fn copy_to_device_puts_equal_data_on_the_new_device() {
    let client = client(3);
    let data = i32_bytes(&[1, -2, 3, -4, 5, -6]);
    let source =
        Buffer::from_bytes(&client, &data, DType::I32, &[2, 3], &client.devices()[0]).unwrap();
    let target = &client.devices()[2];
    let copy = source.copy_to_device(target).unwrap();
    assert!(!copy.same_as(&source));
    assert_eq!(copy.device(), target);
    assert_eq!(copy.memory_space(), target.default_memory_space());
    assert_eq!(copy.dtype(), DType::I32);
    assert_eq!(copy.dims(), &[2, 3]);
    copy.ready_event().wait_timeout(PATIENCE).unwrap();
    assert_eq!(copy.to_host_vec().unwrap(), data);
    copy.delete();
    assert_eq!(
        source.to_host_vec().unwrap(),
        data,
        "the copy is independent"
    );

    let strings =
        Buffer::from_strings(&client, &["α", "β"], &[2], &client.devices()[1], None).unwrap();
    let copied = strings.copy_to_device(&client.devices()[0]).unwrap();
    assert_eq!(copied.device(), &client.devices()[0]);
    assert_eq!(copied.to_strings().unwrap(), vec!["α", "β"]);

    let scalar = Buffer::from_bytes(&client, &[1], DType::Bool, &[], target).unwrap();
    let copied = scalar.copy_to_device(&client.devices()[0]).unwrap();
    assert_eq!(copied.to_host_vec().unwrap(), vec![1]);
    let empty = Buffer::from_bytes(&client, &[], DType::F16, &[0, 3], target).unwrap();
    let copied = empty.copy_to_device(&client.devices()[1]).unwrap();
    assert_eq!(copied.to_host_vec().unwrap(), Vec::<u8>::new());
}

#[test]
fn copy_to_device_rejects_a_device_of_another_client() {
    let ours = client(1);
    let theirs = client(1);
    let buffer = Buffer::from_bytes(&ours, &[1], DType::U8, &[1], &ours.devices()[0]).unwrap();
    assert_error(
        buffer.copy_to_device(&theirs.devices()[0]),
        ErrorCode::InvalidArgument,
        "belongs to another client",
    );
    let foreign_memory = theirs.memory_spaces()[0].clone();
    assert_error(
        buffer.copy_to_memory_space(&foreign_memory),
        ErrorCode::InvalidArgument,
        "belongs to another client",
    );
}

#[test]
fn copy_to_memory_space_keeps_the_device_for_pinned_host_memory() {
    let client = client(2);
    let device = &client.devices()[1];
    let data = pattern(16);
    let source = Buffer::from_bytes(&client, &data, DType::U16, &[8], device).unwrap();
    let pinned = memory_of_kind(device, MemoryKind::PinnedHost);
    let copy = source.copy_to_memory_space(&pinned).unwrap();
    assert_eq!(copy.memory_space(), &pinned);
    assert_eq!(copy.memory_space().kind(), MemoryKind::PinnedHost);
    assert_eq!(
        copy.device(),
        device,
        "the device can address pinned memory"
    );
    assert_eq!(copy.to_host_vec().unwrap(), data);

    let back = copy
        .copy_to_memory_space(device.default_memory_space())
        .unwrap();
    assert_eq!(back.memory_space().kind(), MemoryKind::Device);
    assert_eq!(back.to_host_vec().unwrap(), data);
}

#[test]
fn copy_to_memory_space_of_another_device_moves_the_buffer_to_that_device() {
    let client = client(2);
    let (d0, d1) = (&client.devices()[0], &client.devices()[1]);
    let source = Buffer::from_bytes(&client, &[7, 8, 9], DType::I8, &[3], d0).unwrap();
    let copy = source
        .copy_to_memory_space(d1.default_memory_space())
        .unwrap();
    assert_eq!(copy.device(), d1);
    assert_eq!(copy.memory_space(), d1.default_memory_space());
    assert_eq!(copy.to_host_vec().unwrap(), vec![7, 8, 9]);
}

#[test]
fn deleting_the_source_right_after_copy_to_device_does_not_break_the_pending_copy() {
    // The copy is an in-flight user of the source: delete frees the data only
    // once it is done (PJRT's usage events).
    let client = client(2);
    let gate = Event::new();
    register_gate(&client, "gate", &gate);
    let blocker = compile_nullary(&client, "gate", &client.devices()[0]);
    let data = pattern(8);
    let source = Buffer::from_bytes(&client, &data, DType::U8, &[8], &client.devices()[0]).unwrap();
    // Holds this thread's default stream, on which copy_to_device runs.
    let blocked = blocker.execute(&[], &ExecuteOptions::default()).unwrap();
    let copy = source.copy_to_device(&client.devices()[1]).unwrap();
    source.delete();
    gate.set(Ok(())).unwrap();
    blocked.status.wait_timeout(PATIENCE).unwrap();
    copy.ready_event().wait_timeout(PATIENCE).unwrap();
    assert_eq!(copy.to_host_vec().unwrap(), data);
}

#[test]
fn copy_to_device_runs_in_program_order_on_the_calling_threads_stream() {
    let client = client(2);
    let gate = Event::new();
    register_gate(&client, "gate", &gate);
    let blocker = compile_nullary(&client, "gate", &client.devices()[0]);
    let source =
        Buffer::from_bytes(&client, &[1, 2], DType::U8, &[2], &client.devices()[0]).unwrap();
    let blocked = blocker.execute(&[], &ExecuteOptions::default()).unwrap();
    let copy = source.copy_to_device(&client.devices()[1]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !copy.ready_event().is_ready(),
        "the copy waits behind the blocked execution of its stream"
    );
    gate.set(Ok(())).unwrap();
    blocked.status.wait_timeout(PATIENCE).unwrap();
    assert_eq!(copy.to_host_vec().unwrap(), vec![1, 2]);
}

#[test]
fn arrays_land_in_each_devices_memory_space_of_the_kind_asked() {
    let client = client(2);
    let devices = client.devices().to_vec();
    let sharding = Sharding::replicated(devices.clone()).unwrap();
    let spec = ArraySpec::new(vec![2], DType::U8, sharding).unwrap();
    let dense =
        Array::from_host_bytes_in(&client, &[1, 2], spec.clone(), Some(MemoryKind::PinnedHost))
            .unwrap();
    assert_eq!(dense.memory_kind(), MemoryKind::PinnedHost);
    for (buffer, device) in dense.buffers().iter().zip(&devices) {
        assert_eq!(
            buffer.memory_space(),
            &memory_of_kind(device, MemoryKind::PinnedHost)
        );
        assert_eq!(buffer.to_host_vec().unwrap(), vec![1, 2]);
    }
    let spec = ArraySpec::new(vec![2], DType::String, spec.sharding).unwrap();
    let strings =
        Array::from_host_strings_in(&client, &["a", "b"], spec, Some(MemoryKind::UnpinnedHost))
            .unwrap();
    assert_eq!(strings.memory_kind(), MemoryKind::UnpinnedHost);
    // An array's sharding says the memory it is in: its spec places another.
    assert_eq!(dense.sharding().memory_kind(), Some(MemoryKind::PinnedHost));
    let again = Array::from_host_bytes(&client, &[3, 4], dense.spec().clone()).unwrap();
    assert_eq!(again.memory_kind(), MemoryKind::PinnedHost);
    let default = ArraySpec::new(
        vec![2],
        DType::U8,
        Sharding::replicated(devices.clone()).unwrap(),
    )
    .unwrap();
    let plain = Array::from_host_bytes(&client, &[3, 4], default).unwrap();
    assert_eq!(plain.memory_kind(), MemoryKind::Device);
    assert_eq!(plain.sharding().memory_kind(), None);
    // Copies shard by shard land in default memory: another kind is refused
    // (put_to places it there).
    assert_error(
        plain.copy_to_sharding(dense.sharding().clone(), None),
        ErrorCode::InvalidArgument,
        "not in pinned_host memory",
    );
    let placed = plain
        .put_to(&client, dense.sharding().clone(), None, None)
        .unwrap();
    assert_eq!(placed.memory_kind(), MemoryKind::PinnedHost);
    assert_eq!(placed.to_host_bytes().unwrap(), vec![3, 4]);
    assert_eq!(
        devices[0].memory_kinds(),
        vec![
            MemoryKind::Device,
            MemoryKind::PinnedHost,
            MemoryKind::UnpinnedHost
        ]
    );
    assert_error(
        devices[0].memory_space_by_kind("hbm"),
        ErrorCode::InvalidArgument,
        "Could not find memory addressable by device cpu. Device cpu can address the following \
         memory kinds: device, pinned_host, unpinned_host. Got memory kind: hbm",
    );
}
