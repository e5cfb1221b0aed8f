//! EXARL's communicators, from `--learner_procs` and `--process_per_env` (its `ExaSimple.split`):
//! - the **learner** communicator: the first `learner_procs` ranks;
//! - the **env** communicators: the learners form one; the other ranks form groups of `process_per_env`
//!   consecutive ranks, one communicator per group, whose rank 0 is the group's **lead**;
//! - the **agent** communicator: the learners and the lead of every env group, in rank order.
//!
//! `ranks − learner_procs` must be a positive multiple of `process_per_env`. One case is EXARL's sync learner's: when
//! `process_per_env` equals the number of ranks (with one learner), every rank is in the one env communicator and
//! rank 0 is the learner and the agent communicator alone.
//!
//! The lead of group `g` is rank `learner_procs + g · process_per_env` whatever the number of learners (EXARL's
//! workflows pick a wrong rank when there is more than one learner): the env communicator is split with the world
//! rank as key, so the lead is also its rank 0.

use crate::{Comm, Result};

/// Why a layout is impossible.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum LayoutError {
    /// Zero of something that needs at least one.
    #[error("--{what} must be at least 1, got 0")]
    Zero {
        /// The flag.
        what: &'static str,
    },
    /// The ranks do not divide into the learners and whole env groups.
    #[error(
        "{ranks} ranks cannot be {learner_procs} learner(s) plus groups of --process_per_env {process_per_env}: \
         ranks - learner_procs must be a positive multiple of process_per_env"
    )]
    Indivisible {
        /// Ranks in the world.
        ranks: usize,
        /// `--learner_procs`.
        learner_procs: usize,
        /// `--process_per_env`.
        process_per_env: usize,
    },
}

/// What a rank does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Learner number `index` (its rank in the learner communicator).
    Learner {
        /// Its rank among the learners.
        index: usize,
    },
    /// Member `member` of env group `group` (member 0 leads it).
    Actor {
        /// The env group.
        group: usize,
        /// Its rank in the group.
        member: usize,
    },
}

/// The assignment of a world's ranks to EXARL's communicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Ranks in the world.
    pub ranks: usize,
    /// Learner ranks (the first ones).
    pub learner_procs: usize,
    /// Ranks per env group.
    pub process_per_env: usize,
}

impl Layout {
    /// The layout of `ranks` ranks with `learner_procs` learners and env groups of `process_per_env`.
    pub fn new(ranks: usize, learner_procs: usize, process_per_env: usize) -> Result<Self, LayoutError> {
        if learner_procs == 0 {
            return Err(LayoutError::Zero {
                what: "learner_procs",
            });
        }
        if process_per_env == 0 {
            return Err(LayoutError::Zero {
                what: "process_per_env",
            });
        }
        let layout = Self {
            ranks,
            learner_procs,
            process_per_env,
        };
        let divisible = ranks > learner_procs && (ranks - learner_procs) % process_per_env == 0;
        if layout.shared() || divisible {
            Ok(layout)
        } else {
            Err(LayoutError::Indivisible {
                ranks,
                learner_procs,
                process_per_env,
            })
        }
    }

    /// EXARL's sync case: one env group of every rank, rank 0 also the learner.
    pub fn shared(&self) -> bool {
        self.ranks == self.process_per_env && self.learner_procs == 1
    }

    /// The number of env groups.
    pub fn env_groups(&self) -> usize {
        if self.shared() {
            1
        } else {
            (self.ranks - self.learner_procs) / self.process_per_env
        }
    }

    /// The world rank that leads env group `group` (its env communicator's rank 0).
    pub fn lead(&self, group: usize) -> usize {
        if self.shared() {
            0
        } else {
            self.learner_procs + group * self.process_per_env
        }
    }

    /// What world rank `rank` does (in the shared case rank 0 is the learner, and also leads the one group).
    pub fn role(&self, rank: usize) -> Role {
        if rank < self.learner_procs {
            Role::Learner { index: rank }
        } else if self.shared() {
            Role::Actor {
                group: 0,
                member: rank,
            }
        } else {
            let actor = rank - self.learner_procs;
            Role::Actor {
                group: actor / self.process_per_env,
                member: actor % self.process_per_env,
            }
        }
    }

