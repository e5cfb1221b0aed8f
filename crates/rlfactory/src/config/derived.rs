//! Values derived from the configuration: sizes, and the networks a run's inference workers run (policies, self-play
//! snapshots, built-in players) and how they are numbered and grouped.

use super::*;

impl Config {
    /// Transitions in one training dataset.
    pub fn dataset_size(&self) -> usize {
        self.learning.batch_size * self.appo.num_batches_per_epoch
    }

    /// Networks the run's inference workers run: every policy and, with `--self_play`, every
    /// snapshot in the pools (each group of workers runs its own, [`Config::inference_groups`]).
    /// Network `i < num_policies` is policy `i`; then come the snapshots of policy 0, of policy 1,
    /// and so on ([`Config::snapshot_network`]).
    pub fn num_networks(&self) -> usize {
        let s = &self.sampling;
        s.num_policies * (1 + if s.self_play { s.opponent_pool_size } else { 0 })
    }

    /// Whether policy `policy` is a main exploiter (`--self_play_exploiters`: the last policies).
    pub fn is_exploiter(&self, policy: usize) -> bool {
        let s = &self.sampling;
        s.self_play && policy + s.self_play_exploiters >= s.num_policies && policy < s.num_policies
    }

    /// The network of snapshot `slot` of policy `policy`'s pool.
    pub fn snapshot_network(&self, policy: usize, slot: usize) -> usize {
        let s = &self.sampling;
        s.num_policies + policy * s.opponent_pool_size + slot
    }

    /// Steps per chunk of backpropagation through time (`--recurrence`, -1 standing for `--rollout`).
    pub fn recurrence(&self) -> usize {
        usize::try_from(self.appo.recurrence).unwrap_or(self.sampling.rollout)
    }

    /// The built-in players self-play mixes into the opponents (`--self_play_builtin_opponents`),
    /// in order.
    pub fn builtin_opponents(&self) -> Vec<&str> {
        self.sampling
            .self_play_builtin_opponents
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .collect()
    }

    /// The network id that stands for built-in opponent `k` (of
    /// [`builtin_opponents`](Config::builtin_opponents)) in the slots: past every policy and
    /// snapshot. No inference worker runs it: the rollout worker asks the env for its actions.
    pub fn builtin_network(&self, k: usize) -> usize {
        self.num_networks() + k
    }

    /// The policy whose weights network `network` holds (its own, or a snapshot of them).
    pub fn policy_of_network(&self, network: usize) -> usize {
        let s = &self.sampling;
        if network < s.num_policies {
            network
        } else {
            (network - s.num_policies) / s.opponent_pool_size.max(1)
        }
    }

    /// Groups of inference workers, each with its own queue of requests: one per policy (serving
    /// its networks), or a single one that serves every network (one policy, or
    /// `--shared_policy_workers`).
    pub fn inference_groups(&self) -> usize {
        let s = &self.sampling;
        if s.shared_policy_workers > 0 {
            1
        } else {
            s.num_policies
        }
    }

    /// Inference workers in each group ([`Config::inference_groups`]).
    pub fn workers_per_inference_group(&self) -> usize {
        let s = &self.sampling;
        if s.shared_policy_workers > 0 {
            s.shared_policy_workers
        } else {
            s.policy_workers_per_policy
        }
    }

    /// The group of inference workers that runs network `network`.
    pub fn inference_group_of_network(&self, network: usize) -> usize {
        if self.inference_groups() == 1 {
            0
        } else {
            self.policy_of_network(network)
        }
    }

    /// Envs across all rollout workers.
    pub fn total_envs(&self) -> usize {
        self.sampling.num_workers * self.sampling.num_envs_per_worker
    }
}

/// The slot of a pool of `pool_size` that a policy's snapshot `number` (1, 2, ...) goes into: in turn, except that
/// with `keep_first` (`--self_play_keep_first`) the first keeps slot 0 and the others take turns in the rest.
pub fn snapshot_slot(number: u64, pool_size: usize, keep_first: bool) -> usize {
    let pool = pool_size.max(1) as u64;
    let n = number.max(1) - 1;
    let slot = match (keep_first && pool > 1, n) {
        (true, 0) => 0,
        (true, n) => 1 + (n - 1) % (pool - 1),
        (false, n) => n % pool,
    };
    slot as usize
}

#[cfg(test)]
mod tests {
    use super::snapshot_slot;

    /// Snapshots 1..=7 in a pool of 3: in turn, or with the first kept in slot 0 and the others in slots 1 and 2.
    #[test]
    fn snapshots_take_turns_in_their_slots() {
        let slots = |keep_first| {
            (1..=7)
                .map(|n| snapshot_slot(n, 3, keep_first))
                .collect::<Vec<_>>()
        };
        assert_eq!(slots(false), [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(slots(true), [0, 1, 2, 1, 2, 1, 2]);
        assert_eq!(snapshot_slot(5, 1, true), 0);
    }
}
