//! Objects of colocated classes: the host's stores of the real objects (one
//! per session, built lazily and once), and the controller's handle that
//! destroys an object on every host it ran on.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;

use prost::Message;

use super::pb;
use crate::client::Client;
use crate::compiler::CompileOptions;
use crate::device::Device;
use crate::error::Result;
use crate::executable::{ExecuteOptions, LoadedExecutable};
use crate::executor::SessionKey;
use crate::future::Event;
use crate::languages::colocated::forget;
use crate::program::{Program, LANGUAGE_COLOCATED};

/// The controller's handle of one object of a colocated class. Calls on the
/// object build it on their hosts (lazily, see [`host_object`](crate::host_object)); dropping the
/// handle destroys it on every host it ran on, after the calls already made
/// on it.
///
/// Made with [`ColocatedObject::new`]; a call records itself with
/// [`ColocatedFunction::call`](super::ColocatedFunction::call)'s `object`.
pub struct ColocatedObject {
    id: u64,
    state: Mutex<ObjectState>,
}

#[derive(Default)]
struct ObjectState {
    /// Status of calls that may still be running.
    pending: Vec<Event>,
    /// The program that destroys the object on each worker host (by client
    /// and host index) it ran on, compiled before its first call there.
    forgets: HashMap<(u64, usize), LoadedExecutable>,
}

impl std::fmt::Debug for ColocatedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ColocatedObject({})", self.id)
    }
}

impl Default for ColocatedObject {
    fn default() -> Self {
        Self::new()
    }
}

impl ColocatedObject {
    /// A new object, with an id no other controller of a shared worker picks.
    pub fn new() -> ColocatedObject {
        ColocatedObject {
            id: super::random_key(),
            state: Mutex::new(ObjectState::default()),
        }
    }

    /// The object's id (what the language's program passes to
    /// [`host_object`](crate::host_object)).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// A handle of the existing object `id`, for an SDK that must make its
    /// handle anew (in a forked child, which cannot use its parent's).
    /// Dropping it destroys the object as [`new`](Self::new)'s does.
    pub fn with_id(id: u64) -> ColocatedObject {
        ColocatedObject {
            id,
            state: Mutex::new(ObjectState::default()),
        }
    }

    /// A call on the object over `devices` is about to run: on the first call
    /// on a worker host (of `client`), compiles the program that will
    /// destroy the object there, so that dropping the handle only submits
    /// it (compiled again on a later call if the worker was unreachable).
    pub(crate) fn will_run(&self, client: &Client, devices: &[Device]) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for device in devices {
            let host = (device.client_id(), device.host_index());
            if !client.is_remote(host.1) || state.forgets.contains_key(&host) {
                continue;
            }
            let on_host: Vec<Device> = devices
                .iter()
                .filter(|d| d.host_index() == host.1)
                .cloned()
                .collect();
            match compile_op(
                client,
                "destroy colocated object",
                pb::op::Op::ForgetObject(self.id),
                on_host,
            ) {
                Ok(forget) => {
                    state.forgets.insert(host, forget);
                }
                Err(e) => {
                    tracing::debug!(
                        object = self.id,
                        "cannot prepare the object's destruction on a worker: {e}"
                    );
                }
            }
        }
    }

    /// A call on the object was submitted; `status` (`None`: it finished)
    /// is ready when it has run.
    pub(crate) fn running(&self, status: Option<&Event>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.pending.retain(|e| !e.is_ready());
        if let Some(status) = status {
            if !status.is_ready() {
                state.pending.push(status.clone());
            }
        }
    }
}

impl Drop for ColocatedObject {
    fn drop(&mut self) {
        let id = self.id;
        let state = std::mem::take(self.state.get_mut().unwrap_or_else(|e| e.into_inner()));
        let pending: Vec<Event> = state
            .pending
            .into_iter()
            .filter(|e| !e.is_ready())
            .collect();
        let programs: Vec<LoadedExecutable> = state.forgets.into_values().collect();
        if !programs.is_empty() {
            if pending.is_empty() {
                // In this thread's program order: its later calls there see
                // the object gone, as on the local host.
                run_forgets(id, &programs);
            } else {
                destroy_later(id, pending.clone(), programs);
            }
        }
        // The local host built it for this process's own client.
        if pending.is_empty() {
            forget(SessionKey::LOCAL, id);
        } else {
            Event::join(&pending).when_ready(move |_| forget(SessionKey::LOCAL, id));
        }
    }
}

/// Compiles a program of the `colocated` language running `op` on `devices`.
pub(crate) fn compile_op(
    client: &Client,
    name: &str,
    op: pb::op::Op,
    devices: Vec<Device>,
) -> Result<LoadedExecutable> {
    let program = Program {
        name: name.to_string(),
        language: LANGUAGE_COLOCATED.to_string(),
        payload: pb::Op { op: Some(op) }.encode_to_vec(),
        input_specs: Vec::new(),
        output_specs: Vec::new(),
        devices,
        output_structure: Vec::new(),
    };
    client.compile(program, CompileOptions::default())
}

fn run_forgets(id: u64, programs: &[LoadedExecutable]) {
    for program in programs {
        if let Err(e) = program.execute(&[], &ExecuteOptions::default()) {
            // A lost worker has freed everything already.
            tracing::debug!(object = id, "cannot destroy the object on a worker: {e}");
        }
    }
}

type Job = (u64, Vec<Event>, Vec<LoadedExecutable>);

/// The thread that destroys objects on workers once their calls are done
/// (started on first use, again in a forked child): waiting, and submitting
/// over the network, are not for a finalizer or a completion callback.
static DESTROYER: Mutex<Option<(u32, Sender<Job>)>> = Mutex::new(None);

fn destroy_later(id: u64, pending: Vec<Event>, programs: Vec<LoadedExecutable>) {
    let mut destroyer = DESTROYER.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    let job = (id, pending, programs);
    if let Some((owner, sender)) = destroyer.as_ref() {
        if *owner == pid {
            match sender.send(job) {
                Ok(()) => return,
                Err(failed) => return start_destroyer(&mut destroyer, pid, failed.0),
            }
        }
    }
    start_destroyer(&mut destroyer, pid, job);
}

fn start_destroyer(slot: &mut Option<(u32, Sender<Job>)>, pid: u32, first: Job) {
    let (sender, jobs) = channel::<Job>();
    let _ = sender.send(first);
    let started = std::thread::Builder::new()
        .name("colocated-destroy".into())
        .spawn(move || {
            for (id, pending, programs) in jobs {
                for event in pending {
                    // A failed call may still have built the object: destroy it anyway.
                    let _ = event.wait();
                }
                run_forgets(id, &programs);
            }
        });
    match started {
        Ok(_) => *slot = Some((pid, sender)),
        Err(e) => tracing::error!("no thread to destroy colocated objects on workers: {e}"),
    }
}
