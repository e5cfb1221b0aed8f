//! Envs that span ranks (EXARL's env communicators). Under `--mpi` with `--process_per_env k`, an env group is a lead
//! rank and `k − 1` member ranks. Each split of the lead's rollout workers steps its envs over the whole group, on a
//! communicator of that split's own made by the group alone ([`EnvGroup::comm`]):
//! - [`GroupVecEnv`], on the lead, broadcasts each order (reset with a seed, step with every env's action, close);
//! - every rank steps its share of the envs (a [`VecEnv`]; [`serve_share`] on a member) in lockstep;
//! - the lead gathers the shares' observations, rewards, flags, finished episodes and final observations.
//!
//! The envs are shared out in order, the first ranks taking one more when they do not divide evenly
//! ([`Shares`]), and each share is seeded where it starts: a group steps exactly the numbers one [`VecEnv`] of all
//! the envs steps (tested). The example env of the issue is any single-agent env under `--process_per_env 2`, e.g.
//! CartPole-v1: a batch of CartPoles split over the group's ranks and gathered to the lead.
//!
//! A member that fails (an env's error) answers with the error, which the lead returns naming the rank; the lead
//! sends `Close` when its envs go, and closes the splits a failed rollout worker never made ([`close_unused`]), so a
//! member waits for an order that cannot come only when its lead's process dies or hangs (the learner rank's
//! heartbeats end the job then).

use std::sync::Arc;

use rlf_comm::{Comm, Tag, WorldMaker};
use rlf_env::{ActionBatch, EpisodeStats, Info, Space, StepBuffers, VecBuffers, VecEnv};
use serde::{Deserialize, Serialize};

use crate::error::{Result, RlfError};

/// The subgroup tags of the splits' communicators start here (the link's tags are below it).
const GROUP_TAGS: Tag = 0x100;

/// The most splits a lead rank's rollout workers may have (`--num_workers * --worker_num_splits`).
pub const MAX_CHANNELS: usize = (rlf_comm::RESERVED_TAGS - GROUP_TAGS) as usize;

/// An env group as a rank of it sees it: the world ranks of its members (the lead first) and how a thread of this
/// rank reaches the world.
#[derive(Clone)]
pub struct EnvGroup {
    /// The world communicator, for the calling thread.
    pub maker: Arc<dyn WorldMaker>,
    /// The group's world ranks, the lead first.
    pub members: Vec<usize>,
}

impl std::fmt::Debug for EnvGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvGroup")
            .field("members", &self.members)
            .finish()
    }
}

impl EnvGroup {
    /// The communicator of the lead's split `channel` (worker × splits + split), made on the calling thread by the
    /// group's ranks alone.
    pub fn comm(&self, channel: usize) -> Result<Box<dyn Comm>> {
        let tag = u16::try_from(channel)
            .ok()
            .filter(|&c| (c as usize) < MAX_CHANNELS)
            .map(|c| GROUP_TAGS + c)
            .ok_or_else(|| RlfError::Config(format!("env group channel {channel} is over {MAX_CHANNELS}")))?;
        self.maker
            .world()
            .subgroup(&self.members, tag)
            .map_err(|e| comm_error(&e))
    }
}

/// How `total` envs are shared out over `ranks` ranks: in order, the first `total % ranks` ranks taking one more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// Envs in all.
    pub total: usize,
    /// Ranks of the group.
    pub ranks: usize,
}

impl Shares {
    /// The envs of rank `r`.
    pub fn share(&self, r: usize) -> usize {
        self.total / self.ranks + usize::from(r < self.total % self.ranks)
    }

    /// The first env of rank `r`.
    pub fn offset(&self, r: usize) -> usize {
        (0..r).map(|q| self.share(q)).sum()
    }
}

/// What the lead tells its group.
#[derive(Debug, Serialize, Deserialize)]
enum Order {
    /// Reset every env, env `i` seeded `seed + i`.
    Reset { seed: Option<u64> },
    /// Step every env with its action.
    Step { actions: Actions },
    /// The lead's envs are gone: stop serving.
    Close,
}

/// Every env's action, as [`ActionBatch`] holds them.
#[derive(Debug, Serialize, Deserialize)]
enum Actions {
    Discrete(Vec<i64>),
    Continuous(Vec<f32>),
    MultiDiscrete(Vec<i64>),
    Mixed { ints: Vec<i64>, floats: Vec<f32> },
}

