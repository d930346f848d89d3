"""Secret-looking config values (by key name, or from ``${oc.env:...}``) stay out of what a run writes down: the config
handed to the trackers and the ``config.yaml`` of each checkpoint; the run itself keeps them."""

from __future__ import annotations

import pytest
import yaml
from helpers import REPO

from easyr1.build import start_trackers
from easyr1.config import load_config, redacted_keys, to_dict, to_yaml
from easyr1.config.redaction import REDACTED, is_secret_name


@pytest.mark.parametrize(
    "name",
    ["api_key", "judge_token", "OPENAI_API_KEY", "apiKey", "hf_token", "access_token", "client_secret", "key", "token"]
    + ["db_password", "secret_access_key", "private_key_path_secret", "api_key_judge", "passwd", "credentials"],
)
def test_secret_looking_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["max_tokens", "max_num_batched_tokens", "max_prompt_length", "max_response_length", "pad_token_id"]
    + ["skip_special_tokens", "tokenizer_path", "max_tokens_per_turn", "keyword", "token_budget", "keys", "monkey"],
)
def test_counts_ids_and_lengths_are_not_secrets(name):
    assert not is_secret_name(name)


SECRETS = {"api_key": "sk-live-4f9a", "judge_token": "tok-77e1", "endpoint": "https://user:pw-0c3d@judge.example"}


@pytest.fixture
def config(tmp_path, monkeypatch):
    """The demo config with a judge's secrets among the reward kwargs (one from the environment), a secret
    environment keyword argument and ordinary keys whose names mention tokens and keys."""
    monkeypatch.setenv("EASYR1_TEST_JUDGE_URL", SECRETS["endpoint"])
    kwargs = (
        f"{{api_key: {SECRETS['api_key']}, judge_token: {SECRETS['judge_token']}, "
        "endpoint: '${oc.env:EASYR1_TEST_JUDGE_URL}', max_tokens: 64, pad_token_id: 7}"
    )
    return load_config(
        [
            f"config={REPO / 'examples' / 'config_cpu.yaml'}",
            f"worker.reward.reward_function_kwargs={kwargs}",
            "env.env_kwargs={password: hunter2-secret, size: 5}",
            f"trainer.save_checkpoint_path={tmp_path / 'run'}",
            "trainer.logger=[console,file,mlflow]",
            "trainer.experiment_name=redaction",
        ],
        validate=False,
    )


EXPECTED_KEYS = [
    "worker.reward.reward_function_kwargs.api_key",
    "worker.reward.reward_function_kwargs.judge_token",
    "worker.reward.reward_function_kwargs.endpoint",
    "env.env_kwargs.password",
]


def leaked(text: str) -> list[str]:
    return [value for value in [*SECRETS.values(), "hunter2-secret"] if value in text]


