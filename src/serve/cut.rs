//! Cutting what is waiting into batches: texts sorted by length, split into consecutive runs,
//! each run in the smallest bucket that fits it, the split chosen to minimize the tokens the
//! engine computes (padding included) plus a fixed cost per batch.
//!
//! A dynamic program over the sorted lengths (the optimal split of sorted items into buckets is
//! contiguous): `best[i]` = the cheapest way to run the `i` shortest texts. O(n · max rows)
//! bucket lookups; n is bounded by the token budget of one gather.

use kiln_runtime::Bucket;

/// One batch: `items[start..end]` of the sorted order, run in `bucket`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub start: usize,
    pub end: usize,
    pub bucket: Bucket,
}

/// Splits texts of lengths `sorted` (ascending) into batches. `pick(rows, tokens)` is the
/// smallest bucket that fits (None when none does); `per_batch` is a batch's fixed cost in
/// token-equivalents (weights streamed once per run, kernel launches). Every length must fit
/// some bucket on its own, else None.
pub fn cut(sorted: &[usize], pick: impl Fn(usize, usize) -> Option<Bucket>, per_batch: usize) -> Option<Vec<Cut>> {
    debug_assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "lengths must be sorted");
    let n = sorted.len();
    // best[i]: (cost, rows of the last batch, its bucket) for the first i texts.
    let mut best: Vec<(usize, usize, Option<Bucket>)> = vec![(usize::MAX, 0, None); n + 1];
    best[0].0 = 0;
    for i in 1..=n {
        let tokens = sorted[i - 1];
        for rows in 1..=i {
            // A longer run of the same longest text needs at least as many rows: once no bucket
            // takes `rows`, none takes more.
            let Some(b) = pick(rows, tokens) else { break };
            let prev = best[i - rows].0;
            if prev == usize::MAX {
                continue;
            }
            let cost = prev + b.batch * b.seq + per_batch;
            if cost < best[i].0 {
                best[i] = (cost, rows, Some(b));
            }
        }
        best[i].2?;
    }
    let mut cuts = Vec::new();
    let mut end = n;
    while end > 0 {
        let (_, rows, b) = best[end];
        cuts.push(Cut { start: end - rows, end, bucket: b? });
        end -= rows;
    }
    cuts.reverse();
    Some(cuts)
}

/// Real tokens over computed tokens of a split (1.0 = no padding).
pub fn efficiency(sorted: &[usize], cuts: &[Cut]) -> f64 {
    let real: usize = sorted.iter().sum();
    let computed: usize = cuts.iter().map(|c| c.bucket.batch * c.bucket.seq).sum();
    real as f64 / computed.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(rows: &[usize], seqs: &[usize]) -> Vec<Bucket> {
        let mut v: Vec<Bucket> = rows.iter().flat_map(|&r| seqs.iter().map(move |&s| Bucket::new(r, s))).collect();
        v.sort_by_key(|b| (b.batch * b.seq, b.batch, b.seq));
        v
    }

    fn picker(buckets: &[Bucket]) -> impl Fn(usize, usize) -> Option<Bucket> + '_ {
        move |r, t| buckets.iter().copied().find(|b| b.fits(r, t))
    }

    #[test]
    fn every_text_is_in_exactly_one_batch_that_fits_it() {
        let b = ladder(&[1, 2, 4, 8, 16, 32], &[16, 32, 48, 64, 80, 96, 112, 128, 256]);
        let mut lens: Vec<usize> = (0..200).map(|i| 5 + (i * 37) % 116).collect();
        lens.sort();
        let cuts = cut(&lens, picker(&b), 8).unwrap();
        let mut next = 0;
        for c in &cuts {
            assert_eq!(c.start, next);
            assert!(c.end > c.start);
            assert!(c.bucket.fits(c.end - c.start, lens[c.end - 1]), "{c:?}");
            // The smallest bucket that fits.
            assert_eq!(Some(c.bucket), picker(&b)(c.end - c.start, lens[c.end - 1]));
            next = c.end;
        }
        assert_eq!(next, lens.len());
        let eff = efficiency(&lens, &cuts);
        assert!(eff >= 0.85, "efficiency {eff}");
    }

    #[test]
    fn a_short_text_is_never_padded_to_a_long_one() {
        let b = ladder(&[1, 2, 4, 8], &[16, 128]);
        let lens = [7, 120];
        let cuts = cut(&lens, picker(&b), 8).unwrap();
        assert_eq!(cuts.len(), 2);
        assert_eq!(cuts[0].bucket, Bucket::new(1, 16));
        assert_eq!(cuts[1].bucket, Bucket::new(1, 128));
    }

    #[test]
    fn equal_texts_share_a_batch_and_rows_fill_buckets() {
        let b = ladder(&[1, 2, 4, 8], &[16, 32]);
        let lens = [10; 12];
        let cuts = cut(&lens, picker(&b), 8).unwrap();
        let mut buckets: Vec<Bucket> = cuts.iter().map(|c| c.bucket).collect();
        buckets.sort_by_key(|b| b.batch);
        assert_eq!(buckets, vec![Bucket::new(4, 16), Bucket::new(8, 16)]);
        assert_eq!(efficiency(&lens, &cuts), 120.0 / 192.0);
    }

    #[test]
    fn a_text_no_bucket_takes_is_refused() {
        let b = ladder(&[1, 2], &[16]);
        assert_eq!(cut(&[3, 17], picker(&b), 8), None);
        assert_eq!(cut(&[], picker(&b), 8), Some(vec![]));
    }
}
