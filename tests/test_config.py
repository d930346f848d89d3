"""Tests of the typed config: defaults, YAML + override merging, error messages, derived fields, validation."""

import copy
import dataclasses
import itertools
import json
import os
from pathlib import Path

import pytest

from easyr1.algorithms import (
    ADV_ESTIMATORS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    estimator_needs,
)
from easyr1.config import (
    PPOConfig,
    check_against_model,
    describe,
    load_config,
    to_dict,
    to_yaml,
)
from easyr1.engines.registry import ENGINES
from easyr1.envs.base import Environment
from easyr1.envs.registry import ENVIRONMENTS
from easyr1.errors import ConfigError, UserError
from easyr1.reward import REWARD_TYPES


REPO = Path(__file__).resolve().parents[1]
REQUIRED = ["worker.actor.model.model_path=/models/tiny", "worker.reward.reward_function=/rewards/r.py:compute_score"]
# A small consistent setup: 8 prompts x 2 samples over 2 workers, 2 updates per step.
SMALL = [
    *REQUIRED,
    "data.rollout_batch_size=8",
    "worker.actor.global_batch_size=4",
    "worker.rollout.n=2",
    "trainer.n_gpus_per_node=2",
    "worker.actor.micro_batch_size_per_device_for_update=2",
    "worker.actor.micro_batch_size_per_device_for_experience=4",
    "worker.rollout.tensor_parallel_size=1",
]


def write_yaml(directory: Path, text: str, name: str = "run.yaml") -> str:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def config_error(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(argv)
    return str(info.value)


def all_fields(cls: type = PPOConfig, prefix: str = ""):
    for item in dataclasses.fields(cls):
        yield prefix + item.name, item
        if isinstance(item.type, type) and dataclasses.is_dataclass(item.type):
            yield from all_fields(item.type, f"{prefix}{item.name}.")


# ---------------------------------------------------------------------------------------------------- defaults


def test_config_error_is_a_user_error():
    assert issubclass(ConfigError, UserError) and issubclass(ConfigError, ValueError)


def test_defaults_follow_easyr1():
    config = PPOConfig()
    assert config.data.train_files == "hiyouga/geometry3k@train"
    assert (config.data.max_prompt_length, config.data.rollout_batch_size, config.data.val_batch_size) == (
        512,
        512,
        -1,
    )
    assert (config.data.min_pixels, config.data.max_pixels) == (262144, 4194304)
    assert (config.algorithm.adv_estimator, config.algorithm.kl_penalty, config.algorithm.kl_coef) == (
        "grpo",
        "kl",
        1e-3,
    )
    actor = config.worker.actor
    assert (actor.global_batch_size, actor.micro_batch_size_per_device_for_update) == (256, 4)
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_dual) == (0.2, 0.3, 3.0)
    assert (actor.optim.lr, actor.optim.betas, actor.optim.weight_decay) == (1e-6, (0.9, 0.999), 1e-2)
    assert (actor.fsdp.torch_dtype, actor.fsdp.mp_param_dtype) == (None, None)
    assert (actor.padding_free, actor.dynamic_batching, actor.use_torch_compile) == (True, True, True)
    worker = config.worker
    assert actor.fsdp.enable_rank0_init and worker.ref.fsdp.enable_rank0_init and worker.critic.fsdp.enable_rank0_init
    assert (config.worker.rollout.n, config.worker.rollout.tensor_parallel_size) == (5, 2)
    assert config.trainer.logger == ["console", "file"]
    assert (config.trainer.experiment_name, config.trainer.val_generations_to_log) == ("demo", 0)
    assert (config.trainer.n_gpus_per_node, config.trainer.project_name, config.trainer.device) == (
        8,
        "easy_r1",
        "auto",
    )


def test_mutable_defaults_are_not_shared():
    first, second = PPOConfig(), PPOConfig()
    first.trainer.logger.append("wandb")
    first.worker.rollout.val_override_config["n"] = 1
    assert second.trainer.logger == ["console", "file"]
    assert second.worker.rollout.val_override_config == {}


def test_every_field_has_a_type_and_a_help_line():
    keys = []
    for key, item in all_fields():
        keys.append(key)
        assert item.type is not None, key
        help_text = item.metadata.get("help", "")
        assert help_text and "\n" not in help_text, key
    text = describe()
    for key in keys:
        assert f"\n{key}:" in f"\n{text}", key
    assert "worker.actor.global_batch_size: int = 256  # " in text


def test_loading_only_the_required_keys_gives_the_defaults():
    loaded = load_config(REQUIRED)
    expected = PPOConfig()
    expected.worker.actor.model.model_path = "/models/tiny"
    expected.worker.reward.reward_function = "/rewards/r.py:compute_score"
    expected.fill_derived()
    assert loaded == expected


