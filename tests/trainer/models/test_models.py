"""Behaviour of the shared models: shapes, gradients, seeding, parameter counts and errors."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.models import MODELS, CifarResNet, build_model, count_parameters

VOCAB = 50
SEQ_LEN = 6

# Tiny sizes per model so that the whole file runs in seconds on 2 CPU cores.
CASES: dict[str, dict[str, Any]] = {
    "mlp": dict(hidden_sizes=(32, 16)),
    "lenet5": dict(),
    "lenet5_cifar": dict(in_channels=3, image_size=32),
    "resnet20": dict(in_channels=3, image_size=32),
    # 16x16: the CIFAR ResNets pool globally, so any size works; a smaller map keeps 110 layers fast.
    "resnet110": dict(in_channels=3, image_size=16),
    "vgg_small": dict(in_channels=3, image_size=32, width=0.125),
    "vgg16_bn": dict(in_channels=3, image_size=32),
    "airbench": dict(in_channels=3, image_size=32, width=4),
    "cifar10_alexnet": dict(in_channels=3, image_size=24),
    # 63x63: the smallest input alexnet takes (its classifier does not depend on the input size).
    "alexnet": dict(in_channels=3, image_size=63),
    # 64x64: layer4 then has a 2x2 map, so BatchNorm in training mode also takes a batch of 1.
    "resnet50": dict(in_channels=3, image_size=64),
    "lstm_lm": dict(vocab_size=VOCAB, embed_dim=16, hidden_dim=16),
    "gpt2_small": dict(vocab_size=VOCAB, n_layer=1, n_head=2, n_embd=16, n_positions=16),
}


# Parameters a model keeps frozen by design (no gradient): airbench's whitening filters (set from
# data) and its BatchNorm scales.
FROZEN = {"airbench": ("whiten.weight", "norm1.weight", "norm2.weight")}


def _model_name(case: str) -> str:
    return case.removesuffix("_cifar")


def _build(case: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(_model_name(case), **CASES[case])


def _inputs(case: str, batch: int, seed: int = 123) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    kwargs = CASES[case]
    if "vocab_size" in kwargs:
        return torch.randint(0, VOCAB, (batch, SEQ_LEN), generator=g)
    size = kwargs.get("image_size", 28)
    return torch.randn(batch, kwargs.get("in_channels", 1), size, size, generator=g)


def _expected_shape(case: str, batch: int) -> tuple[int, ...]:
    return (batch, SEQ_LEN, VOCAB) if "vocab_size" in CASES[case] else (batch, 10)


def test_every_registered_model_is_tested() -> None:
    assert {_model_name(c) for c in CASES} == set(MODELS)


# Models that take about a second to build: the shape test runs them with one batch size only.
BIG = {"resnet50"}


@pytest.mark.parametrize(
    ("case", "batch"),
    [(case, batch) for case in CASES for batch in (1, 2, 7) if case not in BIG or batch == 2],
)
def test_output_shape(case: str, batch: int) -> None:
    model = _build(case)
    for mode in (True, False):
        model.train(mode)
        out = model(_inputs(case, batch))
        assert isinstance(out, Tensor)
        assert out.shape == _expected_shape(case, batch)
        assert out.dtype == torch.float32


@pytest.mark.parametrize("case", CASES)
def test_backward_gives_finite_nonzero_gradient_for_every_parameter(case: str) -> None:
    model = _build(case).train()
    x = _inputs(case, batch=2)
    logits = model(x)
    targets = torch.randint(
        0, logits.shape[-1], logits.shape[:-1], generator=torch.Generator().manual_seed(1)
    )
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    for name, p in model.named_parameters():
        if any(name.endswith(f) for f in FROZEN.get(case, ())):
            assert not p.requires_grad and p.grad is None, name
            continue
        assert p.requires_grad, name
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize("case", CASES)
def test_one_step_under_bf16_autocast_runs_every_model(case: str) -> None:
    """What a GPU run with ``precision: bf16`` does (the CPU emulates bf16 where it has no units;
    the LSTM falls back to fp32 where oneDNN has no bf16 kernel): finite fp32 gradients."""
    model = _build(case).train()
    x = _inputs(case, batch=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    targets = torch.randint(
        0, logits.shape[-1], logits.shape[:-1], generator=torch.Generator().manual_seed(1)
    )
    F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def _same_parameters(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("case", CASES)
def test_seed_determines_parameters_and_outputs(case: str) -> None:
    a, b, c = _build(case, seed=0), _build(case, seed=0), _build(case, seed=1)
    assert _same_parameters(a, b)
    assert not _same_parameters(a, c)
    x = _inputs(case, batch=2)
    for m in (a, b, c):
        m.eval()
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
        assert not torch.allclose(a(x), c(x))


def test_lstm_lm_is_stateless() -> None:
    model = _build("lstm_lm").eval()
    x = _inputs("lstm_lm", batch=3)
    with torch.no_grad():
        first = model(x)
        model(_inputs("lstm_lm", batch=3, seed=7))  # a different batch in between changes nothing
        second = model(x)
    assert torch.equal(first, second)


def test_language_models_are_causal() -> None:
    # Changing the last token must leave the logits at every earlier position unchanged.
    for case in ("lstm_lm", "gpt2_small"):
        model = _build(case).eval()
        x = _inputs(case, batch=2)
        y = x.clone()
        y[:, -1] = (y[:, -1] + 1) % VOCAB
        with torch.no_grad():
            out_x, out_y = model(x), model(y)
        torch.testing.assert_close(out_x[:, :-1], out_y[:, :-1])
        assert not torch.allclose(out_x[:, -1], out_y[:, -1])


def test_lenet5_mnist_parameter_count() -> None:
    # conv1  1*6*5*5 + 6      =    156   (pad 2: 28x28 -> 28x28, pool -> 14x14)
    # conv2  6*16*5*5 + 16    =  2,416   (14x14 -> 10x10, pool -> 5x5)
    # fc1    16*5*5*120 + 120 = 48,120
    # fc2    120*84 + 84      = 10,164
    # fc3    84*10 + 10       =    850
    # total                   = 61,706
    assert count_parameters(build_model("lenet5")) == 61_706
    # CIFAR: conv1 gains 2 input channels (+300) and no padding is needed for 32x32.
    assert count_parameters(build_model("lenet5", in_channels=3, image_size=32)) == 62_006


def test_resnet20_parameter_count_matches_paper() -> None:
    # He et al. 2016, Table 6: 0.27M. Option-A shortcuts add no parameters.
    num_params = count_parameters(build_model("resnet20", in_channels=3, image_size=32))
    assert 260_000 <= num_params <= 280_000


def _state_checksum(model: nn.Module) -> tuple[str, float]:
    """(sha256 of the state dict's names, shapes and dtypes; a position-weighted sum of its values)."""
    state = model.state_dict()
    layout = "\n".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in state.items())
    total = 0.0
    for i, v in enumerate(state.values()):
        flat = v.detach().double().flatten()
        total += (i + 1) * float((flat * torch.linspace(1, 2, flat.numel(), dtype=torch.float64)).sum())
    return hashlib.sha256(layout.encode()).hexdigest(), total


