"""Running the `rlfactory` binary from Python: where it is, the environment it gets, and one run of it.

The runner keeps its guarantees (worker heartbeats, a clean stop on SIGINT/SIGTERM, no shared memory left behind)
in a process of its own: the Python process starts it, streams its output into `sys.stdout` and `sys.stderr` (where
a notebook shows it), waits on it without holding the GIL, and on a KeyboardInterrupt (Ctrl-C, a notebook's
interrupt) sends it SIGINT and waits for its checkpoint. The run is in a process group of its own, so a terminal's
Ctrl-C reaches it once, through this process; if this process dies, the run gets SIGTERM (and saves its checkpoint).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, List, Optional


class RlfactoryError(RuntimeError):
    """A run that failed: the binary's one-line error (`error: ...`), without its prefix."""


class ConfigError(RlfactoryError, ValueError):
    """A flag, file or env that the binary refused before starting (its exit code 2)."""


def binary() -> str:
    """The `rlfactory` binary installed with this package (or the one `RLFACTORY_BINARY` names)."""
    override = os.environ.get("RLFACTORY_BINARY")
    if override:
        return override
    try:
        files = importlib.metadata.distribution("rlfactory").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "rlfactory" and f.parent.name == "bin":
            return str(Path(f.locate()).resolve())
    found = shutil.which("rlfactory")
    if found is None:
        raise RlfactoryError(
            "the rlfactory binary is not installed beside this module: run `pip install .` in a clone of the "
            "repository, or set RLFACTORY_BINARY to a built binary"
        )
    return found


def torch_lib_dir() -> Optional[str]:
    """The `lib` folder of this environment's torch package (found without importing torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    lib = os.path.join(os.path.dirname(spec.origin), "lib")
    return lib if os.path.isdir(lib) else None


def child_environment() -> dict:
    """The binary's environment: this interpreter's `sys.path` (so the envs it embeds import what this process
    imports, the user's script folder included), its venv, the torch libraries, and this process's id."""
    env = dict(os.environ)
    paths = [p if p else os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    lib = torch_lib_dir()
    if lib is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [lib, env.get("LD_LIBRARY_PATH")]))
    env["RLFACTORY_PARENT_PID"] = str(os.getpid())
    return env


def _pump(source: IO[bytes], sink: IO[str], errors: List[str]) -> None:
    """Copies the binary's lines to `sink` as they come, keeping its `error:` lines."""
    for raw in iter(source.readline, b""):
        line = raw.decode("utf-8", errors="replace")
        if line.startswith("error: "):
            errors.append(line[len("error: "):].strip())
        sink.write(line)
        sink.flush()
    source.close()


def run(args: List[str]) -> int:
    """Runs `rlfactory <args>` to its end; returns its exit code, raises `ConfigError` (exit code 2) or
    `RlfactoryError` (exit code 1) with its error line, and re-raises a KeyboardInterrupt once the run has stopped."""
    proc = subprocess.Popen(
        [binary(), *args],
        env=child_environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    errors: List[str] = []
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, errors), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, sys.stderr, errors), daemon=True),
    ]
    # The pumps start with SIGINT blocked (a thread inherits its creator's mask), so that a Ctrl-C is never taken by
    # one of them: Python runs its handler in the main thread, whose wait below only returns early when the signal
    # interrupts it.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for p in pumps:
            p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            proc.wait()
        for p in pumps:
            p.join()
        raise
    for p in pumps:
        p.join()
    message = errors[-1] if errors else f"rlfactory {args[0]} exited with code {code}"
    if code == 2:
        raise ConfigError(message)
    if code == 1:
        raise RlfactoryError(message)
    return code
