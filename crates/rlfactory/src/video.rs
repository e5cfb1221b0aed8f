//! Videos of a trained policy (`enjoy --save_video`): env 0's pictures ([`rlf_env::Env::render`]) after its reset
//! and after every step, encoded as MP4 (H.264, yuv420p, which browsers play) by an `ffmpeg` process reading raw RGB
//! frames from a pipe.
//!
//! `ffmpeg` is, in order: the one `IMAGEIO_FFMPEG_EXE` names (imageio's variable), `ffmpeg` on `PATH`, the one the
//! active Python's `imageio-ffmpeg` package ships (`$VIRTUAL_ENV/bin/python`, else `python3`), or the one of the
//! `.venv` of the clone the binary was built in (`scripts/setup_python.sh` installs it there), so that a new shell
//! in the clone needs no venv activated.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::env::{Envs, Frame};
use crate::error::{Result, RlfError};

/// How to get an `ffmpeg` when none is found.
const NO_FFMPEG: &str =
    "--save_video needs ffmpeg: install it (apt install ffmpeg), or imageio-ffmpeg in the active \
                         Python environment (pip install imageio-ffmpeg), or set IMAGEIO_FFMPEG_EXE to one";

fn video_error(message: String) -> RlfError {
    RlfError::Config(format!("--save_video: {message}"))
}

/// The `ffmpeg` to encode with (see the module doc).
fn find_ffmpeg() -> Result<PathBuf> {
    if let Some(exe) = std::env::var_os("IMAGEIO_FFMPEG_EXE") {
        return Ok(PathBuf::from(exe));
    }
    let runs = |exe: &Path| {
        Command::new(exe)
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if runs(Path::new("ffmpeg")) {
        return Ok(PathBuf::from("ffmpeg"));
    }
    let active = match std::env::var_os("VIRTUAL_ENV") {
        Some(venv) => PathBuf::from(venv).join("bin/python"),
        None => PathBuf::from("python3"),
    };
    let clone = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    [active, clone]
        .into_iter()
        .find_map(|python| {
            let out = Command::new(python)
                .args([
                    "-c",
                    "import imageio_ffmpeg; print(imageio_ffmpeg.get_ffmpeg_exe())",
                ])
                .stderr(Stdio::null())
                .output()
                .ok()
                .filter(|out| out.status.success())?;
            let exe = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            runs(&exe).then_some(exe)
        })
        .ok_or_else(|| RlfError::Config(NO_FFMPEG.into()))
}

/// An `ffmpeg` process encoding frames of one size into an MP4 file.
struct Encoder {
    child: Child,
    stdin: ChildStdin,
    width: usize,
    height: usize,
}

impl Encoder {
    fn start(path: &Path, width: usize, height: usize, fps: f64) -> Result<Self> {
        let ffmpeg = find_ffmpeg()?;
        let mut child = Command::new(&ffmpeg)
            .args([
                "-hide_banner",
                "-loglevel",
                "error",
                "-y",
                "-f",
                "rawvideo",
                "-pix_fmt",
                "rgb24",
            ])
            .args([
                "-s",
                &format!("{width}x{height}"),
                "-r",
                &fps.to_string(),
                "-i",
                "-",
            ])
            // yuv420p needs even sides.
            .args([
                "-vf",
                "pad=ceil(iw/2)*2:ceil(ih/2)*2",
                "-c:v",
                "libx264",
                "-pix_fmt",
                "yuv420p",
            ])
            .args(["-movflags", "+faststart"])
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| video_error(format!("cannot run {}: {e}", ffmpeg.display())))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| video_error("ffmpeg has no input pipe".into()))?;
        Ok(Self {
            child,
            stdin,
            width,
            height,
        })
    }

    /// Ends the input, waits for ffmpeg and says why it failed if it did.
    fn finish(self) -> Result<()> {
        let Self { mut child, stdin, .. } = self;
        drop(stdin);
        let mut stderr = String::new();
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut stderr);
        }
        let status = child
            .wait()
            .map_err(|e| video_error(format!("waiting for ffmpeg: {e}")))?;
        if status.success() {
            return Ok(());
        }
        let last = stderr.lines().last().unwrap_or("no message");
        Err(video_error(format!("ffmpeg failed ({status}): {last}")))
    }
}

/// The video of one `enjoy`: frames captured until `max_frames`, then written on [`finish`](Self::finish).
pub struct Recorder {
    path: PathBuf,
    fps: f64,
    max_frames: u64,
    frames: u64,
    env: String,
    encoder: Option<Encoder>,
}

impl Recorder {
    /// A recorder of at most `max_frames` frames of env `env` at `fps` into `path`.
    pub fn new(path: PathBuf, fps: f64, max_frames: u64, env: &str) -> Result<Self> {
        if !(fps.is_finite() && fps > 0.0) {
            return Err(video_error(format!("--fps must be a positive number, got {fps}")));
        }
        Ok(Self {
            path,
            fps,
            max_frames,
            frames: 0,
            env: env.to_owned(),
            encoder: None,
        })
    }

    /// Adds env 0's current picture (until the video holds `max_frames`).
    pub fn capture(&mut self, envs: &mut Envs) -> Result<()> {
        if self.frames >= self.max_frames {
            return Ok(());
        }
        let frame: Frame = envs
            .render(0)?
            .ok_or_else(|| video_error(format!("{} draws no picture", self.env)))?;
        let encoder = match &mut self.encoder {
            Some(encoder) => encoder,
            None => self
                .encoder
                .insert(Encoder::start(&self.path, frame.width, frame.height, self.fps)?),
        };
        if (frame.width, frame.height) != (encoder.width, encoder.height) {
            return Err(video_error(format!(
                "{} drew a {}x{} picture after {}x{} ones",
                self.env, frame.width, frame.height, encoder.width, encoder.height
            )));
        }
        if let Err(e) = encoder.stdin.write_all(&frame.rgb) {
            let failed = self.encoder.take().map(Encoder::finish);
            return Err(match failed {
                Some(Err(why)) => why,
                _ => video_error(format!("writing to ffmpeg: {e}")),
            });
        }
        self.frames += 1;
        Ok(())
    }

    /// Finishes the file; returns its path and the frames it holds.
    pub fn finish(self) -> Result<(PathBuf, u64)> {
        if let Some(encoder) = self.encoder {
            encoder.finish()?;
        }
        Ok((self.path, self.frames))
    }
}
