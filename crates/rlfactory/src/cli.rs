//! The `rlfactory` command line: subcommands, and how `train`'s flags are layered over the
//! defaults and config files (see [`crate::config`]).

use std::any::TypeId;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::builder::PossibleValuesParser;
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::{parse_settings, read_settings, Config, Settings};
use crate::enjoy::{EnjoyArgs, EvalArgs, ExportArgs};
use crate::env::EnvRegistry;
use crate::error::RlfError;
use crate::plan::RunPlan;
use crate::runner;
use crate::top::TopArgs;

/// The `rlfactory` command line.
#[derive(Debug, Parser)]
#[command(
    name = "rlfactory",
    version,
    about = "High-throughput asynchronous reinforcement learning"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a policy.
    Train(Box<TrainArgs>),
    /// Run episodes with a trained policy and print their returns.
    Enjoy(EnjoyArgs),
    /// Run episodes with a trained policy on many envs at once and write their returns to a CSV.
    Eval(EvalArgs),
    /// Write a trained policy as a PyTorch state dict (safetensors).
    Export(ExportArgs),
    /// Watch a running experiment: FPS, policy lag, each component's CPU, queues and heartbeat, replay fill.
    Top(TopArgs),
    /// Print every flag of `train` by section, with its type, default and help.
    Config(ConfigArgs),
}

/// `rlfactory config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Print the reference as the book's page of flags (Markdown, `docs/flags.md`) instead of text.
    #[arg(long)]
    pub markdown: bool,
}

/// `rlfactory train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A file of settings (TOML, or an experiment's config.json; keys are flag names), applied
    /// over the env's shipped defaults.
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// The configuration.
    #[command(flatten)]
    pub config: Config,
}

/// How a command line was understood.
#[derive(Debug)]
pub enum Invocation {
    /// Train as this plan (a resolved configuration, checked against its env) says.
    Train(Box<RunPlan>),
    /// Run episodes with a trained policy.
    Enjoy(EnjoyArgs),
    /// Evaluate a trained policy on many envs.
    Eval(EvalArgs),
    /// Export a trained policy.
    Export(ExportArgs),
    /// Watch a running experiment.
    Top(TopArgs),
    /// Print the reference of `train`'s flags.
    Config(ConfigArgs),
}

/// Why a command line was not accepted.
#[derive(Debug)]
pub enum CliError {
    /// clap's own outcome: a usage error, or `--help` / `--version` to print.
    Clap(clap::Error),
    /// A bad config file or an impossible combination of values.
    Invalid(RlfError),
}

impl From<clap::Error> for CliError {
    fn from(e: clap::Error) -> Self {
        CliError::Clap(e)
    }
}

impl From<RlfError> for CliError {
    fn from(e: RlfError) -> Self {
        CliError::Invalid(e)
    }
}

/// The command line, with `train`'s defaults taken from [`Config::default`].
fn cli_command() -> Result<clap::Command, RlfError> {
    let defaults = Config::flag_defaults()?;
    Ok(Cli::command()
        .args_override_self(true)
        .mut_subcommand("train", |train| {
            defaults.into_iter().fold(
                train.allow_negative_numbers(true).mut_arg("algo", |a| {
                    a.value_parser(PossibleValuesParser::new(crate::algo::names()))
                }),
                |train, (key, value)| {
                    if train.get_arguments().any(|a| a.get_id() == key.as_str()) {
                        train.mut_arg(key, |a| a.default_value(value).required(false))
                    } else {
                        train
                    }
                },
            )
        }))
}

/// The section of the flags that belong to no section of [`Config`] (`--config`).
const FILES_SECTION: &str = "Settings files";

