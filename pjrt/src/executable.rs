//! Compiling programs and running them.

use std::os::raw::c_char;
use std::sync::Arc;

use prost::Message;
use smallvec::SmallVec;

use crate::buffer::Buffer;
use crate::client::{Client, ClientInner, Device};
use crate::error::{Code, Error, Result};
use crate::event::Event;
use crate::plugin::{call, new_args};
use crate::proto;
use crate::sys;
use crate::types::ElementType;

/// The form of a program's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramFormat {
    /// MLIR: StableHLO text or bytecode (what `jax.jit(f).lower(...)` gives).
    Mlir,
    /// A serialized `HloModuleProto`.
    Hlo,
}

impl ProgramFormat {
    fn name(self) -> &'static str {
        match self {
            ProgramFormat::Mlir => "mlir",
            ProgramFormat::Hlo => "hlo",
        }
    }
}

/// How to compile: the fields of XLA's `CompileOptionsProto` this crate sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// Replicas (at least 1).
    pub num_replicas: i64,
    /// SPMD partitions (at least 1): the devices one replica spans.
    pub num_partitions: i64,
    /// Partition the program with SPMD (a module with shardings over several
    /// partitions).
    pub use_spmd_partitioning: bool,
    /// Use the Shardy partitioner (modules that carry `sdy.sharding`, as JAX
    /// 0.10 and later lower them).
    pub use_shardy_partitioner: bool,
    /// The plugin's device ids, `[replica][partition]`; `None`: the client's
    /// default assignment.
    pub device_assignment: Option<Vec<Vec<i64>>>,
}

/// What [`LoadedExecutable::execute`] gives: each device's outputs, and
/// each device's completion event (`None` where the plugin gave none).
pub type Executed = (Vec<Vec<Buffer>>, Vec<Option<Event>>);

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            use_shardy_partitioner: false,
            device_assignment: None,
        }
    }
}

impl CompileOptions {
    /// The serialized `xla.CompileOptionsProto`; `invalid_argument` for counts
    /// below 1 or an assignment of another shape (the plugin would refuse or
    /// abort on them).
    pub fn to_proto_bytes(&self) -> Result<Vec<u8>> {
        if self.num_replicas < 1 || self.num_partitions < 1 {
            return Err(Error::invalid_argument(format!(
                "a program needs at least one replica and one partition, not {} and {}",
                self.num_replicas, self.num_partitions
            )));
        }
        let device_assignment = match &self.device_assignment {
            None => None,
            Some(rows) => {
                let shaped = rows.len() as i64 == self.num_replicas
                    && rows.iter().all(|r| r.len() as i64 == self.num_partitions);
                if !shaped {
                    return Err(Error::invalid_argument(format!(
                        "a device assignment of {} replicas x {} partitions was expected",
                        self.num_replicas, self.num_partitions
                    )));
                }
                // XLA stores it by computation (partition), then replica.
                let computation_devices = (0..self.num_partitions as usize)
                    .map(|p| proto::device_assignment_proto::ComputationDevice {
                        replica_device_ids: rows.iter().map(|r| r[p]).collect(),
                    })
                    .collect();
                Some(proto::DeviceAssignmentProto {
                    replica_count: self.num_replicas as i32,
                    computation_count: self.num_partitions as i32,
                    computation_devices,
                })
            }
        };
        let options = proto::CompileOptionsProto {
            executable_build_options: Some(proto::ExecutableBuildOptionsProto {
                device_ordinal: -1,
                num_replicas: self.num_replicas,
                num_partitions: self.num_partitions,
                use_spmd_partitioning: self.use_spmd_partitioning,
                use_auto_spmd_partitioning: false,
                device_assignment,
                use_shardy_partitioner: self.use_shardy_partitioner,
            }),
            compile_portable_executable: false,
        };
        Ok(options.encode_to_vec())
    }
}

/// A compiled program, loaded on its devices. Dropping it destroys it once
/// executions in flight are done.
pub struct LoadedExecutable {
    raw: *mut sys::PJRT_LoadedExecutable,
    client: Arc<ClientInner>,
    devices: Vec<Device>,
    output_types: Vec<ElementType>,
    output_dims: Vec<Vec<i64>>,
}

