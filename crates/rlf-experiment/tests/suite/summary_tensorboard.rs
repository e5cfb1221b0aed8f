//! Our TensorBoard event files read back by TensorBoard's own reader (`EventFileLoader`, which checks both CRCs of
//! every record) in the project venv. `tests/setup_tensorboard.sh` creates the venv if needed and installs the pinned
//! `tensorboard`; if Python or TensorBoard cannot be set up, the test fails. A plain test function, which fails by
//! panicking as under the standard harness.

use libtest_mimic::Trial;
use rlf_experiment::{read_scalars, SummaryWriter};
use std::path::{Path, PathBuf};
use std::process::Command;

const READER: &str = r#"
import json, sys
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util

events = list(EventFileLoader(sys.argv[1]).Load())
scalars = []
for ev in events:
    for v in ev.summary.value:
        value = v.simple_value if v.HasField("simple_value") else float(tensor_util.make_ndarray(v.tensor))
        scalars.append([v.tag, ev.step, value])
print(json.dumps({
    "file_version": events[0].file_version,
    "wall_times": [ev.wall_time for ev in events],
    "scalars": scalars,
}))
"#;

fn venv_python() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/setup_tensorboard.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({}):\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("setup_tensorboard.sh printed no python path")
            .trim(),
    )
}

fn tensorboard_reads_our_event_files() {
    let python = venv_python();
    let dir = tempfile::tempdir().unwrap();
    let mut writer = SummaryWriter::create(dir.path().join(".summary/0")).unwrap();
    let mut expected = Vec::new();
    for i in 0..500i64 {
        let step = i * 1024 + (i % 3);
        for (tag, value) in [
            ("reward/mean", i as f32 * 0.5 - 3.25),
            ("loss/policy", 1.0 / (i as f32 + 1.0)),
            ("perf/fps", 1.0e6 + i as f32),
        ] {
            writer.add_scalar(tag, value, step).unwrap();
            expected.push((tag.to_string(), step, value));
        }
    }
    writer
        .add_scalar("edge/big_step", f32::MIN_POSITIVE, i64::MAX)
        .unwrap();
    writer.add_scalar("edge/negative", -f32::MAX, -5).unwrap();
    expected.push(("edge/big_step".into(), i64::MAX, f32::MIN_POSITIVE));
    expected.push(("edge/negative".into(), -5, -f32::MAX));
    writer.flush().unwrap();

    assert_eq!(read_scalars(writer.path()).unwrap(), expected, "our reader");

    let out = Command::new(&python)
        .args(["-c", READER])
        .arg(writer.path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "TensorBoard's reader failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("reader output is JSON");
    assert_eq!(got["file_version"], "brain.Event:2");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let walls = got["wall_times"].as_array().unwrap();
    assert_eq!(walls.len(), expected.len() + 1);
    assert!(
        walls.iter().all(|w| (now - w.as_f64().unwrap()).abs() < 600.0),
        "wall times"
    );
    let scalars: Vec<(String, i64, f32)> = got["scalars"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s[0].as_str().unwrap().to_string(),
                s[1].as_i64().unwrap(),
                s[2].as_f64().unwrap() as f32,
            )
        })
        .collect();
    assert_eq!(scalars, expected, "TensorBoard's reader");
}

/// This module's test, named as the standard harness names it.
pub fn trials() -> Vec<Trial> {
    vec![Trial::test(
        "summary_tensorboard::tensorboard_reads_our_event_files",
        || {
            tensorboard_reads_our_event_files();
            Ok(())
        },
    )]
}