/// Every flag of `train`, by section in the order of `--help`, with its type, default and help: as text, or as the
/// book's page of flags (`markdown`). Generated from the command line `train` parses, whose defaults are
/// [`Config::default`]'s, so the page cannot drift from the program.
pub fn flags_reference(markdown: bool) -> Result<String, RlfError> {
    let command = cli_command()?;
    let train = command
        .get_subcommands()
        .find(|c| c.get_name() == "train")
        .ok_or_else(|| RlfError::Config("the command line has no `train`".into()))?;
    let settings = Config::default().to_settings()?;
    // In the order the flags are declared (`train`'s own list has those given defaults at its end).
    let declared = TrainArgs::augment_args(clap::Command::new("train"));
    let mut sections: Vec<(&str, Vec<&clap::Arg>)> = Vec::new();
    for id in declared.get_arguments().map(clap::Arg::get_id) {
        let Some(arg) = train.get_arguments().find(|a| a.get_id() == id) else {
            continue;
        };
        if arg.get_long().is_none() || arg.is_hide_set() {
            continue;
        }
        let heading = arg.get_help_heading().unwrap_or(FILES_SECTION);
        match sections.iter_mut().find(|(h, _)| *h == heading) {
            Some((_, args)) => args.push(arg),
            None => sections.push((heading, vec![arg])),
        }
    }
    let one_line = |text: String| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::new();
    if markdown {
        out.push_str(
            "# Flags of `rlfactory train`\n\nEvery flag, by section, with its type, its default and what it does. \
             The defaults are the reference values; an env's shipped config (`crates/rlfactory/configs/<env>.toml`) \
             and a `--config FILE` apply over them, and flags given on the command line win over both. A settings \
             file's keys are these flags' names without the dashes.\n\nThis page is generated: \
             `rlfactory config --markdown > docs/flags.md` writes it, and a test fails when it differs from what the \
             program generates.\n",
        );
    }
    for (heading, args) in sections {
        if markdown {
            out.push_str(&format!(
                "\n## {heading}\n\n| flag | type | default | what it does |\n|---|---|---|---|\n"
            ));
        } else {
            out.push_str(&format!("{heading}\n"));
        }
        for arg in args {
            let long = arg.get_long().unwrap_or_default();
            let choices: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_owned())
                .collect();
            let parsed = arg.get_value_parser().type_id();
            let is = |t: std::any::TypeId| parsed == t;
            let kind = if is(TypeId::of::<bool>()) {
                "bool".to_owned()
            } else if !choices.is_empty() {
                format!("one of {}", choices.join(", "))
            } else if [TypeId::of::<f64>(), TypeId::of::<f32>()].into_iter().any(is) {
                "number".to_owned()
            } else if [
                TypeId::of::<u64>(),
                TypeId::of::<u32>(),
                TypeId::of::<usize>(),
                TypeId::of::<i64>(),
                TypeId::of::<i32>(),
            ]
            .into_iter()
            .any(is)
            {
                "integer".to_owned()
            } else if is(TypeId::of::<PathBuf>()) {
                "path".to_owned()
            } else if matches!(settings.get(long), Some(toml::Value::Array(_))) {
                "list".to_owned()
            } else {
                "text".to_owned()
            };
            let defaults = arg.get_default_values();
            let default = defaults
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(",");
            let help = one_line(
                arg.get_long_help()
                    .or(arg.get_help())
                    .map(ToString::to_string)
                    .unwrap_or_default(),
            );
            if markdown {
                let cell = |text: &str| text.replace('|', "\\|");
                let default = match default.as_str() {
                    "" if defaults.is_empty() => "none".to_owned(),
                    "" => "empty".to_owned(),
                    d => format!("`{}`", cell(d)),
                };
                out.push_str(&format!(
                    "| `--{long}` | {} | {default} | {} |\n",
                    cell(&kind),
                    cell(&help)
                ));
            } else {
                let default = match default.as_str() {
                    "" if defaults.is_empty() => String::new(),
                    "" => " [default: empty]".to_owned(),
                    d => format!(" [default: {d}]"),
                };
                out.push_str(&format!("  --{long} <{kind}>{default}\n      {help}\n"));
            }
        }
        if !markdown {
            out.push('\n');
        }
    }
    Ok(out)
}

/// Parses `args` (program name first). For `train`: the defaults, the env's shipped config,
/// `--config FILE` and the values given on the command line, in that order (see
/// [`crate::config`]), then `--benchmark`'s implications, then validation.
pub fn parse_invocation(args: &[String], registry: &EnvRegistry) -> Result<Invocation, CliError> {
    let matches = cli_command()?.try_get_matches_from(args)?;
    let train = match Cli::from_arg_matches(&matches)?.command {
        Command::Train(train) => train,
        Command::Enjoy(a) => {
            a.check()?;
            return Ok(Invocation::Enjoy(a));
        }
        Command::Eval(a) => {
            a.check()?;
            return Ok(Invocation::Eval(a));
        }
        Command::Export(a) => {
            a.source.check()?;
            crate::config::check_output_file("--out", &a.out)?;
            return Ok(Invocation::Export(a));
        }
        Command::Top(a) => {
            a.check()?;
            return Ok(Invocation::Top(a));
        }
        Command::Config(a) => return Ok(Invocation::Config(a)),
    };
    let given = matches
        .subcommand_matches("train")
        .ok_or_else(|| RlfError::Config("the command line lost the train command".into()))?;
    let file = match &train.config_file {
        Some(path) => Some((path.as_path(), read_settings(path)?)),
        None => None,
    };
    // The values given on the command line, as clap typed them.
    let typed = train.config.to_settings()?;
    let command_line: Settings = given
        .ids()
        .map(|id| id.as_str())
        .filter(|key| given.value_source(key) == Some(ValueSource::CommandLine))
        .filter_map(|key| Some((key.to_owned(), typed.get(key)?.clone())))
        .collect();
    let config = Config::layered(
        file.as_ref().map(|(path, settings)| (*path, settings)),
        &command_line,
    )?;
    let plan = RunPlan::resolve(&config, registry)?;
    plan.check_train_usage()?;
    Ok(Invocation::Train(Box::new(plan)))
}

