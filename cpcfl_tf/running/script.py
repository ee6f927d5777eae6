"""The scaffold every experiment script stands on: name, command line, output folder,
runner and report, each given once.

A script is a configuration of the runner::

    SCRIPT = Script(__file__, __doc__)

    def main(argv=None):
        session = SCRIPT.start(argv)              # parsed, validated, folder checked
        records = {spec.name: session.runner.run(spec) for spec in SPECS}
        session.finish(report(records), rows)     # <name>.md (+ <name>.csv), printed
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from types import ModuleType

from cpcfl_tf.errors import ArgumentParser, UserError
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.cli import (
    changed_fields,
    experiment_parser,
    name_list,
    proxy_splits,
    read_selection,
    settings_changed,
    setup,
)
from cpcfl_tf.running.runner import Runner, RunSpec


def load_script(path: Path, module_name: str | None = None) -> ModuleType:
    """The script at ``path`` (``experiments/table2.py``) imported as a module, its
    ``main(argv)`` run in-process, registered in :data:`sys.modules` as ``module_name``
    (default ``experiments_<stem>``) before it runs, since ``dataclasses`` look a class's
    module up there."""
    name = module_name or f"experiments_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise UserError(f"no script at {path}: name one of the .py files in its folder")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_context(args: argparse.Namespace) -> RunContext:
    """The context of a script's runs, from its :func:`~cpcfl_tf.running.cli.experiment_parser`
    options, each read and checked once (``--knn-proxy``'s splits, the ``--encoders-from``
    file) before the script does any work: a bad value is refused in one line. A script
    without an option (a measurement takes no ``--diagnose``) has its default."""
    path = getattr(args, "encoders_from", None)
    tensorboard = getattr(args, "tensorboard", None)
    return RunContext(
        resume=args.resume,
        force=args.force,
        dry_run=getattr(args, "dry_run", False),
        distribute=getattr(args, "distribute", "default"),
        max_clients=getattr(args, "max_clients_per_step", None),
        diagnose=getattr(args, "diagnose", 0),
        tensorboard=Path(tensorboard) if tensorboard else None,
        knn_every=getattr(args, "knn_every", 0),
        knn_proxy=proxy_splits(getattr(args, "knn_proxy", None)),
        selection=read_selection(path) if path else None,
    )


@dataclasses.dataclass(frozen=True)
class Script:
    """One script of ``experiments/``, ``benchmarks/`` or ``tools/``: its name is its
    file's."""

    file: str
    """The script's ``__file__``."""
    doc: str
    """Its ``__doc__``; the first paragraph is the ``--help`` description."""
    default_preset: str = "paper"
    distribute: bool = True
    """Whether it takes ``--distribute`` (benchmarks time one device and leave it out)."""
    runs: bool = True
    """Whether it is made of runs (then it takes ``--dry-run``); measurements are not."""
    stand_in: bool = False
    """Whether it serves its own stand-in for the preset's data (then the session does
    not check that the real data can be read or fetched here)."""
    rows: tuple[str, ...] = ()
    """The rows (run keys) of its table: given, the script takes ``--methods`` (the
    option's name since the first table script; ``args.rows``) to run a subset of them."""
    compares_in_tree: bool = False
    """Whether its runs are compared with the committed tree's runs of their configs also
    when written into that tree (``experiments/run.py``: one run, which a table of the
    tree may hold); a table script's own folder is compared only when elsewhere."""

    @property
    def name(self) -> str:
        return Path(self.file).stem

    def parser(self) -> ArgumentParser:
        parser = experiment_parser(
            self.name,
            self.doc.split("\n\n")[0],
            folder=Path(self.file).parent.name,
            default_preset=self.default_preset,
            distribute=self.distribute,
            runs=self.runs,
        )
        if self.rows:
            parser.add_argument(
                "--methods",
                dest="rows",
                type=name_list(self.rows),
                default=list(self.rows),
                metavar="NAME[,NAME...]",
                help="run a subset of the table's rows: " + ",".join(self.rows) + " (default: all)",
            )
        return parser

    def start(
        self,
        argv: Sequence[str] | None = None,
        options: Callable[[ArgumentParser], None] | None = None,
    ) -> Session:
        """Parse ``argv`` (``options`` adds the script's own), validate the preset and
        check the output folder before any work."""
        parser = self.parser()
        if options:
            options(parser)
        return self.session(parser.parse_args(argv))

    def session(self, args: argparse.Namespace, context: RunContext | None = None) -> Session:
        """The session of already parsed ``args``: every option checked (the run context's
        too, unless ``context`` is it, read already) before any folder is made or data
        read."""
        context = run_context(args) if context is None else context
        config, out = setup(args, self.name, check_sources=not self.stand_in, context=context)
        return Session(
            self.name,
            args,
            config,
            out,
            f"{Path(self.file).parent.name}/{self.name}.py",
            self.compares_in_tree,
            dataclasses.replace(context, data_checked=True),  # by setup()
        )


