"""Methods from a researcher's own installed package (``cpcfl_tf/plugins.py``): a toy
package outside ``cpcfl_tf/``, installed as a distribution with entry points (a
``.dist-info`` on the path), gives a self-supervised method, an assignment rule, a
clustered-FL method that uses it and a personalized method. In a fresh process (the
registries read entry points at import), each runs as the kit's own do: a smoke
pre-training and linear evaluation with the toy method, a CP-CFL run from its encoder, a
run of the toy rule in the simulator and in the Flower apps (in one process), a run of
the personalized method from the toy's encoder; the records name the plugin."""
import json
import os
import subprocess
import sys
import textwrap

from helpers import ROOT

FILES = {
    "toy_cpcfl/__init__.py": "",
    # SimCLR's loss and model at another temperature: any build(parts, settings) will do.
    "toy_cpcfl/ssl.py": '''
        from cpcfl_tf.methods.ssl import Setting, SSLMethod

        TOY = SSLMethod("toy-simclr", "ToySimCLR", "toy_cpcfl.ssl", "a toy",
                        {"temperature": Setting(0.5, "the toy's own"),
                         "projector_dim": Setting(32, "the toy's own")})


        def build(parts, settings):
            from cpcfl_tf.pretraining.simclr import build as simclr
            return simclr(parts, settings)
        ''',
    "toy_cpcfl/rule.py": '''
        import numpy as np

        from cpcfl_tf.methods.rules import Rule


        class Alternate(Rule):
            """The server puts client u in cluster u mod N, for good."""
            name = "toy-alternate"
            description = "client u trains model u mod N"
            server_assigns = True

            def first(self, fl, num_clients, answers):
                return np.arange(num_clients) % fl.num_clusters
        ''',
    "toy_cpcfl/method.py": '''
        from cpcfl_tf.methods.federated import PRETRAININGS, Method

        TOY = Method("toy-cfl", "ToyCFL", PRETRAININGS, assign="toy-alternate", head_phase=True)
        # A personalized method, as docs/extending.md writes one: FedPer's keeps.
        PERSONAL = Method("toy-per", "ToyPer", PRETRAININGS, one_model=True, keeps="head")
        ''',
    "toy_cpcfl-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: toy-cpcfl\nVersion: 0.1\n",
    "toy_cpcfl-0.1.dist-info/entry_points.txt": '''
        [cpcfl_tf.ssl_methods]
        toy-simclr = toy_cpcfl.ssl:TOY

        [cpcfl_tf.rules]
        toy-alternate = toy_cpcfl.rule:Alternate

        [cpcfl_tf.methods]
        toy-cfl = toy_cpcfl.method:TOY
        toy-per = toy_cpcfl.method:PERSONAL
        ''',
}

RUN = '''
import json, sys
from pathlib import Path

import numpy as np

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.pretraining.linear_eval import linear_eval
from cpcfl_tf.data.sources import load_labeled
from cpcfl_tf.clustered.metrics import cluster_ari
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.running.runner import Runner, RunSpec

out = Path(sys.argv[1])
smoke = get_preset("smoke")
config = smoke.with_overrides(federated={"method": "cp-cfl", "pretraining": "toy-simclr",
                                         "rounds": 2, "head_rounds": 1})
runner = Runner("plugins", smoke, out, RunContext(verbose=0))
encoder = runner.encoders(resolve(config))
# The toy method's encoder, evaluated as the kit evaluates any: a linear head on frozen
# features of labeled digits, against the same encoder's random initialisation.
import keras
from cpcfl_tf.models import build_encoder
train = load_labeled("digits", "train[697:1197]", image_size=32)
test = load_labeled("digits", "test", image_size=32)
keras.utils.set_random_seed(0)
net = build_encoder("cnn", (32, 32, 3))
moved = max(float(np.abs(a - b).max()) for a, b in zip(net.get_weights(), encoder))
net.set_weights(encoder)
said = {"moved": moved, "linear": linear_eval(net, train, test, epochs=20)}
cp = runner.run(RunSpec("cp-cfl-toy-simclr", "cp-cfl", "toy-simclr",
                        federated={"rounds": 2, "head_rounds": 1}))
toy = runner.run(RunSpec("toy-cfl-none", "toy-cfl", "none", federated={"rounds": 2}))
said["cp"] = {"accuracy": cp.final.accuracy, "plugins": cp.environment.get("plugins")}
said["toy"] = {"ids": [r.cluster_ids for r in toy.rounds],
               "plugins": toy.environment.get("plugins")}
per = runner.run(RunSpec("toy-per-toy-simclr", "toy-per", "toy-simclr",
                         federated={"rounds": 2, "head_rounds": 0}))
said["per"] = {k: getattr(per.final, k) for k in ("bytes_down", "model_bytes", "bytes_kept")}
said["per"]["plugins"] = per.environment.get("plugins")
sys.path.insert(0, sys.argv[2])
from helpers import run_in_process
record = run_in_process({"preset": "smoke", "method": "toy-cfl", "pretraining": "none",
                         "num-clusters": 2, "num-clients": 3, "rounds": 2, "head-rounds": 0,
                         "seed": 0, "out": str(out / "flower.json")},
                        [{"partition-id": k, "num-partitions": 3} for k in range(3)])
said["flower"] = {"ids": [r["cluster_ids"] for r in record["rounds"]],
                  "plugins": record["environment"].get("plugins")}
print("RESULT " + json.dumps(said))
'''


