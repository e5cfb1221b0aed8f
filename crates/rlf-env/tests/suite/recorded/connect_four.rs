//! Native Connect Four against games recorded from PettingZoo 1.24.3's `connect_four_v3`.
//!
//! Reads `tests/data/connect_four_public.jsonl` or the file named by
//! `RLFACTORY_GOLDEN_CONNECT_FOUR`, and fails when it is missing. All games are played in turn
//! through one [`ConnectFour`] env, by its `MultiAgentEnv` interface (so every game after the first
//! starts from the env's own reset within the previous game's last step): the recorded action goes
//! to the active agent, an out-of-range one to the other (it must be ignored). Before each move the
//! mover's observation and action mask must equal the recorded ones exactly; after it, both
//! agents' rewards, terminations and truncations.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rlf_env::connect_four::{ConnectFour, BOARD_DIM, COLUMNS, ID, OBS_DIM};
use rlf_env::{ActionBatch, MultiAgentEnv, VecBuffers};
use serde::Deserialize;

const AGENTS: [&str; 2] = ["player_0", "player_1"];

/// An action for the inactive agent: outside the action space, so using it would fail.
const IGNORED_ACTION: i64 = -1;

#[derive(Deserialize, Clone, Debug)]
struct RecordedStep {
    agent: String,
    /// `[row][column][plane]`.
    obs: Vec<Vec<Vec<f32>>>,
    action_mask: Vec<f32>,
    action: i64,
    rewards: BTreeMap<String, f32>,
    terminations: BTreeMap<String, bool>,
    truncations: BTreeMap<String, bool>,
}

#[derive(Deserialize, Clone, Debug)]
struct Game {
    env: String,
    pettingzoo: String,
    seed: u64,
    steps: Vec<RecordedStep>,
}

fn golden_path() -> PathBuf {
    match std::env::var_os("RLFACTORY_GOLDEN_CONNECT_FOUR") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/connect_four_public.jsonl"
        )),
    }
}

fn load_games() -> Vec<Game> {
    let path = golden_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the golden file {}: {e}", path.display()));
    let games: Vec<Game> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(line_no, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: bad game: {e}", path.display(), line_no + 1))
        })
        .collect();
    assert!(!games.is_empty(), "{} holds no games", path.display());
    games
}

/// Compares one recorded per-agent map (rewards or flags) with the env's output.
fn compare_per_agent<T: PartialEq + Copy + std::fmt::Debug>(
    what: &str,
    expected: &BTreeMap<String, T>,
    actual: &[T],
) -> Result<(), String> {
    if expected.len() != AGENTS.len() {
        return Err(format!(
            "{what}: recorded for {:?}",
            expected.keys().collect::<Vec<_>>()
        ));
    }
    for (name, &got) in AGENTS.iter().zip(actual) {
        match expected.get(*name) {
            Some(&want) if want == got => {}
            want => return Err(format!("{what} of {name}: env {got:?}, recorded {want:?}")),
        }
    }
    Ok(())
}

/// Checks the mover's observation slot against the recorded board and mask.
fn compare_observation(step: &RecordedStep, slot: &[f32]) -> Result<(), String> {
    let (mask, board) = slot.split_at(COLUMNS);
    if step.action_mask.as_slice() != mask {
        return Err(format!(
            "action mask: env {mask:?}, recorded {:?}",
            step.action_mask
        ));
    }
    let recorded: Vec<f32> = step.obs.iter().flatten().flatten().copied().collect();
    let shape_ok = step.obs.len() == 6 && step.obs.iter().flatten().all(|planes| planes.len() == 2);
    if !shape_ok || recorded.len() != BOARD_DIM {
        return Err(format!("recorded observation is not 6 x 7 x 2: {:?}", step.obs));
    }
    match board.iter().zip(&recorded).position(|(a, e)| a != e) {
        None => Ok(()),
        Some(i) => Err(format!(
            "observation [row {}][column {}][plane {}]: env {}, recorded {}",
            i / (COLUMNS * 2),
            i / 2 % COLUMNS,
            i % 2,
            board[i],
            recorded[i]
        )),
    }
}

