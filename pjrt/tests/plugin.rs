//! The safe layer against XLA's real CPU plugin: loading, devices, buffers,
//! events, compile, execute, serialize, and the errors of bad input.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use colocated_pjrt::{
    Buffer, Client, Code, CompileOptions, ElementType, HostBufferSemantics, Plugin, ProgramFormat,
    Value,
};
use common::*;

fn put(client: &Client, device: usize, ty: ElementType, dims: &[i64], bytes: &[u8]) -> Buffer {
    let memory = client.devices()[device].default_memory().unwrap().clone();
    // SAFETY: copied during the call.
    let (buffer, _) = unsafe {
        client.buffer_from_host(
            bytes.as_ptr(),
            bytes.len(),
            ty,
            dims,
            HostBufferSemantics::ImmutableOnlyDuringCall,
            &memory,
        )
    }
    .unwrap();
    buffer
}

fn get(buffer: &Buffer) -> Vec<u8> {
    let mut out = vec![0u8; buffer.host_size()];
    // SAFETY: `out` outlives the wait below.
    if let Some(event) = unsafe { buffer.to_host(out.as_mut_ptr(), out.len()) }.unwrap() {
        event.wait().unwrap();
    }
    out
}

#[test]
fn a_plugin_loads_once_and_reports_its_version() {
    let Some(path) = plugin_path() else { return };
    let a = Plugin::load(&path).unwrap();
    let b = Plugin::load(&path).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    let (major, minor) = a.api_version();
    assert_eq!(major, 0);
    assert!(minor >= colocated_pjrt::MIN_API_MINOR);
    let attributes = a.attributes().unwrap();
    assert!(
        attributes
            .iter()
            .any(|(k, _)| k == "stablehlo_current_version"),
        "{attributes:?}"
    );
}

#[test]
fn a_client_lists_its_devices_and_memories() {
    let Some(client) = client(3) else { return };
    assert_eq!(client.platform_name(), "cpu");
    assert_eq!(client.devices().len(), 3);
    for (i, d) in client.devices().iter().enumerate() {
        assert_eq!(d.local_hardware_id(), i as i32);
        assert_eq!(d.process_index(), 0);
        assert_eq!(d.kind(), "cpu");
        let default = d.default_memory().expect("a default memory");
        assert!(d.memories().iter().any(|m| m.kind() == default.kind()));
    }
    let ids: std::collections::HashSet<i32> = client.devices().iter().map(|d| d.id()).collect();
    assert_eq!(ids.len(), 3);
}

#[test]
fn every_element_type_round_trips() {
    let Some(client) = client(1) else { return };
    for ty in ElementType::ALL {
        let n = ty.size_in_bytes() * 6;
        let bytes: Vec<u8> = (0..n)
            .map(|i| match ty {
                // Booleans are 0 or 1.
                ElementType::Pred => (i % 2) as u8,
                _ => (i * 7 + 3) as u8,
            })
            .collect();
        let b = put(&client, 0, ty, &[2, 3], &bytes);
        assert_eq!(b.element_type(), ty);
        assert_eq!(b.dims(), &[2, 3]);
        assert_eq!(get(&b), bytes, "{ty:?}");
    }
}

#[test]
fn every_host_buffer_semantics_gives_the_data() {
    let Some(client) = client(1) else { return };
    let memory = client.devices()[0].default_memory().unwrap().clone();
    for semantics in [
        HostBufferSemantics::ImmutableOnlyDuringCall,
        HostBufferSemantics::ImmutableUntilTransferCompletes,
        HostBufferSemantics::ImmutableZeroCopy,
        HostBufferSemantics::MutableZeroCopy,
    ] {
        // 64-byte aligned, as zero-copy on CPU wants.
        let mut storage = vec![0u64; 16];
        let data: &mut [u8] = bytemuck_bytes(&mut storage);
        for (i, x) in data.iter_mut().enumerate() {
            *x = i as u8;
        }
        let expected = data.to_vec();
        // SAFETY: `storage` outlives the buffer and its done event.
        let (buffer, done) = unsafe {
            client.buffer_from_host(
                data.as_ptr(),
                128,
                ElementType::U8,
                &[128],
                semantics,
                &memory,
            )
        }
        .unwrap();
        assert_eq!(get(&buffer), expected, "{semantics:?}");
        drop(buffer);
        if let Some(done) = done {
            done.wait().unwrap();
        }
    }
}

fn bytemuck_bytes(v: &mut [u64]) -> &mut [u8] {
    // SAFETY: u64 has no padding; any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 8) }
}

