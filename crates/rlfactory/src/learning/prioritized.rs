//! Prioritised replay (Schaul et al., 2016, the proportional variant) over a policy's replay ring
//! (`--prioritized_replay`).
//!
//! The ring lives in shared memory and the actors write it; only the policy's learner samples it, so the priorities
//! live in the learner's process: a [`SumTree`] with one leaf per row of the ring (insert `k` is in row
//! `k mod (capacity + 1)`, where the ring puts it).
//! - Before each batch the sampler catches up with the ring's insert counter: each new insert's leaf gets the largest
//!   priority given so far (so a new transition is soon sampled), and the leaf of the row the next insert overwrites
//!   gets 0 (it is no longer visible).
//! - A batch of `B` is drawn stratified: one prefix sum uniformly in each of `B` equal segments of the total, its leaf
//!   found by descending the tree. A row the actors overwrote since the catch-up is caught up with and drawn again.
//! - Importance weights `w_i = (N P(i))^−β` for `N` visible rows, divided by the batch's largest; `β` rises linearly
//!   from `--prioritized_replay_beta` to 1 over the run.
//! - After the SGD step the learner sets each sampled transition's priority to `(|δ_i| + ε)^α` (`δ_i` its TD error),
//!   unless the actors have overwritten it since.

use rlf_shm::ReplayRing;

/// A binary tree of sums over `n` non-negative leaves: set a leaf, read the total, and find the leaf where a prefix
/// sum falls, each in `O(log n)`. A parent is recomputed from its children at every change, so no rounding drift
/// accumulates however many updates are made.
#[derive(Debug, Clone)]
pub struct SumTree {
    /// Leaves rounded up to a power of two.
    size: usize,
    /// `nodes[1]` is the root, the children of `i` are `2i` and `2i + 1`, leaf `j` is `nodes[size + j]`.
    nodes: Vec<f64>,
}

impl SumTree {
    /// A tree of `n` leaves, all 0.
    pub fn new(n: usize) -> Self {
        let size = n.max(1).next_power_of_two();
        Self {
            size,
            nodes: vec![0.0; 2 * size],
        }
    }

    /// The sum of every leaf.
    pub fn total(&self) -> f64 {
        self.nodes[1]
    }

    /// Leaf `leaf`'s value.
    pub fn get(&self, leaf: usize) -> f64 {
        self.nodes[self.size + leaf]
    }

    /// Sets leaf `leaf` to `value` (≥ 0).
    pub fn set(&mut self, leaf: usize, value: f64) {
        let mut i = self.size + leaf;
        self.nodes[i] = value.max(0.0);
        while i > 1 {
            i /= 2;
            self.nodes[i] = self.nodes[2 * i] + self.nodes[2 * i + 1];
        }
    }

    /// The leaf where the prefix sum `u` (in `[0, total)`) falls: the first leaf whose running sum exceeds `u`.
    /// A subtree of sum 0 is never entered while the total is positive, whatever the rounding.
    pub fn find(&self, mut u: f64) -> usize {
        let mut i = 1;
        while i < self.size {
            let (left, right) = (self.nodes[2 * i], self.nodes[2 * i + 1]);
            if u < left || right <= 0.0 {
                i *= 2;
            } else {
                u -= left;
                i = 2 * i + 1;
            }
        }
        i - self.size
    }
}

/// Priorities saved with a replay buffer (by the prioritised sampler's `saved`).
#[derive(Debug, Clone, PartialEq)]
pub struct SavedPriorities {
    /// The priority of each saved insert, oldest first (0: not yet given one).
    pub values: Vec<f64>,
    /// Inserts the sampler had caught up with.
    pub seen: u64,
    /// The largest priority given.
    pub max: f64,
}

