"""Rank-0 initialisation, offload and the per-group weight gather, through the real HybridWorker on 2 Ray ranks.

Two worker groups load the same config: one the everyone-loads way with nothing offloaded, one with EasyR1's
memory settings (``fsdp.enable_rank0_init`` for actor, reference and critic, ``offload.*`` on, the reference's
FSDP CPU offload, which is a no-op on a CPU device). Both must hold bit-identical weights (parameters and
non-persistent buffers such as rotary ``inv_freq``), give bit-identical log-probs, values and update; rank 1 of
the second group must never have read the checkpoint.
"""

from __future__ import annotations

import pytest
import torch
from helpers import demo_config, start_ray, training_batch

from easyr1.distributed import WorkerGroup
from easyr1.distributed.fsdp import gathered_parameters
from easyr1.models import loading
from easyr1.protocol import Batch
from easyr1.workers.hybrid_worker import HybridWorker


pytestmark = pytest.mark.ray

NUM_SAMPLES = 4
MEMORY_SETTINGS = (
    "worker.actor.fsdp.enable_rank0_init=true",
    "worker.ref.fsdp.enable_rank0_init=true",
    "worker.critic.fsdp.enable_rank0_init=true",
    "worker.actor.offload.offload_params=true",
    "worker.actor.offload.offload_optimizer=true",
    "worker.ref.offload.offload_params=true",
    "worker.critic.offload.offload_params=true",
    "worker.critic.offload.offload_optimizer=true",
    "worker.ref.fsdp.enable_cpu_offload=true",
)
# the probe builds no engine; the hf engine's ranks share no tensor-parallel group to compare with vLLM's
NO_VLLM = "worker.rollout.name=hf"
VARIANTS = {
    # actor, reference and critic: three separately loaded models
    # (with adamw_bf16: its bf16 states on 2 ranks, moved by the offload like AdamW's)
    "full": ("algorithm.disable_kl=false", "algorithm.adv_estimator=gae", "worker.actor.optim.strategy=adamw_bf16"),
    # LoRA: peft wraps the (meta) model before sharding; the reference is the actor without adapters
    "lora": ("algorithm.disable_kl=false", "worker.actor.model.lora.rank=4", "worker.actor.optim.lr=1e-2"),
}


