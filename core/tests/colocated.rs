//! The colocated protocol of core, language-neutral: a test language whose
//! programs are Rust functions drives colocated functions and objects on the
//! controller's own host and on in-process workers over real sockets — the
//! call rules, the cache, declared outputs, discovery with outputs of any
//! sharding and argument-less calls, parking, and the object lifecycle.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use common::{assert_error, eventually, i32_bytes, i32_values, DropCounter};

use colocated_core::transport::Token;
use colocated_core::worker::Worker;
use colocated_core::{
    host_object, host_objects, parked_results, Array, ArraySpec, AxisType, CallSite, CallSpec,
    Client, ColocatedFunction, ColocatedObject, DType, Device, ErrorCode, ExecutionContext,
    LanguageExecutor, LoadedProgram, MemoryKind, OutputOrigin, Outputs, Payload, Program, Result,
    Sharding,
};

/// The test language's functions: a host's context and input arrays in, its
/// output arrays out.
type HostFn = dyn Fn(&ExecutionContext<'_>, Vec<Array>) -> Result<Vec<Array>> + Send + Sync;

static FUNCTIONS: LazyLock<Mutex<HashMap<String, Arc<HostFn>>>> = LazyLock::new(Default::default);

fn define(
    name: &str,
    f: impl Fn(&ExecutionContext<'_>, Vec<Array>) -> Result<Vec<Array>> + Send + Sync + 'static,
) {
    FUNCTIONS
        .lock()
        .unwrap()
        .insert(name.to_string(), Arc::new(f));
}

/// The structure tag every host's next results carry (see `TestLanguage`):
/// a test changes it to make a function return another structure.
static STRUCTURE_TAG: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The `test` language: the payload names a function of `FUNCTIONS`; the
/// structure of its outputs is their count and `STRUCTURE_TAG`, reported
/// with every run (core checks it against the program's).
struct TestLanguage;

impl LanguageExecutor for TestLanguage {
    fn load(&self, program: &Program) -> Result<Arc<dyn LoadedProgram>> {
        let name = String::from_utf8_lossy(&program.payload).to_string();
        let f = FUNCTIONS
            .lock()
            .unwrap()
            .get(&name)
            .cloned()
            .ok_or_else(|| colocated_core::Error::not_found(format!("no test function {name}")))?;
        Ok(Arc::new(move |ctx: &mut ExecutionContext<'_>| {
            let outputs = f(ctx, ctx.host_input_arrays()?)?;
            let structure = vec![outputs.len() as u8, STRUCTURE_TAG.load(Ordering::SeqCst)];
            ctx.set_host_outputs(outputs, Some(structure))
        }))
    }
}

/// A call site of the test language: the function's name, and the outputs
/// it declares (if any).
struct Site {
    name: &'static str,
    declared: Option<Vec<ArraySpec>>,
}

impl Site {
    fn of(name: &'static str) -> Site {
        Site {
            name,
            declared: None,
        }
    }

    /// The site of `name` declaring `outputs`.
    fn declaring(name: &'static str, outputs: Vec<ArraySpec>) -> Site {
        Site {
            name,
            declared: Some(outputs),
        }
    }
}

impl CallSite for Site {
    type Entry = ();

    fn payload(&self, _devices: &[Device]) -> Result<Payload> {
        Ok(Payload {
            bytes: self.name.as_bytes().to_vec(),
            host_callbacks: Vec::new(),
        })
    }

    fn declared_outputs(&self) -> Result<Option<Outputs>> {
        Ok(self
            .declared
            .clone()
            .map(|specs| Outputs::declared(vec![specs.len() as u8, 0], specs)))
    }

    fn entry(&self, _outputs: &Outputs) -> Result<()> {
        Ok(())
    }
}

/// Tests that count what every session parked or holds in this process run
/// one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn local_client(devices: usize) -> Client {
    let client = common::client_with_threads(devices, 2);
    client.register_executor("test", TestLanguage).unwrap();
    client
}

fn function(devices: Option<Vec<Device>>) -> ColocatedFunction<()> {
    ColocatedFunction::new("f", "test", devices, None).unwrap()
}

fn call_spec(inputs: &[Array]) -> CallSpec {
    CallSpec {
        tree: 1,
        leaves: inputs.iter().map(|a| a.spec().clone()).collect(),
    }
}

