//! Loading executables for a session: checking the request, proxies of
//! the controller's host callbacks, and answering a retried load (after a
//! broken link) as the first was.

use std::sync::Arc;

use super::service::Service;
use crate::compiler::CompileOptions;
use crate::error::{Error, Result};
use crate::host_callback::LoadedHostCallback;
use crate::transport::host_calls::MAX_HOST_CALLBACKS;
use crate::transport::proto::{LoadExecutableRequest, LoadExecutableResponse};
use crate::transport::SessionId;

impl Service {
    /// Loads `request`'s executable into session `id`; a request the
    /// session loaded already (a retry) gets the first answer again.
    pub(super) fn load(
        &self,
        id: SessionId,
        request: &LoadExecutableRequest,
    ) -> Result<LoadExecutableResponse> {
        let digest = load_digest(request);
        let answered = self.with_session(id, |session| {
            Ok(session
                .executables
                .get(&request.handle)
                .filter(|loaded| loaded.request == digest)
                .map(|loaded| loaded.answer))
        })?;
        if let Some(answer) = answered {
            return Ok(answer);
        }
        let decoded = crate::format::decode(&request.executable)?;
        if decoded.num_host_callbacks > MAX_HOST_CALLBACKS {
            return Err(Error::invalid_argument(format!(
                "an executable may name at most {MAX_HOST_CALLBACKS} host callbacks, not {}",
                decoded.num_host_callbacks
            )));
        }
        let host_callbacks = (0..decoded.num_host_callbacks)
            .map(|index| self.host_callback_proxy(id, request.handle, index))
            .collect();
        let scope = self.with_session(id, |session| Ok(session.scope.clone()))?;
        // The controller's ids of this host's devices, for the load only.
        let mut by_controller = std::collections::HashMap::new();
        for (&local, &controller) in &request.controller_device_ids {
            self.0.client.lookup_device(local).map_err(|_| {
                Error::invalid_argument(format!(
                    "controller_device_ids names device {local}, which this host lacks"
                ))
            })?;
            if by_controller.insert(controller, local).is_some() {
                return Err(Error::invalid_argument(format!(
                    "controller_device_ids gives controller device {controller} twice"
                )));
            }
        }
        let _ids = crate::executor::ControllerIds::enter(by_controller);
        let exe =
            self.0
                .client
                .load_decoded(decoded, CompileOptions { host_callbacks }, Some(scope))?;
        let count = |specs: &[crate::spec::ArraySpec]| -> Result<u32> {
            let n: usize = specs.iter().map(|s| s.sharding.devices().len()).sum();
            u32::try_from(n).map_err(|_| Error::invalid_argument("too many shards"))
        };
        let response = LoadExecutableResponse {
            num_input_buffers: count(&exe.program().input_specs)?,
            num_output_buffers: count(&exe.program().output_specs)?,
        };
        self.with_session(id, |session| {
            if let Some(loaded) = session.executables.get(&request.handle) {
                // The first of a load and its retry (both in flight when
                // the link broke) to finish stays; the other answers alike.
                if loaded.request == digest {
                    return Ok(loaded.answer);
                }
                return Err(Error::already_exists(format!(
                    "executable {} exists in this session",
                    request.handle
                )));
            }
            let loaded = super::Loaded {
                exe,
                request: digest,
                answer: response,
            };
            session.executables.insert(request.handle, loaded);
            Ok(response)
        })
    }

    /// Host callback `index` of executable `executable` as a program of the
    /// session sees it: a call that runs on the controller.
    fn host_callback_proxy(
        &self,
        id: SessionId,
        executable: u64,
        index: u32,
    ) -> LoadedHostCallback {
        let shared = Arc::downgrade(&self.0);
        LoadedHostCallback::new(format!("controller host callback {index}"), move |input| {
            let shared = shared
                .upgrade()
                .ok_or_else(|| Error::unavailable("the worker is stopping"))?;
            let waiter = Service(shared)
                .with_session(id, |session| session.calls.start(executable, index, input))?;
            // Blocks this thread only: the result arrives on the control
            // stream (read by another thread), or the session's end fails it.
            super::lane::before_waiting_on_the_controller();
            waiter.wait()
        })
    }
}

/// The digest of a load request: its handle, executable and device ids.
fn load_digest(request: &LoadExecutableRequest) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    request.handle.hash(&mut hasher);
    request.executable.hash(&mut hasher);
    let mut ids: Vec<_> = request.controller_device_ids.iter().collect();
    ids.sort_unstable();
    ids.hash(&mut hasher);
    hasher.finish()
}