def test_resnet20_is_unchanged_by_the_depth_option() -> None:
    # Computed with the code before CifarResNet took a depth (the class was ResNet20), seed 0, 10
    # classes. The names must match exactly (checkpoints); the values to float64 rounding, as torch's
    # normal_ may differ in the last bit between CPU kernels. A different init or RNG order moves the
    # sum by hundreds (seed 1 gives 149,379.86).
    torch.manual_seed(0)
    layout, total = _state_checksum(build_model("resnet20", in_channels=3, image_size=32))
    assert layout == "a09b21dad4eda442c9457909360ed5ba22f52d5262625c05ed76641fa7172941"
    assert total == pytest.approx(148_212.51054091685, abs=1e-2)
    torch.manual_seed(0)
    direct = CifarResNet(num_classes=10, in_channels=3)  # depth 20 by default
    torch.manual_seed(0)
    assert _same_parameters(direct, build_model("resnet20", in_channels=3, image_size=32))


def _cifar_resnet_parameters(n: int, num_classes: int = 10) -> int:
    # Convs have no bias; each BN has 2 parameters per channel; option-A shortcuts have none.
    stem = 3 * 16 * 9 + 2 * 16
    stages = 0
    for in_planes, planes in ((16, 16), (16, 32), (32, 64)):
        first = in_planes * planes * 9 + planes * planes * 9 + 4 * planes
        stages += first + (n - 1) * (2 * planes * planes * 9 + 4 * planes)
    return stem + stages + 64 * num_classes + num_classes