    /// The world ranks of the learner communicator.
    pub fn learner_members(&self) -> Vec<usize> {
        (0..self.learner_procs).collect()
    }

    /// The world ranks of the agent communicator: the learners and every group's lead.
    pub fn agent_members(&self) -> Vec<usize> {
        let mut members = self.learner_members();
        members.extend((0..self.env_groups()).map(|g| self.lead(g)));
        members.dedup();
        members
    }

    /// The world ranks of the env communicator `rank` is in (the learners', or its group's).
    pub fn env_members(&self, rank: usize) -> Vec<usize> {
        if self.shared() {
            return (0..self.ranks).collect();
        }
        match self.role(rank) {
            Role::Learner { .. } => self.learner_members(),
            Role::Actor { group, .. } => {
                let lead = self.lead(group);
                (lead..lead + self.process_per_env).collect()
            }
        }
    }

    /// The colours of world rank `rank` in the three splits: agent, env, learner (`None`: not a member).
    fn colors(&self, rank: usize) -> (Option<u32>, u32, Option<u32>) {
        let agent = self.agent_members().contains(&rank).then_some(0);
        let learner = (rank < self.learner_procs).then_some(0);
        let env = match (self.shared(), self.role(rank)) {
            (true, _) | (false, Role::Learner { .. }) => 0,
            (false, Role::Actor { group, .. }) => group as u32 + 1,
        };
        (agent, env, learner)
    }
}

/// The communicators of one rank.
pub struct Communicators {
    /// The layout they were made by.
    pub layout: Layout,
    /// The whole world.
    pub global: Box<dyn Comm>,
    /// The learners and the env groups' leads (`None` on other ranks).
    pub agent: Option<Box<dyn Comm>>,
    /// The rank's env group (the learners': their own).
    pub env: Box<dyn Comm>,
    /// The learners (`None` on other ranks).
    pub learner: Option<Box<dyn Comm>>,
}

impl std::fmt::Debug for Communicators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicators")
            .field("layout", &self.layout)
            .field("rank", &self.global.rank())
            .field("agent", &self.agent.as_ref().map(|c| c.rank()))
            .field("env", &self.env.rank())
            .field("learner", &self.learner.as_ref().map(|c| c.rank()))
            .finish()
    }
}

impl Communicators {
    /// Splits `global` by `layout` (a collective: every rank calls it). Each split orders its members by world rank.
    pub fn split(global: Box<dyn Comm>, layout: Layout) -> Result<Self> {
        let rank = global.rank();
        if global.size() != layout.ranks {
            return Err(crate::CommError::Mismatch {
                what: "layout",
                message: format!(
                    "a layout of {} ranks for a world of {}",
                    layout.ranks,
                    global.size()
                ),
            });
        }
        let (agent, env, learner) = layout.colors(rank);
        let agent = global.split(agent, rank)?;
        let env = global
            .split(Some(env), rank)?
            .ok_or_else(|| crate::CommError::Mismatch {
                what: "split",
                message: "a rank with a colour got no communicator".into(),
            })?;
        let learner = global.split(learner, rank)?;
        Ok(Self {
            layout,
            global,
            agent,
            env,
            learner,
        })
    }

    /// The world ranks of each communicator's members, in their order, as every member sees them (a collective on
    /// the global communicator): `(agent, env, learner)`, empty where the rank is not a member. Each list is
    /// gathered to the communicator's rank 0 and broadcast from there.
    pub fn members(&self) -> Result<(Vec<usize>, Vec<usize>, Vec<usize>)> {
        let world = self.global.rank();
        let of = |comm: &dyn Comm| -> Result<Vec<usize>> {
            let mut bytes = comm
                .gather(0, &(world as u64).to_le_bytes())?
                .map(|all| all.concat())
                .unwrap_or_default();
            comm.bcast(0, &mut bytes)?;
            Ok(bytes
                .chunks_exact(8)
                .map(|b| {
                    let mut w = [0; 8];
                    w.copy_from_slice(b);
                    u64::from_le_bytes(w) as usize
                })
                .collect())
        };
        let agent = self.agent.as_deref().map(of).transpose()?.unwrap_or_default();
        let env = of(self.env.as_ref())?;
        let learner = self.learner.as_deref().map(of).transpose()?.unwrap_or_default();
        Ok((agent, env, learner))
    }

