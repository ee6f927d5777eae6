"""The scaffold every experiment script stands on: name, command line, output folder,
runner and report, each given once.

A script is a configuration of the runner::

    SCRIPT = Script(__file__, __doc__)

    def main(argv=None):
        run = SCRIPT.start(argv)                  # parsed, validated, folder checked
        records = {spec.name: run.runner.run(spec) for spec in SPECS}
        run.finish(report(records), rows)         # <name>.md (+ <name>.csv), printed
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path
from typing import Callable, Sequence

from cpcfl_tf.config import Config
from cpcfl_tf.errors import ArgumentParser
from cpcfl_tf.experiment import experiment_parser, setup
from cpcfl_tf.runner import Runner


@dataclasses.dataclass(frozen=True)
class Script:
    """One script of ``experiments/``: its name is its file's."""

    file: str
    """The script's ``__file__``."""
    doc: str
    """Its ``__doc__``; the first paragraph is the ``--help`` description."""
    default_preset: str = "paper"
    distribute: bool = True
    """Whether it takes ``--distribute`` (benchmarks time one device and leave it out)."""

    @property
    def name(self) -> str:
        return Path(self.file).stem

    def parser(self) -> ArgumentParser:
        return experiment_parser(self.name, self.doc.split("\n\n")[0],
                                 default_preset=self.default_preset,
                                 distribute=self.distribute)

    def start(self, argv: Sequence[str] | None = None,
              options: Callable[[ArgumentParser], None] | None = None) -> "Session":
        """Parse ``argv`` (``options`` adds the script's own), validate the preset and
        check the output folder before any work."""
        parser = self.parser()
        if options:
            options(parser)
        return self.session(parser.parse_args(argv))

    def session(self, args: argparse.Namespace) -> "Session":
        """The session of already parsed ``args``."""
        config, out = setup(args, self.name)
        return Session(self.name, args, config, out)


@dataclasses.dataclass
class Session:
    """One invocation of a script."""

    name: str
    args: argparse.Namespace
    config: Config
    """The preset with ``--seed`` and the data folders."""
    out: Path

    @functools.cached_property
    def runner(self) -> Runner:
        return Runner.for_script(self.name, self.config, self.out, self.args)

    def finish(self, report: str, rows: list[dict] | None = None) -> None:
        """Write ``report`` as ``<name>.md`` (and ``rows`` as ``<name>.csv``), show it,
        say where it went."""
        from cpcfl_tf.results import write_csv, write_text

        if rows:
            write_csv(self.out / f"{self.name}.csv", rows)
        write_text(self.out / f"{self.name}.md", report)
        print(report)
        print(f"wrote {self.out}")