// SAFETY: PJRT executables may be used from any thread.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above.
unsafe impl Sync for LoadedExecutable {}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let mut a = new_args!(
            PJRT_LoadedExecutable_Destroy_Args,
            PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE
        );
        a.executable = self.raw;
        let _ = call!(
            self.client.plugin.api(),
            PJRT_LoadedExecutable_Destroy,
            &mut a
        );
    }
}

/// A `PJRT_Executable` (the compiled program without its devices), destroyed on drop.
struct Unloaded<'a> {
    raw: *mut sys::PJRT_Executable,
    client: &'a ClientInner,
}

impl Drop for Unloaded<'_> {
    fn drop(&mut self) {
        let mut a = new_args!(
            PJRT_Executable_Destroy_Args,
            PJRT_Executable_Destroy_Args_STRUCT_SIZE
        );
        a.executable = self.raw;
        let _ = call!(self.client.plugin.api(), PJRT_Executable_Destroy, &mut a);
    }
}

impl Client {
    /// Compiles `code` (of `format`) with `options` and loads it on the
    /// devices the options assign. A module the compiler refuses is
    /// `invalid_argument` with the compiler's message.
    pub fn compile(
        &self,
        code: &[u8],
        format: ProgramFormat,
        options: &CompileOptions,
    ) -> Result<LoadedExecutable> {
        if code.is_empty() {
            return Err(Error::invalid_argument("the program's code is empty"));
        }
        let serialized = options.to_proto_bytes()?;
        let format_name = format.name();
        let mut program = new_args!(PJRT_Program, PJRT_Program_STRUCT_SIZE);
        // The plugin only reads the code (the field is not const in the header).
        program.code = code.as_ptr() as *mut c_char;
        program.code_size = code.len();
        program.format = format_name.as_ptr().cast();
        program.format_size = format_name.len();
        let mut a = new_args!(
            PJRT_Client_Compile_Args,
            PJRT_Client_Compile_Args_STRUCT_SIZE
        );
        a.client = self.0.raw;
        a.program = &program;
        a.compile_options = serialized.as_ptr().cast();
        a.compile_options_size = serialized.len();
        // XLA's compilers report a module they cannot parse or verify with
        // `UNKNOWN`: that is the module's fault, so it is `invalid_argument`.
        call!(self.0.plugin.api(), PJRT_Client_Compile, &mut a).map_err(|e| match e.code() {
            Code::Unknown => Error::new(Code::InvalidArgument, e.message()),
            _ => e,
        })?;
        self.adopt_executable(a.executable)
    }

    /// Loads an executable that [`LoadedExecutable::serialize`] gave, made by
    /// this plugin and version; the plugin's error for any other bytes.
    pub fn deserialize_and_load(&self, bytes: &[u8]) -> Result<LoadedExecutable> {
        if bytes.is_empty() {
            return Err(Error::invalid_argument(
                "the serialized executable is empty",
            ));
        }
        let mut a = new_args!(
            PJRT_Executable_DeserializeAndLoad_Args,
            PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE
        );
        a.client = self.0.raw;
        a.serialized_executable = bytes.as_ptr().cast();
        a.serialized_executable_size = bytes.len();
        call!(
            self.0.plugin.api(),
            PJRT_Executable_DeserializeAndLoad,
            &mut a
        )?;
        self.adopt_executable(a.loaded_executable)
    }

