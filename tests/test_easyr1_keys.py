"""EasyR1's whole key set loads: a config dumped by an EasyR1 run (every key of its ``PPOConfig`` at commit b44b311,
in the form its ``post_init`` leaves them) loads and keeps its values, the split reward function is joined, the
compatibility-only keys are named when set, and docs/easyr1-compatibility.md agrees with the code.

:data:`EASYR1_DEFAULTS` is EasyR1's config at its defaults after ``deep_post_init`` (mirrors filled in, the reward
function split), written out as data; ``save_checkpoint_path`` is left null (EasyR1 fills it from the project and
experiment names, as the config here does).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from easyr1.config import PPOConfig, compatibility_only_keys, compatibility_only_settings, load_config, to_dict
from easyr1.config.fields import (
    acts_through,
    default_of,
    get_key,
    is_compatibility_only,
    is_section,
    iter_fields,
    mirror_source,
)
from easyr1.config.loading import _RENAMED_KEYS
from easyr1.errors import ConfigError


DOC = Path(__file__).resolve().parents[1] / "docs" / "easyr1-compatibility.md"

_LORA = {"rank": 0, "alpha": 64, "target_modules": "all-linear", "exclude_modules": None}
_MODEL = {
    "model_path": None,
    "tokenizer_path": None,
    "override_config": {},
    "enable_gradient_checkpointing": True,
    "trust_remote_code": True,
    "freeze_vision_tower": False,
    "lora": _LORA,
}
_OPTIM = {
    "lr": 1e-6,
    "betas": [0.9, 0.999],
    "weight_decay": 1e-2,
    "strategy": "adamw",
    "lr_warmup_ratio": 0.0,
    "lr_warmup_steps": None,
    "min_lr_ratio": None,
    "lr_scheduler_type": "constant",
    "training_steps": -1,
}
_FSDP = {
    "enable_full_shard": True,
    "enable_cpu_offload": False,
    "enable_rank0_init": True,
    "use_orig_params": False,
    "torch_dtype": None,
    "fsdp_size": -1,
    "mp_param_dtype": "bf16",
    "mp_reduce_dtype": "fp32",
    "mp_buffer_dtype": "fp32",
}
_OFFLOAD = {"offload_params": False, "offload_optimizer": False}

EASYR1_DEFAULTS: dict[str, Any] = {
    "data": {
        "train_files": "",
        "val_files": "",
        "prompt_key": "prompt",
        "answer_key": "answer",
        "image_key": "images",
        "video_key": "videos",
        "image_dir": None,
        "video_fps": 2.0,
        "max_prompt_length": 512,
        "max_response_length": 512,
        "rollout_batch_size": 512,
        "mini_rollout_batch_size": None,
        "val_batch_size": -1,
        "format_prompt": None,
        "override_chat_template": None,
        "shuffle": True,
        "seed": 1,
        "min_pixels": 262144,
        "max_pixels": 4194304,
        "filter_overlong_prompts": True,
        "filter_overlong_prompts_workers": 16,
    },
    "worker": {
        "hybrid_engine": True,
        "actor": {
            "strategy": "fsdp",
            "global_batch_size": 256,
            "micro_batch_size_per_device_for_update": 4,
            "micro_batch_size_per_device_for_experience": 16,
            "max_grad_norm": 1.0,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.3,
            "clip_ratio_dual": 3.0,
            "loss_avg_mode": "token",
            "loss_type": "default",
            "ppo_epochs": 1,
            "padding_free": True,
            "dynamic_batching": True,
            "ulysses_size": 1,
            "use_torch_compile": True,
            "tau_positive": 1.0,
            "tau_negative": 1.05,
            "model": _MODEL,
            "optim": _OPTIM,
            "fsdp": _FSDP,
            "offload": _OFFLOAD,
            "global_batch_size_per_device": -1,
            "disable_kl": False,
            "use_kl_loss": False,
            "kl_penalty": "kl",
            "kl_coef": 1e-3,
        },
        "critic": {
            "strategy": "fsdp",
            "global_batch_size": 256,
            "micro_batch_size_per_device_for_update": 4,
            "micro_batch_size_per_device_for_experience": 16,
            "max_grad_norm": 1.0,
            "cliprange_value": 0.5,
            "loss_avg_mode": "token",
            "ppo_epochs": 1,
            "padding_free": False,
            "dynamic_batching": True,
            "ulysses_size": 1,
            "model": _MODEL,
            "optim": _OPTIM,
            "fsdp": _FSDP,
            "offload": _OFFLOAD,
            "global_batch_size_per_device": -1,
        },
        "ref": {
            "strategy": "fsdp",
            "fsdp": _FSDP,
            "offload": _OFFLOAD,
            "micro_batch_size_per_device_for_experience": 16,
            "padding_free": True,
            "dynamic_batching": True,
            "ulysses_size": 1,
            "use_torch_compile": True,
        },
        "reward": {
            "reward_function": None,
            "reward_function_kwargs": {},
            "skip_special_tokens": True,
            "num_cpus": 1,
            "reward_function_name": None,
        },
        "rollout": {
            "name": "vllm",
            "n": 1,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "seed": 1,
            "limit_images": 0,
            "dtype": "bf16",
            "gpu_memory_utilization": 0.6,
            "ignore_eos": False,
            "enforce_eager": False,
            "enable_chunked_prefill": False,
            "tensor_parallel_size": 2,
            "max_model_len": None,
            "max_num_batched_tokens": 8192,
            "disable_log_stats": True,
            "disable_tqdm": False,
            "val_override_config": {},
            "prompt_length": 512,
            "response_length": 512,
            "trust_remote_code": True,
        },
    },
    "algorithm": {
        "gamma": 1.0,
        "lam": 1.0,
        "adv_estimator": "grpo",
        "disable_kl": False,
        "use_kl_loss": False,
        "kl_penalty": "kl",
        "kl_coef": 1e-3,
        "kl_type": "fixed",
        "kl_horizon": 10000.0,
        "kl_target": 0.1,
        "online_filtering": False,
        "filter_key": "overall",
        "filter_low": 0.01,
        "filter_high": 0.99,
    },
    "trainer": {
        "total_epochs": 15,
        "max_steps": None,
        "project_name": "easy_r1",
        "experiment_name": "demo",
        "logger": ["console", "wandb"],
        "nnodes": 1,
        "n_gpus_per_node": 8,
        "max_try_make_batch": 20,
        "critic_warmup": 0,
        "val_freq": -1,
        "val_before_train": True,
        "val_only": False,
        "val_generations_to_log": 0,
        "save_freq": -1,
        "save_limit": -1,
        "save_model_only": False,
        "save_checkpoint_path": None,
        "load_checkpoint_path": None,
        "ray_timeline": None,
        "find_last_checkpoint": True,
    },
}

# Dict-valued keys: one value each, not sections.
_DICT_VALUES = {"override_config", "val_override_config", "reward_function_kwargs"}


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of a nested config dict."""
    flat: dict[str, Any] = {}
    for name, value in tree.items():
        if isinstance(value, dict) and name not in _DICT_VALUES:
            flat.update(leaves(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def value_fields() -> dict[str, Any]:
    """Every value key of PPOConfig and its dataclass field."""
    return {key: item for key, item, hint in iter_fields(PPOConfig) if not is_section(hint)}


def plain(value: Any) -> Any:
    """Tuples as lists, as YAML and JSON give them."""
    return list(value) if isinstance(value, tuple) else value


def easyr1_dump(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Path]]:
    """An EasyR1 run's dump: the defaults plus what a run sets (local paths, made absolute as EasyR1 does) and
    what the trainer fills in (the step count). Returns the dump and the paths it names."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")  # the config checks read no model
    paths = {"model": model, "train": tmp_path / "train.jsonl", "val": tmp_path / "val.jsonl"}
    paths |= {"reward": tmp_path / "reward.py", "checkpoints": tmp_path / "checkpoints" / "easy_r1" / "demo"}
    paths["reward"].write_text("def compute_score(reward_inputs):\n    return []\n", encoding="utf-8")
    dump = copy.deepcopy(EASYR1_DEFAULTS)
    dump["data"] |= {"train_files": str(paths["train"]), "val_files": str(paths["val"])}
    actor, critic = dump["worker"]["actor"], dump["worker"]["critic"]
    actor["model"] |= {"model_path": str(model), "tokenizer_path": str(model)}
    # EasyR1 itself refuses its default grpo with n=1 (GRPO needs n > 1): a dump of a run has a group size
    dump["worker"]["rollout"]["n"] = 5
    dump["worker"]["reward"] |= {"reward_function": str(paths["reward"]), "reward_function_name": "compute_score"}
    dump["trainer"]["save_checkpoint_path"] = str(paths["checkpoints"])
    actor["optim"]["training_steps"] = critic["optim"]["training_steps"] = 45
    return dump, paths


def write_dump(dump: dict[str, Any], directory: Path, form: str) -> Path:
    """The dump as EasyR1 writes it: ``json`` (printed at start, and the file logger's experiment_config.json),
    ``console`` (the console logger's yaml.dump: tuples tagged !!python/tuple), or plain ``yaml``."""
    if form == "json":
        path = directory / "experiment_config.json"
        path.write_text(json.dumps(dump, indent=2), encoding="utf-8")
    elif form == "console":
        tupled = copy.deepcopy(dump)
        tupled["trainer"]["logger"] = tuple(tupled["trainer"]["logger"])
        for role in ("actor", "critic"):
            optim = tupled["worker"][role]["optim"]
            optim["betas"] = tuple(optim["betas"])
        path = directory / "console.yaml"
        path.write_text(yaml.dump(tupled, indent=2), encoding="utf-8")
        assert "!!python/tuple" in path.read_text(encoding="utf-8")
    else:
        path = directory / "dump.yaml"
        path.write_text(yaml.safe_dump(dump), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------- the dump


def test_the_key_set_is_easyr1s_and_every_key_exists_here():
    keys = leaves(EASYR1_DEFAULTS)
    assert len(keys) == 193
    fields = value_fields()
    assert [key for key in keys if key not in fields] == []


@pytest.mark.parametrize("form", ["json", "console", "yaml"])
def test_an_easyr1_dump_loads_and_keeps_its_values(tmp_path, form):
    dump, paths = easyr1_dump(tmp_path)
    config = load_config([f"config={write_dump(dump, tmp_path, form)}"])
    loaded = leaves(to_dict(config))
    model = str(paths["model"])
    # keys whose value is translated on loading; every other key keeps the dump's value
    translated = {
        "worker.actor.loss_avg_mode": None,  # consumed into loss_agg_mode
        "worker.actor.loss_type": "ppo",  # EasyR1's "default"
        "worker.reward.reward_function": f"{paths['reward']}:compute_score",
        "worker.reward.reward_function_name": None,  # joined into reward_function
        "worker.critic.model.model_path": model,  # null: the actor's model
        "worker.critic.model.tokenizer_path": model,
    }
    expected = {key: translated.get(key, value) for key, value in leaves(dump).items()}
    assert {key: loaded[key] for key in expected} == expected
    assert config.worker.actor.loss_agg_mode == "token-mean"
    assert compatibility_only_settings(config) == []  # nothing set away from EasyR1's defaults: no notice


def test_easyr1_defaults_validate_but_for_the_group_size_easyr1_refuses_too(tmp_path):
    dump, _ = easyr1_dump(tmp_path)
    dump["worker"]["rollout"]["n"] = 1  # EasyR1's own default: its trainer stops on grpo with n=1
    with pytest.raises(ConfigError) as info:
        load_config([f"config={write_dump(dump, tmp_path, 'yaml')}"])
    assert str(info.value) == (
        "algorithm.adv_estimator=grpo compares responses to the same prompt and needs worker.rollout.n >= 2 (got 1)"
    )


def test_a_dumped_mirror_that_disagrees_with_its_source_is_refused(tmp_path):
    dump, _ = easyr1_dump(tmp_path)
    dump["worker"]["ref"]["padding_free"] = False
    with pytest.raises(ConfigError, match="'worker.ref.padding_free' .* is copied from 'worker.actor.padding_free'"):
        load_config([f"config={write_dump(dump, tmp_path, 'yaml')}"])


# ---------------------------------------------------------------------------------------------------- reward name

REQUIRED = ["worker.actor.model.model_path=/models/tiny"]


def test_reward_function_name_joins_the_file(tmp_path):
    config = load_config(
        [*REQUIRED, "worker.reward.reward_function=rewards/math.py", "worker.reward.reward_function_name=score"],
        validate=False,
    )
    assert config.worker.reward.reward_function.endswith("/rewards/math.py:score")
    assert config.worker.reward.reward_function_name is None  # joined: only the effective key is shown and dumped
    again = copy.deepcopy(config)
    again.fill_derived()
    assert again == config
    # the name already after ':' is the same function
    same = ["worker.reward.reward_function=/r/math.py:score", "worker.reward.reward_function_name=score"]
    assert load_config([*REQUIRED, *same], validate=False).worker.reward.reward_function == "/r/math.py:score"


def test_reward_function_name_that_contradicts_or_lacks_a_file_is_refused():
    both = ["worker.reward.reward_function=/r/math.py:score", "worker.reward.reward_function_name=main"]
    with pytest.raises(ConfigError, match="names the function 'score' but worker.reward.reward_function_name='main'"):
        load_config([*REQUIRED, *both], validate=False)
    with pytest.raises(ConfigError, match="reward_function_name='compute_score' names a function but"):
        load_config([*REQUIRED, "worker.reward.reward_function_name=compute_score"])
    with pytest.raises(ConfigError, match="must be a python function name"):
        load_config([*REQUIRED, "worker.reward.reward_function=/r/math.py", "worker.reward.reward_function_name=a-b"])


# ---------------------------------------------------------------------------------------------------- compatibility

# The keys this change accepts from EasyR1, each with a value away from its default.
COMPATIBILITY_ONLY = {
    "worker.hybrid_engine": False,
    "worker.actor.fsdp.use_orig_params": True,
    "worker.critic.fsdp.use_orig_params": True,
    "worker.ref.fsdp.use_orig_params": True,
    "worker.actor.global_batch_size_per_device": 32,
    "worker.critic.global_batch_size_per_device": 32,
    "worker.critic.loss_avg_mode": "seq",
    "worker.critic.padding_free": True,
    "worker.critic.dynamic_batching": False,
}


@pytest.mark.parametrize(("key", "value"), COMPATIBILITY_ONLY.items(), ids=list(COMPATIBILITY_ONLY))
def test_a_compatibility_only_key_set_away_from_its_default_is_named(key, value):
    override = f"{key}={str(value).lower() if isinstance(value, bool) else value}"
    config = load_config([*REQUIRED, "worker.reward.reward_function=/r/r.py", override])  # grpo: no critic built
    assert get_key(config, key) == value
    assert compatibility_only_settings(config) == [f"{key}={value}"]


def test_the_keys_that_act_are_not_compatibility_only():
    fields = value_fields()
    for key in ("trainer.ray_timeline", "worker.reward.reward_function_name"):
        assert not is_compatibility_only(fields[key]), key
    config = load_config([*REQUIRED, "trainer.ray_timeline=/tmp/timeline.json"], validate=False)
    assert config.trainer.ray_timeline == "/tmp/timeline.json"


def test_a_critic_ulysses_size_that_does_not_divide_the_workers_is_refused_when_a_critic_is_built():
    argv = [*REQUIRED, "worker.reward.reward_function=/r/r.py", "algorithm.adv_estimator=gae"]
    load_config(argv)
    load_config([*argv[:-1], "worker.critic.ulysses_size=3"])  # grpo: no critic, nothing to split
    with pytest.raises(ConfigError, match=r"worker.critic.ulysses_size=3 does not divide the \d+ workers"):
        load_config([*argv, "worker.critic.ulysses_size=3"])


# ---------------------------------------------------------------------------------------------------- the page


def doc_table(heading: str) -> list[list[str]]:
    """The cells of the table under ``## heading`` in docs/easyr1-compatibility.md (header rows left out)."""
    section = DOC.read_text(encoding="utf-8").split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def expand(cell: str) -> list[str]:
    """The keys a cell starts with: ``worker.{actor,critic}.x`` is two keys; a value after the key is left out."""
    key = re.match(r"`([\w.{},]+)", cell).group(1)
    parts = re.split(r"\{([^}]*)\}", key)
    choices = [part.split(",") if index % 2 else [part] for index, part in enumerate(parts)]
    return ["".join(combination) for combination in itertools.product(*choices)]


def scalar(cell: str) -> Any:
    """The YAML value in a cell's backquotes."""
    return yaml.safe_load(re.fullmatch(r"`([^`]*)`", cell).group(1))


def test_the_documented_default_differences_match_the_code():
    fields, easyr1 = value_fields(), leaves(EASYR1_DEFAULTS)
    documented = set()
    for key_cell, easyr1_cell, here_cell, why in doc_table("Defaults that differ from EasyR1's"):
        assert why, key_cell
        for key in expand(key_cell):
            documented.add(key)
            assert plain(default_of(fields[key])) == scalar(here_cell), key
            assert easyr1[key] == scalar(easyr1_cell), key
    renamed = {key for row in doc_table("Renamed keys and values") for key in expand(row[0])}
    differing = {
        key
        for key, value in easyr1.items()
        if mirror_source(fields[key]) is None and plain(default_of(fields[key])) != value
    }
    assert documented == differing - renamed


def test_the_documented_compatibility_only_keys_are_the_codes():
    documented = [key for row in doc_table("Compatibility-only keys") for key in expand(row[0])]
    assert sorted(documented) == sorted(compatibility_only_keys(PPOConfig))


def test_the_documented_renames_are_the_codes():
    rows = doc_table("Renamed keys and values")
    pairs = {(expand(old)[0], expand(new)[0]) for old, new, _ in rows}
    assert set(_RENAMED_KEYS.items()) <= pairs
    aliases = {key for key, item in value_fields().items() if acts_through(item) and not mirror_source(item)}
    assert aliases == {"worker.actor.loss_avg_mode", "worker.reward.reward_function_name"}
    assert aliases <= {old for old, _ in pairs}
