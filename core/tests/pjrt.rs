//! A PJRT plugin as a device backend (XLA's CPU plugin from PyPI): its
//! devices beside the CPU devices, buffers on them, XLA programs compiled and
//! run on them, and order across backends.

mod common;

use colocated_core::*;
use common::*;

const ADD_ONE: &str = include_str!("../../tests/xla/add_one.mlir");

/// `x + 1` over `f32[8]` split along "x" of a 4-device mesh (Shardy, as JAX
/// 0.10 lowers it).
const ADD_ONE_SHARDED: &str = include_str!("../../tests/xla/add_one_sharded.mlir");

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A client with one CPU device and one device of XLA's CPU PJRT plugin, and
/// that plugin device (`None` when the plugin is not installed).
fn plugin_client() -> Option<(Client, Device)> {
    let client = pjrt_client(1, 1)?;
    let device = client.backend_devices(None).unwrap()[0].clone();
    Some((client, device))
}

/// The StableHLO module `mlir` compiled for `device` alone.
fn compile_on(client: &Client, mlir: &str, device: &Device) -> LoadedExecutable {
    client
        .compile_stablehlo(mlir.as_bytes(), std::slice::from_ref(device))
        .unwrap()
}

/// [`ADD_ONE_SHARDED`] compiled over `devices`, and an input of `x` in its
/// input spec.
fn sharded_add_one(client: &Client, devices: &[Device], x: &[f32]) -> (LoadedExecutable, Array) {
    let exe = client
        .compile_stablehlo(ADD_ONE_SHARDED.as_bytes(), devices)
        .unwrap();
    let spec = exe.program().input_specs[0].clone();
    let input = Array::from_host_bytes(client, &f32_bytes(x), spec).unwrap();
    (exe, input)
}

/// Asserts that shard i of `array` is on `devices[i]`.
#[track_caller]
fn assert_on_devices(array: &Array, devices: &[Device]) {
    for (b, d) in array.buffers().iter().zip(devices) {
        assert_eq!(b.device(), d);
    }
}

/// The float32 values of `array`, once it is ready (panics if it failed).
fn floats(array: &Array) -> Vec<f32> {
    f32s(&array.to_host_bytes().unwrap())
}

/// A float32 vector of `values` on `device`.
fn f32_array(client: &Client, values: &[f32], device: &Device) -> Array {
    let spec = spec_on(&[values.len() as i64], DType::F32, device);
    Array::from_host_bytes(client, &f32_bytes(values), spec).unwrap()
}

#[test]
fn a_plugin_s_devices_join_the_cpu_devices_as_the_default_backend() {
    let Some(client) = pjrt_client(2, 4) else {
        return;
    };
    assert_eq!(client.devices().len(), 6);
    assert_eq!(client.default_backend(), "pjrt_cpu");
    let plugin = client.backend_devices(None).unwrap();
    assert_eq!(plugin.len(), 4);
    for (i, d) in plugin.iter().enumerate() {
        assert_eq!(d.platform(), "cpu");
        assert_eq!(d.kind(), "cpu");
        assert_eq!(d.backend(), "pjrt_cpu");
        assert!(!d.is_host_cpu());
        assert_eq!(d.local_hardware_id(), i as u32);
        assert_eq!(d.host_index(), 0);
        assert_eq!(d.default_memory_space().kind(), MemoryKind::Device);
        assert_eq!(d.default_memory_space().id(), d.id());
    }
    let cpus = client.backend_devices(Some("cpu")).unwrap();
    assert_eq!(cpus.len(), 2);
    assert!(cpus.iter().all(Device::is_host_cpu));
    let ids: std::collections::HashSet<u32> = client.devices().iter().map(Device::id).collect();
    assert_eq!(ids.len(), 6);
    let spaces: std::collections::HashSet<u32> =
        client.memory_spaces().iter().map(MemorySpace::id).collect();
    assert_eq!(spaces.len(), client.memory_spaces().len());
    // Every memory space a device addresses is one of the client's.
    for d in client.devices() {
        for m in d.memory_spaces() {
            assert_eq!(client.lookup_memory_space(m.id()).unwrap(), *m);
        }
    }
    // Colocated programs run next to the plugin's data on the host's CPU devices.
    let colocated = client.colocated_cpu_devices(&plugin).unwrap();
    assert_eq!(
        colocated,
        vec![
            cpus[0].clone(),
            cpus[1].clone(),
            cpus[0].clone(),
            cpus[1].clone()
        ]
    );
    assert_error(
        client.backend_devices(Some("tpu")),
        ErrorCode::NotFound,
        "pjrt_cpu",
    );
}

