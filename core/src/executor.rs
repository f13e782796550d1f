//! What runs programs on a host: language executors (one per program language;
//! `native` is built in, SDKs add `python` and `node`), the registry of native
//! functions, and the context a running program sees.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::array::Array;
use crate::buffer::Buffer;
use crate::client::Client;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::Event;
use crate::host_callback::LoadedHostCallback;

/// A native function: reads its inputs from the context and sets every output.
pub type NativeFn = dyn Fn(&mut ExecutionContext<'_>) -> Result<()> + Send + Sync;

/// Runs the programs of one language on a host.
///
/// `load` runs once per host at compile (and load) time: it validates the payload
/// and prepares what runs (resolves a native name, deserializes code). Errors there
/// are the caller's misuse (`invalid_argument`, `not_found`, …).
pub trait LanguageExecutor: Send + Sync + 'static {
    /// Prepares `program` for this host.
    fn load(&self, program: &crate::program::Program) -> Result<Arc<dyn LoadedProgram>>;

    /// A session of a worker this process serves ended: its controller closed
    /// it, it timed out (the controller is gone), or the worker stopped. Free
    /// everything the session's programs left behind — what they keyed by
    /// [`ExecutionContext::session`] (objects, parked results, caches).
    ///
    /// Called once per ended session for every registered executor, after
    /// every execution of the session has finished (and none starts any
    /// more), on a thread of its own: never on a network thread nor under the
    /// worker's locks, so it may block (to take Python's GIL, say) and run
    /// user code such as destructors. Never called for
    /// [`SessionKey::LOCAL`]. The default does nothing.
    fn session_ended(&self, session: SessionKey) {
        let _ = session;
    }
}

/// The session a program runs for: on a worker, each controller's session
/// has its own key, never reused in the process; programs that a process runs
/// for its own client run in [`SessionKey::LOCAL`]. Language executors key
/// what programs leave behind by it and free it in
/// [`LanguageExecutor::session_ended`]. Opaque: it says nothing about the
/// session's id on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(u64);

impl SessionKey {
    /// The implicit session of programs a process runs for its own client
    /// (the controller's own host); it never ends.
    pub const LOCAL: SessionKey = SessionKey(0);

    /// A key no other session of this process has had.
    pub(crate) fn fresh() -> SessionKey {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SessionKey(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The key as a number (0 for [`SessionKey::LOCAL`]), e.g. for an SDK to
    /// key its stores by.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// True for [`SessionKey::LOCAL`].
    pub fn is_local(self) -> bool {
        self == SessionKey::LOCAL
    }
}

impl std::fmt::Display for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "session {}", self.0)
    }
}

thread_local! {
    /// While a worker loads a program a controller sent: the controller's id
    /// of each of the host's devices -> the host's own id.
    static CONTROLLER_IDS: std::cell::RefCell<Option<HashMap<u32, u32>>> =
        const { std::cell::RefCell::new(None) };
}

/// Makes a controller's device ids current on this thread while a worker
/// loads its program; restores the outer ones when dropped.
pub(crate) struct ControllerIds(Option<HashMap<u32, u32>>);

impl ControllerIds {
    /// `ids`: controller id -> this host's id.
    pub(crate) fn enter(ids: HashMap<u32, u32>) -> ControllerIds {
        ControllerIds(CONTROLLER_IDS.with(|c| c.replace(Some(ids))))
    }
}

impl Drop for ControllerIds {
    fn drop(&mut self) {
        let outer = self.0.take();
        CONTROLLER_IDS.with(|c| *c.borrow_mut() = outer);
    }
}

/// This host's id of the device the controller calls `id`, for a language
/// executor that meets device ids while it loads a program (Python's
/// unpickling of captured devices): `Ok(None)` when this thread is not
/// loading a program a controller sent with its ids (ids are this process's
/// own), `not_found` for a device of the controller that is not on this host.
pub fn controller_device_id(id: u32) -> Result<Option<u32>> {
    CONTROLLER_IDS.with(|c| match &*c.borrow() {
        None => Ok(None),
        Some(ids) if ids.is_empty() => Ok(None),
        Some(ids) => ids.get(&id).copied().map(Some).ok_or_else(|| {
            let mut known: Vec<u32> = ids.keys().copied().collect();
            known.sort_unstable();
            Error::not_found(format!(
                "device {id} of the controller is not on this host (its devices are {known:?} there)"
            ))
        }),
    })
}

