//! Replay transitions for off-policy learners: the row layout of a [`rlf_shm::ReplayRing`] and the n-step adder
//! that turns an agent's steps into rows, as DeepMind Acme's `NStepTransitionAdder` does.
//!
//! A row is one n-step transition `(obs, action, return, discount, next_obs)`:
//! - `return` = Σ_{j<k} γ^j r_j over the agent's next `k ≤ n` steps of the same episode, where `r_j` folds in every
//!   reward the agent received until it acted again (a turn-based game's loser gets its −1 on the winner's move);
//! - `discount` = γ^k, or 0 when the window ended in a terminal state;
//! - `next_obs` = the agent's observation when it acts `k` steps later, or the last observation of its episode when
//!   a time limit truncated it (a truncation is not terminal: the learner bootstraps from it), zeros when terminal.
//!
//! So a learner's target is `return + discount · max_a Q(next_obs, a)` whatever `k` was. The adder keeps one window
//! per agent stream across trajectory boundaries; an episode truncated without a final observation (a multi-agent
//! env does not keep it) cannot bootstrap its last windows, and those are dropped.

use std::collections::VecDeque;

use super::ObsLayout;

/// Where each part of a transition lies in a row of `f32` words. An observation's byte-valued parts (images, boards,
/// masks: its [`ObsLayout`]) are packed four to a word; the learner unpacks its sampled rows
/// ([`decode`](Self::decode)). An observation whose packing would save nothing (every byte run a single value) is
/// kept as floats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionLayout {
    /// Which observation values are bytes.
    obs: ObsLayout,
    /// Words per packed observation.
    obs_words: usize,
    /// Values per raw action.
    pub action_dim: usize,
}

impl TransitionLayout {
    /// Rows for observations laid out as `obs` and actions of `action_dim` values.
    pub fn new(obs: ObsLayout, action_dim: usize) -> Self {
        let obs = if obs.packed_words() < obs.dim() {
            obs
        } else {
            ObsLayout::floats(obs.dim())
        };
        Self {
            obs_words: obs.packed_words(),
            obs,
            action_dim,
        }
    }

    /// Rows whose observations are `obs_dim` floats.
    pub fn floats(obs_dim: usize, action_dim: usize) -> Self {
        Self::new(ObsLayout::floats(obs_dim), action_dim)
    }

    /// Values per observation.
    pub fn obs_dim(&self) -> usize {
        self.obs.dim()
    }

    /// Words per observation in a row.
    pub fn obs_words(&self) -> usize {
        self.obs_words
    }

    /// Words per row: `obs`, `action`, `return`, `discount`, `next_obs`.
    pub fn row_words(&self) -> usize {
        2 * self.obs_words + self.action_dim + 2
    }

    /// Offset of the action.
    pub fn action_at(&self) -> usize {
        self.obs_words
    }

    /// Offset of the n-step return.
    pub fn return_at(&self) -> usize {
        self.obs_words + self.action_dim
    }

    /// Offset of the discount.
    pub fn discount_at(&self) -> usize {
        self.return_at() + 1
    }

    /// Offset of the next observation.
    pub fn next_obs_at(&self) -> usize {
        self.discount_at() + 1
    }

    /// Whether some observation values are packed as bytes (rows must be decoded before use).
    pub fn packs(&self) -> bool {
        self.obs.bytes() > 0
    }

    /// The observation `values` packed into `words` (`obs_words` of them).
    pub fn pack_obs(&self, values: &[f32], words: &mut [f32]) {
        self.obs.pack(values, words);
    }

    /// Writes a transition into `row`, its observations already packed.
    pub fn write(
        &self,
        row: &mut [f32],
        obs: &[f32],
        action: &[f32],
        ret: f32,
        discount: f32,
        next_obs: &[f32],
    ) {
        row[..self.obs_words].copy_from_slice(obs);
        row[self.action_at()..self.return_at()].copy_from_slice(action);
        row[self.return_at()] = ret;
        row[self.discount_at()] = discount;
        row[self.next_obs_at()..].copy_from_slice(next_obs);
    }