def test_missing_required_keys_are_named_together():
    message = config_error([])
    assert "worker.actor.model.model_path is not set" in message
    assert "worker.reward.reward_function is not set" in message
    # Without validation the defaults load (tools that only read a config need no model).
    assert load_config([], validate=False).worker.actor.model.model_path is None


# ---------------------------------------------------------------------------------------------------- merging


def test_yaml_then_overrides_precedence(tmp_path):
    first = write_yaml(
        tmp_path,
        "worker:\n  actor:\n    optim:\n      lr: 1.0e-5\n      weight_decay: 0.5\ntrainer:\n  nnodes: 3\n",
        "first.yaml",
    )
    second = write_yaml(tmp_path, "worker:\n  actor:\n    optim:\n      weight_decay: 0.25\n", "second.yaml")
    config = load_config(
        [f"config={first}", f"config={second}", "trainer.nnodes=1", *REQUIRED, "worker.rollout.n=8"], validate=False
    )
    assert config.worker.actor.optim.lr == 1e-5  # from the first file only
    assert config.worker.actor.optim.weight_decay == 0.25  # the second file wins over the first
    assert config.trainer.nnodes == 1  # the command line wins over both files
    assert config.worker.rollout.n == 8
    assert config.worker.actor.optim.betas == (0.9, 0.999)  # untouched default


def test_an_override_may_come_before_the_config_file(tmp_path):
    path = write_yaml(tmp_path, "trainer:\n  nnodes: 3\n")
    assert load_config(["trainer.nnodes=2", f"config={path}"], validate=False).trainer.nnodes == 2


def test_lists_replace_rather_than_extend(tmp_path):
    path = write_yaml(tmp_path, "trainer:\n  logger: [console, wandb, tensorboard]\n")
    assert load_config([f"config={path}"], validate=False).trainer.logger == ["console", "wandb", "tensorboard"]
    config = load_config([f"config={path}", "trainer.logger=[file]"], validate=False)
    assert config.trainer.logger == ["file"]
    config = load_config(["worker.actor.optim.betas=[0.8,0.95]"], validate=False)
    assert config.worker.actor.optim.betas == (0.8, 0.95)


def test_dict_fields_accept_any_key_and_merge(tmp_path):
    path = write_yaml(
        tmp_path,
        "worker:\n  rollout:\n    val_override_config:\n      temperature: 0.6\n"
        "  reward:\n    reward_function_kwargs: {format_weight: 0.2}\n",
    )
    config = load_config([f"config={path}", "worker.rollout.val_override_config.n=1"], validate=False)
    assert config.worker.rollout.val_override_config == {"temperature": 0.6, "n": 1}
    assert config.worker.reward.reward_function_kwargs == {"format_weight": 0.2}


def test_empty_sections_and_empty_files_are_allowed(tmp_path):
    path = write_yaml(tmp_path, "data:\nworker:\n  actor:\n")
    assert load_config([f"config={path}"], validate=False) == load_config([], validate=False)
    empty = write_yaml(tmp_path, "", "empty.yaml")
    assert load_config([f"config={empty}"], validate=False) == load_config([], validate=False)


def test_yaml_interpolation_is_resolved(tmp_path):
    path = write_yaml(tmp_path, "data:\n  max_prompt_length: 100\nworker:\n  rollout:\n    max_model_len: 300\n")
    text = "data:\n  max_response_length: ${worker.rollout.max_model_len}\n"
    second = write_yaml(tmp_path, text, "second.yaml")
    assert load_config([f"config={path}", f"config={second}"], validate=False).data.max_response_length == 300


def test_easyr1_style_yaml_loads(tmp_path):
    text = """
worker:
  actor:
    loss_avg_mode: token
    loss_type: default
    dynamic_batching: true
    ulysses_size: 1
    model:
      model_path: Qwen/Qwen2.5-VL-7B-Instruct
      lora:
        rank: 0
        alpha: 64
        target_modules: all-linear
        exclude_modules: .*visual.*
  rollout:
    val_override_config:
      temperature: 0.6
      top_p: 0.95
      n: 1
  reward:
    reward_function: ./examples/reward_function/math.py:compute_score
trainer:
  max_try_make_batch: 20
  find_last_checkpoint: true
"""
    config = load_config([f"config={write_yaml(tmp_path, text)}"])
    assert config.worker.actor.model.lora.exclude_modules == ".*visual.*"
    assert (config.worker.actor.loss_agg_mode, config.worker.actor.loss_type) == ("token-mean", "ppo")
    assert config.worker.ref.dynamic_batching is True


