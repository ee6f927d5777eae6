"""User-facing errors and the command-line convention that reports them.

Bad input anywhere in the kit raises :class:`UserError` with a one-line message that
names the fix. Command-line entry points wrap their ``main`` in :func:`run_cli`, which
prints that line to stderr and exits with status 2: no traceback, nothing written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

EXIT_USAGE = 2


class UserError(Exception):
    """Bad input the user can fix; the message is one line that says how."""


class DivergedError(UserError):
    """Training produced NaN or Inf (pre-training loss, or local weights in a round);
    the message names the learning rate to lower and what was kept."""


def require(ok: bool, message: str) -> None:
    """Raise :class:`UserError` with ``message`` (one line naming the fix) unless ``ok``."""
    if not ok:
        raise UserError(message)


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on one line to stderr and exit with status 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` with a one-line error (argparse prints the usage block too). The
    parsed namespace keeps the command line as given, each abbreviated option written in
    full, as ``argv`` (a partial report's resume command repeats it)."""

    def error(self, message: str) -> NoReturn:  # noqa: D401 - argparse API
        fail(f"{message} (see --help)")

    def parse_known_args(self, args=None, namespace=None):
        given = list(sys.argv[1:] if args is None else args)
        parsed, rest = super().parse_known_args(given, namespace)
        parsed.argv = [self._in_full(token) for token in given]
        return parsed, rest

    def _in_full(self, token: str) -> str:
        option, sep, value = token.partition("=")
        if not option.startswith("--") or option in self._option_string_actions:
            return token
        matches = [o for o in self._option_string_actions if o.startswith(option)]
        return matches[0] + sep + value if len(matches) == 1 else token


def run_cli(
    main: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None = None
) -> None:
    """Run ``main(argv)``; turn :class:`UserError` into one stderr line and exit 2."""
    try:
        main(argv)
    except UserError as err:
        fail(str(err))
    except KeyboardInterrupt:
        print("interrupted; rerun with --resume to continue", file=sys.stderr)
        raise SystemExit(130) from None