impl Actions {
    fn of(batch: ActionBatch<'_>) -> Self {
        match batch {
            ActionBatch::Discrete(a) => Actions::Discrete(a.to_vec()),
            ActionBatch::Continuous(a) => Actions::Continuous(a.to_vec()),
            ActionBatch::MultiDiscrete(a) => Actions::MultiDiscrete(a.to_vec()),
            ActionBatch::Mixed { ints, floats } => Actions::Mixed {
                ints: ints.to_vec(),
                floats: floats.to_vec(),
            },
        }
    }

    fn batch(&self) -> ActionBatch<'_> {
        match self {
            Actions::Discrete(a) => ActionBatch::Discrete(a),
            Actions::Continuous(a) => ActionBatch::Continuous(a),
            Actions::MultiDiscrete(a) => ActionBatch::MultiDiscrete(a),
            Actions::Mixed { ints, floats } => ActionBatch::Mixed { ints, floats },
        }
    }
}

/// A member's answer: its share's outcome, or what went wrong.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Outcome {
    obs: Vec<f32>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    /// Each env's finished episode: return, length, true objective.
    episodes: Vec<Option<(f64, u64, Option<f64>)>>,
    /// The final observations of the envs whose episode finished, in env order.
    final_obs: Vec<f32>,
}

type Answer = std::result::Result<Outcome, String>;

fn comm_error(e: &rlf_comm::CommError) -> RlfError {
    RlfError::Protocol {
        component: "env group",
        message: e.to_string(),
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    postcard::to_stdvec(value).map_err(|e| RlfError::Protocol {
        component: "env group",
        message: format!("cannot encode a message: {e}"),
    })
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    postcard::from_bytes(bytes).map_err(|e| RlfError::Protocol {
        component: "env group",
        message: format!("a message of {} bytes does not decode: {e}", bytes.len()),
    })
}

/// A rank's share of the envs: it carries out an order and says how it went.
struct Share {
    envs: VecEnv,
    buffers: VecBuffers,
}

impl Share {
    fn new(envs: VecEnv) -> Self {
        let buffers = VecBuffers::new(envs.num_envs(), envs.obs_dim());
        Self { envs, buffers }
    }

    /// Carries out `order` as rank `r` of `shares`, into `out` (the lead's own buffers) or its own buffers.
    fn run(&mut self, order: &Order, r: usize, shares: Shares, out: Option<StepBuffers<'_>>) -> Result<()> {
        let out = match out {
            Some(out) => out,
            None => self.buffers.view(),
        };
        match order {
            Order::Reset { seed } => {
                let seed = seed.map(|s| s.wrapping_add(shares.offset(r) as u64));
                self.envs.reset(seed, out.obs)?;
            }
            Order::Step { actions } => {
                let dim = self.envs.action_dim();
                let mine = actions
                    .batch()
                    .chunk(shares.offset(r), shares.share(r), dim)
                    .ok_or_else(|| RlfError::Protocol {
                        component: "env group",
                        message: format!(
                            "{} action numbers for {} envs of {dim}",
                            actions.batch().len(),
                            shares.total
                        ),
                    })?;
                self.envs.step(mine, out)?;
            }
            Order::Close => {}
        }
        Ok(())
    }

    /// What a member sends back after `order`.
    fn outcome(&self, order: &Order) -> Outcome {
        let b = &self.buffers;
        match order {
            Order::Reset { .. } => Outcome {
                obs: b.obs.clone(),
                ..Outcome::default()
            },
            Order::Step { .. } | Order::Close => {
                let n = self.envs.num_envs();
                let mut final_obs = Vec::new();
                for i in 0..n {
                    if let Some(last) = self.envs.final_observation(i) {
                        final_obs.extend_from_slice(last);
                    }
                }
                Outcome {
                    obs: b.obs.clone(),
                    rewards: b.rewards.clone(),
                    terminated: b.terminated.clone(),
                    truncated: b.truncated.clone(),
                    episodes: self
                        .envs
                        .infos()
                        .iter()
                        .map(|i| i.episode.map(|e| (e.episode_return, e.length, e.true_objective)))
                        .collect(),
                    final_obs,
                }
            }
        }
    }
}

/// A member's part of a group env until the lead closes it: makes its share with `make` (its number of envs), then
/// carries out every order in lockstep. Returns the steps it took. An error of its envs is its answer (the lead
/// returns it); a communication error ends it.
pub fn serve_share(
    comm: &dyn Comm,
    shares: Shares,
    make: impl FnOnce(usize) -> Result<VecEnv>,
) -> Result<u64> {
    let r = comm.rank();
    let mut share = make(shares.share(r)).map(Share::new);
    let hello: Answer = share
        .as_ref()
        .map(|s| Outcome {
            obs: vec![0.0; s.envs.obs_dim()],
            ..Outcome::default()
        })
        .map_err(ToString::to_string);
    comm.gather(0, &encode(&hello)?).map_err(|e| comm_error(&e))?;
    let mut steps = 0;
    loop {
        let mut bytes = Vec::new();
        comm.bcast(0, &mut bytes).map_err(|e| comm_error(&e))?;
        let order: Order = decode(&bytes)?;
        if matches!(order, Order::Close) {
            return Ok(steps);
        }
        let answer: Answer = match &mut share {
            Ok(share) => share
                .run(&order, r, shares, None)
                .map(|()| share.outcome(&order))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        steps += u64::from(matches!(order, Order::Step { .. }));
        comm.gather(0, &encode(&answer)?).map_err(|e| comm_error(&e))?;
    }
}

/// The lead's view of a group env: every env of the group, stepped as one [`VecEnv`] would be.
pub struct GroupVecEnv {
    comm: Box<dyn Comm>,
    /// Between an order's broadcast and its gather (a panic there leaves the members in the gather: no `Close`).
    in_order: bool,
    shares: Shares,
    own: Share,
    infos: Vec<Info>,
    final_obs: Vec<f32>,
    has_final: Vec<bool>,
}

impl std::fmt::Debug for GroupVecEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupVecEnv")
            .field("shares", &self.shares)
            .finish_non_exhaustive()
    }
}