# ---------------------------------------------------------------------------------------------------- key errors


def test_unknown_key_in_yaml_names_file_key_and_suggestion(tmp_path):
    path = write_yaml(tmp_path, "worker:\n  actor:\n    global_batchsize: 8\n")
    message = config_error([f"config={path}"])
    assert message == (
        f"unknown config key 'worker.actor.global_batchsize' (from {path}); "
        "did you mean 'worker.actor.global_batch_size'?"
    )


def test_unknown_key_on_the_command_line():
    message = config_error(["worker.rollout.temprature=0.7"])
    assert "unknown config key 'worker.rollout.temprature' (from the command line)" in message
    assert "did you mean 'worker.rollout.temperature'?" in message


def test_key_in_the_wrong_section_points_to_the_right_one():
    assert "did you mean 'worker.rollout.n'?" in config_error(["worker.actor.n=4"])


def test_renamed_easyr1_keys_point_to_the_new_name():
    assert "it is now called 'trainer.total_epochs'" in config_error(["trainer.total_episodes=3"])


def test_unknown_key_without_close_match_lists_the_section():
    message = config_error(["zzzz=1"])
    assert "unknown config key 'zzzz'" in message
    assert "data, algorithm, worker, trainer" in message


def test_section_given_a_value():
    message = config_error(["worker.actor=3"])
    assert "'worker.actor' (from the command line) is a section" in message


# ---------------------------------------------------------------------------------------------------- type errors


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.nnodes=abc", "config key 'trainer.nnodes' (from the command line) got 'abc' (str); expected int"),
        ("worker.actor.optim.lr=fast", "got 'fast' (str); expected float"),
        ("data.shuffle=maybe", "got 'maybe' (str); expected bool"),
        ("data.rollout_batch_size=2.5", "got 2.5 (float); expected int"),
        ("data.max_prompt_length=null", "got null; expected int (this key cannot be null)"),
        ("trainer.logger=console", "expected list[str] (write a list"),
        ("worker.actor.optim.betas=[0.9]", "expected tuple[float, float]"),
        ("worker.actor.model.override_config=3", "expected dict[str, Any]"),
    ],
)
def test_wrong_type_names_key_value_and_expected_type(override, expected):
    message = config_error([override])
    assert expected in message
    assert f"'{override.partition('=')[0]}'" in message


def test_wrong_type_in_yaml_names_the_file(tmp_path):
    path = write_yaml(tmp_path, "trainer:\n  n_gpus_per_node: [1, 2]\n")
    message = config_error([f"config={path}"])
    assert f"'trainer.n_gpus_per_node' (from {path}) got [1, 2] (list); expected int" in message


def test_optional_keys_accept_null_and_strings_convert():
    config = load_config(
        ["data.min_pixels=null", "trainer.experiment_name=123", "data.rollout_batch_size=16"], validate=False
    )
    assert config.data.min_pixels is None
    assert config.trainer.experiment_name == "123"
    assert config.data.rollout_batch_size == 16


# ---------------------------------------------------------------------------------------------------- file/argv errors


def test_missing_config_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    message = config_error([f"config={missing}"])
    assert f"config file '{missing}' not found" in message


def test_invalid_yaml_names_the_file(tmp_path):
    path = write_yaml(tmp_path, "data: [unclosed\n")
    assert f"config file '{path}' is not valid YAML" in config_error([f"config={path}"])
    listing = write_yaml(tmp_path, "- a\n- b\n", "list.yaml")
    assert "must hold a mapping" in config_error([f"config={listing}"])


@pytest.mark.parametrize("item", ["--trainer.nnodes=2", "trainer.nnodes", "=3"])
def test_malformed_command_line_items(item):
    assert f"'{item}'" in config_error([item])


# ---------------------------------------------------------------------------------------------------- derived fields


def test_mirrors_are_copied_from_their_sources():
    config = load_config(
        [
            *SMALL,
            "algorithm.disable_kl=true",
            "algorithm.use_kl_loss=true",
            "algorithm.kl_penalty=low_var_kl",
            "algorithm.kl_coef=0.05",
            "worker.actor.padding_free=true",
            "worker.actor.model.trust_remote_code=true",
            "data.max_prompt_length=77",
            "data.max_response_length=33",
        ]
    )
    actor, ref, rollout = config.worker.actor, config.worker.ref, config.worker.rollout
    assert (actor.disable_kl, actor.use_kl_loss, actor.kl_penalty, actor.kl_coef) == (True, True, "low_var_kl", 0.05)
    assert ref.micro_batch_size_per_device_for_experience == 4
    assert ref.padding_free is True
    assert rollout.trust_remote_code is True
    assert (rollout.prompt_length, rollout.response_length) == (77, 33)


