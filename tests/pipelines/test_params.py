"""A params.yaml value of the wrong type is refused with the file and the run named."""

import pytest

import pipelines.common as pipelines_common


def test_a_wrong_type_names_the_run_and_the_params_file(monkeypatch):
    monkeypatch.setattr(pipelines_common, "run_values", lambda *args: {"momentum": "0.9"})
    with pytest.raises(
        ValueError,
        match=r"^pipelines/baseline/params.yaml, run 'fp32': momentum must be a number in \[0, 1\)",
    ):
        pipelines_common.run_config("baseline", "fp32")


def test_a_compressor_option_of_the_wrong_type_names_the_run_and_the_params_file(monkeypatch):
    values = {"compressor": "dgc", "compressor_options": {"density": 0.01, "resample": "no"}}
    monkeypatch.setattr(pipelines_common, "run_values", lambda *args: values)
    with pytest.raises(
        ValueError,
        match=r"^pipelines/baseline/params.yaml, run 'fp32': compressor 'dgc' option resample must be true or "
        r"false, got 'no' \(str\)$",
    ):
        pipelines_common.run_config("baseline", "fp32")


def test_a_stretched_run_is_the_recipe_n_times_as_long():
    from harness.params import stretched

    recipe = {"epochs": 10, "lr_warmup_steps": 200, "max_steps": None, "lr_milestones": [3, 6], "lr": 0.4}
    assert stretched(recipe, 2) == {
        "epochs": 20, "lr_warmup_steps": 400, "max_steps": None, "lr_milestones": [6, 12], "lr": 0.4
    }  # fmt: skip
    assert stretched({"epochs": 1, "max_steps": 6}, 4) == {"epochs": 4, "max_steps": 24}
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"stretch must be a positive integer .* got {bad!r}"):
            stretched(recipe, bad)
    with pytest.raises(ValueError, match="stretch: 2 needs the run to name its epochs"):
        stretched({"lr": 0.4}, 2)


def test_the_launchers_stretch_makes_every_run_of_a_launch_longer(monkeypatch):
    from pipelines.train import STRETCH_ENV, parse_stretch, resolve_config

    recipe = resolve_config("suite", "mnist_fp32", "smoke")
    monkeypatch.setenv(STRETCH_ENV, "2")
    longer = resolve_config("suite", "mnist_fp32", "smoke")
    assert (longer.epochs, longer.max_steps, longer.lr_warmup_steps) == (
        2 * recipe.epochs, 2 * recipe.max_steps, 2 * recipe.lr_warmup_steps
    )  # fmt: skip
    monkeypatch.delenv(STRETCH_ENV)
    assert longer == resolve_config("suite", "mnist_fp32x2", "smoke")  # the same as params' `stretch: 2`
    with pytest.raises(ValueError, match="--stretch '0': expected a positive integer"):
        parse_stretch("0")
