"""Padding-free and dynamic micro-batches give the padded, fixed-size update; a batch whose text-only rows all land
on one rank and image rows on the other trains on 2 FSDP workers (no hang) exactly like one process."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import demo_config, start_ray, training_batch

from easyr1.distributed import Worker, WorkerGroup
from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, shard_model
from easyr1.models.loading import load_model
from easyr1.protocol import Batch
from easyr1.workers.actor import Actor, micro_batches


pytestmark = pytest.mark.ray

PROBE_PARAMETERS = ("model.language_model.layers.0.self_attn.q_proj.weight", "model.visual.blocks.0.attn.qkv.weight")


def build_actor(model_dir, actor_config, shard: bool) -> Actor:
    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32)
    if shard:
        shard_model(model, data_parallel_mesh("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the weight change is the gradient itself
    return Actor(model, actor_config, optimizer, banned_token_ids=[model.config.image_token_id])


def log_probs_and_update(actor: Actor, batch: Batch, mini_batch_size: int) -> dict:
    log_probs = actor.compute_log_probs(batch, temperature=1.0, micro_batch_size=2)
    metrics = actor.update_policy(batch, temperature=1.0, mini_batch_size=mini_batch_size)
    parameters = dict(actor.model.named_parameters())
    probes = {name: full_tensor(parameters[name].detach()).clone() for name in PROBE_PARAMETERS}
    return {"log_probs": log_probs, "metrics": metrics, "probes": probes}


class BatchingProbe(Worker):
    """A rank holding a sharded actor."""

    def setup(self, model_dir, actor_config) -> None:
        self.actor = build_actor(model_dir, actor_config, shard=True)

    def run(self, batch: Batch, mini_batch_size: int) -> dict:
        has_images = [bool(row) for row in batch["multi_modal_inputs"]]
        return {**log_probs_and_update(self.actor, batch, mini_batch_size), "has_images": has_images}


@pytest.fixture(scope="module")
def mixed_setup(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path_factory):
    """4 text-only rows, then 4 image rows, with random responses of random lengths and perturbed old log-probs."""
    text_dir = tmp_path_factory.mktemp("text_rows")
    questions = ["Name a colour.", "What colour is grass?", "Say red.", "Which colour is the sky on a clear day?"]
    with (text_dir / "train.jsonl").open("w") as file:
        for question, answer in zip(questions, ["red", "green", "red", "blue"]):
            file.write(json.dumps({"problem": question, "answer": answer}) + "\n")
    text = training_batch(tiny_qwen2_5_vl_dir, text_dir, 4, seed=1)
    images = training_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 4, seed=2)
    batch = Batch.concat([text, images])
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir).worker.actor
    log_probs = build_actor(tiny_qwen2_5_vl_dir, config, shard=False).compute_log_probs(batch, 1.0, 4)
    batch["old_log_probs"] = log_probs + 0.3 * torch.sin(torch.arange(log_probs.numel())).view_as(log_probs)
    return tiny_qwen2_5_vl_dir, config, batch


def single_process(model_dir, actor_config, batch, padding_free: bool, dynamic: bool, micro: int = 2) -> dict:
    actor_config.padding_free, actor_config.dynamic_batching = padding_free, dynamic
    actor_config.share_prompt = False  # the reference is the plain padded forward (prompt sharing has its own tests)
    actor_config.micro_batch_size_per_device_for_update = micro
    return log_probs_and_update(build_actor(model_dir, actor_config, shard=False), batch, len(batch))


def assert_same_update(result: dict, reference: dict, mask: torch.Tensor) -> None:
    torch.testing.assert_close(result["log_probs"][mask], reference["log_probs"][mask], rtol=0, atol=1e-5)
    for key in ("actor/pg_loss", "actor/entropy"):
        assert result["metrics"][key] == pytest.approx(reference["metrics"][key], abs=1e-5), key
    assert result["metrics"]["actor/grad_norm"] == pytest.approx(reference["metrics"]["actor/grad_norm"], rel=1e-4)
    for name in PROBE_PARAMETERS:
        torch.testing.assert_close(result["probes"][name], reference["probes"][name], rtol=0, atol=1e-5, msg=name)


def test_micro_batches_cover_the_batch_and_keep_order(mixed_setup):
    _, _, batch = mixed_setup
    for dynamic in (False, True):
        parts = micro_batches(batch, 2, dynamic)
        assert sorted(i for rows, _ in parts for i in rows) == list(range(len(batch)))
        for rows, part in parts:
            assert torch.equal(part["input_ids"], batch["input_ids"][rows])
    # dynamic: as many groups as the tokens need at 2 full-length rows per group, not one per 2 rows
    tokens = int(batch["attention_mask"].sum())
    assert len(micro_batches(batch, 2, True)) == -(-tokens // (2 * batch["attention_mask"].shape[1]))


@pytest.mark.parametrize("padding_free,dynamic", [(True, False), (False, True), (True, True)])
def test_packed_and_dynamic_updates_equal_the_padded_fixed_update(mixed_setup, padding_free, dynamic):
    model_dir, config, batch = mixed_setup
    reference = single_process(model_dir, config, batch, padding_free=False, dynamic=False)
    initial = dict(load_model(str(model_dir), torch.float32).named_parameters())
    for name in PROBE_PARAMETERS:  # both the language model and the vision tower really moved
        assert (reference["probes"][name] - initial[name]).abs().max() > 1e-4
    result = single_process(model_dir, config, batch, padding_free, dynamic)
    assert_same_update(result, reference, batch["response_mask"].bool())


@pytest.fixture(scope="module")
def probes():
    """Two ranks of :class:`BatchingProbe`, set up afresh by each test."""
    start_ray()
    group = WorkerGroup(BatchingProbe, 2)
    yield group
    group.shutdown()


@pytest.mark.parametrize("padding_free", [False, True])
def test_text_rows_on_one_rank_and_image_rows_on_the_other(mixed_setup, probes, padding_free):
    model_dir, config, batch = mixed_setup
    reference = single_process(model_dir, config, batch, padding_free=padding_free, dynamic=True)
    probes.run_all(BatchingProbe.setup, model_dir, config)
    results = probes.run_split(BatchingProbe.run, batch, len(batch) // 2)
    assert [set(result["has_images"]) for result in results] == [{False}, {True}]
    log_probs = torch.cat([result["log_probs"] for result in results])
    mask = batch["response_mask"].bool()  # padded slots hold different garbage in the two layouts
    torch.testing.assert_close(log_probs[mask], reference["log_probs"][mask], rtol=0, atol=1e-5)
    for result in results:
        assert result["metrics"]["actor/grad_norm"] == pytest.approx(reference["metrics"]["actor/grad_norm"], rel=1e-4)
        for name in PROBE_PARAMETERS:
            torch.testing.assert_close(result["probes"][name], reference["probes"][name], rtol=0, atol=1e-5)