#[test]
fn copies_between_devices_keep_the_data() {
    let Some(client) = client(2) else { return };
    let bytes = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let a = put(&client, 0, ElementType::F32, &[4], &bytes);
    let b = a.copy_to_device(&client.devices()[1]).unwrap();
    assert_eq!(get(&b), bytes);
    let memory = client.devices()[1].memories()[0].clone();
    if let Ok(c) = a.copy_to_memory(&memory) {
        assert_eq!(get(&c), bytes);
    }
}

#[test]
fn a_ready_event_calls_back() {
    let Some(client) = client(1) else { return };
    let b = put(&client, 0, ElementType::F32, &[2], &f32_bytes(&[1.0, 2.0]));
    let (tx, rx) = mpsc::channel();
    b.ready_event()
        .unwrap()
        .on_ready(move |r| tx.send(r).unwrap());
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Ok(()));
}

#[test]
fn deleting_a_buffer_refuses_later_reads() {
    let Some(client) = client(1) else { return };
    let b = put(&client, 0, ElementType::F32, &[2], &f32_bytes(&[1.0, 2.0]));
    b.delete().unwrap();
    assert!(b.is_deleted().unwrap());
    let mut out = vec![0u8; 8];
    // SAFETY: `out` outlives the wait.
    let read = unsafe { b.to_host(out.as_mut_ptr(), 8) }.and_then(|e| match e {
        Some(e) => e.wait(),
        None => Ok(()),
    });
    assert!(read.is_err());
}

#[test]
fn add_one_compiles_and_runs() {
    let Some(client) = client(1) else { return };
    let exe = client
        .compile(
            ADD_ONE.as_bytes(),
            ProgramFormat::Mlir,
            &CompileOptions::default(),
        )
        .unwrap();
    assert_eq!(exe.devices().len(), 1);
    assert_eq!(exe.output_types(), &[ElementType::F32]);
    assert_eq!(exe.output_dims(), &[vec![8]]);
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let input = put(&client, 0, ElementType::F32, &[8], &f32_bytes(&x));
    let (outputs, events) = exe.execute(&[vec![&input]]).unwrap();
    for e in events.into_iter().flatten() {
        e.wait().unwrap();
    }
    let y = f32s(&get(&outputs[0][0]));
    assert_eq!(y, x.iter().map(|v| v + 1.0).collect::<Vec<_>>());
}

#[test]
fn an_input_the_module_aliases_to_an_output_is_not_donated() {
    // JAX writes `tf.aliasing_output` for donated arguments; the caller's
    // buffer must stay readable all the same.
    let Some(client) = client(1) else { return };
    let module = ADD_ONE.replace(
        "%arg0: tensor<8xf32>)",
        "%arg0: tensor<8xf32> {tf.aliasing_output = 0 : i32})",
    );
    assert_ne!(module, ADD_ONE);
    let exe = client
        .compile(
            module.as_bytes(),
            ProgramFormat::Mlir,
            &CompileOptions::default(),
        )
        .unwrap();
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let input = put(&client, 0, ElementType::F32, &[8], &f32_bytes(&x));
    let (outputs, events) = exe.execute(&[vec![&input]]).unwrap();
    for e in events.into_iter().flatten() {
        e.wait().unwrap();
    }
    assert_eq!(
        f32s(&get(&outputs[0][0])),
        x.iter().map(|v| v + 1.0).collect::<Vec<_>>()
    );
    assert!(!input.is_deleted().unwrap());
    assert_eq!(f32s(&get(&input)), x);
    assert!(input.is_dense_row_major().unwrap());
}

#[test]
fn a_result_in_another_layout_reads_back_row_major() {
    // The module asks for its result in column-major order (`{0,1}`).
    let Some(client) = client(1) else { return };
    let module = r#"
module @t {
  func.func public @main(%x: tensor<2x3xf32>) -> (tensor<2x3xf32> {mhlo.layout_mode = "{0,1}"}) {
    %c = stablehlo.constant dense<1.0> : tensor<2x3xf32>
    %0 = stablehlo.add %x, %c : tensor<2x3xf32>
    return %0 : tensor<2x3xf32>
  }
}"#;
    let exe = client
        .compile(
            module.as_bytes(),
            ProgramFormat::Mlir,
            &CompileOptions::default(),
        )
        .unwrap();
    let x: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let input = put(&client, 0, ElementType::F32, &[2, 3], &f32_bytes(&x));
    assert!(input.is_dense_row_major().unwrap());
    let (outputs, events) = exe.execute(&[vec![&input]]).unwrap();
    for e in events.into_iter().flatten() {
        e.wait().unwrap();
    }
    let out = &outputs[0][0];
    assert!(!out.is_dense_row_major().unwrap());
    assert_eq!(
        f32s(&get(out)),
        x.iter().map(|v| v + 1.0).collect::<Vec<_>>()
    );
}