def test_mirror_set_to_a_different_value_is_rejected_with_the_source_key():
    message = config_error([*SMALL, "worker.rollout.prompt_length=100", "data.max_prompt_length=64"])
    assert "'worker.rollout.prompt_length' (from the command line) is copied from 'data.max_prompt_length'" in message
    assert "got 100 but data.max_prompt_length=64" in message
    # The same value is accepted, so a fully written-out config still loads.
    load_config([*SMALL, "worker.rollout.prompt_length=64", "data.max_prompt_length=64"])


def test_tokenizer_path_defaults_to_model_path():
    config = load_config(["worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct"], validate=False)
    assert config.worker.actor.model.tokenizer_path == "Qwen/Qwen2.5-VL-7B-Instruct"
    config = load_config([*REQUIRED, "worker.actor.model.tokenizer_path=/tok"], validate=False)
    assert config.worker.actor.model.tokenizer_path == "/tok"


def test_checkpoint_and_log_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(["trainer.project_name=proj", "trainer.experiment_name=exp"], validate=False)
    expected = str(tmp_path / "checkpoints" / "proj" / "exp")
    assert config.trainer.save_checkpoint_path == expected
    assert config.trainer.log_dir == expected
    config = load_config(["trainer.save_checkpoint_path=out/ckpt", "trainer.log_dir=logs"], validate=False)
    assert config.trainer.save_checkpoint_path == str(tmp_path / "out" / "ckpt")
    assert config.trainer.log_dir == str(tmp_path / "logs")


def test_local_paths_become_absolute_and_hub_ids_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mine").mkdir(parents=True)
    config = load_config(
        [
            "data.train_files=data/train.jsonl",
            "data.val_files=.cache/val@test",
            "data.format_prompt=./prompts/math.jinja",
            "worker.actor.model.model_path=models/mine",
            "worker.reward.reward_function=rewards/r.py:score",
            "trainer.load_checkpoint_path=ckpt/global_step_3",
        ],
        validate=False,
    )
    assert config.data.train_files == str(tmp_path / "data" / "train.jsonl")  # not created yet: known suffix
    assert config.data.val_files == f"{tmp_path / '.cache' / 'val'}@test"
    assert config.data.format_prompt == str(tmp_path / "prompts" / "math.jinja")
    assert config.worker.actor.model.model_path == str(tmp_path / "models" / "mine")  # exists
    assert config.worker.reward.reward_function == f"{tmp_path / 'rewards' / 'r.py'}:score"
    assert config.trainer.load_checkpoint_path == str(tmp_path / "ckpt" / "global_step_3")

    hub = load_config(["worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct"], validate=False)
    assert hub.data.train_files == "hiyouga/geometry3k@train"
    assert hub.worker.actor.model.model_path == "Qwen/Qwen2.5-VL-7B-Instruct"


def test_fill_derived_is_idempotent():
    config = load_config(SMALL)
    again = copy.deepcopy(config)
    again.fill_derived()
    assert again == config


# ---------------------------------------------------------------------------------------------------- aliases


@pytest.mark.parametrize(("old", "new"), [("token", "token-mean"), ("seq", "seq-mean-token-mean")])
def test_loss_avg_mode_alias(tmp_path, old, new):
    path = write_yaml(tmp_path, f"worker:\n  actor:\n    loss_avg_mode: {old}\n")
    config = load_config([f"config={path}", *SMALL])
    assert config.worker.actor.loss_agg_mode == new
    assert config.worker.actor.loss_avg_mode is None  # consumed: only the effective mode is shown
    load_config([f"config={path}", *SMALL, f"worker.actor.loss_agg_mode={new}"])  # agreeing values are fine


def test_loss_avg_mode_contradicting_loss_agg_mode_is_rejected():
    message = config_error([*SMALL, "worker.actor.loss_avg_mode=seq", "worker.actor.loss_agg_mode=token-mean"])
    assert "worker.actor.loss_avg_mode='seq'" in message and "worker.actor.loss_agg_mode='token-mean'" in message


def test_unknown_loss_avg_mode_is_rejected():
    assert "worker.actor.loss_avg_mode='tok'" in config_error([*SMALL, "worker.actor.loss_avg_mode=tok"])


def test_easyr1_default_loss_type_means_ppo():
    assert load_config([*SMALL, "worker.actor.loss_type=default"]).worker.actor.loss_type == "ppo"


# ---------------------------------------------------------------------------------------------------- validation


