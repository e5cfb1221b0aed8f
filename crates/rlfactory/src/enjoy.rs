//! Using a trained policy: `rlfactory enjoy` runs episodes and prints their returns, `rlfactory eval`
//! does the same on many envs at once and writes a CSV, `rlfactory export` writes the
//! policy as a PyTorch state dict.
//!
//! All three read the experiment folder `<train_dir>/<experiment>/`: its `config.json` rebuilds the
//! network, and the newest intact checkpoint of `--load_checkpoint_kind` (latest or best) fills it; a
//! corrupt newer checkpoint is named on stderr and passed over.
//!
//! # The exported state dict
//! `rlfactory export --env CartPole-v1 --experiment cartpole --out policy.safetensors` writes every
//! variable of the actor-critic by a PyTorch-style name, float32, `nn.Linear` weights as
//! `[out_features, in_features]`:
//!
//! | name | what |
//! |---|---|
//! | `actor_encoder.fc<i>.{weight,bias}` | hidden layer `i` of the (actor's) MLP encoder |
//! | `critic_encoder.fc<i>.{weight,bias}` | the critic's encoder (absent with `--actor_critic_share_weights`) |
//! | `action_head.{weight,bias}` | logits, or the Gaussian mean (and log-std with `--adaptive_stddev`) |
//! | `value_head.{weight,bias}` | the value, in units of the return normaliser when `--normalize_returns` |
//! | `log_std` | the learned log standard deviation of a Gaussian head |
//! | `obs_normalizer.{mean,var,count}` | running observation statistics (`--normalize_input`) |
//! | `returns_normalizer.{mean,var,count}` | running return statistics (`--normalize_returns`) |
//!
//! The file's metadata (`__metadata__`) holds `observation_layout`: JSON naming each part of the observation (one
//! part, `obs`, unless it is a Dict) with its `offset` and `length` in the flat vector the network reads, and a
//! Box's `shape` (an image's `[H, W, C]` or `[C, H, W]`); the weights alone do not say where the image is.
//! Convolutional encoders add `actor_encoder.conv<i>.{weight,bias}` (`--encoder_conv_layers`, before the MLP's
//! `fc<i>`) or one network per part, `actor_encoder.<part>.…` (`--encoder_conv_architecture`); Python's
//! `rlfactory.load_policy` builds all of these.
//!
//! An equivalent `torch.nn.Module` (default CartPole-v1 settings: 64,64 tanh MLP encoders, separate
//! actor and critic, discrete actions, no normalisers) loads it with `strict=True`:
//!
//! ```text
//! import torch, torch.nn as nn
//! from safetensors.torch import load_file
//!
//! class Mlp(nn.Module):
//!     def __init__(self, sizes):
//!         super().__init__()
//!         for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
//!             setattr(self, f"fc{i}", nn.Linear(a, b))
//!         self.n = len(sizes) - 1
//!     def forward(self, x):
//!         for i in range(self.n):
//!             x = torch.tanh(getattr(self, f"fc{i}")(x))
//!         return x
//!
//! class ActorCritic(nn.Module):
//!     def __init__(self, obs_dim=4, n_actions=2, hidden=(64, 64)):
//!         super().__init__()
//!         self.actor_encoder = Mlp([obs_dim, *hidden])
//!         self.critic_encoder = Mlp([obs_dim, *hidden])
//!         self.action_head = nn.Linear(hidden[-1], n_actions)
//!         self.value_head = nn.Linear(hidden[-1], 1)
//!     def forward(self, obs):
//!         return self.action_head(self.actor_encoder(obs)), self.value_head(self.critic_encoder(obs))
//!
//! model = ActorCritic()
//! model.load_state_dict(load_file("policy.safetensors"), strict=True)
//! ```
//!
//! With `--normalize_input`, add the `obs_normalizer` buffers and feed
//! `clamp((obs - mean) / sqrt(var + 1e-5), -10, 10)`. The tests read the file with Python's
//! `safetensors` and compare names, shapes and values with the checkpoint.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{ArgAction, Args};

use crate::config::{parse_bool, CheckpointKind, Config};
use rlf_env::connect_four::{self, play_game, ConnectFour, HeuristicPlayer, Player, RandomPlayer, Side};

use crate::env::{ActionMapper, EnvRegistry, Envs, VecBuffers};
use crate::error::{Result, RlfError};
use crate::experiment::{self, RestoredState};
use crate::model::{ActOutput, ActorCritic, Policy};
use crate::plan::RunPlan;
use crate::video::Recorder;