/// Gives the memory that the C allocator (glibc's `malloc`) holds free back
/// to the system (`malloc_trim(0)`); elsewhere a no-op. A worker calls it
/// after freeing a session; a language executor whose runtime frees through
/// `malloc` may call it after freeing much at once.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointers and is thread-safe; it only
    // returns free pages of the heap to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A worker session as the executables loaded in it see it: its key, and
/// whether it ended (then its programs that have not started yet fail
/// instead of running).
pub(crate) struct SessionScope {
    key: SessionKey,
    ended: AtomicBool,
}

impl SessionScope {
    /// A new session's scope, with a fresh key.
    pub(crate) fn new() -> SessionScope {
        SessionScope {
            key: SessionKey::fresh(),
            ended: AtomicBool::new(false),
        }
    }

    pub(crate) fn key(&self) -> SessionKey {
        self.key
    }

    /// Marks the session ended: its programs that have not started fail.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }
}

/// A program prepared by a [`LanguageExecutor`], run once per execution on the
/// host's executor threads (several at once, for different streams).
pub trait LoadedProgram: Send + Sync + 'static {
    /// Runs the program: reads the context's inputs and sets every output shard.
    fn run(&self, ctx: &mut ExecutionContext<'_>) -> Result<()>;

    /// True when the program runs best on the thread that waits for it (it needs
    /// something that thread holds, such as Python's GIL): executor threads then
    /// leave a stream's executions to its waiter while the stream is being fed,
    /// and take them only after a short pause in submissions.
    fn waiter_first(&self) -> bool {
        false
    }

    /// True when `run` only hands the work to a device that orders it (a PJRT
    /// plugin's queue) and never blocks: the submitting thread runs it at
    /// once when its stream is idle and its inputs are there (as JAX
    /// dispatches), an input still being computed on that device does not
    /// hold it back, and the outputs `run` sets may still be pending: the
    /// execution completes when they are ready.
    fn enqueues(&self) -> bool {
        false
    }

    /// The program in a form its language loads again without compiling it
    /// (an XLA program's plugin executable), which
    /// [`LoadedExecutable::serialize`](crate::LoadedExecutable::serialize)
    /// stores as the payload; `None` (the default): the payload as given.
    fn artifact(&self) -> Option<Vec<u8>> {
        None
    }
}

impl<F> LoadedProgram for F
where
    F: Fn(&mut ExecutionContext<'_>) -> Result<()> + Send + Sync + 'static,
{
    fn run(&self, ctx: &mut ExecutionContext<'_>) -> Result<()> {
        self(ctx)
    }
}

/// The built-in `native` executor: the payload names a function of the host's
/// registry.
struct NativeExecutor(Arc<NativeRegistry>);

struct NativeProgram {
    function: Arc<NativeFn>,
    /// What follows the name in the payload (see [`native_payload`]).
    data: Option<Arc<[u8]>>,
}

impl LoadedProgram for NativeProgram {
    fn run(&self, ctx: &mut ExecutionContext<'_>) -> Result<()> {
        ctx.native_data = self.data.clone();
        let ran = (self.function)(ctx);
        ctx.native_data = None;
        ran
    }
}

impl LanguageExecutor for NativeExecutor {
    fn load(&self, program: &crate::program::Program) -> Result<Arc<dyn LoadedProgram>> {
        let (name, data) = split_native_payload(&program.payload);
        let name = std::str::from_utf8(name).map_err(|_| {
            Error::invalid_argument("a native program's payload must be a UTF-8 function name")
        })?;
        Ok(Arc::new(NativeProgram {
            function: self.0.resolve(name)?,
            data: (!data.is_empty()).then(|| data.into()),
        }))
    }
}

/// The payload of a `native` program: the function's name, and the data the
/// function reads with [`ExecutionContext::native_data`] (e.g. the id of the
/// colocated object it is a method of), after a NUL byte when not empty.
/// `invalid_argument` for an empty name or one with a NUL byte (no native
/// function has such a name).
pub fn native_payload(name: &str, data: &[u8]) -> Result<Vec<u8>> {
    check_native_name(name)?;
    let mut payload = name.as_bytes().to_vec();
    if !data.is_empty() {
        payload.push(0);
        payload.extend_from_slice(data);
    }
    Ok(payload)
}

/// A native function's name is not empty and has no NUL byte (which ends the
/// name in a program's payload).
fn check_native_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid_argument("a native function needs a name"));
    }
    if name.contains('\0') {
        return Err(Error::invalid_argument(
            "a native function's name cannot contain a NUL byte (it ends the name in a program's payload)",
        ));
    }
    Ok(())
}

