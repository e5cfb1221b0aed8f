//! The runner's statistics and stop rules, free of any event loop: frames and episodes counted
//! from rollout reports, training metrics from the learners, the scalars due for TensorBoard
//! (per policy), the progress line, the stop conditions and the final [`Summary`].

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::summary::{
    AgentSummary, BuiltinSummary, PolicySummary, SavedSelfPlay, SelfPlaySummary, SnapshotSummary, StopReason,
    Summary,
};
use crate::config::{BestMetric, Config, UNLIMITED_SECONDS};
use crate::experiment::CheckpointRequest;
use crate::learning::TrainingReport;
use crate::sampling::{RolloutReport, SelfPlayGame, SnapshotRequest, SnapshotTaken};
use crate::top::{LiveView, PolicyLive};

/// Self-play games the win rate against the pool is taken over.
const GAMES_WINDOW: usize = 100;

/// The start-up excluded from the steady-state FPS: 2 s, or a fifth of `--train_for_seconds` if
/// that is shorter.
pub fn warm_up(train_for_seconds: f64) -> Duration {
    Duration::from_secs_f64((train_for_seconds / 5.0).clamp(0.0, 2.0))
}

/// Scalars for TensorBoard at one step (env frames), by Sample Factory's tags.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalars {
    /// The policy they belong to (its `.summary/<i>/`).
    pub policy: usize,
    /// The step: env frames so far.
    pub env_frames: u64,
    /// Values by tag.
    pub values: Vec<(String, f64)>,
}

/// When one kind of scalars is next due.
#[derive(Debug, Clone, Copy, Default)]
struct Due {
    /// Something new arrived since the last scalars of this kind.
    fresh: bool,
    /// Env frames from which the next may be written.
    from: u64,
    /// Env frames of the last scalars of this kind written.
    last: Option<u64>,
}

impl Due {
    /// Whether scalars are due at `env_frames`: something new arrived and `every` frames passed since the last.
    /// When `force` (the run's end), regardless of the interval, and even with nothing new once frames passed since
    /// the last: the last values then stand at the run's end.
    fn take(&mut self, env_frames: u64, every: u64, force: bool) -> bool {
        let at_end = force && self.last.is_some_and(|l| env_frames > l);
        if !(self.fresh || at_end) || (!force && env_frames < self.from) {
            return false;
        }
        self.fresh = false;
        self.from = env_frames.saturating_add(every);
        self.last = Some(env_frames);
        true
    }
}

/// A window of the last `capacity` values.
#[derive(Debug, Clone)]
struct Window<T>(VecDeque<T>, usize);

impl<T: Copy + Into<f64>> Window<T> {
    fn new(capacity: usize) -> Self {
        Self(VecDeque::with_capacity(capacity), capacity.max(1))
    }

    fn push(&mut self, v: T) {
        if self.0.len() == self.1 {
            self.0.pop_front();
        }
        self.0.push_back(v);
    }

    fn mean(&self) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.iter().map(|&v| v.into()).sum::<f64>() / self.0.len() as f64)
    }

    fn is_full(&self) -> bool {
        self.0.len() == self.1
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// The Elo rating a policy starts with; a snapshot starts with its policy's rating when taken.
const ELO_START: f64 = 1200.0;
/// How far one game moves two ratings.
const ELO_K: f64 = 16.0;

/// The expected score of a player rated `a` against one rated `b`.
fn elo_expected(a: f64, b: f64) -> f64 {
    1.0 / (1.0 + 10f64.powf((b - a) / 400.0))
}

/// A snapshot in a policy's self-play pool.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    number: u64,
    version: u64,
    rating: f64,
    games: u64,
}

/// A policy's games against one built-in opponent.
#[derive(Debug, Clone)]
struct BuiltinRecord {
    name: String,
    scores: Window<f64>,
    games: u64,
}

/// A policy's self-play record: its latest weights' Elo rating, its pool's snapshots, and the
/// scores of its last games against them and against each built-in opponent.
#[derive(Debug, Clone)]
struct SelfPlayStats {
    rating: f64,
    /// By pool slot.
    pool: Vec<Option<Snapshot>>,
    scores: Window<f64>,
    games: u64,
    /// By built-in opponent (`--self_play_builtin_opponents`, in order).
    builtin: Vec<BuiltinRecord>,
    /// A resumed run's saved snapshots not yet put back into the pool: each takes its saved rating and games
    /// back when its learner announces it again.
    saved: Vec<SnapshotSummary>,
}

impl SelfPlayStats {
    fn new(pool_size: usize, builtin: &[&str]) -> Self {
        Self {
            rating: ELO_START,
            pool: vec![None; pool_size],
            scores: Window::new(GAMES_WINDOW),
            games: 0,
            builtin: builtin
                .iter()
                .map(|&name| BuiltinRecord {
                    name: name.to_owned(),
                    scores: Window::new(GAMES_WINDOW),
                    games: 0,
                })
                .collect(),
            saved: Vec::new(),
        }
    }

    /// Continues a resumed run's record: the saved snapshots' ratings for when they are put back, the games
    /// against each built-in opponent still played, and, when `latest` (the record is of the resumed weights), the
    /// latest weights' rating and games (the win-rate windows start empty).
    fn resume(&mut self, saved: SelfPlaySummary, latest: bool) {
        if latest {
            self.rating = saved.elo;
            self.games = saved.games;
        }
        for record in &mut self.builtin {
            if let Some(b) = saved.builtin.iter().find(|b| b.name == record.name) {
                record.games = b.games;
            }
        }
        self.saved = saved.pool;
    }

    /// The record `self_play_<i>.json` keeps: the summary, with the saved snapshots not put back yet.
    fn record(&self) -> SelfPlaySummary {
        let mut record = self.summary();
        record.pool.extend(self.saved.iter().cloned());
        record
    }

    /// A game of the latest weights against built-in opponent `b` (no rating: a fixed player).
    fn on_builtin_game(&mut self, b: usize, score: f64) {
        if let Some(record) = self.builtin.get_mut(b) {
            record.scores.push(score);
            record.games += 1;
        }
    }