#[test]
fn every_dtype_round_trips_through_a_plugin_device() {
    let Some((client, device)) = plugin_client() else {
        return;
    };
    for dtype in [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ] {
        let size = dtype.byte_size().unwrap();
        let bytes: Vec<u8> = (0..size * 6)
            .map(|i| {
                if dtype == DType::Bool {
                    (i % 2) as u8
                } else {
                    (i * 5 + 1) as u8
                }
            })
            .collect();
        let b = Buffer::from_bytes(&client, &bytes, dtype, &[2, 3], &device).unwrap();
        assert_eq!(b.to_host_vec().unwrap(), bytes, "{dtype:?}");
    }
    assert_error(
        Buffer::from_strings(&client, &["a"], &[1], &device, None),
        ErrorCode::InvalidArgument,
        "CPU devices only",
    );
}

#[test]
fn host_buffer_semantics_all_give_the_data() {
    let Some((client, device)) = plugin_client() else {
        return;
    };
    let data = f32_bytes(&[1.0, 2.0, 3.0]);
    for semantics in [
        HostBufferSemantics::ImmutableOnlyDuringCall,
        HostBufferSemantics::ImmutableUntilTransferCompletes,
        HostBufferSemantics::ImmutableZeroCopy,
    ] {
        // SAFETY: `data` outlives the done event waited on below.
        let (b, done) = unsafe {
            Buffer::from_host_raw(
                &client,
                data.as_ptr(),
                data.len(),
                DType::F32,
                &[3],
                &device,
                None,
                semantics,
            )
        }
        .unwrap();
        assert_eq!(b.to_host_vec().unwrap(), data, "{semantics:?}");
        drop(b);
        done.wait().unwrap();
    }
}

#[test]
fn a_view_of_device_memory_reads_it_in_place_and_lets_go_when_done() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some((client, device)) = plugin_client() else {
        return;
    };
    // XLA's CPU plugin's device memory is this process's: 64-byte aligned
    // memory stands in for another client's allocation.
    let mut storage = vec![0u64; 24];
    let offset = storage.as_ptr().align_offset(64);
    let data = storage[offset..].as_mut_ptr().cast::<u8>();
    let bytes = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    // SAFETY: 16 bytes fit in what follows `offset`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, 16) };
    let released = Arc::new(AtomicUsize::new(0));
    let on_delete = |count: &Arc<AtomicUsize>| -> Box<dyn FnOnce() + Send> {
        let count = count.clone();
        Box::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
        })
    };
    // SAFETY: `storage` outlives the view (waited for below).
    let view = unsafe {
        Buffer::view_of_device_memory(
            &client,
            data,
            DType::F32,
            &[4],
            &device,
            None,
            on_delete(&released),
        )
    }
    .unwrap();
    let spec = spec_on(&[4], DType::F32, &device);
    let x = Array::assemble(spec, vec![view]).unwrap();
    // An XLA program reads it where it is.
    let exe = compile_on(&client, ADD_ONE_4, &device);
    let run = exe
        .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
        .unwrap();
    assert_eq!(floats(&run.outputs[0]), [2.0, 3.0, 4.0, 5.0]);
    run.status.wait().unwrap();
    // SAFETY: nothing reads the memory concurrently.
    unsafe { *data.cast::<f32>() = 10.0 };
    assert_eq!(floats(&x)[0], 10.0);
    assert_eq!(released.load(Ordering::SeqCst), 0);
    drop((x, run, exe));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while released.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(released.load(Ordering::SeqCst), 1);
    // Refused, the callback run: a CPU device, strings.
    let cpu = client.backend_devices(Some("cpu")).unwrap()[0].clone();
    for (device, dtype, want) in [
        (&cpu, DType::F32, "not a PJRT plugin's device"),
        (&device, DType::String, "cannot hold strings"),
    ] {
        // SAFETY: refused without reading.
        let err = unsafe {
            Buffer::view_of_device_memory(
                &client,
                data,
                dtype,
                &[4],
                device,
                None,
                on_delete(&released),
            )
        }
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.message().contains(want), "{err}");
    }
    assert_eq!(released.load(Ordering::SeqCst), 3);
    drop(storage);
}

