//! Which policy controls each agent: `--num_policies`, `--agent_policy_map`,
//! `--pbt_mix_policies_in_one_env`, as Sample Factory maps agents to policies.
//!
//! - One policy: every agent is policy 0.
//! - `--agent_policy_map`: a fixed policy per agent, by agent name (for envs whose agents differ).
//! - Sync mode (`--async_rl=false`): a fixed mapping, so that every dataset is made of the same
//!   envs: agent `a` of env `e` (counted over all workers) is policy `(e * agents + a) % N`, or
//!   `e % N` for the whole env without mixing.
//! - Otherwise each env draws its policies when it starts and again every
//!   [`RESAMPLE_EVERY_EPISODES`] episodes: one policy per agent, or one for all its agents
//!   without mixing. A draw only ever happens between two episodes of the env.
//!
//! With `--self_play` ([`SelfPlay`]) each episode of an env has one protagonist, an agent drawn
//! at random that plays its policy's latest weights; every other agent plays them too with
//! probability `--self_play_latest_prob`, or else a snapshot drawn from its policy's pool (a
//! network of its own, whose steps no learner trains on). Until a pool holds a snapshot, all play
//! the latest weights. With built-in opponents (`--self_play_builtin_opponents`) every agent but
//! the protagonist is first, with probability `--self_play_builtin_prob`, one of the env's
//! scripted players instead (network ids past the snapshots; no learner trains on them either).
//! In team games ([`rlf_env::MultiAgentEnv::team`], `--agent_team_map`) the protagonist's
//! teammates play the latest weights with it, and each other team meets one opponent drawn for the
//! whole team (the same built-in player, the latest weights, or one snapshot slot drawn from its
//! first member's pool that every member plays from its own policy's pool, modulo that pool's size).
//!
//! With main exploiters (`--self_play_exploiters k`, AlphaStar's league) the last `k` policies are exploiters: an
//! episode whose protagonist plays an exploiter sets every opponent to a main policy's latest weights (drawn
//! uniformly among the mains), never a pool; a main protagonist's opponent is, with probability
//! `--self_play_exploiter_prob`, an exploiter's latest weights (drawn uniformly), else drawn as above. In exploiter
//! mode every agent's opponent comes from the protagonist's policy, whatever the agents' own draws.
//! Both sides of a game between two latest weights are trained, each by its own policy's learner.
//!
//! A snapshot is drawn uniformly from the pool, or, with `--self_play_pfsp_power p > 0`, by
//! prioritised fictitious self-play (AlphaStar's `f_hard`): slot `k` with weight `(1 − w_k)^p`,
//! `w_k` the latest weights' recent score against it ([`SelfPlay::record`], a moving average over
//! about [`PFSP_WINDOW`] games, ½ before its first game), so the snapshots the learner still loses
//! to are met more often and the ones it beats every time seldom.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::plan::Mapping;

/// Episodes of an env between two draws of its agents' policies (Sample Factory's value).
pub const RESAMPLE_EVERY_EPISODES: u64 = 10;

/// Games over which a pool slot's recent score is averaged (prioritised fictitious self-play).
pub const PFSP_WINDOW: f64 = 100.0;

#[derive(Debug, Clone)]
enum Rule {
    /// A policy per agent of every env.
    ByAgent(Vec<usize>),
    /// Fixed by the env's global index (sync mode).
    Cyclic,
    /// Drawn at random every few episodes.
    Drawn,
}

/// The policies of the agents of a rollout worker's envs, one column per agent of each env.
#[derive(Debug, Clone)]
pub struct PolicyAssigner {
    num_policies: usize,
    num_agents: usize,
    mix: bool,
    rule: Rule,
    /// The global index of the worker's first env.
    first_env: usize,
    rng: Pcg64Mcg,
    /// Episodes each env finished since its last draw.
    episodes: Vec<u64>,
}

impl PolicyAssigner {
    /// Its random draws and episode counts, for an exact resume.
    pub fn kept(&self) -> (Pcg64Mcg, Vec<u64>) {
        (self.rng.clone(), self.episodes.clone())
    }

    /// Takes back what [`kept`](Self::kept) saved.
    pub fn restore(&mut self, (rng, episodes): (Pcg64Mcg, Vec<u64>)) {
        self.rng = rng;
        self.episodes = episodes;
    }