    /// A snapshot put into `taken.slot`: rated as the latest weights are now, or as it was saved if it is a
    /// resumed run's snapshot put back (the same number and policy version).
    fn on_snapshot_taken(&mut self, taken: &SnapshotTaken) {
        let same =
            |s: &Option<Snapshot>| s.is_some_and(|s| (s.number, s.version) == (taken.number, taken.version));
        if self.pool.get(taken.slot).is_some_and(same) {
            return;
        }
        let saved = self
            .saved
            .iter()
            .position(|s| (s.number, s.policy_version) == (taken.number, taken.version))
            .map(|i| self.saved.swap_remove(i));
        if let Some(slot) = self.pool.get_mut(taken.slot) {
            *slot = Some(Snapshot {
                number: taken.number,
                version: taken.version,
                rating: saved.as_ref().map_or(self.rating, |s| s.elo),
                games: saved.as_ref().map_or(0, |s| s.games),
            });
        }
    }

    /// A game of the latest weights against the snapshot in `slot`: both ratings move.
    fn on_game(&mut self, slot: usize, score: f64) {
        let Some(Some(snapshot)) = self.pool.get_mut(slot) else {
            return;
        };
        let delta = ELO_K * (score - elo_expected(self.rating, snapshot.rating));
        self.rating += delta;
        snapshot.rating -= delta;
        snapshot.games += 1;
        self.scores.push(score);
        self.games += 1;
    }

    fn summary(&self) -> SelfPlaySummary {
        SelfPlaySummary {
            games: self.games,
            win_rate_vs_pool: self.scores.mean(),
            elo: self.rating,
            pool: self
                .pool
                .iter()
                .enumerate()
                .filter_map(|(slot, s)| {
                    let s = s.as_ref()?;
                    Some(SnapshotSummary {
                        slot,
                        number: s.number,
                        policy_version: s.version,
                        elo: s.rating,
                        games: s.games,
                    })
                })
                .collect(),
            builtin: self
                .builtin
                .iter()
                .map(|b| BuiltinSummary {
                    name: b.name.clone(),
                    games: b.games,
                    win_rate: b.scores.mean(),
                })
                .collect(),
        }
    }
}

/// One policy's statistics.
#[derive(Debug, Clone)]
struct PolicyStats {
    /// PBT replaced the weights: its ranking objective and best-checkpoint metric wait for a full window of new
    /// episodes.
    settling: bool,
    agent_steps: u64,
    episodes: u64,
    returns: Window<f64>,
    objectives: Window<f64>,
    lengths: Window<f64>,
    version: u64,
    version_diff: f64,
    last_metrics: Vec<(String, f64)>,
    episode_scalars: Due,
    training_scalars: Due,
    self_play: Option<SelfPlayStats>,
}

/// One agent's statistics (multi-agent envs).
#[derive(Debug, Clone)]
struct AgentStats {
    name: String,
    returns: Window<f64>,
    objectives: Window<f64>,
    episodes: u64,
}

/// When the next self-play snapshot is due.
#[derive(Debug, Clone, Copy)]
struct SnapshotSchedule {
    every: u64,
    next: u64,
    number: u64,
    /// Networks before the first snapshot (the policies), and snapshots per pool.
    num_policies: usize,
    pool_size: usize,
}

/// The span a progress line's FPS is measured over: trajectories arrive whole (Atari's 8 envs × 128 steps are
/// 1,024 frames), so the frames between two lines a second apart jump between none and several trajectories.
const FPS_WINDOW: Duration = Duration::from_secs(10);

/// Statistics and stop conditions.
#[derive(Debug)]
pub struct RunStats {
    process_start: Instant,
    sampling_start: Instant,
    warm_up: Duration,
    /// Time and env frames of the first rollout report after the warm-up.
    steady_from: Option<(Instant, u64)>,
    /// Time of the last rollout report counted.
    last_report: Instant,
    max_frames: u64,
    max_seconds: f64,
    stop_at_reward: Option<f64>,
    summary_every: u64,
    env_frames: u64,
    episodes: u64,
    /// Every policy's episodes together.
    returns: Window<f64>,
    reached: Option<(u64, f64)>,
    /// By policy index.
    policies: Vec<PolicyStats>,
    first_dataset_digest: Option<u64>,
    /// `(time, env frames)` of the progress reports of the last [`FPS_WINDOW`], oldest first, and one before it:
    /// the FPS a line prints is over that window.
    line_marks: VecDeque<(Instant, u64)>,
    stop: Option<StopReason>,
    snapshots: Option<SnapshotSchedule>,
    best_metric: BestMetric,
    /// By agent index, for multi-agent envs ([`RunStats::track_agents`]).
    agents: Vec<AgentStats>,
    stats_avg: usize,
}

impl RunStats {
    /// A runner for `cfg`; `process_start` is when the process started.
    pub fn new(cfg: &Config, process_start: Instant) -> Self {
        let now = Instant::now();
        let s = &cfg.sampling;
        Self {
            process_start,
            sampling_start: now,
            warm_up: warm_up(cfg.run.train_for_seconds),
            steady_from: None,
            last_report: now,
            max_frames: cfg.run.train_for_env_steps,
            max_seconds: cfg.run.train_for_seconds,
            stop_at_reward: cfg.run.stop_at_reward,
            summary_every: cfg.run.summary_every_env_steps,
            env_frames: 0,
            episodes: 0,
            returns: Window::new(cfg.run.stats_avg),
            reached: None,
            policies: vec![
                PolicyStats {
                    agent_steps: 0,
                    episodes: 0,
                    settling: false,
                    returns: Window::new(cfg.run.stats_avg),
                    objectives: Window::new(cfg.run.stats_avg),
                    lengths: Window::new(cfg.run.stats_avg),
                    version: 0,
                    version_diff: 0.0,
                    last_metrics: Vec::new(),
                    episode_scalars: Due::default(),
                    training_scalars: Due::default(),
                    self_play: s
                        .self_play
                        .then(|| SelfPlayStats::new(s.opponent_pool_size, &cfg.builtin_opponents())),
                };
                s.num_policies.max(1)
            ],
            first_dataset_digest: None,
            line_marks: VecDeque::from([(now, 0)]),
            stop: None,
            snapshots: s.self_play.then_some(SnapshotSchedule {
                every: s.snapshot_every_env_steps.max(1),
                next: 0,
                number: 0,
                num_policies: s.num_policies,
                pool_size: s.opponent_pool_size.max(1),
            }),
            best_metric: cfg.checkpoint.save_best_metric,
            agents: Vec::new(),
            stats_avg: cfg.run.stats_avg,
        }
    }

