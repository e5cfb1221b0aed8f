//! The inference worker: every waiting request in, one batched forward pass per policy, actions
//! out, with the newest weights each policy's learner has published. Observations are read from,
//! and actions, log-probabilities, values and policy versions written into, the rollout workers'
//! trajectory slots; the answer (`actions_ready`) only says they are there.
//!
//! With several policies the worker holds one network per policy and reads which policy controls
//! each column ([`Field::Policy`]): the columns of each policy go through its network together,
//! and each column's results (and the version of the policy that chose them) go back in place.
//! A worker of one policy's group (`--policy_workers_per_policy`) holds only that policy's networks
//! and writes only their columns, beside the other policies' workers; the group of policy 0 also
//! writes the columns no network runs (agents that do not act, built-in players).
//!
//! A recurrent policy (`--use_rnn`) reads each column's state from the slot at the step ([`Field::States`]) and
//! writes the state after the step where the next step starts (at step `t + 1`, or [`Field::NextStates`] after
//! the last); the rollout worker zeroes it when the column's episode ends and carries it into the split's next
//! slot. The states live in the slots, so a replaced rollout worker's envs start again from zero.
//!
//! Weights come through a seqlock in shared memory ([`rlf_shm::SharedWeights`], one per policy):
//! before each batch the worker compares the published version with its own and, when newer,
//! copies the weights out (a read that overlaps a write is discarded and retried at the next
//! batch, never used).

use rlf_shm::{ReplayRing, SharedWeights};

use super::{ActionsReady, PolicyRequest, INACTIVE};
use crate::algo::ExplorationSchedule;
use crate::data::{Field, TrajectoryPool};
use crate::error::{Result, RlfError};
use crate::model::{ActOutput, Durations, Hold, Policy, PolicyWeights};

/// One policy's network and the weights it follows.
struct Served {
    /// The run's id of the network.
    network: usize,
    policy: Box<dyn Policy>,
    weights: SharedWeights,
    scratch: PolicyWeights,
    version: u64,
}

impl Served {
    /// Loads the published weights if they are newer than those in use.
    fn refresh(&mut self) -> Result<()> {
        if self.weights.version() <= self.version {
            return Ok(());
        }
        if let Ok(version) = self.weights.try_read(&mut self.scratch.values) {
            if version > self.version {
                self.policy.load_weights(&self.scratch)?;
                self.version = version;
            }
        }
        Ok(())
    }
}

/// Runs the policies for rollout workers and follows their learners' published weights.
pub struct InferenceWorker {
    served: Vec<Served>,
    /// Every rollout worker's trajectory pool, by worker index.
    pools: Vec<TrajectoryPool>,
    obs: Vec<f32>,
    /// A recurrent policy's states of every column of the batch.
    states: Vec<f32>,
    /// With several policies: each column's policy, and one policy's columns and observations.
    column_policies: Vec<f32>,
    rows: Vec<usize>,
    gathered: Vec<f32>,
    /// The run's networks (this worker serves all or some of them).
    num_networks: usize,
    /// Columns of one request whose results this worker writes, when it serves some networks only.
    own: Vec<usize>,
    /// Network ids past the run's networks that stand for built-in self-play opponents: their
    /// columns are left to the rollout workers.
    builtin: usize,
    /// Off-policy: each policy's replay buffer, whose insert count sets its ε.
    exploration: Option<Exploration>,
    /// εz-greedy (`--exploration_duration_mu`): the durations of exploratory actions, each column's action still
    /// to repeat (by rollout worker and split), and those of the batch's columns, in order.
    durations: Option<Durations>,
    holds: Vec<Vec<Vec<Hold>>>,
    held: Vec<Hold>,
    gathered_holds: Vec<Hold>,
}

/// ε-greedy exploration by each policy's progress: ε follows `--exploration_*` over the transitions in its replay
/// buffer so far.
pub struct Exploration {
    /// By policy.
    pub replays: Vec<ReplayRing>,
    /// The algorithm's schedule.
    pub schedule: ExplorationSchedule,
}

