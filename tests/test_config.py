import subprocess
import sys

import pytest

from posttrain.config import ConfigError, RunConfig, field_reference, load_config


def write(tmp_path, text):
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_defaults_are_valid_and_documented():
    cfg = RunConfig()
    assert cfg.model.name == "smollm2-135m-instruct" and cfg.algorithm.name == "grpo"
    rows = field_reference()
    assert len(rows) > 30
    assert all(description for _, _, description in rows), "every field needs a description"


def test_overrides_apply_and_parse_types(tmp_path):
    p = write(tmp_path, "train:\n  steps: 5\n")
    cfg = load_config(p, ["train.steps=7", "algorithm.beta=0.04", "model.lora.enabled=true", "env.kwargs.difficulty=3"])
    assert cfg.train.steps == 7 and cfg.algorithm.beta == 0.04 and cfg.model.lora.enabled
    assert cfg.env.kwargs == {"difficulty": 3}


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        ("train:\n  learning_rte: 1e-5\n", [], "unknown key 'train.learning_rte' (did you mean 'train.learning_rate'?)"),
        ("trian:\n  steps: 1\n", [], "unknown key 'trian' (did you mean 'train'?)"),
        ("train:\n  steps: many\n", [], "'train.steps': Input should be a valid integer"),
        ("algorithm:\n  loss_aggregation: tokens\n", [], "'algorithm.loss_aggregation'"),
        ("", ["algorithm.group_size=1"], "'algorithm.group_size': Input should be greater than or equal to 2"),
        ("", ["train.minibatch_size=5"], "train.minibatch_size (5) must divide the batch"),
        ("", ["steps"], "expected KEY=VALUE"),
        ("- a\n- b\n", [], "expected a mapping"),
        ("train: [\n", [], "not valid YAML"),
    ],
)
def test_errors_name_the_key(tmp_path, text, overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text), overrides)
    assert message in str(e.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found: nope.yaml"):
        load_config("nope.yaml")


def test_cli_misspelled_key_exits_2_without_traceback(tmp_path):
    p = write(tmp_path, "model:\n  name: tiny-random\nalgorithm:\n  bta: 0.1\n")
    proc = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", str(p)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "unknown key 'algorithm.bta'" in proc.stderr and "did you mean 'algorithm.beta'" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_cli_unknown_model_and_env_exit_2(tmp_path):
    for overrides, expected in ((["--set", "model.name=no-such-model"], "unknown model 'no-such-model'"),
                                (["--set", "model.name=tiny-random", "--set", "env.id=nope"], "env.id 'nope' is not registered")):
        proc = subprocess.run([sys.executable, "-m", "posttrain.cli", "eval", str(write(tmp_path, "")), *overrides],
                              capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert expected in proc.stderr and "Traceback" not in proc.stderr


def test_readme_config_reference_is_current():
    from pathlib import Path

    from posttrain.config import reference_markdown

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert reference_markdown() in readme, "regenerate the README table with `posttrain config`"


def test_algorithm_presets_fill_only_unset_fields(tmp_path):
    cfg = load_config(write(tmp_path, "algorithm:\n  name: dapo\n"))
    assert (cfg.algorithm.epsilon_high, cfg.algorithm.dynamic_sampling, cfg.algorithm.loss_aggregation) == (0.28, True, "token")
    cfg = load_config(write(tmp_path, "algorithm:\n  name: dapo\n  epsilon_high: 0.25\n"))
    assert cfg.algorithm.epsilon_high == 0.25 and cfg.algorithm.dynamic_sampling
    cfg = load_config(write(tmp_path, ""), ["algorithm.name=dr_grpo"])
    assert cfg.algorithm.scale_rewards is False and cfg.algorithm.loss_aggregation == "constant"
    assert load_config(write(tmp_path, "")).algorithm.scale_rewards is True


def test_algorithm_kl_placement_errors(tmp_path):
    with pytest.raises(ConfigError, match="gspo has no KL term"):
        load_config(write(tmp_path, ""), ["algorithm.name=gspo", "algorithm.beta=0.1"])
    with pytest.raises(ConfigError, match="kl_in_reward is supported by reinforce_pp and ppo"):
        load_config(write(tmp_path, ""), ["algorithm.kl_in_reward=true"])
