"""Typed configs: YAML loading, --set overrides and validation errors that name the field and the reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from fedarena.platform import config as cfgmod
from fedarena.platform.cli import main
from fedarena.platform.config import ConfigError
from fedarena.platform.experiment import ExperimentConfig, param


@dataclass(frozen=True)
class Inner:
    lr: float = param(0.1, "learning rate")
    layers: list[int] = param(doc="hidden sizes", factory=lambda: [64, 64])


@dataclass(frozen=True)
class Schema(ExperimentConfig):
    iterations: int = param(10, "iterations")
    mode: Literal["fast", "exact"] = param("exact", "mode")
    inner: Inner = param(doc="inner section", factory=Inner)
    label: str | None = param(None, "optional label")


def test_build_applies_defaults_and_values():
    cfg = cfgmod.build(Schema, {"kind": "x", "iterations": 5, "inner": {"lr": 1}, "checkpoint": {"every": 7}})
    assert cfg.iterations == 5 and cfg.inner.lr == 1.0 and isinstance(cfg.inner.lr, float)
    assert cfg.inner.layers == [64, 64] and cfg.checkpoint.every == 7 and cfg.checkpoint.keep == 3
    assert cfg.label is None and cfg.cluster.address is None


@pytest.mark.quick
def test_unknown_key_suggests_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'iteratons'; did you mean 'iterations'\?"):
        cfgmod.build(Schema, {"iteratons": 3})
    with pytest.raises(ConfigError, match=r"unknown config key 'inner.lrr'; did you mean 'inner.lr'\?"):
        cfgmod.build(Schema, {"inner": {"lrr": 3}})


@pytest.mark.parametrize(
    "data, message",
    [
        ({"iterations": "ten"}, r"iterations: expected int, got 'ten' \(str\)"),
        ({"iterations": True}, r"iterations: expected int, got True \(bool\)"),
        ({"iterations": 2.5}, r"iterations: expected int, got 2.5 \(float\)"),
        ({"inner": {"lr": "fast"}}, r"inner.lr: expected float, got 'fast' \(str\)"),
        ({"inner": {"layers": [1, "x"]}}, r"inner.layers\[1\]: expected int, got 'x' \(str\)"),
        ({"inner": 3}, r"inner: expected a mapping of fields, got 3 \(int\)"),
        ({"mode": "fsat"}, r"mode: expected one of 'fast', 'exact', got 'fsat' \(str\); did you mean 'fast'\?"),
        ({"label": 4}, r"label: expected str or null, got 4 \(int\)"),
    ],
)
@pytest.mark.quick
def test_wrong_type_names_field_expected_and_given(data, message):
    with pytest.raises(ConfigError, match=message):
        cfgmod.build(Schema, data)


def test_float_accepts_yaml_scientific_strings():
    assert cfgmod.build(Schema, {"inner": {"lr": "1e-3"}}).inner.lr == 1e-3


def test_overrides_parse_yaml_values_and_nest():
    data = cfgmod.apply_overrides({"inner": {"lr": 0.1}}, ["inner.lr=0.5", "inner.layers=[8, 8]", "label=hi"])
    assert data == {"inner": {"lr": 0.5, "layers": [8, 8]}, "label": "hi"}


@pytest.mark.parametrize("bad", ["iterations", "=3", "a..b=1", "inner.lr=[1,", "a b=1"])
def test_bad_override_syntax(bad):
    with pytest.raises(ConfigError, match="bad --set"):
        cfgmod.apply_overrides({}, [bad])


def test_override_into_a_value_is_an_error():
    with pytest.raises(ConfigError, match="'iterations' is a value, not a section"):
        cfgmod.apply_overrides({"iterations": 3}, ["iterations.x=1"])


def test_missing_file_and_malformed_yaml_give_the_line(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        cfgmod.load_yaml(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: matrix_dynamics\niterations: [1, 2\nseed: 3\n")
    with pytest.raises(ConfigError, match=r"malformed YAML in .*bad.yaml at line \d+, column \d+"):
        cfgmod.load_yaml(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        cfgmod.load_yaml(scalar)


@pytest.mark.quick
def test_round_trip_through_yaml(tmp_path):
    cfg = cfgmod.build(Schema, {"kind": "x", "inner": {"layers": [3]}, "mode": "fast"})
    path = tmp_path / "c.yaml"
    path.write_text(cfgmod.dump_yaml(cfg))
    assert cfgmod.build(Schema, cfgmod.load_yaml(path)) == cfg


def test_describe_lists_every_field_with_its_doc():
    text = "\n".join(cfgmod.describe(Schema))
    for needle in ("iterations: 10", "# int; iterations", "inner:", "lr: 0.1", "learning rate", "checkpoint:"):
        assert needle in text


# ----------------------------------------------------------------------------- through the CLI: exit 2, one line


def _cli_error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


def test_cli_unknown_key(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("kind: matrix_dynamics\niteratons: 10\n")
    err = _cli_error(capsys, ["show", str(path)])
    assert "unknown config key 'iteratons'; did you mean 'iterations'?" in err


def test_cli_wrong_type_via_set(capsys):
    err = _cli_error(capsys, ["show", "experiments/quickstart.yaml", "--set", "iterations=lots"])
    assert "iterations: expected int, got 'lots' (str)" in err


def test_cli_missing_file(capsys):
    err = _cli_error(capsys, ["run", "experiments/does_not_exist.yaml"])
    assert "config file not found: experiments/does_not_exist.yaml" in err


def test_cli_malformed_yaml(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("kind: matrix_dynamics\ngame: [rock\n")
    err = _cli_error(capsys, ["run", str(path), "--out", str(tmp_path / "r")])
    assert "malformed YAML" in err and "line 3" in err


def test_cli_bad_set_syntax(capsys):
    err = _cli_error(capsys, ["show", "experiments/quickstart.yaml", "--set", "iterations"])
    assert "bad --set 'iterations': expected key.path=value" in err


def test_cli_unknown_kind_and_invalid_value(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("kind: matrix_dynamic\n")
    assert "unknown experiment kind 'matrix_dynamic'; did you mean 'matrix_dynamics'?" in _cli_error(capsys, ["show", str(path)])
    err = _cli_error(capsys, ["show", "experiments/quickstart.yaml", "--set", "iterations=0"])
    assert "iterations: must be at least 1" in err
    err = _cli_error(capsys, ["run", "experiments/quickstart.yaml", "--set", "game=rock_paper", "--out", str(tmp_path / "r")])
    assert "unknown matrix game 'rock_paper'" in err


def test_cli_debug_shows_traceback(capsys):
    with pytest.raises(ConfigError):
        main(["--debug", "show", "experiments/quickstart.yaml", "--set", "iterations=lots"])


def test_cli_show_and_list(capsys):
    assert main(["show", "experiments/quickstart.yaml", "--set", "iterations=5"]) == 0
    out = capsys.readouterr().out
    assert "kind: matrix_dynamics" in out and "iterations: 5" in out and "every: 1000" in out
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "matrix_dynamics" in out and "quickstart.yaml" in out and "prisoners_dilemma.yaml" in out


def test_cli_help_on_each_command(capsys):
    for argv in (["--help"], ["run", "--help"], ["list", "--help"], ["show", "--help"], ["report", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
        assert "usage: fedarena" in capsys.readouterr().out


def test_errors_from_a_yaml_file_name_the_file_and_the_line_of_the_key(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("# header\nkind: x\niterations: 3\ninner:\n  lr: 0.1\n\n  layrs: [3]\nmode: fast\n")
    data = cfgmod.load_yaml(path)
    with pytest.raises(ConfigError, match=rf"unknown config key 'inner.layrs'.*\({path}, line 7\)$"):
        cfgmod.build(Schema, data)
    bad_type = cfgmod.load_yaml(path)
    bad_type["inner"].pop("layrs")
    with pytest.raises(ConfigError, match=rf"iterations: expected int, got 'many' \(str\) \(from --set\)$"):
        cfgmod.build(Schema, cfgmod.apply_overrides(bad_type, ["iterations=many"]))
    path.write_text("kind: x\nmode: slow\n")
    with pytest.raises(ConfigError, match=rf"mode: expected one of .* \({path}, line 2\)$"):
        cfgmod.build(Schema, cfgmod.load_yaml(path))


def test_post_init_errors_from_a_yaml_file_name_the_line(tmp_path):
    path = tmp_path / "xfp.yaml"
    path.write_text("kind: xfp\ngame: kuhn_poker\n\niterations: 0\n")
    with pytest.raises(ConfigError, match=rf"iterations: must be at least 1, got 0 \({path}, line 4\)$"):
        from fedarena.platform.runs import resolve

        resolve(path)


def test_a_loaded_yaml_mapping_dumps_as_plain_yaml(tmp_path):
    import yaml

    path = tmp_path / "exp.yaml"
    path.write_text("kind: x\ninner: {lr: 0.5}\n")
    assert yaml.safe_dump(cfgmod.plain(cfgmod.load_yaml(path))) == "inner:\n  lr: 0.5\nkind: x\n"
