"""Ulysses sequence parallelism (``distributed/sequence_parallel.py``) against one process, on gloo ranks forked from
the test's process (helpers.fork_ranks).

- The split forward itself: log-probs, entropies and gradients of N = 2 and 4 ranks equal one process's, padding-free
  and with shared prompts, on text, one-image, three-image and video rows of Qwen2.5-VL and Qwen3-VL
  (``tools/check_sequence_parallel.py``; ``make check-families`` runs it on every family).
- The sharded actor and critic on 4 ranks in 2 groups of 2 (data-parallel 2 x sequence-parallel 2): each rank's rows
  of the log-probs and values, the update's metrics and the updated weights equal an unsharded single process's.
- The config's refusals, read from the model's config.json before anything starts.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import demo_config, fork_ranks, training_batch

from easyr1.config.checks import sequence_parallel_problems
from easyr1.distributed import sequence_parallel
from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, shard_model
from easyr1.models.loading import load_model, load_model_config
from easyr1.protocol import Batch
from easyr1.tools.check_families import ulysses_batch
from easyr1.tools.check_sequence_parallel import compare
from easyr1.workers.actor import Actor
from easyr1.workers.critic import Critic, ValueModel


WORLD_SIZE, GROUP_SIZE, NUM_SAMPLES = 4, 2, 8


@pytest.fixture(scope="module")
def mixed_data_dir(tmp_path_factory):
    from easyr1.tools.check_families import DATASET_ROWS
    from easyr1.tools.tiny_dataset import build_mixed_dataset

    return build_mixed_dataset(tmp_path_factory.mktemp("mixed"), num_rows=DATASET_ROWS, seed=0)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_split_forward_equals_one_process_on_images_and_videos(tiny_model_dir, mixed_data_dir, family):
    model_dir = tiny_model_dir(family)
    gaps = compare(model_dir, *ulysses_batch(model_dir, mixed_data_dir), sizes=(2, 4))
    assert set(gaps) == {(size, layout) for size in (2, 4) for layout in ("padding_free", "share_prompt")}
    assert max(gaps.values()) <= 1e-5, gaps


# ------------------------------------------------------------------------------------ sharded actor and critic
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _batch(model_dir: Path, data_dir: Path) -> Batch:
    """Training rows with old log-probs off the policy (clipped ratios), old values and returns."""
    batch = training_batch(model_dir, data_dir, NUM_SAMPLES)
    generator = torch.Generator().manual_seed(3)
    shape = batch["responses"].shape
    batch["old_log_probs"] = -3.0 + 0.5 * torch.randn(shape, generator=generator)
    batch["values"] = 0.1 * torch.randn(shape, generator=generator) * batch["response_mask"]
    batch["returns"] = torch.randn(shape, generator=generator) * batch["response_mask"]
    return batch


def _models(model_dir: Path, config, group: sequence_parallel.SequenceParallelGroup | None):
    """The actor and the critic, sharded over the world when one exists, plain SGD (the step is the gradient)."""
    torch.manual_seed(0)
    policy = load_model(str(model_dir), torch.float32)
    value = ValueModel(load_model(str(model_dir), torch.float32))
    with torch.no_grad():  # a value head that is not zero, so that the backbone gets gradients too
        value.value_head.weight.copy_(0.02 * torch.randn(value.value_head.weight.shape))
    if group is not None:
        sequence_parallel.install(policy, group)
        sequence_parallel.install(value, group, "worker.critic.ulysses_size")
        mesh = data_parallel_mesh("cpu")
        shard_model(policy, mesh)
        shard_model(value, mesh)
    actor = Actor(policy, config.worker.actor, torch.optim.SGD(policy.parameters(), lr=1.0))
    critic = Critic(value, config.worker.critic, torch.optim.SGD(value.parameters(), lr=1.0))
    return actor, critic


def _run(actor: Actor, critic: Critic, batch: Batch, mini_batch_size: int) -> dict:
    log_probs = actor.compute_log_probs(batch, temperature=1.0, micro_batch_size=2)
    values = critic.compute_values(batch, micro_batch_size=2)
    actor_metrics = actor.update_policy(batch, temperature=1.0, mini_batch_size=mini_batch_size)
    critic_metrics = critic.update(batch, mini_batch_size)
    weights = {
        f"actor.{name}": full_tensor(param.detach()).clone() for name, param in actor.model.named_parameters()
    } | {f"critic.{name}": full_tensor(param.detach()).clone() for name, param in critic.model.named_parameters()}
    return {"log_probs": log_probs, "values": values, "metrics": actor_metrics | critic_metrics, "weights": weights}


def _sharded_rank(rank: int, port: int, model_dir: str, data_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        config = demo_config(Path(model_dir), Path(data_dir))
        group = sequence_parallel.SequenceParallelGroup(GROUP_SIZE)
        actor, critic = _models(Path(model_dir), config, group)
        share = NUM_SAMPLES // WORLD_SIZE
        rows = list(range(rank * share, (rank + 1) * share))
        result = _run(actor, critic, _batch(Path(model_dir), Path(data_dir)).index(rows), share)
        torch.save(result, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_sharded_actor_and_critic_in_two_groups_of_two_equal_one_process(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path
):
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir)
    reference = _run(*_models(tiny_qwen2_5_vl_dir, config, None), _batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir), 8)
    fork_ranks(_sharded_rank, (_free_port(), str(tiny_qwen2_5_vl_dir), str(tiny_dataset_dir), str(tmp_path)), 4)
    ranks = [torch.load(tmp_path / f"{rank}.pt", weights_only=False) for rank in range(WORLD_SIZE)]
    # each rank returns its own rows, in order: their concatenation is the whole batch's
    for key in ("log_probs", "values"):
        torch.testing.assert_close(torch.cat([rank[key] for rank in ranks]), reference[key], rtol=0, atol=1e-5)
    initial = dict(load_model(str(tiny_qwen2_5_vl_dir), torch.float32).named_parameters())
    moved = max(float((reference["weights"][f"actor.{n}"] - p.detach()).abs().max()) for n, p in initial.items())
    assert moved > 1e-3  # the update moved the weights: equal weights below mean equal gradients
    for rank in ranks:
        for name, weight in reference["weights"].items():
            torch.testing.assert_close(rank["weights"][name], weight, rtol=0, atol=2e-5, msg=name)
    # every member of a group reports its group's metrics, shares of the global mean over 2 data-parallel groups
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
        mean = sum(rank["metrics"][key] for rank in ranks) / WORLD_SIZE
        assert mean == pytest.approx(reference["metrics"][key], rel=1e-4, abs=1e-6), key


# --------------------------------------------------------------------------------------------------- the config
def test_the_config_names_what_a_model_cannot_split(tiny_model_dir):
    qwen = load_model_config(str(tiny_model_dir("qwen2_5_vl"))).to_dict()
    heads = qwen["text_config"]["num_attention_heads"]
    assert sequence_parallel_problems("worker.actor.ulysses_size", heads, qwen, "m") == []
    (problem,) = sequence_parallel_problems("worker.actor.ulysses_size", heads + 1, qwen, "m")
    assert f"does not divide the model's num_attention_heads={heads}" in problem
    linear = load_model_config(str(tiny_model_dir("qwen3_5"))).to_dict()
    assert any(
        "linear-attention" in p for p in sequence_parallel_problems("worker.actor.ulysses_size", 2, linear, "m")
    )
    gemma = load_model_config(str(tiny_model_dir("gemma3"))).to_dict()
    assert any("token types" in p for p in sequence_parallel_problems("worker.critic.ulysses_size", 2, gemma, "m"))