def test_cifar_resnet_parameter_counts_match_paper() -> None:
    # He et al. 2016, Table 6: ResNet-20 0.27M, ResNet-110 1.7M parameters.
    with torch.device("meta"):
        resnet20 = build_model("resnet20", in_channels=3, image_size=32)
        resnet110 = build_model("resnet110", in_channels=3, image_size=32)
    assert count_parameters(resnet20) == _cifar_resnet_parameters(3) == 269_722
    assert count_parameters(resnet110) == _cifar_resnet_parameters(18) == 1_727_962
    assert _weighted_layers(resnet20) == 20
    assert _weighted_layers(resnet110) == 110


def _weighted_layers(model: nn.Module) -> int:
    return sum(isinstance(m, nn.Conv2d | nn.Linear) for m in model.modules())


@pytest.mark.parametrize("depth", [8, 56])
def test_cifar_resnet_depth_is_its_number_of_weighted_layers(depth: int) -> None:
    with torch.device("meta"):
        model = CifarResNet(num_classes=10, in_channels=3, depth=depth)
    assert _weighted_layers(model) == depth
    assert count_parameters(model) == _cifar_resnet_parameters((depth - 2) // 6)


@pytest.mark.parametrize("depth", [2, 21, 108, 0, -4])
def test_cifar_resnet_rejects_a_depth_that_is_not_6n_plus_2(depth: int) -> None:
    with pytest.raises(ValueError, match=rf"6n\+2 .*got {depth}$"):
        CifarResNet(num_classes=10, in_channels=3, depth=depth)


def test_mlp_parameter_count() -> None:
    # 784*512+512 + 512*256+256 + 256*10+10
    assert count_parameters(build_model("mlp")) == 401_920 + 131_328 + 2_570


def test_vgg_small_width_scales_channels() -> None:
    full = count_parameters(build_model("vgg_small", in_channels=3, image_size=32))
    tiny = count_parameters(build_model("vgg_small", in_channels=3, image_size=32, width=0.125))
    assert tiny < full / 30


def test_tied_weights_are_counted_once() -> None:
    untied = count_parameters(build_model("lstm_lm", vocab_size=VOCAB, embed_dim=16, hidden_dim=16))
    tied = count_parameters(
        build_model("lstm_lm", vocab_size=VOCAB, embed_dim=16, hidden_dim=16, tie_weights=True)
    )
    assert untied - tied == VOCAB * 16
    model = build_model("lstm_lm", vocab_size=VOCAB, embed_dim=16, hidden_dim=16, tie_weights=True)
    assert model.decoder.weight is model.embedding.weight


def test_unknown_model_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="resnet21") as info:
        build_model("resnet21")
    for name in MODELS:
        assert name in str(info.value)


def test_unknown_option_names_it_and_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="hiden_sizes") as info:
        build_model("mlp", hiden_sizes=(8,))
    assert "hidden_sizes" in str(info.value)
    with pytest.raises(ValueError, match="width") as info:
        build_model("resnet20", width=2)
    with pytest.raises(ValueError, match="n_layers") as info:
        build_model("gpt2_small", vocab_size=VOCAB, n_layers=1)
    for allowed in ("n_layer", "n_head", "n_embd", "n_positions", "dropout"):
        assert allowed in str(info.value)


def test_lstm_tie_weights_needs_equal_dims() -> None:
    with pytest.raises(ValueError, match="embed_dim == hidden_dim"):
        build_model("lstm_lm", vocab_size=VOCAB, embed_dim=16, hidden_dim=32, tie_weights=True)