impl Config {
    /// A configuration for `env`: the reference values, the env's shipped settings and `settings` (lines of TOML,
    /// keys named as the flags, as in a `--config` file: `["algo = 'dqn'", "n_step = 3"]`), layered as a run's are
    /// ([`Config::layered`], `settings` in the command line's place), and checked against the env as `train` checks
    /// it.
    pub fn for_env(env: &str, settings: &[&str]) -> Result<Config, RlfError> {
        Config::checked_for_env(env, None, settings)
    }

    /// As [`Config::for_env`], with the settings of `file` (as `--config FILE`) under `settings`.
    pub fn for_env_with_file(env: &str, file: &Path, settings: &[&str]) -> Result<Config, RlfError> {
        Config::checked_for_env(env, Some(file), settings)
    }

    fn checked_for_env(env: &str, file: Option<&Path>, settings: &[&str]) -> Result<Config, RlfError> {
        let mut given = parse_settings(
            &settings.join("\n"),
            Path::new("the settings given to Config::for_env"),
        )?;
        given.insert("env".into(), env.into());
        let file = match file {
            Some(path) => Some((path, read_settings(path)?)),
            None => None,
        };
        let config = Config::layered(file.as_ref().map(|(path, s)| (*path, s)), &given)?;
        RunPlan::resolve(&config, &EnvRegistry::with_builtin())?.check_train_usage()?;
        Ok(config)
    }
}

/// The whole `rlfactory` program over the envs of `registry`: a binary of your own with your own
/// native envs is `fn main() -> ExitCode { rlfactory::cli::main(my_registry()) }`. Worker
/// processes re-entering the binary build their part of the graph first thing. Exit codes: 0, 2
/// for a usage or config error, 1 for a failure at run time (the error on one line), 128 +
/// signal for a run stopped by SIGINT or SIGTERM (after its last checkpoint).
///
/// It does not return: once the command is done and everything it opened is dropped, it ends the process
/// ([`rlf_shm::process::exit_now`]) without libtorch's static destructors, which would take about a tenth of a
/// second of every process's CPU after the work is over.
pub fn main(registry: EnvRegistry) -> ! {
    rlf_shm::process::exit_now(main_code(registry))
}

