//! Which policy and which team each agent of an env is in, from the config: `--num_policies`, `--agent_policy_map`,
//! `--agent_team_map`, sync mode and `--pbt_mix_policies_in_one_env` (the rollout workers draw the policies by
//! these rules, see `sampling::policy_map`).

use crate::config::Config;
use crate::error::{Result, RlfError};

/// How agents map to policies, from the config.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mapping {
    /// `--num_policies`.
    pub num_policies: usize,
    /// The parsed `--agent_policy_map`.
    pub by_agent: Option<Vec<usize>>,
    /// Sync mode (`--async_rl=false`).
    pub sync: bool,
    /// `--pbt_mix_policies_in_one_env`.
    pub mix: bool,
}

/// How the agents named `agent_names` map to policies under `cfg` (an error names a bad `--agent_policy_map`).
pub fn policy_mapping(cfg: &Config, agent_names: &[String]) -> Result<Mapping> {
    let s = &cfg.sampling;
    Ok(Mapping {
        num_policies: s.num_policies,
        by_agent: parse_agent_policy_map(&s.agent_policy_map, agent_names, s.num_policies)?,
        sync: !cfg.run.async_rl,
        mix: s.pbt_mix_policies_in_one_env,
    })
}

/// The team of each agent named `agent_names`, whose env puts them in `env_teams`: `--agent_team_map`'s when given
/// (an error names a bad one), else the env's.
pub fn agent_teams(cfg: &Config, agent_names: &[String], env_teams: Vec<usize>) -> Result<Vec<usize>> {
    Ok(parse_agent_team_map(&cfg.sampling.agent_team_map, agent_names)?.unwrap_or(env_teams))
}

/// Parses `--agent_policy_map` (`prefix=policy,prefix=policy`) for agents named `agents`: each
/// agent takes the policy of the longest prefix its name starts with. An agent no entry matches,
/// an entry that matches no agent, a policy not below `num_policies` or a malformed entry is an
/// error naming it. An empty map is `None` (no explicit mapping).
pub fn parse_agent_policy_map(
    text: &str,
    agents: &[String],
    num_policies: usize,
) -> Result<Option<Vec<usize>>> {
    parse_prefix_map("--agent_policy_map", "policy", text, agents, |policy| {
        (policy >= num_policies)
            .then(|| format!("policy {policy} does not exist (--num_policies {num_policies})"))
    })
}

/// Parses `--agent_team_map` (`prefix=team,prefix=team`) for agents named `agents`, as
/// [`parse_agent_policy_map`] does (any whole number names a team).
pub fn parse_agent_team_map(text: &str, agents: &[String]) -> Result<Option<Vec<usize>>> {
    parse_prefix_map("--agent_team_map", "team", text, agents, |_| None)
}

/// A map from agent-name prefixes to indices of `what` given by `flag`; `bad` says what is wrong
/// with an index, if anything.
fn parse_prefix_map(
    flag: &str,
    what: &str,
    text: &str,
    agents: &[String],
    bad: impl Fn(usize) -> Option<String>,
) -> Result<Option<Vec<usize>>> {
    let err = |m: String| RlfError::Config(format!("{flag} `{text}`: {m}"));
    if text.trim().is_empty() {
        return Ok(None);
    }
    let mut entries: Vec<(&str, usize)> = Vec::new();
    for entry in text.split(',') {
        let Some((prefix, index)) = entry.split_once('=') else {
            return Err(err(format!("`{entry}` is not `agent_prefix={what}`")));
        };
        let prefix = prefix.trim();
        let index: usize = index
            .trim()
            .parse()
            .map_err(|_| err(format!("`{}` is not a {what} index", index.trim())))?;
        if let Some(m) = bad(index) {
            return Err(err(m));
        }
        if prefix.is_empty() || entries.iter().any(|(p, _)| *p == prefix) {
            return Err(err(format!("`{prefix}` is empty or given twice")));
        }
        if !agents.iter().any(|a| a.starts_with(prefix)) {
            return Err(err(format!(
                "`{prefix}` matches no agent (the agents are {})",
                agents.join(", ")
            )));
        }
        entries.push((prefix, index));
    }
    agents
        .iter()
        .map(|agent| {
            entries
                .iter()
                .filter(|(prefix, _)| agent.starts_with(prefix))
                .max_by_key(|(prefix, _)| prefix.len())
                .map(|&(_, index)| index)
                .ok_or_else(|| err(format!("agent `{agent}` matches no entry")))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|&n| n.to_owned()).collect()
    }

    #[test]
    fn agents_take_the_policy_of_their_longest_prefix() {
        let agents = names(&["adversary_0", "agent_0", "agent_1", "agent_10"]);
        let map = parse_agent_policy_map("adversary=1, agent=0, agent_10=2", &agents, 3).unwrap();
        assert_eq!(map, Some(vec![1, 0, 0, 2]));
        assert_eq!(parse_agent_policy_map(" ", &agents, 3).unwrap(), None);
    }

    #[test]
    fn bad_maps_are_errors_that_say_what_is_wrong() {
        let agents = names(&["player_0", "player_1"]);
        let cases = [
            ("player_0=0", "agent `player_1` matches no entry"),
            ("player=2", "policy 2 does not exist (--num_policies 2)"),
            ("player=x", "`x` is not a policy index"),
            ("player", "`player` is not `agent_prefix=policy`"),
            (
                "player=0,knight=1",
                "`knight` matches no agent (the agents are player_0, player_1)",
            ),
            ("player=0,player=1", "`player` is empty or given twice"),
        ];
        for (text, wanted) in cases {
            let e = parse_agent_policy_map(text, &agents, 2).unwrap_err().to_string();
            assert!(
                e.contains(wanted) && e.contains("--agent_policy_map"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn agents_take_the_team_of_their_longest_prefix() {
        let agents = names(&["red_0", "red_1", "blue_0", "blue_1"]);
        let map = parse_agent_team_map("red=0,blue=7", &agents).unwrap();
        assert_eq!(map, Some(vec![0, 0, 7, 7]));
        let e = parse_agent_team_map("red=0", &agents).unwrap_err().to_string();
        assert!(
            e.contains("--agent_team_map") && e.contains("`blue_0` matches no entry"),
            "{e}"
        );
        let e = parse_agent_team_map("red=a,blue=1", &agents)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`a` is not a team index"), "{e}");
    }
}
