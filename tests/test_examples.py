"""Every example script's settings load as a valid config, on the GPU recipe and on the CPU demo config."""

from __future__ import annotations

import re
import shlex

import pytest
from helpers import REPO

from easyr1.config import load_config


ALGORITHM_SCRIPTS = sorted((REPO / "examples").glob("qwen2_5_vl_7b_geo3k_*.sh"))
# every recipe: one per algorithm on Qwen2.5-VL-7B, one per other model family
SCRIPTS = sorted((REPO / "examples").glob("*.sh"))


def script_overrides(path) -> list[str]:
    """The key=value arguments the script passes to easyr1.main (shell variables replaced by test values)."""
    text = path.read_text().replace("\\\n", " ")
    command = next(line for line in text.splitlines() if "easyr1.main" in line)
    command = command.replace('"${CONFIG}"', "CONFIG").replace('"${MODEL_PATH}"', "MODEL").replace('"$@"', "")
    return [arg for arg in shlex.split(command) if re.match(r"^[a-z_]+(\.[a-z_]+)+=", arg)]


def test_there_is_a_script_per_algorithm():
    names = {path.stem.removeprefix("qwen2_5_vl_7b_geo3k_") for path in ALGORITHM_SCRIPTS}
    assert {"grpo", "dapo", "gspo", "cispo", "sapo", "reinforce", "rloo", "remax", "ppo"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
@pytest.mark.parametrize("config", ["config.yaml", "config_cpu.yaml"])
def test_script_settings_load(script, config):
    overrides = script_overrides(script)
    assert overrides, f"{script.name} passes no settings"
    loaded = load_config(
        [f"config={REPO / 'examples' / config}", "worker.actor.model.model_path=/models/m", *overrides]
    )
    for override in overrides:
        key, value = override.split("=", 1)
        if key == "worker.reward.reward_function":
            continue  # made absolute
        actual = loaded
        for part in key.split("."):
            actual = actual[part] if isinstance(actual, dict) else getattr(actual, part)
        assert str(actual).lower() == value.lower() or float(actual) == pytest.approx(float(value)), key


def test_each_new_family_has_a_recipe():
    families = {path.stem.split("_geo3k_")[0] for path in SCRIPTS}
    assert "internvl3_5_8b" in families
    text = (REPO / "examples" / "internvl3_5_8b_geo3k_grpo.sh").read_text()
    assert "OpenGVLab/InternVL3_5-8B-HF" in text
