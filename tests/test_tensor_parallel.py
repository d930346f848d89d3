"""Tensor-parallel rollout in the hybrid worker (TP=2 x DP=1): the engine's log-probs equal the actor's, it wakes
and syncs in the right order, and its shared memory is never left in /dev/shm."""

from __future__ import annotations

import pytest
import torch
from helpers import demo_config, prompt_batch, start_ray, vllm_shared_memory

from easyr1.distributed import WorkerGroup
from easyr1.engines import vllm_cpu_weight_sync
from easyr1.protocol import Batch
from easyr1.workers.hybrid_worker import HybridWorker


pytestmark = [pytest.mark.ray, pytest.mark.vllm]


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 6, "ignore_eos": False}


class RecordingLLM:
    """Forwards everything to the real ``vllm.LLM`` and records the calls made on it. ``sleep`` and ``wake_up``
    are only recorded: vLLM-CPU cannot sleep, and they let the engine act as on GPU (level-2 sleep)."""

    def __init__(self, llm, calls: list) -> None:
        self._llm, self._calls = llm, calls

    def sleep(self, level: int = 1) -> None:
        self._calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._calls.append(("wake_up", tuple(tags or ())))

    def __getattr__(self, name: str):
        attribute = getattr(self._llm, name)
        if not callable(attribute):
            return attribute

        def recorded(*args, **kwargs):
            self._calls.append((name, args[0] if name == "collective_rpc" else None))
            return attribute(*args, **kwargs)

        return recorded


class RecordingWorker(HybridWorker):
    """A hybrid worker whose engine records the calls made on it and, optionally, sleeps as on GPU."""

    def record_engine_calls(self, sleep_as_on_gpu: bool) -> None:
        self.engine_calls: list = []
        self.engine.llm = RecordingLLM(self.engine.llm, self.engine_calls)
        self.engine.sleep_supported = sleep_as_on_gpu

    def take_engine_calls(self) -> list:
        calls, self.engine_calls[:] = list(self.engine_calls), []
        return calls

    def shared_memory_files(self) -> set[str]:
        return vllm_shared_memory()

    def shm_tag(self) -> str | None:
        return self.engine.shm_tag

    def communicator_shm_name(self) -> str | None:
        """The TP communicator's shared-memory group name; None when vLLM's kernels for this CPU have no
        shared-memory all-reduce (its AVX2 build) and the communicator is torch.distributed itself."""
        from vllm.distributed.parallel_state import get_tp_group

        module = get_tp_group().device_communicator.dist_module
        if not hasattr(torch.ops._C, "init_shm_manager"):
            assert module is torch.distributed
            return None
        return module.group_name

    def engine_ranks(self) -> list[int]:
        return self.engine.tensor_parallel_ranks()

    def engine_dtype(self) -> torch.dtype:
        return self.engine.llm.llm_engine.vllm_config.model_config.dtype


def masked_gap(batch: Batch) -> torch.Tensor:
    mask = batch["response_mask"].bool()
    return (batch["rollout_log_probs"] - batch["old_log_probs"]).abs()[mask]


def with_seeds(prompts: Batch, repeat: int, offset: int = 0) -> Batch:
    batch = prompts.repeat(repeat)
    batch["sample_seed"] = torch.arange(len(batch)) + offset
    return batch


# on CPU the engine loads through easyr1's CPU path (vllm_cpu_weight_sync.py), TP=2 included
WEIGHT_SYNC = [("collective_rpc", vllm_cpu_weight_sync.load), ("reset_prefix_cache", None)]