    /// The rows of floats of `rows` (whole rows of this layout), into `out`; returns their layout.
    pub fn decode(&self, rows: &[f32], out: &mut Vec<f32>) -> TransitionLayout {
        let floats = Self::floats(self.obs_dim(), self.action_dim);
        let (w, fw, d) = (self.row_words(), floats.row_words(), self.obs_dim());
        out.resize(rows.len() / w * fw, 0.0);
        for (row, to) in rows.chunks_exact(w).zip(out.chunks_exact_mut(fw)) {
            self.obs.unpack(&row[..self.obs_words], &mut to[..d]);
            to[d..d + self.action_dim + 2].copy_from_slice(&row[self.action_at()..self.next_obs_at()]);
            self.obs
                .unpack(&row[self.next_obs_at()..], &mut to[floats.next_obs_at()..]);
        }
        floats
    }
}

/// One agent step waiting for its window to fill: where the agent was, what it did, and the rewards it received
/// until it acted again.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Pending {
    obs: Vec<f32>,
    action: Vec<f32>,
    reward: f64,
}

/// The n-step adder of one agent stream (one column of a rollout worker's envs).
#[derive(Debug, Clone)]
pub struct NStepAdder {
    layout: TransitionLayout,
    n: usize,
    gamma: f64,
    pending: VecDeque<Pending>,
    zeros: Vec<f32>,
    /// A bootstrap observation, packed.
    next: Vec<f32>,
}

/// An [`NStepAdder`]'s windows, for an exact resume: the steps waiting and the bootstrap observation.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct KeptWindows {
    pending: VecDeque<Pending>,
    next: Vec<f32>,
}

impl NStepAdder {
    /// Its windows, which [`restore`](Self::restore) puts back into an adder of the same layout.
    pub fn kept(&self) -> KeptWindows {
        KeptWindows {
            pending: self.pending.clone(),
            next: self.next.clone(),
        }
    }

    /// Takes back windows [`kept`](Self::kept) saved.
    pub fn restore(&mut self, kept: KeptWindows) {
        self.pending = kept.pending;
        self.next = kept.next;
    }

    /// Values per observation it takes.
    pub fn obs_dim(&self) -> usize {
        self.layout.obs_dim()
    }

    /// Values per action it takes.
    pub fn action_dim(&self) -> usize {
        self.layout.action_dim
    }

    /// An adder of `n`-step transitions (`n ≥ 1`) discounted by `gamma`.
    pub fn new(layout: TransitionLayout, n: usize, gamma: f64) -> Self {
        Self {
            n: n.max(1),
            gamma,
            pending: VecDeque::with_capacity(n + 1),
            zeros: vec![0.0; layout.obs_words()],
            next: vec![0.0; layout.obs_words()],
            layout,
        }
    }

    /// The agent acts: `action` from `obs`. The oldest window, full now, goes to `out` as a row, bootstrapping from
    /// `obs`.
    pub fn act(&mut self, obs: &[f32], action: &[f32], out: &mut Vec<f32>) {
        let mut packed = vec![0.0; self.layout.obs_words()];
        self.layout.pack_obs(obs, &mut packed);
        if self.pending.len() == self.n {
            self.emit(&packed, false, out);
        }
        self.pending.push_back(Pending {
            obs: packed,
            action: action.to_vec(),
            reward: 0.0,
        });
    }

    /// The agent received `reward` (acting or not).
    pub fn reward(&mut self, reward: f32) {
        if let Some(last) = self.pending.back_mut() {
            last.reward += f64::from(reward);
        }
    }

    /// The agent's episode ended: terminated (no bootstrap), or truncated with its last observation `last` (none:
    /// its windows cannot bootstrap and are dropped). Every window goes to `out`.
    pub fn end_episode(&mut self, terminated: bool, last: Option<&[f32]>, out: &mut Vec<f32>) {
        match (terminated, last) {
            (true, _) => {
                let zeros = std::mem::take(&mut self.zeros);
                while !self.pending.is_empty() {
                    self.emit(&zeros, true, out);
                }
                self.zeros = zeros;
            }
            (false, Some(last)) => {
                let mut next = std::mem::take(&mut self.next);
                self.layout.pack_obs(last, &mut next);
                while !self.pending.is_empty() {
                    self.emit(&next, false, out);
                }
                self.next = next;
            }
            (false, None) => self.pending.clear(),
        }
    }

