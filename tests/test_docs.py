"""README and docs/ stay current: every local link resolves, and README's layout map names
every part of the package."""
import re

from helpers import ROOT


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


def test_the_layout_map_names_every_part_of_the_package():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.index("```", layout.index("```") + 3)]
    parts = [p for p in sorted((ROOT / "cpcfl_tf").iterdir())
             if not p.name.startswith(("_", ".")) and (p.suffix == ".py" or p.is_dir())]
    missing = [p.name for p in parts
               if f"cpcfl_tf/{p.name}{'/' if p.is_dir() else ''}" not in layout]
    assert not missing, f"README's layout map lacks {missing}"