/// Calls `f` (a test function, `name`) with `inputs`, as no object's method.
fn call(
    client: &Client,
    f: &ColocatedFunction<()>,
    name: &'static str,
    inputs: &[Array],
) -> Result<colocated_core::Call<()>> {
    call_at(client, f, &Site::of(name), inputs)
}

/// Calls `f` at `site` with `inputs`, as no object's method.
fn call_at(
    client: &Client,
    f: &ColocatedFunction<()>,
    site: &Site,
    inputs: &[Array],
) -> Result<colocated_core::Call<()>> {
    f.call(client, &call_spec(inputs), inputs, site, &[])
}

fn named(devices: Vec<Device>, axis: &str) -> Sharding {
    let n = devices.len();
    Sharding::named(devices, vec![n], vec![axis.into()], vec![vec![0]]).unwrap()
}

fn i32_array(client: &Client, values: &[i32], sharding: Sharding) -> Array {
    let spec = ArraySpec::new(vec![values.len() as i64], DType::I32, sharding).unwrap();
    Array::from_host_bytes(client, &i32_bytes(values), spec).unwrap()
}

/// The int32 values of `x`, each through `f`.
fn mapped(x: &Array, f: impl Fn(i32) -> i32) -> Result<Vec<i32>> {
    Ok(i32_values(&x.to_host_bytes()?).into_iter().map(f).collect())
}

/// This host's devices of the call, in the program's order.
fn host_devices(ctx: &ExecutionContext<'_>) -> Vec<Device> {
    let on_host = ctx.client().devices();
    ctx.program()
        .devices
        .iter()
        .filter(|d| on_host.contains(d))
        .cloned()
        .collect()
}

/// This test's turn (see [`serial`]), with the test functions defined and
/// a local client of `devices` devices.
fn local_client_with_functions(devices: usize) -> (MutexGuard<'static, ()>, Client) {
    let turn = serial();
    define_functions();
    (turn, local_client(devices))
}

fn define_functions() {
    // Each element plus one, with the input's sharding.
    define("add_one", |ctx, inputs| {
        let x = &inputs[0];
        let values = mapped(x, |v| v + 1)?;
        let spec = x.spec().clone();
        Ok(vec![Array::from_host_bytes(
            ctx.client(),
            &i32_bytes(&values),
            spec,
        )?])
    });
    // Ten times the input, over this host's devices in reverse order: a
    // sharding of none of the inputs (as one captured in the function).
    define("reversed", |ctx, inputs| {
        let x = &inputs[0];
        let values = mapped(x, |v| v * 10)?;
        let mut devices = host_devices(ctx);
        devices.reverse();
        Ok(vec![i32_array(ctx.client(), &values, named(devices, "y"))])
    });
    // Ten times the input over its devices in its order (the input's
    // layout), on a mesh of other names and axis types.
    define("renamed", |ctx, inputs| {
        let x = &inputs[0];
        let values = mapped(x, |v| v * 10)?;
        let sharding = named(x.sharding().devices().to_vec(), "y")
            .with_axis_types(vec![AxisType::Explicit])?;
        Ok(vec![i32_array(ctx.client(), &values, sharding)])
    });
    // The input with its sharding, in pinned host memory.
    define("pinned", |ctx, inputs| {
        let x = &inputs[0];
        Ok(vec![Array::from_host_bytes_in(
            ctx.client(),
            &x.to_host_bytes()?,
            x.spec().clone(),
            Some(MemoryKind::PinnedHost),
        )?])
    });
    // No inputs: [0, 1, ...] over this host's devices, one per device.
    define("iota", |ctx, _inputs| {
        let devices = host_devices(ctx);
        let values: Vec<i32> = (0..devices.len() as i32).collect();
        Ok(vec![i32_array(ctx.client(), &values, named(devices, "x"))])
    });
    // Fails on the host whose part of the input holds a 4.
    define("fails_where_4", |_ctx, inputs| {
        let x = &inputs[0];
        if i32_values(&x.to_host_bytes()?).contains(&4) {
            return Err(colocated_core::Error::invalid_argument("not on this host"));
        }
        Ok(vec![x.clone()])
    });
    // Calls host callback 0 (a program compiled without any).
    define("calls_callback_0", |ctx, inputs| {
        ctx.call_host_callback(0, b"not a report")?;
        Ok(vec![inputs[0].clone()])
    });
    // Returns an array on a device outside the call.
    define("escapes", |ctx, _inputs| {
        let outside = ctx.client().devices().last().cloned().unwrap();
        Ok(vec![i32_array(
            ctx.client(),
            &[1],
            Sharding::single_device(outside),
        )])
    });
}