    /// The assigner of `num_envs` envs of `num_agents` agents, the first being env `first_env`
    /// of the run; draws are seeded by `seed`.
    pub fn new(mapping: &Mapping, num_agents: usize, num_envs: usize, first_env: usize, seed: u64) -> Self {
        let Mapping {
            num_policies,
            by_agent,
            sync,
            mix,
        } = mapping.clone();
        let rule = match by_agent {
            Some(map) => Rule::ByAgent(map),
            None if num_policies <= 1 => Rule::ByAgent(vec![0; num_agents]),
            None if sync => Rule::Cyclic,
            None => Rule::Drawn,
        };
        Self {
            num_policies: num_policies.max(1),
            num_agents,
            mix,
            rule,
            first_env,
            rng: Pcg64Mcg::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            episodes: vec![0; num_envs],
        }
    }

    /// Writes the policies of env `env`'s agents (local index) into `out` (`num_agents` values).
    pub fn assign(&mut self, env: usize, out: &mut [u32]) {
        let n = self.num_policies;
        match &self.rule {
            Rule::ByAgent(map) => {
                for (o, &p) in out.iter_mut().zip(map) {
                    *o = p as u32;
                }
            }
            Rule::Cyclic => {
                let e = self.first_env + env;
                for (a, o) in out.iter_mut().enumerate() {
                    let p = if self.mix {
                        (e * self.num_agents + a) % n
                    } else {
                        e % n
                    };
                    *o = p as u32;
                }
            }
            Rule::Drawn => {
                let whole = self.rng.random_range(0..n) as u32;
                for o in out.iter_mut() {
                    *o = if self.mix {
                        self.rng.random_range(0..n) as u32
                    } else {
                        whole
                    };
                }
            }
        }
    }

    /// Env `env` finished an episode: every [`RESAMPLE_EVERY_EPISODES`] its policies are drawn
    /// again into `out`; returns whether they were.
    pub fn on_episode_end(&mut self, env: usize, out: &mut [u32]) -> bool {
        if !matches!(self.rule, Rule::Drawn) {
            return false;
        }
        self.episodes[env] += 1;
        if self.episodes[env] < RESAMPLE_EVERY_EPISODES {
            return false;
        }
        self.episodes[env] = 0;
        self.assign(env, out);
        true
    }
}

/// What one opposing team plays in a self-play episode.
#[derive(Debug, Clone, Copy)]
enum Opponent {
    /// Built-in player `b`.
    Builtin(usize),
    /// Each member's policy's latest weights.
    Latest,
    /// This policy's latest weights (a main's or an exploiter's).
    Policy(usize),
    /// This slot of each member's policy's pool.
    Snapshot(usize),
}

/// Self-play opponents: which network each agent of an env plays in an episode (see the module
/// doc). Network `i < num_policies` is policy `i`'s latest weights; snapshot `k` of policy `p`'s
/// pool is network `num_policies + p * pool_size + k`; built-in player `b` is network
/// `num_policies * (1 + pool_size) + b`.
#[derive(Debug, Clone)]
pub struct SelfPlay {
    num_policies: usize,
    pool_size: usize,
    latest_prob: f64,
    /// Built-in players that may play opponents, and how often.
    builtin: usize,
    builtin_prob: f64,
    /// Snapshots in each policy's pool.
    filled: Vec<usize>,
    /// The exponent of prioritised fictitious self-play (0: snapshots drawn uniformly).
    pfsp_power: f64,
    /// The latest weights' recent score against each slot, by policy and slot.
    scores: Vec<Vec<f64>>,
    /// Exploiters among the policies (the last ones), and how often a main meets one.
    exploiters: usize,
    exploiter_prob: f64,
    rng: Pcg64Mcg,
}

impl SelfPlay {
    /// Self-play among `num_policies` policies with pools of `pool_size` snapshots, empty at
    /// first; draws are seeded by `seed`.
    pub fn new(num_policies: usize, pool_size: usize, latest_prob: f64, seed: u64) -> Self {
        Self {
            num_policies,
            pool_size,
            latest_prob,
            builtin: 0,
            builtin_prob: 0.0,
            filled: vec![0; num_policies],
            pfsp_power: 0.0,
            scores: vec![vec![0.5; pool_size]; num_policies],
            exploiters: 0,
            exploiter_prob: 0.0,
            rng: Pcg64Mcg::seed_from_u64(seed ^ 0x5e1f_91a7_0000_0001),
        }
    }

