"""The kit declares what it imports: every third-party module the package, the scripts
and the tools import belongs to a distribution setup.cfg names (install_requires or an
extra), so a clean install has it however pip resolves the rest."""
import ast
import configparser
import importlib.metadata
import re
import sys

from helpers import ROOT

FOLDERS = ("cpcfl_tf", "experiments", "tools", "benchmarks")


def imported_modules() -> set[str]:
    """Top-level names of every module imported anywhere in :data:`FOLDERS`."""
    names = set()
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def declared() -> set[str]:
    """Normalised names of the distributions setup.cfg asks for."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in cfg["options.extras_require"].values():
        lines += extra.splitlines()
    names = {re.split(r"[\[<>=!~ ;]", line.strip(), maxsplit=1)[0] for line in lines
             if line.strip() and not line.strip().startswith("#")}
    return {n.lower().replace("_", "-") for n in names}


def test_every_third_party_import_is_declared():
    local = {"cpcfl_tf", "helpers", *(p.stem for folder in FOLDERS
                                      for p in (ROOT / folder).glob("*.py"))}
    third = {m for m in imported_modules() - local - set(sys.stdlib_module_names)}
    owners = importlib.metadata.packages_distributions()
    wanted = declared()
    undeclared = {m: owners.get(m) for m in third
                  if not {d.lower().replace("_", "-") for d in owners.get(m, [m])} & wanted}
    assert not undeclared, f"imported but not declared in setup.cfg: {undeclared}"
    assert {"scipy", "pillow", "threadpoolctl"} <= wanted
