import dataclasses
import itertools
import json

import pytest

from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.identity import config_key, config_record
from cpcfl_tf.plan.sections import DataConfig, FederatedConfig, PartitionConfig, PretrainConfig
from cpcfl_tf.plan.presets import PRESETS, get_preset, with_encoder
from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.ssl import SSL_METHODS
from cpcfl_tf.plan.resolve import resolve


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_are_valid_and_serialisable(name):
    config = get_preset(name)
    assert config.preset == name
    assert config.to_dict()["partition"]["num_clients"] == config.partition.num_clients


def test_paper_preset_holds_the_papers_settings():
    c = get_preset("paper")
    assert (c.data.pretrain_dataset, c.data.pretrain_split, c.data.image_size) == (
        "stl10", "unlabelled", 96)
    assert (c.partition.num_clients, c.partition.num_groups, c.partition.class_counts) == (
        60, 3, (20, 20, 5, 5))
    f = c.federated
    assert (f.num_clusters, f.rounds, f.head_rounds, f.local_epochs, f.batch_size,
            f.learning_rate) == (3, 100, 10, 3, 32, 1e-3)
    p = c.pretrain
    assert (p.epochs, p.batch_size, p.learning_rate, p.settings("simclr")["temperature"],
            p.settings("byol")["target_decay"]) == (300, 500, 1e-3, 0.1, 0.9)


def test_cpu_presets_follow_design():
    quick, standard = get_preset("quick"), get_preset("standard")
    assert (quick.partition.num_clients, quick.federated.rounds, quick.federated.head_rounds) == (
        15, 40, 10)
    assert (standard.partition.num_clients, standard.federated.rounds) == (60, 100)
    assert quick.data.client_dataset == "fashion_mnist_idx" and quick.data.image_size == 32