    /// Draws snapshots by prioritised fictitious self-play with exponent `power` (0: uniformly).
    pub fn with_pfsp(self, power: f64) -> Self {
        Self {
            pfsp_power: power,
            ..self
        }
    }

    /// Lets `count` built-in players play an opponent with probability `prob`.
    pub fn with_builtin(self, count: usize, prob: f64) -> Self {
        Self {
            builtin: count,
            builtin_prob: prob,
            ..self
        }
    }

    /// Makes the last `count` policies main exploiters, whom a main meets with probability `prob` (at least one
    /// policy stays a main).
    pub fn with_exploiters(self, count: usize, prob: f64) -> Self {
        Self {
            exploiters: count.min(self.num_policies.saturating_sub(1)),
            exploiter_prob: prob,
            ..self
        }
    }

    /// The number of main policies (the first ones).
    fn mains(&self) -> usize {
        self.num_policies - self.exploiters
    }

    /// The network of built-in player `b`.
    fn builtin_network(&self, b: usize) -> usize {
        self.num_policies * (1 + self.pool_size) + b
    }

    /// The built-in player that `network` stands for, if it is one.
    pub fn builtin(&self, network: u32) -> Option<usize> {
        (network as usize)
            .checked_sub(self.builtin_network(0))
            .filter(|&b| b < self.builtin)
    }

    /// Policy `policy`'s snapshot is now in slot `slot` of its pool: a new opponent, whose score starts again.
    pub fn on_snapshot_taken(&mut self, policy: usize, slot: usize) {
        if let Some(filled) = self.filled.get_mut(policy) {
            *filled = (*filled).max(slot + 1).min(self.pool_size);
        }
        if let Some(score) = self.scores.get_mut(policy).and_then(|p| p.get_mut(slot)) {
            *score = 0.5;
        }
    }

    /// Policy `policy`'s latest weights scored `score` (1 a win, ½ a draw, 0 a loss) in a game
    /// against `network`; only games against its own pool's snapshots count.
    pub fn record(&mut self, policy: usize, network: usize, score: f64) {
        let Some(slot) = network
            .checked_sub(self.num_policies + policy * self.pool_size)
            .filter(|&slot| slot < self.pool_size)
        else {
            return;
        };
        let recent = &mut self.scores[policy][slot];
        *recent += (score - *recent) / PFSP_WINDOW;
    }

    /// For one env whose agents are controlled by the policies `base` and play for the teams
    /// `teams` (by agent), writes the network each agent plays this episode into `out`; returns
    /// the protagonist. The protagonist and its teammates play their policies' latest weights;
    /// each other team plays one opponent, drawn once for the whole team: a built-in player, the
    /// latest weights, or a pool slot drawn from its first member's pool, which every member plays
    /// from its own policy's pool (modulo that pool's size; a member whose pool is still empty plays
    /// its latest weights). With every agent a team of its own, each opponent
    /// is drawn on its own.
    pub fn draw(&mut self, base: &[u32], teams: &[usize], out: &mut [u32]) -> usize {
        let protagonist = self.rng.random_range(0..base.len().max(1));
        let hero_policy = base.get(protagonist).copied().unwrap_or(0);
        let team_of = |a: usize| teams.get(a).copied().unwrap_or(a);
        let mut drawn: Vec<(usize, Opponent)> = Vec::new();
        for (a, (o, &own)) in out.iter_mut().zip(base).enumerate() {
            let p = if self.exploiters > 0 { hero_policy } else { own };
            let filled = self.filled.get(p as usize).copied().unwrap_or(0);
            let team = team_of(a);
            if a == protagonist || team == team_of(protagonist) {
                *o = p;
                continue;
            }
            let opponent = match drawn.iter().find(|(t, _)| *t == team) {
                Some(&(_, opponent)) => opponent,
                None => {
                    let opponent = self.draw_opponent(p as usize, filled);
                    drawn.push((team, opponent));
                    opponent
                }
            };
            *o = match opponent {
                Opponent::Builtin(b) => self.builtin_network(b) as u32,
                Opponent::Policy(q) => q as u32,
                Opponent::Snapshot(slot) if filled > 0 => {
                    (self.num_policies + p as usize * self.pool_size + slot % filled) as u32
                }
                Opponent::Latest | Opponent::Snapshot(_) => p,
            };
        }
        protagonist
    }