def test_small_setup_is_valid():
    load_config(SMALL)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["worker.actor.global_batch_size=16"],
            "worker.actor.global_batch_size=16 is larger than data.rollout_batch_size=8",
        ),
        (
            ["worker.actor.global_batch_size=3"],
            "data.rollout_batch_size=8 is not a multiple of worker.actor.global_batch_size=3",
        ),
        (
            ["trainer.n_gpus_per_node=3", "worker.actor.global_batch_size=8"],
            "data.rollout_batch_size * worker.rollout.n = 8 * 2 = 16 samples cannot be split evenly across the 3 "
            "workers (trainer.nnodes=1 * trainer.n_gpus_per_node=3)",
        ),
        (
            ["worker.actor.micro_batch_size_per_device_for_update=3"],
            "= 8 / 2 = 4 samples, not a whole number of micro-batches of "
            "worker.actor.micro_batch_size_per_device_for_update=3; use a micro-batch size that divides 4 (e.g. 2)",
        ),
        (
            ["worker.actor.micro_batch_size_per_device_for_experience=3"],
            "= 16 / 2 = 8 samples, not a whole number of micro-batches of "
            "worker.actor.micro_batch_size_per_device_for_experience=3",
        ),
        (
            ["worker.rollout.tensor_parallel_size=4"],
            "worker.rollout.tensor_parallel_size=4 does not divide the 2 workers",
        ),
        (
            ["data.max_prompt_length=100", "data.max_response_length=50", "worker.rollout.max_model_len=128"],
            "data.max_prompt_length + data.max_response_length = 100 + 50 = 150 exceeds "
            "worker.rollout.max_model_len=128",
        ),
        (
            ["worker.rollout.n=1", "worker.actor.micro_batch_size_per_device_for_update=1"],
            "algorithm.adv_estimator=grpo compares responses to the same prompt and needs worker.rollout.n >= 2",
        ),
        (["worker.rollout.n=0"], "worker.rollout.n=0 must be at least 1"),
        (["worker.rollout.temperature=0"], "worker.rollout.temperature=0.0 must be positive"),
        (["worker.rollout.top_p=1.5"], "worker.rollout.top_p=1.5 must be in (0, 1]"),
        (["worker.actor.clip_ratio_dual=0.5"], "worker.actor.clip_ratio_dual=0.5 must be greater than 1"),
        (["data.min_pixels=100", "data.max_pixels=50"], "data.min_pixels=100 is larger than data.max_pixels=50"),
        (
            ["algorithm.online_filtering=true", "algorithm.filter_low=0.9", "algorithm.filter_high=0.1"],
            "algorithm.filter_low=0.9 must be below algorithm.filter_high=0.1",
        ),
        (["algorithm.adv_estimator=grp"], "algorithm.adv_estimator='grp' is not supported (did you mean 'grpo'?)"),
        (["algorithm.kl_penalty=low_var"], "algorithm.kl_penalty='low_var' is not supported"),
        (["worker.actor.loss_type=gspoo"], "worker.actor.loss_type='gspoo' is not supported (did you mean 'gspo'?)"),
        (["algorithm.rollout_correction=tis"], "algorithm.rollout_correction='tis' is not supported"),
        (["algorithm.rollout_correction_threshold=0"], "algorithm.rollout_correction_threshold=0.0 must be positive"),
        (["worker.actor.tau_negative=0"], "worker.actor.tau_negative=0.0 must be positive"),
        (["worker.actor.clip_ratio_low=1.5"], "worker.actor.clip_ratio_low=1.5 must be in [0, 1]"),
        (
            ["algorithm.adv_estimator=grpo_passk", "worker.rollout.n=1"],
            "algorithm.adv_estimator=grpo_passk compares responses to the same prompt",
        ),
        (["worker.actor.loss_agg_mode=mean"], "worker.actor.loss_agg_mode='mean' is not supported"),
        (["worker.rollout.name=sglang"], "worker.rollout.name='sglang' is not supported; valid values: vllm, hf"),
        (["worker.rollout.dtype=fp8"], "worker.rollout.dtype='fp8' is not supported"),
        (
            ["worker.rollout.load_format=dumy"],
            "worker.rollout.load_format='dumy' is not supported (did you mean 'dummy'?); valid values: dummy, auto",
        ),
        (
            ["worker.ref.fsdp.fsdp_size=1"],
            "worker.ref.fsdp.fsdp_size=1: every model is sharded over all 2 workers (hybrid sharding over smaller "
            "groups is not implemented)",
        ),
        (
            ["trainer.logger=[console,wandbb]"],
            "trainer.logger entry='wandbb' is not supported (did you mean 'wandb'?)",
        ),
        (["trainer.device=tpu"], "trainer.device='tpu' is not supported"),
        (["worker.reward.reward_type=function"], "worker.reward.reward_type='function' is not supported"),
        (
            ["worker.rollout.val_override_config.temprature=0.5"],
            "worker.rollout.val_override_config has unknown rollout key 'temprature'; did you mean 'temperature'?",
        ),
        (["worker.reward.reward_function=rewards/math"], "must name a python file"),
        (
            ["worker.rollout.name=hf", "worker.rollout.tensor_parallel_size=2"],
            "worker.rollout.tensor_parallel_size=2 needs worker.rollout.name=vllm",
        ),
        (
            [
                "data.mini_rollout_batch_size=3",
                "trainer.n_gpus_per_node=4",
                "worker.actor.micro_batch_size_per_device_for_update=1",
            ],
            "data.mini_rollout_batch_size * worker.rollout.n = 3 * 2 = 6 samples cannot be split evenly",
        ),
    ],
)
def test_cross_field_checks(overrides, expected):
    assert expected in config_error([*SMALL, *overrides])


