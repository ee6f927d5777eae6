"""README and docs/ stay current: every local link resolves, README's layout map names
every part of the package, and every command they show parses with the options and
settings the kit has today."""
import argparse
import importlib
import re
import shlex
from pathlib import Path

import numpy as np
from PIL import Image

from helpers import ROOT, script


def pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            ROOT / "results" / "README.md"]


def test_every_local_link_resolves():
    broken = []
    for page in pages():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def _exists(dotted: str) -> bool:
    """Whether ``dotted`` (``cpcfl_tf.a.b``) names a module, an attribute of one, or an
    attribute a class sets on its instances (``self.name =``, ``self.name: T =``, a
    dataclass field)."""
    import inspect

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if hasattr(obj, name):
                obj = getattr(obj, name)
            elif inspect.isclass(obj) and (
                    re.search(rf"self\.{name}\s*[:=]", inspect.getsource(obj))
                    or name in getattr(obj, "__dataclass_fields__", {})):
                return True
            else:
                return False
        return True
    return False


def test_every_cpcfl_tf_name_the_pages_and_docstrings_use_exists():
    """A module, function or attribute named in full (``cpcfl_tf.x.y``) in docs/, the
    READMEs, the package or the scripts exists today (a rename leaves none behind); an
    entry-point group is one the kit reads."""
    from cpcfl_tf.plugins import GROUPS

    files = [*pages(), *sorted((ROOT / "cpcfl_tf").rglob("*.py")),
             *(p for folder in ("experiments", "benchmarks", "tools")
               for p in sorted((ROOT / folder).glob("*.py")))]
    named = {}
    for path in files:
        for found in re.findall(r"cpcfl_tf(?:\.[A-Za-z_]\w*)+", path.read_text()):
            named.setdefault(found, path.relative_to(ROOT))
    missing = {name: str(where) for name, where in named.items()
               if name not in GROUPS and not _exists(name)}
    assert not missing, missing


def test_the_layout_map_names_every_part_of_the_package():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.index("```", layout.index("```") + 3)]
    parts = [p for p in sorted((ROOT / "cpcfl_tf").iterdir())
             if not p.name.startswith(("_", ".")) and (p.suffix == ".py" or p.is_dir())]
    missing = [p.name for p in parts
               if f"cpcfl_tf/{p.name}{'/' if p.is_dir() else ''}" not in layout]
    assert not missing, f"README's layout map lacks {missing}"


# An install or test command, as README shows it and .ci/run runs it.
_SETUP_COMMAND = re.compile(r"\s*(apt-get install|(python -m )?(pip install|uv pip)|python -m pytest)")


def test_ci_installs_and_tests_the_way_readme_says():
    """CI (.ci/run) is README's set-up and test commands, nothing else: each install
    command of README's first code block, and the first test command, is one of
    .ci/run's lines, and .ci/run runs no install or test command README does not show."""
    readme = (ROOT / "README.md").read_text()
    setup = re.findall(r"```bash\n(.*?)```", readme[readme.index("## Set-up"):], re.S)[0]
    tests = re.findall(r"```bash\n(.*?)```", readme[readme.index("## Tests"):], re.S)[0]
    shown = [c for line in setup.splitlines() + tests.splitlines()[:1]
             for c in line.split(" #")[0].split("&&")]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [sorted(c.strip().removeprefix("python -m ") for c in lines
                       if _SETUP_COMMAND.match(c)) for lines in (ci, shown)]
    assert commands[0] == commands[1], commands


_COMMAND = re.compile(r"python (?:(?:experiments|tools|benchmarks)/\w+\.py|-m cpcfl_tf\.[\w.]+)")
# What the pages write for "your value here", and a value each option takes.
_PLACEHOLDERS = {"P": "quick", "K": "1", "DIR": "runs/mine", "M": "fedavg-none"}


def shown_commands():
    """Every kit command the pages show: the lines of their code blocks (continuations
    joined, comments cut) and the inline ones, as ``(page, command)``."""
    found = []
    for page in pages():
        text = page.read_text()
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip()
                if _COMMAND.match(line):
                    found.append((page.relative_to(ROOT).as_posix(), line))
        prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
        found += [(page.relative_to(ROOT).as_posix(), span.strip())
                  for span in re.findall(r"`([^`]+)`", prose) if _COMMAND.match(span.strip())]
    return found


class _Parsed(BaseException):
    """Raised in place of running the command once its arguments have parsed."""


def _image_folder(root):
    """An image folder (train/ and test/, ten classes) big enough for any preset's
    partition check, standing in for a folder a page names."""
    for split in ("train", "test"):
        for label in range(10):
            (root / split / f"class{label}").mkdir(parents=True, exist_ok=True)
            for k in range(100):
                Image.fromarray(np.full((8, 8), (25 * label + k) % 256, np.uint8)).save(
                    root / split / f"class{label}" / f"{k}.png")


def test_every_command_the_pages_show_parses_and_its_settings_validate(tmp_path, monkeypatch):
    from cpcfl_tf.running.cli import resolve_config

    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    commands, broken = shown_commands(), []
    assert len(commands) > 40, "the pages' commands were not found"
    for page, command in commands:
        words = shlex.split(command)[1:]  # after "python"
        as_module = words[0] == "-m"
        target, argv = words[int(as_module)], [_PLACEHOLDERS.get(w, w)
                                               for w in words[1 + int(as_module):]]
        if not argv or any(mark in w for w in argv for mark in ("|", "[", "...")):
            continue  # a mention of the tool, or a pattern of several commands
        for folder in {f for w in argv for f in re.findall(r"folder:/(\S+)", w)}:
            _image_folder(tmp_path / folder)
        argv = [w.replace("folder:/", f"folder:{tmp_path}/") for w in argv]
        module = importlib.import_module(target) if as_module else script(Path(target).stem)
        try:
            module.main(argv)
            broken.append(f"{page}: {command}: ran past its arguments")
        except _Parsed as parsed:
            args = parsed.args[0]
            if all(hasattr(args, a) for a in ("preset", "set", "seed", "data_dir")):
                try:
                    resolve_config(args)
                except Exception as err:  # noqa: BLE001 - the message is the finding
                    broken.append(f"{page}: {command}: {err}")
        except SystemExit:
            broken.append(f"{page}: {command}: refused by its parser")
    assert not broken, "\n".join(broken)