/// Which experiment and checkpoint to load.
#[derive(Debug, Clone, Args)]
#[command(rename_all = "snake_case")]
pub struct CheckpointSource {
    /// Environment id (must be the one the experiment was trained on).
    #[arg(long)]
    pub env: String,
    /// Experiment name (a folder under `train_dir`).
    #[arg(long, default_value = "default_experiment")]
    pub experiment: String,
    /// Root folder of experiments.
    #[arg(long, default_value = "train_dir")]
    pub train_dir: PathBuf,
    /// Which checkpoint to load.
    #[arg(long, value_enum, default_value_t = CheckpointKind::Latest)]
    pub load_checkpoint_kind: CheckpointKind,
    /// Which policy's checkpoint to load (`checkpoint_p<i>/`), for runs of several policies.
    #[arg(long, default_value_t = 0)]
    pub policy_index: usize,
}

/// `rlfactory enjoy`.
#[derive(Debug, Clone, Args)]
#[command(rename_all = "snake_case")]
pub struct EnjoyArgs {
    /// The experiment and checkpoint.
    #[command(flatten)]
    pub source: CheckpointSource,
    /// Episodes to run.
    #[arg(long, default_value_t = 10)]
    pub max_num_episodes: usize,
    /// Frames to run at most, one per env step of each env, whichever of this and `--max_num_episodes` comes first
    /// (the episodes still running then are not counted).
    #[arg(long, default_value_t = 1_000_000_000)]
    pub max_num_frames: u64,
    /// Take the most likely action (argmax, or the Gaussian mean) instead of sampling.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub eval_deterministic: bool,
    /// Seed of the envs (env `i` gets `seed + i`) and of action sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write a video of the episodes into the experiment folder (`--video_name`; MP4, H.264): env 0's pictures
    /// after its reset and after every step (Gymnasium envs' `rgb_array` renders, Atari's screen, the native
    /// classic-control envs drawn as Gymnasium draws them). Needs ffmpeg (or Python's imageio-ffmpeg).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub save_video: bool,
    /// Frames the video holds at most (the episodes go on).
    #[arg(long, default_value_t = 1_000_000_000)]
    pub video_frames: u64,
    /// The video's file name in the experiment folder.
    #[arg(long, default_value = "replay.mp4")]
    pub video_name: String,
    /// Frames per second of the video.
    #[arg(long, default_value_t = 30.0)]
    pub fps: f64,
}

/// `rlfactory eval`.
#[derive(Debug, Clone, Args)]
#[command(rename_all = "snake_case")]
pub struct EvalArgs {
    /// What `enjoy` takes.
    #[command(flatten)]
    pub enjoy: EnjoyArgs,
    /// Envs stepped together (one batch through the policy per step).
    #[arg(long, default_value_t = 8)]
    pub num_envs: usize,
    /// Write one line per episode (`episode,env,return,length`) to this CSV file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// For `connect_four`: play `--max_num_episodes` games against this opponent instead
    /// (colours alternating, the policy first in game 0) and report wins, draws and losses.
    #[arg(long, value_enum)]
    pub opponent: Option<Opponent>,
    /// With `--opponent checkpoint`: the opponent's experiment (under the same `--train_dir`;
    /// the same experiment when not given).
    #[arg(long)]
    pub opponent_experiment: Option<String>,
    /// With `--opponent checkpoint`: which of its policies (`checkpoint_p<i>/`).
    #[arg(long, default_value_t = 0)]
    pub opponent_policy_index: usize,
}

/// A built-in Connect Four player for `eval --opponent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Opponent {
    /// A uniformly random legal move.
    Random,
    /// One ply: win if it can, else block the opponent's win, else random.
    Heuristic,
    /// Another trained policy (`--opponent_experiment`, `--opponent_policy_index`), playing
    /// as `--eval_deterministic` says.
    Checkpoint,
}

/// Games of a policy against an opponent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Record {
    /// Games the policy won.
    pub wins: usize,
    /// Drawn games.
    pub draws: usize,
    /// Games the policy lost.
    pub losses: usize,
    /// The policy's one-ply tactics over those games.
    pub tactics: Tactics,
}

