//! The rollout worker: envs in `worker_num_splits` groups; each group steps when its actions
//! arrive. A split writes its trajectory straight into a slot of the worker's shared-memory
//! [`TrajectoryPool`], step by step (see [`crate::data`]): observations before asking for
//! actions, which the inference worker writes into the same slot, then rewards and episode ends.
//! After `rollout` steps the slot is handed on and the split takes a free one; with none free it
//! waits until the batcher releases one (back-pressure).
//!
//! A worker starts with no free slot: its first message (`worker_started`) asks the batcher which
//! slots of its pool it does not hold, and the answer (`slots_reclaimed`) is its free list. So a
//! replacement process (after its predecessor died or hung) never writes into a slot the batcher
//! still reads, and releases addressed to the predecessor are ignored until the answer comes.
//! Requests carry the worker's incarnation (also recorded in the pool), so requests and answers
//! of the predecessor are ignored too.
//!
//! Multi-agent envs take one slot column per agent of each env ([`Envs`]): a column's step is
//! valid when its agent acted in it (a turn-based game's waiting player, an agent out until the
//! next episode write 0), and env frames count the agent steps taken (valid columns).
//!
//! With several policies (or self-play snapshots) each column records, at every step, the
//! network playing its agent ([`Field::Policy`]: a policy from a [`PolicyAssigner`], or a
//! snapshot from [`SelfPlay`]); an env's networks only change between two of its episodes.
//! Finished episodes and agent steps are reported per policy, for the agents its latest weights
//! played; self-play episodes against snapshots and built-in players are reported as games. The
//! columns a built-in player plays take its moves from the env
//! ([`Envs::builtin_action`]), written into the slot over what no inference worker computed.

use super::{
    ActionsReady, PolicyAssigner, PolicyRequest, RolloutReport, SelfPlay, SelfPlayGame, SnapshotTaken,
    TrajectoryReady,
};
use crate::config::Config;
use crate::data::{Field, SlotCopy, TrajectoryPool};
use crate::data::{KeptWindows, NStepAdder, TransitionLayout};
use crate::env::group::{close_unused, EnvGroup};
use crate::env::{ActionMapper, EnvRegistry, Envs, VecBuffers};
use crate::error::{Result, RlfError};
use crate::plan::RunPlan;
use rand::SeedableRng;
use rand_pcg::Pcg64Mcg;
use rlf_shm::{InsertError, ReplayRing};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

struct Split {
    envs: Envs,
    buf: VecBuffers,
    mapper: ActionMapper,
    /// The slot the current trajectory is written into (none: waiting for a free one).
    slot: Option<usize>,
    /// Steps of the current trajectory done.
    t: usize,
    /// Agent steps (valid columns) of the current trajectory.
    frames: u64,
    /// Trajectories handed on since the last policy update (sync mode pauses at `rounds_per_update`).
    since_update: usize,
    paused: bool,
    /// Answers still to come for the current step (one per group of inference workers asked).
    awaiting: usize,
    /// Scratch for one step: actions read from the slot, flags and final observations to write.
    actions: Vec<f32>,
    flags: Vec<f32>,
    final_obs: Vec<f32>,
    /// The policy controlling each column's agent.
    base: Vec<u32>,
    /// The network playing each column's agent (its policy's, or a self-play snapshot), and as
    /// written into the slot.
    policies: Vec<u32>,
    policy_values: Vec<f32>,
    assigner: PolicyAssigner,
    self_play: Option<SelfPlay>,
    /// Each env's self-play protagonist (agent index).
    protagonists: Vec<usize>,
    /// Each agent's team (self-play: teammates play with the protagonist).
    teams: Vec<usize>,
    /// The env's index of each built-in opponent (`--self_play_builtin_opponents`), and the
    /// randomness of their moves.
    builtin: Vec<usize>,
    builtin_rng: Pcg64Mcg,
    /// Columns whose agent's episode ended since its env last reset, with its return.
    ended: Vec<bool>,
    returns: Vec<f64>,
    /// Off-policy: each column's n-step adder, and the observations the last step started from.
    adders: Vec<NStepAdder>,
    prev_obs: Vec<f32>,
    /// With a recurrent policy: each column's state after the last trajectory (zeros at the
    /// start), which the next slot starts from, and scratch to keep and reset states.
    carry: Vec<f32>,
    states: Vec<f32>,
    before: Vec<f32>,
}

impl Split {
    /// The networks written into the slot with the next observations: each column's, or
    /// [`INACTIVE`] for a column whose agent does not act next (no network needs to run for it).
    fn refresh_policy_values(&mut self) {
        for (c, (v, &p)) in self.policy_values.iter_mut().zip(&self.policies).enumerate() {
            *v = if self.envs.acts_next(c) {
                p as f32
            } else {
                INACTIVE
            };
        }
    }

    /// Sets the networks of env `e`'s agents for its next episode from their policies (with
    /// self-play, a protagonist and its opponents).
    fn start_episode(&mut self, e: usize, num_agents: usize) {
        let columns = e * num_agents..(e + 1) * num_agents;
        match &mut self.self_play {
            Some(sp) => {
                self.protagonists[e] = sp.draw(
                    &self.base[columns.clone()],
                    &self.teams,
                    &mut self.policies[columns],
                )
            }
            None => self.policies[columns.clone()].copy_from_slice(&self.base[columns]),
        }
    }

    /// Replaces the actions of the columns that built-in players play (read from the slot, where
    /// no inference worker wrote them) with the players' moves; returns whether there were any.
    fn play_builtin(&mut self) -> bool {
        let Some(sp) = self.self_play.as_ref().filter(|_| !self.builtin.is_empty()) else {
            return false;
        };
        let dim = self.actions.len() / self.policies.len().max(1);
        let mut any = false;
        for (c, &network) in self.policies.iter().enumerate() {
            let Some(b) = sp.builtin(network) else {
                continue;
            };
            let action = self
                .envs
                .builtin_action(c, self.builtin[b], &mut self.builtin_rng);
            self.actions[c * dim] = action.unwrap_or(0) as f32;
            any = true;
        }
        any
    }

    /// Off-policy: feeds the last step of every column a trained policy plays to its n-step adder (its action from
    /// the observation it started from if its agent acted, its reward, its episode's end), whose finished rows go
    /// to the policy's buffer.
    fn add_transitions(&mut self, writer: &mut ReplayWriter, num_policies: usize) {
        let (n, width) = (self.adders.len(), self.envs.obs_dim());
        let dim = self.actions.len() / n.max(1);
        for c in 0..n {
            let p = self.policies[c] as usize;
            if p >= num_policies {
                continue;
            }
            let (adder, rows) = (&mut self.adders[c], &mut writer.rows[p]);
            let (obs_dim, action_dim) = (adder.obs_dim(), adder.action_dim().min(dim));
            if self.envs.acted(c) {
                let obs = &self.prev_obs[c * width..c * width + obs_dim];
                adder.act(obs, &self.actions[c * dim..c * dim + action_dim], rows);
            }
            adder.reward(self.buf.rewards[c]);
            if self.buf.terminated[c] || self.buf.truncated[c] {
                let last = self.envs.final_observation(c).map(|o| &o[..obs_dim]);
                adder.end_episode(self.buf.terminated[c], last, rows);
            }
        }
    }

    /// Off-policy, as the run stops: each column's n-step windows go to its policy's rows as those of a truncated
    /// episode, bootstrapping from the observation its agent acts on next. A column whose agent does not act next
    /// (its turn has not come) has no such observation: its windows are dropped.
    fn end_windows(&mut self, writer: &mut ReplayWriter, num_policies: usize) {
        let width = self.envs.obs_dim();
        for (c, adder) in self.adders.iter_mut().enumerate() {
            let p = self.policies[c] as usize;
            if p >= num_policies {
                continue;
            }
            let next = self
                .envs
                .acts_next(c)
                .then(|| &self.buf.obs[c * width..c * width + adder.obs_dim()]);
            adder.end_episode(false, next, &mut writer.rows[p]);
        }
    }