const ADD_ONE_4: &str = r#"
module @jit_add_one {
  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
    %c = stablehlo.constant dense<1.0> : tensor<4xf32>
    %0 = stablehlo.add %arg0, %c : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"#;

#[test]
fn copies_between_plugin_and_cpu_devices_keep_the_data() {
    let Some(client) = pjrt_client(1, 2) else {
        return;
    };
    let plugin = client.backend_devices(None).unwrap();
    let cpu = client.backend_devices(Some("cpu")).unwrap()[0].clone();
    let data = f32_bytes(&[1.5, 2.5, 3.5, 4.5]);
    let a = Buffer::from_bytes(&client, &data, DType::F32, &[4], &plugin[0]).unwrap();
    let b = a.copy_to_device(&plugin[1]).unwrap();
    let c = b.copy_to_device(&cpu).unwrap();
    let d = c.copy_to_device(&plugin[0]).unwrap();
    for x in [&b, &c, &d] {
        assert_eq!(x.to_host_vec().unwrap(), data);
    }
    assert_eq!(b.device(), &plugin[1]);
    assert_eq!(c.device(), &cpu);
    // Deleting a buffer while a copy of it is queued does not take its data away.
    let e = a.copy_to_device(&plugin[1]).unwrap();
    a.delete();
    assert_eq!(e.to_host_vec().unwrap(), data);
    assert_error(a.to_host_vec(), ErrorCode::FailedPrecondition, "deleted");
}

#[test]
fn add_one_compiles_and_runs_on_a_plugin_device() {
    let Some((client, device)) = plugin_client() else {
        return;
    };
    let exe = compile_on(&client, ADD_ONE, &device);
    let x: Vec<f32> = (0..8).map(|i| i as f32 * 0.5).collect();
    let input = f32_array(&client, &x, &device);
    let run = exe.execute(&[input], &ExecuteOptions::default()).unwrap();
    let y = floats(&run.outputs[0]);
    assert_eq!(y, x.iter().map(|v| v + 1.0).collect::<Vec<_>>());
    run.status.wait().unwrap();
    assert_eq!(run.outputs[0].sharding().devices(), &[device]);
}

const MATMUL: &str = include_str!("../../tests/xla/matmul.mlir");

#[test]
fn xla_programs_queued_back_to_back_feed_each_other_without_waits() {
    // Whether the plugin finishes a program before `Execute` returns (XLA's
    // CPU plugin) or after (an accelerator's: the next program is then queued
    // on an input still being made, and the plugin orders them), each
    // product gets the one before.
    let Some((client, device)) = plugin_client() else {
        return;
    };
    let exe = compile_on(&client, MATMUL, &device);
    let n = 1024usize;
    let spec = exe.program().input_specs[0].clone();
    let a: Vec<f32> = (0..n * n).map(|i| (i % 251) as f32).collect();
    let identity: Vec<f32> = (0..n * n)
        .map(|i| if i / n == i % n { 1.0 } else { 0.0 })
        .collect();
    let a_array = Array::from_host_bytes(&client, &f32_bytes(&a), spec.clone()).unwrap();
    let i_array = Array::from_host_bytes(&client, &f32_bytes(&identity), spec).unwrap();
    let mut y = a_array;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let run = exe
            .execute(&[y, i_array.clone()], &ExecuteOptions::default())
            .unwrap();
        statuses.push(run.status);
        y = run.outputs.into_iter().next().unwrap();
    }
    assert_eq!(floats(&y), a);
    for status in statuses {
        status.wait().unwrap();
    }
}

#[test]
fn a_sharded_program_runs_over_all_plugin_devices() {
    let Some(client) = pjrt_client(1, 4) else {
        return;
    };
    let devices = client.backend_devices(None).unwrap();
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let (exe, input) = sharded_add_one(&client, &devices, &x);
    let spec = exe.program().input_specs[0].clone();
    assert_eq!(spec.sharding.shard_shape(&spec.shape).unwrap(), vec![2]);
    let run = exe.execute(&[input], &ExecuteOptions::default()).unwrap();
    let y = floats(&run.outputs[0]);
    assert_eq!(y, (1..=8).map(|v| v as f32).collect::<Vec<_>>());
    assert_on_devices(&run.outputs[0], &devices);
}