    /// Keeps statistics per agent of a multi-agent env whose agents are named `names`.
    pub fn track_agents(&mut self, names: &[String]) {
        self.agents = names
            .iter()
            .map(|name| AgentStats {
                name: name.clone(),
                returns: Window::new(self.stats_avg),
                objectives: Window::new(self.stats_avg),
                episodes: 0,
            })
            .collect();
    }

    /// Mean return of the last `--stats_avg` episodes, whatever policy played them.
    pub fn mean_return(&self) -> Option<f64> {
        self.returns.mean()
    }

    /// Mean true objective of the last `--stats_avg` episodes of `policy` (its PBT objective; the
    /// mean return when the env reports no objective).
    pub fn policy_objective(&self, policy: usize) -> Option<f64> {
        self.policies
            .get(policy)
            .filter(|p| !p.settling)
            .and_then(|p| p.objectives.mean())
    }

    /// Forgets `policy`'s recent episodes (returns, objectives, lengths): PBT replaced its weights, and episodes
    /// played with the old ones no longer measure it. Its ranking objective and best-checkpoint metric wait for a
    /// full `--stats_avg` window of new episodes (the few that were under way with the old weights when the new
    /// ones arrived are among them).
    pub fn forget_recent_episodes(&mut self, policy: usize) {
        if let Some(p) = self.policies.get_mut(policy) {
            p.returns.clear();
            p.objectives.clear();
            p.lengths.clear();
            p.settling = true;
        }
    }

    /// Continues each policy's agent steps from a resumed run's (PBT's saved states).
    pub fn resume_agent_steps(&mut self, steps: &[u64]) {
        for (p, &s) in self.policies.iter_mut().zip(steps) {
            p.agent_steps = s;
        }
    }

    /// Agent steps `policy`'s latest weights took.
    pub fn policy_agent_steps(&self, policy: usize) -> u64 {
        self.policies.get(policy).map_or(0, |p| p.agent_steps)
    }

    /// Env frames so far.
    pub fn env_frames(&self) -> u64 {
        self.env_frames
    }

    /// The counts [`resume_from`](Self::resume_from) continues: env frames, episodes and each policy's version.
    pub fn counts(&self) -> (u64, u64, Vec<u64>) {
        let versions = self.policies.iter().map(|p| p.version).collect();
        (self.env_frames, self.episodes, versions)
    }

    /// Continues the counts of a resumed run: env frames, episodes and each policy's version.
    pub fn resume_from(&mut self, env_frames: u64, episodes: u64, versions: &[u64]) {
        self.env_frames = env_frames;
        self.episodes = episodes;
        for (p, &version) in self.policies.iter_mut().zip(versions) {
            p.version = version;
        }
        self.line_marks = VecDeque::from([(Instant::now(), env_frames)]);
        for p in &mut self.policies {
            p.episode_scalars.from = env_frames;
            p.training_scalars.from = env_frames;
        }
        // The snapshots continue on their schedule: the learners put the saved pool back.
        if let (Some(schedule), true) = (&mut self.snapshots, env_frames > 0) {
            schedule.next = (env_frames / schedule.every + 1) * schedule.every;
        }
    }

    /// Slot of `rollout_reported`: counts frames and episodes; returns why to stop, if it is time.
    pub fn on_rollout_reported(&mut self, report: &RolloutReport) -> Option<StopReason> {
        self.env_frames += report.env_frames;
        let now = Instant::now();
        self.last_report = now;
        if self.steady_from.is_none() && now.duration_since(self.sampling_start) >= self.warm_up {
            self.steady_from = Some((now, self.env_frames));
        }
        for (p, &frames) in self.policies.iter_mut().zip(&report.policy_frames) {
            p.agent_steps += frames;
        }
        for (i, &r) in report.episode_returns.iter().enumerate() {
            self.returns.push(r);
            self.episodes += 1;
            let objective = report.episode_objectives.get(i).copied().unwrap_or(r);
            if let Some(a) = report.episode_agents.get(i).and_then(|&a| self.agents.get_mut(a)) {
                a.returns.push(r);
                a.objectives.push(objective);
                a.episodes += 1;
            }
            let policy = report.episode_policies.get(i).copied().unwrap_or(0);
            if let Some(p) = self.policies.get_mut(policy) {
                p.returns.push(r);
                p.objectives.push(objective);
                p.settling &= !p.objectives.is_full();
                p.lengths
                    .push(report.episode_lengths.get(i).copied().unwrap_or(0) as f64);
                p.episodes += 1;
                p.episode_scalars.fresh = true;
            }
        }
        for game in &report.games {
            self.on_game(game);
        }
        self.check_stop()
    }

    fn on_game(&mut self, game: &SelfPlayGame) {
        let Some(schedule) = self.snapshots else { return };
        let Some(p) = self.policies.get_mut(game.policy) else {
            return;
        };
        let Some(sp) = &mut p.self_play else { return };
        let first_builtin = schedule.num_policies * (1 + schedule.pool_size);
        let first = schedule.num_policies + game.policy * schedule.pool_size;
        if let Some(b) = game.network.checked_sub(first_builtin) {
            sp.on_builtin_game(b, game.score);
        } else if let Some(slot) = game.network.checked_sub(first) {
            sp.on_game(slot, game.score);
        } else {
            return;
        }
        p.episode_scalars.fresh = true;
    }

    /// The self-play snapshot due now, if any: the first at the first report (the initial
    /// weights, an opponent close to uniformly random), then one every
    /// `--snapshot_every_env_steps` env frames (a resumed run continues the schedule, its pool put back).
    pub fn due_snapshot(&mut self) -> Option<SnapshotRequest> {
        let schedule = self.snapshots.as_mut()?;
        if self.env_frames < schedule.next {
            return None;
        }
        while schedule.next <= self.env_frames {
            schedule.next += schedule.every;
        }
        schedule.number += 1;
        Some(SnapshotRequest {
            number: schedule.number,
        })
    }

    /// Continues policy `policy`'s self-play record from a resumed run's `self_play_<i>.json` (nothing without
    /// `--self_play`). The latest weights' rating and games continue only if the record was written at the resumed
    /// env frames (the checkpoint saved with it; not an older one, such as the best); returns whether they did.
    pub fn resume_self_play(&mut self, policy: usize, saved: SavedSelfPlay) -> bool {
        let latest = saved.env_frames == self.env_frames;
        if let Some(sp) = self.policies.get_mut(policy).and_then(|p| p.self_play.as_mut()) {
            sp.resume(saved.record, latest);
        }
        latest
    }

