//! Events: asynchronous work's completion, with its error.

use std::os::raw::c_void;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::plugin::{call, new_args, Plugin};
use crate::sys;

/// A plugin's event. Dropping it destroys the event (the work goes on).
pub struct Event {
    raw: *mut sys::PJRT_Event,
    plugin: Arc<Plugin>,
}

// SAFETY: PJRT events may be used and destroyed from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

/// What `on_ready`'s trampoline gets back: the callback and the event, which
/// is destroyed once the callback has run (as XLA's own C API client does).
struct Waiter {
    callback: Box<dyn FnOnce(Result<()>) + Send>,
    event: Event,
}

impl Event {
    /// Takes ownership of `raw` (null gives `None`).
    pub(crate) fn from_raw(plugin: &Arc<Plugin>, raw: *mut sys::PJRT_Event) -> Option<Event> {
        (!raw.is_null()).then(|| Event {
            raw,
            plugin: plugin.clone(),
        })
    }

    /// Whether the work has finished (successfully or not).
    pub fn is_ready(&self) -> Result<bool> {
        let mut a = new_args!(PJRT_Event_IsReady_Args, PJRT_Event_IsReady_Args_STRUCT_SIZE);
        a.event = self.raw;
        call!(self.plugin.api(), PJRT_Event_IsReady, &mut a)?;
        Ok(a.is_ready)
    }

    /// Blocks this thread until the work has finished; its error, if any.
    pub fn wait(&self) -> Result<()> {
        let mut a = new_args!(PJRT_Event_Await_Args, PJRT_Event_Await_Args_STRUCT_SIZE);
        a.event = self.raw;
        call!(self.plugin.api(), PJRT_Event_Await, &mut a)
    }

    /// Calls `callback` with the outcome once the work has finished, on a
    /// thread of the plugin's choice (or on this one, before returning, when it
    /// has finished already). `callback` must not block.
    ///
    /// If the plugin refuses to register the callback, it runs at once with
    /// that error.
    pub fn on_ready(self, callback: impl FnOnce(Result<()>) + Send + 'static) {
        let plugin = self.plugin.clone();
        let raw = self.raw;
        let waiter = Box::into_raw(Box::new(Waiter {
            callback: Box::new(callback),
            event: self,
        }));
        let mut a = new_args!(PJRT_Event_OnReady_Args, PJRT_Event_OnReady_Args_STRUCT_SIZE);
        a.event = raw;
        a.callback = Some(on_ready_trampoline);
        a.user_arg = waiter.cast::<c_void>();
        if let Err(e) = call!(plugin.api(), PJRT_Event_OnReady, &mut a) {
            // SAFETY: the plugin refused the callback, so it never runs and
            // `waiter` is still ours.
            let waiter = unsafe { Box::from_raw(waiter) };
            (waiter.callback)(Err(e));
        }
    }
}

/// Runs on the plugin's thread: owns `error` (destroys it) and `user_arg`.
unsafe extern "C" fn on_ready_trampoline(error: *mut sys::PJRT_Error, user_arg: *mut c_void) {
    // SAFETY: `user_arg` is the `Waiter` that `on_ready` leaked for us, given
    // back exactly once.
    let waiter = unsafe { Box::from_raw(user_arg.cast::<Waiter>()) };
    let outcome = if error.is_null() {
        Ok(())
    } else {
        // SAFETY: the callback owns `error`.
        Err(unsafe { Error::from_raw(waiter.event.plugin.api(), error, "PJRT event") })
    };
    let Waiter { callback, event } = *waiter;
    // A panic must not unwind into the plugin's C++ frames.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(outcome)));
    drop(event);
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut a = new_args!(PJRT_Event_Destroy_Args, PJRT_Event_Destroy_Args_STRUCT_SIZE);
        a.event = self.raw;
        // A failure to destroy leaves nothing to do.
        let _ = call!(self.plugin.api(), PJRT_Event_Destroy, &mut a);
    }
}