@pytest.mark.parametrize("name", ["lstm_lm", "gpt2_small"])
def test_language_models_need_vocab_size(name: str) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_model(name)


def test_vocab_size_for_an_image_model_warns() -> None:
    with pytest.warns(UserWarning, match="vocab_size"):
        build_model("lenet5", vocab_size=VOCAB)


def test_gpt2_rejects_sequences_longer_than_its_positions() -> None:
    model = _build("gpt2_small")
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.zeros(1, 17, dtype=torch.long))


# ---------------------------------------------------------------- TernGrad's AlexNets


def test_cifar10_alexnet_parameter_count() -> None:
    # conv1  5*5*3*64 + 64       =   4,864
    # conv2  5*5*64*64 + 64      = 102,464
    # fc3    (6*6*64)*384 + 384  = 885,120  (24x24 -> two SAME stride-2 pools -> 6x6)
    # fc4    384*192 + 192       =  73,920
    # logits 192*10 + 10         =   1,930
    assert count_parameters(build_model("cifar10_alexnet", in_channels=3, image_size=24)) == 1_068_298
    # 32x32 -> 8x8 before fc3: (8*8*64)*384 + 384 = 1,573,248.
    assert count_parameters(build_model("cifar10_alexnet", in_channels=3, image_size=32)) == 1_756_426


def test_cifar10_alexnet_layers_are_named_for_fp32_layers() -> None:
    names = {
        name for name, _ in build_model("cifar10_alexnet", in_channels=3, image_size=24).named_parameters()
    }
    assert names == {
        f"{layer}.{kind}"
        for layer in ("conv1", "conv2", "fc3", "fc4", "logits")
        for kind in ("weight", "bias")
    }


def test_cifar10_alexnet_pools_pad_like_tensorflow_same() -> None:
    # TF SAME on a 24-wide map with kernel 3, stride 2 pads one column after the input, none before:
    # window j covers [2j, 2j + 2], so the first output is the max of rows/columns 0..2.
    model = build_model("cifar10_alexnet", in_channels=3, image_size=24)
    x = torch.arange(24 * 24, dtype=torch.float32).view(1, 1, 24, 24)
    out = model.pool1(x)
    assert out.shape == (1, 1, 12, 12)
    assert out[0, 0, 0, 0] == x[0, 0, 2, 2]
    assert out[0, 0, -1, -1] == x[0, 0, 23, 23]


def test_cifar10_alexnet_lrn_matches_tensorflow_formula() -> None:
    # tf.nn.lrn(depth_radius=4, bias=1, alpha=0.001/9, beta=0.75): x / (1 + alpha * sum_window x^2)^beta
    model = build_model("cifar10_alexnet", in_channels=3, image_size=24)
    x = torch.randn(2, 64, 3, 3, generator=torch.Generator().manual_seed(0)) * 10
    padded = F.pad(x.square(), (0, 0, 0, 0, 4, 4))
    window_sum = sum(padded[:, k : k + 64] for k in range(9))
    expected = x / (1 + 0.001 / 9 * window_sum) ** 0.75
    torch.testing.assert_close(model.lrn1(x), expected)


@pytest.fixture(scope="module")
def imagenet_alexnet() -> nn.Module:
    return build_model("alexnet", num_classes=1000, in_channels=3, image_size=224).eval()


def test_alexnet_parameter_count() -> None:
    # features: 23,296 + 307,392 + 663,936 + 884,992 + 590,080            =  2,469,696
    # classifier: 9216*4096 + 4096 + 4096*4096 + 4096 + 4096*1000 + 1000 = 58,631,144
    with torch.device("meta"):  # shapes only: skips initialising 61M parameters
        imagenet = build_model("alexnet", num_classes=1000, in_channels=3, image_size=224)
        ten_classes = build_model("alexnet", in_channels=3, image_size=224)
    assert count_parameters(imagenet) == 61_100_840
    assert count_parameters(ten_classes) == 57_044_810


