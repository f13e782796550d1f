//! Reading a buffer to host memory: its size there, dense bytes and string
//! elements.

use std::sync::{Arc, Mutex};

use super::{write_on_host, Buffer, HostDst, Storage};
use crate::dtype::{checked_byte_size, DType};
use crate::error::{Error, Result};
use crate::future::Event;
use crate::future::Progress;

impl Buffer {
    /// Bytes `to_host` writes. Blocks until the buffer is ready (string sizes are
    /// known only then; the strings of a buffer on a worker are downloaded).
    pub fn on_host_size(&self) -> Result<usize> {
        self.check_live()?;
        if let Some(size) = self.0.dtype.byte_size() {
            return checked_byte_size(self.0.dtype, &self.0.dims)
                .map(|_| size * self.num_elements());
        }
        Ok(self.read_strings()?.wait()?.on_host_size())
    }

    pub(super) fn num_elements(&self) -> usize {
        self.0.dims.iter().map(|d| *d as usize).product()
    }

    /// Copies the data into `dst` once the buffer is ready; the event reports the
    /// outcome. `len` must equal [`Buffer::on_host_size`] (dense buffers are checked
    /// now, string buffers when the data is there).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and untouched by the caller
    /// until the returned event is ready.
    pub unsafe fn to_host_raw(&self, dst: *mut u8, len: usize) -> Result<Event> {
        self.check_live()?;
        if let Some(size) = self.0.dtype.byte_size() {
            let expected = size * self.num_elements();
            if len != expected {
                return Err(Error::invalid_argument(format!(
                    "destination is {len} bytes but {self:?} needs {expected}"
                )));
            }
        }
        if dst.is_null() && len > 0 {
            return Err(Error::invalid_argument("destination is NULL"));
        }
        let dst = HostDst(dst, len);
        if self.host().in_process() && self.0.ready.is_ready() {
            // Copied during the call: the storage handle taken by `copy_out` keeps
            // the data alive even if another thread deletes the buffer meanwhile.
            return self
                .copy_out(dst)
                .map(|()| Event::ready_ok())
                .or_else(|e| Ok(Event::ready(Err(e))));
        }
        // Once ready, the host writes it (a worker's data is downloaded
        // straight into `dst`), without blocking any thread.
        let hold = self.hold()?;
        let done = Event::new();
        let (me, out) = (self.clone(), done.clone());
        self.0.ready.when_ready(move |status| {
            match status.and_then(|()| me.storage()) {
                Ok(held) => me.host().read_into(&me, held, dst, hold, out),
                Err(e) => out.set_if_pending(Err(e)),
            };
        });
        Ok(done)
    }

    fn copy_out(&self, dst: HostDst) -> Result<()> {
        let _span = tracing::trace_span!("to_host", bytes = dst.1).entered();
        self.0.ready.status().unwrap_or(Ok(()))?;
        write_on_host(&*self.storage()?, dst)
    }

    /// Waits for the buffer and returns a copy of its on-host form.
    pub fn to_host_vec(&self) -> Result<Vec<u8>> {
        if self.0.dtype == DType::String {
            // Read once: the size of strings is known only with them.
            let strings = self.read_strings()?.wait()?;
            let mut out = vec![0u8; strings.on_host_size()];
            strings.write_to(&mut out)?;
            return Ok(out);
        }
        self.0.ready.wait()?;
        let mut out = vec![0u8; self.on_host_size()?];
        // SAFETY: `out` is exactly that long and outlives the wait below.
        unsafe { self.to_host_raw(out.as_mut_ptr(), out.len())? }.wait()?;
        Ok(out)
    }

    /// Waits for a string buffer and returns its elements (downloaded from
    /// its worker, for a buffer on one).
    pub fn to_strings(&self) -> Result<Vec<String>> {
        let strings = self.read_strings()?.wait()?;
        Ok(strings.strings()?.iter().map(|x| x.to_string()).collect())
    }

    /// Starts reading this string buffer's elements: at once for a buffer of
    /// this host once it is ready, else downloaded from its worker (reads of
    /// several buffers proceed in parallel). `invalid_argument` for a dense
    /// buffer, `failed_precondition` for a deleted one.
    pub(crate) fn read_strings(&self) -> Result<StringsRead> {
        let done = Event::new();
        let slot = Arc::new(Mutex::new(None));
        let (out, sink) = (done.clone(), slot.clone());
        self.strings_then(None, move |strings| match strings {
            Ok(strings) => {
                *sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(strings);
                out.set_if_pending(Ok(()));
            }
            Err(e) => out.set_if_pending(Err(e)),
        })?;
        Ok(StringsRead {
            done,
            strings: slot,
        })
    }

    /// Calls `done` with this string buffer's elements (as `Storage::Strings`)
    /// once it is ready, downloading them first when they are on a worker,
    /// with `progress` reports. Never blocks: `done` runs on the thread that
    /// makes the buffer ready, a network thread, or this one.
    fn strings_then(
        &self,
        progress: Option<Progress>,
        done: impl FnOnce(Result<Arc<Storage>>) + Send + 'static,
    ) -> Result<()> {
        self.check_live()?;
        if self.0.dtype != DType::String {
            return Err(Error::invalid_argument(format!(
                "{self:?} is not a string buffer"
            )));
        }
        let hold = self.hold()?;
        let me = self.clone();
        self.0
            .ready
            .when_ready(move |status| match status.and_then(|()| me.storage()) {
                Ok(held) => me.host().fetch(&me, held, hold, progress, Box::new(done)),
                Err(e) => done(Err(e)),
            });
        Ok(())
    }
}

/// A read of a string buffer's elements in flight (see [`Buffer::read_strings`]).
pub(crate) struct StringsRead {
    done: Event,
    strings: Arc<Mutex<Option<Arc<Storage>>>>,
}

impl StringsRead {
    /// Waits for the read: the elements, as `Storage::Strings`.
    pub(crate) fn wait(self) -> Result<Arc<Storage>> {
        self.done.wait()?;
        self.strings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| Error::internal("a finished read of strings has no strings"))
    }
}