/// The priorities of one replay ring and the sampling by them.
#[derive(Debug, Clone)]
pub struct PrioritizedSampler {
    tree: SumTree,
    /// Rows of the ring (`capacity + 1`).
    rows: u64,
    capacity: u64,
    /// Inserts caught up with.
    seen: u64,
    /// The largest priority given so far (new inserts get it).
    max_priority: f64,
    alpha: f64,
    eps: f64,
    /// The last batch's sampling probabilities.
    probs: Vec<f64>,
}

impl PrioritizedSampler {
    /// Priorities for a ring of `capacity` transitions, `(|δ| + eps)^alpha` each.
    pub fn new(capacity: usize, alpha: f64, eps: f64) -> Self {
        let rows = capacity as u64 + 1;
        Self {
            tree: SumTree::new(rows as usize),
            rows,
            capacity: capacity as u64,
            seen: 0,
            max_priority: 1.0,
            alpha,
            eps,
            probs: Vec::new(),
        }
    }

    /// Gives every insert below `inserted` not yet seen the largest priority, and the row the next insert
    /// overwrites priority 0.
    fn catch_up(&mut self, inserted: u64) {
        for k in self.seen.max(inserted.saturating_sub(self.rows))..inserted {
            self.tree.set((k % self.rows) as usize, self.max_priority);
        }
        self.tree.set((inserted % self.rows) as usize, 0.0);
        self.seen = self.seen.max(inserted);
    }

    /// The insert number held by `leaf`'s row as of the catch-up (leaves with a positive priority only).
    fn insert_of(&self, leaf: usize) -> u64 {
        let last = self.seen - 1;
        last - (last % self.rows + self.rows - leaf as u64) % self.rows
    }

    /// Copies rows of `ring` drawn by priority into `out` (filling it: `n` rows of `row_words` words), their insert
    /// numbers into
    /// `indices` and their importance weights at exponent `beta` into `weights`; `uniform()` must return a uniform
    /// number in `[0, 1)`. Returns `false` (and copies nothing) while the ring is empty.
    pub fn sample(
        &mut self,
        ring: &ReplayRing,
        beta: f64,
        mut uniform: impl FnMut() -> f64,
        indices: &mut Vec<u64>,
        out: &mut [f32],
        weights: &mut Vec<f32>,
    ) -> bool {
        self.catch_up(ring.inserted());
        if self.tree.total() <= 0.0 {
            return false;
        }
        indices.clear();
        self.probs.clear();
        let n = out.len() / ring.row_words();
        for (i, row) in out.chunks_exact_mut(ring.row_words()).enumerate() {
            loop {
                let total = self.tree.total();
                let u = ((i as f64 + uniform()) * total / n as f64).min(total * (1.0 - f64::EPSILON));
                let leaf = self.tree.find(u);
                let k = self.insert_of(leaf);
                if ring.read(k, row).is_ok() {
                    indices.push(k);
                    self.probs.push(self.tree.get(leaf) / total);
                    break;
                }
                self.catch_up(ring.inserted());
            }
        }
        let visible = self.seen.min(self.capacity) as f64;
        weights.clear();
        weights.extend(self.probs.iter().map(|p| (visible * p).powf(-beta) as f32));
        let largest = weights.iter().copied().fold(f32::MIN_POSITIVE, f32::max);
        weights.iter_mut().for_each(|w| *w /= largest);
        true
    }

    /// The largest priority given so far.
    pub fn max_priority(&self) -> f64 {
        self.max_priority
    }

    /// The priorities of inserts `first ..< first + n` (0 for one not yet given its priority), the inserts caught up
    /// with, and the largest priority: what [`restore`](Self::restore) continues from.
    pub fn saved(&self, first: u64, n: u64) -> SavedPriorities {
        let values = (first..first + n)
            .map(|k| {
                if k < self.seen && k + self.rows >= self.seen {
                    self.tree.get((k % self.rows) as usize)
                } else {
                    0.0
                }
            })
            .collect();
        SavedPriorities {
            values,
            seen: self.seen,
            max: self.max_priority,
        }
    }

