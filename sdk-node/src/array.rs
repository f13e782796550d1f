//! Arrays: made from JavaScript data (`devicePut`), read back as typed arrays,
//! assembled from single-device arrays.

use colocated_core as core;
use napi::bindgen_prelude::{
    AsyncTask, ClassInstance, Either, FnArgs, FromNapiValue, Function, Object, Unknown,
};
use napi::threadsafe_function::ThreadsafeFunctionCallMode;
use napi::{Env, JsValue, Task};
use napi_derive::napi;

use crate::client::{on_stream, Device, Stream};
use crate::convert::{gather, read, Gathered, HostData};
use crate::errors::{invalid, to_js, OrThrow};
use crate::promise::settle;
use crate::sharding::{
    sharding_of, sharding_to_js, type_name, NamedSharding, SingleDeviceSharding,
};

/// An array sharded over devices (JAX's `jax.Array`; exported as `Array`
/// too): returned at once, ready later (`await a.ready()`).
#[napi]
#[derive(Clone)]
pub struct ColocatedArray {
    pub(crate) client: core::Client,
    pub(crate) inner: core::Array,
}

/// One device's part of an array.
#[napi(object, object_from_js = false)]
pub struct Shard {
    /// Where it lives.
    pub device: Device,
    /// Per dimension, `[start, stop)` of the global array it holds.
    pub index: Vec<Vec<i64>>,
    /// The shard, as an array on its device.
    pub data: ColocatedArray,
}

#[napi]
impl ColocatedArray {
    /// The global shape.
    #[napi(getter)]
    pub fn shape(&self) -> Vec<i64> {
        self.inner.shape().to_vec()
    }

    /// The element type's name (`'float32'`, `'int64'`, `'bool'`, …).
    #[napi(getter)]
    pub fn dtype(&self) -> String {
        self.inner.dtype().name().to_string()
    }

    /// The number of elements.
    #[napi(getter)]
    pub fn size(&self) -> i64 {
        self.inner.shape().iter().product()
    }

    /// The sharding.
    #[napi(getter)]
    pub fn sharding(&self) -> Either<NamedSharding, SingleDeviceSharding> {
        sharding_to_js(&self.client, self.inner.sharding())
    }

    /// The shards this process can address, one per device (workers' shards
    /// are addressable from the controller too).
    #[napi(getter)]
    pub fn addressable_shards(&self, env: Env) -> napi::Result<Vec<Shard>> {
        let spec = self.inner.spec();
        let devices = spec.sharding.devices();
        let mut shards = Vec::with_capacity(devices.len());
        for (i, (device, buffer)) in devices.iter().zip(self.inner.buffers()).enumerate() {
            let index = self.inner.shard_index(i).js(&env)?;
            let data = single(buffer).js(&env)?;
            shards.push(Shard {
                device: Device::of(&self.client, device),
                index: index.iter().map(|r| vec![r.start, r.end]).collect(),
                data: ColocatedArray {
                    client: self.client.clone(),
                    inner: data,
                },
            });
        }
        Ok(shards)
    }

    /// Resolves once every shard is ready; rejects with the error of the work
    /// that was to produce it.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn ready<'e>(&self, env: &'e Env) -> napi::Result<Object<'e>> {
        settle(env, &self.inner.ready_event(), |_| Ok(()))
    }

    /// Gathers the array into a typed array of its element type (a new
    /// one: writing to it does not change the array), or an array of
    /// strings. Shards on workers download in parallel, off the event loop.
    #[napi(ts_return_type = "Promise<TypedArray | string[]>")]
    pub fn to_typed_array(&self) -> AsyncTask<Gather> {
        AsyncTask::new(Gather {
            array: self.inner.clone(),
        })
    }

    /// Frees the shards (on their workers too). Later uses fail with
    /// `FailedPreconditionError`.
    #[napi]
    pub fn delete(&self) {
        self.inner.delete();
    }

    /// True once deleted.
    #[napi(getter)]
    pub fn is_deleted(&self) -> bool {
        self.inner.is_deleted()
    }

    /// `Array(float32[4], sharding)`.
    #[napi(js_name = "toString")]
    pub fn to_js_string(&self) -> String {
        format!(
            "Array({}, {:?})",
            self.inner.spec().describe(),
            self.inner.sharding()
        )
    }
}

/// The single-device array of one shard.
fn single(buffer: &core::Buffer) -> core::Result<core::Array> {
    let sharding = core::Sharding::single_device(buffer.device().clone());
    let spec = core::ArraySpec::new(buffer.dims().to_vec(), buffer.dtype(), sharding)?;
    core::Array::assemble(spec, vec![buffer.clone()])
}

/// Gathering an array, on libuv's thread pool.
pub struct Gather {
    array: core::Array,
}

impl Task for Gather {
    type Output = core::Result<Gathered>;
    type JsValue = Gathered;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        Ok(gather(&self.array))
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<Gathered> {
        output.map_err(|e| to_js(&env, &e))
    }
}

/// Options of `devicePut`.
#[napi(object, object_to_js = false)]
pub struct PutOptions<'a> {
    /// The shape (default: the data's: a typed array is flat).
    pub shape: Option<Vec<f64>>,
    /// The element type (default: the data's: a typed array's element type,
    /// float32 for numbers, int64 for bigints, bool, string).
    pub dtype: Option<String>,
    /// The stream a copy of an Array queues on (default: the calling
    /// context's, see `Stream.run`).
    pub stream: Option<ClassInstance<'a, Stream>>,
    /// Called with `(bytes done, bytes in all)` as the bytes that go to
    /// workers travel (on the event loop, after the fact; a put within this
    /// process reports nothing).
    #[napi(ts_type = "(done: number, total: number) => void")]
    pub on_progress: Option<Function<'a, FnArgs<(f64, f64)>, Unknown<'static>>>,
}

