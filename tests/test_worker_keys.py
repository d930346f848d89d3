"""Config keys that act on the worker: each test fails when its key is read by nothing.

One ``HybridWorker`` is built in this process (rank 0 of a one-rank gloo group, the HF rollout engine, PPO with GAE
so the reference and the critic exist too) from a config that sets every key under test; the tests then look at
what it built and drive single phases of it. Keys: ``trainer.seed`` (worker and driver), ``model.override_config``
(actor, reference, HF engine), ``worker.rollout.dtype`` and ``disable_tqdm`` (HF engine), ``fsdp.enable_full_shard``,
``fsdp.fsdp_size``, the critic's ``freeze_vision_tower``, ``lora`` and LR schedule.
"""

from __future__ import annotations

import random
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers import REPO, demo_config, prompt_batch, training_batch
from torch.distributed.tensor import DTensor

from easyr1.distributed.fsdp import data_parallel_mesh
from easyr1.errors import ConfigError
from easyr1.protocol import ACTOR_FIELDS, Batch
from easyr1.workers.actor import forward_inputs
from easyr1.workers.hybrid_worker import HybridWorker


SEED = 7
EPS = 1e-3  # the override: the tiny model's config has rms_norm_eps 1e-6
CRITIC_LR = 1e-3
OVERRIDES = (
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    f"trainer.seed={SEED}",
    "worker.rollout.name=hf",
    "worker.rollout.n=2",
    "worker.rollout.dtype=bf16",
    "worker.rollout.disable_tqdm=false",
    "data.rollout_batch_size=4",
    "worker.actor.global_batch_size=4",
    "worker.actor.micro_batch_size_per_device_for_update=4",
    "worker.actor.micro_batch_size_per_device_for_experience=8",
    "worker.actor.fsdp.enable_full_shard=false",
    "worker.ref.fsdp.enable_full_shard=false",
    "worker.critic.fsdp.enable_full_shard=false",
    f"worker.actor.model.override_config={{text_config: {{rms_norm_eps: {EPS}}}}}",
    "algorithm.adv_estimator=gae",
    "algorithm.disable_kl=false",
    "worker.critic.global_batch_size=4",
    "worker.critic.micro_batch_size_per_device_for_update=4",
    "worker.critic.model.freeze_vision_tower=true",
    f"worker.critic.optim.lr={CRITIC_LR}",
    "worker.critic.optim.lr_warmup_steps=2",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def worker(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    """The worker, built once; the process group lives as long as the module's tests."""
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *OVERRIDES)
    built = HybridWorker(config)
    built.init_distributed(0, 1, "127.0.0.1", free_port(), 1, "gloo")
    random.seed(0)  # whatever the process drew before, the worker's own seed must decide what comes next
    np.random.seed(0)
    built.init_models()
    # what python's and numpy's generators give right after the set-up, before any test draws from them (torch's
    # was seeded before this change too, and building the models draws from it)
    built.draws_after_init = (random.random(), np.random.random())
    yield built
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir) -> Batch:
    """Four prompts with random responses, advantages, values and returns."""
    data = training_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 4)
    generator = torch.Generator().manual_seed(1)
    data["values"] = torch.zeros_like(data["advantages"])
    data["returns"] = torch.randn(data["advantages"].shape, generator=generator) * data["response_mask"]
    return data


def seeded_draws(seed: int) -> tuple[float, float, float]:
    """The first python, numpy and torch draws of generators seeded with ``seed``."""
    torch_draw = torch.rand((), generator=torch.Generator().manual_seed(seed)).item()
    return random.Random(seed).random(), np.random.RandomState(seed).random_sample(), torch_draw


def norm_eps(model: torch.nn.Module) -> set[float]:
    """The epsilon of every RMS norm of the language model (the vision tower keeps its own)."""
    return {
        module.variance_epsilon
        for name, module in model.named_modules()
        if hasattr(module, "variance_epsilon") and "visual" not in name.split(".")
    }


def test_trainer_seed_seeds_python_and_numpy_on_the_worker(worker):
    python_draw, numpy_draw = worker.draws_after_init
    # building the models draws nothing from python's or numpy's generator, so the first draws are the seed's
    assert python_draw == random.Random(SEED).random()
    assert numpy_draw == np.random.RandomState(SEED).random_sample()


