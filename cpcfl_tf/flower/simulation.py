"""One run under Flower's Simulation Engine, ``flwr run . local``, as a Flower user starts
one: virtual SuperNodes in one process tree, on a managed local SuperLink of the run's
own (:func:`simulation_command`, :func:`simulate`). The federation of real processes is
:mod:`cpcfl_tf.flower.loopback`'s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from cpcfl_tf.errors import UserError
from cpcfl_tf.flower.loopback import APP_DIR, command_path, free_port, run_config_line


def simulation_command(
    run_config: dict[str, Any], supernodes: int, home: Path, *, env: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """``flwr run . local`` for one run of ``supernodes`` virtual SuperNodes under Flower's
    Simulation Engine, the way a Flower user starts one, and the environment to run it in:
    the Flower home ``home``, whose local connection sets ``options.num-supernodes``, and
    the kit's dependencies as installed here (no per-run dependency installation), and a
    free port of its own for the managed local SuperLink it starts. (On Flower's fixed
    port, 39091, ``flwr run`` hands the run to any SuperLink already answering there: one
    another run started, with that run's environment, or a Deployment process that
    happened to get the port.) That SuperLink outlives the command:
    :func:`stop_local_superlink`."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n\n[superlink.local]\n'
        f"options.num-supernodes = {int(supernodes)}\n"
    )
    env = dict(
        os.environ if env is None else env,
        FLWR_HOME=str(home),
        PYTHONUNBUFFERED="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
    )
    return [
        command_path("flwr"),
        "run",
        str(APP_DIR),
        "local",
        "--run-config",
        run_config_line(run_config),
        "--stream",
    ], env


def simulate(
    run_config: dict[str, Any],
    supernodes: int,
    workdir: str | Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 900.0,
) -> dict:
    """One run under the Simulation Engine (:func:`simulation_command`); returns the run
    record (``run_config["out"]``). The local SuperLink is stopped at the end."""
    workdir = Path(workdir).resolve()
    home = workdir / "flwr-home"
    command, env = simulation_command(run_config, supernodes, home, env=env)
    out = Path(run_config["out"])
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
        (workdir / "flwr-run.log").write_text(proc.stdout + proc.stderr)
    finally:
        stop_local_superlink(home)
    if not out.exists():
        raise UserError(f"the simulation wrote no result; its log: {workdir / 'flwr-run.log'}")
    check_own_superlink(home, env, workdir / "flwr-run.log")
    return json.loads(out.read_text())


def check_own_superlink(home: Path, env: dict[str, str], log: Path) -> None:
    """Refuse a finished run that the managed local SuperLink of ``home`` (started by the
    :func:`simulation_command` that gave ``env``) did not make: another SuperLink took the
    port before it, and ``flwr run`` handed the run to that one."""
    started = home / "local-superlink" / "superlink.log"  # where Flower's managed one logs
    if "Created run" not in (started.read_text() if started.exists() else ""):
        raise UserError(
            f"the run went to a SuperLink this call did not start (port "
            f"{env['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']} was taken meanwhile); "
            f"run it again. Its log: {log}"
        )


def stop_local_superlink(home: Path) -> None:
    """Kill the SuperLink ``flwr run`` started for ``home`` (it outlives the command)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "flower-superlink" in command and str(home) in command:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