#[test]
fn discovery_on_the_local_host_keeps_an_inputs_sharding_and_caches_the_program() {
    let (_serial, client) = local_client_with_functions(4);
    let x = i32_array(
        &client,
        &[1, 2, 3, 4],
        named(client.devices()[..2].to_vec(), "x"),
    );
    let f = function(None);
    let inputs = [x.clone()];
    let first = call(&client, &f, "add_one", &inputs).unwrap();
    assert!(first.status.is_none(), "discovery ran synchronously");
    assert!(first.outputs[0].spec().matches(x.spec()));
    assert!(
        first.outputs[0].sharding().same_as(x.sharding()),
        "the input's own sharding"
    );
    assert_eq!(first.entry.outputs().origins, vec![OutputOrigin::Input(0)]);
    assert_eq!(
        i32_values(&first.outputs[0].to_host_bytes().unwrap()),
        [2, 3, 4, 5]
    );
    let second = call(&client, &f, "add_one", &inputs).unwrap();
    second.status.unwrap().wait().unwrap();
    assert_eq!(
        i32_values(&second.outputs[0].to_host_bytes().unwrap()),
        [2, 3, 4, 5]
    );
    let info = f.cache_info();
    assert_eq!((info.hits, info.misses, info.currsize), (1, 1, 1));
}

/// Sets the structure tag of the test language's results while it lives.
struct Tagged;

impl Tagged {
    fn with(tag: u8) -> Tagged {
        STRUCTURE_TAG.store(tag, Ordering::SeqCst);
        Tagged
    }
}

impl Drop for Tagged {
    fn drop(&mut self) {
        STRUCTURE_TAG.store(0, Ordering::SeqCst);
    }
}

/// Calls `add_one` (once to discover, then with another result structure)
/// and checks that core refuses the second result on every host.
fn check_a_result_of_another_structure_is_refused(client: &Client, devices: Vec<Device>) {
    let x = i32_array(client, &[1, 2, 3, 4], named(devices, "x"));
    let f = function(None);
    let inputs = [x.clone()];
    let first = call(client, &f, "add_one", &inputs).unwrap();
    assert_eq!(
        i32_values(&first.outputs[0].to_host_bytes().unwrap()),
        [2, 3, 4, 5]
    );
    let _tag = Tagged::with(7);
    let second = call(client, &f, "add_one", &inputs)
        .and_then(|second| second.status.map_or(Ok(()), |s| s.wait()));
    assert_error(
        second,
        ErrorCode::InvalidArgument,
        "another structure than its program's",
    );
    // Its declared structure: the same rule.
    let declared = Site::declaring("add_one", vec![x.spec().clone()]);
    let run = call_at(client, &function(None), &declared, &inputs)
        .and_then(|run| run.status.map_or(Ok(()), |s| s.wait()));
    assert_error(
        run,
        ErrorCode::InvalidArgument,
        "another structure than its program's",
    );
}

#[test]
fn a_result_of_another_structure_than_the_programs_is_refused_on_the_local_host() {
    let (_serial, client) = local_client_with_functions(4);
    let devices = client.devices()[..2].to_vec();
    check_a_result_of_another_structure_is_refused(&client, devices);
}

#[test]
fn a_result_of_another_structure_than_the_programs_is_refused_on_workers() {
    let (_serial, _workers, client) = two_workers();
    let devices = client.devices().to_vec();
    check_a_result_of_another_structure_is_refused(&client, devices);
}