def test_all_problems_are_reported_at_once():
    message = config_error(
        [*SMALL, "worker.rollout.top_p=2", "trainer.device=tpu", "worker.actor.global_batch_size=16"]
    )
    assert message.startswith("invalid configuration:\n")
    assert message.count("\n  - ") == 3


def test_validate_with_the_real_number_of_workers():
    config = load_config(SMALL)  # valid for 2 workers
    config.validate(num_workers=1)
    config.validate(num_workers=4)
    with pytest.raises(ConfigError, match="cannot be split evenly across the 3 workers;"):
        config.validate(num_workers=3)


def test_disable_kl_wins_over_use_kl_loss():
    # EasyR1 recipes switch the KL off on top of a YAML that asks for the KL loss; that must stay valid.
    config = load_config([*SMALL, "algorithm.use_kl_loss=true", "algorithm.disable_kl=true"])
    assert config.worker.actor.disable_kl and config.worker.actor.use_kl_loss


def _chunks_are_full(items: list[int], size: int) -> bool:
    """Equal micro-batches, or a single one holding everything (a micro-batch may exceed the share)."""
    if size >= len(items):
        return True
    chunks = [items[start : start + size] for start in range(0, len(items), size)]
    return all(len(chunk) == size for chunk in chunks)


def _reference_batch_sizes_ok(rollout: int, global_: int, n: int, workers: int, micro_update: int, micro_exp: int):
    """Simulate one step: split the prompts into updates and the samples over workers and micro-batches."""
    prompts = list(range(rollout))
    updates = [prompts[start : start + global_] for start in range(0, rollout, global_)]
    if any(len(update) != global_ for update in updates):
        return False
    for samples, micro in ((rollout * n, micro_exp), (global_ * n, micro_update)):
        shares = [list(range(samples))[rank::workers] for rank in range(workers)]
        if len({len(share) for share in shares}) != 1:
            return False
        if not all(_chunks_are_full(share, micro) for share in shares):
            return False
    return True


def test_batch_size_checks_agree_with_a_simulated_split():
    base = load_config(SMALL)
    checked = rejected = 0
    for rollout, global_, n, workers, micro_update, micro_exp in itertools.product(
        (4, 6, 8), (1, 2, 3, 4, 8), (2, 3), (1, 2, 3, 4), (1, 2, 4), (1, 3, 4)
    ):
        config = copy.deepcopy(base)
        config.data.rollout_batch_size, config.worker.actor.global_batch_size = rollout, global_
        config.worker.rollout.n, config.trainer.n_gpus_per_node = n, workers
        actor = config.worker.actor
        actor.micro_batch_size_per_device_for_update, actor.micro_batch_size_per_device_for_experience = (
            micro_update,
            micro_exp,
        )
        config.fill_derived()
        expected = _reference_batch_sizes_ok(rollout, global_, n, workers, micro_update, micro_exp)
        try:
            config.validate()
            accepted = True
        except ConfigError:
            accepted = False
        assert accepted == expected, (rollout, global_, n, workers, micro_update, micro_exp)
        checked += 1
        rejected += not accepted
    assert 0 < rejected < checked  # the grid covers both outcomes


# ---------------------------------------------------------------------------------------------------- model checks


QWEN_VL_JSON = {
    "model_type": "qwen2_5_vl",
    "vision_config": {"depth": 2},
    "text_config": {"max_position_embeddings": 128, "num_attention_heads": 4},
}