    /// Each policy's self-play record, by policy (with `--self_play`), as `self_play_<i>.json` keeps it.
    pub fn self_play_records(&self) -> Vec<(usize, SavedSelfPlay)> {
        self.policies
            .iter()
            .enumerate()
            .filter_map(|(p, stats)| {
                let record = stats.self_play.as_ref()?.record();
                Some((
                    p,
                    SavedSelfPlay {
                        env_frames: self.env_frames,
                        record,
                    },
                ))
            })
            .collect()
    }

    /// Slot of `snapshot_taken` (also for each snapshot a resumed learner put back into its pool: the numbering
    /// continues after them).
    pub fn on_snapshot_taken(&mut self, taken: &SnapshotTaken) {
        if let Some(schedule) = &mut self.snapshots {
            schedule.number = schedule.number.max(taken.number);
        }
        if let Some(sp) = self
            .policies
            .get_mut(taken.policy)
            .and_then(|p| p.self_play.as_mut())
        {
            sp.on_snapshot_taken(taken);
        }
    }

    /// What a checkpoint saved now should record.
    pub fn checkpoint_request(&self) -> CheckpointRequest {
        CheckpointRequest {
            env_steps: self.env_frames,
            episodes: self.episodes,
            best_metrics: self
                .policies
                .iter()
                .map(|p| match (p.settling, self.best_metric) {
                    (true, _) => None,
                    (false, BestMetric::Reward) => p.returns.mean(),
                    (false, BestMetric::TrueObjective) => p.objectives.mean(),
                })
                .collect(),
        }
    }

    /// Slot of `training_reported` (of any policy's learner).
    pub fn on_training_reported(&mut self, report: &TrainingReport) {
        if self.first_dataset_digest.is_none() {
            self.first_dataset_digest = report.dataset_digest;
        }
        let Some(p) = self.policies.get_mut(report.policy) else {
            return;
        };
        p.version = report.version;
        if let Some((_, v)) = report.metrics.iter().find(|(k, _)| k == "train/version_diff_avg") {
            p.version_diff = *v;
        }
        p.last_metrics.clone_from(&report.metrics);
        p.training_scalars.fresh = true;
    }

    /// The run's figures for `rlfactory top` (the loops and replay buffers are the caller's to fill in).
    pub fn live_view(&self, experiment: &str, train_dir: &std::path::Path) -> LiveView {
        LiveView {
            experiment: experiment.to_owned(),
            train_dir: train_dir.to_owned(),
            pid: std::process::id(),
            seconds: self.process_start.elapsed().as_secs_f64(),
            env_frames: self.env_frames,
            fps: 0.0,
            mean_return: self.mean_return(),
            episodes: self.episodes,
            policies: self
                .policies
                .iter()
                .map(|p| PolicyLive {
                    version: p.version,
                    lag: p.version_diff,
                    mean_return: p.returns.mean(),
                    agent_steps: p.agent_steps,
                })
                .collect(),
            loops: Vec::new(),
            replays: Vec::new(),
            stopping: self.stop.is_some(),
        }
    }

    /// Checks the stop conditions.
    pub fn check_stop(&mut self) -> Option<StopReason> {
        if self.stop.is_some() {
            return self.stop;
        }
        let window_full = self.returns.is_full();
        if let (Some(target), Some(mean)) = (self.stop_at_reward, self.mean_return()) {
            if window_full && mean >= target {
                self.reached = Some((self.env_frames, self.process_start.elapsed().as_secs_f64()));
                self.stop = Some(StopReason::Reward);
            }
        }
        if self.stop.is_none() && self.env_frames >= self.max_frames {
            self.stop = Some(StopReason::EnvSteps);
        }
        if self.stop.is_none() && self.sampling_start.elapsed().as_secs_f64() >= self.max_seconds {
            self.stop = Some(StopReason::Seconds);
        }
        self.stop
    }

    /// The scalars due now, per policy: its episode statistics (`reward/reward`, `len/len`,
    /// `stats/episodes`, `stats/agent_steps`) once its episodes ended, its learner's metrics
    /// (`train/...`) once it trained, each at most once per `--summary_every_env_steps` env
    /// frames (0: every report). With `force` (at stop), whatever is new regardless of the
    /// interval.
    pub fn due_scalars(&mut self, force: bool) -> Vec<Scalars> {
        let mut due = Vec::new();
        let (frames, every) = (self.env_frames, self.summary_every);
        for (policy, p) in self.policies.iter_mut().enumerate() {
            if p.episode_scalars.take(frames, every, force) {
                let mut values = vec![("stats/episodes".to_owned(), p.episodes as f64)];
                values.extend(p.returns.mean().map(|r| ("reward/reward".to_owned(), r)));
                values.extend(
                    p.objectives
                        .mean()
                        .map(|o| ("policy_stats/avg_true_objective".to_owned(), o)),
                );
                values.extend(p.lengths.mean().map(|l| ("len/len".to_owned(), l)));
                values.push(("stats/agent_steps".to_owned(), p.agent_steps as f64));
                if let Some(sp) = &p.self_play {
                    values.extend(
                        sp.scores
                            .mean()
                            .map(|w| ("selfplay/win_rate_vs_pool".to_owned(), w)),
                    );
                    values.push(("selfplay/elo".to_owned(), sp.rating));
                    values.push(("selfplay/games".to_owned(), sp.games as f64));
                    for b in &sp.builtin {
                        values.extend(
                            b.scores
                                .mean()
                                .map(|w| (format!("selfplay/win_rate_vs_{}", b.name), w)),
                        );
                    }
                }
                due.push(Scalars {
                    policy,
                    env_frames: frames,
                    values,
                });
            }
            if p.training_scalars.take(frames, every, force) {
                let mut values = vec![("train/policy_version".to_owned(), p.version as f64)];
                values.extend(p.last_metrics.iter().cloned());
                due.push(Scalars {
                    policy,
                    env_frames: frames,
                    values,
                });
            }
        }
        due
    }