@pytest.mark.parametrize("build,message", [
    (lambda: get_preset("fast"), "unknown preset"),
    (lambda: DataConfig(pretrain_dataset="imagenet"), "unknown dataset"),
    (lambda: DataConfig(client_train_split="valid"), "has no split"),
    (lambda: DataConfig(client_train_split="unlabelled"), "must be labeled"),
    (lambda: DataConfig(image_size=28), "image_size"),
    (lambda: get_preset("quick").with_overrides(data={"pretrain_split": "train[:50001]"}),
     r"data.pretrain_split 'train\[:50001\]' and data.client_train_split .* share images"),
    (lambda: get_preset("quick").with_overrides(data={"client_test_split": "train[-10:]"}),
     "data.client_train_split .* and data.client_test_split .* share images"),
    (lambda: get_preset("smoke").with_overrides(data={"pretrain_split": "test[5:]"}),
     "data.pretrain_split 'test\\[5:\\]' and data.client_test_split 'test' share"),
    (lambda: DataConfig(pretrain_dataset="stl10", pretrain_split="train[:10]"),
     "and data.client_train_split 'train' share images of stl10"),
    (lambda: DataConfig(image_size=-1), "image_size"),
    (lambda: PartitionConfig(num_clients=0), "positive"),
    (lambda: PartitionConfig(num_clients=2, num_groups=3), "more groups"),
    (lambda: PartitionConfig(num_clients=61), "split evenly"),
    (lambda: PartitionConfig(class_counts=(20, 20, 5)), "class_counts"),
    (lambda: PartitionConfig(class_counts=(20, 20, 5, 0)), "class_counts"),
    (lambda: PartitionConfig(class_overlap=4), "class_overlap"),
    (lambda: get_preset("smoke").with_overrides(pretrain={"method": "byol"}),
     r"unknown field\(s\) method in pretrain"),
    (lambda: PretrainConfig(epochs=0), "positive"),
    (lambda: PretrainConfig(options={"byol": {"target_decay": 1.0}}), "byol.target_decay"),
    (lambda: PretrainConfig(options={"byol": {"temperature": 0.2}}), "byol has no setting"),
    (lambda: PretrainConfig(options={"mocov2": {}}), "unknown method .mocov2. in pretrain.options"),
    (lambda: PretrainConfig(warmup_epochs=2, epochs=5), "lr_schedule=cosine"),
    (lambda: PretrainConfig(lr_schedule="step"), "lr_schedule"),
    (lambda: FederatedConfig(num_clusters=0), "positive"),
    (lambda: FederatedConfig(head_rounds=100), "head_rounds"),
    (lambda: FederatedConfig(method="fedprox"), "unknown federated.method"),
    (lambda: FederatedConfig(pretraining="moco"), "unknown federated.pretraining"),
    (lambda: FederatedConfig(head="c-4"), "unknown federated.head"),
    (lambda: get_preset("quick").with_overrides(partition={"num_groups": 5, "num_clients": 15}),
     "need classes 0..15"),
    (lambda: get_preset("quick").with_overrides(partition={"clients": 5}), "unknown field"),
    (lambda: FederatedConfig(method="cp-cfl", pretraining="none"), "use method ifca"),
    (lambda: FederatedConfig(method="fedavg", pretraining="fedavg"), "cannot start from"),
    (lambda: FederatedConfig(encoder_epochs=4), "encoder_epochs"),
    (lambda: FederatedConfig(participation=1.5), "participation"),
    (lambda: FederatedConfig(participation=0), "positive"),
    (lambda: FederatedConfig(learning_rate=float("inf")), "positive finite"),
    (lambda: PretrainConfig(options={"simclr": {"temperature": float("inf")}}),
     "simclr.temperature must be a positive number"),
    (lambda: PretrainConfig(learning_rate=float("nan")), "positive finite"),
    (lambda: FederatedConfig(backend="gpu"), "unknown federated.backend"),
    (lambda: FederatedConfig(local_optimizer="rmsprop"), "unknown federated.local_optimizer"),
    (lambda: FederatedConfig(optimizer_state="server"), "unknown federated.optimizer_state"),
    (lambda: FederatedConfig(local_optimizer="sgd", optimizer_state="client"), "has none"),
    (lambda: get_preset("quick").with_overrides(federated={"encoder": "resnet18"}),
     "federated.encoder resnet18 is not pretrain.encoder cnn: the encoder is one setting of "
     "both stages, set pretrain.encoder=resnet18"),
    (lambda: dataclasses.replace(get_preset("quick"), seed=-1), "seed"),
])
def test_bad_values_raise_one_line_user_errors(build, message):
    """Each bad value is refused in one line: when the config is built, or (what needs
    the data's facts) when it is resolved into the run's plan, before any run."""
    def build_and_resolve():
        made = build()
        if isinstance(made, DataConfig):
            made = dataclasses.replace(get_preset("paper"), data=made)
        if isinstance(made, PartitionConfig):
            made = dataclasses.replace(get_preset("paper"), partition=made)
        resolve(made)

    with pytest.raises(UserError, match=message) as err:
        build_and_resolve()
    assert "\n" not in str(err.value)


def test_a_config_is_built_without_reading_any_dataset(monkeypatch, tmp_path):
    """Building a config, and changing it, reads no folder and asks no tfds builder: only
    resolving it into the run's plan looks at the data, once."""
    from cpcfl_tf.data import sources

    asked = []

    def spy(name):
        asked.append(name)
        return spec(name)

    spec = sources.get_spec
    monkeypatch.setattr(sources, "get_spec", spy)
    missing = f"folder:{tmp_path / 'nowhere'}"
    config = get_preset("quick").with_overrides(
        seed=2, data={"client_dataset": missing, "client_train_split": "train",
                      "pretrain_dataset": "cifar100_like_name_tfds_does_not_know"},
        partition={"num_clients": 30}, federated={"method": "ifca", "pretraining": "none"})
    Config.from_dict(config.to_dict())
    assert asked == []
    with pytest.raises(UserError, match="unknown dataset 'cifar100_like") as err:
        resolve(config)
    assert "\n" not in str(err.value) and asked
    config = config.with_overrides(data={"pretrain_dataset": "fashion_mnist_idx"})
    with pytest.raises(UserError, match="nowhere") as err:
        resolve(config)
    assert "\n" not in str(err.value)


def test_overrides_are_validated_and_kept():
    c = get_preset("quick").with_overrides(seed=3, partition={"num_clients": 30})
    assert (c.seed, c.partition.num_clients, c.partition.num_groups) == (3, 30, 3)
    assert isinstance(c, Config)


