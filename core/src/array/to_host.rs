//! Reading an array to host memory: its gathered row-major bytes and string
//! elements.

use super::layout::{contiguous_run, copy_block, element_indices, Direction};
use super::Array;
use crate::buffer::Buffer;
use crate::dtype::{checked_byte_size, checked_num_elements, DType};
use crate::error::{Error, Result};
use crate::prefault::Prefault;

impl Array {
    /// Waits for the array and gathers it into row-major host bytes.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.on_host_size()?];
        self.to_host_into(&mut out)?;
        Ok(out)
    }

    /// Bytes of the gathered row-major array (dense dtypes; `invalid_argument`
    /// for strings).
    pub fn on_host_size(&self) -> Result<usize> {
        let spec = &self.0.spec;
        if spec.dtype == DType::String {
            return Err(Error::invalid_argument(
                "use to_host_strings for string arrays",
            ));
        }
        checked_byte_size(spec.dtype, &spec.shape)
    }

    /// Waits for the array and gathers it into `out`, which must be exactly
    /// [`Array::on_host_size`] bytes (checked before waiting).
    pub fn to_host_into(&self, out: &mut [u8]) -> Result<()> {
        let spec = &self.0.spec;
        let expected = self.on_host_size()?;
        if out.len() != expected {
            return Err(Error::invalid_argument(format!(
                "destination is {} bytes but {} needs {expected}",
                out.len(),
                spec.describe()
            )));
        }
        let elem = spec.dtype.byte_size().unwrap_or(1);
        let replicated = spec.sharding.is_fully_replicated();
        let wanted = if replicated { 1 } else { self.0.buffers.len() };
        // Everything that can fail is known before the first read starts.
        let shards = (0..wanted)
            .map(|pos| Ok((self.0.buffers[pos].on_host_size()?, self.shard_index(pos)?)))
            .collect::<Result<Vec<_>>>()?;
        let base = out.as_mut_ptr();
        // Fresh destination memory (a new NumPy array, say) is faulted in on
        // another core while the shards arrive; stopped before returning.
        let prefault = Prefault::start(base, out.len());
        // Every shard's read starts before the first wait: shards on workers
        // download in parallel. A shard whose block is one run of `out` is
        // read straight into it; others into memory of their own, then
        // copied. A block that several shards hold (partial replication) is
        // read once.
        let mut seen = std::collections::HashSet::with_capacity(wanted);
        let mut reads = Vec::with_capacity(wanted);
        for (pos, (size, index)) in shards.into_iter().enumerate() {
            if !seen.insert(index.clone()) {
                continue;
            }
            let buffer = &self.0.buffers[pos];
            let run = contiguous_run(&spec.shape, &index, elem)
                .filter(|run| run.len() == size && run.end <= out.len());
            let (staged, done) = match run {
                // SAFETY: the run lies inside `out`, the runs of different
                // blocks do not overlap, and `out` is not touched until every
                // read's event is ready: every event is waited for below.
                Some(run) => (None, unsafe {
                    buffer.to_host_raw(base.add(run.start), size)
                }),
                None => {
                    let mut shard = vec![0u8; size];
                    // SAFETY: `shard` is exactly that long, and is neither
                    // moved nor touched until its event is ready: every
                    // event is waited for below before `reads` is dropped.
                    let done = unsafe { buffer.to_host_raw(shard.as_mut_ptr(), size) };
                    (Some(shard), done)
                }
            };
            reads.push((staged, index, done));
        }
        let waited: Vec<Result<()>> = reads
            .iter()
            .map(|(_, _, done)| match done {
                Ok(event) => event.wait(),
                Err(e) => Err(e.clone()),
            })
            .collect();
        drop(prefault);
        for ((staged, index, _), status) in reads.iter().zip(waited) {
            status?;
            if let Some(shard) = staged {
                copy_block(
                    shard,
                    &spec.shape,
                    index,
                    out,
                    elem,
                    Direction::ShardToGlobal,
                );
            }
        }
        Ok(())
    }

    /// Waits for a string array and gathers its elements in row-major order
    /// (shards on workers download in parallel; a replicated array reads one).
    pub fn to_host_strings(&self) -> Result<Vec<String>> {
        let spec = &self.0.spec;
        let mut out = vec![String::new(); checked_num_elements(&spec.shape)?];
        let wanted = if spec.sharding.is_fully_replicated() {
            1
        } else {
            self.0.buffers.len()
        };
        // Every shard's read starts before the first wait: shards on workers
        // download in parallel.
        let reads = self.0.buffers[..wanted]
            .iter()
            .map(Buffer::read_strings)
            .collect::<Result<Vec<_>>>()?;
        for (pos, read) in reads.into_iter().enumerate() {
            let index = self.shard_index(pos)?;
            let strings = read.wait()?;
            for (i, s) in element_indices(&spec.shape, &index).zip(strings.strings()?) {
                out[i] = s.to_string();
            }
        }
        Ok(out)
    }
}