impl GroupVecEnv {
    /// `total` envs over the ranks of `comm` (this rank its rank 0), this rank's share made by `make` (its number
    /// of envs); every member must be serving ([`serve_share`]). A member that cannot make its share is an error
    /// naming it (and the group is closed).
    pub fn lead(
        comm: Box<dyn Comm>,
        total: usize,
        make: impl FnOnce(usize) -> Result<VecEnv>,
    ) -> Result<Self> {
        let shares = Shares {
            total,
            ranks: comm.size(),
        };
        let own = make(shares.share(0));
        let answers = comm
            .gather(0, &[])
            .map_err(|e| comm_error(&e))?
            .unwrap_or_default();
        let made = own.and_then(|own| {
            for (r, bytes) in answers.iter().enumerate().skip(1) {
                let hello: Answer = decode(bytes)?;
                match hello {
                    Ok(o) if o.obs.len() == own.obs_dim() => {}
                    Ok(o) => {
                        return Err(RlfError::Protocol {
                            component: "env group",
                            message: format!(
                                "env rank {r} of the group has observations of {} values, the lead {}",
                                o.obs.len(),
                                own.obs_dim()
                            ),
                        })
                    }
                    Err(e) => return Err(member_failed(r, &e)),
                }
            }
            Ok(own)
        });
        let own = match made {
            Ok(own) => own,
            Err(e) => {
                let _ = comm.bcast(0, &mut encode(&Order::Close)?);
                return Err(e);
            }
        };
        let d = own.obs_dim();
        Ok(Self {
            comm,
            in_order: false,
            shares,
            own: Share::new(own),
            infos: vec![Info::default(); total],
            final_obs: vec![0.0; total * d],
            has_final: vec![false; total],
        })
    }

    /// Envs in the group.
    pub fn num_envs(&self) -> usize {
        self.shares.total
    }

    /// Values per observation.
    pub fn obs_dim(&self) -> usize {
        self.own.envs.obs_dim()
    }

    /// The envs' observation space.
    pub fn observation_space(&self) -> &Space {
        self.own.envs.observation_space()
    }

    /// The envs' action space.
    pub fn action_space(&self) -> &Space {
        self.own.envs.action_space()
    }

