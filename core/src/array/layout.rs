//! Row-major blocks: copying a shard's block between the global array's bytes
//! and the shard's own, in runs where the block allows.

use std::ops::Range;

#[derive(Clone, Copy)]
pub(super) enum Direction {
    GlobalToShard,
    ShardToGlobal,
}

/// The bytes of a row-major array of `shape` (elements of `elem` bytes) that
/// block `index` covers, when they are one run: every dimension after the
/// first one the block cuts is whole, and every one before it has one index.
pub(super) fn contiguous_run(
    shape: &[i64],
    index: &[Range<i64>],
    elem: usize,
) -> Option<Range<usize>> {
    let mut cut = shape.len();
    while cut > 0 && index[cut - 1].start == 0 && index[cut - 1].end == shape[cut - 1] {
        cut -= 1;
    }
    if cut > 1 && index[..cut - 1].iter().any(|r| r.end - r.start != 1) {
        return None;
    }
    let start = shape.iter().zip(index).try_fold(0i64, |at, (&dim, r)| {
        at.checked_mul(dim)?.checked_add(r.start)
    })?;
    let len = index
        .iter()
        .try_fold(1i64, |n, r| n.checked_mul(r.end - r.start))?;
    let start = usize::try_from(start).ok()?.checked_mul(elem)?;
    let len = usize::try_from(len).ok()?.checked_mul(elem)?;
    Some(start..start.checked_add(len)?)
}

/// Copies the block `index` of a row-major global array (of `shape`) between the
/// global bytes and a dense shard, one contiguous innermost run at a time.
pub(super) fn copy_block(
    src: &[u8],
    shape: &[i64],
    index: &[Range<i64>],
    dst: &mut [u8],
    elem: usize,
    dir: Direction,
) {
    let rank = shape.len();
    if rank == 0 {
        let n = elem.min(src.len()).min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
        return;
    }
    let run = (index[rank - 1].end - index[rank - 1].start) as usize * elem;
    if run == 0 {
        return;
    }
    let mut shard_at = 0usize;
    for start in element_indices(&shape[..rank], &block_rows(index)) {
        let global_at = (start + index[rank - 1].start as usize) * elem;
        match dir {
            Direction::GlobalToShard => {
                dst[shard_at..shard_at + run].copy_from_slice(&src[global_at..global_at + run])
            }
            Direction::ShardToGlobal => {
                dst[global_at..global_at + run].copy_from_slice(&src[shard_at..shard_at + run])
            }
        }
        shard_at += run;
    }
}

/// The block's rows: the same ranges with the innermost reduced to its first column.
fn block_rows(index: &[Range<i64>]) -> Vec<Range<i64>> {
    let mut rows = index.to_vec();
    if let Some(last) = rows.last_mut() {
        *last = 0..1;
    }
    rows
}

/// Row-major flat indices of the elements of block `index` in an array of `shape`.
pub(super) fn element_indices<'a>(
    shape: &'a [i64],
    index: &'a [Range<i64>],
) -> impl Iterator<Item = usize> + 'a {
    let total: usize = index
        .iter()
        .map(|r| (r.end - r.start).max(0) as usize)
        .product();
    let mut counter: Vec<i64> = index.iter().map(|r| r.start).collect();
    (0..total).map(move |k| {
        let flat = counter
            .iter()
            .zip(shape)
            .fold(0usize, |acc, (&c, &n)| acc * n as usize + c as usize);
        if k + 1 < total {
            for d in (0..counter.len()).rev() {
                counter[d] += 1;
                if counter[d] < index[d].end {
                    break;
                }
                counter[d] = index[d].start;
            }
        }
        flat
    })
}

#[cfg(test)]
mod tests {
    use super::contiguous_run;

    #[test]
    fn a_block_is_one_run_when_only_its_leading_dimensions_are_cut() {
        let shape = [4, 6, 2];
        // Rows 1..3 of a (4, 6, 2) array of 4-byte elements.
        assert_eq!(
            contiguous_run(&shape, &[1..3, 0..6, 0..2], 4),
            Some(48..144)
        );
        // One row, columns 2..4: a run too.
        assert_eq!(contiguous_run(&shape, &[2..3, 2..4, 0..2], 1), Some(28..32));
        // Two rows cut in the columns: not one run.
        assert_eq!(contiguous_run(&shape, &[0..2, 0..3, 0..2], 1), None);
        // The last dimension cut over several rows: not one run.
        assert_eq!(contiguous_run(&shape, &[0..4, 0..6, 0..1], 1), None);
        // The whole array, and a scalar.
        assert_eq!(contiguous_run(&shape, &[0..4, 0..6, 0..2], 2), Some(0..96));
        assert_eq!(contiguous_run(&[], &[], 8), Some(0..8));
        // An empty block is an empty run.
        assert_eq!(contiguous_run(&shape, &[2..2, 0..6, 0..2], 1), Some(24..24));
    }
}