/// A Connect Four player's one-ply tactics (what [`HeuristicPlayer`] always does): of its moves, how many had a win
/// on offer and took one, and how many faced an immediate threat of the opponent (with no win of their own on
/// offer) and blocked it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tactics {
    /// Moves with a winning column among the legal ones.
    pub wins_on_offer: usize,
    /// Of those, the moves that won.
    pub wins_taken: usize,
    /// Moves without a win on offer where the opponent would win next in some column.
    pub threats: usize,
    /// Of those, the moves into such a column.
    pub blocked: usize,
}

impl Tactics {
    /// Counts the move `column` of the side to move in `game`, before it is played.
    fn count(&mut self, game: &ConnectFour, column: usize) {
        let me = game.to_move();
        let wins = |side: Side| {
            game.legal_moves()
                .filter(|&c| game.is_winning_move(c, side))
                .collect::<Vec<_>>()
        };
        let mine = wins(me);
        if !mine.is_empty() {
            self.wins_on_offer += 1;
            self.wins_taken += usize::from(mine.contains(&column));
            return;
        }
        let theirs = wins(me.opponent());
        if !theirs.is_empty() {
            self.threats += 1;
            self.blocked += usize::from(theirs.contains(&column));
        }
    }
}

impl Record {
    /// Wins over games played (0 with none).
    pub fn win_rate(&self) -> f64 {
        self.wins as f64 / (self.wins + self.draws + self.losses).max(1) as f64
    }
}

/// `rlfactory export`.
#[derive(Debug, Clone, Args)]
#[command(rename_all = "snake_case")]
pub struct ExportArgs {
    /// The experiment and checkpoint.
    #[command(flatten)]
    pub source: CheckpointSource,
    /// The safetensors file to write.
    #[arg(long)]
    pub out: PathBuf,
}

impl EnjoyArgs {
    /// Checks the experiment folder and the episode count (bad-input errors).
    pub fn check(&self) -> Result<()> {
        if self.max_num_episodes == 0 {
            return Err(RlfError::Config("--max_num_episodes must be at least 1".into()));
        }
        if self.max_num_frames == 0 {
            return Err(RlfError::Config("--max_num_frames must be at least 1".into()));
        }
        if self.save_video && (self.video_name.is_empty() || self.video_name.contains('/')) {
            return Err(RlfError::Config(format!(
                "--video_name {:?}: a file name in the experiment folder",
                self.video_name
            )));
        }
        self.source.check()
    }

    /// The recorder of `--save_video`, if asked.
    fn recorder(&self) -> Result<Option<Recorder>> {
        self.save_video
            .then(|| {
                let path = self.source.dir().join(&self.video_name);
                Recorder::new(path, self.fps, self.video_frames, &self.source.env)
            })
            .transpose()
    }

    /// Finishes the video, and says where it is.
    fn finish_video(&self, video: Option<Recorder>) -> Result<()> {
        if let Some(video) = video {
            let (path, frames) = video.finish()?;
            eprintln!("[rlfactory] wrote {} ({frames} frames)", path.display());
        }
        Ok(())
    }
}

impl EvalArgs {
    /// Checks what `enjoy` checks and the number of envs (bad-input errors).
    pub fn check(&self) -> Result<()> {
        if self.num_envs == 0 {
            return Err(RlfError::Config("--num_envs must be at least 1".into()));
        }
        if self.opponent.is_some() && self.enjoy.source.env != "connect_four" {
            return Err(RlfError::Config(format!(
                "--opponent: built-in opponents play connect_four, not {}",
                self.enjoy.source.env
            )));
        }
        self.enjoy.check()
    }
}

impl CheckpointSource {
    fn dir(&self) -> PathBuf {
        self.train_dir.join(&self.experiment)
    }

    /// Checks that the experiment folder and its `config.json` exist (a bad-input error otherwise).
    pub fn check(&self) -> Result<()> {
        let config = self.dir().join("config.json");
        if config.is_file() {
            Ok(())
        } else {
            Err(RlfError::Config(format!(
                "--experiment {}: no experiment at {} (config.json missing)",
                self.experiment,
                self.dir().display()
            )))
        }
    }

    /// The experiment's saved config (`config.json`), resolved against its env; it must be for `--env`.
    pub fn plan(&self, registry: &EnvRegistry) -> Result<(Config, RunPlan)> {
        let cfg = Config::from_file(&self.dir().join("config.json"))?;
        if cfg.env.env != self.env {
            return Err(RlfError::Config(format!(
                "--env {}: experiment {} was trained on {}",
                self.env, self.experiment, cfg.env.env
            )));
        }
        let plan = RunPlan::resolve(&cfg, registry)?;
        Ok((cfg, plan))
    }