    /// Resets every env of the group (env `i` seeded `seed + i`).
    pub fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        let d = self.obs_dim();
        check_len("observation", obs.len(), self.shares.total * d)?;
        let order = Order::Reset { seed };
        let own = d * self.shares.share(0);
        let answers = self.order(&order, |share, _| Ok(share.envs.reset(seed, &mut obs[..own])?))?;
        for (r, outcome) in answers {
            let at = self.shares.offset(r) * d;
            check_len("observation", outcome.obs.len(), self.shares.share(r) * d)?;
            obs[at..at + outcome.obs.len()].copy_from_slice(&outcome.obs);
        }
        self.infos.fill(Info::default());
        self.has_final.fill(false);
        Ok(())
    }

    /// Steps every env of the group with its action.
    pub fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<()> {
        let (d, n) = (self.obs_dim(), self.shares.total);
        out.check("group env step", n, d)?;
        let order = Order::Step {
            actions: Actions::of(actions),
        };
        let s0 = self.shares.share(0);
        let StepBuffers {
            obs,
            rewards,
            terminated,
            truncated,
        } = out;
        let answers = self.order(&order, |share, shares| {
            let mine = StepBuffers {
                obs: &mut obs[..s0 * d],
                rewards: &mut rewards[..s0],
                terminated: &mut terminated[..s0],
                truncated: &mut truncated[..s0],
            };
            share.run(&order, 0, shares, Some(mine))
        })?;
        for i in 0..s0 {
            self.infos[i] = self.own.envs.infos()[i];
            let last = self.own.envs.final_observation(i);
            self.has_final[i] = last.is_some();
            if let Some(last) = last {
                self.final_obs[i * d..(i + 1) * d].copy_from_slice(last);
            }
        }
        for (r, o) in answers {
            let (at, k) = (self.shares.offset(r), self.shares.share(r));
            check_len("observation", o.obs.len(), k * d)?;
            for (what, got) in [
                ("reward", o.rewards.len()),
                ("terminated flag", o.terminated.len()),
                ("truncated flag", o.truncated.len()),
                ("episode", o.episodes.len()),
            ] {
                check_len(what, got, k)?;
            }
            obs[at * d..(at + k) * d].copy_from_slice(&o.obs);
            rewards[at..at + k].copy_from_slice(&o.rewards);
            terminated[at..at + k].copy_from_slice(&o.terminated);
            truncated[at..at + k].copy_from_slice(&o.truncated);
            let mut finals = o.final_obs.chunks_exact(d);
            for (j, episode) in o.episodes.iter().enumerate() {
                let i = at + j;
                self.infos[i] =
                    episode.map_or_else(Info::default, |(episode_return, length, true_objective)| Info {
                        episode: Some(EpisodeStats {
                            episode_return,
                            length,
                            true_objective,
                        }),
                        true_objective,
                        ..Info::default()
                    });
                self.has_final[i] = episode.is_some();
                if episode.is_some() {
                    let last = finals.next().ok_or_else(|| RlfError::Protocol {
                        component: "env group",
                        message: format!("env rank {r} sent fewer final observations than finished episodes"),
                    })?;
                    self.final_obs[i * d..(i + 1) * d].copy_from_slice(last);
                }
            }
        }
        Ok(())
    }

    /// Broadcasts `order`, carries out this rank's share with `own`, gathers the members' outcomes: by rank, or the
    /// first error (this rank's own first).
    fn order(
        &mut self,
        order: &Order,
        own: impl FnOnce(&mut Share, Shares) -> Result<()>,
    ) -> Result<Vec<(usize, Outcome)>> {
        self.in_order = true;
        self.comm
            .bcast(0, &mut encode(order)?)
            .map_err(|e| comm_error(&e))?;
        let mine = own(&mut self.own, self.shares);
        let answers = self
            .comm
            .gather(0, &[])
            .map_err(|e| comm_error(&e))?
            .unwrap_or_default();
        self.in_order = false;
        mine?;
        answers
            .iter()
            .enumerate()
            .skip(1)
            .map(|(r, bytes)| {
                let answer: Answer = decode(bytes)?;
                answer.map(|o| (r, o)).map_err(|e| member_failed(r, &e))
            })
            .collect()
    }

    /// The last observation of the episode env `i` finished on the latest step, if it finished one.
    pub fn final_observation(&self, i: usize) -> Option<&[f32]> {
        let d = self.obs_dim();
        match self.has_final.get(i) {
            Some(true) => self.final_obs.get(i * d..(i + 1) * d),
            _ => None,
        }
    }

    /// Per-env infos of the latest step.
    pub fn infos(&self) -> &[Info] {
        &self.infos
    }
}

impl Drop for GroupVecEnv {
    fn drop(&mut self) {
        if self.in_order {
            return;
        }
        if let Ok(mut close) = encode(&Order::Close) {
            let _ = self.comm.bcast(0, &mut close);
        }
    }
}

/// Closes the lead's split `channel`, whose envs will never be made (its rollout worker failed first): the members
/// make the split's communicator, say hello and get `Close`, so none waits for it.
pub fn close_unused(group: &EnvGroup, channel: usize) -> Result<()> {
    let comm = group.comm(channel)?;
    comm.gather(0, &[]).map_err(|e| comm_error(&e))?;
    comm.bcast(0, &mut encode(&Order::Close)?)
        .map_err(|e| comm_error(&e))
}