#[test]
fn discovery_gives_an_output_the_sharding_the_function_made_not_an_equivalent_inputs() {
    let (_serial, client) = local_client_with_functions(4);
    let x = i32_array(&client, &[1, 2], named(client.devices()[..2].to_vec(), "x"));
    let inputs = [x.clone()];
    let ran = call(&client, &function(None), "renamed", &inputs).unwrap();
    let outputs = ran.entry.outputs();
    assert_eq!(outputs.origins, vec![OutputOrigin::New]);
    let made = named(client.devices()[..2].to_vec(), "y")
        .with_axis_types(vec![AxisType::Explicit])
        .unwrap();
    assert!(outputs.specs[0].sharding == made, "{:?}", outputs.specs[0]);
    assert!(ran.outputs[0].sharding() == &made);
    assert_eq!(ran.outputs[0].memory_kind(), MemoryKind::Device);
    assert_eq!(
        outputs.specs[0].sharding.memory_kind(),
        None,
        "the default memory"
    );

    let ran = call(&client, &function(None), "pinned", &inputs).unwrap();
    let outputs = ran.entry.outputs();
    assert_eq!(
        outputs.origins,
        vec![OutputOrigin::New],
        "another memory kind than the input's"
    );
    let pinned = x
        .sharding()
        .with_memory_kind(Some(MemoryKind::PinnedHost))
        .unwrap();
    assert!(
        outputs.specs[0].sharding == pinned,
        "{:?}",
        outputs.specs[0]
    );
    assert!(outputs.specs[0].sharding != *x.sharding());
    assert_eq!(ran.outputs[0].memory_kind(), MemoryKind::PinnedHost);
    assert!(ran.outputs[0].sharding() == &pinned);
}

#[test]
fn discovery_takes_an_output_with_a_sharding_of_its_own_and_refuses_one_outside_the_call() {
    let (_serial, client) = local_client_with_functions(4);
    let devices = client.devices()[..2].to_vec();
    let x = i32_array(&client, &[1, 2], named(devices.clone(), "x"));
    let inputs = [x];
    let ran = call(&client, &function(None), "reversed", &inputs).unwrap();
    let out = &ran.outputs[0];
    assert_eq!(ran.entry.outputs().origins, vec![OutputOrigin::New]);
    assert_eq!(
        out.sharding().devices(),
        [devices[1].clone(), devices[0].clone()]
    );
    assert_eq!(i32_values(&out.to_host_bytes().unwrap()), [10, 20]);

    let err = call(&client, &function(None), "escapes", &inputs).map(|_| ());
    assert_error(
        err,
        ErrorCode::InvalidArgument,
        "not one of the call's devices",
    );
}

#[test]
fn an_argument_less_call_needs_devices_and_runs_on_them() {
    let (_serial, client) = local_client_with_functions(4);
    let err = call(&client, &function(None), "iota", &[]).map(|_| ());
    assert_error(
        err,
        ErrorCode::InvalidArgument,
        "must be first specialized with devices",
    );
    let devices = client.devices()[1..3].to_vec();
    let ran = call(&client, &function(Some(devices.clone())), "iota", &[]).unwrap();
    assert_eq!(ran.outputs[0].sharding().devices(), devices.as_slice());
    assert_eq!(i32_values(&ran.outputs[0].to_host_bytes().unwrap()), [0, 1]);
}

#[test]
fn declared_outputs_run_asynchronously_and_a_wrong_output_is_refused() {
    let (_serial, client) = local_client_with_functions(2);
    let x = i32_array(&client, &[1, 2], named(client.devices().to_vec(), "x"));
    let inputs = [x.clone()];
    let site = Site::declaring("add_one", vec![x.spec().clone()]);
    let ran = call_at(&client, &function(None), &site, &inputs).unwrap();
    ran.status.unwrap().wait().unwrap();
    assert_eq!(i32_values(&ran.outputs[0].to_host_bytes().unwrap()), [2, 3]);

    // "reversed" makes another sharding than the one declared.
    let site = Site::declaring("reversed", vec![x.spec().clone()]);
    let ran = call_at(&client, &function(None), &site, &inputs).unwrap();
    assert_error(
        ran.status.unwrap().wait(),
        ErrorCode::InvalidArgument,
        "was expected",
    );
}

#[test]
fn a_discovery_run_hides_the_protocols_report_callback_from_the_function() {
    let (_serial, client) = local_client_with_functions(1);
    let x = i32_array(&client, &[1], named(client.devices().to_vec(), "x"));
    // The function has no host callbacks of its own: index 0 is out of
    // range, not the report callback core added.
    let err = match call(&client, &function(None), "calls_callback_0", &[x]) {
        Ok(_) => panic!("the function reached the report callback"),
        Err(e) => e,
    };
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(err.message().contains("out of range"), "{err}");
}