    /// The trained network with the checkpoint's weights and statistics (an actor-critic, or a Q-network
    /// acting greedily for `--algo dqn`), with its config and plan.
    pub fn load(&self, registry: &EnvRegistry) -> Result<(Config, RunPlan, Box<dyn Policy>)> {
        let (cfg, plan) = self.plan(registry)?;
        let model = self.network(&cfg, &plan)?;
        Ok((cfg, plan, model))
    }

    /// As [`load`](Self::load), the network of policy `policy_index` of an experiment whose config and plan are
    /// `cfg` and `plan`.
    fn network(&self, cfg: &Config, plan: &RunPlan) -> Result<Box<dyn Policy>> {
        if self.policy_index >= cfg.sampling.num_policies {
            return Err(RlfError::Config(format!(
                "--policy_index {}: experiment {} trained {} policies",
                self.policy_index, self.experiment, cfg.sampling.num_policies
            )));
        }
        let store = experiment::open_store(&self.train_dir, &self.experiment, self.policy_index)?;
        let state: RestoredState = experiment::load(&store, self.load_checkpoint_kind)?.ok_or_else(|| {
            RlfError::Config(format!(
                "--load_checkpoint_kind={}: no such checkpoint in {}",
                match self.load_checkpoint_kind {
                    CheckpointKind::Latest => "latest",
                    CheckpointKind::Best => "best",
                },
                store.dir().display()
            ))
        })?;
        for skipped in &state.skipped {
            eprintln!("[rlfactory] skipped a broken checkpoint: {skipped}");
        }
        let (observation_space, action_space) = plan
            .env
            .policy_spaces(self.policy_index, plan.mapping.by_agent.as_deref())?;
        let mut model = plan
            .algorithm()?
            .acting_network(observation_space, action_space, cfg)?;
        model.load_named_tensors(&state.tensors)?;
        // Sampled moves explore as at the end of training (DQN's ε); deterministic ones are greedy.
        model.set_exploration(cfg.off_policy.exploration_final_eps);
        eprintln!(
            "[rlfactory] loaded {} (env frames {}, policy version {})",
            state.path.display(),
            state.env_steps,
            state.training.version
        );
        Ok(model)
    }
}

/// One finished episode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Episode {
    /// The column it ran in: the env, or for a multi-agent env `env * num_agents + agent` (each
    /// agent's episode is one episode).
    pub env: usize,
    /// Sum of rewards.
    pub episode_return: f64,
    /// Steps.
    pub length: u64,
}

/// Who plays the agents in `enjoy` and `eval`: the loaded policy plays them all; in an env whose
/// agents differ each agent plays the policy the experiment mapped it to (`--agent_policy_map`),
/// and only the episodes of `--policy_index`'s agents are reported.
pub struct Lineup {
    /// By policy (one for all agents when they are alike).
    models: Vec<Box<dyn Policy>>,
    /// The model of each agent.
    of_agent: Vec<usize>,
    /// Whether each agent's episodes are reported.
    reported: Vec<bool>,
    /// Values per observation slot.
    width: usize,
    gathered: Vec<f32>,
    /// A recurrent policy's state of each column (one policy playing every agent), and before the
    /// latest step.
    states: Vec<f32>,
    before: Vec<f32>,
}

impl Lineup {
    /// `model` playing every agent of `source`'s env; for agents that differ, every policy of the
    /// experiment loaded from `source`'s checkpoints, each playing its agents.
    pub fn load(source: &CheckpointSource, registry: &EnvRegistry) -> Result<(Config, Self)> {
        let (cfg, plan, model) = source.load(registry)?;
        let spec = &plan.env;
        let n = spec.num_agents;
        let by_agent = plan.mapping.by_agent.clone();
        let lineup = match by_agent.filter(|_| !spec.agents_alike()) {
            None => Self {
                models: vec![model],
                of_agent: vec![0; n],
                reported: vec![true; n],
                width: spec.obs_dim,
                gathered: Vec::new(),
                states: Vec::new(),
                before: Vec::new(),
            },
            Some(by_agent) => {
                let mut models = Vec::with_capacity(cfg.sampling.num_policies);
                let mut mine = Some(model);
                for policy in 0..cfg.sampling.num_policies {
                    models.push(match mine.take_if(|_| policy == source.policy_index) {
                        Some(m) => m,
                        None => {
                            let other = CheckpointSource {
                                policy_index: policy,
                                ..source.clone()
                            };
                            other.network(&cfg, &plan)?
                        }
                    });
                }
                Self {
                    reported: by_agent.iter().map(|&p| p == source.policy_index).collect(),
                    of_agent: by_agent,
                    models,
                    width: spec.obs_dim,
                    gathered: Vec::new(),
                    states: Vec::new(),
                    before: Vec::new(),
                }
            }
        };
        Ok((cfg, lineup))
    }

