"""The FSDP2 actor on 2 Ray workers against one unsharded process and across micro-batch sizes, per loss mode."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from helpers import demo_config, start_ray, training_batch

from easyr1.algorithms import LOSS_AGG_MODES
from easyr1.distributed import Worker, WorkerGroup
from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, shard_model
from easyr1.models.loading import load_model
from easyr1.protocol import Batch  # noqa: TC001
from easyr1.workers.actor import Actor


pytestmark = pytest.mark.ray

NUM_SAMPLES = 8
PROBE_PARAMETER = "model.language_model.layers.0.self_attn.q_proj.weight"


def build_actor(model_dir, actor_config, shard: bool) -> Actor:
    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32)
    if shard:
        shard_model(model, data_parallel_mesh("cpu"))
    # plain SGD: the weight change is the gradient itself (Adam's first step, g / |g|, would amplify float noise
    # in near-zero gradients into visible weight differences)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    return Actor(model, actor_config, optimizer, banned_token_ids=[model.config.image_token_id])


def log_probs_and_update(actor: Actor, batch: Batch, mini_batch_size: int) -> dict:
    """Log-probs, then one update (``batch`` carries ``old_log_probs``)."""
    log_probs = actor.compute_log_probs(batch, temperature=1.0, micro_batch_size=2)
    metrics = actor.update_policy(batch, temperature=1.0, mini_batch_size=mini_batch_size)
    probe = full_tensor(dict(actor.model.named_parameters())[PROBE_PARAMETER].detach()).clone()
    return {"log_probs": log_probs, "metrics": metrics, "probe": probe}


class ActorProbe(Worker):
    """A rank holding a sharded actor, for comparison with the unsharded one."""

    def setup(self, model_dir, actor_config) -> None:
        self.actor = build_actor(model_dir, actor_config, shard=True)

    def run(self, batch: Batch, mini_batch_size: int) -> dict:
        result = log_probs_and_update(self.actor, batch, mini_batch_size)
        result["world_size"] = dist.get_world_size()
        return result


@pytest.fixture(scope="module")
def actor_setup(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir)
    actor_config = config.worker.actor
    batch = training_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, NUM_SAMPLES)
    # old log-probs off the current policy, so that some PPO ratios leave the clip range
    log_probs = build_actor(tiny_qwen2_5_vl_dir, actor_config, shard=False).compute_log_probs(batch, 1.0, 4)
    shift = 0.3 * torch.sin(torch.arange(log_probs.numel(), dtype=torch.float32)).view_as(log_probs)
    batch["old_log_probs"] = log_probs + shift
    return tiny_qwen2_5_vl_dir, actor_config, batch


def single_process(model_dir, actor_config, batch, micro_batch_size: int) -> dict:
    actor_config.micro_batch_size_per_device_for_update = micro_batch_size
    return log_probs_and_update(build_actor(model_dir, actor_config, shard=False), batch, NUM_SAMPLES)


@pytest.fixture(scope="module")
def two_workers():
    start_ray()
    group = WorkerGroup(ActorProbe, 2)
    yield group
    group.shutdown()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_size_does_not_change_the_update(actor_setup, mode):
    model_dir, actor_config, batch = actor_setup
    actor_config.loss_agg_mode = mode
    results = {size: single_process(model_dir, actor_config, batch, size) for size in (1, 2, 4)}
    reference = results[4]
    for size in (1, 2):
        result = results[size]
        torch.testing.assert_close(result["log_probs"], reference["log_probs"], rtol=0, atol=1e-6)
        assert result["metrics"]["actor/pg_loss"] == pytest.approx(reference["metrics"]["actor/pg_loss"], abs=1e-6)
        assert result["metrics"]["actor/grad_norm"] == pytest.approx(reference["metrics"]["actor/grad_norm"], rel=1e-5)
        torch.testing.assert_close(result["probe"], reference["probe"], rtol=0, atol=1e-6)
    # the update really moved the weights, so equal probes mean equal updates
    initial = dict(load_model(str(model_dir), torch.float32).named_parameters())[PROBE_PARAMETER]
    assert (reference["probe"] - initial).abs().max() > 1e-4


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_two_fsdp_workers_equal_one_unsharded_process(actor_setup, two_workers, mode):
    model_dir, actor_config, batch = actor_setup
    actor_config.loss_agg_mode = mode
    actor_config.micro_batch_size_per_device_for_update = 2
    reference = single_process(model_dir, actor_config, batch, 2)

    two_workers.run_all(ActorProbe.setup, model_dir, actor_config)
    results = two_workers.run_split(ActorProbe.run, batch, NUM_SAMPLES // 2)
    assert [result["world_size"] for result in results] == [2, 2]
    sharded_log_probs = torch.cat([result["log_probs"] for result in results])
    torch.testing.assert_close(sharded_log_probs, reference["log_probs"], rtol=0, atol=1e-6)
    # each worker reports its share of the global loss scaled by the world size; their mean is the global loss
    pg_loss = sum(result["metrics"]["actor/pg_loss"] for result in results) / 2
    assert pg_loss == pytest.approx(reference["metrics"]["actor/pg_loss"], abs=1e-6)
    for result in results:
        assert result["metrics"]["actor/grad_norm"] == pytest.approx(reference["metrics"]["actor/grad_norm"], rel=1e-5)
        torch.testing.assert_close(result["probe"], reference["probe"], rtol=0, atol=1e-5)