/// A `native` payload's (name, data): split at the first NUL byte.
fn split_native_payload(payload: &[u8]) -> (&[u8], &[u8]) {
    match payload.iter().position(|b| *b == 0) {
        Some(at) => (&payload[..at], &payload[at + 1..]),
        None => (payload, &[]),
    }
}

/// The local host's languages: its executors by language tag, and the
/// registry of native functions the built-in `native` executor resolves.
pub(crate) struct Languages {
    by_language: RwLock<HashMap<String, Arc<dyn LanguageExecutor>>>,
    natives: Arc<NativeRegistry>,
}

impl Languages {
    /// The client's languages (made on first use, with the built-in
    /// `native` executor).
    pub fn of(client: &Client) -> &Languages {
        let slot = client
            .0
            .local
            .languages
            .get_or_init(|| Box::new(Languages::new()));
        match slot.downcast_ref::<Languages>() {
            Some(languages) => languages,
            // Only this function fills the slot.
            None => unreachable!("a client's language slot holds its languages"),
        }
    }

    fn new() -> Languages {
        let natives = Arc::new(NativeRegistry::default());
        let mut by_language: HashMap<String, Arc<dyn LanguageExecutor>> = HashMap::new();
        by_language.insert(
            crate::program::LANGUAGE_NATIVE.to_string(),
            Arc::new(NativeExecutor(natives.clone())),
        );
        Languages {
            by_language: RwLock::new(by_language),
            natives,
        }
    }
    pub fn register(&self, language: &str, executor: Arc<dyn LanguageExecutor>) -> Result<()> {
        if language.is_empty() {
            return Err(Error::invalid_argument(
                "a language executor needs a language tag",
            ));
        }
        if language == crate::program::LANGUAGE_COLOCATED {
            return Err(Error::already_exists(
                "the 'colocated' language is built in",
            ));
        }
        let mut map = self.by_language.write().unwrap_or_else(|e| e.into_inner());
        if map.contains_key(language) {
            return Err(Error::already_exists(format!(
                "an executor for '{language}' programs is already registered"
            )));
        }
        map.insert(language.to_string(), executor);
        Ok(())
    }

    pub fn get(&self, language: &str) -> Option<Arc<dyn LanguageExecutor>> {
        self.by_language
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(language)
            .cloned()
    }

    /// The languages, sorted.
    pub fn languages(&self) -> Vec<String> {
        let mut languages: Vec<String> = self
            .by_language
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .chain([crate::program::LANGUAGE_COLOCATED.to_string()])
            .collect();
        languages.sort();
        languages
    }