def test_methods_resolve_to_what_they_imply():
    def resolved(**fields):
        return resolve(get_preset("paper").with_overrides(federated=fields)).federated

    fedavg = resolved(method="fedavg", pretraining="none")
    assert (fedavg.num_clusters, fedavg.head_rounds) == (1, 0)
    assert resolved(method="ifca", pretraining="none").head_rounds == 0
    assert resolved(method="ifca", pretraining="simclr").head_rounds == 0
    assert resolved() == FederatedConfig()
    # FedAvg from a pre-trained encoder is CP-CFL with N = 1, its Tc phase included.
    for pre in (*SSL_METHODS, "supervised"):
        fedavg = resolved(method="fedavg", pretraining=pre)
        one = resolved(method="cp-cfl", pretraining=pre, num_clusters=1)
        assert dataclasses.replace(fedavg, method="cp-cfl") == one
        assert (fedavg.num_clusters, fedavg.head_rounds) == (1, 10)


def test_fields_added_to_a_section_later_count_at_their_defaults():
    from cpcfl_tf.plan.sections import with_defaults

    stored = dataclasses.asdict(FederatedConfig())
    del stored["local_optimizer"], stored["optimizer_state"]
    assert with_defaults("federated", stored) == dataclasses.asdict(FederatedConfig())
    stored["learning_rate"] = 0.5
    assert with_defaults("federated", stored) != dataclasses.asdict(FederatedConfig())


def test_with_encoder_changes_both_and_follows_the_papers_resnet_settings():
    c = with_encoder(get_preset("paper"), "resnet18")
    assert (c.pretrain.encoder, resolve(c).federated.encoder) == ("resnet18", "resnet18")
    assert (c.pretrain.batch_size, c.pretrain.epochs) == (250, 500)


def test_the_encoder_is_one_setting_that_records_name_where_they_always_have():
    # One setting, pretrain.encoder; the plan's federated section builds it. A record
    # writes it after the federated learning_rate as well (records written before it
    # was one setting spell it so), and reading one back checks the two agree.
    config = get_preset("smoke").with_overrides(pretrain={"encoder": "resnet18"})
    assert not hasattr(config.federated, "encoder")
    plan = resolve(config)
    assert plan.federated.encoder == "resnet18"
    stored = config.to_dict()["federated"]
    keys = list(stored)
    assert keys[keys.index("learning_rate") + 1] == "encoder" and stored["encoder"] == "resnet18"
    assert list(plan.config.to_dict()["federated"]) == keys  # the plan's: the same place
    assert Config.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    # A plan's section follows a changed encoder: requested again, then resolved anew.
    again = plan.config.with_overrides(pretrain={"encoder": "cnn"})
    assert resolve(again).federated.encoder == "cnn"
    with pytest.raises(UserError, match="federated.encoder cnn is not pretrain.encoder "
                                        "resnet18: .* set pretrain.encoder=cnn"):
        Config.from_dict({**config.to_dict(), "federated": {**stored, "encoder": "cnn"}})
    # A command line that set both, as it once had to, still means the same config.
    both = get_preset("smoke").with_overrides(pretrain={"encoder": "resnet18"},
                                              federated={"encoder": "resnet18"})
    assert both == config


def test_keys_and_fingerprints_leave_out_added_fields_at_their_defaults():
    """A checkpoint or cache entry written before a field existed is found again."""
    from cpcfl_tf.compat import ADDED_FIELDS, without_added
    from cpcfl_tf.plan.sections import SECTIONS

    now = dataclasses.asdict(get_preset("smoke"))
    before = {k: ({f: x for f, x in v.items() if f not in ADDED_FIELDS.get(k, {})}
                  if isinstance(v, dict) else v) for k, v in now.items()}
    assert without_added(now) == without_added(before) == before
    jit = dataclasses.asdict(get_preset("smoke").with_overrides(federated={"jit_compile": True}))
    assert without_added(jit)["federated"]["jit_compile"] is True
    for section, fields in ADDED_FIELDS.items():  # each names a real field and its default
        defaults = dataclasses.asdict(SECTIONS[section]())
        assert all(defaults[name] == value for name, value in fields.items())