    /// After a step of `envs`: the columns whose agent did not act keep the recurrent state they
    /// had, and those whose episode just ended start again from zero.
    fn forget(&mut self, envs: &Envs, terminated: &[bool], truncated: &[bool]) {
        let d = self.states.len() / terminated.len().max(1);
        if d == 0 {
            return;
        }
        for (c, state) in self.states.chunks_mut(d).enumerate() {
            if !envs.acted(c) {
                state.copy_from_slice(&self.before[c * d..(c + 1) * d]);
            }
            if terminated[c] || truncated[c] {
                state.fill(0.0);
            }
        }
    }

    /// Actions for every column of `obs` (`width` values each): each column's agent's network
    /// takes the first values of its slot.
    fn act(&mut self, obs: &[f32], deterministic: bool) -> Result<ActOutput> {
        if self.models.len() == 1 {
            let model = &mut self.models[0];
            let columns = obs.len() / model.obs_dim().max(1);
            self.states.resize(columns * model.state_dim(), 0.0);
            self.before.clone_from(&self.states);
            return model.act_recurrent(obs, &mut self.states, deterministic);
        }
        let (agents, width) = (self.of_agent.len().max(1), self.width.max(1));
        let columns = obs.len() / width;
        // Action slots as wide as the largest agent's action; each network fills the first values of its columns'.
        let a = self.models.iter().map(|m| m.action_dim()).max().unwrap_or(1);
        let mut out = ActOutput {
            actions: vec![0.0; columns * a],
            log_probs: vec![0.0; columns],
            values: vec![0.0; columns],
        };
        for (m, model) in self.models.iter_mut().enumerate() {
            let rows: Vec<usize> = (0..columns).filter(|&c| self.of_agent[c % agents] == m).collect();
            if rows.is_empty() {
                continue;
            }
            let d = model.obs_dim();
            self.gathered.clear();
            for &c in &rows {
                self.gathered.extend_from_slice(&obs[c * width..c * width + d]);
            }
            let part = model.act(&self.gathered, deterministic)?;
            let k = model.action_dim();
            for (i, &c) in rows.iter().enumerate() {
                out.actions[c * a..c * a + k].copy_from_slice(&part.actions[i * k..(i + 1) * k]);
                out.log_probs[c] = part.log_probs[i];
                out.values[c] = part.values[i];
            }
        }
        Ok(out)
    }
}

/// Runs `episodes` episodes of `lineup` on `envs` (of `cfg`'s env) stepped together, or `max_frames` frames (env
/// steps of all envs) if that comes first, in the order they finish; `on_episode` sees each one.
#[allow(clippy::too_many_arguments)]
pub fn run_episodes(
    cfg: &Config,
    mut envs: Envs,
    lineup: &mut Lineup,
    episodes: usize,
    max_frames: u64,
    deterministic: bool,
    seed: u64,
    mut video: Option<&mut Recorder>,
    mut on_episode: impl FnMut(usize, &Episode) -> Result<()>,
) -> Result<Vec<Episode>> {
    let mode = crate::algo::algorithm(&cfg.learning.algo)?.continuous_action_mode(cfg);
    let mut mapper = ActionMapper::for_agents(&envs.action_spaces(), mode)?;
    let columns = envs.num_columns();
    let mut buf = VecBuffers::new(columns, envs.obs_dim());
    ActorCritic::seed(seed);
    envs.reset(Some(seed), &mut buf.obs)?;
    if let Some(video) = video.as_deref_mut() {
        video.capture(&mut envs)?;
    }
    let mut done = Vec::with_capacity(episodes);
    let mut frames = 0u64;
    while done.len() < episodes && frames < max_frames {
        let out = lineup.act(&buf.obs, deterministic)?;
        envs.step(mapper.map(&out.actions), buf.view())?;
        frames += (columns / envs.num_agents().max(1)) as u64;
        if let Some(video) = video.as_deref_mut() {
            video.capture(&mut envs)?;
        }
        lineup.forget(&envs, &buf.terminated, &buf.truncated);
        let agents = lineup.reported.len().max(1);
        for c in (0..columns).filter(|&c| lineup.reported[c % agents]) {
            if let Some(ep) = envs.finished(c) {
                if done.len() < episodes {
                    let episode = Episode {
                        env: c,
                        episode_return: ep.episode_return,
                        length: ep.length,
                    };
                    on_episode(done.len(), &episode)?;
                    done.push(episode);
                }
            }
        }
    }
    Ok(done)
}