    /// Every registered executor (built-in ones included).
    pub fn all(&self) -> Vec<Arc<dyn LanguageExecutor>> {
        self.by_language
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// A host's registry of native functions, resolved by name at compile time.
#[derive(Default)]
pub(crate) struct NativeRegistry {
    functions: RwLock<HashMap<String, Arc<NativeFn>>>,
}

impl NativeRegistry {
    pub fn register(&self, name: &str, func: Arc<NativeFn>) -> Result<()> {
        check_native_name(name)?;
        let mut map = self.functions.write().unwrap_or_else(|e| e.into_inner());
        if map.contains_key(name) {
            return Err(Error::already_exists(format!(
                "native function '{name}' is already registered"
            )));
        }
        map.insert(name.to_string(), func);
        Ok(())
    }

    pub fn resolve(&self, name: &str) -> Result<Arc<NativeFn>> {
        let map = self.functions.read().unwrap_or_else(|e| e.into_inner());
        map.get(name).cloned().ok_or_else(|| {
            let mut known: Vec<&String> = map.keys().collect();
            known.sort();
            Error::not_found(format!(
                "no native function '{name}' on this host (registered: {known:?})"
            ))
        })
    }
}

impl Client {
    /// Adds `func` to the local host's registry of native functions under `name`.
    /// Fails with `already_exists` if the name is taken.
    pub fn register_native_function(
        &self,
        name: &str,
        func: impl Fn(&mut ExecutionContext<'_>) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        Languages::of(self).natives.register(name, Arc::new(func))
    }

    /// Lets the local host run programs of `language` (an SDK registers `python`).
    /// Fails with `already_exists` if the language has an executor.
    pub fn register_executor(&self, language: &str, executor: impl LanguageExecutor) -> Result<()> {
        Languages::of(self).register(language, Arc::new(executor))
    }

    /// The program languages host `host` runs (sorted), e.g. `["native"]`.
    pub fn languages(&self, host: usize) -> Result<Vec<String>> {
        if host >= self.hosts().len() {
            return Err(Error::invalid_argument(format!(
                "host {host} is out of range ({} hosts)",
                self.hosts().len()
            )));
        }
        Ok(match self.remote(host) {
            Some(remote) => remote.session.host().languages.clone(),
            None => {
                let mut languages = Languages::of(self).languages();
                // A host with a PJRT plugin's devices runs XLA programs (its
                // executor is registered when the first one is compiled).
                let xla = crate::program::LANGUAGE_XLA;
                let has_plugin = self.0.hosts[host]
                    .device_ids()
                    .iter()
                    .any(|id| self.lookup_device(*id).is_ok_and(|d| d.0.pjrt.is_some()));
                if has_plugin && !languages.iter().any(|l| l == xla) {
                    languages.push(xla.to_string());
                    languages.sort();
                }
                languages
            }
        })
    }
}

/// One output shard a host must produce: which output, and its dtype, dims, device.
#[derive(Clone, Debug)]
pub struct OutputShard {
    /// Index of the output in the program's results.
    pub output: usize,
    /// Element type.
    pub dtype: DType,
    /// Shard dimensions.
    pub dims: Vec<i64>,
    /// The device the shard lives on.
    pub device: Device,
}

/// What a running program sees on its host: its input shards, the output shards it
/// must produce, and the host callbacks it may call.
pub struct ExecutionContext<'a> {
    pub(crate) client: &'a Client,
    pub(crate) program: &'a crate::program::Program,
    /// The index of the host it runs on, in its client's hosts.
    pub(crate) host: usize,
    pub(crate) host_input_specs: &'a [crate::spec::ArraySpec],
    pub(crate) host_output_specs: &'a [crate::spec::ArraySpec],
    pub(crate) inputs: &'a [Buffer],
    pub(crate) input_counts: &'a [usize],
    pub(crate) output_shards: &'a [OutputShard],
    pub(crate) outputs: smallvec::SmallVec<[Produced; 2]>,
    /// The data an enqueuing program placed, by output shard: they go into
    /// the outputs once the program has run without an error.
    pub(crate) placed: smallvec::SmallVec<[(usize, Arc<crate::buffer::Storage>); 2]>,
    /// When placed outputs' data are made, where that is later than the run.
    pub(crate) placed_pending: smallvec::SmallVec<[Event; 1]>,
    pub(crate) callbacks: &'a [LoadedHostCallback],
    pub(crate) session: SessionKey,
    /// Set while a colocated discovery run takes the program's outputs.
    pub(crate) discovery: Option<Arc<dyn DiscoverySink>>,
    /// Set while a native function with data runs.
    pub(crate) native_data: Option<Arc<[u8]>>,
    /// Whether `set_host_outputs` ran.
    pub(crate) host_outputs_set: bool,
}

/// What a program made for one of its output shards.
pub(crate) enum Produced {
    /// Nothing yet.
    Unset,
    /// A buffer of the program's, whose data become the output's.
    Buffer(Buffer),
    /// Data placed in the output itself ([`ExecutionContext::place_output`]).
    Placed,
}

/// Takes the outputs of a discovery run (see
/// [`ExecutionContext::set_host_outputs`]): the colocated protocol parks them
/// on the host and reports them to the controller.
pub(crate) trait DiscoverySink: Send + Sync {
    fn discovered(
        &self,
        ctx: &ExecutionContext<'_>,
        outputs: Vec<Array>,
        structure: Vec<u8>,
    ) -> Result<()>;
}

impl<'a> ExecutionContext<'a> {
    /// The program being run (its specs give the global arrays the shards belong
    /// to).
    pub fn program(&self) -> &'a crate::program::Program {
        self.program
    }

    /// The input specs restricted to this host's shards (the program's own
    /// when the host holds every shard): [`inputs`](Self::inputs) assemble
    /// into arrays of these, argument by argument.
    pub fn host_input_specs(&self) -> &'a [crate::spec::ArraySpec] {
        self.host_input_specs
    }