def test_alexnet_takes_imagenet_crops(imagenet_alexnet: nn.Module) -> None:
    with torch.no_grad():
        assert imagenet_alexnet(torch.randn(2, 3, 224, 224)).shape == (2, 1000)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("mlp", {"hidden_sizes": 8}, "model 'mlp' option hidden_sizes must be a list of integers, got 8 (int)"),
        ("alexnet", {"dropout": "0.2"}, "model 'alexnet' option dropout must be a number, got '0.2' (str)"),
        ("resnet50", {"zero_init_residual": "no"}, "model 'resnet50' option zero_init_residual must be true or false, got 'no'"),
        ("lstm_lm", {"num_layers": 2.0}, "model 'lstm_lm' option num_layers must be an integer, got 2.0 (float)"),
    ],
)  # fmt: skip
def test_an_option_of_the_wrong_type_names_the_model_and_the_type(
    name: str, options: dict, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        build_model(
            name, in_channels=3, image_size=224, vocab_size=VOCAB if "lm" in name else None, **options
        )
    assert str(info.value).startswith(message), str(info.value)
    with torch.device("meta"):  # an int where a number belongs, a tuple where a list does
        assert count_parameters(build_model("vgg_small", in_channels=3, image_size=32, width=1)) > 0
        assert count_parameters(build_model("mlp", hidden_sizes=(8,))) == 784 * 8 + 8 + 8 * 10 + 10


def test_alexnet_dropout_option() -> None:
    with torch.device("meta"):
        default = build_model("alexnet", in_channels=3, image_size=224)
        terngrad = build_model("alexnet", in_channels=3, image_size=224, dropout=0.2)
    assert [m.p for m in default.modules() if isinstance(m, nn.Dropout)] == [0.5, 0.5]
    assert [m.p for m in terngrad.modules() if isinstance(m, nn.Dropout)] == [0.2, 0.2]
    with pytest.raises(ValueError, match="alexnet dropout"):
        build_model("alexnet", in_channels=3, image_size=224, dropout=1.0)


def test_alexnet_state_dict_is_torchvisions(imagenet_alexnet: nn.Module) -> None:
    torchvision = pytest.importorskip("torchvision")
    theirs = torchvision.models.alexnet().eval()
    imagenet_alexnet.load_state_dict(theirs.state_dict())  # same names and shapes, or this raises
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(imagenet_alexnet(x), theirs(x))


def test_alexnet_rejects_too_small_inputs(imagenet_alexnet: nn.Module) -> None:
    with pytest.raises(ValueError, match=r"alexnet needs image_size >= 63 .*got 32"):
        build_model("alexnet", in_channels=3, image_size=32)
    with pytest.raises(ValueError, match=r"at least 63x63 .*\(32, 32\)"):
        imagenet_alexnet(torch.zeros(1, 3, 32, 32))


# ---------------------------------------------------------------- DGC's ResNet-50


RESNET50_BLOCKS = (3, 4, 6, 3)


@pytest.fixture(scope="module")
def small_resnet50() -> nn.Module:
    torch.manual_seed(0)
    return build_model("resnet50", in_channels=3, image_size=64).eval()


def test_resnet50_parameter_count_and_imagenet_output() -> None:
    with torch.device("meta"):
        imagenet = build_model("resnet50", num_classes=1000, in_channels=3, image_size=224)
        ten_classes = build_model("resnet50", in_channels=3, image_size=224)
    assert count_parameters(imagenet) == 25_557_032  # torchvision's resnet50
    assert count_parameters(ten_classes) == 25_557_032 - 2048 * 990 - 990
    names = {name.split(".")[0] for name, _ in imagenet.named_parameters()}
    assert names == {"conv1", "bn1", "layer1", "layer2", "layer3", "layer4", "fc"}
    for i, blocks in enumerate(RESNET50_BLOCKS, start=1):
        assert len(getattr(imagenet, f"layer{i}")) == blocks
    with torch.device("meta"):  # an ImageNet crop, shapes only
        assert imagenet(torch.empty(2, 3, 224, 224)).shape == (2, 1000)


def test_resnet50_is_torchvisions_v1_5(small_resnet50: nn.Module) -> None:
    # Same names, shapes, init and RNG order: the same seed gives the same parameters and outputs.
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    theirs = torchvision.models.resnet50(num_classes=10).eval()
    ours_state, their_state = small_resnet50.state_dict(), theirs.state_dict()
    assert list(ours_state) == list(their_state)
    for name, value in ours_state.items():
        assert torch.equal(value, their_state[name]), name
    # v1.5: the stride sits on the 3x3 conv, not on the first 1x1.
    assert small_resnet50.layer2[0].conv1.stride == (1, 1)
    assert small_resnet50.layer2[0].conv2.stride == (2, 2)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(small_resnet50(x), theirs(x))


def test_resnet50_zero_init_residual_zeroes_each_blocks_last_bn(small_resnet50: nn.Module) -> None:
    torch.manual_seed(0)
    zeroed = build_model("resnet50", in_channels=3, image_size=64, zero_init_residual=True)
    default, changed = small_resnet50.state_dict(), zeroed.state_dict()
    assert list(default) == list(changed)
    differing = {name for name in default if not torch.equal(default[name], changed[name])}
    expected = {
        f"layer{i}.{j}.bn3.weight" for i, blocks in enumerate(RESNET50_BLOCKS, start=1) for j in range(blocks)
    }
    assert differing == expected
    for name in expected:
        assert torch.all(changed[name] == 0), name
        assert torch.all(default[name] == 1), name  # off by default, as torchvision


def test_resnet50_rejects_too_small_inputs(small_resnet50: nn.Module) -> None:
    with pytest.raises(ValueError, match=r"resnet50 needs image_size >= 32 .*got 31"):
        build_model("resnet50", in_channels=3, image_size=31)
    with pytest.raises(ValueError, match=r"at least 32x32 .*\(16, 16\)"):
        small_resnet50(torch.zeros(1, 3, 16, 16))


def test_vgg16_bn_is_the_def_papers_cifar_model() -> None:
    channels = [c for stage in ((64, 64), (128, 128), (256,) * 3, (512,) * 3, (512,) * 3) for c in stage]
    convs = sum(9 * cin * cout + cout + 2 * cout for cin, cout in zip([3, *channels[:-1]], channels))
    classifier = (512 * 512 + 512) * 2 + 512 * 10 + 10
    model = build_model("vgg16_bn", in_channels=3, image_size=32)
    assert count_parameters(model) == convs + classifier == 15_253_578
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 13
    with pytest.raises(ValueError, match="vgg16_bn is the CIFAR model .* got image_size 64"):
        build_model("vgg16_bn", in_channels=3, image_size=64)


def test_airbench_parameter_count_is_airbench94s() -> None:
    # airbench94.py at base width 64: whitening 312, groups 13,824 + 36,864 + 147,456 + 589,824 +
    # 2 x 589,824 conv weights, 2 x 2 x (64 + 256 + 256) BatchNorm, fc 2,560
    model = build_model("airbench", in_channels=3, image_size=32, width=64)
    assert count_parameters(model) == 1_972_792


def test_airbench_whitening_decorrelates_the_patches_it_was_fitted_on() -> None:
    torch.manual_seed(0)
    mix = torch.tensor([[1.0, 0.8, 0.6], [0.0, 0.6, 0.5], [0.0, 0.0, 0.4]])
    images = torch.einsum("ij,bjhw->bihw", mix, torch.randn(64, 3, 12, 12)).contiguous()
    images = images + images.roll(1, dims=3)  # neighbouring pixels correlate as in photographs
    model = build_model("airbench", in_channels=3, image_size=32, width=4)
    before = model.whiten.weight.clone()
    model.init_from_data(images, eps=0.0)
    assert model.whitened and not torch.equal(before, model.whiten.weight)
    assert not model.whiten.weight.requires_grad
    with torch.no_grad():
        out = F.conv2d(images, model.whiten.weight[:12])  # the first half: the whitening filters
    flat = out.permute(0, 2, 3, 1).reshape(-1, 12).double()
    covariance = flat.T @ flat / flat.shape[0]
    assert torch.allclose(covariance, torch.eye(12, dtype=torch.float64), atol=1e-3)
    # the second half is the negation (GELU then keeps both signs of each component)
    assert torch.equal(model.whiten.weight[12:], -model.whiten.weight[:12])


def test_airbench_without_whitening_trains_its_stem() -> None:
    model = build_model("airbench", in_channels=3, image_size=32, width=4, whiten=False)
    before = model.whiten.weight.clone()
    model.init_from_data(torch.randn(4, 3, 32, 32))
    assert model.whiten.weight.requires_grad and torch.equal(before, model.whiten.weight)


def test_airbench_rejects_bad_width() -> None:
    with pytest.raises(ValueError, match="airbench width must be a positive integer, got 0"):
        build_model("airbench", in_channels=3, image_size=32, width=0)


def test_airbench_bn_eps_reaches_every_norm_and_bounds_a_flat_channel() -> None:
    default = build_model("airbench", in_channels=1, image_size=28, width=4)
    model = build_model("airbench", in_channels=1, image_size=28, width=4, bn_eps=1e-5)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 6 and all(m.eps == 1e-5 for m in norms)
    assert all(m.eps == 1e-12 for m in default.modules() if isinstance(m, torch.nn.BatchNorm2d))
    # a channel whose batch variance is ~0 (MNIST's constant background): the gradient through BN
    # scales with 1/sqrt(var + eps), so eps bounds it
    x = torch.full((8, 4, 6, 6), 0.5)
    x[0, 0, 0, 0] += 1e-6
    grads = {}
    for eps in (1e-12, 1e-5):
        norm = torch.nn.BatchNorm2d(4, eps=eps)
        xi = x.clone().requires_grad_(True)
        (norm(xi)[:, 0] * torch.arange(8.0)[:, None, None]).sum().backward()
        grads[eps] = xi.grad.abs().max().item()
    assert grads[1e-12] > 1e3 * grads[1e-5]  # ~sqrt(1e-5 / 1e-12) = 3162
    for bad in (0, -1e-5, 1.5):
        with pytest.raises(ValueError, match=rf"airbench bn_eps must be a number in \(0, 1\), got {bad!r}"):
            build_model("airbench", in_channels=1, image_size=28, width=4, bn_eps=bad)
    for bad in (True, "1e-5"):
        with pytest.raises(
            ValueError, match=rf"model 'airbench' option bn_eps must be a number, got {bad!r}"
        ):
            build_model("airbench", in_channels=1, image_size=28, width=4, bn_eps=bad)


@pytest.mark.parametrize("supported", [True, False])
def test_the_lstm_trains_under_bf16_autocast_on_every_cpu(monkeypatch, supported):
    """oneDNN has no bf16 LSTM on CPUs without AVX512-BF16 or AMX (the suite's Shakespeare runs
    failed there); the model then runs its recurrence in fp32 under bf16 autocast, exactly the
    fp32 LSTM's, and the rest in bf16."""
    import trainer.models.language as models

    if supported and not models.bf16_lstm_supported():
        pytest.skip("this CPU has no bf16 LSTM (the fp32 fallback is the other case)")
    monkeypatch.setattr(models, "bf16_lstm_supported", lambda: supported)
    torch.manual_seed(0)
    model = build_model("lstm_lm", vocab_size=50, embed_dim=16, hidden_dim=16, num_layers=2, dropout=0.0)
    x = torch.randint(0, 50, (2, 8))
    seen: list[torch.Tensor] = []
    model.decoder.register_forward_hook(lambda m, inputs, out: seen.append(inputs[0].detach()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    logits.float().sum().backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    if not supported:
        reference, _ = model.lstm(model.embedding(x))  # with autograd on, as in the model's forward
        assert seen[0].dtype == torch.float32
        torch.testing.assert_close(
            seen[0], reference.detach(), rtol=1e-6, atol=1e-7
        )  # the recurrence in fp32
