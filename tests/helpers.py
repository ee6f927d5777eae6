"""What several test modules share (pytest puts this folder on sys.path)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def script(name):
    """``experiments/<name>.py`` imported as a module (its ``main(argv)`` runs in-process)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