    /// The output specs restricted to this host's shards: the program makes
    /// [`output_shards`](Self::output_shards) of arrays of these.
    pub fn host_output_specs(&self) -> &'a [crate::spec::ArraySpec] {
        self.host_output_specs
    }

    /// A `native` program's data: what follows its function's name in the
    /// payload (see [`native_payload`]); empty for other languages.
    pub fn native_data(&self) -> &[u8] {
        self.native_data.as_deref().unwrap_or_default()
    }

    /// The program's devices on this host, in the program's order: where a
    /// program without inputs, or a discovery run, puts its outputs.
    pub fn devices(&self) -> Vec<Device> {
        self.program
            .devices
            .iter()
            .filter(|d| d.host_index() == self.host)
            .cloned()
            .collect()
    }

    /// The client (to create output buffers).
    pub fn client(&self) -> &'a Client {
        self.client
    }

    /// The session the program runs for: the controller's session on a
    /// worker, [`SessionKey::LOCAL`] for the process's own client. What the
    /// program leaves behind for later programs belongs to it (see
    /// [`LanguageExecutor::session_ended`]).
    pub fn session(&self) -> SessionKey {
        self.session
    }
    /// Input shards on this host, argument-major: argument 0's shards in its
    /// sharding's device order, then argument 1's, …
    pub fn inputs(&self) -> &'a [Buffer] {
        self.inputs
    }
    /// For each argument, how many of [`ExecutionContext::inputs`] belong to it.
    pub fn input_shard_counts(&self) -> &'a [usize] {
        self.input_counts
    }
    /// The output shards to set, in the order of [`ExecutionContext::set_output`].
    pub fn output_shards(&self) -> &'a [OutputShard] {
        self.output_shards
    }
    /// Sets output shard `index`; `invalid_argument` if out of range, already set, or
    /// if the buffer's dtype, dims or device differ from the shard's.
    pub fn set_output(&mut self, index: usize, buffer: Buffer) -> Result<()> {
        let spec = self.output_shards.get(index).ok_or_else(|| {
            Error::invalid_argument(format!(
                "output shard {index} is out of range ({} shards)",
                self.output_shards.len()
            ))
        })?;
        if buffer.dtype() != spec.dtype
            || buffer.dims() != spec.dims.as_slice()
            || buffer.device() != &spec.device
        {
            return Err(Error::invalid_argument(format!(
                "output shard {index} must be {}{:?} on {}, got {}{:?} on {}",
                spec.dtype.name(),
                spec.dims,
                spec.device,
                buffer.dtype().name(),
                buffer.dims(),
                buffer.device()
            )));
        }
        buffer.check_live()?;
        let slot = &mut self.outputs[index];
        if !matches!(slot, Produced::Unset) {
            return Err(Error::invalid_argument(format!(
                "output shard {index} was already set"
            )));
        }
        *slot = Produced::Buffer(buffer);
        Ok(())
    }

    /// Places `data` in output shard `index` itself (once the program's run
    /// returns without an error), for an enqueuing program whose device
    /// makes them (ready or not: `made`, when given, completes when they
    /// are): no buffer of the program's in between. The caller has checked
    /// that `data` are of the shard's dtype, dims and device.
    pub(crate) fn place_output(
        &mut self,
        index: usize,
        data: Arc<crate::buffer::Storage>,
        made: Option<Event>,
    ) -> Result<()> {
        let Some(slot) = self.outputs.get_mut(index) else {
            return Err(Error::internal(format!(
                "output shard {index} is out of range ({} shards)",
                self.output_shards.len()
            )));
        };
        if !matches!(slot, Produced::Unset) {
            return Err(Error::internal(format!(
                "output shard {index} was already set"
            )));
        }
        self.placed.push((index, data));
        *slot = Produced::Placed;
        self.placed_pending.extend(made);
        Ok(())
    }

    /// Marks the outputs placed so far made when `made` completes (one event
    /// for a device's outputs).
    pub(crate) fn placed_made_when(&mut self, made: Event) {
        self.placed_pending.push(made);
    }
    /// The host callbacks the executable was compiled with, by index (on a
    /// worker, each call of one travels to the controller).
    pub fn host_callbacks(&self) -> &'a [LoadedHostCallback] {
        self.callbacks
    }
    /// Number of host callbacks the executable was compiled with.
    pub fn num_host_callbacks(&self) -> usize {
        self.callbacks.len()
    }
    /// This host's input arrays: [`inputs`](Self::inputs) assembled argument
    /// by argument into arrays of [`host_input_specs`](Self::host_input_specs).
    /// `unimplemented` when a host's shards of an argument do not make one
    /// array of its own.
    pub fn host_input_arrays(&self) -> Result<Vec<Array>> {
        let mut at = 0;
        let mut arrays = Vec::with_capacity(self.host_input_specs.len());
        for (spec, &count) in self.host_input_specs.iter().zip(self.input_counts) {
            if count != spec.sharding.devices().len() {
                return Err(Error::unimplemented(
                    "this host's shards of an input are not one block of the array",
                ));
            }
            let shards = self.inputs.get(at..at + count).ok_or_else(|| {
                Error::internal("the host has fewer input shards than its specs say")
            })?;
            at += count;
            arrays.push(Array::assemble(spec.clone(), shards.to_vec())?);
        }
        Ok(arrays)
    }

    /// True while the program runs to discover its outputs (the first call of
    /// a colocated function without declared output specs): then
    /// [`set_host_outputs`](Self::set_host_outputs) needs the structure of
    /// the outputs, and the outputs have no specs to match.
    pub fn discovering(&self) -> bool {
        self.discovery.is_some()
    }

    /// Sets every output shard from this host's output arrays, one per
    /// [`host_output_specs`](Self::host_output_specs), each checked against
    /// its spec (`invalid_argument` with the difference).
    ///
    /// While [`discovering`](Self::discovering), the outputs may be any
    /// arrays over the program's devices of this host, and `structure` (the
    /// language's description of the result's tree, opaque to core, equal on
    /// every host of the call) is required: the host keeps the arrays for
    /// the controller, which learns their specs from them.
    pub fn set_host_outputs(
        &mut self,
        outputs: Vec<Array>,
        structure: Option<Vec<u8>>,
    ) -> Result<()> {
        if self.host_outputs_set {
            return Err(Error::invalid_argument(
                "the program's outputs were already set (set_host_outputs runs once per call)",
            ));
        }
        self.host_outputs_set = true;
        if let Some(sink) = self.discovery.clone() {
            let structure = structure.ok_or_else(|| {
                Error::internal("a discovery run must give the structure of its outputs")
            })?;
            return sink.discovered(self, outputs, structure);
        }
        let specs = self.host_output_specs;
        if outputs.len() != specs.len() {
            return Err(Error::invalid_argument(format!(
                "the function returned {} arrays but {} were expected",
                outputs.len(),
                specs.len()
            )));
        }
        for (o, (got, want)) in outputs.iter().zip(specs).enumerate() {
            if !got.spec().matches(want) {
                return Err(Error::invalid_argument(format!(
                    "output {o} is {} on {:?} but {} on {:?} was expected (outputs must use the inputs' devices)",
                    got.spec().describe(),
                    got.sharding(),
                    want.describe(),
                    want.sharding
                )));
            }
        }
        for k in 0..self.output_shards.len() {
            let shard = &self.output_shards[k];
            let array = &outputs[shard.output];
            let pos = array
                .sharding()
                .devices()
                .iter()
                .position(|d| d == &shard.device)
                .ok_or_else(|| {
                    Error::internal(format!(
                        "output {} has no shard on {}",
                        shard.output, shard.device
                    ))
                })?;
            let buffer = array.buffers()[pos].clone();
            self.set_output(k, buffer)?;
        }
        Ok(())
    }

    /// Calls host callback `index` with `input` and returns its answer.
    pub fn call_host_callback(&self, index: usize, input: &[u8]) -> Result<Vec<u8>> {
        let cb = self.callbacks.get(index).ok_or_else(|| {
            Error::invalid_argument(format!(
                "host callback {index} is out of range (the executable has {})",
                self.callbacks.len()
            ))
        })?;
        cb.call(input)
    }
}