    /// One opponent, for a first member of policy `policy`, whose pool holds `filled` snapshots.
    fn draw_opponent(&mut self, policy: usize, filled: usize) -> Opponent {
        let mains = self.mains();
        if self.exploiters > 0 && policy >= mains {
            Opponent::Policy(self.rng.random_range(0..mains))
        } else if self.builtin > 0 && self.rng.random::<f64>() < self.builtin_prob {
            Opponent::Builtin(self.rng.random_range(0..self.builtin))
        } else if self.exploiters > 0 && self.rng.random::<f64>() < self.exploiter_prob {
            Opponent::Policy(mains + self.rng.random_range(0..self.exploiters))
        } else if filled == 0 || self.rng.random::<f64>() < self.latest_prob {
            Opponent::Latest
        } else {
            Opponent::Snapshot(self.draw_slot(policy, filled))
        }
    }

    /// A slot of policy `policy`'s pool, of the `filled` first: uniformly, or by prioritised
    /// fictitious self-play (uniformly too while every slot's weight is 0).
    fn draw_slot(&mut self, policy: usize, filled: usize) -> usize {
        let scores = self
            .scores
            .get(policy)
            .map_or(&[][..], |s| &s[..filled.min(s.len())]);
        if self.pfsp_power > 0.0 && !scores.is_empty() {
            let weight = |w: f64| (1.0 - w).max(0.0).powf(self.pfsp_power);
            let total: f64 = scores.iter().map(|&w| weight(w)).sum();
            if total > 0.0 {
                let mut left = self.rng.random::<f64>() * total;
                for (slot, &w) in scores.iter().enumerate() {
                    left -= weight(w);
                    if left < 0.0 {
                        return slot;
                    }
                }
                return scores.iter().rposition(|&w| weight(w) > 0.0).unwrap_or(0);
            }
        }
        self.rng.random_range(0..filled)
    }

