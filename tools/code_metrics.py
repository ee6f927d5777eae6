"""How typed and how large the kit's code is, at a revision or in the work tree: the share
of functions fully annotated (every parameter but ``self``/``cls`` and the return), how
many annotations in signatures name ``Any``, the parameters of ``Runner.__init__``, and
the largest modules by lines.

    python tools/code_metrics.py                 # the work tree
    python tools/code_metrics.py --rev 9cbe02a   # a commit (read with git show)

Reads only ``cpcfl_tf/**/*.py``; writes nothing.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Metrics:
    functions: int = 0
    annotated: int = 0
    any_in_signatures: int = 0
    runner_parameters: int | None = None
    lines: dict[str, int] = field(default_factory=dict)

    @property
    def share(self) -> float:
        return self.annotated / self.functions if self.functions else 0.0


def _names_any(node: ast.expr | None) -> bool:
    """Whether an annotation names ``Any`` (``Any``, ``typing.Any``, ``dict[str, Any]``,
    or the same as a string)."""
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return False
    return any(
        (isinstance(n, ast.Name) and n.id == "Any")
        or (isinstance(n, ast.Attribute) and n.attr == "Any")
        for n in ast.walk(node)
    )


def add_source(metrics: Metrics, path: str, text: str) -> None:
    """Count ``text`` (the module at ``path``) into ``metrics``."""
    tree = ast.parse(text)
    metrics.lines[path] = len(text.splitlines())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Runner":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    a = item.args
                    metrics.runner_parameters = len(a.posonlyargs + a.args + a.kwonlyargs) - 1
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        params = a.posonlyargs + a.args + a.kwonlyargs
        if params and params[0].arg in ("self", "cls"):
            params = params[1:]
        params += [p for p in (a.vararg, a.kwarg) if p is not None]
        metrics.functions += 1
        metrics.annotated += node.returns is not None and all(
            p.annotation is not None for p in params
        )
        metrics.any_in_signatures += sum(_names_any(p.annotation) for p in params) + _names_any(
            node.returns
        )


def measure(rev: str | None) -> Metrics:
    metrics = Metrics()
    if rev is None:
        for path in sorted((ROOT / "cpcfl_tf").rglob("*.py")):
            add_source(metrics, str(path.relative_to(ROOT)), path.read_text())
        return metrics
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "cpcfl_tf"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    for name in sorted(p for p in listed if p.endswith(".py")):
        text = subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        add_source(metrics, name, text)
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python tools/code_metrics.py", description=__doc__)
    parser.add_argument("--rev", help="a git revision (default: the work tree)")
    parser.add_argument("--largest", type=int, default=5, help="modules listed (default 5)")
    args = parser.parse_args(argv)
    try:
        m = measure(args.rev)
    except subprocess.CalledProcessError as err:
        print(f"error: git could not read {args.rev!r} ({err.stderr.strip()}); name a commit",
              file=sys.stderr)
        raise SystemExit(2) from None
    print(f"functions: {m.functions}, fully annotated: {m.annotated} ({100 * m.share:.0f} %)")
    print(f"annotations in signatures naming Any: {m.any_in_signatures}")
    print(f"Runner.__init__ parameters (besides self): {m.runner_parameters}")
    print("largest modules (lines): " + ", ".join(
        f"{p} ({n})" for p, n in sorted(m.lines.items(), key=lambda kv: -kv[1])[: args.largest]
    ))


if __name__ == "__main__":
    main()