    fn adopt_executable(&self, raw: *mut sys::PJRT_LoadedExecutable) -> Result<LoadedExecutable> {
        if raw.is_null() {
            return Err(Error::internal("the PJRT plugin returned no executable"));
        }
        let mut loaded = LoadedExecutable {
            raw,
            client: self.0.clone(),
            devices: Vec::new(),
            output_types: Vec::new(),
            output_dims: Vec::new(),
        };
        let api = self.0.plugin.api();
        let mut d = new_args!(
            PJRT_LoadedExecutable_AddressableDevices_Args,
            PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE
        );
        d.executable = raw;
        call!(api, PJRT_LoadedExecutable_AddressableDevices, &mut d)?;
        let raw_devices = if d.addressable_devices.is_null() {
            &[][..]
        } else {
            // SAFETY: owned by the executable, `num_addressable_devices` long.
            unsafe { std::slice::from_raw_parts(d.addressable_devices, d.num_addressable_devices) }
        };
        for &rd in raw_devices {
            let device = self
                .devices()
                .iter()
                .find(|x| x.raw == rd)
                .ok_or_else(|| Error::internal("an executable's device is not the client's"))?;
            loaded.devices.push(device.clone());
        }
        let unloaded = loaded.unloaded()?;
        let mut n = new_args!(
            PJRT_Executable_NumOutputs_Args,
            PJRT_Executable_NumOutputs_Args_STRUCT_SIZE
        );
        n.executable = unloaded.raw;
        call!(api, PJRT_Executable_NumOutputs, &mut n)?;
        let mut t = new_args!(
            PJRT_Executable_OutputElementTypes_Args,
            PJRT_Executable_OutputElementTypes_Args_STRUCT_SIZE
        );
        t.executable = unloaded.raw;
        call!(api, PJRT_Executable_OutputElementTypes, &mut t)?;
        let mut dims = new_args!(
            PJRT_Executable_OutputDimensions_Args,
            PJRT_Executable_OutputDimensions_Args_STRUCT_SIZE
        );
        dims.executable = unloaded.raw;
        call!(api, PJRT_Executable_OutputDimensions, &mut dims)?;
        if t.num_output_types != n.num_outputs || dims.num_outputs != n.num_outputs {
            return Err(Error::internal(format!(
                "the plugin describes {} outputs with {} types and {} shapes",
                n.num_outputs, t.num_output_types, dims.num_outputs
            )));
        }
        // SAFETY: both lists are owned by the executable and `num_outputs` long.
        let (types, sizes) = unsafe {
            (
                std::slice::from_raw_parts(t.output_types, n.num_outputs),
                std::slice::from_raw_parts(dims.dim_sizes, n.num_outputs),
            )
        };
        let total: usize = sizes.iter().sum();
        // SAFETY: the dimensions of every output, one after another.
        let all_dims = if total == 0 {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(dims.dims, total) }
        };
        let mut at = 0;
        let mut output_types = Vec::with_capacity(types.len());
        let mut output_dims = Vec::with_capacity(types.len());
        for (&ty, &size) in types.iter().zip(sizes) {
            output_types.push(ElementType::from_pjrt(ty)?);
            output_dims.push(all_dims[at..at + size].to_vec());
            at += size;
        }
        drop(unloaded);
        loaded.output_types = output_types;
        loaded.output_dims = output_dims;
        Ok(loaded)
    }
}