    /// Records the episode ends of the last step. An env whose agents have all ended reset: its
    /// self-play games are scored (the protagonist's return against each snapshot's), and its
    /// agents' networks for the next episode set.
    fn track_episode_ends(&mut self, num_agents: usize, games: &mut Vec<SelfPlayGame>) {
        for e in 0..self.ended.len() / num_agents.max(1) {
            let columns = e * num_agents..(e + 1) * num_agents;
            for c in columns.clone() {
                self.ended[c] |= self.buf.terminated[c] || self.buf.truncated[c];
            }
            if !self.ended[columns.clone()].iter().all(|&d| d) {
                continue;
            }
            self.ended[columns.clone()].fill(false);
            if let Some(sp) = &mut self.self_play {
                let hero = e * num_agents + self.protagonists[e];
                // One game per opposing team, scored by its first frozen member's return.
                let mut scored = Vec::new();
                let first = games.len();
                for c in columns.clone().filter(|&c| sp.is_frozen(self.policies[c])) {
                    let team = self.teams[c - e * num_agents];
                    if scored.contains(&team) {
                        continue;
                    }
                    scored.push(team);
                    let (mine, theirs) = (self.returns[hero], self.returns[c]);
                    games.push(SelfPlayGame {
                        policy: self.base[hero] as usize,
                        network: self.policies[c] as usize,
                        score: if mine > theirs {
                            1.0
                        } else if mine < theirs {
                            0.0
                        } else {
                            0.5
                        },
                    });
                }
                // The split's own draws weigh the snapshots by these scores (prioritised fictitious self-play).
                for game in &games[first..] {
                    sp.record(game.policy, game.network, game.score);
                }
            }
            let redrawn = self.assigner.on_episode_end(e, &mut self.base[columns]);
            if redrawn || self.self_play.is_some() {
                self.start_episode(e, num_agents);
            }
        }
    }
}

/// The network id a slot's `Policy` field holds for a column whose agent does not act at that
/// step: inference skips it (its step is invalid, in no policy's share).
pub const INACTIVE: f32 = -1.0;

/// What a rollout worker emits after a step.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// Requests for actions (none while paused in sync mode or waiting for a slot).
    pub requests: Vec<PolicyRequest>,
    /// A finished trajectory, in its slot.
    pub trajectory: Option<TrajectoryReady>,
    /// Progress since the last report, sent with each trajectory.
    pub report: Option<RolloutReport>,
}

/// A rollout worker's cumulative counts, kept in shared memory after every step so that they
/// outlive its process: a replacement continues them ([`WorkerCounts::inherit`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCounts {
    /// Trajectories finished and handed on.
    pub produced: u64,
    /// Env frames simulated.
    pub stepped_frames: u64,
    /// Env frames in trajectories handed on to the batcher.
    pub handed_frames: u64,
    /// Env frames dead processes had simulated but not handed on (unfinished trajectories).
    pub lost_frames: u64,
}

impl WorkerCounts {
    /// Words in shared memory.
    pub const LEN: usize = 4;

    /// As words, in field order.
    pub fn to_words(self) -> [u64; Self::LEN] {
        [
            self.produced,
            self.stepped_frames,
            self.handed_frames,
            self.lost_frames,
        ]
    }

    /// From words, in field order.
    pub fn from_words(w: [u64; Self::LEN]) -> Self {
        Self {
            produced: w[0],
            stepped_frames: w[1],
            handed_frames: w[2],
            lost_frames: w[3],
        }
    }

    /// The counts a replacement continues from: what its predecessor had not yet finished is lost.
    pub fn inherit(self) -> Self {
        Self {
            produced: self.produced,
            stepped_frames: self.stepped_frames,
            handed_frames: self.stepped_frames,
            lost_frames: self.lost_frames + self.stepped_frames.saturating_sub(self.handed_frames),
        }
    }
}

/// Simulates `num_envs_per_worker` envs for the sampler.
pub struct RolloutWorker {
    index: usize,
    rollout: usize,
    envs_per_split: usize,
    seed: u64,
    splits: Vec<Split>,
    report: RolloutReport,
    /// In sync mode, trajectories per split before waiting for a new policy; `None` in async mode.
    rounds_per_update: Option<usize>,
    /// Policies trained, and networks played (with self-play snapshots): with more than one
    /// network, columns record theirs.
    num_policies: usize,
    num_networks: usize,
    /// The group of inference workers of each network, and which groups a step asks.
    groups: Vec<usize>,
    asked: Vec<bool>,
    pool: TrajectoryPool,
    free: Vec<usize>,
    /// The split offered the next free slot first: the one after the split that took the last. When the learner
    /// holds the slots and frees them one at a time, each waiting split gets its turn; from the first split every
    /// time, the others would wait as long as the learner is the bottleneck, their envs standing still.
    turn: usize,
    /// The batcher's answer to `worker_started` (the free list) arrived.
    reclaimed: bool,
    incarnation: u32,
    counts: WorkerCounts,
    /// Off-policy: the replay buffers trajectories go into instead of the batcher.
    replay: Option<ReplayWriter>,
}

/// How long an insert into a rate-limited replay buffer waits before its writer checks that it was not told to stop.
const INSERT_WAIT: Duration = Duration::from_secs(1);

/// Where an off-policy rollout worker puts its agents' transitions: each policy's replay buffer, and the rows
/// waiting to go in (at the end of each trajectory).
pub struct ReplayWriter {
    /// By policy.
    pub rings: Vec<ReplayRing>,
    /// The rows of each policy's buffer.
    pub layouts: Vec<TransitionLayout>,
    /// `--n_step`.
    pub n_step: usize,
    /// `--gamma`.
    pub gamma: f64,
    rows: Vec<Vec<f32>>,
}

impl ReplayWriter {
    /// A writer into `rings` (by policy) of rows laid out by `layouts`, with `n_step`-step returns discounted by
    /// `gamma`.
    pub fn new(rings: Vec<ReplayRing>, layouts: Vec<TransitionLayout>, n_step: usize, gamma: f64) -> Self {
        let rows = vec![Vec::new(); rings.len()];
        Self {
            rings,
            layouts,
            n_step,
            gamma,
            rows,
        }
    }

    /// Inserts the waiting rows, waiting while a rate limit holds them back; `false` when the buffers were
    /// interrupted or closed, or this process was told to stop while it waited (the run is stopping: the rows wait
    /// for [`finish`](Self::finish)). The wait goes in steps of [`INSERT_WAIT`]: when the run's main process dies,
    /// its learner goes with it and no sample will let the rows in, so this worker's stop (the SIGTERM of its
    /// parent's death) must end it.
    fn flush(&mut self) -> Result<bool> {
        for (ring, rows) in self.rings.iter().zip(&mut self.rows) {
            let w = ring.row_words();
            while !rows.is_empty() {
                match ring.insert(rows, Some(Instant::now() + INSERT_WAIT)) {
                    Ok(_) => rows.clear(),
                    Err(InsertError::HeldBack { inserted }) => {
                        rows.drain(..inserted * w);
                        if rlf_signal::stop_requested() {
                            return Ok(false);
                        }
                    }
                    Err(InsertError::Interrupted { inserted } | InsertError::Closed { inserted }) => {
                        rows.drain(..inserted * w);
                        return Ok(false);
                    }
                    Err(e) => return Err(replay_error(e)),
                }
            }
        }
        Ok(true)
    }

    /// As the run stops: the rows still waiting go in past the rate limit and the close, and each buffer counts this
    /// writer finished, so that its learner's last save holds them (the learner waits for its writers).
    fn finish(&mut self) -> Result<()> {
        let deadline = Instant::now() + INSERT_WAIT;
        let mut failed = None;
        for (ring, rows) in self.rings.iter().zip(&mut self.rows) {
            if !rows.is_empty() {
                if let Err(e) = ring.insert_last(rows, Some(deadline)) {
                    failed.get_or_insert(replay_error(e));
                }
                rows.clear();
            }
            ring.finish_writer();
        }
        failed.map_or(Ok(()), Err)
    }
}

fn replay_error(e: InsertError) -> RlfError {
    RlfError::Protocol {
        component: "rollout worker",
        message: format!("replay buffer: {e}"),
    }
}

impl std::fmt::Debug for RolloutWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutWorker")
            .field("index", &self.index)
            .field("splits", &self.splits.len())
            .finish_non_exhaustive()
    }
}

/// A rollout worker's kept state ([`RolloutWorker::save_state`]).
#[derive(Serialize, Deserialize)]
struct KeptWorker {
    splits: Vec<KeptSplit>,
    report: RolloutReport,
    free: Vec<usize>,
    turn: usize,
    reclaimed: bool,
    counts: WorkerCounts,
    /// Off-policy: each policy's rows waiting to go into its buffer.
    rows: Vec<Vec<f32>>,
    pool: Vec<SlotCopy>,
}

/// A split's kept state (the scratch it rewrites at every step is left out).
#[derive(Serialize, Deserialize)]
struct KeptSplit {
    envs: Vec<u8>,
    obs: Vec<f32>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    slot: Option<usize>,
    t: usize,
    frames: u64,
    since_update: usize,
    paused: bool,
    awaiting: usize,
    actions: Vec<f32>,
    base: Vec<u32>,
    policies: Vec<u32>,
    policy_values: Vec<f32>,
    assigner: (Pcg64Mcg, Vec<u64>),
    protagonists: Vec<usize>,
    builtin_rng: Pcg64Mcg,
    ended: Vec<bool>,
    returns: Vec<f64>,
    windows: Vec<KeptWindows>,
    prev_obs: Vec<f32>,
    carry: Vec<f32>,
}