/// Plays every game through one env; returns the first difference from the recording.
fn first_mismatch(games: &[Game]) -> Option<String> {
    let mut env = ConnectFour::new();
    let mut buf = VecBuffers::new(AGENTS.len(), OBS_DIM);
    if let Err(e) = env.reset(Some(0), &mut buf.obs) {
        return Some(format!("reset: {e}"));
    }
    for (g, game) in games.iter().enumerate() {
        let at = |t: usize| format!("game {g} (seed {}) step {t}", game.seed);
        if game.env != ID {
            return Some(format!("{}: recorded env {}, not {ID}", at(0), game.env));
        }
        for (t, step) in game.steps.iter().enumerate() {
            let Some(mover) = AGENTS.iter().position(|&a| a == step.agent) else {
                return Some(format!("{}: unknown agent {}", at(t), step.agent));
            };
            let active: Vec<bool> = (0..AGENTS.len()).map(|k| env.is_active(k)).collect();
            if active.iter().enumerate().any(|(k, &a)| a != (k == mover)) {
                return Some(format!(
                    "{}: {} should move, env active {active:?}",
                    at(t),
                    step.agent
                ));
            }
            let slot = &buf.obs[mover * OBS_DIM..(mover + 1) * OBS_DIM];
            if let Err(e) = compare_observation(step, slot) {
                return Some(format!("{}: {e}", at(t)));
            }

            let mut actions = [IGNORED_ACTION; 2];
            actions[mover] = step.action;
            if let Err(e) = env.step(ActionBatch::Discrete(&actions), buf.view()) {
                return Some(format!("{}: step({}) failed: {e}", at(t), step.action));
            }
            let checks = [
                compare_per_agent("reward", &step.rewards, &buf.rewards),
                compare_per_agent("termination", &step.terminations, &buf.terminated),
                compare_per_agent("truncation", &step.truncations, &buf.truncated),
            ];
            if let Some(Err(e)) = checks.into_iter().find(Result::is_err) {
                return Some(format!("{}: after the move, {e}", at(t)));
            }
        }
        // A recording cut before the game's end: start the next game by hand.
        let ended = buf.terminated.iter().all(|&t| t);
        if !ended {
            if let Err(e) = env.reset(None, &mut buf.obs) {
                return Some(format!("game {g}: reset: {e}"));
            }
        }
    }
    None
}

#[test]
fn native_connect_four_matches_pettingzoo() {
    let games = load_games();
    if let Some(mismatch) = first_mismatch(&games) {
        panic!("{}: {mismatch}", golden_path().display());
    }
    let steps: usize = games.iter().map(|g| g.steps.len()).sum();
    let versions: Vec<&str> = games.iter().map(|g| g.pettingzoo.as_str()).collect();
    println!(
        "{} games, {steps} moves match PettingZoo {versions:?}",
        games.len()
    );
    if std::env::var_os("RLFACTORY_GOLDEN_CONNECT_FOUR").is_none() {
        assert_eq!((games.len(), steps), (12, 294), "the public file");
        assert!(versions.iter().all(|&v| v == "1.24.3"));
    }
}

#[test]
fn comparison_reports_corrupted_recordings() {
    let games = load_games();
    assert_eq!(first_mismatch(&games), None, "the recording itself must match");

    /// What is corrupted, and how: returns the step it changed.
    type Corruption = (&'static str, fn(&mut Game) -> usize);
    let corruptions: [Corruption; 4] = [
        ("observation", |g| {
            let step = 3.min(g.steps.len() - 1);
            let cell = &mut g.steps[step].obs[5][2][1];
            *cell = 1.0 - *cell;
            step
        }),
        ("reward", |g| {
            let step = g.steps.len() - 1;
            for reward in g.steps[step].rewards.values_mut() {
                if *reward == -1.0 {
                    *reward = 0.0;
                }
            }
            step
        }),
        ("action mask", |g| {
            let step = 5.min(g.steps.len() - 1);
            g.steps[step].action_mask[0] = 1.0 - g.steps[step].action_mask[0];
            step
        }),
        ("termination", |g| {
            let step = g.steps.len() / 2;
            for flag in g.steps[step].terminations.values_mut() {
                *flag = !*flag;
            }
            step
        }),
    ];
    for (what, corrupt) in corruptions {
        for g in [0, games.len() / 2, games.len() - 1] {
            let mut copy = games.clone();
            let t = corrupt(&mut copy[g]);
            let mismatch = first_mismatch(&copy)
                .unwrap_or_else(|| panic!("a corrupted {what} in game {g} step {t} went unnoticed"));
            assert!(
                mismatch.starts_with(&format!("game {g} ")) && mismatch.contains(&format!("step {t}:")),
                "corrupted {what} at game {g} step {t}, reported: {mismatch}"
            );
            assert!(mismatch.contains(what), "corrupted {what}, reported: {mismatch}");
        }
    }
}
