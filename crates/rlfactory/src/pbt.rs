//! Population-based training (`--with_pbt`), with Sample Factory's rules, free of any event loop:
//! the runner feeds it each policy's agent steps and objective and carries out its
//! [`Decision`]s.
//!
//! Every `--pbt_period_env_steps` agent steps of a policy, once the run has passed
//! `--pbt_start_mutation` env frames, the policies are ranked by their objective (the mean true
//! objective of their last `--stats_avg` episodes: what the env reports as `info["true_objective"]`
//! at an episode's end, else its return). A policy in the best `--pbt_replace_fraction` keeps
//! everything. One in the worst fraction takes the weights and the hyper-parameters of a policy
//! drawn from the best fraction when the gap passes both `--pbt_replace_reward_gap` (relative)
//! and `--pbt_replace_reward_gap_absolute`. Every policy outside the best fraction then has its
//! hyper-parameters mutated ([`Hyper::mutate`]), except policy 0, which keeps its own as the
//! population's reference.
//!
//! Where Sample Factory is fragile this is not:
//! - the relative gap divides by the larger magnitude of the two objectives, so negative and
//!   near-zero returns compare sensibly (its TODO);
//! - a policy without a finished episode yet, or an objective that is not finite, postpones the
//!   policy's update instead of failing (Sample Factory's GitHub issue #263: it crashed on missing statistics).

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::{Deserialize, Serialize};

use crate::config::{AppoConfig, Config, LearningConfig, OptimizerConfig, PbtConfig};

/// Mutations multiply or divide a value by a factor drawn from this range.
const PERTURB: std::ops::Range<f64> = 1.1..1.5;
/// Gamma stays within this range when it is mutated.
const GAMMA_RANGE: (f64, f64) = (0.8, 0.9999);

/// The hyper-parameters PBT mutates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Hyper {
    /// `--learning_rate`.
    pub learning_rate: f64,
    /// `--exploration_loss_coeff`.
    pub exploration_loss_coeff: f64,
    /// `--value_loss_coeff`.
    pub value_loss_coeff: f64,
    /// `--ppo_clip_ratio`.
    pub ppo_clip_ratio: f64,
    /// `--ppo_clip_value`.
    pub ppo_clip_value: f64,
    /// `--max_grad_norm`.
    pub max_grad_norm: f64,
    /// `--gamma` (mutated only with `--pbt_optimize_gamma`).
    pub gamma: f64,
}

impl Hyper {
    /// The values of `cfg`.
    pub fn of(cfg: &Config) -> Self {
        Self {
            learning_rate: cfg.optimizer.learning_rate,
            exploration_loss_coeff: cfg.appo.exploration_loss_coeff,
            value_loss_coeff: cfg.appo.value_loss_coeff,
            ppo_clip_ratio: cfg.appo.ppo_clip_ratio,
            ppo_clip_value: cfg.appo.ppo_clip_value,
            max_grad_norm: cfg.optimizer.max_grad_norm,
            gamma: cfg.learning.gamma,
        }
    }

    /// Writes these values into the sections that hold them.
    pub fn apply(&self, appo: &mut AppoConfig, learning: &mut LearningConfig, optim: &mut OptimizerConfig) {
        optim.learning_rate = self.learning_rate;
        appo.exploration_loss_coeff = self.exploration_loss_coeff;
        appo.value_loss_coeff = self.value_loss_coeff;
        appo.ppo_clip_ratio = self.ppo_clip_ratio;
        appo.ppo_clip_value = self.ppo_clip_value;
        optim.max_grad_norm = self.max_grad_norm;
        learning.gamma = self.gamma;
    }

    /// Each value, with probability `rate`, multiplied or divided (even odds) by a factor drawn
    /// from [1.1, 1.5] (so a zero, such as a disabled value clip, stays zero); gamma, with
    /// `gamma` set, through `1 - gamma`.
    pub fn mutate(&self, rate: f64, gamma: bool, rng: &mut Pcg64Mcg) -> Self {
        let mut perturb = |v: f64| {
            if rng.random::<f64>() >= rate {
                return v;
            }
            let factor = rng.random_range(PERTURB);
            if rng.random::<bool>() {
                v * factor
            } else {
                v / factor
            }
        };
        let mut next = Self {
            learning_rate: perturb(self.learning_rate),
            exploration_loss_coeff: perturb(self.exploration_loss_coeff),
            value_loss_coeff: perturb(self.value_loss_coeff),
            ppo_clip_ratio: perturb(self.ppo_clip_ratio),
            ppo_clip_value: perturb(self.ppo_clip_value),
            max_grad_norm: perturb(self.max_grad_norm),
            gamma: self.gamma,
        };
        if gamma {
            next.gamma = (1.0 - perturb(1.0 - self.gamma)).clamp(GAMMA_RANGE.0, GAMMA_RANGE.1);
        }
        next
    }