def test_check_against_model_accepts_a_fitting_model():
    config = load_config([*SMALL, "data.max_prompt_length=100", "data.max_response_length=28"])
    check_against_model(config, QWEN_VL_JSON)


def test_check_against_model_lengths_heads_and_vision():
    config = load_config(
        [
            *SMALL,
            "data.max_prompt_length=100",
            "data.max_response_length=50",
            "worker.rollout.tensor_parallel_size=2",
            "trainer.n_gpus_per_node=6",
            "data.rollout_batch_size=12",
            "worker.actor.global_batch_size=6",
            "worker.actor.micro_batch_size_per_device_for_update=1",
            "worker.actor.micro_batch_size_per_device_for_experience=1",
            "worker.actor.model.freeze_vision_tower=true",
        ]
    )
    check_against_model(config, QWEN_VL_JSON | {"text_config": {"max_position_embeddings": 4096}})
    text_only = {"max_position_embeddings": 128, "num_attention_heads": 3}
    with pytest.raises(ConfigError) as info:
        check_against_model(config, text_only)
    message = str(info.value)
    assert "100 + 50 = 150 exceeds the model's max_position_embeddings=128 (/models/tiny)" in message
    assert "worker.rollout.tensor_parallel_size=2 does not divide the model's num_attention_heads=3" in message
    assert "freeze_vision_tower=true but the model (/models/tiny) has no vision tower" in message


def test_check_against_model_reads_config_json(tmp_path):
    from easyr1.main import read_model_config

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(QWEN_VL_JSON), encoding="utf-8")
    lengths = ["data.max_prompt_length=100", "data.max_response_length=28", "worker.rollout.max_model_len=512"]
    config = load_config([*SMALL, f"worker.actor.model.model_path={model_dir}", *lengths])
    with pytest.raises(ConfigError, match=r"worker.rollout.max_model_len=512 exceeds the model's max_position_emb"):
        check_against_model(config, read_model_config(config.worker.actor.model))
    # override_config replaces config.json entries, as it does when the model is loaded.
    config.worker.actor.model.override_config = {"text_config": {"max_position_embeddings": 1024}}
    check_against_model(config, read_model_config(config.worker.actor.model))
    # a directory without a config.json is an error naming the key and what builds the demo's model
    config.worker.actor.model.model_path = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"worker.actor.model.model_path=.*missing.*easyr1.tools.demo_assets"):
        read_model_config(config.worker.actor.model)


# ---------------------------------------------------------------------------------------------------- examples


