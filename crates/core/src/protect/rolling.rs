//! A rolling average over fixed buckets, pure and clock-injected: the
//! per-pool in-flight `/_cluster_avg` reports (the OpenResty gateway's 5 minutes in
//! 10 × 30 s buckets). Reported, not enforced.

/// Buckets of `bucket_ms`, the last `N` kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Rolling<const N: usize> {
    bucket_ms: u64,
    /// (bucket index since the epoch, sum, samples), newest last.
    buckets: Vec<(u64, f64, u64)>,
}

impl<const N: usize> Rolling<N> {
    pub fn new(bucket_ms: u64) -> Self {
        Rolling {
            bucket_ms: bucket_ms.max(1),
            buckets: Vec::with_capacity(N + 1),
        }
    }

    pub fn add(&mut self, value: f64, now_ms: u64) {
        let index = now_ms / self.bucket_ms;
        match self.buckets.last_mut() {
            Some((i, sum, n)) if *i == index => {
                *sum += value;
                *n += 1;
            }
            _ => self.buckets.push((index, value, 1)),
        }
        self.expire(now_ms);
    }

    fn expire(&mut self, now_ms: u64) {
        let oldest = (now_ms / self.bucket_ms).saturating_sub(N as u64 - 1);
        self.buckets.retain(|(i, _, _)| *i >= oldest);
    }

    /// The mean of every sample in the last `N` buckets, and each bucket's
    /// own mean (oldest first) with its start time.
    pub fn average(&mut self, now_ms: u64) -> (Option<f64>, Vec<(u64, f64)>) {
        self.expire(now_ms);
        let (sum, n) = self
            .buckets
            .iter()
            .fold((0.0, 0), |(s, c), (_, sum, n)| (s + sum, c + n));
        let per_bucket = self
            .buckets
            .iter()
            .map(|(i, sum, n)| (i * self.bucket_ms, sum / *n as f64))
            .collect();
        ((n > 0).then(|| sum / n as f64), per_bucket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_covers_the_last_ten_buckets_only() {
        let mut r: Rolling<10> = Rolling::new(30_000);
        assert_eq!(r.average(0).0, None);
        // 4 in-flight for the first bucket, 8 for the next.
        r.add(4.0, 0);
        r.add(4.0, 29_999);
        r.add(8.0, 30_000);
        let (avg, buckets) = r.average(30_000);
        assert_eq!(avg, Some(16.0 / 3.0));
        assert_eq!(buckets, vec![(0, 4.0), (30_000, 8.0)]);
        // Ten buckets on, the first has left the window; eleven on, both.
        assert_eq!(r.average(9 * 30_000).0, Some(16.0 / 3.0));
        assert_eq!(r.average(10 * 30_000).0, Some(8.0));
        assert_eq!(r.average(11 * 30_000).0, None);
    }
}