#[test]
fn an_xla_program_and_a_native_function_feed_each_other_in_order() {
    let Some((client, plugin)) = plugin_client() else {
        return;
    };
    let cpu = client
        .colocated_cpu_devices(std::slice::from_ref(&plugin))
        .unwrap()[0]
        .clone();
    let gate = Event::new();
    let (opened, fail) = (
        gate.clone(),
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let failing = fail.clone();
    // Doubles its input on the CPU device, once the gate opens.
    client
        .register_native_function("double_after_gate", move |ctx| {
            opened.wait()?;
            if failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::invalid_argument("the CPU step failed on purpose"));
            }
            let x = f32s(&ctx.inputs()[0].to_host_vec()?);
            let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
            let shard = ctx.output_shards()[0].clone();
            let out = Buffer::from_bytes(
                ctx.client(),
                &f32_bytes(&doubled),
                DType::F32,
                &shard.dims,
                &shard.device,
            )?;
            ctx.set_output(0, out)
        })
        .unwrap();
    let xla = compile_on(&client, ADD_ONE, &plugin);
    let cpu_spec = spec_on(&[8], DType::F32, &cpu);
    let double = compile_native(
        &client,
        "double_after_gate",
        vec![cpu_spec.clone()],
        vec![cpu_spec],
        std::slice::from_ref(&cpu),
    );
    let chain = |x: &[f32], first: bool| -> Result<Vec<f32>> {
        let a = xla.execute(
            &[f32_array(&client, x, &plugin)],
            &ExecuteOptions::default(),
        )?;
        let on_cpu = a.outputs[0].buffers()[0].copy_to_device(&cpu)?;
        let on_cpu = Array::assemble(double.program().input_specs[0].clone(), vec![on_cpu])?;
        let b = double.execute(&[on_cpu], &ExecuteOptions::default())?;
        let back = b.outputs[0].buffers()[0].copy_to_device(&plugin)?;
        let back = Array::assemble(xla.program().input_specs[0].clone(), vec![back])?;
        let c = xla.execute(&[back], &ExecuteOptions::default())?;
        if first {
            // Nothing has run past the gate yet: every step was queued in order.
            assert!(!c.outputs[0].ready_event().is_ready());
            gate.set(Ok(())).unwrap();
        }
        Ok(f32s(&c.outputs[0].to_host_bytes()?))
    };
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    assert_eq!(
        chain(&x, true).unwrap(),
        x.iter().map(|v| (v + 1.0) * 2.0 + 1.0).collect::<Vec<_>>()
    );
    // An error in the middle reaches the last program's outputs.
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_error(
        chain(&x, false),
        ErrorCode::InvalidArgument,
        "failed on purpose",
    );
}

#[test]
fn bad_programs_and_arguments_get_typed_errors() {
    let Some(client) = pjrt_client(1, 4) else {
        return;
    };
    let plugin = client.backend_devices(None).unwrap();
    let cpu = client.backend_devices(Some("cpu")).unwrap();
    let one = std::slice::from_ref(&plugin[0]);
    assert_error(
        client.compile_stablehlo(
            b"module { func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { this is wrong } }",
            one,
        ),
        ErrorCode::InvalidArgument,
        "",
    );
    assert_error(
        client.compile_stablehlo(b"not mlir", one),
        ErrorCode::InvalidArgument,
        "@main",
    );
    assert_error(
        client.compile_stablehlo(ADD_ONE.as_bytes(), &cpu),
        ErrorCode::InvalidArgument,
        "CPU devices",
    );
    assert_error(
        client.compile_stablehlo(ADD_ONE.as_bytes(), &plugin[..2]),
        ErrorCode::InvalidArgument,
        "1 device",
    );
    assert_error(
        client.compile_stablehlo(ADD_ONE_SHARDED.as_bytes(), &plugin[..2]),
        ErrorCode::InvalidArgument,
        "4 device",
    );
    let exe = client.compile_stablehlo(ADD_ONE.as_bytes(), one).unwrap();
    // Wrong dtype, wrong shape, wrong device, wrong count.
    let ints = spec_on(&[8], DType::I32, &plugin[0]);
    let ints = Array::from_host_bytes(&client, &[0u8; 32], ints).unwrap();
    assert!(exe.execute(&[ints], &ExecuteOptions::default()).is_err());
    let short = f32_array(&client, &[0.0; 4], &plugin[0]);
    assert!(exe.execute(&[short], &ExecuteOptions::default()).is_err());
    let elsewhere = f32_array(&client, &[0.0; 8], &plugin[1]);
    assert!(exe
        .execute(&[elsewhere], &ExecuteOptions::default())
        .is_err());
    assert!(exe.execute(&[], &ExecuteOptions::default()).is_err());
    // A plugin that is not there, or not a plugin.
    let missing = Client::new_local(ClientOptions {
        pjrt: Some(PjrtOptions {
            plugin: "/nonexistent/pjrt_plugin.so".into(),
            options: vec![],
        }),
        ..Default::default()
    });
    assert_error(missing, ErrorCode::NotFound, "does not exist");
    let not_plugin = Client::new_local(ClientOptions {
        pjrt: Some(PjrtOptions {
            plugin: "/lib/x86_64-linux-gnu/libm.so.6".into(),
            options: vec![],
        }),
        ..Default::default()
    });
    if std::path::Path::new("/lib/x86_64-linux-gnu/libm.so.6").exists() {
        assert_error(not_plugin, ErrorCode::InvalidArgument, "GetPjrtApi");
    }
}

