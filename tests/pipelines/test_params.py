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