/// [`main`]'s work: the exit code of the command.
fn main_code(registry: EnvRegistry) -> u8 {
    #[cfg(feature = "python")]
    rlf_env::gym::pin_python_home();
    rlf_shm::process::keep_freed_memory();
    // libtorch's OpenMP threads spin after every parallel region unless told otherwise, taking the cores the rollout
    // and inference workers need; they sleep instead (in the processes started from here: the environment is read
    // when libtorch loads), unless the user chose a policy.
    if std::env::var_os("OMP_WAIT_POLICY").is_none() {
        std::env::set_var("OMP_WAIT_POLICY", "PASSIVE");
    }
    // NumPy's OpenBLAS starts a thread per core when a Python env first imports it: in every worker of a run of many
    // processes on few cores, and in this one before the shared-memory reaper is forked (which needs one thread).
    // One thread each, as Sample Factory's workers have, unless the user chose.
    if std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        std::env::set_var("OPENBLAS_NUM_THREADS", "1");
    }
    let child_registry = registry.clone();
    if let Some(code) = rlf_signal::child_entry(move |app| runner::child_build_with(app, child_registry)) {
        return code;
    }
    if let Err(e) = stop_with_starter() {
        eprintln!("error: {e}");
        return 1;
    }
    // Timings (`seconds_to_reward`, `wall_seconds`) count from the kernel's start of the process.
    let now = Instant::now();
    let process_start = rlf_shm::process::age()
        .and_then(|age| now.checked_sub(age))
        .unwrap_or(now);
    let args: Vec<String> = std::env::args().collect();
    let invocation = match parse_invocation(&args, &registry) {
        Ok(i) => i,
        Err(CliError::Clap(e)) if !e.use_stderr() => {
            let _ = e.print();
            return 0;
        }
        Err(CliError::Clap(e))
            if matches!(
                e.kind(),
                clap::error::ErrorKind::MissingSubcommand
                    | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            eprintln!(
                "error: a command is required: train, enjoy, eval, export or top (rlfactory --help says more)"
            );
            return 2;
        }
        Err(CliError::Clap(e)) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            return 2;
        }
        Err(CliError::Invalid(e)) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    match run(invocation, &registry, process_start) {
        Ok(None) => 0,
        Ok(Some(signal)) => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
        Err(RlfError::ReportedByRankZero) => 1,
        Err(e @ RlfError::Usage(_)) => {
            eprintln!("error: {e}");
            2
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// The variable in which a program that starts `rlfactory` (the Python package's `rlfactory.train`) gives its process
/// id: the run then stops, as on SIGTERM, when that process dies (see [`rlf_signal::stop_with_parent`]).
pub const PARENT_PID_ENV: &str = "RLFACTORY_PARENT_PID";

/// Stops this process with the program that started it, when that program asked (in [`PARENT_PID_ENV`]).
fn stop_with_starter() -> Result<(), String> {
    let Some(value) = std::env::var_os(PARENT_PID_ENV) else {
        return Ok(());
    };
    let pid = value
        .to_str()
        .and_then(|v| v.parse::<u32>().ok())
        .ok_or_else(|| format!("{PARENT_PID_ENV}={value:?} is not a process id"))?;
    rlf_signal::stop_with_parent(pid).map_err(|e| format!("{PARENT_PID_ENV}: {e}"))
}

/// Runs the command; returns the signal that interrupted a training run, if one did.
fn run(
    invocation: Invocation,
    registry: &EnvRegistry,
    process_start: Instant,
) -> Result<Option<i32>, RlfError> {
    let plan = match invocation {
        Invocation::Train(plan) => plan,
        Invocation::Enjoy(args) => return crate::enjoy::enjoy(&args, registry).map(|_| None),
        Invocation::Eval(args) => return crate::enjoy::eval(&args, registry).map(|_| None),
        Invocation::Export(args) => return crate::enjoy::export(&args, registry).map(|()| None),
        Invocation::Top(args) => return crate::top::top(&args, &mut std::io::stdout().lock()).map(|()| None),
        Invocation::Config(args) => {
            print!("{}", flags_reference(args.markdown)?);
            return Ok(None);
        }
    };
    let cfg = &plan.config;
    // A reaper removes the shared memory that the run and its workers leave if they are all killed at once (SIGKILL of
    // the process group); an MPI rank starts its own first thing. It is forked, as the workers are, while this
    // process has one thread: before libtorch's first operation, which starts its thread pool unless told how many
    // threads to use.
    let reaper = cfg.distributed.mpi
        || rlf_shm::process::start_segment_reaper().map_err(|e| RlfError::Io {
            what: "starting the shared-memory reaper for",
            path: cfg.run.train_dir.clone(),
            source: e,
        })?;
    tch::set_num_threads(cfg.run.num_threads);
    if !cfg.distributed.mpi {
        runner::check_resources(&plan)?;
    }
    if cfg.run.verbose {
        eprintln!("[rlfactory] training {} with:\n{}", cfg.env.env, cfg.to_toml()?);
    } else {
        eprintln!("[rlfactory] {}", start_line(cfg));
    }
    if !reaper {
        eprintln!("[rlfactory] no shared-memory reaper: this process already runs several threads");
    }
    let summary = if cfg.distributed.mpi {
        match crate::runner::train_mpi(&plan, registry, process_start)? {
            Some(summary) => summary,
            None => return Ok(rlf_signal::stop_signal()),
        }
    } else {
        runner::train_planned(&plan, registry, process_start)?
    };
    let program = std::env::args().next().unwrap_or_else(|| "rlfactory".to_owned());
    for line in end_lines(cfg, &summary, &program) {
        eprintln!("[rlfactory] {line}");
    }
    if cfg.run.benchmark {
        eprintln!(
            "[rlfactory] benchmark: steady-state fps {:.0} ({} env frames, overall fps {:.0})",
            summary.fps, summary.env_frames, summary.fps_overall
        );
    }
    if let Some(path) = &cfg.run.summary_json {
        let json = serde_json::to_string_pretty(&summary)
            .map_err(|e| RlfError::Config(format!("cannot serialise the summary: {e}")))?;
        std::fs::write(path, &json).map_err(|source| RlfError::Io {
            what: "writing the summary to",
            path: path.clone(),
            source,
        })?;
    }
    Ok(summary.signal)
}

/// What a run says as it starts (the whole config with `--verbose`): the env, the algorithm, the budget and where
/// the experiment goes.
fn start_line(cfg: &Config) -> String {
    let r = &cfg.run;
    let mut budget = format!("budget: {} env frames", r.train_for_env_steps);
    if r.train_for_seconds < crate::config::UNLIMITED_SECONDS {
        budget = format!(
            "budget: {} s or {} env frames",
            r.train_for_seconds, r.train_for_env_steps
        );
    }
    if let Some(target) = r.stop_at_reward {
        budget.push_str(&format!(", until a mean return of {target}"));
    }
    let saved = if r.save_experiment {
        format!("into {}", r.train_dir.join(&r.experiment).display())
    } else {
        "saving nothing (--save_experiment false)".to_owned()
    };
    format!(
        "training {} with {} ({budget}), {saved}; --verbose prints the whole config",
        cfg.env.env, cfg.learning.algo
    )
}

/// What a run says at its end: frames, time and return, then where the experiment is and the commands that open its
/// curves and play its policy (`program` is how this binary was called).
fn end_lines(cfg: &Config, summary: &runner::Summary, program: &str) -> Vec<String> {
    use runner::StopReason;
    let r = &cfg.run;
    let ret = summary
        .mean_return
        .map_or_else(|| "n/a (no episode ended)".to_owned(), |m| format!("{m:.2}"));
    let why = match summary.stop_reason {
        StopReason::EnvSteps => "the frame budget".to_owned(),
        StopReason::Seconds => "the time budget".to_owned(),
        StopReason::Reward => format!("a mean return of {}", r.stop_at_reward.unwrap_or_default()),
        StopReason::Failed => "a failure".to_owned(),
        StopReason::Interrupted => "a signal".to_owned(),
        StopReason::OtherLearner => "another learner rank".to_owned(),
    };
    let mut lines = vec![format!(
        "done: {} env frames in {:.1} s ({:.0} fps), mean return {ret} over the last {} episodes; stopped at {why}",
        summary.env_frames, summary.wall_seconds, summary.fps_overall, r.stats_avg
    )];
    if summary.policies.len() > 1 {
        for (p, policy) in summary.policies.iter().enumerate() {
            let ret = policy
                .mean_return
                .map_or_else(|| "n/a".to_owned(), |m| format!("{m:.2}"));
            lines.push(format!("policy {p}: mean return {ret}"));
        }
    }
    if r.save_experiment {
        let dir = r.train_dir.join(&r.experiment);
        lines.push(format!(
            "saved in {}: config.json, checkpoints, TensorBoard scalars, the learning curve",
            dir.display()
        ));
        lines.push(match tensorboard() {
            Some(program) => format!("curves: {program} --logdir {}", dir.display()),
            None => format!(
                "curves: the learning_curve*.png images there; TensorBoard's (pip install tensorboard): \
                 tensorboard --logdir {}",
                dir.display()
            ),
        });
        lines.push(format!(
            "watch the policy: {program} enjoy --env {} --experiment {} --train_dir {}",
            cfg.env.env,
            r.experiment,
            r.train_dir.display()
        ));
    }
    lines
}

/// The `tensorboard` a user can type here: the one on `PATH`, else the one in the `.venv` of the clone this binary was
/// built in (`bash scripts/test` installs it there), else none.
fn tensorboard() -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|dir| dir.join("tensorboard").is_file()) {
        return Some("tensorboard".to_owned());
    }
    let clone = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/tensorboard");
    let clone = std::fs::canonicalize(clone).ok()?;
    clone.is_file().then(|| clone.display().to_string())
}