/// The last line of `enjoy` and `eval`: the mean return, or that no episode ended (within `--max_num_frames`).
fn print_mean_return(episodes: &[Episode]) {
    if episodes.is_empty() {
        println!("no episode ended within --max_num_frames");
    } else {
        println!(
            "mean return {:.2} over {} episodes",
            mean_return(episodes),
            episodes.len()
        );
    }
}

fn mean_return(episodes: &[Episode]) -> f64 {
    episodes.iter().map(|e| e.episode_return).sum::<f64>() / episodes.len().max(1) as f64
}

/// `rlfactory enjoy`: prints each episode's return and length, then the mean; returns the episodes.
pub fn enjoy(args: &EnjoyArgs, registry: &EnvRegistry) -> Result<Vec<Episode>> {
    let (cfg, mut lineup) = Lineup::load(&args.source, registry)?;
    let envs = Envs::make(registry, &cfg.env, 1)?;
    let mut video = args.recorder()?;
    let episodes = run_episodes(
        &cfg,
        envs,
        &mut lineup,
        args.max_num_episodes,
        args.max_num_frames,
        args.eval_deterministic,
        args.seed,
        video.as_mut(),
        |k, e| {
            println!("episode {k}: return {:.2}, length {}", e.episode_return, e.length);
            Ok(())
        },
    )?;
    print_mean_return(&episodes);
    args.finish_video(video)?;
    Ok(episodes)
}

/// `rlfactory eval`: as [`enjoy`] on `--num_envs` envs, writing the CSV if asked; with
/// `--opponent`, Connect Four games against a built-in player instead ([`duel`]: the record is
/// printed, no episodes are returned).
pub fn eval(args: &EvalArgs, registry: &EnvRegistry) -> Result<Vec<Episode>> {
    if let Some(opponent) = args.opponent {
        eval_against(args, opponent, registry)?;
        return Ok(Vec::new());
    }
    let (cfg, mut lineup) = Lineup::load(&args.enjoy.source, registry)?;
    let mut csv = args.csv.as_deref().map(Csv::create).transpose()?;
    let envs = Envs::make(registry, &cfg.env, args.num_envs)?;
    let mut video = args.enjoy.recorder()?;
    let episodes = run_episodes(
        &cfg,
        envs,
        &mut lineup,
        args.enjoy.max_num_episodes,
        args.enjoy.max_num_frames,
        args.enjoy.eval_deterministic,
        args.enjoy.seed,
        video.as_mut(),
        |k, e| {
            println!(
                "episode {k} (env {}): return {:.2}, length {}",
                e.env, e.episode_return, e.length
            );
            match &mut csv {
                Some(csv) => csv.row(k, e),
                None => Ok(()),
            }
        },
    )?;
    if let Some(csv) = csv {
        csv.finish()?;
    }
    args.enjoy.finish_video(video)?;
    print_mean_return(&episodes);
    Ok(episodes)
}

/// A policy as a Connect Four player: it sees the board from its side, with the action mask.
struct PolicyPlayer<'a> {
    policy: &'a mut dyn Policy,
    deterministic: bool,
    obs: Vec<f32>,
    error: Option<RlfError>,
    tactics: Tactics,
}

impl Player for PolicyPlayer<'_> {
    fn choose(&mut self, game: &ConnectFour) -> Option<usize> {
        let chosen = game
            .observe(game.to_move(), &mut self.obs)
            .map_err(RlfError::from)
            .and_then(|()| self.policy.act(&self.obs, self.deterministic));
        match chosen {
            Ok(out) => {
                let column = out.actions.first().map(|&a| a as usize)?;
                self.tactics.count(game, column);
                Some(column)
            }
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }
}