    /// The frames so far against the run's budget: the share of `--train_for_env_steps` or of
    /// `--train_for_seconds` done, whichever is ahead, and the time left at `fps` (or by the clock),
    /// whichever ends first; on a terminal, a bar before it.
    fn budget_progress(&self, fps: f64) -> String {
        let frames = self.env_frames;
        let elapsed = self.sampling_start.elapsed().as_secs_f64();
        let by_frames = frames as f64 / self.max_frames.max(1) as f64;
        let timed = self.max_seconds.is_finite() && self.max_seconds < UNLIMITED_SECONDS;
        let by_time = if timed { elapsed / self.max_seconds } else { 0.0 };
        let done = by_frames.max(by_time).min(1.0);
        let mut left = self.max_frames.saturating_sub(frames) as f64 / fps.max(1e-9);
        if timed {
            left = left.min((self.max_seconds - elapsed).max(0.0));
        }
        let eta = if left.is_finite() && left < 1e7 {
            format_seconds(left)
        } else {
            "n/a".to_owned()
        };
        let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            let filled = (done * 20.0).round() as usize;
            format!("[{}{}] ", "#".repeat(filled), ".".repeat(20 - filled))
        } else {
            String::new()
        };
        format!(
            "{bar}frames {frames} of {} ({:.1}%, ETA {eta})",
            self.max_frames,
            100.0 * done
        )
    }

    /// A progress report: the line (frames against the budget, FPS over the last `FPS_WINDOW`, mean
    /// return, policy lag) and `perf/_fps`.
    pub fn report(&mut self) -> Report {
        let now = Instant::now();
        while self
            .line_marks
            .get(1)
            .is_some_and(|&(t, _)| now.duration_since(t) >= FPS_WINDOW)
        {
            self.line_marks.pop_front();
        }
        let (then, frames) = self.line_marks.front().copied().unwrap_or((now, self.env_frames));
        let dt = now.duration_since(then).as_secs_f64().max(1e-9);
        let fps = self.env_frames.saturating_sub(frames) as f64 / dt;
        self.line_marks.push_back((now, self.env_frames));
        let ret = self
            .mean_return()
            .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.1}"));
        let mut line = format!(
            "{} | fps {:.0} | mean return {} ({} episodes)",
            self.budget_progress(fps),
            fps,
            ret,
            self.episodes
        );
        for (i, p) in self.policies.iter().enumerate() {
            let tag = if self.policies.len() == 1 {
                " |".to_owned()
            } else {
                format!(" | p{i}")
            };
            let ret = p
                .returns
                .mean()
                .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.1}"));
            if self.policies.len() > 1 {
                line.push_str(&format!("{tag} return {ret}"));
            }
            line.push_str(&format!(
                "{tag} policy lag {:.1} | version {}",
                p.version_diff, p.version
            ));
            if let Some(sp) = &p.self_play {
                let rate = |w: Option<f64>| w.map_or_else(|| "n/a".to_owned(), |w| format!("{w:.2}"));
                line.push_str(&format!(
                    "{tag} Elo {:.0}, won {} against the pool",
                    sp.rating,
                    rate(sp.scores.mean())
                ));
                for b in &sp.builtin {
                    line.push_str(&format!(", {} against {}", rate(b.scores.mean()), b.name));
                }
            }
        }
        Report {
            line,
            scalars: Scalars {
                policy: 0,
                env_frames: self.env_frames,
                values: vec![("perf/_fps".to_owned(), fps)],
            },
        }
    }

    /// The summary of the run so far.
    pub fn summary(&self) -> Summary {
        let elapsed = self.sampling_start.elapsed().as_secs_f64().max(1e-9);
        let fps_overall = self.env_frames as f64 / elapsed;
        let steady = self.steady_from.and_then(|(t, frames)| {
            let dt = self.last_report.duration_since(t).as_secs_f64();
            (dt > 0.0).then(|| self.env_frames.saturating_sub(frames) as f64 / dt)
        });
        Summary {
            env_frames: self.env_frames,
            wall_seconds: self.process_start.elapsed().as_secs_f64(),
            fps: steady.unwrap_or(fps_overall),
            fps_overall,
            mean_return: self.mean_return(),
            policies: self
                .policies
                .iter()
                .map(|p| PolicySummary {
                    mean_return: p.returns.mean(),
                    true_objective: p.objectives.mean(),
                    episodes: p.episodes,
                    agent_steps: p.agent_steps,
                    policy_version: p.version,
                    self_play: p.self_play.as_ref().map(SelfPlayStats::summary),
                })
                .collect(),
            agents: self
                .agents
                .iter()
                .map(|a| AgentSummary {
                    name: a.name.clone(),
                    mean_return: a.returns.mean(),
                    true_objective: a.objectives.mean(),
                    episodes: a.episodes,
                })
                .collect(),
            reached_reward: self.reached.is_some(),
            frames_to_reward: self.reached.map(|r| r.0),
            seconds_to_reward: self.reached.map(|r| r.1),
            episodes: self.episodes,
            policy_version: self.policies[0].version,
            stop_reason: self.stop.unwrap_or(StopReason::Failed),
            last_metrics: self.policies[0].last_metrics.clone(),
            first_dataset_digest: self.first_dataset_digest.map(|d| format!("{d:016x}")),
            signal: None,
            trajectories_produced: 0,
            trajectories_trained: 0,
            trajectories_dropped: 0,
            trajectories_in_flight: 0,
            env_frames_lost: 0,
            env_frames_stepped: 0,
            replay: Vec::new(),
            worker_restarts: 0,
            cpu_seconds: BTreeMap::new(),
        }
    }
}

/// One progress report of the [`RunStats`].
#[derive(Debug, Clone)]
pub struct Report {
    /// The progress line.
    pub line: String,
    /// `perf/_fps` since the last report.
    pub scalars: Scalars,
}