#[test]
fn a_serialized_xla_program_carries_the_plugin_s_executable_and_loads_again() {
    let Some((client, device)) = plugin_client() else {
        return;
    };
    let exe = compile_on(&client, ADD_ONE, &device);
    let bytes = exe.serialize();
    let magic = b"colocated-xla-artifact";
    assert!(bytes.windows(magic.len()).any(|w| w == magic));
    check_compatible(&bytes).unwrap();
    // Another client of the same plugin loads it without the module's text.
    let (other, device) = plugin_client().unwrap();
    let loaded = other
        .deserialize_and_load(&bytes, CompileOptions::default())
        .unwrap();
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let run = loaded
        .execute(
            &[f32_array(&other, &x, &device)],
            &ExecuteOptions::default(),
        )
        .unwrap();
    assert_eq!(
        floats(&run.outputs[0]),
        x.iter().map(|v| v + 1.0).collect::<Vec<_>>()
    );
    // The artifact names its plugin (an artifact of another plugin is
    // refused: the unit tests of core's xla module), and a byte changed in it
    // is caught by the format's checksum.
    let text = String::from_utf8_lossy(&bytes);
    let at = text
        .find("cpu plugin")
        .expect("the plugin's identity is in the bytes");
    let mut forged = bytes.clone();
    forged[at] = b'g';
    let Err(e) = other.deserialize_and_load(&forged, CompileOptions::default()) else {
        panic!("a changed artifact loaded");
    };
    assert!(e.message().contains("corrupted"), "{e}");
}

#[test]
fn an_external_reference_pins_a_plugin_buffer_s_memory() {
    let Some((client, device)) = plugin_client() else {
        return;
    };
    let data = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let b = Buffer::from_bytes(&client, &data, DType::F32, &[4], &device).unwrap();
    let pin = b.acquire_external_reference().unwrap();
    assert_eq!(pin.len(), 16);
    assert!(!pin.data_ptr().is_null());
    // XLA's CPU plugin's device memory is this process's memory.
    // SAFETY: pinned for 16 bytes while `pin` lives.
    let seen = unsafe { std::slice::from_raw_parts(pin.data_ptr(), 16) };
    assert_eq!(seen, &data[..]);
    // Deleting the buffer keeps pinned memory valid until the pin goes.
    b.delete();
    // SAFETY: as above.
    let still = unsafe { std::slice::from_raw_parts(pin.data_ptr(), 16) };
    assert_eq!(still, &data[..]);
    drop(pin);
    // A large put is copied by the plugin after it returns: a pin taken at
    // once still sees every byte, and the layout is the dense row-major one.
    let values: Vec<f32> = (0..(16 << 20)).map(|i| (i % 1021) as f32 + 1.0).collect();
    let data = f32_bytes(&values);
    let mut memory = HostMemory::zeroed(data.len()).unwrap();
    memory.as_mut_slice().copy_from_slice(&data);
    let dims = [values.len() as i64];
    let b = &Buffer::from_host_memory(&client, memory, DType::F32, &dims, &device).unwrap();
    let pin = b.acquire_external_reference().unwrap();
    assert_eq!(pin.len(), data.len());
    // SAFETY: pinned for its length while `pin` lives.
    let seen = unsafe { std::slice::from_raw_parts(pin.data_ptr(), pin.len()) };
    // The last bytes first: a copy still running writes them last.
    let tail = data.len() - 4096;
    assert_eq!(
        &seen[tail..],
        &data[tail..],
        "the pin saw bytes not copied yet"
    );
    assert!(seen == &data[..]);
    assert!(b.is_dense_row_major().unwrap());
}

#[test]
fn a_sharded_program_over_devices_in_another_order_gives_each_shard_its_device() {
    let Some(client) = pjrt_client(1, 4) else {
        return;
    };
    let mut devices = client.backend_devices(None).unwrap();
    devices.reverse();
    let x: Vec<f32> = (0..8).map(|i| i as f32 * 10.0).collect();
    let (exe, input) = sharded_add_one(&client, &devices, &x);
    let run = exe.execute(&[input], &ExecuteOptions::default()).unwrap();
    assert_eq!(
        floats(&run.outputs[0]),
        x.iter().map(|v| v + 1.0).collect::<Vec<_>>()
    );
    assert_on_devices(&run.outputs[0], &devices);
}
