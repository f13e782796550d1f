//! A worker serving a PJRT plugin's devices (`--pjrt-plugin`, XLA's CPU plugin
//! from PyPI): the controller, which loads no plugin, sees them with their
//! platform, compiles an XLA program there and moves 256 MiB in and out.

use std::path::PathBuf;
use std::time::Duration;

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::{
    Array, ArraySpec, Buffer, Client, ClientOptions, ClusterOptions, DType, ErrorCode,
    ExecuteOptions, MemoryKind, Sharding,
};

mod common;
use common::spawn_worker;

/// XLA's CPU plugin (`make test` sets the variable; see core's tests).
fn plugin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("COLOCATED_TEST_PJRT_PLUGIN") {
        return Some(p.into());
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "COLOCATED_TEST_PJRT_PLUGIN is unset: run the tests with make test"
    );
    eprintln!("skipped: COLOCATED_TEST_PJRT_PLUGIN is unset (make test sets it)");
    None
}

const ADD_ONE_SHARDED: &str = r#"
module @jit_add_one attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2]>
  func.func public @main(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> (tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) {
    %c = stablehlo.constant dense<1.0> : tensor<8xf32>
    %0 = stablehlo.add %arg0, %c : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
"#;

const BIG_ADD_ONE: &str = r#"
module @add_one_big {
  func.func public @main(%arg0: tensor<67108864xf32>) -> tensor<67108864xf32> {
    %c = stablehlo.constant dense<1.0> : tensor<67108864xf32>
    %0 = stablehlo.add %arg0, %c : tensor<67108864xf32>
    return %0 : tensor<67108864xf32>
  }
}
"#;

fn controller(address: &str, token: &Token) -> Client {
    let mut connect = ConnectOptions::new(address.to_string(), Some(token.clone()));
    connect.timeout = Duration::from_secs(10);
    Client::connect(&ClusterOptions {
        workers: vec![connect],
        include_local: false,
        local: ClientOptions {
            executor_threads: Some(2),
            ..Default::default()
        },
    })
    .unwrap()
}

#[test]
fn a_worker_serves_a_pjrt_plugin_s_devices_and_runs_xla_programs() {
    let Some(plugin) = plugin() else { return };
    let token = Token::generate().unwrap();
    let worker = spawn_worker(
        Some(&token),
        &[
            "--cpu-devices",
            "1",
            "--pjrt-plugin",
            plugin.to_str().unwrap(),
            "--pjrt-option",
            "cpu_device_count=2",
        ],
        None,
    );
    let client = controller(&worker.address, &token);
    assert_eq!(client.devices().len(), 3);
    assert_eq!(client.default_backend(), "pjrt_cpu");
    let plugin_devices = client.backend_devices(None).unwrap();
    assert_eq!(plugin_devices.len(), 2);
    for d in &plugin_devices {
        assert_eq!((d.platform(), d.kind(), d.host_index()), ("cpu", "cpu", 0));
        assert!(!d.is_host_cpu());
    }
    let cpu = client.backend_devices(Some("cpu")).unwrap();
    assert_eq!(cpu.len(), 1);
    assert_eq!(
        client.colocated_cpu_devices(&plugin_devices).unwrap(),
        vec![cpu[0].clone(), cpu[0].clone()]
    );
    assert!(client.languages(0).unwrap().contains(&"xla".to_string()));
    let mut connect = ConnectOptions::new(worker.address.clone(), Some(token.clone()));
    connect.timeout = Duration::from_secs(10);
    let (status, all) =
        colocated_core::session::status_report(std::slice::from_ref(&worker.address), &connect);
    assert!(all, "{status}");
    assert!(
        status.contains("1 cpu device, 2 pjrt_cpu (cpu) devices"),
        "{status}"
    );
    assert!(status.contains("xla"), "{status}");

    // The plugin's memories travel, as the plugin has them (XLA's CPU plugin:
    // each device its own host memories), distinct from the CPU devices'.
    let device = &plugin_devices[0];
    let kinds: Vec<&str> = device.memory_kinds().iter().map(|k| k.name()).collect();
    assert_eq!(kinds, ["device", "pinned_host", "unpinned_host"]);
    let pinned = device.memory_space_by_kind("pinned_host").unwrap().clone();
    assert_eq!(pinned.device_ids(), [device.id()]);
    assert_ne!(
        &pinned,
        plugin_devices[1]
            .memory_space_by_kind("pinned_host")
            .unwrap()
    );
    assert_ne!(&pinned, cpu[0].memory_space_by_kind("pinned_host").unwrap());
    let ids: std::collections::HashSet<u32> =
        client.memory_spaces().iter().map(|m| m.id()).collect();
    assert_eq!(
        ids.len(),
        client.memory_spaces().len(),
        "memory space ids repeat"
    );
    assert!(client.memory_spaces().contains(&pinned));
    // Every memory space of the client is one its devices list.
    for space in client.memory_spaces() {
        for id in space.device_ids() {
            let device = client.lookup_device(*id).unwrap();
            assert!(
                device.memory_spaces().contains(space),
                "{space:?} names {device} but {device} does not list it"
            );
        }
    }
    // Into the worker's pinned host memory, then to the device's memory and
    // back, and to the other device.
    let data: Vec<u8> = (0..32u8).collect();
    let put =
        Buffer::from_bytes_in(&client, &data, DType::F32, &[8], device, Some(&pinned)).unwrap();
    assert_eq!(put.memory_space().kind(), MemoryKind::PinnedHost);
    assert_eq!(put.to_host_vec().unwrap(), data);
    let on_device = put
        .copy_to_memory_space(device.default_memory_space())
        .unwrap();
    assert_eq!(on_device.memory_space().kind(), MemoryKind::Device);
    assert_eq!(on_device.to_host_vec().unwrap(), data);
    let back = on_device.copy_to_memory_space(&pinned).unwrap();
    assert_eq!(back.device(), device);
    assert_eq!(back.to_host_vec().unwrap(), data);
    let moved = back.copy_to_device(&plugin_devices[1]).unwrap();
    assert_eq!(
        moved.memory_space(),
        plugin_devices[1].default_memory_space()
    );
    assert_eq!(moved.to_host_vec().unwrap(), data);

    // An SPMD program over the worker's two plugin devices.
    let exe = client
        .compile_stablehlo(ADD_ONE_SHARDED.as_bytes(), &plugin_devices)
        .unwrap();
    let spec = exe.program().input_specs[0].clone();
    let x: Vec<f32> = (0..8).map(|v| v as f32).collect();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let input = Array::from_host_bytes(&client, &bytes, spec).unwrap();
    let run = exe.execute(&[input], &ExecuteOptions::default()).unwrap();
    let out = run.outputs[0].to_host_bytes().unwrap();
    let y: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(y, (1..=8).map(|v| v as f32).collect::<Vec<_>>());

    // 256 MiB in, through the program, and out.
    let big = client
        .compile_stablehlo(BIG_ADD_ONE.as_bytes(), &plugin_devices[..1])
        .unwrap();
    let n = 64 << 20;
    let mut data = vec![0u8; n * 4];
    for (i, chunk) in data.chunks_exact_mut(4).enumerate() {
        chunk.copy_from_slice(&((i % 1000) as f32).to_le_bytes());
    }
    let spec = ArraySpec::new(
        vec![n as i64],
        DType::F32,
        Sharding::single_device(plugin_devices[0].clone()),
    )
    .unwrap();
    let input = Array::from_host_bytes(&client, &data, spec).unwrap();
    let run = big.execute(&[input], &ExecuteOptions::default()).unwrap();
    let out = run.outputs[0].to_host_bytes().unwrap();
    assert_eq!(out.len(), n * 4);
    for i in [0, 1, 999, 1000, n / 2 + 7, n - 1] {
        let v = f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(v, (i % 1000) as f32 + 1.0, "element {i}");
    }

    // Strings stay on CPU devices; a module for another device count is refused.
    let strings =
        colocated_core::Buffer::from_strings(&client, &["a"], &[1], &plugin_devices[0], None);
    let e = strings.expect_err("a string buffer on a plugin device");
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.message().contains("CPU devices only"), "{e}");
    let e = client
        .compile_stablehlo(ADD_ONE_SHARDED.as_bytes(), &plugin_devices[..1])
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
}

#[test]
fn a_worker_refuses_to_start_with_a_missing_plugin() {
    let output = common::worker_command(None)
        .args(["--insecure", "--pjrt-plugin", "/nonexistent/pjrt_plugin.so"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");
    let output = common::worker_command(None)
        .args(["--insecure", "--pjrt-option", "cpu_device_count=2"])
        .env_remove("COLOCATED_PJRT_PLUGIN")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--pjrt-plugin"), "{stderr}");
}