#[test]
fn a_sharded_program_runs_over_four_devices() {
    let Some(client) = client(4) else { return };
    let options = CompileOptions {
        num_partitions: 4,
        use_spmd_partitioning: true,
        use_shardy_partitioner: true,
        ..CompileOptions::default()
    };
    let exe = client
        .compile(ADD_ONE_SHARDED.as_bytes(), ProgramFormat::Mlir, &options)
        .unwrap();
    assert_eq!(exe.devices().len(), 4);
    assert_eq!(exe.output_dims(), &[vec![2]]);
    let shards: Vec<Buffer> = (0..4)
        .map(|d| {
            let v = [2.0 * d as f32, 2.0 * d as f32 + 1.0];
            let device = exe.devices()[d].clone();
            let index = client
                .devices()
                .iter()
                .position(|x| x.id() == device.id())
                .unwrap();
            put(&client, index, ElementType::F32, &[2], &f32_bytes(&v))
        })
        .collect();
    let args: Vec<Vec<&Buffer>> = shards.iter().map(|b| vec![b]).collect();
    let (outputs, _) = exe.execute(&args).unwrap();
    let mut all = Vec::new();
    for out in &outputs {
        all.extend(f32s(&get(&out[0])));
    }
    assert_eq!(all, (1..=8).map(|v| v as f32).collect::<Vec<_>>());
}

#[test]
fn an_executable_serializes_and_loads_again() {
    let Some(client) = client(1) else { return };
    let exe = client
        .compile(
            ADD_ONE.as_bytes(),
            ProgramFormat::Mlir,
            &CompileOptions::default(),
        )
        .unwrap();
    let bytes = exe.serialize().unwrap();
    assert!(!bytes.is_empty());
    let again = client.deserialize_and_load(&bytes).unwrap();
    let input = put(&client, 0, ElementType::F32, &[8], &f32_bytes(&[0.5; 8]));
    let (outputs, _) = again.execute(&[vec![&input]]).unwrap();
    assert_eq!(f32s(&get(&outputs[0][0])), vec![1.5; 8]);
    let garbage = client.deserialize_and_load(b"not an executable");
    assert!(garbage.is_err());
}