    /// Whether `network` is a frozen opponent (a snapshot or a built-in player, never trained).
    pub fn is_frozen(&self, network: u32) -> bool {
        network as usize >= self.num_policies
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(num_policies: usize, by_agent: Option<Vec<usize>>, sync: bool, mix: bool) -> Mapping {
        Mapping {
            num_policies,
            by_agent,
            sync,
            mix,
        }
    }

    #[test]
    fn sync_mode_maps_agents_to_policies_in_turn_and_never_redraws() {
        let mut mixed = PolicyAssigner::new(&mapping(3, None, true, true), 2, 2, 4, 0);
        let mut out = [0; 2];
        mixed.assign(1, &mut out);
        // Env 5 of the run: columns 10 and 11.
        assert_eq!(out, [1, 2]);
        let mut whole = PolicyAssigner::new(&mapping(3, None, true, false), 2, 2, 4, 0);
        whole.assign(1, &mut out);
        assert_eq!(out, [2, 2]);
        for _ in 0..3 * RESAMPLE_EVERY_EPISODES {
            assert!(!whole.on_episode_end(1, &mut out));
        }
    }

    #[test]
    fn drawn_policies_change_only_every_few_episodes_and_cover_every_policy() {
        let mut a = PolicyAssigner::new(&mapping(4, None, false, true), 3, 1, 0, 7);
        let mut seen = [false; 4];
        let mut out = [0; 3];
        a.assign(0, &mut out);
        for draw in 0..50 {
            for p in out {
                seen[p as usize] = true;
            }
            for episode in 1..=RESAMPLE_EVERY_EPISODES {
                let redrawn = a.on_episode_end(0, &mut out);
                assert_eq!(redrawn, episode == RESAMPLE_EVERY_EPISODES, "draw {draw}");
            }
        }
        assert_eq!(seen, [true; 4]);
        let mut whole = PolicyAssigner::new(&mapping(4, None, false, false), 3, 1, 0, 7);
        for _ in 0..20 {
            whole.assign(0, &mut out);
            assert!(out.iter().all(|&p| p == out[0]), "{out:?}");
        }
    }

    #[test]
    fn one_policy_or_an_explicit_map_is_fixed() {
        let mut one = PolicyAssigner::new(&mapping(1, None, false, true), 2, 1, 0, 0);
        let mut out = [9; 2];
        one.assign(0, &mut out);
        assert_eq!(out, [0, 0]);
        let mut mapped = PolicyAssigner::new(&mapping(2, Some(vec![1, 0]), false, true), 2, 1, 0, 0);
        mapped.assign(0, &mut out);
        assert_eq!(out, [1, 0]);
        for _ in 0..RESAMPLE_EVERY_EPISODES {
            assert!(!mapped.on_episode_end(0, &mut out));
        }
    }

    #[test]
    fn self_play_opponents_play_snapshots_once_the_pool_holds_some() {
        let mut sp = SelfPlay::new(2, 3, 0.25, 5);
        let mut out = [0; 2];
        // An empty pool: everyone plays the latest weights.
        for _ in 0..20 {
            sp.draw(&[1, 1], &[0, 1], &mut out);
            assert_eq!(out, [1, 1]);
        }
        sp.on_snapshot_taken(1, 0);
        sp.on_snapshot_taken(1, 1);
        let (mut snapshots, mut protagonists) = (0, [0; 2]);
        for _ in 0..400 {
            let hero = sp.draw(&[1, 1], &[0, 1], &mut out);
            protagonists[hero] += 1;
            assert_eq!(out[hero], 1, "the protagonist plays the latest weights");
            let other = out[1 - hero];
            if sp.is_frozen(other) {
                snapshots += 1;
                // Policy 1's pool: networks 2 + 3 + slot, slots 0 and 1 filled.
                assert!(other == 5 || other == 6, "{other}");
            }
        }
        // About 75% of the opponents are snapshots; both sides are the protagonist.
        assert!((250..350).contains(&snapshots), "{snapshots}");
        assert!(protagonists.iter().all(|&n| n > 150), "{protagonists:?}");
    }

    #[test]
    fn prioritised_self_play_meets_the_snapshots_the_latest_weights_lose_to_more_often() {
        // One policy, a pool of 3, snapshots only (latest_prob 0), f_hard with p = 2.
        let mut sp = SelfPlay::new(1, 3, 0.0, 9).with_pfsp(2.0);
        for slot in 0..3 {
            sp.on_snapshot_taken(0, slot);
        }
        let mut out = [0; 2];
        let mut draws = |sp: &mut SelfPlay| {
            let mut slots = [0; 3];
            for _ in 0..3000 {
                let hero = sp.draw(&[0, 0], &[0, 1], &mut out);
                slots[out[1 - hero] as usize - 1] += 1;
            }
            slots
        };
        // No games yet: every slot scores ½, drawn alike.
        let even = draws(&mut sp);
        assert!(even.iter().all(|&n| (850..1150).contains(&n)), "{even:?}");
        // The latest weights win every game against slot 0 and lose every one against slot 2; slot 1 is even.
        for _ in 0..1000 {
            sp.record(0, 1, 1.0);
            sp.record(0, 2, 0.5);
            sp.record(0, 3, 0.0);
        }
        // Weights (1 − w)²: about 0, ¼ and 1.
        let hard = draws(&mut sp);
        assert!(hard[0] < 30, "{hard:?}");
        assert!((450..750).contains(&hard[1]), "{hard:?}");
        assert!(hard[2] > 2200, "{hard:?}");
        // Games against networks that are not this policy's snapshots (the latest weights, a built-in player past
        // the pool) change nothing.
        let before = sp.scores[0].clone();
        sp.record(0, 0, 0.0);
        sp.record(0, 4, 0.0);
        assert_eq!(sp.scores[0], before);
        // A new snapshot in slot 0 is a new opponent: scored ½ again.
        sp.on_snapshot_taken(0, 0);
        assert_eq!(sp.scores[0][0], 0.5);
        // Power 0 draws uniformly whatever the scores.
        let mut uniform = SelfPlay::new(1, 3, 0.0, 9);
        for slot in 0..3 {
            uniform.on_snapshot_taken(0, slot);
        }
        for _ in 0..1000 {
            uniform.record(0, 1, 1.0);
        }
        let flat = draws(&mut uniform);
        assert!(flat.iter().all(|&n| (850..1150).contains(&n)), "{flat:?}");
    }

    #[test]
    fn exploiters_meet_only_the_mains_latest_weights_and_mains_meet_them_at_their_rate() {
        // Policies 0 (main) and 1, 2 (exploiters), pools of 2: snapshots are networks 3..=8.
        let mut sp = SelfPlay::new(3, 2, 0.5, 13).with_exploiters(2, 0.4);
        for p in 0..3 {
            sp.on_snapshot_taken(p, 0);
            sp.on_snapshot_taken(p, 1);
        }
        let mut out = [0; 2];
        let (mut main_games, mut against_exploiters, mut against_own) = (0, [0; 2], 0);
        for round in 0..3000 {
            // The agents' own draws disagree on purpose: the protagonist's policy decides.
            let base = [round % 3, (round + 1) % 3];
            let hero = sp.draw(&base, &[0, 1], &mut out);
            assert_eq!(
                out[hero], base[hero],
                "the protagonist plays its policy's latest weights"
            );
            let other = out[1 - hero];
            if base[hero] > 0 {
                assert_eq!(
                    other, 0,
                    "an exploiter meets the main's latest weights, never a pool"
                );
                continue;
            }
            main_games += 1;
            match other {
                1 | 2 => against_exploiters[other as usize - 1] += 1,
                0 | 3 | 4 => against_own += 1,
                n => panic!("a main met network {n}, another policy's snapshot"),
            }
        }
        // 40% of the main's opponents are exploiters, half each; the rest its own latest weights or pool.
        let share = against_exploiters.iter().sum::<u32>() as f64 / main_games as f64;
        assert!((0.35..0.45).contains(&share), "{share} of {main_games}");
        assert!(
            against_exploiters.iter().all(|&n| n > 150),
            "{against_exploiters:?}"
        );
        assert_eq!(main_games, against_own + against_exploiters.iter().sum::<u32>());
        // Without exploiters each agent's opponent comes from its own policy, as before.
        let mut plain = SelfPlay::new(3, 2, 0.0, 13);
        plain.on_snapshot_taken(2, 0);
        plain.draw(&[0, 2], &[0, 1], &mut out);
        assert!(out == [0, 7] || out == [0, 2], "{out:?}");
    }

    #[test]
    fn built_in_players_play_opponents_at_their_rate_even_before_the_first_snapshot() {
        // One policy, pools of 2: networks 0 (latest), 1 and 2 (snapshots), 3 and 4 (built-in).
        let mut sp = SelfPlay::new(1, 2, 0.5, 3).with_builtin(2, 0.4);
        let mut out = [0; 2];
        let mut builtin = [0; 2];
        for round in 0..1000 {
            if round == 500 {
                sp.on_snapshot_taken(0, 0);
            }
            let hero = sp.draw(&[0, 0], &[0, 1], &mut out);
            assert_eq!(out[hero], 0, "the protagonist plays the latest weights");
            let other = out[1 - hero];
            assert!(other <= 4 && other != 2, "network {other}");
            if let Some(b) = sp.builtin(other) {
                assert!(sp.is_frozen(other));
                builtin[b] += 1;
            }
        }
        assert_eq!(sp.builtin(0), None);
        assert_eq!(sp.builtin(2), None);
        // 40% of 1000 opponents, half of them each player.
        assert!(builtin.iter().all(|&n| (160..240).contains(&n)), "{builtin:?}");
    }

    #[test]
    fn a_team_plays_together_and_each_other_team_meets_one_opponent() {
        // Two teams of two (agents 0 and 2, 1 and 3), one policy with a pool of 3 snapshots, a
        // built-in player: networks 0 (latest), 1..=3 (snapshots), 4 (built-in).
        let mut sp = SelfPlay::new(1, 3, 0.2, 11).with_builtin(1, 0.2);
        let teams = [0, 1, 0, 1];
        let mut out = [0; 4];
        for _ in 0..50 {
            let hero = sp.draw(&[0; 4], &teams, &mut out);
            let opponent = out[(hero + 1) % 4];
            assert!(opponent == 0 || opponent == 4, "an empty pool: {out:?}");
        }
        for slot in 0..3 {
            sp.on_snapshot_taken(0, slot);
        }
        let (mut frozen, mut builtin, mut slots) = (0, 0, [0; 3]);
        for _ in 0..600 {
            let hero = sp.draw(&[0; 4], &teams, &mut out);
            let mate = (hero + 2) % 4;
            assert_eq!(
                (out[hero], out[mate]),
                (0, 0),
                "the protagonist's team plays the latest weights"
            );
            let (a, b) = ((hero + 1) % 4, (hero + 3) % 4);
            assert_eq!(out[a], out[b], "an opposing team plays one opponent: {out:?}");
            match out[a] {
                0 => {}
                4 => builtin += 1,
                n => {
                    frozen += 1;
                    slots[n as usize - 1] += 1;
                }
            }
        }
        // 20% built-in; of the rest 80% snapshots, spread over the three slots.
        assert!((80..160).contains(&builtin), "{builtin}");
        assert!((330..440).contains(&frozen), "{frozen}");
        assert!(slots.iter().all(|&n| n > 80), "{slots:?}");
    }
}