def test_disjoint_splits_of_one_dataset_pass_and_other_datasets_never_clash():
    from cpcfl_tf.data.specs import Split

    assert DataConfig(pretrain_dataset="stl10", pretrain_split="unlabelled")  # the paper's
    get_preset("quick").with_overrides(data={"pretrain_split": "train[:49999]"})
    get_preset("quick").with_overrides(data={"pretrain_dataset": "digits",
                                             "pretrain_split": "train"})
    # sizes unknown (a tfds dataset not prepared yet): judged on the bounds
    assert Split("train", 0, 10).overlaps(Split("train", 5, None), None)
    assert not Split("train", 0, 10).overlaps(Split("train", 10, None), None)
    assert not Split("train", None, None).overlaps(Split("test", None, None), None)
    assert Split("train", -10, None).overlaps(Split("train", 95, None), 100)
    # sizes known: a common image, exactly as the selected index sets say
    bounds = (None, 0, 1, 4, 5, 6, -1, -5, -6)
    for first in itertools.product(bounds, repeat=2):
        for second in itertools.product(bounds, repeat=2):
            a, b = Split("train", *first), Split("train", *second)
            shared = set(a.indices(5)) & set(b.indices(5))
            assert a.overlaps(b, 5) == bool(shared), (a, b)


# The cache folders of the encoders the committed quick and standard records start from
# (seed 0), as the kit named them before pretrain.seed existed: a setting added at its
# default must leave them, and so every cached encoder, where they are.
COMMITTED_KEYS = {
    ("quick", "simclr"): "simclr-cnn-96654d6eeb", ("quick", "byol"): "byol-cnn-011b1927b5",
    ("quick", "simsiam"): "simsiam-cnn-f9f761171d",
    ("quick", "supervised"): "supervised-cnn-f911e1dfe0",
    ("standard", "simclr"): "simclr-cnn-28c1e9fef5", ("standard", "byol"): "byol-cnn-7ffc207749",
    ("standard", "simsiam"): "simsiam-cnn-d60f8eae35",
}


@pytest.mark.parametrize("preset,method", list(COMMITTED_KEYS))
def test_pretraining_cache_keys_survive_added_settings(preset, method):
    from cpcfl_tf.pretraining.pretrain import image_source, pretrain_key

    config = get_preset(preset)
    key = pretrain_key(config.pretrain, method, data=image_source(config.data), seed=0)
    assert key == COMMITTED_KEYS[preset, method]
    # pretrain.seed names the seed, not a setting: seed 3 of run 0 is seed 3 of run 3
    shared = config.with_overrides(pretrain={"seed": 3})
    assert shared.pretrain_seed == 3 and config.pretrain_seed == 0
    assert (pretrain_key(shared.pretrain, method, data=image_source(config.data), seed=3)
            == pretrain_key(config.with_overrides(seed=3).pretrain, method,
                            data=image_source(config.data), seed=3))


def test_a_mapping_is_set_key_by_key_without_json():
    from cpcfl_tf.plan.overrides import parse_settings

    assert parse_settings(["pretrain.options.fedema.rounds=2", "pretrain.options.byol."
                           "target_decay=0.99", "federated.options.eps1=0.3"]) == {
        "pretrain": {"options": {"fedema": {"rounds": 2}, "byol": {"target_decay": 0.99}}},
        "federated": {"options": {"eps1": 0.3}}}
    with pytest.raises(UserError, match="federated.rounds is not a mapping"):
        parse_settings(["federated.rounds.x=2"])


def test_a_runs_key_is_its_record_without_data_folders_and_follows_every_copy():
    # The key is kept on the (frozen) config once made: a copy with one setting changed
    # must get its own, and where the data is read from never counts.
    config = get_preset("smoke")
    by_hand = config.to_dict()
    del by_hand["data"]["data_dir"], by_hand["data"]["manual_dir"]
    assert config_key(config) == json.dumps(by_hand, sort_keys=True)
    assert config_key(config) == config_key(config)  # kept, and the same
    moved = config.with_overrides(data={"data_dir": "/elsewhere", "manual_dir": "/m"})
    assert config_key(moved) == config_key(config)
    for changed in (config.with_overrides(federated={"rounds": 5}), config.with_overrides(seed=3),
                    dataclasses.replace(config, partition=dataclasses.replace(
                        config.partition, num_clients=config.partition.num_clients + 3))):
        assert config_key(changed) != config_key(config)
        assert json.loads(config_key(changed)) == config_record(changed)