/// `onProgress` as core's progress callback (called on network threads; the
/// calls reach the event loop without waiting, and do not keep it alive).
fn progress_of(
    f: Option<&Function<FnArgs<(f64, f64)>, Unknown<'static>>>,
) -> napi::Result<Option<core::Progress>> {
    let Some(f) = f else {
        return Ok(None);
    };
    let tsfn = f
        .build_threadsafe_function::<FnArgs<(f64, f64)>>()
        .callee_handled::<false>()
        .weak::<true>()
        .build()?;
    Ok(Some(std::sync::Arc::new(move |done: u64, total: u64| {
        let _ = tsfn.call(
            FnArgs::from((done as f64, total as f64)),
            ThreadsafeFunctionCallMode::NonBlocking,
        );
    })))
}

/// Puts `data` on devices: a typed array, a number, bigint, boolean or
/// string, nested arrays of them, or an `Array` (returned as it is when
/// laid out that way already, copied host to host when its shards keep their
/// place, else gathered and put again in the background). `sharding`: a NamedSharding, SingleDeviceSharding or Device
/// (default: the default client's first device). Returns at once; the data
/// is copied during the call, and the array is ready once it is in place.
#[napi(
    ts_args_type = "data: TypedArray | number | bigint | boolean | string | unknown[] | ColocatedArray, sharding?: NamedSharding | SingleDeviceSharding | Device | null, options?: PutOptions"
)]
pub fn device_put(
    env: Env,
    data: Unknown,
    sharding: Option<Unknown>,
    options: Option<PutOptions>,
) -> napi::Result<ColocatedArray> {
    // The event loop must not wait for the network: copies to workers queue
    // their chunks at once.
    let stream = options
        .as_ref()
        .and_then(|o| o.stream.as_ref())
        .map(|s| Stream {
            inner: s.inner.clone(),
        });
    on_stream(stream.as_ref(), || {
        core::without_waiting(|| put(&env, &data, sharding.as_ref(), options))
    })
    .js(&env)
}

fn put(
    env: &Env,
    data: &Unknown,
    sharding: Option<&Unknown>,
    options: Option<PutOptions>,
) -> core::Result<ColocatedArray> {
    let (client, sharding) = match sharding {
        Some(s) if !is_nullish(s) => sharding_of(env, s)?,
        _ => {
            let client = crate::client::default_client()?;
            let device = client
                .devices()
                .first()
                .cloned()
                .ok_or_else(|| invalid("the default client has no device"))?;
            (client, core::Sharding::single_device(device))
        }
    };
    let progress = progress_of(options.as_ref().and_then(|o| o.on_progress.as_ref()))
        .map_err(|e| invalid(format!("onProgress: {}", e.reason)))?;
    let (shape, dtype) = match options {
        Some(o) => (
            o.shape.map(|s| crate::convert::dims(&s)).transpose()?,
            o.dtype.map(|d| core::DType::from_name(&d)).transpose()?,
        ),
        None => (None, None),
    };
    // SAFETY: `data` is a live value of this call's environment; the class
    // check comes first.
    if let Ok(array) =
        unsafe { ClassInstance::<ColocatedArray>::from_napi_value(env.raw(), data.raw()) }
    {
        if shape.is_some() || dtype.is_some() {
            return Err(invalid(
                "devicePut of an Array takes no shape or dtype: it keeps the array's",
            ));
        }
        // As it is, host to host, or gathered and put (on a thread of the
        // runtime's: the event loop does not wait).
        let inner = array.inner.put_to(&client, sharding, None, progress)?;
        return Ok(ColocatedArray { client, inner });
    }
    let (shape, host) = read(data, dtype, shape)?;
    let inner = match host {
        HostData::Dense(dtype, bytes) => {
            let spec = core::ArraySpec::new(shape, dtype, sharding)?;
            core::Array::from_host_bytes_with_progress(&client, &bytes, spec, None, progress)?
        }
        HostData::Strings(strings) => {
            let spec = core::ArraySpec::new(shape, core::DType::String, sharding)?;
            core::Array::from_host_strings(&client, &strings, spec)?
        }
    };
    Ok(ColocatedArray { client, inner })
}

fn is_nullish(value: &Unknown) -> bool {
    matches!(type_name(value), "undefined" | "null")
}

/// Assembles an array of `shape` over `sharding` from single-device arrays,
/// one per device of the sharding (in any order), without copying.
#[napi(
    ts_args_type = "shape: number[], sharding: NamedSharding | SingleDeviceSharding | Device, arrays: ColocatedArray[]"
)]
pub fn make_array_from_single_device_arrays(
    env: Env,
    shape: Vec<f64>,
    sharding: Unknown,
    arrays: Vec<ClassInstance<ColocatedArray>>,
) -> napi::Result<ColocatedArray> {
    let shape = crate::convert::dims(&shape).js(&env)?;
    let (client, sharding) = sharding_of(&env, &sharding).js(&env)?;
    let Some(first) = arrays.first() else {
        return Err(invalid("no arrays were given")).js(&env);
    };
    let dtype = first.inner.dtype();
    let spec = core::ArraySpec::new(shape, dtype, sharding).js(&env)?;
    let parts: Vec<core::Array> = arrays.iter().map(|a| a.inner.clone()).collect();
    let inner = core::Array::from_single_device_arrays(spec, &parts, None).js(&env)?;
    Ok(ColocatedArray { client, inner })
}