@dataclasses.dataclass
class Session:
    """One invocation of a script."""

    name: str
    args: argparse.Namespace
    config: Config
    """The preset with ``--seed`` and the data folders."""
    out: Path
    script: str = ""
    """The script's path in the kit, e.g. ``experiments/table2.py``."""
    compares_in_tree: bool = False
    """:attr:`Script.compares_in_tree`."""
    context: RunContext = RunContext()
    """What its runs are made with (:func:`run_context`), read once."""

    @functools.cached_property
    def runner(self) -> Runner:
        return Runner(self.name, self.config, self.out, self.context)

    def reuse_committed(self, tree: Path | None = None) -> None:
        """Take a run from a results tree where this machine would make it bit for bit
        (same config, machine kind and starting encoder: :meth:`Runner.run`): ``tree`` if
        given, else the kit's own ``results/<preset>`` when the output folder is in it. A
        reproducer writing elsewhere (``--out``) gets every run made on their machine, to
        compare with the committed ones."""
        from cpcfl_tf.records.store import RecordIndex

        own = Path("results") / self.config.preset
        if tree is not None or (own.is_dir() and self.out.resolve().parent == own.resolve()):
            self.runner.store.reuse = RecordIndex(tree or own, prefer=self.out)

    def update_readme(self, tag: str, lines: list[str], what: str, front: bool = False) -> None:
        """Replace the block ``<!-- TAG:PRESET -->`` of ``results/README.md`` (``front``:
        of the repository's README.md) with ``lines``
        (:func:`~cpcfl_tf.running.report.replace_block`), only where the output folder is the
        kit's own ``results/<preset>/<script>``: a study written elsewhere leaves the
        committed READMEs as they are. Scripts call it once their study is whole."""
        from cpcfl_tf.running.report import replace_block

        readme = Path("README.md") if front else Path("results") / "README.md"
        if self.out.resolve() == (
            Path("results") / self.config.preset / self.name
        ).resolve() and replace_block(readme, tag, self.config.preset, lines):
            print(f"updated the {self.config.preset} {what} in {readme}")

    def resume_command(self) -> str:
        """The command that makes the runs a partial folder lacks: this command line as
        given, with ``--resume`` in place of ``--report``, ``--force`` and
        ``--dry-run``."""
        import shlex

        skip = {"--report", "--force", "--dry-run", "--resume"}
        kept = [token for token in getattr(self.args, "argv", []) if token not in skip]
        return shlex.join(["python", self.script or f"{self.name}.py", *kept, "--resume"])

    def wanted(self, key: str) -> bool:
        """Whether the row ``key`` is among ``--methods`` (always, without the option)."""
        return key in getattr(self.args, "rows", [key])

    def kept(self, specs: Sequence[RunSpec], also: Sequence[str] = ()) -> list[RunSpec]:
        """The runs of ``specs`` that ``--methods`` keeps. With ``--dry-run``: print the
        settings that differ from the preset and what each run would do (then the lines
        ``also``: work that is not a run), then stop (exit 0) having touched nothing."""
        kept = [s for s in specs if self.wanted(s.key)]
        self.refuse_dropped(kept)
        if getattr(self.args, "dry_run", False):
            changed = settings_changed(self.config)
            print(
                f"{self.name}, preset {self.config.preset}: "
                + ("changed " + ", ".join(changed) if changed else "the preset's settings")
                + f"; output {self.out}"
            )
            encoders: dict[str, None] = {}  # of the runs still to make, each once
            for spec in kept:
                status, encoder = self.runner.planned(spec)
                print(f"  {spec.name}: {status}")
                if encoder is not None:
                    encoders.setdefault(encoder)
            for line in also:
                print(f"  {line}")
            for line in encoders:
                print(f"  starting encoder: {line}")
            raise SystemExit(0)
        return kept

    def refuse_dropped(self, specs: Sequence[RunSpec]) -> None:
        """Refuse, in one line, a setting the user changed (``--set``, against the preset)
        that a run of ``specs`` sets otherwise itself: the run would silently not use it.
        ``--seed`` is not such a setting (a script's runs count their seeds from it)."""
        changed = changed_fields(self.config)
        for spec in specs:
            config = self.runner.plan_of(spec).requested  # checked against its data here
            for section, field in changed:
                given = getattr(getattr(self.config, section), field)
                used = getattr(getattr(config, section), field)
                if used != given:
                    rows = (
                        "choose its rows with --methods instead (--help lists them)"
                        if hasattr(self.args, "rows")
                        else "leave it out: this script's runs set it"
                    )
                    raise UserError(
                        f"--set {section}.{field}={given} would not be used: run "
                        f"{spec.name} of {self.name}.py sets {section}.{field}="
                        f"{used} itself; {rows}"
                    )

    def run_all(self, specs: Sequence[RunSpec]) -> dict[str, RunRecord]:
        """Run (or load) the planned runs of ``specs``, by name."""
        return {spec.name: self.runner.run(spec) for spec in self.kept(specs)}

    def run_or_read(
        self, specs: Sequence[RunSpec], only_finished: bool = False
    ) -> tuple[list[tuple[RunSpec, RunRecord]], list[RunSpec]]:
        """Each planned spec of ``specs`` with its record (made now, or found), and the
        specs without one. ``only_finished`` (a script's ``--report``): make no run, read
        the records finished in the output folder and leave the rest as missing."""
        done, missing = [], []
        for spec in self.kept(specs):
            record = self.runner.finished(spec) if only_finished else self.runner.run(spec)
            if record is None:
                missing.append(spec)
            else:
                done.append((spec, record))
        return done, missing

    def finish(self, report: str, rows: list[dict] | None = None) -> None:
        """Write ``report`` as ``<name>.md`` (and ``rows`` as ``<name>.csv``), show it,
        say where it went. Notes are added where the runs come from more than one kind
        of CPU or encoder (:func:`~cpcfl_tf.running.report.provenance`), where some were taken
        from elsewhere in the tree, and where some are another method's runs
        (:func:`stood_in_note`)."""
        from cpcfl_tf.records.files import write_csv, write_text
        from cpcfl_tf.running.report import provenance

        note = provenance(self.runner.records) if "runner" in self.__dict__ else []
        store = self.runner.store if "runner" in self.__dict__ else None
        if store and store.reused:
            note += reused_note(store.reused, store.named, store.paired)
            store.keep_taken()
        if store and store.stood_in:
            note.append(stood_in_note(store.stood_in, self.runner.records))
        if note:
            report = report.rstrip("\n") + "\n\n" + "\n".join(note) + "\n"
        if rows:
            write_csv(self.out / f"{self.name}.csv", rows)
        write_text(self.out / f"{self.name}.md", report)
        print(report)
        print(f"wrote {self.out}")
        self.compare_with_reference()

    def compare_with_reference(self) -> None:
        """Where the runs went elsewhere than the committed ``results/<preset>``: how
        each compares with the committed record of the same config
        (:func:`~cpcfl_tf.running.compare.compare_runs`)."""
        from cpcfl_tf.running.compare import compare_runs, comparison_lines

        reference = Path("results") / self.config.preset
        if (
            not reference.is_dir()
            or reference.resolve() == self.out.resolve()
            or (reference.resolve() in self.out.resolve().parents and not self.compares_in_tree)
        ):
            return
        lines = comparison_lines(compare_runs(self.out, reference))
        if lines:
            print(
                f"\nAgainst the committed runs ({reference}; python experiments/compare.py "
                f"--results {self.out} --preset {self.config.preset}):"
            )
            print("\n".join(lines))