/// Plays `games` Connect Four games of `policy` against `other`, colours alternating with the
/// policy moving first in game 0 (action sampling seeded with `seed`).
pub fn duel(
    policy: &mut dyn Policy,
    other: &mut dyn Player,
    games: usize,
    deterministic: bool,
    seed: u64,
) -> Result<Record> {
    ActorCritic::seed(seed);
    let mut me = PolicyPlayer {
        policy,
        deterministic,
        obs: vec![0.0; connect_four::OBS_DIM],
        error: None,
        tactics: Tactics::default(),
    };
    let mut record = Record::default();
    for game in 0..games {
        let mine = if game % 2 == 0 { Side::First } else { Side::Second };
        let outcome = if mine == Side::First {
            play_game(&mut me, other)
        } else {
            play_game(other, &mut me)
        };
        let outcome = match (outcome, me.error.take()) {
            (_, Some(e)) => return Err(e),
            (outcome, None) => outcome?,
        };
        match outcome.reward(mine) {
            r if r > 0.0 => record.wins += 1,
            r if r < 0.0 => record.losses += 1,
            _ => record.draws += 1,
        }
    }
    record.tactics = me.tactics;
    Ok(record)
}

/// `rlfactory eval --opponent`: a trained Connect Four policy against a built-in player or
/// another trained policy.
fn eval_against(args: &EvalArgs, opponent: Opponent, registry: &EnvRegistry) -> Result<Record> {
    let (_, _, mut model) = args.enjoy.source.load(registry)?;
    let e = &args.enjoy;
    let mut rival_model = None;
    let name = match opponent {
        Opponent::Checkpoint => {
            let source = CheckpointSource {
                experiment: args
                    .opponent_experiment
                    .clone()
                    .unwrap_or_else(|| e.source.experiment.clone()),
                policy_index: args.opponent_policy_index,
                ..e.source.clone()
            };
            rival_model = Some(source.load(registry)?.2);
            format!("{} policy {}", source.experiment, source.policy_index)
        }
        other => format!("{other:?}"),
    };
    let mut other: Box<dyn Player + '_> = match (opponent, rival_model.as_mut()) {
        (Opponent::Random, _) => Box::new(RandomPlayer::new(e.seed)),
        (Opponent::Heuristic, _) => Box::new(HeuristicPlayer::new(e.seed)),
        (Opponent::Checkpoint, Some(rival)) => Box::new(PolicyPlayer {
            policy: rival.as_mut(),
            deterministic: e.eval_deterministic,
            obs: vec![0.0; connect_four::OBS_DIM],
            error: None,
            tactics: Tactics::default(),
        }),
        (Opponent::Checkpoint, None) => {
            return Err(RlfError::Config(
                "--opponent checkpoint: no opponent loaded".into(),
            ));
        }
    };
    let record = duel(
        model.as_mut(),
        other.as_mut(),
        e.max_num_episodes,
        e.eval_deterministic,
        e.seed,
    )?;
    let t = record.tactics;
    println!(
        "against {name}: {} wins, {} draws, {} losses in {} games (win rate {:.3}); one-ply tactics: took {} of {} \
         wins on offer, blocked {} of {} threats",
        record.wins,
        record.draws,
        record.losses,
        e.max_num_episodes,
        record.win_rate(),
        t.wins_taken,
        t.wins_on_offer,
        t.blocked,
        t.threats
    );
    Ok(record)
}

/// `rlfactory export`: writes the policy's state dict (see the module doc), with the observation's layout in the
/// file's metadata.
pub fn export(args: &ExportArgs, registry: &EnvRegistry) -> Result<()> {
    let (_, plan, model) = args.source.load(registry)?;
    let (observation_space, _) = plan
        .env
        .policy_spaces(args.source.policy_index, plan.mapping.by_agent.as_deref())?;
    model.save(&args.out)?;
    // libtorch writes its own format unless the name ends in `.safetensors`; only that format has metadata.
    if args.out.extension().is_some_and(|e| e == "safetensors") {
        let layout = observation_layout(observation_space).to_string();
        add_safetensors_metadata(&args.out, &[("observation_layout", &layout)])?;
    }
    eprintln!("[rlfactory] wrote {}", args.out.display());
    Ok(())
}

