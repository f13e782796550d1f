//! Meshes, partition specs and shardings (JAX's), over core's `Sharding`; and
//! `ShapeDtypeStruct`, core's `ArraySpec`.

use colocated_core as core;
use napi::bindgen_prelude::{ClassInstance, Either, FromNapiValue, Null, Unknown};
use napi::{Env, JsValue, ValueType};
use napi_derive::napi;

use crate::client::Device;
use crate::errors::{invalid, OrThrow};

/// Devices laid out over named axes: `new Mesh(devices, ['x'])`, or nested
/// arrays of devices for more axes (`new Mesh([[d0, d1], [d2, d3]], ['x', 'y'])`).
#[napi]
#[derive(Clone)]
pub struct Mesh {
    pub(crate) client: core::Client,
    pub(crate) devices: Vec<core::Device>,
    pub(crate) shape: Vec<usize>,
    pub(crate) axis_names: Vec<String>,
}

#[napi]
impl Mesh {
    /// `devices`: (nested) arrays of devices, one level per axis.
    #[napi(
        constructor,
        ts_args_type = "devices: Device[] | Device[][] | Device[][][], axisNames: string[]"
    )]
    pub fn new(env: Env, devices: Unknown, axis_names: Vec<String>) -> napi::Result<Self> {
        let mut flat: Vec<Device> = Vec::new();
        let mut shape: Vec<usize> = Vec::new();
        flatten_devices(&env, devices, 0, &mut shape, &mut flat).js(&env)?;
        if shape.len() != axis_names.len() {
            return Err(invalid(format!(
                "the devices nest {} deep but {} axis names are given",
                shape.len(),
                axis_names.len()
            )))
            .js(&env);
        }
        let Some(first) = flat.first() else {
            return Err(invalid("a mesh needs at least one device")).js(&env);
        };
        let client = first.client.clone();
        let devices: Vec<core::Device> = flat.iter().map(|d| d.inner.clone()).collect();
        // Core checks the rest (repeated names or devices, one client).
        core::Sharding::named(devices.clone(), shape.clone(), axis_names.clone(), vec![])
            .js(&env)?;
        Ok(Mesh {
            client,
            devices,
            shape,
            axis_names,
        })
    }

    /// The devices, in row-major order.
    #[napi(getter)]
    pub fn devices(&self) -> Vec<Device> {
        self.devices
            .iter()
            .map(|d| Device::of(&self.client, d))
            .collect()
    }

    /// The size of each axis.
    #[napi(getter)]
    pub fn shape(&self) -> Vec<u32> {
        self.shape.iter().map(|&n| n as u32).collect()
    }

    /// The axis names.
    #[napi(getter)]
    pub fn axis_names(&self) -> Vec<String> {
        self.axis_names.clone()
    }

    /// The number of devices.
    #[napi(getter)]
    pub fn size(&self) -> u32 {
        self.devices.len() as u32
    }
}

/// Reads nested arrays of devices: `shape` gets one size per level.
fn flatten_devices(
    env: &Env,
    value: Unknown,
    depth: usize,
    shape: &mut Vec<usize>,
    out: &mut Vec<Device>,
) -> core::Result<()> {
    if depth > crate::convert::MAX_RANK {
        return Err(invalid("the mesh's device arrays nest too deep (a cycle?)"));
    }
    let is_array = value.is_array().unwrap_or(false);
    if !is_array {
        if depth == 0 {
            return Err(invalid(format!(
                "Mesh: devices must be an array of Devices, not {}",
                type_name(&value)
            )));
        }
        let device = device_of(env, &value)?;
        if shape.len() != depth {
            return Err(invalid("the mesh's nested device arrays are ragged"));
        }
        out.push(device);
        return Ok(());
    }
    let items: Vec<Unknown> =
        unsafe { value.cast::<Vec<Unknown>>() }.map_err(|e| invalid(e.reason.clone()))?;
    match shape.get(depth) {
        None if depth == shape.len() && out.is_empty() => shape.push(items.len()),
        Some(&n) if n == items.len() => {}
        _ => return Err(invalid("the mesh's nested device arrays are ragged")),
    }
    for item in items {
        flatten_devices(env, item, depth + 1, shape, out)?;
    }
    Ok(())
}