fn kept_error(e: &dyn std::fmt::Display) -> RlfError {
    RlfError::Protocol {
        component: "rollout worker",
        message: format!("kept state: {e}"),
    }
}

fn flags(dst: &mut [f32], src: &[bool]) {
    for (d, &b) in dst.iter_mut().zip(src) {
        *d = f32::from(u8::from(b));
    }
}

/// The seed of rollout worker `index`'s first env (the others follow it).
fn env_seed(cfg: &Config, index: usize) -> u64 {
    cfg.env.seed + (index * cfg.sampling.num_envs_per_worker) as u64
}

/// Sync mode: the rounds of a rollout worker between policy updates, each policy's dataset filling from its share of
/// the columns of the run's `workers` (`columns` per split).
fn sync_rounds(cfg: &Config, columns: usize, workers: usize) -> Option<usize> {
    let s = &cfg.sampling;
    let all = columns * s.worker_num_splits * workers;
    (!cfg.run.async_rl).then(|| (cfg.dataset_size() * s.num_policies / (all * s.rollout)).max(1))
}

impl RolloutWorker {
    /// Process `incarnation` of rollout worker `index` of the run `plan` plans, with envs
    /// from `registry`, continuing `counts`. Its trajectories go into `pool` (which it marks as
    /// its own), whose free slots it learns from [`on_slots_reclaimed`](Self::on_slots_reclaimed).
    /// With `group` (an env group's lead rank) each split's envs are stepped over the group's ranks.
    pub fn new(
        index: usize,
        plan: &RunPlan,
        registry: &EnvRegistry,
        pool: TrajectoryPool,
        incarnation: u32,
        counts: WorkerCounts,
        group: Option<&EnvGroup>,
    ) -> Result<Self> {
        let cfg = &plan.config;
        let s = &cfg.sampling;
        let per_split = s.num_envs_per_worker / s.worker_num_splits;
        // An env group's splits first: when one fails, the later ones are closed so that no member waits for them
        // (the splits made are closed as they are dropped).
        let mut in_group = Vec::new();
        if let Some(group) = group {
            let channels = index * s.worker_num_splits..(index + 1) * s.worker_num_splits;
            for channel in channels.clone() {
                match Envs::make_in_group(registry, &cfg.env, per_split, group, channel) {
                    Ok(envs) => in_group.push(envs),
                    Err(e) => {
                        for later in channel + 1..channels.end {
                            let _ = close_unused(group, later);
                        }
                        return Err(e);
                    }
                }
            }
        }
        let mut in_group = in_group.into_iter();
        let mut splits = Vec::with_capacity(s.worker_num_splits);
        for k in 0..s.worker_num_splits {
            let envs = match in_group.next() {
                Some(envs) => envs,
                None => Envs::make(registry, &cfg.env, per_split)?,
            };
            let first_env = index * s.num_envs_per_worker + k * per_split;
            let num_agents = envs.num_agents();
            let mut assigner = PolicyAssigner::new(
                &plan.mapping,
                num_agents,
                per_split,
                first_env,
                cfg.env.seed + first_env as u64,
            );
            let mapper = ActionMapper::for_agents(
                &envs.action_spaces(),
                plan.algorithm()?.continuous_action_mode(cfg),
            )?;
            let (shape, columns) = (pool.shape(), envs.num_columns());
            if shape.num_envs != columns
                || shape.obs_dim != envs.obs_dim()
                || shape.rollout != s.rollout
                || shape.action_dim != mapper.action_dim()
            {
                return Err(RlfError::Protocol {
                    component: "rollout worker",
                    message: format!(
                        "worker {index}: the trajectory pool's slots do not fit {per_split} envs ({columns} columns)"
                    ),
                });
            }
            let mut base = vec![0; columns];
            for (e, chunk) in base.chunks_mut(num_agents).enumerate() {
                assigner.assign(e, chunk);
            }
            let builtin = cfg
                .builtin_opponents()
                .iter()
                .map(|&name| {
                    envs.builtin_players()
                        .iter()
                        .position(|&p| p == name)
                        .ok_or_else(|| {
                            RlfError::Config(format!(
                                "--self_play_builtin_opponents: {} has no built-in player `{name}`",
                                cfg.env.env
                            ))
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            let self_play = s.self_play.then(|| {
                SelfPlay::new(
                    s.num_policies,
                    s.opponent_pool_size,
                    s.self_play_latest_prob,
                    cfg.env.seed + first_env as u64,
                )
                .with_builtin(builtin.len(), s.self_play_builtin_prob)
                .with_pfsp(s.self_play_pfsp_power)
                .with_exploiters(s.self_play_exploiters, s.self_play_exploiter_prob)
            });
            let mut split = Split {
                adders: Vec::new(),
                prev_obs: Vec::new(),
                policy_values: vec![0.0; columns],
                policies: base.clone(),
                base,
                assigner,
                self_play,
                protagonists: vec![0; per_split],
                teams: plan.teams.clone(),
                builtin,
                builtin_rng: Pcg64Mcg::seed_from_u64(
                    (cfg.env.seed + first_env as u64) ^ 0xb117_1a00_0000_0001,
                ),
                ended: vec![false; columns],
                returns: vec![0.0; columns],
                buf: VecBuffers::new(columns, envs.obs_dim()),
                actions: vec![0.0; columns * shape.action_dim],
                flags: vec![0.0; columns],
                final_obs: vec![0.0; columns * envs.obs_dim()],
                carry: vec![0.0; columns * shape.state_dim],
                states: vec![0.0; columns * shape.state_dim],
                before: vec![0.0; columns * shape.state_dim],
                envs,
                mapper,
                slot: None,
                t: 0,
                frames: 0,
                since_update: 0,
                paused: false,
                awaiting: 0,
            };
            for e in 0..per_split {
                split.start_episode(e, num_agents);
            }
            split.refresh_policy_values();
            splits.push(split);
        }
        let rounds_per_update = sync_rounds(cfg, pool.shape().num_envs, s.num_workers);
        pool.set_owner(incarnation);
        Ok(Self {
            index,
            rollout: s.rollout,
            envs_per_split: per_split,
            seed: env_seed(cfg, index),
            splits,
            report: RolloutReport::new(index, s.num_policies),
            rounds_per_update,
            num_policies: s.num_policies,
            num_networks: cfg.num_networks(),
            groups: (0..cfg.num_networks())
                .map(|n| cfg.inference_group_of_network(n))
                .collect(),
            asked: vec![false; cfg.inference_groups()],
            free: Vec::new(),
            turn: 0,
            reclaimed: false,
            incarnation,
            counts,
            pool,
            replay: None,
        })
    }

    /// Rollout worker `global` of a run spread over machines (an MPI actor rank's worker), among the `workers` that
    /// feed its learner: its envs are seeded as worker `global` of one machine would be (no two actor ranks step the
    /// same episodes), and in sync mode its share of each dataset is its share of those workers' columns. (The
    /// policy mapping's random draws keep the rank's own index: a run under MPI has one policy.)
    pub fn in_run(mut self, cfg: &Config, global: usize, workers: usize) -> Self {
        self.seed = env_seed(cfg, global);
        self.rounds_per_update = sync_rounds(cfg, self.pool.shape().num_envs, workers);
        self
    }

    /// Off-policy: every agent step of a trained policy goes, as n-step transitions, into that policy's replay
    /// buffer through `writer`; a finished trajectory's slot is free again at once (no batcher reads it).
    pub fn with_replay(mut self, writer: ReplayWriter) -> Self {
        for split in &mut self.splits {
            let columns = split.base.len();
            split.adders = split
                .base
                .iter()
                .map(|&p| {
                    let layout = &writer.layouts[(p as usize).min(writer.layouts.len() - 1)];
                    NStepAdder::new(layout.clone(), writer.n_step, writer.gamma)
                })
                .collect();
            split.prev_obs = vec![0.0; columns * split.envs.obs_dim()];
        }
        self.replay = Some(writer);
        self
    }

    /// Off-policy, as the run stops: every transition this worker holds (the rows of its current trajectories and
    /// its n-step windows, ended as truncated) goes into the replay buffers, which count it finished. Nothing
    /// on-policy.
    pub fn finish_replay(&mut self) -> Result<()> {
        let Some(writer) = &mut self.replay else {
            return Ok(());
        };
        for split in &mut self.splits {
            split.end_windows(writer, self.num_policies);
        }
        writer.finish()
    }

    /// Off-policy, as a serial run that keeps its state stops: the buffers count this worker finished, and the rows
    /// and n-step windows it holds stay in its kept state ([`save_state`](Self::save_state)) rather than going in
    /// as those of truncated episodes.
    pub fn finish_kept(&mut self) {
        if let Some(writer) = &self.replay {
            for ring in &writer.rings {
                ring.finish_writer();
            }
        }
    }

    /// Everything the worker needs to continue exactly (a serial run's kept state): its envs, each split's step,
    /// slot, buffers, random draws and n-step windows, its free slots, counts and waiting replay rows, and what
    /// its trajectory pool's slots hold.
    pub fn save_state(&self) -> Result<Vec<u8>> {
        if self.splits.iter().any(|s| s.self_play.is_some()) {
            return Err(RlfError::Config(
                "a self-play run keeps no state for an exact resume".into(),
            ));
        }
        let splits = self
            .splits
            .iter()
            .map(|s| {
                let mut envs = Vec::new();
                s.envs.save_state(&mut envs)?;
                Ok(KeptSplit {
                    envs,
                    obs: s.buf.obs.clone(),
                    rewards: s.buf.rewards.clone(),
                    terminated: s.buf.terminated.clone(),
                    truncated: s.buf.truncated.clone(),
                    slot: s.slot,
                    t: s.t,
                    frames: s.frames,
                    since_update: s.since_update,
                    paused: s.paused,
                    awaiting: s.awaiting,
                    actions: s.actions.clone(),
                    base: s.base.clone(),
                    policies: s.policies.clone(),
                    policy_values: s.policy_values.clone(),
                    assigner: s.assigner.kept(),
                    protagonists: s.protagonists.clone(),
                    builtin_rng: s.builtin_rng.clone(),
                    ended: s.ended.clone(),
                    returns: s.returns.clone(),
                    windows: s.adders.iter().map(NStepAdder::kept).collect(),
                    prev_obs: s.prev_obs.clone(),
                    carry: s.carry.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let kept = KeptWorker {
            splits,
            report: self.report.clone(),
            free: self.free.clone(),
            turn: self.turn,
            reclaimed: self.reclaimed,
            counts: self.counts,
            rows: self.replay.as_ref().map(|w| w.rows.clone()).unwrap_or_default(),
            pool: (0..self.pool.num_buffers())
                .map(|b| self.pool.read_slot(b))
                .collect::<Result<_>>()?,
        };
        postcard::to_stdvec(&kept).map_err(|e| kept_error(&e))
    }

    /// Continues from what [`save_state`](Self::save_state) kept, in a worker built from the same config.
    pub fn load_state(&mut self, state: &[u8]) -> Result<()> {
        let kept: KeptWorker = postcard::from_bytes(state).map_err(|e| kept_error(&e))?;
        if kept.splits.len() != self.splits.len() || kept.pool.len() != self.pool.num_buffers() {
            return Err(kept_error(&"it is of another number of splits or slots"));
        }
        for (s, k) in self.splits.iter_mut().zip(kept.splits) {
            let mut envs = &k.envs[..];
            s.envs.load_state(&mut envs)?;
            let same = |a: usize, b: usize| {
                if a == b {
                    Ok(())
                } else {
                    Err(kept_error(&"its splits are of another size"))
                }
            };
            same(k.obs.len(), s.buf.obs.len())?;
            same(k.windows.len(), s.adders.len())?;
            (s.buf.obs, s.buf.rewards, s.buf.terminated, s.buf.truncated) =
                (k.obs, k.rewards, k.terminated, k.truncated);
            (s.slot, s.t, s.frames, s.since_update, s.paused, s.awaiting) =
                (k.slot, k.t, k.frames, k.since_update, k.paused, k.awaiting);
            (s.actions, s.base, s.policies, s.policy_values) =
                (k.actions, k.base, k.policies, k.policy_values);
            s.assigner.restore(k.assigner);
            (s.protagonists, s.builtin_rng, s.ended, s.returns) =
                (k.protagonists, k.builtin_rng, k.ended, k.returns);
            for (adder, windows) in s.adders.iter_mut().zip(k.windows) {
                adder.restore(windows);
            }
            (s.prev_obs, s.carry) = (k.prev_obs, k.carry);
        }
        (self.report, self.free, self.turn, self.reclaimed, self.counts) =
            (kept.report, kept.free, kept.turn, kept.reclaimed, kept.counts);
        if let Some(writer) = &mut self.replay {
            if kept.rows.len() == writer.rows.len() {
                writer.rows = kept.rows;
            }
        }
        for (b, slot) in kept.pool.iter().enumerate() {
            self.pool.write_slot(b, slot)?;
        }
        Ok(())
    }

    /// This worker's counts so far.
    pub fn counts(&self) -> WorkerCounts {
        self.counts
    }

    /// Writes split `k`'s observations at its current step and asks for actions: one request per group of
    /// inference workers whose networks play one of its agents, and always one to group 0.
    fn request(&mut self, k: usize, out: &mut Vec<PolicyRequest>) -> Result<()> {
        let split = &mut self.splits[k];
        let Some(buffer) = split.slot else {
            return Err(RlfError::Protocol {
                component: "rollout worker",
                message: format!("worker {} split {k}: a request without a slot", self.index),
            });
        };
        self.pool.put(buffer, Field::Obs, split.t, &split.buf.obs)?;
        // Which network plays each column, and which columns wait for their turn (`INACTIVE`): inference runs each
        // network on its columns, and keeps a waiting column's εz-greedy hold.
        if self.num_networks > 1 || split.envs.num_agents() > 1 {
            self.pool
                .put(buffer, Field::Policy, split.t, &split.policy_values)?;
        }
        self.asked.fill(false);
        self.asked[0] = true;
        if self.asked.len() > 1 {
            for &v in &split.policy_values {
                if let Some(&g) = (v >= 0.0).then(|| self.groups.get(v as usize)).flatten() {
                    self.asked[g] = true;
                }
            }
        }
        split.awaiting = 0;
        for (group, _) in self.asked.iter().enumerate().filter(|(_, &a)| a) {
            split.awaiting += 1;
            out.push(PolicyRequest {
                worker: self.index,
                split: k,
                incarnation: self.incarnation,
                buffer,
                step: split.t,
                group,
            });
        }
        Ok(())
    }

    /// Splits without a slot that may run (not paused) take a free slot, if any, in turn from
    /// [`turn`](Self::turn), and ask for actions for their first step.
    fn resume(&mut self) -> Result<Vec<PolicyRequest>> {
        let mut requests = Vec::new();
        let (n, first) = (self.splits.len(), self.turn);
        for k in (0..n).map(|i| (first + i) % n) {
            let split = &self.splits[k];
            if split.slot.is_some() || split.paused {
                continue;
            }
            let Some(buffer) = self.free.pop() else {
                break;
            };
            self.turn = (k + 1) % n;
            let split = &mut self.splits[k];
            split.slot = Some(buffer);
            split.t = 0;
            split.frames = 0;
            self.pool.put(buffer, Field::States, 0, &split.carry)?;
            self.request(k, &mut requests)?;
        }
        Ok(requests)
    }

    /// Resets every env (env `i` of the worker seeded `seed + i`). The first requests go out
    /// once the free slots are known ([`on_slots_reclaimed`](Self::on_slots_reclaimed)).
    pub fn start(&mut self) -> Result<()> {
        let mut offset = self.seed;
        for split in &mut self.splits {
            split.envs.reset(Some(offset), &mut split.buf.obs)?;
            split.refresh_policy_values();
            offset += self.envs_per_split as u64;
        }
        Ok(())
    }

    /// Slot of `actions_ready`: reads the actions of the split from its slot, steps its envs,
    /// records the step, and says what to emit.
    pub fn on_actions_ready(&mut self, actions: &ActionsReady) -> Result<StepOutcome> {
        if actions.worker != self.index || actions.incarnation != self.incarnation {
            return Ok(StepOutcome::default());
        }
        let k = actions.split;
        let (index, rollout) = (self.index, self.rollout);
        let protocol = |message: String| RlfError::Protocol {
            component: "rollout worker",
            message: format!("worker {index} split {k}: {message}"),
        };
        let Some(split) = self.splits.get_mut(k) else {
            return Err(protocol("no such split".into()));
        };
        let Some(buffer) = split.slot else {
            return Err(protocol("actions for a split without a slot".into()));
        };
        if split.awaiting == 0 {
            return Err(protocol("actions that were not asked for".into()));
        }
        split.awaiting -= 1;
        if split.awaiting > 0 {
            return Ok(StepOutcome::default());
        }
        let t = split.t;
        let n = split.envs.num_columns();
        self.pool.get(buffer, Field::Actions, t, &mut split.actions)?;
        if split.play_builtin() {
            self.pool.put(buffer, Field::Actions, t, &split.actions)?;
        }
        if self.replay.is_some() {
            split.prev_obs.copy_from_slice(&split.buf.obs);
        }
        let env_actions = split.mapper.map(&split.actions);
        split.envs.step(env_actions, split.buf.view())?;

        self.pool.put(buffer, Field::Rewards, t, &split.buf.rewards)?;
        flags(&mut split.flags, &split.buf.terminated);
        self.pool.put(buffer, Field::Terminated, t, &split.flags)?;
        flags(&mut split.flags, &split.buf.truncated);
        self.pool.put(buffer, Field::Truncated, t, &split.flags)?;
        let mut frames = 0;
        for (c, valid) in split.flags.iter_mut().enumerate() {
            let acted = split.envs.acted(c);
            *valid = f32::from(u8::from(acted));
            frames += u64::from(acted);
            if acted && self.num_networks > 1 {
                if let Some(f) = self.report.policy_frames.get_mut(split.policies[c] as usize) {
                    *f += 1;
                }
            }
        }
        self.pool.put(buffer, Field::Valid, t, &split.flags)?;
        let obs_dim = split.buf.obs.len() / n.max(1);
        split.flags.fill(0.0);
        split.final_obs.fill(0.0);
        for i in 0..n {
            if split.buf.truncated[i] {
                if let Some(last) = split.envs.final_observation(i) {
                    split.flags[i] = 1.0;
                    split.final_obs[i * obs_dim..(i + 1) * obs_dim].copy_from_slice(last);
                }
            }
            if let Some(ep) = split.envs.finished(i) {
                split.returns[i] = ep.episode_return;
                // A snapshot's episodes are not its policy's.
                if (split.policies[i] as usize) < self.num_policies {
                    self.report.episode_returns.push(ep.episode_return);
                    self.report
                        .episode_objectives
                        .push(ep.true_objective.unwrap_or(ep.episode_return));
                    self.report.episode_lengths.push(ep.length);
                    self.report.episode_policies.push(split.policies[i] as usize);
                    self.report
                        .episode_agents
                        .push(i % split.envs.num_agents().max(1));
                }
            }
        }
        if self.num_networks > 1 {
            split.track_episode_ends(split.envs.num_agents(), &mut self.report.games);
            split.refresh_policy_values();
        }
        self.pool.put(buffer, Field::HasFinal, t, &split.flags)?;
        self.pool.put(buffer, Field::FinalObs, t, &split.final_obs)?;
        let state_dim = self.pool.shape().state_dim;
        if state_dim > 0 {
            // Where the next step starts (the inference worker wrote the state after this step's
            // actions): an agent that did not act keeps the state it had, and a new episode starts
            // from a zero state.
            let (field, at) = if t + 1 < rollout {
                (Field::States, t + 1)
            } else {
                (Field::NextStates, 0)
            };
            self.pool.get(buffer, field, at, &mut split.states)?;
            if (0..n).any(|c| !split.envs.acted(c)) {
                self.pool.get(buffer, Field::States, t, &mut split.before)?;
            }
            for (c, state) in split.states.chunks_mut(state_dim).enumerate() {
                if !split.envs.acted(c) {
                    state.copy_from_slice(&split.before[c * state_dim..(c + 1) * state_dim]);
                }
                if split.buf.terminated[c] || split.buf.truncated[c] {
                    state.fill(0.0);
                }
            }
            self.pool.put(buffer, field, at, &split.states)?;
            if t + 1 == rollout {
                split.carry.copy_from_slice(&split.states);
            }
        }
        if let Some(writer) = &mut self.replay {
            split.add_transitions(writer, self.num_policies);
        }
        split.t += 1;
        split.frames += frames;
        self.report.env_frames += frames;
        self.counts.stepped_frames += frames;

        let mut outcome = StepOutcome::default();
        if split.t < rollout {
            self.request(k, &mut outcome.requests)?;
            return Ok(outcome);
        }
        if let Some(writer) = &mut self.replay {
            split.slot = None;
            self.counts.produced += 1;
            self.counts.handed_frames += split.frames;
            self.free.push(buffer);
            if writer.flush()? {
                outcome.requests = self.resume()?;
            }
            outcome.report = Some(self.take_report());
            return Ok(outcome);
        }
        self.pool.put(buffer, Field::NextObs, 0, &split.buf.obs)?;
        for (c, acts) in split.flags.iter_mut().enumerate() {
            *acts = f32::from(u8::from(split.envs.acts_next(c)));
        }
        self.pool.put(buffer, Field::NextValid, 0, &split.flags)?;
        split.slot = None;
        split.since_update += 1;
        if self.rounds_per_update.is_some_and(|r| split.since_update >= r) {
            split.paused = true;
        }
        self.counts.produced += 1;
        self.counts.handed_frames += split.frames;
        outcome.trajectory = Some(TrajectoryReady {
            worker: self.index,
            split: k,
            buffer,
        });
        outcome.report = Some(self.take_report());
        outcome.requests = self.resume()?;
        Ok(outcome)
    }

    /// The progress since the last report, sent with each trajectory.
    fn take_report(&mut self) -> RolloutReport {
        let mut report = std::mem::replace(
            &mut self.report,
            RolloutReport::new(self.index, self.num_policies),
        );
        if self.num_networks == 1 {
            report.policy_frames[0] = report.env_frames;
        }
        report
    }

    /// Slot of `snapshot_taken`: a policy's pool holds one more snapshot to draw opponents from.
    pub fn on_snapshot_taken(&mut self, taken: &SnapshotTaken) {
        for split in &mut self.splits {
            if let Some(sp) = &mut split.self_play {
                sp.on_snapshot_taken(taken.policy, taken.slot);
            }
        }
    }

    /// Slot of `policy_updated`: in sync mode, resumes the splits waiting for a new policy.
    pub fn on_policy_updated(&mut self) -> Result<Vec<PolicyRequest>> {
        for split in &mut self.splits {
            split.since_update = 0;
            split.paused = false;
        }
        if !self.reclaimed {
            return Ok(Vec::new());
        }
        self.resume()
    }

    /// Slot of `buffer_released`: the slot is free again; a split waiting for one takes it.
    /// Ignored until the free list came ([`on_slots_reclaimed`](Self::on_slots_reclaimed) counts it).
    pub fn on_buffer_released(&mut self, buffer: usize) -> Result<Vec<PolicyRequest>> {
        if !self.reclaimed {
            return Ok(Vec::new());
        }
        let in_use = self.splits.iter().any(|s| s.slot == Some(buffer));
        if buffer >= self.pool.num_buffers() || self.free.contains(&buffer) || in_use {
            return Err(RlfError::Protocol {
                component: "rollout worker",
                message: format!("worker {}: buffer {buffer} released but not in use", self.index),
            });
        }
        self.free.push(buffer);
        self.resume()
    }

    /// Slot of `slots_reclaimed`: the free list (slots the batcher does not hold); the splits
    /// take their first slots from it.
    pub fn on_slots_reclaimed(&mut self, incarnation: u32, free: &[usize]) -> Result<Vec<PolicyRequest>> {
        if incarnation != self.incarnation || self.reclaimed {
            return Ok(Vec::new());
        }
        let n = self.pool.num_buffers();
        let mut free = free.to_vec();
        free.sort_unstable_by(|a, b| b.cmp(a));
        free.dedup();
        if free.iter().any(|&b| b >= n) {
            return Err(RlfError::Protocol {
                component: "rollout worker",
                message: format!("worker {}: reclaimed slots {free:?} outside its {n}", self.index),
            });
        }
        self.free = free;
        self.reclaimed = true;
        self.resume()
    }
}

#[cfg(test)]
impl RolloutWorker {
    /// Rollout worker 0 of a run of `cfg` (planned against `registry`), writing into `pool`: the unit tests' worker.
    pub(crate) fn first_of(cfg: &Config, registry: &EnvRegistry, pool: TrajectoryPool) -> Self {
        let plan = RunPlan::resolve(cfg, registry).expect("plan");
        RolloutWorker::new(0, &plan, registry, pool, 0, WorkerCounts::default(), None).expect("worker")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::TrajectoryShape;

    /// A real rollout worker and inference worker of a recurrent policy (GRUs of 3 units) on `env`: `envs` envs in
    /// one split, two 8-step slots laid out as a run's would be (byte parts as bytes), both free; `prepare` gets the
    /// pool and the state size before the worker takes the pool.
    struct RecurrentRig {
        state_dim: usize,
        reader: TrajectoryPool,
        inference: crate::sampling::InferenceWorker,
        worker: RolloutWorker,
        requests: Vec<PolicyRequest>,
    }

    fn recurrent_rig(env: &str, envs: usize, prepare: impl FnOnce(&TrajectoryPool, usize)) -> RecurrentRig {
        use crate::data::ObsLayout;
        use crate::model::{ActorCritic, Policy};
        use crate::sampling::InferenceWorker;

        let envs_flag = format!("num_envs_per_worker = {envs}");
        let cfg = Config::for_env(
            env,
            &[
                "use_rnn = true",
                "rnn_size = 3",
                &envs_flag,
                "worker_num_splits = 1",
                "rollout = 8",
                "batch_size = 32",
            ],
        )
        .expect("config");
        let registry = EnvRegistry::with_builtin();
        tch::manual_seed(0);
        let spec = crate::env::EnvSpec::of(&registry, &cfg.env).expect("spec");
        let model = ActorCritic::new(
            &spec.observation_spaces[0],
            &spec.action_spaces[0],
            &cfg.model,
            crate::config::DeviceKind::Cpu,
        )
        .expect("model");
        let d = Policy::state_dim(&model);
        let layout = ObsLayout::common(&spec.observation_spaces, spec.obs_dim);
        let shape = TrajectoryShape {
            rollout: 8,
            num_envs: envs * spec.num_agents,
            obs_dim: spec.obs_dim,
            action_dim: 1,
            state_dim: d,
            obs_bytes: layout.bytes(),
        };
        let pool = TrajectoryPool::with_layout(shape, layout, 2).expect("pool");
        let reader = TrajectoryPool::open(&pool.handle()).expect("mapped");
        prepare(&reader, d);
        let weights =
            rlf_shm::SharedWeights::create(model.weights().expect("weights").values.len()).expect("weights");
        let inference = InferenceWorker::new(
            vec![(Box::new(model), weights)],
            vec![TrajectoryPool::open(&pool.handle()).expect("mapped")],
        );
        let mut worker = RolloutWorker::first_of(&cfg, &registry, pool);
        worker.start().expect("reset");
        let requests = worker.on_slots_reclaimed(0, &[0, 1]).expect("free slots");
        RecurrentRig {
            state_dim: d,
            reader,
            inference,
            worker,
            requests,
        }
    }

    /// With a group of inference workers per policy (Connect Four, one policy per player): a split asks group 0
    /// always and the group of each other policy whose agent acts next, steps only once every group it asked has
    /// answered, and no group writes over another's columns (the versions in the slot say whose weights chose
    /// each column's action: policy 0's are at version 10, policy 1's at 11, and columns that do not act get 0).
    #[test]
    fn a_split_asks_each_policys_inference_group_and_steps_after_the_last_answer() {
        use crate::data::ObsLayout;
        use crate::model::{ActorCritic, Policy};
        use crate::sampling::InferenceWorker;

        let cfg = Config::for_env(
            "connect_four",
            &[
                "num_policies = 2",
                "agent_policy_map = 'player_0=0,player_1=1'",
                "num_envs_per_worker = 2",
                "worker_num_splits = 1",
                "rollout = 8",
                "batch_size = 32",
            ],
        )
        .expect("config");
        assert_eq!(cfg.inference_groups(), 2);
        let registry = EnvRegistry::with_builtin();
        let spec = crate::env::EnvSpec::of(&registry, &cfg.env).expect("spec");
        let layout = ObsLayout::common(&spec.observation_spaces, spec.obs_dim);
        let shape = TrajectoryShape {
            rollout: 8,
            num_envs: 2 * spec.num_agents,
            obs_dim: spec.obs_dim,
            action_dim: 1,
            state_dim: 0,
            obs_bytes: layout.bytes(),
        };
        let pool = TrajectoryPool::with_layout(shape, layout, 2).expect("pool");
        let reader = TrajectoryPool::open(&pool.handle()).expect("mapped");
        let mut groups: Vec<InferenceWorker> = (0..2)
            .map(|network| {
                let model = ActorCritic::new(
                    &spec.observation_spaces[network],
                    &spec.action_spaces[network],
                    &cfg.model,
                    crate::config::DeviceKind::Cpu,
                )
                .expect("model");
                let values = model.weights().expect("weights").values;
                let weights = rlf_shm::SharedWeights::create(values.len()).expect("weights");
                weights.publish(10 + network as u64, &values);
                let served: Box<dyn Policy> = Box::new(model);
                InferenceWorker::for_networks(
                    vec![(network, served, weights)],
                    2,
                    vec![TrajectoryPool::open(&pool.handle()).expect("mapped")],
                )
            })
            .collect();
        let mut worker = RolloutWorker::first_of(&cfg, &registry, pool);
        worker.start().expect("reset");
        let mut requests = worker.on_slots_reclaimed(0, &[0, 1]).expect("free slots");
        for t in 0..6 {
            // Player 0 moves first in both envs (columns: env 0's players 0 and 1, then env 1's).
            let asked: Vec<usize> = requests.iter().map(|r| r.group).collect();
            let expected = if t % 2 == 0 { vec![0] } else { vec![0, 1] };
            assert_eq!(asked, expected, "step {t}");
            let buffer = requests[0].buffer;
            // Policy 1's group answers first: policy 0's, answering last, must leave its columns alone.
            let mut answered = 0;
            let mut next = Vec::new();
            for r in requests.iter().rev() {
                let answers = groups[r.group].on_policy_requested(&[*r]).expect("actions");
                let outcome = worker.on_actions_ready(&answers[0]).expect("step");
                answered += 1;
                if answered < requests.len() {
                    assert!(
                        outcome.requests.is_empty() && outcome.trajectory.is_none(),
                        "step {t}: stepped before every group answered"
                    );
                } else {
                    next = outcome.requests;
                }
            }
            let versions = reader.versions(buffer).expect("versions");
            let expected = if t % 2 == 0 {
                [10, 0, 10, 0]
            } else {
                [0, 11, 0, 11]
            };
            assert_eq!(versions[t * 4..t * 4 + 4], expected, "step {t}");
            requests = next;
        }
    }

    /// When the learner holds every slot and frees one at a time (the learner the bottleneck), the splits waiting for
    /// one take them in turn: from the first split every time, the second's envs stood still as long as the learner
    /// was behind.
    #[test]
    fn waiting_splits_take_the_freed_slots_in_turn() {
        let cfg = Config::for_env(
            "CartPole-v1",
            &[
                "num_envs_per_worker = 4",
                "worker_num_splits = 2",
                "rollout = 2",
                "batch_size = 8",
            ],
        )
        .expect("config");
        let shape = TrajectoryShape {
            rollout: 2,
            num_envs: 2,
            obs_dim: 4,
            action_dim: 1,
            state_dim: 0,
            obs_bytes: 0,
        };
        let pool = TrajectoryPool::create(shape, 2).expect("pool");
        let reader = TrajectoryPool::open(&pool.handle()).expect("mapped");
        let mut worker = RolloutWorker::first_of(&cfg, &EnvRegistry::with_builtin(), pool);
        worker.start().expect("reset");
        let requests = worker.on_slots_reclaimed(0, &[0, 1]).expect("free slots");
        // Steps the requested splits to the end of their trajectories, keeping the slots they hand on.
        fn run(
            worker: &mut RolloutWorker,
            reader: &TrajectoryPool,
            mut requests: Vec<PolicyRequest>,
            held: &mut std::collections::VecDeque<usize>,
        ) {
            while let Some(r) = requests.pop() {
                reader
                    .put(r.buffer, Field::Actions, r.step, &[1.0, 0.0])
                    .expect("actions");
                let outcome = worker.on_actions_ready(&r.answer()).expect("step");
                requests.extend(outcome.requests);
                held.extend(outcome.trajectory.map(|t| t.buffer));
            }
        }
        let mut held = std::collections::VecDeque::new();
        run(&mut worker, &reader, requests, &mut held);
        assert_eq!(
            held.len(),
            2,
            "both splits wait with their trajectories handed on"
        );
        let mut takers = Vec::new();
        for _ in 0..6 {
            // The learner frees the oldest slot: one of the two waiting splits takes it and fills it.
            let oldest = held.pop_front().expect("a held slot");
            let freed = worker.on_buffer_released(oldest).expect("released");
            assert_eq!(freed.len(), 1, "one slot, one split");
            takers.push(freed[0].split);
            run(&mut worker, &reader, freed, &mut held);
        }
        assert_eq!(takers, [0, 1, 0, 1, 0, 1], "the split each freed slot went to");
    }

    /// Connect Four's players take turns: a recurrent policy's state of the waiting player's column stays as it
    /// was through the other's move (the inference worker computed one for it, the rollout worker puts the old one
    /// back), and the player that moved carries the new one; both restart from zero after a game. (Its board and
    /// mask are bytes in the slots.)
    #[test]
    fn a_waiting_agent_keeps_its_recurrent_state() {
        let RecurrentRig {
            state_dim: d,
            reader,
            mut inference,
            mut worker,
            mut requests,
        } = recurrent_rig("connect_four", 2, |_, _| {});
        assert_eq!(reader.shape().obs_bytes, rlf_env::connect_four::OBS_DIM);
        let (mut before, mut after) = (vec![0.0; 4 * d], vec![0.0; 4 * d]);
        let mut flags = [vec![0.0; 4], vec![0.0; 4], vec![0.0; 4]];
        let (mut kept, mut moved, mut reset) = (0, 0, 0);
        for _ in 0..300 {
            let r = requests.pop().expect("a request");
            reader
                .get(r.buffer, Field::States, r.step, &mut before)
                .expect("states");
            let answers = inference.on_policy_requested(&[r]).expect("actions");
            let outcome = worker.on_actions_ready(&answers[0]).expect("step");
            let (field, at) = if r.step + 1 < 8 {
                (Field::States, r.step + 1)
            } else {
                (Field::NextStates, 0)
            };
            reader.get(r.buffer, field, at, &mut after).expect("next states");
            reader
                .get(r.buffer, Field::Valid, r.step, &mut flags[0])
                .expect("valid");
            reader
                .get(r.buffer, Field::Terminated, r.step, &mut flags[1])
                .expect("terminated");
            reader
                .get(r.buffer, Field::Truncated, r.step, &mut flags[2])
                .expect("truncated");
            for c in 0..4 {
                let (was, is) = (&before[c * d..(c + 1) * d], &after[c * d..(c + 1) * d]);
                if flags[1][c] + flags[2][c] > 0.0 {
                    assert!(
                        is.iter().all(|&v| v == 0.0),
                        "column {c}: a state after its game ended"
                    );
                    reset += 1;
                } else if flags[0][c] == 0.0 {
                    assert_eq!(was, is, "column {c} waited but its state changed");
                    kept += 1;
                } else {
                    assert_ne!(was, is, "column {c} moved but its state did not change");
                    moved += 1;
                }
            }
            requests.extend(outcome.requests);
            if let Some(t) = outcome.trajectory {
                requests.extend(worker.on_buffer_released(t.buffer).expect("released"));
            }
        }
        assert!(
            kept >= 200 && moved >= 200 && reset >= 4,
            "{kept} kept, {moved} moved, {reset} reset"
        );
    }

    /// A recurrent policy through a real inference worker: each step starts from the state the step before left
    /// (zero after an episode's end), a new slot starts from the split's state after the last one, and a fresh
    /// worker starts from zeros whatever its slots held.
    #[test]
    fn recurrent_states_chain_through_the_slots_and_reset_at_episode_ends() {
        // Leftovers of a predecessor in both slots.
        let RecurrentRig {
            state_dim: d,
            reader,
            mut inference,
            mut worker,
            mut requests,
        } = recurrent_rig("CartPole-v1", 4, |pool, d| {
            for b in 0..2 {
                for t in 0..8 {
                    pool.put(b, Field::States, t, &vec![7.0; 4 * d]).expect("garbage");
                }
            }
        });
        assert_eq!(d, 6, "an actor and a critic GRU of 3 units");
        let (mut state, mut expected) = (vec![0.0; 4 * d], vec![0.0; 4 * d]);
        let mut flags = [vec![0.0; 4], vec![0.0; 4]];
        let (mut resets, mut slots) = (0, 0);
        for _ in 0..400 {
            let r = requests.pop().expect("a request");
            reader
                .get(r.buffer, Field::States, r.step, &mut state)
                .expect("states");
            assert_eq!(
                state, expected,
                "the state step {} of slot {} starts from",
                r.step, r.buffer
            );
            let answers = inference.on_policy_requested(&[r]).expect("actions");
            assert_eq!(answers.len(), 1);
            let (field, at) = if r.step + 1 < 8 {
                (Field::States, r.step + 1)
            } else {
                (Field::NextStates, 0)
            };
            reader
                .get(r.buffer, field, at, &mut expected)
                .expect("next states");
            assert!(
                expected.iter().all(|v| v.abs() > 0.0 && v.abs() < 1.0),
                "a GRU's state after a step"
            );
            let outcome = worker.on_actions_ready(&answers[0]).expect("step");
            reader
                .get(r.buffer, Field::Terminated, r.step, &mut flags[0])
                .expect("flags");
            reader
                .get(r.buffer, Field::Truncated, r.step, &mut flags[1])
                .expect("flags");
            for (c, e) in expected.chunks_mut(d).enumerate() {
                if flags[0][c] + flags[1][c] > 0.0 {
                    e.fill(0.0);
                    resets += 1;
                }
            }
            reader.get(r.buffer, field, at, &mut state).expect("reset states");
            assert_eq!(
                state, expected,
                "the states after step {} once its episodes ended",
                r.step
            );
            requests.extend(outcome.requests);
            if let Some(t) = outcome.trajectory {
                slots += 1;
                requests.extend(worker.on_buffer_released(t.buffer).expect("released"));
            }
        }
        assert!(resets >= 4 && slots >= 40, "{resets} resets, {slots} slots");
    }

    #[test]
    fn a_replacement_counts_its_predecessors_unfinished_frames_as_lost() {
        let dead = WorkerCounts {
            produced: 7,
            stepped_frames: 1000,
            handed_frames: 896,
            lost_frames: 40,
        };
        let next = dead.inherit();
        assert_eq!(
            next,
            WorkerCounts {
                produced: 7,
                stepped_frames: 1000,
                handed_frames: 1000,
                lost_frames: 144,
            }
        );
        // A predecessor that had handed on everything it stepped (every split waiting for a slot)
        // lost nothing, and a second replacement adds only what the first left unfinished.
        assert_eq!(next.inherit(), next);
        assert_eq!(WorkerCounts::from_words(next.to_words()), next);
    }

    /// A started rollout worker of Connect Four with `--self_play`, a pool of two snapshots (both taken) and `flags`,
    /// its 4 envs in one split of `columns` columns; with a second mapping of its pool and its first requests.
    fn self_play_rig(flags: &[&str], columns: usize) -> (TrajectoryPool, RolloutWorker, Vec<PolicyRequest>) {
        let mut args = vec![
            "self_play = true",
            "opponent_pool_size = 2",
            "num_envs_per_worker = 4",
            "worker_num_splits = 1",
            "rollout = 8",
            "batch_size = 64",
        ];
        args.extend_from_slice(flags);
        let cfg = Config::for_env("connect_four", &args).expect("config");
        let shape = TrajectoryShape {
            rollout: 8,
            num_envs: columns,
            obs_dim: rlf_env::connect_four::OBS_DIM,
            action_dim: 1,
            state_dim: 0,
            obs_bytes: 0,
        };
        let pool = TrajectoryPool::create(shape, 2).expect("pool");
        let reader = TrajectoryPool::open(&pool.handle()).expect("mapped");
        let registry = EnvRegistry::with_builtin();
        let mut worker = RolloutWorker::first_of(&cfg, &registry, pool);
        for slot in 0..2 {
            worker.on_snapshot_taken(&SnapshotTaken {
                policy: 0,
                slot,
                number: slot as u64 + 1,
                version: 1,
            });
        }
        worker.start().expect("reset");
        let requests = worker.on_slots_reclaimed(0, &[0, 1]).expect("free slots");
        (reader, worker, requests)
    }

    /// Answers request `r` of `worker` (whose slots `reader` maps) with each column's first legal move (any move for
    /// a waiting column), steps it and adds its next requests to `requests`; returns the step's report.
    fn play_first_legal(
        worker: &mut RolloutWorker,
        reader: &TrajectoryPool,
        r: &PolicyRequest,
        requests: &mut Vec<PolicyRequest>,
    ) -> Option<RolloutReport> {
        let dim = reader.shape().obs_dim;
        let mut obs = vec![0.0; reader.shape().num_envs * dim];
        reader.get(r.buffer, Field::Obs, r.step, &mut obs).expect("obs");
        let actions: Vec<f32> = obs
            .chunks(dim)
            .map(|o| o[..7].iter().position(|&m| m > 0.0).unwrap_or(0) as f32)
            .collect();
        reader
            .put(r.buffer, Field::Actions, r.step, &actions)
            .expect("actions");
        let outcome = worker.on_actions_ready(&r.answer()).expect("step");
        requests.extend(outcome.requests);
        if let Some(t) = outcome.trajectory {
            requests.extend(worker.on_buffer_released(t.buffer).expect("released"));
        }
        outcome.report
    }

    /// Self-play with one policy: once its pool holds snapshots, the slots record some columns as
    /// played by a snapshot's network (1 or 2 here), never by a network that does not exist.
    #[test]
    fn self_play_columns_record_the_snapshot_that_plays_them() {
        let (reader, mut worker, mut requests) = self_play_rig(&[], 8);
        let mut networks = vec![0.0; 8];
        let mut seen = [0usize; 3];
        for _ in 0..600 {
            let r = requests.pop().expect("a request");
            reader
                .get(r.buffer, Field::Policy, r.step, &mut networks)
                .expect("networks");
            for &n in networks.iter().filter(|&&n| n != INACTIVE) {
                assert!(n == 0.0 || n == 1.0 || n == 2.0, "network {n}");
                seen[n as usize] += 1;
            }
            play_first_legal(&mut worker, &reader, &r, &mut requests);
        }
        assert!(seen[0] > 0 && seen[1] + seen[2] > 0, "networks seen: {seen:?}");
    }

    /// Team self-play (Connect Four, two players a side): in every episode the protagonist's
    /// teammate plays the latest weights with it, both opponents play one network (the latest
    /// weights or the same snapshot), and each game against a snapshot is scored once.
    #[test]
    fn self_play_teams_play_together_and_meet_one_opponent_per_team() {
        let (reader, mut worker, mut requests) = self_play_rig(
            &["env_kwargs = 'players_per_side=2'", "self_play_latest_prob = 0.3"],
            16,
        );
        assert_eq!(worker.splits[0].teams, [0, 1, 0, 1]);
        let (mut snapshot_games, mut games) = (0, 0);
        for _ in 0..800 {
            for (e, env) in worker.splits[0].policies.chunks(4).enumerate() {
                let hero = worker.splits[0].protagonists[e];
                let (mate, a, b) = ((hero + 2) % 4, (hero + 1) % 4, (hero + 3) % 4);
                assert_eq!((env[hero], env[mate]), (0, 0), "env {e}: {env:?}");
                assert_eq!(env[a], env[b], "env {e}: one opponent per team: {env:?}");
                assert!(env[a] <= 2, "env {e}: {env:?}");
            }
            let r = requests.pop().expect("a request");
            let report = play_first_legal(&mut worker, &reader, &r, &mut requests);
            games += worker.splits[0]
                .buf
                .terminated
                .iter()
                .step_by(4)
                .filter(|&&t| t)
                .count();
            snapshot_games += report.map_or(0, |report| report.games.len());
        }
        // About 70% of the games have a snapshot for an opponent team, scored once each.
        assert!(games > 50, "{games} games");
        let share = snapshot_games as f64 / games as f64;
        assert!(
            (0.5..0.9).contains(&share),
            "{snapshot_games} of {games} games against a snapshot"
        );
    }

    /// Off-policy: a rollout worker on CartPole puts every step into the replay buffer as a 1-step transition that
    /// chains with the next one of its env (its next observation is where the env's next row starts), with the
    /// reward 1, the discount γ (0 at a terminal state), and the action the slot held; its slots are free again
    /// at once. Each env's last step waits for the observation after it.
    #[test]
    fn off_policy_workers_write_transitions_that_chain() {
        let cfg = Config::for_env(
            "CartPole-v1",
            &[
                "algo = 'dqn'",
                "num_envs_per_worker = 2",
                "worker_num_splits = 1",
                "rollout = 4",
                "batch_size = 4",
                "gamma = 0.5",
            ],
        )
        .expect("config");
        let registry = EnvRegistry::with_builtin();
        let shape = TrajectoryShape {
            rollout: 4,
            num_envs: 2,
            obs_dim: 4,
            action_dim: 1,
            state_dim: 0,
            obs_bytes: 0,
        };
        let pool = TrajectoryPool::create(shape, 1).expect("pool");
        let reader = TrajectoryPool::open(&pool.handle()).expect("mapped");
        let layout = TransitionLayout::floats(4, 1);
        let ring = ReplayRing::create(4096, layout.row_words(), None).expect("ring");
        let writer = ReplayWriter::new(
            vec![ReplayRing::open(&ring.handle()).expect("open")],
            vec![layout.clone()],
            1,
            0.5,
        );
        let mut worker = RolloutWorker::first_of(&cfg, &registry, pool).with_replay(writer);
        worker.start().expect("reset");
        let mut requests = worker.on_slots_reclaimed(0, &[0]).expect("free slots");
        for _ in 0..200 {
            let r = requests
                .pop()
                .expect("a request: the slot is free again after each trajectory");
            // Env 0 always pushes left, env 1 always right: the action tells whose row it is.
            let actions = [0.0, 1.0];
            reader
                .put(r.buffer, Field::Actions, r.step, &actions)
                .expect("actions");
            let outcome = worker
                .on_actions_ready(&ActionsReady {
                    worker: 0,
                    split: 0,
                    incarnation: 0,
                })
                .expect("step");
            assert!(outcome.trajectory.is_none(), "no batcher off-policy");
            requests.extend(outcome.requests);
        }
        assert_eq!(
            ring.inserted(),
            200 * 2 - 2,
            "every step of both envs but the last"
        );
        let mut rows = vec![vec![0.0; layout.row_words()]; 398];
        for (i, row) in rows.iter_mut().enumerate() {
            ring.read(i as u64, row).expect("row");
        }
        let w = layout.row_words();
        let (mut chained, mut terminal) = (0, 0);
        for env in 0..2 {
            let own: Vec<&Vec<f32>> = rows
                .iter()
                .filter(|r| r[layout.action_at()] == env as f32)
                .collect();
            assert_eq!(own.len(), 199);
            for (k, row) in own.iter().enumerate() {
                assert_eq!(row[layout.return_at()], 1.0);
                let discount = row[layout.discount_at()];
                if discount == 0.0 {
                    terminal += 1;
                    assert!(row[layout.next_obs_at()..w].iter().all(|&v| v == 0.0));
                } else {
                    assert_eq!(discount, 0.5);
                    if let Some(next) = own.get(k + 1) {
                        assert_eq!(&row[layout.next_obs_at()..w], &next[..4], "env {env} row {k}");
                        chained += 1;
                    }
                }
            }
        }
        assert!(
            terminal >= 5 && chained > 300,
            "{terminal} terminal, {chained} chained"
        );
    }

    /// A built-in opponent's columns take its moves from the env, whatever the slot held: here
    /// every column is given its first legal column, and the `random` player's moves, recorded
    /// in the slot, are legal and mostly other columns; its games are reported against it.
    #[test]
    fn built_in_opponents_play_their_own_moves_and_their_games_are_reported() {
        let cfg = Config::for_env(
            "connect_four",
            &[
                "self_play = true",
                "opponent_pool_size = 2",
                "self_play_builtin_opponents = 'random'",
                "self_play_builtin_prob = 1",
                "num_envs_per_worker = 4",
                "worker_num_splits = 1",
                "rollout = 8",
                "batch_size = 64",
            ],
        )
        .expect("config");
        let builtin = cfg.builtin_network(0) as f32;
        assert_eq!(builtin, 3.0, "after the policy and its two snapshots");
        let registry = EnvRegistry::with_builtin();
        let shape = TrajectoryShape {
            rollout: 8,
            num_envs: 8,
            obs_dim: rlf_env::connect_four::OBS_DIM,
            action_dim: 1,
            state_dim: 0,
            obs_bytes: 0,
        };
        let pool = TrajectoryPool::create(shape, 2).expect("pool");
        let reader = TrajectoryPool::open(&pool.handle()).expect("mapped");
        let mut worker = RolloutWorker::first_of(&cfg, &registry, pool);
        worker.start().expect("reset");
        let mut requests = worker.on_slots_reclaimed(0, &[0, 1]).expect("free slots");
        let (mut obs, mut networks) = (vec![0.0; 8 * shape.obs_dim], vec![0.0; 8]);
        let (mut played, mut valid) = (vec![0.0; 8], vec![0.0; 8]);
        let (mut moves, mut elsewhere, mut games) = (0, 0, 0);
        for _ in 0..600 {
            let r = requests.pop().expect("a request");
            reader.get(r.buffer, Field::Obs, r.step, &mut obs).expect("obs");
            reader
                .get(r.buffer, Field::Policy, r.step, &mut networks)
                .expect("networks");
            let first_legal: Vec<f32> = obs
                .chunks(shape.obs_dim)
                .map(|o| o[..7].iter().position(|&m| m > 0.0).unwrap_or(0) as f32)
                .collect();
            reader
                .put(r.buffer, Field::Actions, r.step, &first_legal)
                .expect("actions");
            let outcome = worker
                .on_actions_ready(&ActionsReady {
                    worker: 0,
                    split: 0,
                    incarnation: 0,
                })
                .expect("step");
            reader
                .get(r.buffer, Field::Actions, r.step, &mut played)
                .expect("actions played");
            reader
                .get(r.buffer, Field::Valid, r.step, &mut valid)
                .expect("valid");
            for c in 0..8 {
                let n = networks[c];
                assert!(n == 0.0 || n == builtin || n == INACTIVE, "network {n}");
                if networks[c] != builtin || valid[c] == 0.0 {
                    continue;
                }
                let column = played[c] as usize;
                assert!(
                    obs[c * shape.obs_dim + column] > 0.0,
                    "an illegal column {column}"
                );
                moves += 1;
                elsewhere += usize::from(played[c] != first_legal[c]);
            }
            if let Some(report) = &outcome.report {
                for game in &report.games {
                    assert_eq!((game.policy, game.network), (0, 3), "{game:?}");
                    games += 1;
                }
            }
            requests.extend(outcome.requests);
            if let Some(t) = outcome.trajectory {
                requests.extend(worker.on_buffer_released(t.buffer).expect("released"));
            }
        }
        assert!(moves > 500 && games > 20, "{moves} moves, {games} games");
        assert!(
            elsewhere * 2 > moves,
            "{elsewhere} of {moves} moves off the first legal column"
        );
    }
}
