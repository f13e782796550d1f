//! Programs: what the compiler takes; `local.rs`, the registry of values of
//! this process that programs refer to by reference.

use crate::device::{Device, PLATFORM_NAME};
use crate::format::pb;
use crate::spec::ArraySpec;

mod local;

pub use local::{local_values, LocalValue, LOCAL_REFERENCE_PREFIX};

/// Language tag of programs whose payload names a function in each host's registry
/// of native functions.
pub const LANGUAGE_NATIVE: &str = "native";
/// Language tag of colocated Python programs (payload: cloudpickle bytes).
pub const LANGUAGE_PYTHON: &str = "python";
/// Language tag of the colocated protocol's own programs, built into every
/// host (payload: a protobuf `colocated.colocated.v1.Op`: a discovery run of
/// another language's program, or the popping, dropping and destroying of
/// what such runs and objects left on a host).
pub const LANGUAGE_COLOCATED: &str = "colocated";
/// Language tag of XLA programs (payload: a StableHLO module, MLIR text),
/// which hosts with a PJRT plugin compile and run on its devices.
pub const LANGUAGE_XLA: &str = "xla";
/// Language tag of colocated Node programs (payload: source plus captured JSON).
pub const LANGUAGE_NODE: &str = "node";

/// A colocated program: it runs once on each host that owns some of `devices`, with
/// that host's shards of the inputs, and returns that host's shards of the outputs.
#[derive(Clone, Debug)]
pub struct Program {
    /// A name for people and traces.
    pub name: String,
    /// The language tag (`"native"`, `"python"`, `"node"`).
    pub language: String,
    /// Language-specific payload (for `native`: the function's registered name).
    pub payload: Vec<u8>,
    /// Specs of the inputs, in argument order.
    pub input_specs: Vec<ArraySpec>,
    /// Specs of the outputs, in result order.
    pub output_specs: Vec<ArraySpec>,
    /// The devices the program runs on; every spec's sharding uses exactly these.
    pub devices: Vec<Device>,
    /// The structure its result must have, in its language's encoding (a
    /// colocated function's output tree: what its first run reported, or
    /// what its declared output specs say where the SDK gives that to core,
    /// as Node does), which every host checks each run against (see
    /// [`ExecutionContext::set_host_outputs`]); empty: none to check (Python
    /// checks declared outputs in its own payload).
    ///
    /// [`ExecutionContext::set_host_outputs`]: crate::ExecutionContext::set_host_outputs
    pub output_structure: Vec<u8>,
}

impl Program {
    /// A native program calling the registered function `function`.
    pub fn native(
        function: &str,
        input_specs: Vec<ArraySpec>,
        output_specs: Vec<ArraySpec>,
        devices: Vec<Device>,
    ) -> Program {
        Program {
            name: function.to_string(),
            language: LANGUAGE_NATIVE.to_string(),
            payload: function.as_bytes().to_vec(),
            input_specs,
            output_specs,
            devices,
            output_structure: Vec::new(),
        }
    }
}

impl Program {
    /// The program's persisted form (see `proto/executable.proto`).
    pub(crate) fn to_proto(&self, num_host_callbacks: usize) -> pb::Executable {
        let spec = |s: &ArraySpec| pb::ArraySpec {
            dtype: s.dtype as u32,
            shape: s.shape.clone(),
            sharding: Some(pb::Sharding {
                device_ids: device_ids(s.sharding.devices()),
                mesh_shape: s.sharding.mesh_shape().iter().map(|n| *n as u64).collect(),
                axis_names: s.sharding.axis_names().to_vec(),
                partition: s
                    .sharding
                    .partition()
                    .iter()
                    .map(|axes| pb::DimPartition {
                        mesh_axes: axes.iter().map(|a| *a as u32).collect(),
                    })
                    .collect(),
                axis_types: s.sharding.wire_axis_types(),
                mesh: !s.sharding.is_single_device(),
                memory_kind: s.sharding.wire_memory_kind(),
            }),
        };
        pb::Executable {
            name: self.name.clone(),
            language: self.language.clone(),
            payload: self.payload.clone(),
            input_specs: self.input_specs.iter().map(spec).collect(),
            output_specs: self.output_specs.iter().map(spec).collect(),
            device_ids: device_ids(&self.devices),
            num_host_callbacks: num_host_callbacks as u32,
            platform_name: PLATFORM_NAME.to_string(),
            output_structure: self.output_structure.clone(),
        }
    }
}

fn device_ids(devices: &[Device]) -> Vec<u32> {
    devices.iter().map(Device::id).collect()
}