#[test]
fn a_program_compiled_ahead_serializes_and_runs_where_it_is_loaded() {
    let (_serial, client) = local_client_with_functions(2);
    let x = i32_array(&client, &[1, 2], named(client.devices().to_vec(), "x"));
    let spec = call_spec(std::slice::from_ref(&x));
    let f = function(None);
    // Without declared outputs there is nothing to compile ahead: discovery
    // would run the function.
    assert_error(
        f.compile_ahead(&client, &spec, &Site::of("add_one"))
            .map(|_| ()),
        ErrorCode::InvalidArgument,
        "needs its output specs declared",
    );
    let site = Site::declaring("add_one", vec![x.spec().clone()]);
    let entry = f.compile_ahead(&client, &spec, &site).unwrap();
    // The serialized program runs where it is loaded, as any executable.
    let loaded = client
        .deserialize_and_load(
            &entry.executable().serialize(),
            colocated_core::CompileOptions::default(),
        )
        .unwrap();
    let run = loaded
        .execute(
            std::slice::from_ref(&x),
            &colocated_core::ExecuteOptions::default(),
        )
        .unwrap();
    run.status.wait().unwrap();
    assert_eq!(i32_values(&run.outputs[0].to_host_bytes().unwrap()), [2, 3]);
    // It carries its result's structure, and refuses another.
    {
        let _tag = Tagged::with(7);
        let run = loaded
            .execute(
                std::slice::from_ref(&x),
                &colocated_core::ExecuteOptions::default(),
            )
            .unwrap();
        assert_error(
            run.status.wait(),
            ErrorCode::InvalidArgument,
            "another structure than its program's",
        );
    }
    // A call of that spec takes the program compiled ahead.
    let hits = f.cache_info().hits;
    let ran = call(&client, &f, "add_one", std::slice::from_ref(&x)).unwrap();
    ran.status.unwrap().wait().unwrap();
    assert_eq!(f.cache_info().hits, hits + 1);
    assert!(std::sync::Arc::ptr_eq(&ran.entry, &entry));
}

// -- objects ----------------------------------------------------------------------

/// Defines `touch-<id>`: builds (once) object `id` of the running program's
/// session, a `DropCounter` on `drops`, counting builds on `builds`; returns
/// its input.
fn define_touch(
    object: &ColocatedObject,
    builds: &Arc<AtomicUsize>,
    drops: &Arc<AtomicUsize>,
) -> &'static str {
    let id = object.id();
    let (builds, drops) = (builds.clone(), drops.clone());
    let name: &'static str = Box::leak(format!("touch-{id}").into_boxed_str());
    define(name, move |ctx, inputs| {
        let (builds, drops) = (builds.clone(), drops.clone());
        host_object(ctx.session(), id, move || {
            builds.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(DropCounter(drops)))
        })
        .map_err(|_| colocated_core::Error::internal("the constructor failed"))?;
        Ok(inputs)
    });
    name
}

#[test]
fn an_object_is_built_once_per_host_and_destroyed_when_its_handle_goes() {
    let _serial = serial();
    let client = local_client(2);
    let x = i32_array(&client, &[1, 2], named(client.devices().to_vec(), "x"));
    let inputs = [x];
    let (builds, drops) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let object = ColocatedObject::new();
    let f = function(None);
    let site = Site::of(define_touch(&object, &builds, &drops));
    for _ in 0..3 {
        let ran = f
            .call(&client, &call_spec(&inputs), &inputs, &site, &[&object])
            .unwrap();
        if let Some(status) = ran.status {
            status.wait().unwrap();
        }
    }
    assert_eq!(builds.load(Ordering::SeqCst), 1, "built once, on first use");
    assert_eq!(host_objects(Some(colocated_core::SessionKey::LOCAL)), 1);
    drop(object);
    eventually("the object is destroyed", || {
        drops.load(Ordering::SeqCst) == 1
    });
    assert_eq!(host_objects(None), 0);
}

