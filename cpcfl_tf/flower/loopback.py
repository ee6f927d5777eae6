"""A Flower federation as real processes on 127.0.0.1: one ``flower-superlink``, K
``flower-supernode``s (partition-id 0..K-1, or each with a data folder of its own,
``--data``) and ``flwr run`` of the app (the repository
root, whose pyproject.toml holds ``[tool.flwr.app]``) against them (the Deployment Engine,
not the Simulation one).

Without credentials everything is insecure (no TLS, no node authentication), acceptable
on 127.0.0.1 only; with :class:`~cpcfl_tf.flower.credentials.Credentials` (``--secure``)
the federation is the one docs/flower.md deploys across machines: TLS on the SuperLink
(its certificate signed by the credentials' CA, which every SuperNode and ``flwr``
checks) and SuperNode authentication (only nodes whose public key was registered with
``flwr supernode register`` may join). Every process is started by :class:`LoopbackFederation`
and stopped by it, by pid.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpcfl_tf.errors import UserError
from cpcfl_tf.flower.credentials import Credentials
from cpcfl_tf.methods.federated import METHODS, PRETRAINED

APP_DIR = Path(__file__).resolve().parents[2]
"""The Flower App: the repository root (a clone with the kit installed from it)."""
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def command_path(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UserError(f'{name} not found; install the Flower extra: pip install -e ".[flower]"')
    return path


def run_config_line(run_config: dict[str, Any]) -> str:
    """``run_config`` as ``flwr run --run-config`` takes it (each value JSON-quoted)."""
    return " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())


@dataclasses.dataclass
class LoopbackFederation:
    """A SuperLink and its SuperNodes, each a process with a log file in ``workdir``."""

    workdir: Path
    port: int
    superlink: subprocess.Popen
    supernodes: list[subprocess.Popen]
    env: dict[str, str]
    credentials: Credentials | None = None

    @classmethod
    def start(
        cls,
        nodes: int | Sequence[str],
        workdir: str | Path,
        *,
        env: dict[str, str] | None = None,
        credentials: Credentials | None = None,
        unregistered: Sequence[int] = (),
        without_ca: Sequence[int] = (),
    ) -> LoopbackFederation:
        """``nodes`` SuperNodes with partition ids 0..nodes-1, or one per node config
        given (e.g. ``data-path="/data/site3"``, a TOML string). With ``credentials``,
        secured: SuperNode k uses the credentials' ``node-k.key`` and CA, and its public
        key is registered before it starts, except the nodes in ``unregistered``; the
        nodes in ``without_ca`` are not given the CA (to rehearse the nodes a secured
        SuperLink must refuse: :meth:`refused` then says why each did not join)."""
        configs = (
            [f"partition-id={k} num-partitions={nodes}" for k in range(nodes)]
            if isinstance(nodes, int)
            else list(nodes)
        )
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ if env is None else env,
            FLWR_HOME=str(workdir / "flwr-home"),
            PYTHONUNBUFFERED="1",
        )
        port = free_port()
        security = ["--insecure"] if credentials is None else credentials.superlink_flags()
        superlink = _spawn(
            [
                command_path("flower-superlink"),
                *security,
                "--host",
                HOST,
                "--port",
                str(port),
                "--disable-runtime-dependency-installation",
                "--database",
                str(workdir / "superlink.db"),
            ],
            workdir / "superlink.log",
            env,
        )
        fed = cls(workdir, port, superlink, [], env, credentials)
        try:
            fed._wait_for_port()
            fed._write_connection()
            for k, node_config in enumerate(configs):
                if credentials is None:
                    security = ["--insecure"]
                else:
                    security = credentials.supernode_flags(k, ca=k not in without_ca)
                    if k not in unregistered:
                        fed._register(k)
                fed.supernodes.append(
                    _spawn(
                        [
                            command_path("flower-supernode"),
                            *security,
                            "--superlink",
                            f"{HOST}:{port}",
                            "--host",
                            HOST,
                            "--port",
                            str(free_port()),
                            "--node-config",
                            node_config,
                        ],
                        workdir / f"supernode-{k}.log",
                        env,
                    )
                )
        except BaseException:
            fed.stop()
            raise
        return fed

    def _register(self, k: int) -> None:
        """``flwr supernode register`` SuperNode ``k``'s public key with the SuperLink."""
        if self.credentials is None:
            raise ValueError("an insecure federation registers no keys")
        key = self.credentials.node_public_key(k)
        proc = subprocess.run(
            [
                command_path("flwr"),
                "supernode",
                "register",
                str(key),
                "loopback",
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
        )
        if proc.returncode != 0 or '"success": true' not in proc.stdout:
            raise UserError(
                f"flwr supernode register {key} "
                f"failed: {(proc.stdout + proc.stderr).strip()[-300:]}"
            )

    def refused(self) -> dict[int, str]:
        """SuperNode index -> why it could not join, for each SuperNode whose process
        ended because the SuperLink could not be reached or refused it (its log's
        reason: a TLS handshake that failed, a key the SuperLink does not know)."""
        reasons = {}
        for k, proc in enumerate(self.supernodes):
            if proc.poll() is None:
                continue
            lines = (self.workdir / f"supernode-{k}.log").read_text(errors="replace").splitlines()
            for i, line in enumerate(lines):
                if "Failed to initialize the connection to the SuperLink" in line:
                    reasons[k] = lines[i + 1].strip() if i + 1 < len(lines) else line.strip()
                    break
        return reasons

    def _wait_for_port(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.superlink.poll() is not None:
                raise UserError(f"flower-superlink exited ({self.workdir / 'superlink.log'})")
            try:
                socket.create_connection((HOST, self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.5)
        raise UserError(f"flower-superlink did not open {HOST}:{self.port} in {timeout:.0f} s")

    def _write_connection(self) -> None:
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        security = (
            "insecure = true"
            if self.credentials is None
            else f'root-certificates = "{self.credentials.ca.resolve()}"'
        )
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
            f'address = "{HOST}:{self.port}"\n{security}\n'
        )

    def run(self, run_config: dict[str, Any]) -> str:
        """``flwr run`` the app with ``run_config`` overrides; returns the run's id."""
        proc = subprocess.run(
            [
                command_path("flwr"),
                "run",
                str(APP_DIR),
                "loopback",
                "--run-config",
                run_config_line(run_config),
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=300,
        )
        (self.workdir / "flwr-run.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise UserError(
                f"flwr run failed ({self.workdir / 'flwr-run.log'}): "
                f"{(proc.stdout + proc.stderr).strip().splitlines()[-1:]}"
            )
        return str(json.loads(proc.stdout).get("run-id", ""))

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess | None:
        """``flwr ARGS`` against this federation's SuperLink; None when it gave nothing
        in ``timeout`` seconds."""
        try:
            return subprocess.run(
                [command_path("flwr"), *args],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return None

    def server_log(self, run_id: str) -> str | None:
        """The ServerApp's log of run ``run_id`` so far (``flwr log --show``)."""
        proc = self.flwr("log", str(run_id), "loopback", "--show")
        return None if proc is None else proc.stdout + proc.stderr

    def server_lines(
        self, run_id: str, until: str | None = None, timeout: float = 60.0
    ) -> list[str]:
        """The ServerApp's ``[cpcfl]`` lines of run ``run_id`` so far: rounds, replies,
        and each failed node's reason. The ServerApp uploads its log every few seconds
        from a thread, so its last lines can reach the SuperLink after its result file:
        with ``until``, ask again (up to ``timeout`` seconds) until a line contains it."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.server_log(run_id)
            if log is None:  # a diagnostic: never the reason a check fails
                return [f"(flwr log {run_id} gave nothing in 120 s)"]
            lines = [
                line[line.index("[cpcfl]") :] for line in log.splitlines() if "[cpcfl]" in line
            ]
            if until is None or any(until in line for line in lines) or time.monotonic() > deadline:
                return lines
            time.sleep(2.0)

    def status(self, run_id: str) -> str:
        """Run ``run_id``'s status as ``flwr ls`` gives it (``running``,
        ``finished:completed``, ``finished:failed`` ...); "" when the SuperLink does not
        say (a diagnostic: never a reason to stop waiting)."""
        proc = self.flwr("ls", "loopback", "--run-id", str(run_id), "--format", "json")
        return "" if proc is None else run_status(proc.stdout)

    def failure(self, run_id: str) -> str:
        """The ServerApp's error of run ``run_id`` (its traceback's last line), or its
        log's last line."""
        log = self.server_log(run_id)
        return f"flwr log {run_id} gave nothing in 120 s" if log is None else error_line(log)

    def kill_supernode(self, index: int) -> None:
        """Kill SuperNode ``index`` and its ClientApp processes (its process group)."""
        _kill(self.supernodes[index])

    def stop(self) -> None:
        for proc in [*self.supernodes, self.superlink]:
            _kill(proc)

    def __enter__(self) -> LoopbackFederation:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _spawn(command: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    # Own process group: stopping a SuperNode also stops the ClientApp it spawned.
    with open(log, "wb") as fh:
        return subprocess.Popen(
            list(command), stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def run_status(ls_json: str) -> str:
    """The status in ``flwr ls --run-id X --format json``'s output ("" if none)."""
    try:
        runs = json.loads(ls_json).get("runs") or [{}]
    except (ValueError, AttributeError):
        return ""
    return str(runs[0].get("status", ""))


def error_line(log: str) -> str:
    """What a ServerApp's log says went wrong: its last ``SomeError: why`` line, the
    exception's module left off; else the log's last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    raised = [m for m in map(ERROR.match, lines) if m]
    if raised:
        return f"{raised[-1]['name']}: {raised[-1]['why']}"
    return lines[-1] if lines else "its log is empty"


ERROR = re.compile(r"^(?:\w+\.)*(?P<name>\w*(?:Error|Exception|Exit)): (?P<why>.*)$")
"""A traceback's last line, e.g. ``cpcfl_tf.errors.UserError: why``."""


STATUS_EVERY = 10.0
"""Seconds between two questions to the SuperLink of whether the run ended."""


def wait_for_file(
    path: Path, federation: LoopbackFederation, timeout: float, run_id: str | None = None
) -> dict:
    """The JSON the ServerApp writes at the end of the run: an error if it never comes,
    or (given ``run_id``) as soon as the SuperLink says the run ended without it,
    naming the ServerApp's error."""
    deadline = time.monotonic() + timeout
    asked = time.monotonic()
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if federation.superlink.poll() is not None:
            raise UserError(f"flower-superlink exited ({federation.workdir / 'superlink.log'})")
        if run_id is not None and time.monotonic() - asked >= STATUS_EVERY:
            asked = time.monotonic()
            if federation.status(run_id).startswith("finished") and not path.exists():
                raise UserError(
                    f"the ServerApp ended without a result: {federation.failure(run_id)} "
                    f"(flwr log {run_id}; logs in {federation.workdir})"
                )
        time.sleep(1.0)
    raise UserError(
        f"the federation wrote no result in {timeout:.0f} s; logs in {federation.workdir}"
    )


NAMED = {
    "federated.method": "--method",
    "federated.pretraining": "--pretraining",
    "federated.num_clusters": "--num-clusters",
    "federated.rounds": "--rounds",
    "federated.head_rounds": "--head-rounds",
    "partition.num_clients": "--nodes",
}
"""The settings the launcher's own options give (``--set`` of one is refused)."""


def refuse_named(items: list[str]) -> None:
    """Refuse, in one line, a ``--set`` of a setting one of the launcher's options gives:
    two values for one setting, one of them silently not used."""
    for item in items:
        key = item.partition("=")[0].strip()
        if key in NAMED:
            raise UserError(
                f"--set {item}: the launcher sets {key} from {NAMED[key]}; use {NAMED[key]} instead"
            )


def _given_credentials(folder: Path, nodes: int) -> Credentials:
    """The credentials in ``folder``, refused in one line if any file a federation of
    ``nodes`` SuperNodes needs is missing."""
    creds = Credentials(folder)
    missing = [p.name for p in creds.files(nodes) if not p.exists()]
    if missing:
        raise UserError(
            f"--credentials {folder} lacks {', '.join(missing)}: make them with "
            f"python -m cpcfl_tf.flower.credentials --out NEW_DIR --nodes {nodes}"
        )
    return creds


def main(argv: Sequence[str] | None = None) -> None:
    from cpcfl_tf.errors import ArgumentParser
    from cpcfl_tf.flower.common import DEFAULTS, run_config
    from cpcfl_tf.flower.credentials import make as make_credentials
    from cpcfl_tf.plan.resolve import resolve
    from cpcfl_tf.records.files import prepare_out_dir

    parser = ArgumentParser(
        prog="python -m cpcfl_tf.flower.loopback",
        description="Run CP-CFL as a Flower federation of real processes "
        "on 127.0.0.1 (1 SuperLink, K SuperNodes).",
    )
    parser.add_argument("--nodes", type=int, default=3, help="SuperNodes = clients (default 3)")
    parser.add_argument(
        "--data",
        type=Path,
        metavar="DIR",
        help="one SuperNode per subfolder of DIR, each with that folder as its "
        "own data (tools/export_partition.py writes such folders); "
        "replaces --nodes",
    )
    parser.add_argument("--preset", default="smoke", help="data and model preset (default smoke)")
    parser.add_argument(
        "--method", default="cp-cfl", choices=[m for m in METHODS if METHODS[m].on_flower]
    )
    parser.add_argument("--pretraining", default="simclr", choices=["none", *PRETRAINED])
    parser.add_argument("--num-clusters", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--head-rounds", type=int, default=1, help="Tc (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--round-timeout", type=float, default=DEFAULTS["round-timeout"])
    parser.add_argument(
        "--out", help="folder for the result and the logs (default results/<preset>/flower)"
    )
    secured = parser.add_mutually_exclusive_group()
    secured.add_argument(
        "--secure",
        action="store_true",
        help="TLS and SuperNode authentication, as a deployment across "
        "machines: new credentials for this run (a CA, the SuperLink's "
        "certificate, a key pair per node), removed afterwards",
    )
    secured.add_argument(
        "--credentials",
        type=Path,
        metavar="DIR",
        help="secured with the credentials in DIR (made by python -m "
        "cpcfl_tf.flower.credentials --out DIR --nodes K)",
    )
    parser.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="any other setting, as the scripts' --set (e.g. federated.local_epochs=1)",
    )
    args = parser.parse_args(argv)
    refuse_named(args.set)
    nodes: int | list[str] = args.nodes
    settings = {
        "preset": args.preset,
        "method": args.method,
        "pretraining": args.pretraining,
        "num-clusters": args.num_clusters,
        "rounds": args.rounds,
        "head-rounds": args.head_rounds,
        "num-clients": args.nodes,
        "seed": args.seed,
        "round-timeout": args.round_timeout,
        "set": shlex.join(args.set),
    }
    if args.data is not None:
        folders = sorted(p for p in args.data.iterdir() if p.is_dir()) if args.data.is_dir() else []
        if not folders:
            raise UserError(
                f"no client folders in {args.data}; write them with "
                "python tools/export_partition.py --out DIR"
            )
        nodes = [f"data-path={json.dumps(str(p.resolve()))}" for p in folders]  # TOML string
        settings.pop("num-clients")
        settings.update({"min-nodes": len(nodes), "node-data": "own"})
    # Bad values fail here, before any process starts, as the ServerApp's checks of its
    # data and plan would refuse them.
    resolve(run_config(settings))
    count = args.nodes if isinstance(nodes, int) else len(nodes)
    given = None if args.credentials is None else _given_credentials(args.credentials, count)
    out = prepare_out_dir(args.out or Path("results") / args.preset / "flower")
    result = out / "flower.json"
    result.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="cpcfl-credentials-") as made:
        credentials = given or (
            make_credentials(Path(made) / "credentials", count) if args.secure else None
        )
        with LoopbackFederation.start(nodes, out / "logs", credentials=credentials) as federation:
            print(
                f"SuperLink on {HOST}:{federation.port} "
                f"({'TLS, SuperNode authentication' if credentials else 'insecure'}), "
                f"{len(federation.supernodes)} SuperNodes; logs in {out / 'logs'}",
                flush=True,
            )
            run_id = federation.run({**settings, "out": str(result.resolve())})
            print(f"run {run_id} submitted; waiting for the ServerApp", flush=True)
            record = wait_for_file(
                result, federation, timeout=args.rounds * args.round_timeout + 600, run_id=run_id
            )
            for k, reason in federation.refused().items():
                print(f"SuperNode {k} did not join: {reason}")
    for r in record["rounds"]:
        scored = f", accuracy {r['accuracy']:.4f}" if "accuracy" in r else ""
        print(
            f"round {r['round']}: cluster ids {r['cluster_ids']}, failed clients "
            f"{r['failed_partitions']}{scored}"
        )
    print(f"final accuracy {record['final']['accuracy']:.4f}; wrote {result}")


if __name__ == "__main__":
    from cpcfl_tf.errors import run_cli

    run_cli(main)
