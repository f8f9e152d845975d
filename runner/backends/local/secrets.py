"""A --local run's secrets: read on this machine as the job starts, and handed to it as the spec asks.

Values come from this shell's environment (env:NAME), a file (file:PATH) or Secret Manager with your own
credentials, and live only in memory and in the job's environment, or, for `as: file`, in a file on a memory file
system ($XDG_RUNTIME_DIR or /dev/shm, whichever is tmpfs), mode 0600, owner the user who runs the job (a
container runs as that user: container.local_flags), mounted read-only at the same path in a container. The file
goes when the run is torn down.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from runner.errors import PlanError
from runner.plan.planner import Plan, PlannedSecret

_MEMORY_FILE_SYSTEMS = {"tmpfs", "ramfs"}


def value(planned: PlannedSecret) -> bytes:
    """The secret's bytes, read where the reference says (PlanError, exit 2, when it cannot be)."""
    ref = planned.ref
    if ref.kind == "env":
        data = os.fsencode(os.environ.get(ref.local, ""))
        if not data:
            raise PlanError(f"secrets.{planned.name}: ${ref.local} is not set (or empty) in this shell")
        return data
    if ref.kind == "file":
        path = Path(planned.source.removeprefix("file:"))
        try:
            return path.read_bytes()
        except OSError as exc:
            raise PlanError(f"secrets.{planned.name}: {path} cannot be read ({exc.strerror})") from None
    from runner.backends import secretmanager

    return secretmanager.access(planned)


def env_value(planned: PlannedSecret, data: bytes) -> str:
    """The value as an environment variable holds it: one line (a final line break dropped, as `$(cat FILE)`
    would), the same rule the TPU VM's bootstrap applies."""
    text = data[:-1] if data.endswith(b"\n") else data
    if b"\n" in text or b"\0" in text:
        raise PlanError(
            f"secrets.{planned.name}: it holds a line break or a NUL, which an environment variable cannot",
            hint=f"give it to the job as a file: `{planned.name}: {{ref: {planned.ref.text}, as: file}}`",
        )
    return os.fsdecode(text)


def _file_system(path: Path) -> str | None:
    """The type of the file system `path` is on (Linux /proc/mounts), or None where that cannot be told."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    resolved = str(path.resolve())
    found = [
        (point, kind) for point, kind in mounts if resolved == point or resolved.startswith(point.rstrip("/") + "/")
    ]
    return max(found, key=lambda m: len(m[0]))[1] if found else None


def secrets_dir(run_id: str) -> Path:
    """This run's folder on a memory file system, made private to this user (PlanError when there is none)."""
    for base in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm"):
        if base and Path(base).is_dir() and _file_system(Path(base)) in _MEMORY_FILE_SYSTEMS:
            user = Path(base) / f"tpu-runner-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
            user.mkdir(mode=0o700, exist_ok=True)
            user.chmod(0o700)
            folder = user / run_id
            folder.mkdir(mode=0o700, exist_ok=True)
            return folder
    raise PlanError(
        "a secret `as: file` needs a memory file system (tmpfs) to keep it in, and neither $XDG_RUNTIME_DIR nor "
        "/dev/shm is one here",
        hint="give the secret `as: env`, or run where /dev/shm is a tmpfs",
    )


def hand_over(plan: Plan) -> tuple[dict[str, str], list[Path], Path | None]:
    """(the job's secret variables, the files to mount, the folder that holds them) for `plan`'s secrets."""
    env: dict[str, str] = {}
    files: list[Path] = []
    folder: Path | None = None
    for planned in plan.secrets:
        data = value(planned)
        if planned.mode == "env":
            env[planned.name] = env_value(planned, data)
            continue
        folder = folder or secrets_dir(plan.run_id)
        path = folder / planned.name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        env[planned.name] = str(path)
        files.append(path)
    return env, files, folder


def forget(folder: str | None) -> None:
    """Remove a run's secret files (teardown)."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