/// The device `value` (an item of a mesh's devices) is, or `invalid_argument`.
fn device_of(env: &Env, value: &Unknown) -> core::Result<Device> {
    // SAFETY: `value` is a live value of this call's environment.
    match unsafe { ClassInstance::<Device>::from_napi_value(env.raw(), value.raw()) } {
        Ok(d) => Ok((*d).clone()),
        Err(_) => Err(invalid(format!(
            "Mesh: devices must hold Devices, not {}",
            type_name(value)
        ))),
    }
}

/// A JavaScript type name for messages.
pub(crate) fn type_name(value: &Unknown) -> &'static str {
    match value.get_type() {
        Ok(ValueType::Undefined) => "undefined",
        Ok(ValueType::Null) => "null",
        Ok(ValueType::Boolean) => "a boolean",
        Ok(ValueType::Number) => "a number",
        Ok(ValueType::String) => "a string",
        Ok(ValueType::Symbol) => "a symbol",
        Ok(ValueType::Function) => "a function",
        Ok(ValueType::BigInt) => "a bigint",
        Ok(ValueType::External) => "an external",
        _ => "an object",
    }
}

/// How each array dimension is split over mesh axes: a name, several names
/// (major first), or `null` (not split): `new PartitionSpec('x', null)`, or
/// `P('x', null)` (as JAX's `PartitionSpec('x', None)`).
#[napi]
#[derive(Clone)]
pub struct PartitionSpec {
    pub(crate) entries: Vec<Vec<String>>,
}