/// `seconds` as a person reads a duration: `42 s`, `3 min 05 s`, `2 h 14 min`.
pub fn format_seconds(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3600, s / 60 % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(overrides: &[&str]) -> RunStats {
        runner_on("CartPole-v1", overrides)
    }

    fn runner_on(env: &str, overrides: &[&str]) -> RunStats {
        let cfg = Config::for_env(env, overrides).expect("config");
        RunStats::new(&cfg, Instant::now())
    }

    fn rollout(env_frames: u64, returns: &[f64]) -> RolloutReport {
        RolloutReport {
            worker: 0,
            env_frames,
            episode_returns: returns.to_vec(),
            episode_objectives: returns.to_vec(),
            episode_lengths: returns.iter().map(|&r| r as u64).collect(),
            episode_policies: vec![0; returns.len()],
            episode_agents: vec![0; returns.len()],
            policy_frames: vec![env_frames],
            games: Vec::new(),
        }
    }

    fn training(version: u64, loss: f64) -> TrainingReport {
        TrainingReport {
            policy: 0,
            version,
            metrics: vec![("train/loss".to_owned(), loss)],
            dataset_digest: Some(version),
        }
    }

    fn tags(s: &Scalars) -> Vec<&str> {
        s.values.iter().map(|(t, _)| t.as_str()).collect()
    }

    #[test]
    fn stops_at_the_frame_budget_and_at_the_reward_over_a_full_window() {
        let mut r = runner(&["train_for_env_steps = 1000", "stop_at_reward = 10"]);
        assert_eq!(r.on_rollout_reported(&rollout(400, &[20.0; 99])), None);
        // The 100th episode fills the window: mean 20 >= 10.
        assert_eq!(
            r.on_rollout_reported(&rollout(100, &[20.0])),
            Some(StopReason::Reward)
        );
        let s = r.summary();
        assert_eq!((s.frames_to_reward, s.episodes), (Some(500), 100));
        let mut r = runner(&["train_for_env_steps = 1000"]);
        assert_eq!(r.on_rollout_reported(&rollout(999, &[])), None);
        assert_eq!(
            r.on_rollout_reported(&rollout(1, &[])),
            Some(StopReason::EnvSteps)
        );
        assert_eq!(r.summary().stop_reason, StopReason::EnvSteps);
    }

    /// A line's FPS is over the reports of the last 10 s (and the one before them), not since the last line:
    /// frames that arrive a trajectory at a time do not make it jump.
    #[test]
    fn the_progress_lines_fps_is_over_the_last_ten_seconds() {
        let mut r = runner(&["train_for_env_steps = 100000"]);
        r.on_rollout_reported(&rollout(2024, &[]));
        let ago = |secs: u64| {
            Instant::now()
                .checked_sub(Duration::from_secs(secs))
                .expect("uptime")
        };
        r.line_marks = VecDeque::from([(ago(12), 0), (ago(6), 1000), (ago(1), 1500)]);
        let line = r.report().line;
        assert!(line.contains("| fps 169 |"), "{line}");
        r.line_marks = VecDeque::from([(ago(25), 0), (ago(11), 500), (ago(3), 1000)]);
        let line = r.report().line;
        assert!(line.contains("| fps 139 |"), "{line}");
        assert_eq!(
            r.line_marks.len(),
            3,
            "the mark of 25 s ago is dropped, this report's kept"
        );
    }

    #[test]
    fn the_progress_line_says_how_much_of_the_budget_is_done_and_what_is_left() {
        let mut r = runner(&["train_for_env_steps = 1000"]);
        r.on_rollout_reported(&rollout(250, &[]));
        let line = r.report().line;
        assert!(line.contains("frames 250 of 1000 (25.0%, ETA "), "{line}");
        let mut r = runner(&["train_for_env_steps = 1000", "train_for_seconds = 3600"]);
        r.on_rollout_reported(&rollout(10, &[]));
        let line = r.report().line;
        assert!(line.contains("frames 10 of 1000 (1.0%, ETA "), "{line}");
        let eta = line
            .split("ETA ")
            .nth(1)
            .and_then(|e| e.split(')').next())
            .expect("an ETA");
        assert!(
            eta.ends_with(" s") || eta.contains("min") || eta.contains(" h "),
            "{eta}"
        );
        assert_eq!(
            [0.4, 59.0, 61.0, 3599.0, 7300.0].map(format_seconds),
            ["0 s", "59 s", "1 min 01 s", "59 min 59 s", "2 h 01 min"]
        );
    }

    #[test]
    fn scalars_start_with_the_first_episode_and_respect_the_interval() {
        let mut r = runner(&["summary_every_env_steps = 1000"]);
        assert!(r.due_scalars(false).is_empty(), "nothing happened yet");
        r.on_rollout_reported(&rollout(100, &[]));
        assert!(r.due_scalars(false).is_empty(), "no episode ended yet");
        r.on_rollout_reported(&rollout(100, &[9.0]));
        let due = r.due_scalars(false);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].env_frames, 200);
        assert_eq!(
            tags(&due[0]),
            [
                "stats/episodes",
                "reward/reward",
                "policy_stats/avg_true_objective",
                "len/len",
                "stats/agent_steps"
            ]
        );
        assert_eq!(due[0].values[1].1, 9.0);
        // Within the interval: not due again until frame 1200.
        r.on_rollout_reported(&rollout(500, &[11.0]));
        r.on_training_reported(&training(1, 0.5));
        let due = r.due_scalars(false);
        assert_eq!(due.len(), 1, "only the first training metrics: {due:?}");
        assert_eq!(tags(&due[0]), ["train/policy_version", "train/loss"]);
        r.on_rollout_reported(&rollout(500, &[13.0]));
        let due = r.due_scalars(false);
        assert_eq!((due.len(), due[0].env_frames), (1, 1200));
        assert_eq!(due[0].values[1].1, 11.0, "mean of 9, 11 and 13");
        // At stop, whatever is new is written regardless of the interval; nothing twice.
        r.on_training_reported(&training(2, 0.25));
        let due = r.due_scalars(true);
        assert_eq!(due.len(), 1);
        assert_eq!(
            due[0].values,
            [
                ("train/policy_version".to_owned(), 2.0),
                ("train/loss".to_owned(), 0.25)
            ]
        );
        assert!(r.due_scalars(true).is_empty());
        // Frames after the last scalars but no episode ended and no training: at stop the last values are written
        // again at the run's end.
        r.on_rollout_reported(&rollout(64, &[]));
        let due = r.due_scalars(true);
        assert_eq!(due.len(), 2, "{due:?}");
        assert!(due.iter().all(|d| d.env_frames == 1264), "{due:?}");
        assert_eq!(due[0].values[1].1, 11.0);
        assert!(r.due_scalars(true).is_empty());
    }

    #[test]
    fn an_interval_of_zero_writes_every_report() {
        let mut r = runner(&["summary_every_env_steps = 0"]);
        for i in 0..3 {
            r.on_rollout_reported(&rollout(10, &[f64::from(i)]));
            r.on_training_reported(&training(i as u64, 1.0));
            assert_eq!(r.due_scalars(false).len(), 2);
        }
    }

    #[test]
    fn a_resumed_run_continues_its_counts() {
        let mut r = runner(&["train_for_env_steps = 5000", "num_policies = 2"]);
        r.resume_from(4000, 30, &[7, 5]);
        assert_eq!(r.checkpoint_request().env_steps, 4000);
        assert_eq!(
            r.on_rollout_reported(&rollout(1000, &[])),
            Some(StopReason::EnvSteps)
        );
        let s = r.summary();
        assert_eq!((s.env_frames, s.episodes, s.policy_version), (5000, 30, 7));
        let versions: Vec<u64> = s.policies.iter().map(|p| p.policy_version).collect();
        assert_eq!(versions, [7, 5], "every policy's version, trained since or not");
    }

    #[test]
    fn self_play_takes_snapshots_on_schedule_and_rates_them_by_elo() {
        let mut r = runner_on(
            "connect_four",
            &[
                "self_play = true",
                "snapshot_every_env_steps = 1000",
                "opponent_pool_size = 2",
            ],
        );
        assert_eq!(
            r.due_snapshot(),
            Some(SnapshotRequest { number: 1 }),
            "the initial weights"
        );
        assert_eq!(r.due_snapshot(), None);
        r.on_rollout_reported(&rollout(2500, &[]));
        assert_eq!(r.due_snapshot(), Some(SnapshotRequest { number: 2 }));
        assert_eq!(r.due_snapshot(), None, "one snapshot per crossing, next at 3000");
        r.on_snapshot_taken(&SnapshotTaken {
            policy: 0,
            slot: 0,
            number: 1,
            version: 40,
        });
        // Network 1 is slot 0 of policy 0's pool (one policy): three wins and a draw.
        let mut report = rollout(100, &[]);
        report.games = [1.0, 1.0, 1.0, 0.5]
            .iter()
            .map(|&score| SelfPlayGame {
                policy: 0,
                network: 1,
                score,
            })
            .collect();
        r.on_rollout_reported(&report);
        let sp = r.summary().policies[0]
            .self_play
            .clone()
            .expect("self-play stats");
        assert_eq!((sp.games, sp.win_rate_vs_pool), (4, Some(0.875)));
        assert!(
            sp.elo > ELO_START && sp.elo < ELO_START + 4.0 * ELO_K,
            "{}",
            sp.elo
        );
        assert_eq!(sp.pool.len(), 1);
        let snapshot = &sp.pool[0];
        assert_eq!(
            (snapshot.number, snapshot.policy_version, snapshot.games),
            (1, 40, 4)
        );
        // Elo is zero-sum between the two.
        assert!((snapshot.elo + sp.elo - 2.0 * ELO_START).abs() < 1e-9);
        let due = r.due_scalars(true);
        assert!(
            due.iter()
                .flat_map(|s| &s.values)
                .any(|(tag, v)| tag == "selfplay/win_rate_vs_pool" && *v == 0.875),
            "{due:?}"
        );
        // A game against an empty slot (no snapshot yet) counts for nothing.
        let mut report = rollout(100, &[]);
        report.games = vec![SelfPlayGame {
            policy: 0,
            network: 2,
            score: 0.0,
        }];
        r.on_rollout_reported(&report);
        assert_eq!(
            r.summary().policies[0].self_play.as_ref().map(|s| s.games),
            Some(4)
        );
    }

    #[test]
    fn a_resumed_run_continues_the_elo_ratings_of_the_snapshots_it_puts_back() {
        let args = [
            "self_play = true",
            "opponent_pool_size = 2",
            "self_play_builtin_opponents = 'heuristic'",
            "self_play_builtin_prob = 0.5",
        ];
        let taken = |slot, number, version| SnapshotTaken {
            policy: 0,
            slot,
            number,
            version,
        };
        let games = |played: &[(usize, f64)]| {
            let mut report = rollout(100, &[]);
            report.games = played
                .iter()
                .map(|&(network, score)| SelfPlayGame {
                    policy: 0,
                    network,
                    score,
                })
                .collect();
            report
        };
        let mut first = runner_on("connect_four", &args);
        first.on_snapshot_taken(&taken(0, 1, 0));
        first.on_snapshot_taken(&taken(1, 2, 30));
        // Networks 1 and 2 are the pool's slots, network 3 the heuristic.
        first.on_rollout_reported(&games(&[(1, 1.0), (1, 1.0), (2, 0.0), (3, 1.0)]));
        let records = first.self_play_records();
        assert_eq!(records.len(), 1);
        let (policy, saved) = records[0].clone();
        assert_eq!((policy, saved.env_frames), (0, 100));
        assert_eq!((saved.record.games, saved.record.pool.len()), (3, 2));
        // Through the file's JSON, as a resumed run reads it.
        let file: SavedSelfPlay =
            serde_json::from_str(&serde_json::to_string(&saved).expect("serialised")).expect("read back");
        let saved = file.record.clone();

        let mut resumed = runner_on("connect_four", &args);
        resumed.resume_from(100, 0, &[0]);
        assert!(
            resumed.resume_self_play(0, file.clone()),
            "the record of the resumed frames"
        );
        // Until the learner announces its pool again, the saved snapshots stay in the record.
        assert_eq!(resumed.self_play_records()[0].1.record.pool.len(), 2);
        // Snapshot 1 is put back as it was saved (announced twice, it keeps its rating); slot 1 holds a snapshot
        // the save did not have (number 2 with another version is another snapshot).
        resumed.on_snapshot_taken(&taken(0, 1, 0));
        resumed.on_snapshot_taken(&taken(0, 1, 0));
        resumed.on_snapshot_taken(&taken(1, 2, 31));
        let now = resumed.summary().policies[0]
            .self_play
            .clone()
            .expect("self-play stats");
        assert_eq!(
            (now.elo, now.games),
            (saved.elo, 3),
            "the latest weights' rating goes on"
        );
        assert_eq!(now.builtin[0].games, 1, "and the games against the heuristic");
        assert_eq!(now.win_rate_vs_pool, None, "the window starts empty");
        let rating = |sp: &SelfPlaySummary, number: u64| {
            let s = sp.pool.iter().find(|s| s.number == number).expect("in the pool");
            (s.elo, s.games)
        };
        assert_eq!(rating(&now, 1), rating(&saved, 1));
        assert_ne!(rating(&saved, 1).0, ELO_START, "snapshot 1 had moved");
        assert_eq!(
            rating(&now, 2),
            (saved.elo, 0),
            "a new snapshot starts at the latest rating"
        );
        // A game goes on from the restored ratings.
        resumed.on_rollout_reported(&games(&[(1, 0.0)]));
        let after = resumed.summary().policies[0].self_play.clone().expect("stats");
        let expected = ELO_K * elo_expected(saved.elo, rating(&saved, 1).0);
        assert!((after.elo - (saved.elo - expected)).abs() < 1e-9, "{after:?}");
        assert_eq!((after.games, rating(&after, 1).1), (4, 3));

        // Resumed from another checkpoint (an older best one): the latest weights start again, the snapshots
        // keep theirs.
        let mut older = runner_on("connect_four", &args);
        older.resume_from(60, 0, &[0]);
        assert!(!older.resume_self_play(0, file));
        older.on_snapshot_taken(&taken(0, 1, 0));
        let sp = older.summary().policies[0].self_play.clone().expect("stats");
        assert_eq!((sp.elo, sp.games), (ELO_START, 0));
        assert_eq!(rating(&sp, 1), rating(&saved, 1));
    }

    #[test]
    fn games_against_built_in_players_are_scored_apart_from_the_pool() {
        let mut r = runner_on(
            "connect_four",
            &[
                "self_play = true",
                "opponent_pool_size = 2",
                "self_play_builtin_opponents = 'random,heuristic'",
                "self_play_builtin_prob = 0.5",
            ],
        );
        // One policy, pools of 2: networks 3 and 4 are `random` and `heuristic`.
        let mut report = rollout(100, &[]);
        report.games = [(3, 1.0), (3, 1.0), (4, 0.0), (4, 1.0), (4, 0.0), (4, 0.5)]
            .iter()
            .map(|&(network, score)| SelfPlayGame {
                policy: 0,
                network,
                score,
            })
            .collect();
        r.on_rollout_reported(&report);
        let sp = r.summary().policies[0]
            .self_play
            .clone()
            .expect("self-play stats");
        assert_eq!((sp.games, sp.elo), (0, ELO_START), "no pool game, no rating");
        let records: Vec<_> = sp
            .builtin
            .iter()
            .map(|b| (b.name.as_str(), b.games, b.win_rate))
            .collect();
        assert_eq!(records, [("random", 2, Some(1.0)), ("heuristic", 4, Some(0.375))]);
        let line = r.report().line;
        assert!(
            line.contains("1.00 against random, 0.38 against heuristic"),
            "{line}"
        );
        let due = r.due_scalars(true);
        assert!(
            due.iter()
                .flat_map(|s| &s.values)
                .any(|(tag, v)| tag == "selfplay/win_rate_vs_heuristic" && *v == 0.375),
            "{due:?}"
        );
    }

    #[test]
    fn each_policys_mean_is_over_its_last_stats_avg_episodes() {
        let mut r = runner(&["stats_avg = 3"]);
        r.on_rollout_reported(&rollout(10, &[100.0, 1.0, 2.0, 3.0]));
        assert_eq!(r.mean_return(), Some(2.0));
        assert_eq!(r.policy_objective(0), Some(2.0));
        assert_eq!(r.summary().policies[0].mean_return, Some(2.0));
    }

    /// After PBT replaces a policy's weights, the episodes of its old weights no longer count towards its mean.
    #[test]
    fn a_replaced_policy_forgets_its_old_episodes() {
        let mut r = runner(&["stats_avg = 3"]);
        r.on_rollout_reported(&rollout(10, &[-50.0, -60.0, -70.0]));
        r.forget_recent_episodes(0);
        assert_eq!(r.policy_objective(0), None);
        assert_eq!(r.summary().policies[0].mean_return, None);
        // One lucky episode neither ranks the policy nor makes a best checkpoint: a full window does.
        r.on_rollout_reported(&rollout(10, &[500.0]));
        assert_eq!(
            (r.policy_objective(0), r.checkpoint_request().best_metric(0)),
            (None, None)
        );
        r.on_rollout_reported(&rollout(10, &[5.0, 5.0]));
        assert_eq!(r.policy_objective(0), Some(170.0));
        assert_eq!(r.checkpoint_request().best_metric(0), Some(170.0));
    }

    #[test]
    fn each_agents_episodes_are_averaged_under_its_name() {
        let mut r = runner(&["stats_avg = 2"]);
        r.track_agents(&["player_0".to_owned(), "player_1".to_owned()]);
        let mut report = rollout(10, &[1.0, -1.0, 3.0, -3.0, 5.0]);
        report.episode_agents = vec![0, 1, 0, 1, 0];
        r.on_rollout_reported(&report);
        let agents = r.summary().agents;
        let seen: Vec<(&str, Option<f64>, u64)> = agents
            .iter()
            .map(|a| (a.name.as_str(), a.mean_return, a.episodes))
            .collect();
        assert_eq!(seen, [("player_0", Some(4.0), 3), ("player_1", Some(-2.0), 2)]);
        assert!(runner(&[]).summary().agents.is_empty());
    }

    #[test]
    fn the_true_objective_ranks_policies_and_checkpoints_when_asked() {
        let mut report = rollout(10, &[10.0, 20.0]);
        report.episode_objectives = vec![1.0, 0.0];
        let mut by_reward = runner(&[]);
        by_reward.on_rollout_reported(&report);
        assert_eq!(by_reward.policy_objective(0), Some(0.5));
        assert_eq!(by_reward.summary().policies[0].true_objective, Some(0.5));
        assert_eq!(by_reward.checkpoint_request().best_metric(0), Some(15.0));
        let due = by_reward.due_scalars(true);
        assert!(
            due.iter()
                .flat_map(|s| &s.values)
                .any(|(tag, v)| tag == "policy_stats/avg_true_objective" && *v == 0.5),
            "{due:?}"
        );
        let mut by_objective = runner(&["save_best_metric = 'true_objective'"]);
        by_objective.on_rollout_reported(&report);
        assert_eq!(by_objective.checkpoint_request().best_metric(0), Some(0.5));
    }
}