    /// The values by flag name, for the log and TensorBoard.
    pub fn named(&self) -> [(&'static str, f64); 7] {
        [
            ("learning_rate", self.learning_rate),
            ("exploration_loss_coeff", self.exploration_loss_coeff),
            ("value_loss_coeff", self.value_loss_coeff),
            ("ppo_clip_ratio", self.ppo_clip_ratio),
            ("ppo_clip_value", self.ppo_clip_value),
            ("max_grad_norm", self.max_grad_norm),
            ("gamma", self.gamma),
        ]
    }
}

/// A policy's PBT state, as `policy_<i>_cfg.json` holds it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PolicyState {
    /// The policy.
    pub policy: usize,
    /// Its hyper-parameters now.
    pub hyper: Hyper,
    /// Its agent steps when the state was written (a resumed run counts on from them).
    pub agent_steps: u64,
    /// Its agent steps at its last PBT update.
    pub last_update_agent_steps: u64,
    /// Updates so far.
    pub updates: u64,
    /// Times it took another policy's weights.
    pub replaced: u64,
}

/// What PBT does to one policy at its update.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The policy updated.
    pub policy: usize,
    /// The policy whose weights (and hyper-parameters, before mutation) it takes, if any.
    pub replace_from: Option<usize>,
    /// Its hyper-parameters before and after.
    pub before: Hyper,
    /// After the update.
    pub after: Hyper,
    /// The objectives the decision was made on, by policy.
    pub objectives: Vec<f64>,
}

/// The population's state and Sample Factory's update rules.
#[derive(Debug, Clone)]
pub struct Pbt {
    cfg: PbtConfig,
    policies: Vec<PolicyState>,
    /// Whether each policy's state came from a resumed run's file.
    resumed: Vec<bool>,
    rng: Pcg64Mcg,
}

