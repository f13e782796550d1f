//! `colocated-core`: the object model and runtime of `colocated`.
//!
//! A [`Client`] owns hosts, each with devices and memory spaces. [`Buffer`]s hold
//! one device's data; [`Array`]s are sharded over devices. The compiler turns a
//! [`Program`] into a [`LoadedExecutable`], which runs once per host with that
//! host's shards, in program order per [`Stream`], and reports through [`Event`]s.
//!
//! ```
//! use colocated_core::*;
//!
//! let client = Client::new_local(ClientOptions { num_cpu_devices: Some(2), ..Default::default() })?;
//! client.register_native_function("add_one", |ctx| {
//!     let x = ctx.inputs()[0].to_host_vec()?;
//!     let y: Vec<u8> = x.iter().map(|b| b + 1).collect();
//!     let shard = ctx.output_shards()[0].clone();
//!     let out = Buffer::from_bytes(ctx.client(), &y, shard.dtype, &shard.dims, &shard.device)?;
//!     ctx.set_output(0, out)
//! })?;
//! let device = client.devices()[0].clone();
//! let spec = ArraySpec::new(vec![4], DType::U8, Sharding::single_device(device.clone()))?;
//! let program = Program::native("add_one", vec![spec.clone()], vec![spec.clone()], vec![device]);
//! let exe = client.compile(program, CompileOptions::default())?;
//! let x = Array::from_host_bytes(&client, &[1, 2, 3, 4], spec)?;
//! let run = exe.execute(&[x], &ExecuteOptions::default())?;
//! assert_eq!(run.outputs[0].to_host_bytes()?, vec![2, 3, 4, 5]);
//! # Ok::<(), colocated_core::Error>(())
//! ```

#![warn(missing_docs)]

mod array;
mod backend;
mod buffer;
mod client;
pub mod cluster;
mod colocated;
mod compiler;
mod default_client;
mod device;
mod dispatch;
mod dtype;
mod error;
mod executable;
mod executor;
mod format;
mod future;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod host_callback;
mod languages;
mod prefault;
mod process;
mod program;
mod remote;
pub mod session;
mod sharding;
mod spec;
mod storage;
pub mod trace;
pub mod transport;
pub mod worker;

pub use array::Array;
pub use backend::{
    find_plugin, plugin_from_env, PjrtOptions, PjrtValue, PJRT_NAMES_ENV, PJRT_PLUGIN_ENV,
};
pub use buffer::{Buffer, ExternalReference, HostBufferSemantics, Kept};
pub use client::{
    Client, ClientOptions, ClusterOptions, Host, DEFAULT_MAX_EXECUTOR_THREADS, PLATFORM_NAME,
};
pub use colocated::{
    flat_tree_key, new_tree_key, tree_key, CacheInfo, Call, CallSite, CallSpec, ColocatedFunction,
    ColocatedObject, Entry, OutputOrigin, Outputs, Payload, SpecCache,
};
pub use compiler::CompileOptions;
pub use default_client::{
    configure, current_default_client, default_client, num_cpu_devices_from_env,
    reset_default_client, set_default_client, NUM_CPU_DEVICES_ENV,
};
pub use device::{AttributeValue, CpuBackend, Device, DeviceBackend, MemoryKind, MemorySpace};
pub use dispatch::{
    as_event_loop, forget_stream_scope, set_stream_scope, with_stream, Stream, StreamSlot,
};
pub use dtype::DType;
pub use error::{bound_text, Error, ErrorCode, Result};
pub use executable::{ExecuteOptions, Execution, LoadedExecutable};
pub use executor::{
    controller_device_id, native_payload, release_freed_memory, ExecutionContext, LanguageExecutor,
    LoadedProgram, NativeFn, OutputShard, SessionKey,
};
pub use format::{check_compatible, FORMAT_VERSION, MAGIC, MIN_FORMAT_VERSION};
pub use future::{Event, Progress};
pub use host_callback::{HostCallbackFn, LoadedHostCallback};
pub use languages::colocated::{host_object, host_objects, parked_results, Built, HostValue};
pub use program::{
    local_values, LocalValue, Program, LANGUAGE_COLOCATED, LANGUAGE_NATIVE, LANGUAGE_NODE,
    LANGUAGE_PYTHON, LANGUAGE_XLA, LOCAL_REFERENCE_PREFIX,
};
pub use remote::without_waiting;
pub use remote::{HostEvent, HostEventKind, HostStats};
pub use sharding::{AxisType, Replica, Sharding};
pub use spec::ArraySpec;
pub use storage::HostMemory;
