//! Buffer data on the local host: bytes or strings in this process.

use std::sync::Arc;

use super::host::{Fetched, HostData};
use super::{write_on_host, Buffer, HostDst, Storage, UsageHold};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::{Event, Progress};
use crate::storage::DenseBytes;

/// The controller's own process as a holder of buffer data.
pub(crate) struct Local;

impl HostData for Local {
    fn in_process(&self) -> bool {
        true
    }

    fn check_dtype(&self, _dtype: DType) -> Result<()> {
        Ok(())
    }

    fn put_copy(&self, dst: &Buffer, src: &[u8], _progress: Option<Progress>) {
        dst.finish(DenseBytes::copy_of(src).map(|b| Arc::new(Storage::Dense(b))));
    }

    fn put(&self, dst: &Buffer, data: Arc<Storage>, _progress: Option<Progress>) {
        if let Storage::Remote(_) = &*data {
            return dst.finish(Err(Error::internal(
                "data on a worker put on the local host without a read",
            )));
        }
        dst.finish(Ok(data));
    }

    fn fetch(
        &self,
        _src: &Buffer,
        held: Arc<Storage>,
        keep: UsageHold,
        _progress: Option<Progress>,
        done: Fetched,
    ) {
        drop(keep);
        done(Ok(held));
    }

    fn read_into(
        &self,
        _src: &Buffer,
        held: Arc<Storage>,
        dst: HostDst,
        keep: UsageHold,
        done: Event,
    ) {
        let _span = tracing::trace_span!("to_host", bytes = dst.len()).entered();
        let result = write_on_host(&held, dst);
        drop(keep);
        done.set_if_pending(result);
    }
}