class LoadingProbe(HybridWorker):
    """A HybridWorker without a rollout engine (nothing here generates), reporting what it holds. Its config names
    the hf engine, whose ranks share no tensor-parallel group to check against vLLM's. One group of probes serves
    every config of the module: :meth:`load` drops the models of the last one and loads the next, as a fresh worker
    would (``init_models`` seeds every generator first)."""

    def _build_engine(self, dtype: torch.dtype) -> None:
        return None

    def load(self, config) -> None:
        """Forget the models of the last config; load ``config``'s, counting this load's checkpoint reads only."""
        self.__init__(config)
        loading.CHECKPOINT_READS = 0
        self.init_models()

    def full_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every model's full parameters and buffers (collective; every rank returns them)."""
        result = {}
        for name, model in (
            ("actor", self.actor.model),
            ("ref", self.ref and self.ref.model),
            ("critic", self.critic and self.critic.model),
        ):
            if model is None:
                continue
            with gathered_parameters(model, master_weights=True) as parameters:
                weights = dict(parameters)
            weights.update({f"buffer:{key}": value.clone() for key, value in model.named_buffers()})
            result[name] = weights
        return result

    def checkpoint_reads(self) -> int:
        return loading.CHECKPOINT_READS

    def experience(self, batch: Batch) -> dict:
        """Log-probs, reference log-probs and values of this rank's share, then one actor update."""
        result = {"old": self.compute_old_log_probs(batch, 1.0)["old_log_probs"]}
        result["ref"] = self.compute_ref_log_probs(batch, 1.0)["ref_log_probs"]
        if self.critic is not None:
            result["values"] = self.compute_values(batch)["values"]
        batch["old_log_probs"] = result["old"] + 0.05  # some ratios leave 1, so the update is not trivial
        result["metrics"] = {
            key: value
            for key, value in self.update_actor(batch, 1.0, NUM_SAMPLES // 2).items()
            if not key.startswith(("perf/", "memory/"))
        }
        result["residency"] = self.residency()
        result["optimizer"] = (
            type(self.actor.optimizer).__name__,
            sorted({str(v.dtype) for s in self.actor.optimizer.state.values() for k, v in s.items() if k != "step"}),
        )
        return result


@pytest.fixture(scope="module")
def probes():
    """Two ranks of :class:`LoadingProbe`, loaded with each test's configs in turn."""
    start_ray()
    group = WorkerGroup(LoadingProbe, 2, init_args=(None,))
    yield group
    group.shutdown()


def run_group(group: WorkerGroup, config, batch: Batch, checkpoint_dir) -> dict:
    """Load, report, compute and update once; then save a checkpoint, train on, and load it back."""
    group.run_all(LoadingProbe.load, config)
    reads = group.run_all(LoadingProbe.checkpoint_reads)
    initial = group.run_all(LoadingProbe.full_weights)
    results = group.run_split(LoadingProbe.experience, batch)
    final = group.run_all(LoadingProbe.full_weights)
    group.run_all(LoadingProbe.save_checkpoint, str(checkpoint_dir))
    group.run_split(LoadingProbe.experience, batch)  # moves the weights and optimizer states on
    group.run_all(LoadingProbe.load_checkpoint, str(checkpoint_dir))
    reloaded = group.run_all(LoadingProbe.full_weights)
    residency = group.run_all(LoadingProbe.residency)
    return {
        "reads": reads,
        "initial": initial,
        "results": results,
        "final": final,
        "reloaded": reloaded,
        "residency": residency,
    }


def assert_same_weights(left: dict, right: dict) -> None:
    assert left.keys() == right.keys()
    for model in left:
        assert left[model].keys() == right[model].keys(), model
        for key in left[model]:
            assert torch.equal(left[model][key], right[model][key]), f"{model} {key}"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rank0_init_and_offload_change_nothing_but_memory(
    variant, probes, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, capfd
):
    batch = training_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, NUM_SAMPLES)
    batch["returns"] = batch["advantages"]  # only read by critic updates, which this test does not run
    plain = run_group(
        probes, demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *VARIANTS[variant], NO_VLLM), batch, tmp_path / "a"
    )
    memory_config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *VARIANTS[variant], NO_VLLM, *MEMORY_SETTINGS)
    memory = run_group(probes, memory_config, batch, tmp_path / "b")

    models = 1 if variant == "lora" else 3  # the LoRA reference is the actor itself; no critic without gae
    assert plain["reads"] == [models, models]
    assert memory["reads"] == [models, 0]  # rank 1 built its models on the meta device and never read weights

    for group in (plain, memory):  # both ranks of a group hold the same full weights
        assert_same_weights(group["initial"][0], group["initial"][1])
    assert_same_weights(plain["initial"][0], memory["initial"][0])
    assert any(key.endswith("inv_freq") for key in memory["initial"][1]["actor"])  # buffers were compared too

    for ours, theirs in zip(plain["results"], memory["results"]):
        for key in ("old", "ref", "values"):
            if key in ours:
                assert torch.equal(ours[key], theirs[key]), key
        assert ours["metrics"] == theirs["metrics"]
    assert_same_weights(plain["final"][0], memory["final"][0])
    # the update moved the trained weights, so equal final weights mean equal updates
    moved = [
        key
        for key, value in plain["final"][0]["actor"].items()
        if not torch.equal(value, plain["initial"][0]["actor"][key])
    ]
    assert moved

    # with offload every model is back in host memory after each call, having gone to the device and back
    for result in memory["results"]:
        for name, residency in result["residency"].items():
            assert not residency["params_on_device"], name
            assert residency["moves"] >= 2, name
        assert not result["residency"]["actor"]["optimizer_on_device"]
    for result in plain["results"]:
        for name, residency in result["residency"].items():
            assert residency["params_on_device"] and residency["moves"] == 0, name
    # checkpoints save and load with everything offloaded, and leave it offloaded
    for group in (plain, memory):
        assert_same_weights(group["reloaded"][0], group["final"][0])
    assert all(not state["params_on_device"] for rank in memory["residency"] for state in rank.values())
    assert all(not rank["actor"]["optimizer_on_device"] for rank in memory["residency"])

    expected_optimizer = ("AdamWBf16", ["torch.bfloat16"]) if variant == "full" else ("AdamW", ["torch.float32"])
    assert all(result["optimizer"] == expected_optimizer for result in plain["results"] + memory["results"])
    if variant == "full":
        assert "enable_cpu_offload is a no-op on a CPU device" in capfd.readouterr().out