/// Where each part of an observation of `space` lies in the flat vector the network reads (what the weights alone
/// do not say): a list of `{"name", "offset", "length"}`, with `"shape"` for a Box (an image's `[H, W, C]` or
/// `[C, H, W]`); one part named `obs` unless the space is a Dict.
fn observation_layout(space: &rlf_env::Space) -> serde_json::Value {
    let parts: Vec<(&str, &rlf_env::Space)> = match space {
        rlf_env::Space::Dict(parts) => parts.iter().map(|(k, s)| (k.as_str(), s)).collect(),
        other => vec![("obs", other)],
    };
    let mut offset = 0;
    let described = parts
        .into_iter()
        .map(|(name, part)| {
            let length = part.flat_dim();
            let mut entry = serde_json::json!({"name": name, "offset": offset, "length": length});
            if let rlf_env::Space::Box(b) = part {
                entry["shape"] = serde_json::json!(b.shape());
            }
            offset += length;
            entry
        })
        .collect();
    serde_json::Value::Array(described)
}

/// Adds string `entries` to the `__metadata__` of the safetensors file at `path` (an 8-byte little-endian header
/// length, the JSON header, then the tensors' bytes, whose offsets count from the header's end and so do not move).
fn add_safetensors_metadata(path: &Path, entries: &[(&str, &str)]) -> Result<()> {
    let io = |what: &'static str| {
        move |source: std::io::Error| RlfError::Io {
            what,
            path: path.to_owned(),
            source,
        }
    };
    let bad = |why: String| RlfError::Io {
        what: "adding metadata to",
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    };
    let bytes = std::fs::read(path).map_err(io("reading"))?;
    let (len, rest) = bytes
        .split_first_chunk::<8>()
        .ok_or_else(|| bad("shorter than a safetensors header".into()))?;
    let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|e| bad(e.to_string()))?;
    if rest.len() < len {
        return Err(bad(format!("a header of {len} bytes in {} bytes", rest.len())));
    }
    let (header, body) = rest.split_at(len);
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(header).map_err(|e| bad(e.to_string()))?;
    let metadata = header
        .entry("__metadata__")
        .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
    for (key, value) in entries {
        metadata[*key] = serde_json::Value::String((*value).to_owned());
    }
    let mut header = serde_json::to_vec(&header).map_err(|e| bad(e.to_string()))?;
    // The tensors' bytes start 8-aligned, as safetensors writes them.
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + header.len() + body.len());
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(body);
    std::fs::write(path, out).map_err(io("writing"))
}

/// The episodes CSV.
struct Csv {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
}

impl Csv {
    fn create(path: &Path) -> Result<Self> {
        let file = std::fs::File::create(path).map_err(|source| RlfError::Io {
            what: "creating",
            path: path.to_owned(),
            source,
        })?;
        let mut csv = Self {
            path: path.to_owned(),
            out: std::io::BufWriter::new(file),
        };
        csv.write("episode,env,return,length")?;
        Ok(csv)
    }

    fn row(&mut self, k: usize, e: &Episode) -> Result<()> {
        self.write(&format!("{k},{},{},{}", e.env, e.episode_return, e.length))
    }

    fn write(&mut self, line: &str) -> Result<()> {
        writeln!(self.out, "{line}").map_err(|source| RlfError::Io {
            what: "writing",
            path: self.path.clone(),
            source,
        })
    }

    fn finish(mut self) -> Result<()> {
        self.out.flush().map_err(|source| RlfError::Io {
            what: "writing",
            path: self.path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tactics_count_the_wins_taken_and_the_threats_blocked() {
        let mut t = Tactics::default();
        // Both sides have three in a column (0 and 6), the first player to move: a win on offer in column 0, taken
        // or not; the opponent's threat does not count while a win is on offer.
        let both = ConnectFour::from_moves(&[0, 6, 0, 6, 0, 6]).expect("legal moves");
        t.count(&both, 0);
        t.count(&both, 6);
        // The second player has three in column 6, the first none of its own to complete (0, 2 and 4 on the bottom
        // row): a threat, blocked in column 6 or not.
        let threat = ConnectFour::from_moves(&[0, 6, 2, 6, 4, 6]).expect("legal moves");
        t.count(&threat, 6);
        t.count(&threat, 1);
        // Nothing on offer and nothing to block: not counted.
        t.count(&ConnectFour::new(), 3);
        assert_eq!(
            t,
            Tactics {
                wins_on_offer: 2,
                wins_taken: 1,
                threats: 2,
                blocked: 1,
            }
        );
    }
}