fn member_failed(r: usize, e: &str) -> RlfError {
    RlfError::Protocol {
        component: "env group",
        message: format!("env rank {r} of the group: {e}"),
    }
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(RlfError::Protocol {
            component: "env group",
            message: format!("{got} {what} values where {want} belong"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::EnvRegistry;
    use rlf_comm::LocalWorld;

    /// The actions of step `t`: a fixed pattern that ends episodes at various times.
    fn actions(t: usize, n: usize) -> Vec<i64> {
        (0..n).map(|i| ((t * 7 + i * 3) / 5 % 2) as i64).collect()
    }

    fn cartpoles(n: usize) -> Result<VecEnv> {
        Ok(VecEnv::from_registry(
            &EnvRegistry::with_builtin(),
            "CartPole-v1",
            n,
        )?)
    }

    /// Members serving their shares of `id`'s envs on threads; their step counts when the lead closes.
    fn members(
        world: Vec<rlf_comm::LocalComm>,
        total: usize,
        id: &'static str,
    ) -> Vec<std::thread::JoinHandle<Result<u64>>> {
        world
            .into_iter()
            .map(|comm| {
                std::thread::spawn(move || {
                    let shares = Shares {
                        total,
                        ranks: comm.size(),
                    };
                    serve_share(&comm, shares, |n| {
                        Ok(VecEnv::from_registry(&EnvRegistry::with_builtin(), id, n)?)
                    })
                })
            })
            .collect()
    }

    /// 7 CartPoles over 3 ranks (3, 2 and 2 envs) step exactly as one VecEnv of 7 does: observations, rewards, flags,
    /// finished episodes and final observations, through resets and many episode ends; every member took every step.
    #[test]
    fn a_group_steps_as_one_vec_env() {
        let (n, steps) = (7, 400);
        let mut world = LocalWorld::create(3);
        let lead = world.remove(0);
        let served = members(world, n, "CartPole-v1");
        let mut group = GroupVecEnv::lead(Box::new(lead), n, cartpoles).expect("group");
        let mut one = cartpoles(n).expect("envs");
        let (mut a, mut b) = (VecBuffers::new(n, 4), VecBuffers::new(n, 4));
        group.reset(Some(11), &mut a.obs).expect("reset");
        one.reset(Some(11), &mut b.obs).expect("reset");
        assert_eq!(a.obs, b.obs);
        let mut episodes = 0;
        for t in 0..steps {
            let acts = actions(t, n);
            group.step(ActionBatch::Discrete(&acts), a.view()).expect("step");
            one.step(ActionBatch::Discrete(&acts), b.view()).expect("step");
            assert_eq!(a, b, "step {t}");
            assert_eq!(group.infos(), one.infos(), "step {t}");
            for i in 0..n {
                assert_eq!(
                    group.final_observation(i),
                    one.final_observation(i),
                    "step {t} env {i}"
                );
            }
            episodes += one.infos().iter().filter(|i| i.episode.is_some()).count();
        }
        assert!(episodes > 20, "{episodes} episodes");
        drop(group);
        for member in served {
            assert_eq!(member.join().expect("member").expect("served"), steps as u64);
        }
    }

    /// A member's env error comes back to the lead naming the rank, and the members end when the lead's envs go; a
    /// member that cannot make its envs fails the lead's start, naming it.
    #[test]
    fn a_members_error_names_it_and_the_group_closes() {
        let mut world = LocalWorld::create(3);
        let lead = world.remove(0);
        let served = members(world, 3, "CartPole-v1");
        let mut group = GroupVecEnv::lead(Box::new(lead), 3, cartpoles).expect("group");
        let mut buffers = VecBuffers::new(3, 4);
        group.reset(Some(1), &mut buffers.obs).expect("reset");
        let err = group
            .step(ActionBatch::Discrete(&[0, 1, 9]), buffers.view())
            .unwrap_err()
            .to_string();
        assert!(err.contains("env rank 2 of the group"), "{err}");
        drop(group);
        for member in served {
            member.join().expect("member").expect("served");
        }
        let mut world = LocalWorld::create(2);
        let lead = world.remove(0);
        let served = members(world, 2, "NoSuchEnv-v0");
        let err = GroupVecEnv::lead(Box::new(lead), 2, cartpoles)
            .unwrap_err()
            .to_string();
        assert!(err.contains("env rank 1 of the group"), "{err}");
        for member in served {
            assert_eq!(member.join().expect("member").expect("served"), 0);
        }
    }

    #[test]
    fn shares_are_in_order_and_differ_by_one_at_most() {
        let s = Shares { total: 7, ranks: 3 };
        assert_eq!((0..3).map(|r| s.share(r)).collect::<Vec<_>>(), [3, 2, 2]);
        assert_eq!((0..4).map(|r| s.offset(r)).collect::<Vec<_>>(), [0, 3, 5, 7]);
    }
}