def test_frozen_features_is_a_checked_setting_absent_from_records_at_its_default():
    """federated.frozen_features: off, a record, a run's key and a checkpoint fingerprint
    leave it out (committed records stay as they were); on, the record names it and the
    run is another; anything but true or false is refused in one line."""
    from cpcfl_tf.compat import without_added
    from cpcfl_tf.plan.identity import config_key

    config = get_preset("quick")
    assert "frozen_features" not in config.to_dict()["federated"]
    assert "frozen_features" not in without_added(dataclasses.asdict(config))["federated"]
    other = config.with_overrides(federated={"frozen_features": True})
    assert other.to_dict()["federated"]["frozen_features"] is True
    assert without_added(dataclasses.asdict(other))["federated"]["frozen_features"] is True
    assert config_key(other) != config_key(config)
    assert Config.from_dict(json.loads(json.dumps(other.to_dict()))) == other
    with pytest.raises(UserError, match="federated.frozen_features must be true or false, "
                                        "got 'yes'"):
        config.with_overrides(federated={"frozen_features": "yes"})


def test_robust_aggregation_is_three_checked_settings_absent_from_records_at_their_defaults():
    """federated.aggregation, trim_fraction and update_norm: at their defaults (the
    paper's weighted mean, no bound) a record, a run's key and a checkpoint fingerprint
    name none of them, so every committed record stays as it was; set, the record names
    it and the run is another. Bad values are refused in one line."""
    from cpcfl_tf.compat import without_added
    from cpcfl_tf.plan.identity import config_key

    names = {"aggregation", "trim_fraction", "update_norm"}
    config = get_preset("quick")
    assert not names & set(config.to_dict()["federated"])
    assert not names & set(without_added(dataclasses.asdict(config))["federated"])
    for change in ({"aggregation": "median"}, {"aggregation": "trimmed-mean"},
                   {"trim_fraction": 0.3}, {"update_norm": 2.5}):
        other = config.with_overrides(federated=change)
        (name, value), = change.items()
        assert other.to_dict()["federated"][name] == value
        assert without_added(dataclasses.asdict(other))["federated"][name] == value
        assert config_key(other) != config_key(config)
        assert Config.from_dict(json.loads(json.dumps(other.to_dict()))) == other
    for bad, said in (({"aggregation": "krum"}, "unknown federated.aggregation 'krum'; "
                                                "choose one of mean, median, trimmed-mean"),
                      ({"trim_fraction": 0.5}, r"trim_fraction must be in \[0, 0.5\)"),
                      ({"trim_fraction": -0.1}, r"trim_fraction must be in \[0, 0.5\)"),
                      ({"update_norm": 0.0}, "update_norm must be a positive finite"),
                      ({"update_norm": float("inf")}, "update_norm must be a positive finite")):
        with pytest.raises(UserError, match=said):
            config.with_overrides(federated=bad)


def test_a_trimmed_mean_checkpoint_of_the_old_cut_is_not_taken_for_the_new():
    """trimmed-mean now cuts one member of three or four (it cut none at beta 0.2): its
    checkpoint fingerprint gains a mark, so a checkpoint written before is refused ("a
    different run") rather than resumed under the new cut; every other aggregation's
    fingerprint, the default's above all, gains nothing."""
    from cpcfl_tf.compat import changed_behaviour

    config = get_preset("quick")
    assert changed_behaviour(dataclasses.asdict(config.federated)) == {}
    assert changed_behaviour(dataclasses.asdict(config.with_overrides(
        federated={"aggregation": "median"}).federated)) == {}
    assert changed_behaviour(dataclasses.asdict(config.with_overrides(
        federated={"aggregation": "trimmed-mean"}).federated)) == {
        "trimmed_mean_cut": "at least one of three"}
