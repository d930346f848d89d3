"""Advantage estimators and policy losses, 3 steps each on the tiny VLM through the CLI entry point.

Each run is the whole loop in this process (``trainer.single_process``: one worker, vLLM, no Ray), so a variant costs
seconds: the variants differ in what the driver and the worker compute, not in how calls cross processes, which the
Ray runs of the other end-to-end tests (and ``test_single_process.py``'s equality with a Ray run) cover.

A variant runs here when it changes what the loop does: which inputs the driver builds (a critic, greedy baselines,
discount), which passes run (reference, old log-probs), how batches are made (filtering, mini rounds) or which config
keys reach the loss. Estimators and losses that only swap the function called at the same place are checked against
written-out references in test_advantages.py and test_policy_losses.py (each through its registry, with the trainer's
inputs): grpo_passk, rloo and reinforce_plus_plus_baseline take exactly grpo's inputs, gspo is gspo_token's loss with
one ratio per sequence, cispo and sapo are called as the default loss is.
"""

from __future__ import annotations

import json
import math

import pytest
from helpers import ONE_PROCESS, demo_config
from test_cli import base_args

from easyr1.build import start_workers
from easyr1.main import main
from easyr1.workers.hybrid_worker import HybridWorker


pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.usefixtures("rank_environment")]
STEPS = 3
PROMPTS = 8  # per step, n=4 samples each: one optimizer step

RUNS = {
    "grpo": ["algorithm.adv_estimator=grpo"],
    "dr_grpo": [
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std=false",
        "worker.actor.loss_agg_mode=seq-mean-token-sum-norm",
    ],
    "reinforce_plus_plus": ["algorithm.adv_estimator=reinforce_plus_plus"],
    "remax": ["algorithm.adv_estimator=remax"],
    "ppo_gae": ["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=8", "worker.critic.optim.lr=1e-3"],
    "gspo_token": [
        "worker.actor.loss_type=gspo_token",
        "worker.actor.loss_agg_mode=seq-mean-token-mean",
        "worker.actor.ppo_epochs=2",  # the second epoch's ratio leaves 1; the old log-probs need their own pass
    ],
    "kl_loss": ["algorithm.disable_kl=false", "algorithm.use_kl_loss=true", "algorithm.kl_penalty=low_var_kl"],
    "kl_in_reward_adaptive": ["algorithm.disable_kl=false", "algorithm.kl_type=adaptive", "algorithm.kl_coef=0.05"],
    "rollout_correction": ["algorithm.rollout_correction=token_tis"],
    "dapo_filtering": ["algorithm.online_filtering=true", "worker.actor.clip_ratio_high=0.28"],
    "dapo_mini_rounds": [
        "algorithm.online_filtering=true",
        "data.mini_rollout_batch_size=2",
        "trainer.max_try_make_batch=60",
    ],
    "grpo_mini_rounds": ["data.mini_rollout_batch_size=4"],
}


def run(model_dir, data_dir, run_dir, extra: list[str]) -> list[dict]:
    code = main(
        [
            *base_args(model_dir, data_dir),
            *ONE_PROCESS,
            f"trainer.max_steps={STEPS}",
            f"data.rollout_batch_size={PROMPTS}",
            f"worker.actor.global_batch_size={PROMPTS}",
            "worker.rollout.n=4",
            f"trainer.save_checkpoint_path={run_dir}",
            *extra,
        ]
    )
    assert code == 0
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# A reward file that fails the run unless every input carries the prompt and the row's other dataset columns, for
# the sampled responses and for ReMax's greedy baselines alike.
CHECKING_REWARD = """
def compute_score(inputs):
    for x in inputs:
        assert "What colour is the shape?" in x["prompt"], x
        assert x["data_source"] == "shapes/" + x["ground_truth"], x
        assert x["extra_info"] == {"row": x["extra_info"]["row"], "colour": x["ground_truth"]}, x
    return [{"overall": float(x["ground_truth"] in x["response"])} for x in inputs]
"""