impl LoadedExecutable {
    fn unloaded(&self) -> Result<Unloaded<'_>> {
        let mut g = new_args!(
            PJRT_LoadedExecutable_GetExecutable_Args,
            PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE
        );
        g.loaded_executable = self.raw;
        call!(
            self.client.plugin.api(),
            PJRT_LoadedExecutable_GetExecutable,
            &mut g
        )?;
        Ok(Unloaded {
            raw: g.executable,
            client: &self.client,
        })
    }

    /// The devices it runs on, in the order of `execute`'s argument lists.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The element type of each output.
    pub fn output_types(&self) -> &[ElementType] {
        &self.output_types
    }

    /// The dimensions of each output (per device).
    pub fn output_dims(&self) -> &[Vec<i64>] {
        &self.output_dims
    }

    /// The plugin's serialized form, loadable by the same plugin and version
    /// ([`Client::deserialize_and_load`]).
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let unloaded = self.unloaded()?;
        let mut a = new_args!(
            PJRT_Executable_Serialize_Args,
            PJRT_Executable_Serialize_Args_STRUCT_SIZE
        );
        a.executable = unloaded.raw;
        call!(self.client.plugin.api(), PJRT_Executable_Serialize, &mut a)?;
        let bytes = if a.serialized_bytes.is_null() {
            Vec::new()
        } else {
            // SAFETY: owned by `serialized_executable`, `serialized_bytes_size` long.
            unsafe {
                std::slice::from_raw_parts(a.serialized_bytes.cast::<u8>(), a.serialized_bytes_size)
            }
            .to_vec()
        };
        if let Some(deleter) = a.serialized_executable_deleter {
            // SAFETY: the deleter the plugin gave for this object.
            unsafe { deleter(a.serialized_executable) };
        }
        Ok(bytes)
    }

    /// Runs the program once: `arguments[d]` are the inputs of the `d`-th of
    /// [`devices`](Self::devices). Gives each device's outputs, which become
    /// ready when the program has run (their ready events carry its error),
    /// and each device's completion event (`None` where the plugin gave none).
    ///
    /// Errors: `invalid_argument` when there is not one argument list per
    /// device, the lists differ in length, or a buffer is of another client;
    /// the plugin's error for arguments the program does not take.
    pub fn execute<'a, L: AsRef<[&'a Buffer]>>(&self, arguments: &[L]) -> Result<Executed> {
        type PerDevice<T> = SmallVec<[T; 2]>;
        let num_devices = self.devices.len();
        if arguments.len() != num_devices {
            return Err(Error::invalid_argument(format!(
                "the program runs on {num_devices} devices and was given {} argument lists",
                arguments.len()
            )));
        }
        let num_args = arguments.first().map_or(0, |l| l.as_ref().len());
        if arguments.iter().any(|l| l.as_ref().len() != num_args) {
            return Err(Error::invalid_argument(
                "every device's argument list must have the same length",
            ));
        }
        if arguments
            .iter()
            .flat_map(|l| l.as_ref())
            .any(|b| !Arc::ptr_eq(b.client_arc(), &self.client))
        {
            return Err(Error::invalid_argument(
                "an argument is a buffer of another PJRT client",
            ));
        }
        let lists: PerDevice<SmallVec<[*mut sys::PJRT_Buffer; 8]>> = arguments
            .iter()
            .map(|l| l.as_ref().iter().map(|b| b.raw()).collect())
            .collect();
        let list_ptrs: PerDevice<*const *mut sys::PJRT_Buffer> =
            lists.iter().map(|l| l.as_ptr()).collect();
        let num_outputs = self.output_types.len();
        let mut outputs: PerDevice<SmallVec<[*mut sys::PJRT_Buffer; 8]>> = (0..num_devices)
            .map(|_| smallvec::smallvec![std::ptr::null_mut(); num_outputs])
            .collect();
        let output_ptrs: PerDevice<*mut *mut sys::PJRT_Buffer> =
            outputs.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut events: PerDevice<*mut sys::PJRT_Event> =
            smallvec::smallvec![std::ptr::null_mut(); num_devices];
        // No argument is donated: the caller's buffers stay theirs (a module
        // that aliases an input to an output gets a copy from the plugin).
        let keep: SmallVec<[i64; 8]> = (0..num_args as i64).collect();
        let mut options = new_args!(PJRT_ExecuteOptions, PJRT_ExecuteOptions_STRUCT_SIZE);
        options.non_donatable_input_indices = keep.as_ptr();
        options.num_non_donatable_input_indices = keep.len();
        let mut a = new_args!(
            PJRT_LoadedExecutable_Execute_Args,
            PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE
        );
        a.executable = self.raw;
        a.options = &mut options;
        a.argument_lists = list_ptrs.as_ptr();
        a.num_devices = num_devices;
        a.num_args = num_args;
        a.output_lists = output_ptrs.as_ptr();
        a.device_complete_events = events.as_mut_ptr();
        call!(
            self.client.plugin.api(),
            PJRT_LoadedExecutable_Execute,
            &mut a
        )?;
        let client = Client(self.client.clone());
        let plugin = &self.client.plugin;
        let events: Vec<Option<Event>> = events
            .into_iter()
            .map(|e| Event::from_raw(plugin, e))
            .collect();
        let mut per_device = Vec::with_capacity(num_devices);
        let mut failure = None;
        for list in outputs {
            let mut buffers = Vec::with_capacity(num_outputs);
            for (i, raw) in list.into_iter().enumerate() {
                match client.adopt(raw, self.output_types[i], &self.output_dims[i]) {
                    Ok(b) => buffers.push(b),
                    Err(e) => failure = Some(e),
                }
            }
            per_device.push(buffers);
        }
        match failure {
            Some(e) => Err(e),
            None => Ok((per_device, events)),
        }
    }
}