impl Pbt {
    /// The population of `num_policies` policies starting from the hyper-parameters `base`, or from
    /// `saved` states (a resumed run's `policy_<i>_cfg.json`) where given.
    pub fn new(
        cfg: &PbtConfig,
        base: Hyper,
        num_policies: usize,
        saved: &[Option<PolicyState>],
        seed: u64,
    ) -> Self {
        let policies: Vec<PolicyState> = (0..num_policies)
            .map(|policy| {
                saved.get(policy).copied().flatten().unwrap_or(PolicyState {
                    policy,
                    hyper: base,
                    agent_steps: 0,
                    last_update_agent_steps: 0,
                    updates: 0,
                    replaced: 0,
                })
            })
            .collect();
        let resumed = (0..num_policies)
            .map(|policy| saved.get(policy).is_some_and(Option::is_some))
            .collect();
        // A resumed population draws on from where its decisions left off, not the first run's draws again (which
        // would mutate a policy taking the same source's parameters exactly as before).
        let decided: u64 = policies.iter().map(|s| s.updates).sum();
        Self {
            cfg: cfg.clone(),
            policies,
            resumed,
            rng: Pcg64Mcg::seed_from_u64(
                seed ^ 0x0b7_0000_0000_0007 ^ decided.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
        }
    }

    /// Each policy's state.
    pub fn states(&self) -> &[PolicyState] {
        &self.policies
    }

    /// The states a resumed run continues (those read from its `policy_<i>_cfg.json`).
    pub fn resumed(&self) -> impl Iterator<Item = &PolicyState> {
        self.policies
            .iter()
            .zip(&self.resumed)
            .filter_map(|(state, &resumed)| resumed.then_some(state))
    }

    /// Records policy `policy`'s agent steps so far (for its saved state).
    pub fn set_agent_steps(&mut self, policy: usize, agent_steps: u64) {
        if let Some(s) = self.policies.get_mut(policy) {
            s.agent_steps = agent_steps;
        }
    }

    /// Policy `policy` has taken `agent_steps` steps in a run at `env_frames`; `objectives` are
    /// every policy's (`None` without a finished episode). Returns the policy's update when it is
    /// due (see the module doc), after recording it.
    pub fn on_progress(
        &mut self,
        policy: usize,
        agent_steps: u64,
        env_frames: u64,
        objectives: &[Option<f64>],
    ) -> Option<Decision> {
        let n = self.policies.len();
        let state = self.policies.get(policy)?;
        if n < 2
            || env_frames < self.cfg.pbt_start_mutation
            || agent_steps < state.last_update_agent_steps + self.cfg.pbt_period_env_steps
        {
            return None;
        }
        let known: Vec<f64> = objectives.iter().map(|o| o.unwrap_or(f64::NAN)).collect();
        if known.len() != n || known.iter().any(|o| !o.is_finite()) {
            return None;
        }
        let mut ranked: Vec<usize> = (0..n).collect();
        ranked.sort_by(|&a, &b| known[b].total_cmp(&known[a]).then(a.cmp(&b)));
        let k = ((self.cfg.pbt_replace_fraction * n as f64).ceil() as usize).clamp(1, n / 2);
        let (best, worst) = (&ranked[..k], &ranked[n - k..]);
        let before = state.hyper;
        let mut decision = Decision {
            policy,
            replace_from: None,
            before,
            after: before,
            objectives: known.clone(),
        };
        if !best.contains(&policy) {
            let mut base = before;
            if worst.contains(&policy) {
                let candidate = best[self.rng.random_range(0..best.len())];
                let gap = known[candidate] - known[policy];
                let scale = known[candidate].abs().max(known[policy].abs()).max(1e-9);
                if gap > self.cfg.pbt_replace_reward_gap_absolute
                    && gap / scale > self.cfg.pbt_replace_reward_gap
                {
                    decision.replace_from = Some(candidate);
                    base = self.policies[candidate].hyper;
                }
            }
            decision.after = if policy == 0 {
                before
            } else {
                base.mutate(
                    self.cfg.pbt_mutation_rate,
                    self.cfg.pbt_optimize_gamma,
                    &mut self.rng,
                )
            };
        }
        let state = &mut self.policies[policy];
        state.hyper = decision.after;
        state.agent_steps = agent_steps;
        state.last_update_agent_steps = agent_steps;
        state.updates += 1;
        state.replaced += u64::from(decision.replace_from.is_some());
        Some(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pbt(n: usize, overrides: &[&str]) -> Pbt {
        let cfg = crate::config::Config::for_env("CartPole-v1", overrides).expect("config");
        Pbt::new(&cfg.pbt, Hyper::of(&cfg), n, &[], 3)
    }

    const FLAGS: [&str; 4] = [
        "pbt_period_env_steps = 100",
        "pbt_start_mutation = 1000",
        "pbt_mutation_rate = 1",
        "pbt_replace_reward_gap = 0.1",
    ];

    #[test]
    fn nothing_happens_before_the_start_or_within_a_period() {
        let mut p = pbt(4, &FLAGS);
        let objectives = [Some(10.0), Some(200.0), Some(300.0), Some(400.0)];
        assert_eq!(
            p.on_progress(0, 500, 999, &objectives),
            None,
            "before --pbt_start_mutation"
        );
        assert!(p.on_progress(0, 500, 1000, &objectives).is_some());
        assert_eq!(
            p.on_progress(0, 599, 2000, &objectives),
            None,
            "within the period"
        );
        // A policy with no episode yet, or a non-finite objective, postpones the update.
        assert_eq!(
            p.on_progress(1, 500, 2000, &[None, Some(1.0), Some(2.0), Some(3.0)]),
            None
        );
        assert_eq!(
            p.on_progress(1, 500, 2000, &[Some(f64::NAN), Some(1.0), Some(2.0), Some(3.0)]),
            None
        );
        assert_eq!(
            pbt(1, &FLAGS).on_progress(0, 500, 2000, &[Some(1.0)]),
            None,
            "a population of one"
        );
    }

    #[test]
    fn a_resumed_population_names_the_saved_states_and_starts_the_others_afresh() {
        let cfg = crate::config::Config::for_env("CartPole-v1", &FLAGS).expect("config");
        let base = Hyper::of(&cfg);
        let mut hyper = base;
        hyper.learning_rate = 1.0;
        let saved = PolicyState {
            policy: 2,
            hyper,
            agent_steps: 700,
            last_update_agent_steps: 600,
            updates: 3,
            replaced: 1,
        };
        let p = Pbt::new(&cfg.pbt, base, 4, &[None, None, Some(saved)], 3);
        assert_eq!(p.resumed().copied().collect::<Vec<_>>(), [saved]);
        assert_eq!(p.states()[2], saved);
        assert!(
            p.states()[3].hyper == base && p.states()[3].updates == 0,
            "a policy past the saved ones"
        );
        assert_eq!(pbt(4, &FLAGS).resumed().count(), 0, "a new run");
    }

    #[test]
    fn a_resumed_population_draws_other_mutations_than_its_first_run() {
        let cfg = crate::config::Config::for_env("CartPole-v1", &FLAGS).expect("config");
        let base = Hyper::of(&cfg);
        let objectives = [Some(500.0), Some(400.0), Some(300.0), Some(10.0)];
        // Policy 3 takes a best policy's parameters (each the reference values) in a first run, and again, with the
        // same seed, in the run that resumes it after one decision of each policy.
        let mutated = |saved: &[Option<PolicyState>]| {
            let mut p = Pbt::new(&cfg.pbt, base, 4, saved, 3);
            let d = p.on_progress(3, 5_000, 5_000, &objectives).expect("due");
            (d.replace_from, d.after)
        };
        let first = mutated(&[]);
        let saved: Vec<Option<PolicyState>> = (0..4)
            .map(|policy| {
                Some(PolicyState {
                    policy,
                    hyper: base,
                    agent_steps: 1_000,
                    last_update_agent_steps: 1_000,
                    updates: 1,
                    replaced: 0,
                })
            })
            .collect();
        let resumed = mutated(&saved);
        assert!(first.0.is_some() && resumed.0.is_some(), "{first:?} {resumed:?}");
        assert_ne!(first.1, resumed.1, "the same draws as the first run's");
    }

    #[test]
    fn the_worst_take_a_best_policys_weights_and_everyone_outside_the_best_mutates() {
        let mut p = pbt(4, &FLAGS);
        let objectives = [Some(100.0), Some(20.0), Some(480.0), Some(500.0)];
        // Two best (3 and 2), two worst (0 and 1): policy 1 takes 2's or 3's weights and mutates.
        let d = p.on_progress(1, 200, 2000, &objectives).expect("due");
        let from = d.replace_from.expect("replaced");
        assert!(from == 2 || from == 3, "{d:?}");
        assert_ne!(d.after, d.before, "mutated (rate 1)");
        for ((name, a), (_, b)) in d.after.named().iter().zip(d.before.named()) {
            if *name == "gamma" || b == 0.0 {
                // Gamma is not optimised; a zero (CartPole's entropy and value clip) stays zero.
                assert_eq!(*a, b, "{name}");
            } else {
                let ratio = a / b;
                assert!(
                    (1.1..=1.5).contains(&ratio) || (1.0 / 1.5..=1.0 / 1.1).contains(&ratio),
                    "{name}: {ratio}"
                );
            }
        }
        assert_eq!((p.states()[1].updates, p.states()[1].replaced), (1, 1));
        // Policy 0, also among the worst, takes weights but never mutates.
        let d = p.on_progress(0, 200, 2000, &objectives).expect("due");
        assert!(d.replace_from.is_some());
        assert_eq!(d.after, d.before);
        // The best keep everything.
        let d = p.on_progress(3, 200, 2000, &objectives).expect("due");
        assert_eq!((d.replace_from, d.after), (None, d.before));
    }

    #[test]
    fn a_small_gap_keeps_the_weights_and_negative_returns_compare_by_magnitude() {
        let mut p = pbt(4, &FLAGS);
        // 5% apart: below the relative gap of 10%.
        let close = [Some(100.0), Some(95.0), Some(99.0), Some(100.0)];
        let d = p.on_progress(1, 200, 2000, &close).expect("due");
        assert_eq!(d.replace_from, None);
        assert_ne!(d.after, d.before, "outside the best: mutated all the same");
        // Negative returns: -500 against -20 is a large gap; -21 against -20 a small one.
        let d = p
            .on_progress(
                2,
                200,
                2000,
                &[Some(-20.0), Some(-19.0), Some(-500.0), Some(-30.0)],
            )
            .expect("due");
        assert!(d.replace_from.is_some(), "{d:?}");
        let d = p
            .on_progress(
                3,
                200,
                2000,
                &[Some(-20.0), Some(-20.5), Some(-20.2), Some(-21.0)],
            )
            .expect("due");
        assert_eq!(d.replace_from, None, "{d:?}");
    }

    #[test]
    fn gamma_mutates_through_one_minus_gamma_and_stays_in_range() {
        let cfg = crate::config::Config::for_env("CartPole-v1", &[]).expect("config");
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        let mut h = Hyper::of(&cfg);
        for _ in 0..200 {
            h = h.mutate(1.0, true, &mut rng);
            assert!((GAMMA_RANGE.0..=GAMMA_RANGE.1).contains(&h.gamma), "{}", h.gamma);
        }
        let mut applied = cfg.clone();
        h.apply(&mut applied.appo, &mut applied.learning, &mut applied.optimizer);
        assert_eq!(Hyper::of(&applied), h);
    }
}