    /// Checks every communicator against the layout's rules on this rank: members and the lead's place. Returns a
    /// line saying what differs, if anything does.
    pub fn check(&self) -> Result<Option<String>> {
        let rank = self.global.rank();
        let (agent, env, learner) = self.members()?;
        let l = &self.layout;
        let want_agent = if l.agent_members().contains(&rank) {
            l.agent_members()
        } else {
            Vec::new()
        };
        let want_learner = if rank < l.learner_procs {
            l.learner_members()
        } else {
            Vec::new()
        };
        let mut wrong = Vec::new();
        for (name, got, want) in [
            ("agent", &agent, &want_agent),
            ("env", &env, &l.env_members(rank)),
            ("learner", &learner, &want_learner),
        ] {
            if got != want {
                wrong.push(format!("{name} {got:?}, want {want:?}"));
            }
        }
        if let Role::Actor { group, member } = l.role(rank) {
            if self.env.rank() != member || l.lead(group) != env[0] {
                wrong.push(format!(
                    "env rank {} (lead {}), want {member} (lead {})",
                    self.env.rank(),
                    env[0],
                    l.lead(group)
                ));
            }
        }
        Ok((!wrong.is_empty()).then(|| format!("rank {rank} of {l:?}: {}", wrong.join("; "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::tests::on_ranks;

    /// EXARL's rules by hand: 5 ranks, 1 learner, groups of 2 → groups {1, 2} and {3, 4}, agent {0, 1, 3}; with 2
    /// learners and groups of 1 the leads are 2, 3 and 4 (EXARL's workflows get this case wrong); the shared sync
    /// case; impossible layouts refused with a line naming the numbers.
    #[test]
    fn exarl_rules() {
        let l = Layout::new(5, 1, 2).expect("layout");
        assert_eq!((l.env_groups(), l.agent_members()), (2, vec![0, 1, 3]));
        assert_eq!(
            (l.env_members(0), l.env_members(2), l.env_members(3)),
            (vec![0], vec![1, 2], vec![3, 4])
        );
        assert_eq!(l.role(4), Role::Actor { group: 1, member: 1 });
        let two = Layout::new(5, 2, 1).expect("layout");
        assert_eq!(two.agent_members(), [0, 1, 2, 3, 4]);
        assert_eq!((two.lead(0), two.lead(2)), (2, 4));
        assert_eq!(two.env_members(1), [0, 1]);
        let two_by_two = Layout::new(4, 2, 2).expect("layout");
        assert_eq!(
            (two_by_two.agent_members(), two_by_two.env_members(3)),
            (vec![0, 1, 2], vec![2, 3])
        );
        let shared = Layout::new(3, 1, 3).expect("layout");
        assert!(shared.shared());
        assert_eq!(
            (shared.agent_members(), shared.env_members(2)),
            (vec![0], vec![0, 1, 2])
        );
        let bad = Layout::new(4, 1, 2).unwrap_err().to_string();
        assert!(
            bad.contains("4 ranks cannot be 1 learner(s) plus groups of --process_per_env 2"),
            "{bad}"
        );
        assert_eq!(
            Layout::new(2, 2, 1),
            Err(LayoutError::Indivisible {
                ranks: 2,
                learner_procs: 2,
                process_per_env: 1
            })
        );
        assert_eq!(
            Layout::new(3, 0, 1),
            Err(LayoutError::Zero {
                what: "learner_procs"
            })
        );
    }

    /// On local worlds of 3, 4 and 5 ranks, for every possible layout with 1 or 2 learners and groups of 1 or 2 (and
    /// the shared layout, groups of every rank), every rank's communicators hold exactly the members the rules give,
    /// and each group's lead is its rank 0.
    #[test]
    fn split_communicators_match_the_rules_on_every_rank() {
        let mut checked = 0;
        for ranks in 3..=5 {
            for learners in 1..=2 {
                for per_env in [1, 2, ranks] {
                    let Ok(layout) = Layout::new(ranks, learners, per_env) else {
                        continue;
                    };
                    let wrong = on_ranks(ranks, move |comm| {
                        let comms = Communicators::split(Box::new(comm), layout).expect("split");
                        comms.check().expect("check")
                    });
                    assert!(wrong.iter().all(Option::is_none), "{wrong:?}");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 12);
    }
}
