"""An engine's worker-side preparation runs first in a worker's set-up, before anything loads, and only on a worker
that will hold the engine; vLLM's makes torch inductor's choice of CPU vector instructions there (its probe child then
runs beside a worker holding only its imports), on CPU with a compiled engine only."""

from __future__ import annotations

import pytest
from helpers import demo_config
from torch._inductor import cpu_vec_isa

from easyr1.engines import engine_traits
from easyr1.engines.vllm_engine import probe_cpu_vector_isa
from easyr1.workers import hybrid_worker
from easyr1.workers.hybrid_worker import GENERATOR, HYBRID, TRAINER, HybridWorker


def inductor_has_chosen() -> bool:
    return cpu_vec_isa.valid_vec_isa_list.cache_info().currsize > 0


def test_vllms_preparation_chooses_the_instructions_for_a_compiled_cpu_engine_only(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir
):
    assert engine_traits("vllm").prepare is probe_cpu_vector_isa
    compiled = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.rollout.enforce_eager=false")
    eager = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.rollout.enforce_eager=true")
    for config, device in ((eager, "cpu"), (compiled, "cuda")):
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        probe_cpu_vector_isa(config, device)
        assert not inductor_has_chosen()
    probe_cpu_vector_isa(compiled, "cpu")
    assert inductor_has_chosen()
    assert cpu_vec_isa.pick_vec_isa()  # the choice made: an instruction set this machine and compiler run


class StopBeforeLoading(Exception):
    pass


def stop(*args, **kwargs):
    raise StopBeforeLoading


@pytest.mark.parametrize("role, prepared", [(HYBRID, True), (GENERATOR, True), (TRAINER, False)])
def test_a_worker_prepares_its_engine_before_it_loads_anything(
    role, prepared, tiny_qwen2_5_vl_dir, tiny_dataset_dir, monkeypatch
):
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.rollout.enforce_eager=false")
    monkeypatch.setattr(hybrid_worker, "load_tokenizer_and_processor", stop)  # the first thing a worker loads
    cpu_vec_isa.valid_vec_isa_list.cache_clear()
    with pytest.raises(StopBeforeLoading):
        HybridWorker(config, role).init_models()
    assert inductor_has_chosen() == prepared