def _install(folder):
    for name, text in FILES.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def test_a_plugins_ssl_method_and_rule_run_as_the_kits_own(tmp_path):
    _install(tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]),
               TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "out"), str(ROOT / "tests")],
                          capture_output=True, text=True, env=env, timeout=900)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    said = json.loads(lines[0][len("RESULT "):])
    # The toy method pre-trained an encoder (moved from its initialisation), and a linear
    # head on its frozen features reads digits far above chance (0.1).
    assert said["moved"] > 0 and said["linear"] > 0.3, said
    # CP-CFL from the toy method's encoder: the record names the plugin and its version.
    assert said["cp"]["plugins"] == {"ssl_method toy-simclr": "toy-cpcfl 0.1"}
    # The toy rule: client u in cluster u mod N in every round, in the simulator (the
    # smoke's 9 clients, N = 3) and in Flower's apps (3 nodes, N = 2) alike.
    assert said["toy"]["ids"] == [[u % 3 for u in range(9)]] * 2  # smoke: 9 clients, N = 3
    assert said["toy"]["plugins"] == {"method toy-cfl": "toy-cpcfl 0.1",
                                      "rule toy-alternate": "toy-cpcfl 0.1"}
    # The personalized method: each of the 9 clients keeps its head (the model's bytes
    # less what went down to each of them in each of the 2 rounds), never sent.
    per = said["per"]
    assert per["bytes_kept"] == 9 * (per["model_bytes"] - per["bytes_down"] // 18) > 0, per
    assert per["plugins"] == {"method toy-per": "toy-cpcfl 0.1",  # from the toy's encoder
                              "ssl_method toy-simclr": "toy-cpcfl 0.1"}
    expected = [[u % 2 for u in range(3)]] * 2
    assert said["flower"]["ids"] == expected
    assert said["flower"]["plugins"] == said["toy"]["plugins"]


def test_a_plugin_entry_that_cannot_join_is_refused_in_one_line(monkeypatch):
    import importlib.metadata

    import pytest

    from cpcfl_tf import plugins
    from cpcfl_tf.errors import UserError
    from cpcfl_tf.methods.rules import RULES, Rule

    def offered(name, value):
        point = importlib.metadata.EntryPoint(name, value, "cpcfl_tf.rules")
        monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [point])

    for name, value, said in (
            ("loss", "cpcfl_tf.methods.rules:Rule", "the kit has a Rule 'loss' already; give the "
                                            "plugin's another name"),
            ("mine", "cpcfl_tf.methods.rules:Rule", "names a Rule called 'loss': name them alike"),
            ("mine", "cpcfl_tf.errors:UserError", "is a UserError, not a Rule"),
            ("mine", "nowhere_at_all:Rule", "could not be loaded: ModuleNotFoundError")):
        offered(name, value)
        with pytest.raises(UserError, match=said):
            plugins.entries("cpcfl_tf.rules", Rule, RULES)
    offered("mine", "cpcfl_tf.methods.rules:Rule")
    assert plugins.used(rule="loss", method="cp-cfl") == {}  # the kit's own: nothing said


def test_the_groups_the_registries_read_are_the_ones_the_docs_name():
    """Each registry reads one group of :data:`~cpcfl_tf.plugins.GROUPS`, and the module's
    docstring and docs/extending.md name exactly those groups (a researcher declares
    entry points under the names they read)."""
    import re

    from cpcfl_tf import plugins

    read = set()
    for source in ("methods/rules.py", "methods/federated.py", "methods/ssl.py"):
        read |= set(re.findall(r'entries\("([\w.]+)"', (ROOT / "cpcfl_tf" / source).read_text()))
    assert read == set(plugins.GROUPS)
    assert re.findall(r"^- ``([\w.]+)``:", plugins.__doc__, re.M) == list(plugins.GROUPS)
    extending = (ROOT / "docs" / "extending.md").read_text()
    assert set(re.findall(r"^\| `(cpcfl_tf\.[\w.]+)` \|", extending, re.M)) == read