    /// Continues from priorities [`saved`](Self::saved) of the inserts from `first` that a restored ring holds
    /// again.
    pub fn restore(&mut self, first: u64, saved: &SavedPriorities) {
        self.seen = saved.seen;
        self.max_priority = saved.max;
        for (k, &p) in (first..).zip(&saved.values) {
            if k < saved.seen && k + self.rows >= saved.seen {
                self.tree.set((k % self.rows) as usize, p);
            }
        }
    }

    /// Sets the priority of each sampled insert in `indices` from its TD error in `td_errors`, unless it has been
    /// overwritten since.
    pub fn update(&mut self, indices: &[u64], td_errors: &[f32]) {
        for (&k, &delta) in indices.iter().zip(td_errors) {
            if k + self.capacity < self.seen {
                continue;
            }
            let p = (f64::from(delta.abs()) + self.eps).powf(self.alpha);
            self.tree.set((k % self.rows) as usize, p);
            self.max_priority = self.max_priority.max(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};
    use rand_pcg::Pcg64Mcg;

    use super::*;

    /// Against a linear scan of running sums: every prefix sum finds the same leaf, after thousands of updates
    /// (some to 0), and the total stays exact.
    #[test]
    fn the_tree_finds_what_a_linear_scan_finds() {
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        let n = 37;
        let mut tree = SumTree::new(n);
        let mut values = vec![0.0; n];
        for step in 0..5000 {
            let leaf = rng.random_range(0..n);
            let v = if step % 7 == 0 {
                0.0
            } else {
                rng.random::<f64>() * 3.0
            };
            tree.set(leaf, v);
            values[leaf] = v;
            let total: f64 = values.iter().sum();
            assert!((tree.total() - total).abs() < 1e-9);
            if total == 0.0 {
                continue;
            }
            let u = rng.random::<f64>() * total;
            let mut running = 0.0;
            let want = values
                .iter()
                .position(|v| {
                    running += v;
                    running > u
                })
                .unwrap_or(n - 1);
            assert_eq!(tree.find(u), want, "u {u} of {total}: {values:?}");
            assert!(tree.get(tree.find(u)) > 0.0);
        }
    }

    /// The priority of insert `k` (0 when it is not visible as of the last catch-up).
    fn priority(s: &PrioritizedSampler, k: u64) -> f64 {
        if k >= s.seen || k + s.capacity < s.seen {
            return 0.0;
        }
        s.tree.get((k % s.rows) as usize)
    }

    fn ring_with(capacity: usize, inserts: u64) -> ReplayRing {
        let ring = ReplayRing::create(capacity, 2, None).expect("ring");
        let rows: Vec<f32> = (0..inserts).flat_map(|k| [k as f32, -(k as f32)]).collect();
        ring.insert(&rows, None).expect("insert");
        ring
    }

    /// A sampler restored from saved priorities into a ring restored from a snapshot draws what the original
    /// draws, with the same weights, and gives new inserts the same largest priority.
    #[test]
    fn restored_priorities_draw_as_the_saved_ones() {
        let capacity = 10;
        let ring = ring_with(capacity, 25);
        let mut sampler = PrioritizedSampler::new(capacity, 0.6, 1e-6);
        let mut rng = Pcg64Mcg::seed_from_u64(3);
        let (mut indices, mut out, mut weights) = (Vec::new(), vec![0.0; 4 * 2], Vec::new());
        for _ in 0..20 {
            assert!(sampler.sample(&ring, 0.5, || rng.random(), &mut indices, &mut out, &mut weights));
            let errors: Vec<f32> = indices.iter().map(|&k| (k % 7) as f32 * 0.3).collect();
            sampler.update(&indices, &errors);
        }
        ring.insert(&[25.0, -25.0], None).expect("insert");
        let (first, rows) = ring.snapshot();
        let saved = sampler.saved(first, (rows.len() / 2) as u64);
        assert_eq!(
            saved.values.last(),
            Some(&0.0),
            "insert 25 not caught up with yet"
        );

        let copy = ReplayRing::create(capacity, 2, None).expect("ring");
        copy.restore(first, &rows, 0).expect("restore");
        let mut restored = PrioritizedSampler::new(capacity, 0.6, 1e-6);
        restored.restore(first, &saved);
        let (mut a, mut b) = (Pcg64Mcg::seed_from_u64(4), Pcg64Mcg::seed_from_u64(4));
        let (mut indices_b, mut out_b, mut weights_b) = (Vec::new(), vec![0.0; 4 * 2], Vec::new());
        for _ in 0..50 {
            assert!(sampler.sample(&ring, 0.7, || a.random(), &mut indices, &mut out, &mut weights));
            assert!(restored.sample(
                &copy,
                0.7,
                || b.random(),
                &mut indices_b,
                &mut out_b,
                &mut weights_b
            ));
            assert_eq!((&indices, &out, &weights), (&indices_b, &out_b, &weights_b));
        }
        assert_eq!(sampler.saved(first, 11), restored.saved(first, 11));
    }

    /// Across the ring's wrap-around, only visible inserts are drawn, each row holds the insert its index names,
    /// and draws follow the priorities: after giving one transition 9 times the priority of the others, it is drawn
    /// in proportion, and its importance weight is the smallest (`(N P)^−β` normalised by the batch's largest).
    #[test]
    fn draws_follow_priorities_across_the_wrap_around() {
        let capacity = 10;
        let ring = ring_with(capacity, 25);
        let mut sampler = PrioritizedSampler::new(capacity, 1.0, 0.0);
        let mut rng = Pcg64Mcg::seed_from_u64(2);
        let (mut indices, mut out, mut weights) = (Vec::new(), vec![0.0; 4 * 2], Vec::new());
        assert!(sampler.sample(&ring, 0.5, || rng.random(), &mut indices, &mut out, &mut weights));
        for (k, row) in indices.iter().zip(out.chunks_exact(2)) {
            assert!((15..25).contains(k), "{k}");
            assert_eq!(row, [*k as f32, -(*k as f32)]);
        }
        // Insert 20 gets priority 9, the others 1: it holds 9 / 18 of the mass.
        let others: Vec<u64> = (15..25).filter(|&k| k != 20).collect();
        sampler.update(&others, &vec![1.0; others.len()]);
        sampler.update(&[20], &[9.0]);
        assert_eq!((priority(&sampler, 20), priority(&sampler, 14)), (9.0, 0.0));
        let (mut hits, mut compared) = (0, 0);
        let draws = 4000;
        for _ in 0..draws / 4 {
            assert!(sampler.sample(&ring, 0.5, || rng.random(), &mut indices, &mut out, &mut weights));
            assert_eq!(weights.iter().copied().fold(0.0, f32::max), 1.0);
            let of = |k: u64| indices.iter().position(|&i| i == k).map(|at| weights[at]);
            hits += indices.iter().filter(|&&k| k == 20).count();
            // (N P)^−β: 9 times the probability, a third of the weight.
            if let (Some(heavy), Some(light)) =
                (of(20), indices.iter().find(|&&k| k != 20).and_then(|&k| of(k)))
            {
                assert!((heavy / light - 1.0 / 3.0).abs() < 1e-5, "{weights:?}");
                compared += 1;
            }
        }
        assert!(compared > 100);
        let share = hits as f64 / f64::from(draws);
        assert!((share - 0.5).abs() < 0.04, "insert 20 drawn {share} of the time");
        // New inserts come in at the largest priority; the ones they overwrite leave.
        ring.insert(&[100.0, -100.0], None).expect("insert");
        assert!(sampler.sample(&ring, 0.5, || rng.random(), &mut indices, &mut out, &mut weights));
        assert_eq!((priority(&sampler, 25), priority(&sampler, 15)), (9.0, 0.0));
    }
}