def test_trackers_get_the_config_without_its_secrets(config, tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    trackers = start_trackers(config, resume_step=None, total_steps=3)
    for tracker in trackers:
        tracker.log({"reward/overall": 0.5}, step=1)
        tracker.close()
    printed = capsys.readouterr().out
    (line,) = [line for line in printed.splitlines() if "secret-looking" in line]
    assert all(key in line for key in EXPECTED_KEYS) and not leaked(printed)

    # the run keeps its values
    assert dict(config.worker.reward.reward_function_kwargs) == {**SECRETS, "max_tokens": 64, "pad_token_id": 7}
    assert config.env.env_kwargs["password"] == "hunter2-secret"

    # what mlflow (and so wandb and swanlab, which get the same dict) recorded
    client = MlflowClient(f"file:{tmp_path / 'run' / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("easyr1_demo").experiment_id])
    params = run.data.params
    for key in EXPECTED_KEYS:
        assert params[key] == REDACTED
    assert params["worker.reward.reward_function_kwargs.max_tokens"] == "64"
    assert params["worker.reward.reward_function_kwargs.pad_token_id"] == "7"
    assert params["env.env_kwargs.size"] == "5"
    assert params["worker.rollout.max_num_batched_tokens"] == str(config.worker.rollout.max_num_batched_tokens)
    assert params["data.prompt_key"] == config.data.prompt_key
    assert params["data.max_prompt_length"] == str(config.data.max_prompt_length)
    # nothing the trackers wrote holds a secret
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert not leaked(path.read_bytes().decode("utf-8", "replace")), path


def test_payload_and_saved_config_without_secrets(config, tmp_path):
    payload = to_dict(config, redacted=True)
    plain = to_dict(config)
    kwargs = payload["worker"]["reward"]["reward_function_kwargs"]
    assert kwargs == {"api_key": REDACTED, "judge_token": REDACTED, "endpoint": REDACTED, "max_tokens": 64,
                      "pad_token_id": 7}  # fmt: skip
    del plain["worker"]["reward"]["reward_function_kwargs"], payload["worker"]["reward"]["reward_function_kwargs"]
    del plain["env"]["env_kwargs"], payload["env"]["env_kwargs"]
    assert payload == plain  # every other key as it is
    assert sorted(redacted_keys(config)) == sorted(EXPECTED_KEYS)

    saved = to_yaml(config, redacted=True)  # what the trainer writes as a checkpoint's config.yaml
    assert not leaked(saved)
    tree = yaml.safe_load(saved)
    assert tree["worker"]["reward"]["reward_function_kwargs"]["endpoint"] == "${oc.env:EASYR1_TEST_JUDGE_URL}"
    assert tree["worker"]["reward"]["reward_function_kwargs"]["api_key"] == REDACTED
    assert tree["env"]["env_kwargs"] == {"password": REDACTED, "size": 5}
    # read back, the saved config takes the environment's value again and equals the run's but for the literal
    # secrets
    saved_file = tmp_path / "config.yaml"
    saved_file.write_text(saved, encoding="utf-8")
    reloaded = load_config([f"config={saved_file}"], validate=False)
    assert reloaded.worker.reward.reward_function_kwargs["endpoint"] == SECRETS["endpoint"]
    reloaded.worker.reward.reward_function_kwargs.update(
        api_key=SECRETS["api_key"], judge_token=SECRETS["judge_token"]
    )
    reloaded.env.env_kwargs["password"] = "hunter2-secret"
    assert to_yaml(reloaded) == to_yaml(config)


def test_values_interpolated_from_a_secret_are_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("EASYR1_TEST_RUN_NAME", "run-from-env")
    config = load_config(
        [
            f"config={REPO / 'examples' / 'config_cpu.yaml'}",
            "trainer.experiment_name=${oc.env:EASYR1_TEST_RUN_NAME}",
            "worker.reward.reward_function_kwargs={api_key: sk-9, header: 'Bearer ${.api_key}', "
            "auth: 'Bearer ${worker.reward.reward_function_kwargs.api_key}'}",
            "algorithm.kl_coef=${oc.decode:${oc.env:EASYR1_TEST_KL,0.25}}",
        ],
        validate=False,
    )
    assert config.trainer.experiment_name == "run-from-env" and config.worker.actor.kl_coef == 0.25
    payload = to_dict(config, redacted=True)
    assert payload["trainer"]["experiment_name"] == REDACTED
    assert payload["algorithm"]["kl_coef"] == REDACTED and payload["worker"]["actor"]["kl_coef"] == REDACTED
    assert payload["worker"]["reward"]["reward_function_kwargs"]["auth"] == REDACTED
    assert payload["worker"]["reward"]["reward_function_kwargs"]["header"] == REDACTED
    saved = to_yaml(config, redacted=True)
    assert "sk-9" not in saved
    assert yaml.safe_load(saved)["trainer"]["experiment_name"] == "${oc.env:EASYR1_TEST_RUN_NAME}"


def test_a_shipped_config_has_nothing_to_redact():
    for name in ("config.yaml", "config_cpu.yaml", "config_agent_cpu.yaml"):
        config = load_config([f"config={REPO / 'examples' / name}"], validate=False)
        assert redacted_keys(config) == []