    /// Appends the row of the oldest window (all pending steps), bootstrapping from `next_obs` (packed) unless
    /// `terminal`.
    fn emit(&mut self, next_obs: &[f32], terminal: bool, out: &mut Vec<f32>) {
        let (mut ret, mut scale) = (0.0, 1.0);
        for p in &self.pending {
            ret += scale * p.reward;
            scale *= self.gamma;
        }
        let Some(first) = self.pending.pop_front() else {
            return;
        };
        let at = out.len();
        out.resize(at + self.layout.row_words(), 0.0);
        let discount = if terminal { 0.0 } else { scale as f32 };
        self.layout.write(
            &mut out[at..],
            &first.obs,
            &first.action,
            ret as f32,
            discount,
            next_obs,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> TransitionLayout {
        TransitionLayout::floats(1, 1)
    }

    /// Rows as `(obs, action, return, discount, next_obs)`.
    fn rows(out: &[f32]) -> Vec<(f32, f32, f32, f32, f32)> {
        out.chunks_exact(layout().row_words())
            .map(|r| (r[0], r[1], r[2], r[3], r[4]))
            .collect()
    }

    fn close(a: &[(f32, f32, f32, f32, f32)], b: &[(f32, f32, f32, f32, f32)]) -> bool {
        let near = |x: f32, y: f32| (x - y).abs() < 1e-5;
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                near(x.0, y.0) && near(x.1, y.1) && near(x.2, y.2) && near(x.3, y.3) && near(x.4, y.4)
            })
    }

    /// With byte-valued observations (a board of 9 cells and a float) the rows are packed: 4 words per observation
    /// (3 for the board, 1 for the float) instead of 10, and decoded they are the rows an all-float layout makes of the same steps, bootstraps and
    /// terminal zeros included.
    #[test]
    fn byte_observations_are_packed_in_rows_and_decode_to_the_float_rows() {
        use crate::data::ObsLayout;
        let space = rlf_env::Space::Tuple(vec![
            rlf_env::Space::MultiDiscrete(vec![3; 9]),
            rlf_env::Space::Box(rlf_env::BoxSpace::uniform(-1.0, 1.0, vec![1]).expect("box")),
        ]);
        let packed = TransitionLayout::new(ObsLayout::of(&space), 1);
        let floats = TransitionLayout::floats(10, 1);
        assert!(packed.packs() && !floats.packs());
        assert_eq!(
            (packed.obs_words(), packed.row_words(), floats.row_words()),
            (4, 11, 23)
        );
        let obs = |t: usize| -> Vec<f32> {
            let mut o: Vec<f32> = (0..9).map(|i| ((i + t) % 3) as f32).collect();
            o.push(-0.5 + 0.1 * t as f32);
            o
        };
        let feed = |layout: TransitionLayout| {
            let mut adder = NStepAdder::new(layout, 2, 0.9);
            let mut out = Vec::new();
            for episode in 0..2 {
                for t in 0..4 {
                    adder.act(&obs(t + episode), &[t as f32], &mut out);
                    adder.reward(1.0);
                }
                adder.end_episode(episode == 0, Some(&obs(9)), &mut out);
            }
            out
        };
        let (rows, reference) = (feed(packed.clone()), feed(floats.clone()));
        assert_eq!(rows.len() / packed.row_words(), 8);
        let mut decoded = Vec::new();
        assert_eq!(packed.decode(&rows, &mut decoded), floats);
        assert_eq!(decoded, reference);
    }