#[test]
fn a_constructors_error_is_kept_and_returned_to_every_call() {
    let _serial = serial();
    let session = colocated_core::SessionKey::LOCAL;
    let object = ColocatedObject::new();
    let tries = AtomicUsize::new(0);
    for _ in 0..2 {
        let built = host_object(session, object.id(), || {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(Arc::new("no such file"))
        });
        let Err(error) = built else {
            panic!("the constructor's failure was not kept")
        };
        assert_eq!(error.downcast_ref::<&str>(), Some(&"no such file"));
    }
    assert_eq!(
        tries.load(Ordering::SeqCst),
        1,
        "the failure is kept, not retried"
    );
    drop(object);
    eventually("the failure is forgotten with the object", || {
        host_objects(None) == 0
    });
}

// -- workers ------------------------------------------------------------------------

fn start_worker(token: &Token, devices: usize) -> Worker {
    let client = local_client(devices);
    common::start_worker(client, token, |_| {})
}

fn connect(workers: &[&Worker], token: &Token) -> Client {
    common::connect_workers(workers, token)
}

/// This test's turn (see [`serial`]), with the test functions defined, and
/// a client of two workers of two devices each (kept with it).
fn two_workers() -> (MutexGuard<'static, ()>, [Worker; 2], Client) {
    let turn = serial();
    define_functions();
    let token = Token::generate().unwrap();
    let workers = [start_worker(&token, 2), start_worker(&token, 2)];
    let client = connect(&[&workers[0], &workers[1]], &token);
    (turn, workers, client)
}

#[test]
fn discovery_on_workers_derives_global_specs_of_outputs_of_any_sharding() {
    let (_serial, _workers, client) = two_workers();
    let devices = client.devices().to_vec();
    let x = i32_array(&client, &[1, 2, 3, 4], named(devices.clone(), "x"));
    let inputs = [x.clone()];

    // An output with an input's sharding on each host: that input's global sharding.
    let ran = call(&client, &function(None), "add_one", &inputs).unwrap();
    assert!(ran.outputs[0].spec().matches(x.spec()));
    assert_eq!(
        i32_values(&ran.outputs[0].to_host_bytes().unwrap()),
        [2, 3, 4, 5]
    );

    // A sharding of the function's own on each host (its devices reversed):
    // the hosts' blocks stacked in host order.
    let ran = call(&client, &function(None), "reversed", &inputs).unwrap();
    let out = &ran.outputs[0];
    assert_eq!(out.shape(), [4]);
    let want = [&devices[1], &devices[0], &devices[3], &devices[2]];
    assert_eq!(out.sharding().devices().iter().collect::<Vec<_>>(), want);
    assert_eq!(i32_values(&out.to_host_bytes().unwrap()), [10, 20, 30, 40]);

    // No arguments, specialized with devices: each host's block of [0, 1].
    let ran = call(&client, &function(Some(devices.clone())), "iota", &[]).unwrap();
    assert_eq!(ran.outputs[0].sharding().devices(), devices.as_slice());
    assert_eq!(
        i32_values(&ran.outputs[0].to_host_bytes().unwrap()),
        [0, 1, 0, 1]
    );
    assert_eq!(parked_results(None), 0, "every parked result was taken");

    // One host fails after the other parked: nothing stays parked.
    let err = call(&client, &function(None), "fails_where_4", &inputs).map(|_| ());
    assert_error(err, ErrorCode::InvalidArgument, "not on this host");
    assert_eq!(
        parked_results(None),
        0,
        "the failed discovery's results were dropped"
    );
}