#[test]
fn bad_input_gets_typed_errors() {
    let Some(path) = plugin_path() else { return };
    let missing = Plugin::load(std::path::Path::new("/nonexistent/plugin.so"))
        .err()
        .unwrap();
    assert_eq!(missing.code(), Code::NotFound);
    let dir = Plugin::load(std::path::Path::new("/")).err().unwrap();
    assert_eq!(dir.code(), Code::InvalidArgument);
    // A file that is not a library.
    let not_lib = std::env::temp_dir().join(format!("not-a-plugin-{}.so", std::process::id()));
    std::fs::write(&not_lib, b"hello").unwrap();
    let e = Plugin::load(&not_lib).err().unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("cannot load"), "{e}");
    std::fs::remove_file(&not_lib).unwrap();
    // A library that is not a plugin.
    let libc = std::path::Path::new("/lib/x86_64-linux-gnu/libm.so.6");
    if libc.exists() {
        let e = Plugin::load(libc).err().unwrap();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("GetPjrtApi"), "{e}");
    }
    let plugin = Plugin::load(&path).unwrap();
    let bad_option = Client::create(
        &plugin,
        &[("cpu_device_count".into(), Value::String("x".into()))],
    );
    assert!(bad_option.is_err());
    let client = client(2).unwrap();
    // A module that does not parse.
    let e = client
        .compile(
            b"module { this is not mlir }",
            ProgramFormat::Mlir,
            &CompileOptions::default(),
        )
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let e = client
        .compile(b"", ProgramFormat::Mlir, &CompileOptions::default())
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    let zero = CompileOptions {
        num_partitions: 0,
        ..CompileOptions::default()
    };
    assert_eq!(
        client
            .compile(ADD_ONE.as_bytes(), ProgramFormat::Mlir, &zero)
            .err()
            .unwrap()
            .code(),
        Code::InvalidArgument
    );
    // Sizes that do not match the type and dimensions.
    let memory = client.devices()[0].default_memory().unwrap().clone();
    let bytes = [0u8; 12];
    // SAFETY: refused before the plugin sees it.
    let e = unsafe {
        client.buffer_from_host(
            bytes.as_ptr(),
            12,
            ElementType::F32,
            &[4],
            HostBufferSemantics::ImmutableOnlyDuringCall,
            &memory,
        )
    }
    .err()
    .unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    // SAFETY: as above.
    let e = unsafe {
        client.buffer_from_host(
            bytes.as_ptr(),
            12,
            ElementType::F32,
            &[-3],
            HostBufferSemantics::ImmutableOnlyDuringCall,
            &memory,
        )
    }
    .err()
    .unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    // Wrong argument counts, shapes and types reach the program.
    let exe = client
        .compile(
            ADD_ONE.as_bytes(),
            ProgramFormat::Mlir,
            &CompileOptions::default(),
        )
        .unwrap();
    let right = put(&client, 0, ElementType::F32, &[8], &f32_bytes(&[0.0; 8]));
    assert_eq!(
        exe.execute::<Vec<&Buffer>>(&[]).err().unwrap().code(),
        Code::InvalidArgument
    );
    assert!(exe.execute(&[vec![&right, &right]]).is_err());
    assert!(exe.execute(&[vec![]]).is_err());
    let short = put(&client, 0, ElementType::F32, &[4], &f32_bytes(&[0.0; 4]));
    assert!(exe.execute(&[vec![&short]]).is_err());
    // (XLA's CPU plugin takes an s32[8] for an f32[8]: the program's input
    // types are checked above this layer, which knows them.)
    // A buffer of another client.
    let other = common::client(1).unwrap();
    let foreign = put(&other, 0, ElementType::F32, &[8], &f32_bytes(&[0.0; 8]));
    assert_eq!(
        exe.execute(&[vec![&foreign]]).err().unwrap().code(),
        Code::InvalidArgument
    );
}

#[test]
fn a_view_of_memory_reads_it_in_place_and_releases_it_when_done() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(client) = client(1) else { return };
    let memory = client.devices()[0].default_memory().unwrap().clone();
    // 64-byte aligned memory, as XLA's CPU plugin wants of what it views.
    let mut storage = vec![0u64; 8 * 3];
    let offset = storage.as_ptr().align_offset(64);
    let words = &mut storage[offset..offset + 8];
    let data = words.as_mut_ptr().cast::<u8>();
    let values: Vec<f32> = (0..16).map(|i| i as f32).collect();
    // SAFETY: 64 bytes of `words` take the 16 floats.
    unsafe { std::ptr::copy_nonoverlapping(values.as_ptr().cast::<u8>(), data, 64) };
    let released = Arc::new(AtomicUsize::new(0));
    let counter = released.clone();
    // SAFETY: `storage` outlives the view (the test waits for `released`).
    let view = unsafe {
        client.view_of_device_buffer(
            data,
            64,
            ElementType::F32,
            &[4, 4],
            &memory,
            Box::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
            }),
        )
    }
    .unwrap();
    assert_eq!(get(&view), f32_bytes(&values));
    // In place: a write to the memory shows through the view.
    // SAFETY: the view reads nothing concurrently.
    unsafe { *data.cast::<f32>() = 42.0 };
    assert_eq!(&get(&view)[..4], &42f32.to_le_bytes());
    assert_eq!(released.load(Ordering::SeqCst), 0);
    drop(view);
    // The plugin lets go once its last use of the memory is over (possibly
    // on its own thread).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while released.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(released.load(Ordering::SeqCst), 1);

    // A size that is not the shape's, or a memory of another client: refused
    // before the plugin sees them, the callback run.
    let counter = released.clone();
    // SAFETY: refused without reading.
    let err = unsafe {
        client.view_of_device_buffer(
            data,
            60,
            ElementType::F32,
            &[4, 4],
            &memory,
            Box::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
            }),
        )
    }
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(released.load(Ordering::SeqCst), 2);
    let Some(other) = common::client(1) else {
        return;
    };
    let foreign = other.devices()[0].default_memory().unwrap().clone();
    let counter = released.clone();
    // SAFETY: refused without reading.
    let err = unsafe {
        client.view_of_device_buffer(
            data,
            64,
            ElementType::F32,
            &[4, 4],
            &foreign,
            Box::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
            }),
        )
    }
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(released.load(Ordering::SeqCst), 3);
    drop(storage);
}