def test_tensor_parallel_rollout_matches_the_actor_and_wakes_in_order(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    config = demo_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        "worker.rollout.tensor_parallel_size=2",
        "worker.rollout.dtype=null",  # the actor's compute dtype: fp32 here
        "worker.actor.optim.lr=1e-2",
        "worker.actor.micro_batch_size_per_device_for_update=4",
    )
    start_ray()
    before = vllm_shared_memory()
    group = WorkerGroup(RecordingWorker, 2, init_args=(config,))
    try:
        group.run_all(RecordingWorker.init_models)
        assert group.run_all(RecordingWorker.engine_ranks) == [[0, 1], [0, 1]]
        assert group.run_all(RecordingWorker.engine_dtype) == [torch.float32, torch.float32]
        tags = group.run_all(RecordingWorker.shm_tag)
        assert tags[0] is not None and tags[0] == tags[1]
        # the communicator's segments are named after this engine's tag, so runs side by side cannot collide
        names = group.run_all(RecordingWorker.communicator_shm_name)
        if names != [None, None]:  # (with vLLM's AVX2 kernels the communicator is gloo and has no segments)
            assert names[0] == names[1] and names[0].startswith(f"{tags[0]}-tp:")
        # the engine is built and its shared memory in use, yet no name is left behind (a killed run leaves none)
        assert group.run_all(RecordingWorker.shared_memory_files)[0] <= before

        # TP=2 x DP=1: both ranks run one engine, each with its own half of the prompts. On CPU the engine
        # keeps its weights between rollouts: the first rollout pushes the actor's weights, ...
        prompts = prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 4)
        group.run_all(RecordingWorker.record_engine_calls, False)
        batch = group.run_split(RecordingWorker.generate, with_seeds(prompts, 2), SAMPLING)
        for calls in group.run_all(RecordingWorker.take_engine_calls):
            assert calls == [*WEIGHT_SYNC, ("generate", None)]
        batch = batch.union(group.run_split(RecordingWorker.compute_old_log_probs, batch, 1.0))
        assert batch["response_mask"].sum() > 0
        assert masked_gap(batch).max() < 1e-3  # 0.35 when the two ranks sent their own prompts
        # ... an unchanged actor is not pushed again ...
        group.run_split(RecordingWorker.generate, with_seeds(prompts, 1, offset=50), SAMPLING)
        for calls in group.run_all(RecordingWorker.take_engine_calls):
            assert calls == [("generate", None)]
        # ... an updated one is, and the engine then samples from the new weights
        batch["advantages"] = torch.where(batch["response_mask"].bool(), 1.0, 0.0)
        batch["old_log_probs"] = batch["old_log_probs"] - 0.05
        group.run_split(RecordingWorker.update_actor, batch, 1.0, len(batch) // 2)
        after = group.run_split(RecordingWorker.generate, with_seeds(prompts, 2, offset=100), SAMPLING)
        for calls in group.run_all(RecordingWorker.take_engine_calls):
            assert calls == [*WEIGHT_SYNC, ("generate", None)]
        after = after.union(group.run_split(RecordingWorker.compute_old_log_probs, after, 1.0))
        assert masked_gap(after).max() < 1e-3

        # As on GPU (sleep recorded, not done): the engine is awake and current, so it generates, then sleeps at
        # level 2, which discards its weights ...
        group.run_all(RecordingWorker.record_engine_calls, True)
        group.run_split(RecordingWorker.generate, with_seeds(prompts, 1, offset=60), SAMPLING)
        for calls in group.run_all(RecordingWorker.take_engine_calls):
            assert calls == [("generate", None), ("sleep", 2)]
        # ... so although the actor has not changed (a DAPO refill round, validation), the next rollout wakes the
        # weights, pushes them, then wakes the KV cache, generates and sleeps
        group.run_split(RecordingWorker.generate, with_seeds(prompts, 1, offset=70), SAMPLING)
        for calls in group.run_all(RecordingWorker.take_engine_calls):
            assert calls == [
                ("wake_up", ("weights",)),
                *WEIGHT_SYNC,
                ("wake_up", ("kv_cache",)),
                ("generate", None),
                ("sleep", 2),
            ]
    finally:
        group.shutdown()
    assert vllm_shared_memory() <= before