#[test]
fn objects_on_workers_go_with_their_handle_and_with_their_session() {
    let _serial = serial();
    let token = Token::generate().unwrap();
    let (a, b) = (start_worker(&token, 1), start_worker(&token, 1));
    let (builds, drops) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let call_on = |client: &Client, object: &ColocatedObject, name: &'static str| {
        let x = i32_array(client, &[1, 2], named(client.devices().to_vec(), "x"));
        let inputs = [x];
        let ran = function(None)
            .call(
                client,
                &call_spec(&inputs),
                &inputs,
                &Site::of(name),
                &[object],
            )
            .unwrap();
        if let Some(status) = ran.status {
            status.wait().unwrap();
        }
    };

    // Dropping the handle destroys the object on both workers.
    let client = connect(&[&a, &b], &token);
    let object = ColocatedObject::new();
    let name = define_touch(&object, &builds, &drops);
    call_on(&client, &object, name);
    call_on(&client, &object, name);
    assert_eq!(builds.load(Ordering::SeqCst), 2, "built once on each host");
    drop(object);
    eventually("both hosts destroyed the object", || {
        drops.load(Ordering::SeqCst) == 2
    });

    // An object no handle destroys (a call that is not a method's built it)
    // goes when its controller's session ends.
    let orphan = ColocatedObject::new();
    let name = define_touch(&orphan, &builds, &drops);
    let x = i32_array(&client, &[1, 2], named(client.devices().to_vec(), "x"));
    let inputs = [x];
    call(&client, &function(None), name, &inputs).unwrap();
    drop(inputs);
    assert_eq!(host_objects(None), 2);
    drop(client);
    eventually("ending the session destroyed its objects", || {
        drops.load(Ordering::SeqCst) == 4
    });
    assert_eq!(host_objects(None), 0);
}

#[test]
fn memory_kinds_are_part_of_a_calls_spec_and_kept_through_calls_on_workers() {
    let (_serial, _workers, client) = two_workers();
    let devices = client.devices().to_vec();
    let x = i32_array(&client, &[1, 2, 3, 4], named(devices.clone(), "x"));
    let pinned_sharding = x
        .sharding()
        .with_memory_kind(Some(MemoryKind::PinnedHost))
        .unwrap();
    let y = x
        .put_to(&client, pinned_sharding.clone(), None, None)
        .unwrap();
    assert_eq!(y.memory_kind(), MemoryKind::PinnedHost);

    // The same layout in another memory is another input spec, and an
    // output made with the input's spec stays in its memory.
    let f = function(None);
    let ran = call(&client, &f, "add_one", std::slice::from_ref(&x)).unwrap();
    assert_eq!(ran.outputs[0].memory_kind(), MemoryKind::Device);
    let ran = call(&client, &f, "add_one", std::slice::from_ref(&y)).unwrap();
    let info = f.cache_info();
    assert_eq!((info.hits, info.misses), (0, 2), "a miss for pinned memory");
    let out = &ran.outputs[0];
    assert_eq!(ran.entry.outputs().origins, vec![OutputOrigin::Input(0)]);
    assert!(out.sharding() == &pinned_sharding, "{:?}", out.sharding());
    assert_eq!(out.memory_kind(), MemoryKind::PinnedHost);
    for buffer in out.buffers() {
        assert_eq!(buffer.memory_space().kind(), MemoryKind::PinnedHost);
    }
    assert_eq!(i32_values(&out.to_host_bytes().unwrap()), [2, 3, 4, 5]);

    // Discovered on the workers: a function that moves its input to pinned
    // memory gives an output whose sharding says so.
    let ran = call(&client, &function(None), "pinned", std::slice::from_ref(&x)).unwrap();
    assert_eq!(ran.entry.outputs().origins, vec![OutputOrigin::New]);
    assert!(ran.outputs[0].sharding() == &pinned_sharding);
    assert_eq!(ran.outputs[0].memory_kind(), MemoryKind::PinnedHost);

    // Declared: outputs in pinned memory are what the workers must make.
    let declared = ArraySpec::new(vec![4], DType::I32, pinned_sharding.clone()).unwrap();
    let site = Site::declaring("pinned", vec![declared]);
    let ran = call_at(&client, &function(None), &site, std::slice::from_ref(&x)).unwrap();
    ran.status.unwrap().wait().unwrap();
    assert_eq!(ran.outputs[0].memory_kind(), MemoryKind::PinnedHost);
    assert_eq!(
        i32_values(&ran.outputs[0].to_host_bytes().unwrap()),
        [1, 2, 3, 4]
    );
    // ... and an output in another memory than declared is refused.
    let device_memory = ArraySpec::new(vec![4], DType::I32, x.sharding().clone()).unwrap();
    let site = Site::declaring("pinned", vec![device_memory]);
    let ran = call_at(&client, &function(None), &site, std::slice::from_ref(&x)).unwrap();
    let err = ran.status.unwrap().wait();
    assert_error(err, ErrorCode::InvalidArgument, "memory");
}