def test_trainer_seed_seeds_the_driver(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    from easyr1.main import run

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    # a run that stops at the model check: after the driver seeded itself, before Ray or any model starts
    with pytest.raises(ConfigError, match="max_model_len"):
        run(
            [
                *demo_argv(tiny_qwen2_5_vl_dir, tiny_dataset_dir),
                "trainer.seed=11",
                "worker.rollout.max_model_len=99999",
            ]
        )
    assert (random.random(), np.random.random(), torch.rand(()).item()) == seeded_draws(11)


def demo_argv(model_dir, data_dir) -> list[str]:
    """Command-line arguments of ``examples/config_cpu.yaml`` pointed at the test model and data."""
    return [
        f"config={REPO / 'examples' / 'config_cpu.yaml'}",
        f"worker.actor.model.model_path={model_dir}",
        f"data.train_files={data_dir / 'train.jsonl'}",
        f"data.val_files={data_dir / 'val.jsonl'}",
        f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
    ]


def test_override_config_reaches_actor_reference_and_hf_engine(worker):
    assert norm_eps(worker.actor.model) == {EPS}
    assert norm_eps(worker.ref.model) == {EPS}
    assert norm_eps(worker.engine.model) == {EPS}


def test_rollout_dtype_is_the_engine_dtype(worker):
    assert worker.precision.compute == torch.float32
    assert {param.dtype for param in worker.engine.model.parameters()} == {torch.bfloat16}


def test_disable_tqdm_false_shows_the_engine_progress_bar(worker, tiny_qwen2_5_vl_dir, tiny_dataset_dir, capsys):
    prompts = prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 1)
    prompts["sample_seed"] = torch.tensor([3])
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 2, "ignore_eos": False}
    capsys.readouterr()
    worker.generate(prompts, sampling)
    assert "generate" in capsys.readouterr().err
    worker.engine.show_progress = False
    try:
        worker.generate(prompts, sampling)
        assert "generate" not in capsys.readouterr().err
    finally:
        worker.engine.show_progress = True


def test_enable_full_shard_false_keeps_blocks_gathered_until_backward(worker, batch):
    model = worker.actor.model
    micro = batch.select(*ACTOR_FIELDS)
    model.train()
    logits = model(**forward_inputs(micro), use_cache=False).logits
    layer = model.model.language_model.layers[0]
    assert not any(isinstance(param, DTensor) for param in layer.parameters())  # still gathered: no second gather
    logits.float().mean().backward()
    assert all(isinstance(param, DTensor) for param in model.parameters())  # the backward resharded every block
    model.zero_grad(set_to_none=True)
    # a pass without a backward must not leave the blocks gathered into the next phase
    worker.compute_experience(micro, 1.0, ["old", "ref", "values"])
    for module in (worker.actor.model, worker.ref.model, worker.critic.model):
        assert all(isinstance(param, DTensor) for param in module.parameters())


def test_critic_freezes_its_vision_tower_and_follows_its_lr_schedule(worker, batch):
    trainable = {name for name, param in worker.critic.model.named_parameters() if param.requires_grad}
    frozen = {name for name, param in worker.critic.model.named_parameters() if not param.requires_grad}
    assert frozen and all("visual" in name.split(".") for name in frozen)
    assert trainable and not any("visual" in name.split(".") for name in trainable)
    assert sum(len(group["params"]) for group in worker.critic.optimizer.param_groups) == len(trainable)
    critic_fields = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "multi_modal_inputs")
    data = batch.select(*critic_fields, "values", "returns")
    # lr_warmup_steps=2: half the learning rate in the first update, all of it from the second
    learning_rates = [worker.update_critic(data, len(data))["critic/lr"] for _ in range(3)]
    assert learning_rates == pytest.approx([CRITIC_LR / 2, CRITIC_LR, CRITIC_LR])


def test_critic_lora_trains_adapters_and_the_value_head_only(worker, batch, tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *OVERRIDES, "worker.critic.model.lora.rank=4")
    other = HybridWorker(config)
    other.device = "cpu"
    other.critic = other._build_critic(data_parallel_mesh("cpu"))
    named = dict(other.critic.model.named_parameters())
    trainable = {name for name, param in named.items() if param.requires_grad}
    assert trainable and all("lora_" in name or name.startswith("value_head.") for name in trainable)
    assert any(name.startswith("value_head.") for name in trainable)
    before = {name: param.full_tensor().clone() for name, param in named.items()}
    critic_fields = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "multi_modal_inputs")
    other.update_critic(batch.select(*critic_fields, "values", "returns"), len(batch))
    changed = {name for name, param in named.items() if not torch.equal(param.full_tensor(), before[name])}
    assert changed and changed <= trainable


def test_fsdp_size_other_than_all_workers_is_refused(worker, tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *OVERRIDES)
    config.worker.critic.fsdp.fsdp_size = 2  # set after loading: the check under test is the worker's
    other = HybridWorker(config)
    other.device = "cpu"
    with pytest.raises(ConfigError, match=r"worker\.critic\.fsdp\.fsdp_size=2"):
        other._build_critic(data_parallel_mesh("cpu"))
    config.worker.critic.fsdp.fsdp_size = 1  # the world size: the one mesh there is
    assert other._build_critic(data_parallel_mesh("cpu")) is not None
