import pytest

from cpcfl_tf.errors import UserError
from cpcfl_tf.flops import count_flops, import_keras_flops
from cpcfl_tf.models import (build_classifier, build_classifier_head, build_encoder,
                             build_predictor, build_projector)


def test_cnn_encoder_matches_the_paper():
    encoder = build_encoder("cnn", (96, 96, 3))
    assert encoder.count_params() == 2_378_304  # paper: ~2.4 M
    assert encoder.output_shape == (None, 256)
    assert abs(count_flops(encoder) / 1e9 - 0.1648) < 0.0005  # paper: 0.17 G


def test_cnn_needs_31_pixels():
    assert build_encoder("cnn", (31, 31, 3)).output_shape == (None, 256)
    with pytest.raises(UserError, match="at least 31x31"):
        build_encoder("cnn", (30, 30, 3))
    with pytest.raises(UserError, match="unknown encoder"):
        build_encoder("vgg", (96, 96, 3))


@pytest.mark.parametrize("name,dim,gflops", [("resnet18", 512, 0.668), ("resnet50", 2048, 1.424)])
def test_resnets_match_the_papers_flops(name, dim, gflops):
    encoder = build_encoder(name, (96, 96, 3))
    assert encoder.output_shape == (None, dim)
    assert abs(count_flops(encoder) / 1e9 - gflops) < 0.002  # paper: 0.67 / 1.42 G


@pytest.mark.parametrize("name,params", [("c", 2_570), ("c-1", 68_362), ("c-2", 99_978),
                                         ("c-3", 107_594)])
def test_classifier_heads(name, params):
    head = build_classifier_head(name, 256, 10)
    assert head.count_params() == params  # c-3: the paper's ~0.1 M
    assert head.output_shape == (None, 10)


def test_classifier_keeps_encoder_and_head_as_named_groups():
    model = build_classifier(build_encoder("cnn", (32, 32, 3)), build_classifier_head("c-1", 256, 10))
    encoder, head = model.get_layer("encoder"), model.get_layer("head")
    assert len(model.weights) == len(encoder.weights) + len(head.weights)
    encoder.trainable = False
    assert {id(v) for v in model.trainable_weights} == {id(v) for v in head.weights}


def test_projectors_and_predictor_shapes():
    assert build_projector("simclr", 256).output_shape == (None, 256)
    assert build_projector("simclr", 2048, width=1024, output_dim=2048).output_shape == (None, 2048)
    bn = build_projector("bn", 256)
    assert bn.output_shape == (None, 512) and bn.get_layer("bn2") is not None
    predictor = build_predictor(512)
    assert predictor.get_layer("dense1").units == 64 and predictor.output_shape == (None, 512)
    with pytest.raises(UserError):
        build_classifier_head("c-9", 256, 10)


def test_keras_flops_imports_on_tf_2_21_twice():
    module = import_keras_flops()
    assert callable(module.get_flops) and import_keras_flops() is module