def with_row_columns(data_dir, out_dir) -> list[str]:
    """The tiny dataset with two more columns per row, scored by ``CHECKING_REWARD``: the CLI arguments."""
    rows = [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines()]
    lines = [
        json.dumps(
            {**row, "data_source": f"shapes/{row['answer']}", "extra_info": {"row": i, "colour": row["answer"]}}
        )
        for i, row in enumerate(rows)
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (out_dir / "checking_reward.py").write_text(CHECKING_REWARD, encoding="utf-8")
    return [
        f"data.train_files={out_dir / 'train.jsonl'}",
        f"data.image_dir={data_dir}",
        f"worker.reward.reward_function={out_dir / 'checking_reward.py'}:compute_score",
    ]


@pytest.mark.parametrize("name", list(RUNS))
def test_algorithm_runs_three_steps(name, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    extra = RUNS[name]
    if name == "remax":  # the reward inputs carry the prompt and the row's other columns (greedy round included)
        extra = [*extra, *with_row_columns(tiny_dataset_dir, tmp_path / "data")]
    records = run(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path / name, extra)
    assert [record["step"] for record in records] == [1, 2, 3]
    for record in records:
        for key in ("actor/pg_loss", "actor/grad_norm", "reward/overall", "rollout/log_prob_gap"):
            assert isinstance(record[key], float) and math.isfinite(record[key]), (key, record)
    if name == "ppo_gae":
        assert {"critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"} <= set(records[0])
    if name == "kl_loss":
        assert "actor/kl_loss" in records[0] and "timing/ref" in records[0]
    if name == "grpo":  # the demo config has disable_kl=true: no reference forward
        assert "timing/ref" not in records[0]
    # the update takes the old log-probs from its own forward unless a batch feeds several optimizer steps or the
    # in-reward KL needs them before the update (easyr1/on_policy.py); the rollout/ metrics are there either way
    separate_pass = name in ("gspo_token", "kl_in_reward_adaptive")
    assert all(("timing/old" in record) == separate_pass for record in records), name
    assert all("rollout/rollout_kl_k1" in record for record in records)
    if name == "kl_in_reward_adaptive":
        assert records[0]["actor/kl_coef"] == pytest.approx(0.05)
        assert records[1]["actor/kl_coef"] != records[0]["actor/kl_coef"]  # the controller moved it
    if name == "rollout_correction":
        assert "rollout_corr/rollout_is_mean" in records[0]
    if name == "dapo_filtering":
        # uninformative groups are dropped and more prompts generated until the batch is full again
        assert all(record["filter/rounds"] >= 1 for record in records)
        assert all(record["batch/samples"] == PROMPTS * 4 for record in records)
        assert any(record["filter/kept_ratio"] < 1 for record in records)
    if name == "dapo_mini_rounds":  # rounds of 2 prompts: at least 4 rounds to fill 8 prompts' worth of groups
        assert all(record["filter/rounds"] >= 4 for record in records)
        assert all(record["batch/samples"] == PROMPTS * 4 for record in records)
    if name in ("dapo_mini_rounds", "remax"):
        # several generation rounds a step (refills; ReMax's greedy round), one actor update a step: the engines
        # sleep once a step, after the last round (on GPU a sleep discards the weights: one sync per wake), and take
        # the weights once a step (the first: the checkpoint's, then after each update)
        assert [(record["perf/engine_sleeps"], record["perf/weight_syncs"]) for record in records] == [(1, 1)] * 3
    if name == "grpo_mini_rounds":  # two rounds of 4 prompts make one step of 8
        assert all(record["batch/samples"] == PROMPTS * 4 for record in records)


def test_disable_kl_loads_no_reference_model(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    for disable_kl in (True, False):
        config = demo_config(
            tiny_qwen2_5_vl_dir,
            tiny_dataset_dir,
            *ONE_PROCESS,
            "worker.rollout.name=hf",
            f"algorithm.disable_kl={disable_kl}",
        )
        group = start_workers(config, "cpu")
        try:
            group.run_all(HybridWorker.init_models)
            assert group.run_all(HybridWorker.has_reference_model) == [not disable_kl]
        finally:
            group.shutdown()


def test_online_filtering_gives_up_with_a_clear_error(capsys, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    # no group can have a mean score strictly between 0.99 and 1.0 on this untrained model
    code = main(
        [
            *base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir),
            *ONE_PROCESS,
            "trainer.max_steps=1",
            "algorithm.online_filtering=true",
            "algorithm.filter_low=0.99",
            "algorithm.filter_high=1.0",
            "trainer.max_try_make_batch=2",
            f"trainer.save_checkpoint_path={tmp_path}",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "trainer.max_try_make_batch=2" in err and "algorithm.filter_low" in err
