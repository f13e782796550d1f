//! The context a running program sees: its program, inputs, output shards,
//! host callbacks, and the outputs it sets.

use std::sync::Arc;

use super::SessionKey;
use crate::array::Array;
use crate::buffer::Buffer;
use crate::client::Client;
use crate::device::{Device, MemoryKind, MemorySpace};
use crate::dispatch::Stream;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::Event;
use crate::host_callback::LoadedHostCallback;
use crate::sharding::Sharding;

/// One output shard a host must produce: which output, and its dtype, dims,
/// device and memory.
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
    /// The device's memory the shard is in (that of the output sharding's
    /// memory kind).
    pub memory: MemorySpace,
}

impl OutputShard {
    /// Shard `dims` of output `output`, at position `pos` of `sharding`.
    pub(crate) fn of(
        output: usize,
        dtype: DType,
        dims: Vec<i64>,
        sharding: &Sharding,
        pos: usize,
    ) -> Result<OutputShard> {
        OutputShard::on(
            output,
            dtype,
            dims,
            sharding.devices()[pos].clone(),
            sharding.memory_kind(),
        )
    }

    /// Shard `dims` of output `output` on `device`, in its memory of `kind`
    /// (`None`: its default memory).
    pub(crate) fn on(
        output: usize,
        dtype: DType,
        dims: Vec<i64>,
        device: Device,
        kind: Option<MemoryKind>,
    ) -> Result<OutputShard> {
        let memory = match kind {
            Some(kind) => device.memory_space_by_kind(kind.name())?.clone(),
            None => device.default_memory_space().clone(),
        };
        Ok(OutputShard {
            output,
            dtype,
            dims,
            device,
            memory,
        })
    }
}

/// What a running program sees on its host: its input shards, the output shards it
/// must produce, and the host callbacks it may call.
pub struct ExecutionContext<'a> {
    pub(crate) client: &'a Client,
    pub(crate) program: &'a crate::program::Program,
    /// What runs: its language compares result structures.
    pub(crate) loaded: &'a dyn super::LoadedProgram,
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
    /// payload (see [`native_payload`](super::native_payload)); empty for
    /// other languages.
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

    /// The stream of the calls that the program's own code makes (host code
    /// that calls colocated functions or runs executables): one of its own,
    /// never the stream the program runs on, so that a nested call never
    /// waits for the program that makes it. Code that runs on this thread
    /// while the program runs has it as its default stream without asking; a
    /// language whose code runs on another thread meanwhile (Node's event
    /// loop, while this thread waits for its answer) makes its calls on it.
    /// Every SDK thus lets host code call colocated functions, alike.
    pub fn nested_stream(&self) -> Stream {
        self.client.nested_stream()
    }

    /// The session the program runs for: the controller's session on a
    /// worker, [`SessionKey::LOCAL`] for the process's own client. What the
    /// program leaves behind for later programs belongs to it (see
    /// [`LanguageExecutor::session_ended`](super::LanguageExecutor::session_ended)).
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
        if buffer.memory_space().kind() != spec.memory.kind() {
            return Err(Error::invalid_argument(format!(
                "output shard {index} must be in {} memory, got one in {} memory",
                spec.memory.kind().name(),
                buffer.memory_space().kind().name()
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
    /// `structure` is the language's description of the result's tree
    /// (opaque to core). While [`discovering`](Self::discovering), the
    /// outputs may be any arrays over the program's devices of this host, and
    /// `structure` is required: the host keeps the arrays for the
    /// controller, which learns their specs from them (and checks that
    /// every host's structure is the same). Otherwise a given `structure`
    /// must be the program's
    /// [`output_structure`](crate::Program::output_structure), where it has
    /// one (by [`LoadedProgram::same_structure`](super::LoadedProgram::same_structure)):
    /// `invalid_argument` when it is not. A language that checks its
    /// result's structure itself, more cheaply than it would encode it,
    /// gives `None`.
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
        if let Some(structure) = &structure {
            let expected = &self.program.output_structure;
            if !expected.is_empty() && !self.loaded.same_structure(structure, expected) {
                return Err(Error::invalid_argument(format!(
                    "the function returned a result of another structure than its program's \
                     (its first call's result, or its declared output specs): {} but {} was expected",
                    shown(structure),
                    shown(expected)
                )));
            }
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

/// A result structure for a message: its text, where it is short text (a
/// JSON skeleton), else its size.
fn shown(structure: &[u8]) -> String {
    match std::str::from_utf8(structure) {
        Ok(text) if text.len() <= 200 => text.to_string(),
        _ => format!("{} bytes", structure.len()),
    }
}