/// clap's error as one line: its message without the usage and tips.
pub fn one_line(text: &str) -> String {
    let parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:"))
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    parts.join(" ").trim_start_matches("error: ").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_default_equals_the_command_lines_defaults() {
        let matches = cli_command()
            .expect("the defaults")
            .try_get_matches_from(["rlfactory", "train", "--env", "CartPole-v1"])
            .expect("parse");
        let Command::Train(train) = Cli::from_arg_matches(&matches).expect("typed").command else {
            panic!("not train")
        };
        assert_eq!(train.config, Config::default());
    }

    /// `--algo dqn` and `--algo sac` take the env's settings for them, not its APPO ones; each shipped off-policy
    /// config is valid.
    #[test]
    fn off_policy_algos_take_their_own_shipped_configs() {
        for (env, batch) in [
            ("CartPole-v1", 64),
            ("Acrobot-v1", 128),
            ("MountainCar-v0", 128),
            ("treasurehunt", 256),
        ] {
            let cfg = Config::for_env(env, &["algo = 'dqn'"]).expect("a valid config");
            assert_eq!(
                (cfg.learning.algo.as_str(), cfg.learning.batch_size),
                ("dqn", batch),
                "{env}"
            );
        }
        let pendulum = Config::for_env("Pendulum-v1", &["algo = 'dqn'"])
            .unwrap_err()
            .to_string();
        assert!(pendulum.contains("Discrete"), "{pendulum}");
        let sac = Config::for_env("Pendulum-v1", &["algo = 'sac'"]).expect("a valid config");
        assert_eq!(
            (
                sac.learning.algo.as_str(),
                sac.off_policy.replay_ratio,
                sac.off_policy.tau
            ),
            ("sac", 256.0, 0.005)
        );
        let cartpole = Config::for_env("CartPole-v1", &["algo = 'sac'"])
            .unwrap_err()
            .to_string();
        assert!(cartpole.contains("needs Box actions"), "{cartpole}");
        // A config file that sets the algorithm takes that algorithm's shipped defaults (MountainCar's APPO ones
        // would normalise the inputs, which DQN refuses).
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/MountainCar-v0-dqn.toml");
        let cfg = Config::for_env_with_file("MountainCar-v0", std::path::Path::new(file), &[])
            .expect("a valid config");
        assert_eq!(
            (
                cfg.learning.algo.as_str(),
                cfg.learning.batch_size,
                cfg.model.normalize_input
            ),
            ("dqn", 128, false)
        );
        // A name no algorithm registered is one line naming those that are, wherever it was written.
        let unknown = Config::for_env("CartPole-v1", &["algo = 'ppo'"])
            .unwrap_err()
            .to_string();
        assert_eq!(
            unknown,
            "invalid configuration: --algo ppo: there is no such algorithm (there are: appo, dqn, sac)"
        );
    }

    /// A `--config` file may name the env (a saved `config.json` does): its shipped defaults apply under the file,
    /// `--env` on the command line wins, and with neither the error asks for `--env`.
    #[test]
    fn the_env_may_come_from_the_config_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("acrobot.toml");
        std::fs::write(
            &file,
            "env = \"Acrobot-v1\"\nalgo = \"dqn\"\nlearning_starts = 321\n",
        )
        .expect("write");
        let parse = |args: &[&str]| {
            let mut all = vec!["rlfactory".to_owned(), "train".to_owned()];
            all.extend(args.iter().map(|a| a.to_string()));
            match parse_invocation(&all, &EnvRegistry::with_builtin()) {
                Ok(Invocation::Train(plan)) => Ok(plan.config),
                Ok(_) => panic!("not a train command"),
                Err(CliError::Invalid(e)) => Err(e.to_string()),
                Err(CliError::Clap(e)) => Err(e.to_string()),
            }
        };
        let path = file.to_str().expect("utf-8 path");
        let cfg = parse(&["--config", path]).expect("a valid config");
        // Acrobot's shipped DQN config has batches of 128; the file's own value is kept.
        assert_eq!(
            (
                cfg.env.env.as_str(),
                cfg.learning.batch_size,
                cfg.off_policy.learning_starts
            ),
            ("Acrobot-v1", 128, 321)
        );
        let cfg = parse(&["--config", path, "--env", "CartPole-v1"]).expect("a valid config");
        assert_eq!(
            (cfg.env.env.as_str(), cfg.learning.batch_size),
            ("CartPole-v1", 64)
        );
        let bare = dir.path().join("bare.toml");
        std::fs::write(&bare, "learning_starts = 321\n").expect("write");
        let error = parse(&["--config", bare.to_str().expect("utf-8 path")]).unwrap_err();
        assert!(error.contains("--env is required"), "{error}");
    }

    #[test]
    fn every_key_of_a_saved_config_is_a_flag() {
        let keys = Config::keys();
        for key in Config::default().to_settings().expect("settings").keys() {
            assert!(keys.contains(key), "{key}");
        }
    }
}