#[napi]
impl PartitionSpec {
    /// One entry per dimension, each an argument: an axis name, an array of
    /// them, or null. Throws `InvalidArgumentError` naming an entry of
    /// another type. (The package's class hands the entries to the native
    /// constructor as one array.)
    #[napi(
        constructor,
        ts_args_type = "...entries: Array<string | string[] | null>"
    )]
    pub fn new(entries: Vec<Either<Either<String, Vec<String>>, Null>>) -> Self {
        let entries = entries
            .into_iter()
            .map(|e| match e {
                Either::A(Either::A(one)) => vec![one],
                Either::A(Either::B(many)) => many,
                Either::B(_) => vec![],
            })
            .collect();
        PartitionSpec { entries }
    }

    /// The entries: an array of axis names per dimension (empty: not split).
    #[napi(getter)]
    pub fn entries(&self) -> Vec<Vec<String>> {
        self.entries.clone()
    }

    /// `P('x', null)`.
    #[napi(js_name = "toString")]
    pub fn to_js_string(&self) -> String {
        let parts: Vec<String> = self
            .entries
            .iter()
            .map(|e| match e.as_slice() {
                [] => "null".to_string(),
                [one] => format!("'{one}'"),
                many => format!(
                    "[{}]",
                    many.iter()
                        .map(|n| format!("'{n}'"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
            .collect();
        format!("P({})", parts.join(", "))
    }
}

/// An array split over a mesh by a partition spec (JAX's `NamedSharding`).
#[napi]
#[derive(Clone)]
pub struct NamedSharding {
    pub(crate) mesh: Mesh,
    pub(crate) spec: PartitionSpec,
    pub(crate) inner: core::Sharding,
}

#[napi]
impl NamedSharding {
    /// Throws `InvalidArgumentError` for an axis the mesh lacks, an axis
    /// used twice, or a memory kind a device lacks.
    #[napi(constructor)]
    pub fn new(
        env: Env,
        mesh: &Mesh,
        spec: &PartitionSpec,
        options: Option<ShardingOptions>,
    ) -> napi::Result<Self> {
        let partition = spec
            .entries
            .iter()
            .map(|names| {
                names
                    .iter()
                    .map(|name| {
                        mesh.axis_names
                            .iter()
                            .position(|a| a == name)
                            .ok_or_else(|| {
                                invalid(format!(
                                    "the partition spec names axis '{name}' but the mesh has {:?}",
                                    mesh.axis_names
                                ))
                            })
                    })
                    .collect::<core::Result<Vec<usize>>>()
            })
            .collect::<core::Result<Vec<_>>>()
            .js(&env)?;
        let inner = core::Sharding::named(
            mesh.devices.clone(),
            mesh.shape.clone(),
            mesh.axis_names.clone(),
            partition,
        )
        .and_then(|sharding| sharding.with_memory_kind(memory_kind_of(options)?))
        .js(&env)?;
        Ok(NamedSharding {
            mesh: mesh.clone(),
            spec: spec.clone(),
            inner,
        })
    }

    /// The kind of memory the shards are in (`'device'`, `'pinned_host'`,
    /// `'unpinned_host'`): the one given, else the devices' default.
    #[napi(getter)]
    pub fn memory_kind(&self) -> String {
        self.inner.memory_kind_or_default().name().to_string()
    }

    /// This sharding with its shards in memory of `kind` (null: the
    /// devices' default). Throws `InvalidArgumentError` for a kind a device
    /// lacks.
    #[napi]
    pub fn with_memory_kind(&self, env: Env, kind: Option<String>) -> napi::Result<NamedSharding> {
        let inner = memory_kind(kind.as_deref())
            .and_then(|kind| self.inner.with_memory_kind(kind))
            .js(&env)?;
        Ok(NamedSharding {
            inner,
            ..self.clone()
        })
    }

    /// The mesh.
    #[napi(getter)]
    pub fn mesh(&self) -> Mesh {
        self.mesh.clone()
    }

    /// The partition spec.
    #[napi(getter)]
    pub fn spec(&self) -> PartitionSpec {
        self.spec.clone()
    }

    /// The devices, in mesh order.
    #[napi(getter)]
    pub fn devices(&self) -> Vec<Device> {
        self.mesh.devices()
    }

    /// True when every device holds the whole array.
    #[napi(getter)]
    pub fn is_fully_replicated(&self) -> bool {
        self.inner.is_fully_replicated()
    }

    /// `NamedSharding(mesh=Mesh('x': 4), spec=P('x'))`.
    #[napi(js_name = "toString")]
    pub fn to_js_string(&self) -> String {
        let axes: Vec<String> = self
            .mesh
            .axis_names
            .iter()
            .zip(&self.mesh.shape)
            .map(|(n, s)| format!("'{n}': {s}"))
            .collect();
        format!(
            "NamedSharding(mesh=Mesh({}), spec={}{})",
            axes.join(", "),
            self.spec.to_js_string(),
            memory_suffix(&self.inner)
        )
    }
}

/// The whole array on one device.
#[napi]
#[derive(Clone)]
pub struct SingleDeviceSharding {
    pub(crate) device: Device,
    pub(crate) inner: core::Sharding,
}

#[napi]
impl SingleDeviceSharding {
    /// Throws `InvalidArgumentError` for a memory kind the device lacks.
    #[napi(constructor)]
    pub fn new(env: Env, device: &Device, options: Option<ShardingOptions>) -> napi::Result<Self> {
        let inner = memory_kind_of(options)
            .and_then(|kind| {
                core::Sharding::single_device(device.inner.clone()).with_memory_kind(kind)
            })
            .js(&env)?;
        Ok(SingleDeviceSharding {
            device: device.clone(),
            inner,
        })
    }

    /// The device.
    #[napi(getter)]
    pub fn device(&self) -> Device {
        self.device.clone()
    }

    /// `[device]`.
    #[napi(getter)]
    pub fn devices(&self) -> Vec<Device> {
        vec![self.device.clone()]
    }

    /// The kind of memory the array is in (as `NamedSharding.memoryKind`).
    #[napi(getter)]
    pub fn memory_kind(&self) -> String {
        self.inner.memory_kind_or_default().name().to_string()
    }

    /// This sharding with the array in memory of `kind` (as
    /// `NamedSharding.withMemoryKind`).
    #[napi]
    pub fn with_memory_kind(
        &self,
        env: Env,
        kind: Option<String>,
    ) -> napi::Result<SingleDeviceSharding> {
        let inner = memory_kind(kind.as_deref())
            .and_then(|kind| self.inner.with_memory_kind(kind))
            .js(&env)?;
        Ok(SingleDeviceSharding {
            inner,
            ..self.clone()
        })
    }

    /// `SingleDeviceSharding(CpuDevice(id=0))`.
    #[napi(js_name = "toString")]
    pub fn to_js_string(&self) -> String {
        format!(
            "SingleDeviceSharding({}{})",
            self.device.inner,
            memory_suffix(&self.inner)
        )
    }
}

/// Options of a sharding.
#[napi(object)]
pub struct ShardingOptions {
    /// The kind of memory the shards are in: `'device'`, `'pinned_host'`
    /// or `'unpinned_host'` (default: each device's default memory).
    pub memory_kind: Option<String>,
}

/// The memory kind `options` name.
fn memory_kind_of(options: Option<ShardingOptions>) -> core::Result<Option<core::MemoryKind>> {
    memory_kind(options.and_then(|o| o.memory_kind).as_deref())
}

/// The memory kind of `name` (None: the devices' default).
fn memory_kind(name: Option<&str>) -> core::Result<Option<core::MemoryKind>> {
    name.map(core::MemoryKind::from_name).transpose()
}

/// `, memoryKind='pinned_host'` for a sharding in other than its devices'
/// default memory, else nothing.
fn memory_suffix(sharding: &core::Sharding) -> String {
    sharding
        .memory_kind()
        .map(|k| format!(", memoryKind='{}'", k.name()))
        .unwrap_or_default()
}

/// A sharding object's core sharding, and its client: a `NamedSharding`, a
/// `SingleDeviceSharding`, or a `Device` (the whole array on it).
pub(crate) fn sharding_of(
    env: &Env,
    value: &Unknown,
) -> core::Result<(core::Client, core::Sharding)> {
    let (env_raw, raw) = (env.raw(), value.raw());
    // SAFETY: `value` is a live value of this call's environment; each
    // attempt checks the class's type tag before reading it.
    if let Ok(s) = unsafe { ClassInstance::<NamedSharding>::from_napi_value(env_raw, raw) } {
        return Ok((s.mesh.client.clone(), s.inner.clone()));
    }
    if let Ok(s) = unsafe { ClassInstance::<SingleDeviceSharding>::from_napi_value(env_raw, raw) } {
        return Ok((s.device.client.clone(), s.inner.clone()));
    }
    if let Ok(d) = unsafe { ClassInstance::<Device>::from_napi_value(env_raw, raw) } {
        return Ok((
            d.client.clone(),
            core::Sharding::single_device(d.inner.clone()),
        ));
    }
    Err(invalid(format!(
        "expected a NamedSharding, a SingleDeviceSharding or a Device, got {}",
        type_name(value)
    )))
}

/// The JavaScript sharding object of a core sharding: a
/// `SingleDeviceSharding` for one device, else a `NamedSharding`.
pub(crate) fn sharding_to_js(
    client: &core::Client,
    sharding: &core::Sharding,
) -> Either<NamedSharding, SingleDeviceSharding> {
    let devices = sharding.devices();
    if devices.len() == 1 {
        return Either::B(SingleDeviceSharding {
            device: Device::of(client, &devices[0]),
            inner: sharding.clone(),
        });
    }
    let names = sharding.axis_names().to_vec();
    let entries = sharding
        .partition()
        .iter()
        .map(|axes| axes.iter().map(|&a| names[a].clone()).collect())
        .collect();
    Either::A(NamedSharding {
        mesh: Mesh {
            client: client.clone(),
            devices: devices.to_vec(),
            shape: sharding.mesh_shape().to_vec(),
            axis_names: names,
        },
        spec: PartitionSpec { entries },
        inner: sharding.clone(),
    })
}

/// An array's shape, element type and sharding, without its data (JAX's
/// `ShapeDtypeStruct`): what a program takes and returns.
#[napi]
#[derive(Clone)]
pub struct ShapeDtypeStruct {
    pub(crate) client: core::Client,
    pub(crate) inner: core::ArraySpec,
}

#[napi]
impl ShapeDtypeStruct {
    /// `dtype`: a name (`'float32'`, `'int64'`, `'bfloat16'`, `'bool'`,
    /// `'string'`, …); `sharding`: a NamedSharding, SingleDeviceSharding or
    /// Device.
    #[napi(
        constructor,
        ts_args_type = "shape: number[], dtype: string, sharding: NamedSharding | SingleDeviceSharding | Device"
    )]
    pub fn new(env: Env, shape: Vec<f64>, dtype: String, sharding: Unknown) -> napi::Result<Self> {
        let shape = crate::convert::dims(&shape).js(&env)?;
        let (client, sharding) = sharding_of(&env, &sharding).js(&env)?;
        let dtype = core::DType::from_name(&dtype).js(&env)?;
        let inner = core::ArraySpec::new(shape, dtype, sharding).js(&env)?;
        Ok(ShapeDtypeStruct { client, inner })
    }

    /// The shape.
    #[napi(getter)]
    pub fn shape(&self) -> Vec<i64> {
        self.inner.shape.clone()
    }

    /// The element type's name.
    #[napi(getter)]
    pub fn dtype(&self) -> String {
        self.inner.dtype.name().to_string()
    }

    /// The sharding.
    #[napi(getter)]
    pub fn sharding(&self) -> Either<NamedSharding, SingleDeviceSharding> {
        sharding_to_js(&self.client, &self.inner.sharding)
    }
}