impl InferenceWorker {
    /// What the worker needs to continue exactly (a serial run's kept state): each network's action generator and
    /// the εz-greedy holds. The weights are not kept: the next batch reads the published ones.
    pub fn save_state(&self) -> Result<Vec<u8>> {
        let samplers = self
            .served
            .iter()
            .map(|s| {
                s.policy.sampler_state().ok_or_else(|| {
                    RlfError::Config(format!(
                        "network {} draws its actions from libtorch's generator, which keeps no state for an exact \
                         resume",
                        s.network
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        postcard::to_stdvec(&(samplers, &self.holds))
            .map_err(|e| RlfError::Config(format!("an inference worker's state does not encode: {e}")))
    }

    /// Continues from what [`save_state`](Self::save_state) kept.
    pub fn load_state(&mut self, state: &[u8]) -> Result<()> {
        let (samplers, holds): (Vec<Vec<u8>>, Vec<Vec<Vec<Hold>>>) =
            postcard::from_bytes(state).map_err(|e| {
                RlfError::Config(format!("an inference worker's kept state does not decode: {e}"))
            })?;
        if samplers.len() != self.served.len() {
            return Err(RlfError::Config(
                "an inference worker's kept state is of another number of networks".into(),
            ));
        }
        for (served, sampler) in self.served.iter_mut().zip(&samplers) {
            served.policy.load_sampler_state(sampler)?;
        }
        self.holds = holds;
        Ok(())
    }
}

impl std::fmt::Debug for InferenceWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InferenceWorker")
            .field("versions", &self.versions())
            .finish_non_exhaustive()
    }
}

impl InferenceWorker {
    /// An inference worker running `policies`, each at version 0 and following its own shared
    /// weights (policy `i` is `policies[i]`), for the rollout workers owning `pools` (by worker
    /// index).
    pub fn new(policies: Vec<(Box<dyn Policy>, SharedWeights)>, pools: Vec<TrajectoryPool>) -> Self {
        let num_networks = policies.len();
        let networks = policies
            .into_iter()
            .enumerate()
            .map(|(n, (policy, weights))| (n, policy, weights))
            .collect();
        Self::for_networks(networks, num_networks, pools)
    }

    /// An inference worker of one group: it runs the networks `networks` (each with the run's id of the network)
    /// of a run of `num_networks`, and writes only their columns (and, when it runs network 0, the columns of no
    /// network).
    pub fn for_networks(
        networks: Vec<(usize, Box<dyn Policy>, SharedWeights)>,
        num_networks: usize,
        pools: Vec<TrajectoryPool>,
    ) -> Self {
        let served = networks
            .into_iter()
            .map(|(network, policy, weights)| Served {
                network,
                scratch: PolicyWeights {
                    values: vec![0.0; weights.len()],
                },
                policy,
                weights,
                version: 0,
            })
            .collect();
        Self {
            served,
            pools,
            obs: Vec::new(),
            states: Vec::new(),
            column_policies: Vec::new(),
            rows: Vec::new(),
            gathered: Vec::new(),
            num_networks,
            own: Vec::new(),
            builtin: 0,
            exploration: None,
            durations: None,
            holds: Vec::new(),
            held: Vec::new(),
            gathered_holds: Vec::new(),
        }
    }

    /// Sets each policy's ε from its replay buffer before acting (and, with `--exploration_duration_mu`, repeats
    /// exploratory actions: εz-greedy). Each inference worker keeps the holds of the columns it answers: with several
    /// workers answering one split, a hold goes on only when its worker answers that split again.
    pub fn with_exploration(self, exploration: Exploration) -> Self {
        let mu = exploration.schedule.duration_mu;
        Self {
            durations: (mu > 0.0).then(|| Durations::zeta(mu)),
            exploration: Some(exploration),
            ..self
        }
    }

    /// Leaves the columns of `count` built-in opponents (network ids right past the run's
    /// networks) to the rollout workers, which take their moves from the env.
    pub fn with_builtin(self, count: usize) -> Self {
        Self {
            builtin: count,
            ..self
        }
    }

    /// The version of each policy's weights in use.
    pub fn versions(&self) -> Vec<u64> {
        self.served.iter().map(|s| s.version).collect()
    }

    /// Loads every policy's published weights that are newer than those in use (and, off-policy, sets its ε).
    pub fn refresh_weights(&mut self) -> Result<()> {
        if let Some(e) = &self.exploration {
            for served in &mut self.served {
                if let Some(replay) = e.replays.get(served.network) {
                    served
                        .policy
                        .set_exploration(e.schedule.epsilon(replay.inserted()));
                }
            }
        }
        self.served.iter_mut().try_for_each(Served::refresh)
    }

    /// Chooses actions for every request, one forward pass per policy, and writes them into the
    /// requesters' slots; returns one answer per request, in order. Requests of a worker process
    /// that has since been replaced get no answer (their slot may be the replacement's now).
    pub fn on_policy_requested(&mut self, requests: &[PolicyRequest]) -> Result<Vec<ActionsReady>> {
        self.refresh_weights()?;
        if self.served.is_empty() {
            return Err(protocol("an inference worker without a policy".into()));
        }
        // Slots are as wide as the largest agent's observation; with several networks each takes
        // the first values of its columns (agents that differ have policies of their own).
        let several = self.num_networks > 1;
        let width = self.pools.first().map_or(0, |p| p.shape().obs_dim);
        if let Some(s) = self.served.iter().find(|s| {
            let d = s.policy.obs_dim();
            d > width || (!several && d != width)
        }) {
            return Err(protocol(format!(
                "network {} takes observations of {} values, the slots hold {width}",
                s.network,
                s.policy.obs_dim()
            )));
        }
        // Action slots are as wide as the largest agent's action: each network writes the first values of its columns'.
        let a = self.action_width();
        if let Some(s) = self.served.iter().find(|s| {
            let d = s.policy.action_dim();
            d > a || (!several && d != a)
        }) {
            return Err(protocol(format!(
                "network {} chooses actions of {} values, the slots hold {a}",
                s.network,
                s.policy.action_dim()
            )));
        }
        let mut live = Vec::with_capacity(requests.len());
        let state_dim = self.served[0].policy.state_dim();
        self.obs.clear();
        self.states.clear();
        self.column_policies.clear();
        self.held.clear();
        for r in requests {
            let pool = self
                .pools
                .get(r.worker)
                .ok_or_else(|| protocol(format!("a request from unknown rollout worker {}", r.worker)))?;
            if pool.owner() != u64::from(r.incarnation) {
                continue;
            }
            let shape = pool.shape();
            if shape.obs_dim != width {
                return Err(protocol(format!(
                    "worker {}: observations of {} values, worker 0's of {width}",
                    r.worker, shape.obs_dim
                )));
            }
            let at = self.obs.len();
            self.obs.resize(at + shape.num_envs * width, 0.0);
            pool.get(r.buffer, Field::Obs, r.step, &mut self.obs[at..])?;
            if state_dim > 0 {
                if shape.state_dim != state_dim {
                    return Err(protocol(format!(
                        "worker {}: slots hold states of {} values, the policy's have {state_dim}",
                        r.worker, shape.state_dim
                    )));
                }
                let at = self.states.len();
                self.states.resize(at + shape.num_envs * state_dim, 0.0);
                pool.get(r.buffer, Field::States, r.step, &mut self.states[at..])?;
            }
            if several || self.durations.is_some() {
                let at = self.column_policies.len();
                self.column_policies.resize(at + shape.num_envs, 0.0);
                pool.get(r.buffer, Field::Policy, r.step, &mut self.column_policies[at..])?;
            }
            if self.durations.is_some() {
                self.held
                    .extend_from_slice(holds_of(&mut self.holds, r, shape.num_envs));
            }
            live.push((r, shape.num_envs));
        }
        if live.is_empty() {
            return Ok(Vec::new());
        }
        let (out, versions) = if several {
            self.act_per_policy(width)?
        } else {
            let served = &mut self.served[0];
            let out = match &self.durations {
                Some(d) => {
                    self.gathered_holds.clone_from(&self.held);
                    let out = served.policy.act_holding(&self.obs, &mut self.held, d)?;
                    // A column whose agent waits for its turn keeps its hold: only its own moves count it down.
                    for (c, _) in self
                        .column_policies
                        .iter()
                        .enumerate()
                        .filter(|(_, &p)| p == INACTIVE)
                    {
                        self.held[c] = self.gathered_holds[c];
                    }
                    out
                }
                None => served.policy.act_recurrent(&self.obs, &mut self.states, false)?,
            };
            (out, Vec::new())
        };
        if self.durations.is_some() {
            let mut at = 0;
            for &(r, n) in &live {
                holds_of(&mut self.holds, r, n).copy_from_slice(&self.held[at..at + n]);
                at += n;
            }
        }
        if self.served.len() < self.num_networks {
            return self.answer_own_columns(&live, &out, &versions);
        }
        let mut at = 0;
        let mut answers = Vec::with_capacity(live.len());
        for (r, n) in live {
            let pool = &self.pools[r.worker];
            pool.put(
                r.buffer,
                Field::Actions,
                r.step,
                &out.actions[at * a..(at + n) * a],
            )?;
            pool.put(r.buffer, Field::LogProbs, r.step, &out.log_probs[at..at + n])?;
            pool.put(r.buffer, Field::Values, r.step, &out.values[at..at + n])?;
            if state_dim > 0 {
                // The state after this step is where the next one starts.
                let states = &self.states[at * state_dim..(at + n) * state_dim];
                if r.step + 1 < pool.shape().rollout {
                    pool.put(r.buffer, Field::States, r.step + 1, states)?;
                } else {
                    pool.put(r.buffer, Field::NextStates, 0, states)?;
                }
            }
            if several {
                pool.put_versions(r.buffer, r.step, &versions[at..at + n])?;
            } else {
                pool.put_version(r.buffer, r.step, self.served[0].version)?;
            }
            at += n;
            answers.push(r.answer());
        }
        Ok(answers)
    }

    /// Values per action slot (the largest agent's action).
    fn action_width(&self) -> usize {
        self.pools.first().map_or(1, |p| p.shape().action_dim)
    }

    /// Writes the results of the columns this worker owns (see [`InferenceWorker::for_networks`]) of every request
    /// in `live` (with its column count), out of `out` and `versions` (every column's, in request order).
    fn answer_own_columns(
        &mut self,
        live: &[(&PolicyRequest, usize)],
        out: &ActOutput,
        versions: &[u64],
    ) -> Result<Vec<ActionsReady>> {
        let a = self.action_width();
        let state_dim = self.served[0].policy.state_dim();
        let rest = self.served.iter().any(|s| s.network == 0);
        let mut at = 0;
        let mut answers = Vec::with_capacity(live.len());
        let mut values = Vec::new();
        let mut chosen = Vec::new();
        for &(r, n) in live {
            let pool = &self.pools[r.worker];
            self.own.clear();
            self.own.extend((0..n).filter(|&c| {
                let p = self.column_policies[at + c];
                let network = p as usize;
                if p == INACTIVE || network >= self.num_networks {
                    rest
                } else {
                    self.served.iter().any(|s| s.network == network)
                }
            }));
            let mut put = |field: Field, width: usize, all: &[f32], step: usize| {
                values.clear();
                for &c in &self.own {
                    values.extend_from_slice(&all[(at + c) * width..(at + c + 1) * width]);
                }
                pool.put_columns(r.buffer, field, step, &self.own, &values)
            };
            put(Field::Actions, a, &out.actions, r.step)?;
            put(Field::LogProbs, 1, &out.log_probs, r.step)?;
            put(Field::Values, 1, &out.values, r.step)?;
            if state_dim > 0 {
                let (field, step) = if r.step + 1 < pool.shape().rollout {
                    (Field::States, r.step + 1)
                } else {
                    (Field::NextStates, 0)
                };
                put(field, state_dim, &self.states, step)?;
            }
            chosen.clear();
            chosen.extend(self.own.iter().map(|&c| versions[at + c]));
            pool.put_column_versions(r.buffer, r.step, &self.own, &chosen)?;
            at += n;
            answers.push(r.answer());
        }
        Ok(answers)
    }

    /// Runs each policy on the columns it controls; returns every column's results, in column
    /// order, and the version of the policy that chose each (zeros for built-in players' columns and
    /// for columns whose agent does not act).
    fn act_per_policy(&mut self, width: usize) -> Result<(ActOutput, Vec<u64>)> {
        let columns = self.column_policies.len();
        let a = self.action_width();
        let mut out = ActOutput {
            actions: vec![0.0; columns * a],
            log_probs: vec![0.0; columns],
            values: vec![0.0; columns],
        };
        let mut versions = vec![0; columns];
        if let Some(&bad) = self.column_policies.iter().find(|&&p| {
            p != INACTIVE && (p < 0.0 || p as usize >= self.num_networks + self.builtin || p.fract() != 0.0)
        }) {
            return Err(protocol(format!(
                "a column of network {bad}, but the run has {} networks and {} built-in players",
                self.num_networks, self.builtin
            )));
        }
        for served in &mut self.served {
            let p = served.network as f32;
            self.rows.clear();
            self.rows
                .extend((0..columns).filter(|&c| self.column_policies[c] == p));
            if self.rows.is_empty() {
                continue;
            }
            let obs_dim = served.policy.obs_dim();
            self.gathered.clear();
            for &c in &self.rows {
                self.gathered
                    .extend_from_slice(&self.obs[c * width..c * width + obs_dim]);
            }
            let part = match &self.durations {
                Some(d) => {
                    self.gathered_holds.clear();
                    self.gathered_holds
                        .extend(self.rows.iter().map(|&c| self.held[c]));
                    let part = served
                        .policy
                        .act_holding(&self.gathered, &mut self.gathered_holds, d)?;
                    for (&c, &h) in self.rows.iter().zip(&self.gathered_holds) {
                        self.held[c] = h;
                    }
                    part
                }
                None => served.policy.act(&self.gathered, false)?,
            };
            let d = served.policy.action_dim();
            for (i, &c) in self.rows.iter().enumerate() {
                out.actions[c * a..c * a + d].copy_from_slice(&part.actions[i * d..(i + 1) * d]);
                out.log_probs[c] = part.log_probs[i];
                out.values[c] = part.values[i];
                versions[c] = served.version;
            }
        }
        Ok((out, versions))
    }
}

/// The held exploratory actions of the `n` columns of `r`'s split, in `holds` (by rollout worker and split).
fn holds_of<'a>(holds: &'a mut Vec<Vec<Vec<Hold>>>, r: &PolicyRequest, n: usize) -> &'a mut [Hold] {
    if holds.len() <= r.worker {
        holds.resize_with(r.worker + 1, Vec::new);
    }
    let splits = &mut holds[r.worker];
    if splits.len() <= r.split {
        splits.resize_with(r.split + 1, Vec::new);
    }
    let held = &mut splits[r.split];
    held.resize(n, Hold::default());
    held
}

fn protocol(message: String) -> RlfError {
    RlfError::Protocol {
        component: "inference worker",
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, DeviceKind};
    use crate::data::{ObsLayout, TrajectoryShape};
    use crate::env::{EnvRegistry, EnvSpec};
    use crate::model::QNetwork;
    use crate::sampling::RolloutWorker;

    /// εz-greedy in a turn-based env (treasurehunt, 5 agents moving in turn, one Q-network, ε = 1): a column whose
    /// agent waits for its turn keeps its hold untouched, and the agent to move repeats its held action, counting
    /// it down, until the hold runs out.
    #[test]
    fn a_waiting_agent_keeps_its_exploratory_hold() {
        let cfg = Config::for_env(
            "treasurehunt",
            &[
                "algo = 'dqn'",
                "exploration_duration_mu = 1.5",
                "num_envs_per_worker = 2",
                "worker_num_splits = 1",
                "rollout = 8",
                "batch_size = 32",
            ],
        )
        .expect("config");
        let registry = EnvRegistry::with_builtin();
        let spec = EnvSpec::of(&registry, &cfg.env).expect("spec");
        let layout = ObsLayout::common(&spec.observation_spaces, spec.obs_dim);
        let columns = 2 * spec.num_agents;
        let shape = TrajectoryShape {
            rollout: 8,
            num_envs: columns,
            obs_dim: spec.obs_dim,
            action_dim: 1,
            state_dim: 0,
            obs_bytes: layout.bytes(),
        };
        let pool = TrajectoryPool::with_layout(shape, layout, 2).expect("pool");
        let reader = TrajectoryPool::open(&pool.handle()).expect("mapped");
        let mut q = QNetwork::new(
            &spec.observation_spaces[0],
            &spec.action_spaces[0],
            &cfg.model,
            false,
            DeviceKind::Cpu,
        )
        .expect("network");
        q.set_exploration(1.0);
        let weights = SharedWeights::create(q.weights().expect("weights").values.len()).expect("weights");
        let mut inference = InferenceWorker::new(
            vec![(Box::new(q), weights)],
            vec![TrajectoryPool::open(&pool.handle()).expect("mapped")],
        )
        .with_exploration(Exploration {
            replays: Vec::new(),
            schedule: crate::algo::algorithm("dqn")
                .expect("registered")
                .exploration(&cfg)
                .expect("ε-greedy"),
        });
        let mut worker = RolloutWorker::first_of(&cfg, &registry, pool);
        worker.start().expect("reset");
        let mut requests = worker.on_slots_reclaimed(0, &[0, 1]).expect("free slots");
        let (mut networks, mut actions) = (vec![0.0; columns], vec![0.0; columns]);
        let (mut repeats, mut waits) = (0, 0);
        for _ in 0..400 {
            let r = requests.pop().expect("a request");
            let before = holds_of(&mut inference.holds, &r, columns).to_vec();
            let answers = inference.on_policy_requested(&[r]).expect("actions");
            let after = holds_of(&mut inference.holds, &r, columns).to_vec();
            reader
                .get(r.buffer, Field::Policy, r.step, &mut networks)
                .expect("networks");
            reader
                .get(r.buffer, Field::Actions, r.step, &mut actions)
                .expect("actions");
            for c in 0..columns {
                if networks[c] == INACTIVE {
                    assert_eq!(after[c], before[c], "column {c} waits: its hold stays");
                    waits += 1;
                } else if before[c].steps > 0 {
                    assert_eq!(
                        actions[c], before[c].action as f32,
                        "column {c} repeats its held action"
                    );
                    assert_eq!(after[c].steps, before[c].steps - 1, "column {c} counts down");
                    repeats += 1;
                }
            }
            let outcome = worker.on_actions_ready(&answers[0]).expect("step");
            requests.extend(outcome.requests);
            if let Some(t) = outcome.trajectory {
                requests.extend(worker.on_buffer_released(t.buffer).expect("released"));
            }
        }
        assert!(
            repeats > 20 && waits > 1000,
            "{repeats} repeats, {waits} waiting columns"
        );
    }
}