def reused_note(
    reused: dict[str, Path], named: Collection[str], paired: Collection[str] = frozenset()
) -> list[str]:
    """The report's lines on the runs taken from elsewhere in the tree: those this
    machine would make bit for bit, those taken because the folder's ``taken.json``
    names them, and a restart variant's runs taken because they start from the encoder
    of this folder's base run (``paired``)."""

    def folders(names) -> str:
        return ", ".join(f"`{f}`" for f in sorted({str(reused[n].parent) for n in names}))

    here = [name for name in reused if name not in named and name not in paired]
    from_base = [name for name in reused if name in paired]
    lines = []
    if from_base:
        lines.append(
            f"{len(from_base)} of these runs were taken from {folders(from_base)}: where "
            "the restart rule fires in this folder's run of the base method, the "
            "restart variant's run of the same config that starts from that run's "
            "encoder."
        )
    if here:
        lines.append(
            f"{len(here)} of these runs were taken from {folders(here)}: this machine "
            "would make them bit for bit (same config, machine kind and starting "
            "encoder)."
        )
    if named:
        lines.append(
            f"{len(named)} of these runs were taken from {folders(named)} as the "
            "folder's `taken.json` names them: the machine that wrote it would make "
            "them bit for bit (whether this one would is not asked)."
        )
    return lines


def stood_in_note(stood_in: dict[str, tuple[str, Path]], records: Sequence[RunRecord] = ()) -> str:
    """The report's note on runs taken from the method their method is until its restart
    rule fires (:attr:`~cpcfl_tf.records.store.RecordStore.stood_in`), and how many of
    that method's own ``records`` (made in full, e.g. before runs were taken so) show the
    rule never firing either."""
    from collections import Counter

    from cpcfl_tf.methods.federated import METHODS

    made = {id(r): r for r in records}.values()
    parts = []
    for method, n in sorted(Counter(m for m, _ in stood_in.values()).items()):
        base = METHODS[METHODS[method].restarts_of].label
        one = n == 1
        part = (
            f"{n} {'run' if one else 'runs'} of {METHODS[method].label} "
            f"{'is' if one else 'are'} {base}'s {'run' if one else 'runs'} of the same "
            f"config: its restart rule never fired in {'it' if one else 'them'}, and "
            f"until it fires {METHODS[method].label} is {base} bit for bit"
        )
        own = [r for r in made if r.method == method]
        quiet = sum(r.final.restarts == 0 for r in own)
        if quiet:
            part += (
                f"; it never fired either in {quiet} of the {len(own)} "
                f"{'run' if len(own) == 1 else 'runs'} of {METHODS[method].label} made "
                f"in full ({n + quiet} of {n + len(own)} in all)"
            )
        parts.append(part)
    return "; ".join(parts) + "."