def test_example_recipe_loads_and_validates(monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(["config=examples/config.yaml"])
    assert config.worker.actor.model.model_path == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert config.data.train_files == "hiyouga/geometry3k@train"
    assert config.data.format_prompt == str(REPO / "format_prompt" / "math.jinja")
    assert config.worker.reward.reward_function == f"{REPO / 'reward_function' / 'math.py'}:compute_score"
    assert (config.data.rollout_batch_size, config.worker.actor.global_batch_size, config.worker.rollout.n) == (
        512,
        128,
        5,
    )
    assert (config.algorithm.use_kl_loss, config.algorithm.kl_penalty, config.algorithm.kl_coef) == (
        True,
        "low_var_kl",
        1e-2,
    )
    assert (config.data.max_prompt_length, config.data.max_response_length) == (2048, 2048)
    assert config.trainer.logger == ["console", "wandb"]
    assert (config.trainer.n_gpus_per_node, config.trainer.val_freq, config.trainer.save_freq) == (8, 5, 5)


def test_cpu_example_loads_and_validates(monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(["config=examples/config_cpu.yaml"])
    assert config.data.train_files == str(REPO / ".cache" / "demo" / "data" / "train.jsonl")
    assert config.worker.actor.model.model_path == str(REPO / ".cache" / "demo" / "model" / "qwen2_5_vl")
    assert config.worker.reward.reward_function == f"{REPO / 'reward_function' / 'shape_color.py'}:compute_score"
    assert (config.data.rollout_batch_size, config.worker.rollout.n, config.trainer.n_gpus_per_node) == (16, 8, 2)
    assert (config.worker.rollout.dtype, config.worker.actor.fsdp.torch_dtype) == ("float32", "float32")
    assert config.algorithm.disable_kl and config.trainer.device == "cpu"
    # the demo keeps the settings it was tuned with where the defaults follow EasyR1's
    actor = config.worker.actor
    assert (actor.padding_free, actor.dynamic_batching, actor.use_torch_compile) == (False, False, False)
    fsdp_sections = (actor.fsdp, config.worker.ref.fsdp, config.worker.critic.fsdp)
    assert not any(fsdp.enable_rank0_init for fsdp in fsdp_sections)
    assert config.trainer.val_generations_to_log == 3
    assert config.trainer.save_checkpoint_path == str(REPO / "checkpoints" / "easyr1_demo" / "shape_color_grpo")


def test_reward_files_of_the_examples_exist(monkeypatch):
    monkeypatch.chdir(REPO)
    for name in ("config.yaml", "config_cpu.yaml"):
        reward = load_config([f"config=examples/{name}"]).worker.reward.reward_function
        assert os.path.isfile(reward.rpartition(":")[0]), reward


# ---------------------------------------------------------------------------------------------------- output


@pytest.mark.parametrize(
    "argv",
    [
        ["config=examples/config.yaml"],
        ["config=examples/config_cpu.yaml", "worker.actor.loss_avg_mode=seq", "trainer.logger=[console]"],
        [*SMALL, "worker.rollout.val_override_config={temperature: 0.5, n: 1}", "data.min_pixels=null"],
    ],
)
def test_to_yaml_round_trip(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(REPO)
    config = load_config(argv)
    path = write_yaml(tmp_path, to_yaml(config), "dumped.yaml")
    reloaded = load_config([f"config={path}"])
    assert reloaded == config
    assert to_yaml(reloaded) == to_yaml(config)


def test_dumped_config_can_be_overridden(tmp_path):
    config = load_config([*SMALL, "algorithm.kl_coef=0.01"])
    path = write_yaml(tmp_path, to_yaml(config))
    reloaded = load_config([f"config={path}", "algorithm.kl_coef=0.5"])
    assert reloaded.worker.actor.kl_coef == 0.5


def test_to_dict_is_plain_data():
    config = load_config(SMALL)
    tree = to_dict(config)
    assert tree["worker"]["actor"]["optim"]["betas"] == [0.9, 0.999]
    assert tree["data"]["rollout_batch_size"] == 8
    json.dumps(tree)  # loggers need JSON-serialisable values


# ---------------------------------------------------------------------------------------------------- registries


# Each family's config key and its registry's names: the config accepts exactly these.
REGISTERED_NAMES = [
    ("algorithm.adv_estimator", ADV_ESTIMATORS.names()),
    ("algorithm.kl_penalty", KL_ESTIMATORS.names()),
    ("algorithm.kl_type", KL_CONTROLLERS.names()),
    ("worker.actor.loss_type", POLICY_LOSSES.names()),
    ("worker.actor.loss_agg_mode", LOSS_AGGREGATIONS.names()),
    ("worker.rollout.name", ENGINES.names()),
    ("worker.reward.reward_type", list(REWARD_TYPES)),
]


@pytest.mark.parametrize(
    ("key", "name"), [(key, name) for key, names in REGISTERED_NAMES for name in names], ids=lambda item: str(item)
)
def test_every_registered_name_is_accepted(key, name, monkeypatch):
    extra = []
    if key == "algorithm.adv_estimator" and estimator_needs(name).turn_ids:  # a multi-turn estimator needs an env
        monkeypatch.setitem(ENVIRONMENTS._entries, "config_test_env", Environment)
        monkeypatch.setitem(ENVIRONMENTS._traits, "config_test_env", None)
        extra = ["env.name=config_test_env"]
    config = load_config([*SMALL, f"{key}={name}", *extra])
    section, _, field_name = key.rpartition(".")
    value = config
    for part in section.split("."):
        value = getattr(value, part)
    assert getattr(value, field_name) == name


def test_kl_estimator_aliases_k1_k2_k3_are_accepted():
    for name in ("k1", "k2", "k3"):
        assert load_config([*SMALL, f"algorithm.kl_penalty={name}"]).worker.actor.kl_penalty == name


@pytest.mark.parametrize(("key", "names"), REGISTERED_NAMES, ids=[key for key, _ in REGISTERED_NAMES])
def test_an_unknown_name_lists_the_registry_names(key, names):
    message = config_error([*SMALL, f"{key}=no_such_name"])
    assert message.startswith(f"{key}='no_such_name' is not supported")
    assert message.endswith(f"valid values: {', '.join(names)}")


def test_a_newly_registered_name_is_accepted_without_touching_the_config(monkeypatch):
    # The config reads the registry itself: a name registered later is valid at once.
    assert "never_seen" in config_error([*SMALL, "algorithm.kl_penalty=never_seen"])
    monkeypatch.setitem(KL_ESTIMATORS._entries, "never_seen", KL_ESTIMATORS.get("kl"))
    assert load_config([*SMALL, "algorithm.kl_penalty=never_seen"]).algorithm.kl_penalty == "never_seen"
