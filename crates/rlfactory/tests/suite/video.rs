//! `enjoy --save_video`: an MP4 (H.264) of the episodes in the experiment folder, decoded back by ffmpeg (the one
//! the test venv's imageio-ffmpeg ships) to count its frames and read their size.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{self, run, text};

/// The ffmpeg of the active Python environment's imageio-ffmpeg (`scripts/setup_python.sh` installs it).
fn ffmpeg() -> PathBuf {
    let venv = std::env::var("VIRTUAL_ENV").expect("the tests run with the venv of scripts/setup_python.sh");
    let out = Command::new(Path::new(&venv).join("bin/python"))
        .args([
            "-c",
            "import imageio_ffmpeg; print(imageio_ffmpeg.get_ffmpeg_exe())",
        ])
        .output()
        .expect("run python");
    assert!(out.status.success(), "{}", text(&out.stderr));
    PathBuf::from(text(&out.stdout).trim())
}

/// The frames of `video` decoded to RGB, and their width and height (read from ffmpeg's description of the stream).
fn decode(video: &Path) -> (usize, usize, usize) {
    let out = Command::new(ffmpeg())
        .args(["-hide_banner", "-i"])
        .arg(video)
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .output()
        .expect("run ffmpeg");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let described = text(&out.stderr);
    let stream = described
        .lines()
        .find(|l| l.contains("Video: h264"))
        .unwrap_or_else(|| panic!("no H.264 stream in {described}"));
    let size = stream
        .split([',', ' '])
        .find_map(|w| {
            let (w, h) = w.split_once('x')?;
            Some((w.parse::<usize>().ok()?, h.parse::<usize>().ok()?))
        })
        .unwrap_or_else(|| panic!("no size in {stream}"));
    assert!(stream.contains("yuv420p"), "{stream}");
    let bytes = out.stdout.len();
    assert_eq!(
        bytes % (size.0 * size.1 * 3),
        0,
        "{bytes} bytes of {size:?} frames"
    );
    (bytes / (size.0 * size.1 * 3), size.0, size.1)
}

fn train(train_dir: &str, env: &str, flags: &[&str]) {
    let mut args = vec![
        "train",
        "--env",
        env,
        "--train_dir",
        train_dir,
        "--experiment",
        "v",
    ];
    args.extend_from_slice(flags);
    let out = run(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `rlfactory enjoy --env <env> --save_video` of experiment `v` in `train_dir`, with `flags`; must succeed.
fn enjoy_with_video(train_dir: &str, env: &str, flags: &[&str]) -> std::process::Output {
    let mut args = vec![
        "enjoy",
        "--env",
        env,
        "--train_dir",
        train_dir,
        "--experiment",
        "v",
        "--save_video",
    ];
    args.extend_from_slice(flags);
    let out = run(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    out
}

#[test]
fn enjoy_saves_a_video_of_native_cartpole_drawn_as_gymnasium_draws_it() {
    let dir = common::temp_dir("video");
    let train_dir = dir.path().to_str().unwrap();
    train(
        train_dir,
        "CartPole-v1",
        &["--train_for_env_steps", "5000", "--serial_mode"],
    );
    let out = enjoy_with_video(train_dir, "CartPole-v1", &["--max_num_episodes", "2"]);
    let steps: usize = text(&out.stdout)
        .lines()
        .filter_map(|l| l.split("length ").nth(1)?.trim().parse::<usize>().ok())
        .sum();
    let video = dir.path().join("v/replay.mp4");
    assert!(text(&out.stderr).contains(&format!("wrote {} ({} frames)", video.display(), steps + 1)));
    // The reset's picture, then one after every step.
    assert_eq!(decode(&video), (steps + 1, 600, 400));

    enjoy_with_video(
        train_dir,
        "CartPole-v1",
        &["--video_frames", "7", "--video_name", "short.mp4"],
    );
    assert_eq!(decode(&dir.path().join("v/short.mp4")), (7, 600, 400));

    let out = Command::new(common::BIN)
        .args([
            "enjoy",
            "--env",
            "CartPole-v1",
            "--train_dir",
            train_dir,
            "--experiment",
            "v",
            "--save_video",
        ])
        .env("IMAGEIO_FFMPEG_EXE", "/no/such/ffmpeg")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        errors.len() == 1 && errors[0].contains("--save_video: cannot run /no/such/ffmpeg"),
        "{stderr}"
    );
}

#[cfg(feature = "python")]
#[test]
fn enjoy_saves_a_video_of_atari_screens() {
    let dir = common::temp_dir("video-atari");
    let train_dir = dir.path().to_str().unwrap();
    train(
        train_dir,
        "atari_pong",
        &[
            "--train_for_env_steps",
            "1024",
            "--num_workers",
            "1",
            "--num_envs_per_worker",
            "2",
        ],
    );
    // The reset's screen and 39 steps' make the video's 40 frames; the game stops there, long before Pong's end.
    let out = enjoy_with_video(
        train_dir,
        "atari_pong",
        &["--max_num_frames", "39", "--video_frames", "40"],
    );
    assert_eq!(decode(&dir.path().join("v/replay.mp4")), (40, 160, 210));
    assert!(
        text(&out.stdout).contains("no episode ended within --max_num_frames"),
        "{}",
        text(&out.stdout)
    );
}