    /// Byte runs of a single value save nothing packed: such observations stay floats, whole numbers as they are.
    #[test]
    fn single_byte_values_stay_floats() {
        use crate::data::ObsLayout;
        let unit = rlf_env::Space::Box(rlf_env::BoxSpace::uniform(-1.0, 1.0, vec![1]).expect("box"));
        for space in [
            rlf_env::Space::discrete(16),
            rlf_env::Space::Tuple(vec![
                rlf_env::Space::discrete(3),
                unit,
                rlf_env::Space::discrete(5),
            ]),
        ] {
            let layout = TransitionLayout::new(ObsLayout::of(&space), 1);
            assert!(ObsLayout::of(&space).bytes() > 0, "{space}");
            assert!(!layout.packs(), "{space}");
            assert_eq!(layout, TransitionLayout::floats(space.flat_dim(), 1));
            let mut adder = NStepAdder::new(layout, 1, 0.5);
            let mut out = Vec::new();
            let obs: Vec<f32> = (0..space.flat_dim()).map(|i| (i + 2) as f32).collect();
            adder.act(&obs, &[1.0], &mut out);
            adder.end_episode(true, None, &mut out);
            assert_eq!(&out[..obs.len()], &obs[..], "{space}");
        }
    }

    /// A 5-step episode ending in a terminal state, 3-step windows, γ = 0.5: each row matches the hand-computed
    /// return; the last windows shrink and do not bootstrap.
    #[test]
    fn windows_fill_then_shrink_at_a_terminal_state() {
        let mut adder = NStepAdder::new(layout(), 3, 0.5);
        let mut out = Vec::new();
        for t in 0..5 {
            adder.act(&[t as f32], &[10.0 + t as f32], &mut out);
            adder.reward((t + 1) as f32);
        }
        adder.end_episode(true, None, &mut out);
        let want = [
            (0.0, 10.0, 1.0 + 0.5 * 2.0 + 0.25 * 3.0, 0.125, 3.0),
            (1.0, 11.0, 2.0 + 0.5 * 3.0 + 0.25 * 4.0, 0.125, 4.0),
            (2.0, 12.0, 3.0 + 0.5 * 4.0 + 0.25 * 5.0, 0.0, 0.0),
            (3.0, 13.0, 4.0 + 0.5 * 5.0, 0.0, 0.0),
            (4.0, 14.0, 5.0, 0.0, 0.0),
        ];
        assert!(close(&rows(&out), &want), "{:?}", rows(&out));
    }

    /// A truncated episode bootstraps its last windows from the final observation, with the discount of their
    /// length; the next episode starts empty.
    #[test]
    fn a_truncation_bootstraps_from_the_final_observation() {
        let mut adder = NStepAdder::new(layout(), 2, 0.9);
        let mut out = Vec::new();
        for t in 0..3 {
            adder.act(&[t as f32], &[0.0], &mut out);
            adder.reward(1.0);
        }
        adder.end_episode(false, Some(&[99.0]), &mut out);
        adder.act(&[50.0], &[1.0], &mut out);
        adder.reward(2.0);
        adder.end_episode(false, None, &mut out);
        let want = [
            (0.0, 0.0, 1.9, 0.81, 2.0),
            (1.0, 0.0, 1.9, 0.81, 99.0),
            (2.0, 0.0, 1.0, 0.9, 99.0),
        ];
        assert!(close(&rows(&out), &want), "{:?}", rows(&out));
    }

    /// A turn-based agent: rewards received while it waits are folded into its last step, and its next step's
    /// observation (not the one in between) is the bootstrap.
    #[test]
    fn rewards_between_turns_fold_into_the_agents_last_step() {
        let mut adder = NStepAdder::new(layout(), 1, 0.99);
        let mut out = Vec::new();
        adder.act(&[0.0], &[3.0], &mut out);
        adder.reward(0.0);
        // The opponent's move: no action, a reward of -0.5 to this agent.
        adder.reward(-0.5);
        adder.act(&[2.0], &[4.0], &mut out);
        adder.reward(0.0);
        adder.reward(-1.0);
        adder.end_episode(true, None, &mut out);
        let want = [(0.0, 3.0, -0.5, 0.99, 2.0), (2.0, 4.0, -1.0, 0.0, 0.0)];
        assert!(close(&rows(&out), &want), "{:?}", rows(&out));
    }
}
