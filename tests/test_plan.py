"""The memory and step-time plan: exact parameter counts, how sharding, offload, LoRA, the critic and dtypes move
the numbers (hand-computed for the tiny model), the refusal of a run that cannot fit, and the scripts' last line."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from easyr1.config import load_config
from easyr1.errors import ConfigError
from easyr1.models.loading import load_model, load_model_config
from easyr1.plan import Device, gpu_device, make_plan, measure_model
from easyr1.plan.check import check_plan_fits
from easyr1.plan.reference_models import write_reference_model
from easyr1.plan.report import render, summary_line


GIB = 2**30
LAST_LINE = re.compile(r"^plan: fits=(yes|no) device_peak_gb=\d+\.\d\d host_peak_gb=\d+\.\d\d step_seconds=\d+\.\d$")
# A CPU machine of fixed size, so the verdicts do not depend on what else runs here.
CPU = Device(name="cpu", kind="cpu", memory_bytes=64 * GIB, peak_flops=1e11, host_bytes=64 * GIB)


def cpu_config(model: Path, data: Path, *overrides: str):
    """The demo's config on ``model`` and ``data`` with ``overrides``."""
    return load_config(
        [
            "config=examples/config_cpu.yaml",
            f"worker.actor.model.model_path={model}",
            f"data.train_files={data / 'train.jsonl'}",
            f"data.val_files={data / 'val.jsonl'}",
            *overrides,
        ]
    )


def plan_for(config, device: Device = CPU):
    """The plan of ``config`` on ``device``."""
    model = config.worker.actor.model
    return make_plan(config, device, measure_model(load_model_config(model.model_path), model.override_config))


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2"])
def test_parameter_counts_equal_the_real_model(tiny_model_dir, family):
    from easyr1.models.lora import apply_lora
    from easyr1.workers.critic import ValueModel

    path = tiny_model_dir(family)
    size = measure_model(load_model_config(str(path)))
    model = load_model(str(path), torch.float32)
    assert size.total == sum(p.numel() for p in model.parameters())
    assert size.vision == sum(p.numel() for name, p in model.named_parameters() if ".visual." in name)
    assert size.embeddings == model.get_input_embeddings().weight.numel()
    critic_parameters = sum(p.numel() for p in ValueModel(load_model(str(path), torch.float32)).parameters())
    assert size.backbone + size.text.hidden + 1 == critic_parameters
    lora = SimpleNamespace(rank=4, alpha=8, target_modules="all-linear", exclude_modules=None)
    adapters = sum(p.numel() for p in apply_lora(model, lora).parameters() if p.requires_grad)
    assert size.lora_parameters(4, "all-linear", None) == adapters


def test_lora_targets_by_name_count_what_peft_adapts(tiny_qwen2_5_vl_dir):
    from easyr1.models.lora import apply_lora

    size = measure_model(load_model_config(str(tiny_qwen2_5_vl_dir)))
    model = load_model(str(tiny_qwen2_5_vl_dir), torch.float32)
    lora = SimpleNamespace(rank=8, alpha=16, target_modules="q_proj,v_proj", exclude_modules=None)
    adapters = sum(p.numel() for p in apply_lora(model, lora).parameters() if p.requires_grad)
    assert size.lora_parameters(8, "q_proj,v_proj", None) == adapters


def test_states_shard_over_workers_with_hand_computed_bytes(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    one = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "trainer.n_gpus_per_node=1"))
    two = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "trainer.n_gpus_per_node=2"))
    total = one.size.total
    actor = one.states["actor"]
    # CPU: fp32 weights, fp32 gradients, two fp32 AdamW moments
    assert (actor.param_bytes, actor.grad_bytes, actor.optimizer_bytes) == (4 * total, 4 * total, 8 * total)
    assert two.states["actor"].param_bytes == 4 * total // 2
    assert two.states["actor"].optimizer_bytes == 8 * total // 2
    assert set(one.states) == {"actor"}  # the demo disables KL: no reference model


def test_bf16_moments_lora_frozen_tower_reference_and_critic(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    base = ("trainer.n_gpus_per_node=1",)
    size = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *base)).size
    bf16 = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *base, "worker.actor.optim.strategy=adamw_bf16"))
    assert bf16.states["actor"].optimizer_bytes == 2 * 2 * size.total

    frozen = plan_for(
        cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *base, "worker.actor.model.freeze_vision_tower=true")
    )
    assert frozen.states["actor"].grad_bytes == 4 * (size.total - size.vision)
    assert frozen.update.vision == 0  # nothing of a frozen tower is kept for the backward

    kl = ("algorithm.disable_kl=false", "algorithm.use_kl_loss=true")
    with_ref = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *base, *kl))
    assert with_ref.states["ref"].param_bytes == 4 * size.total and with_ref.states["ref"].grad_bytes == 0

    lora = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *base, *kl, "worker.actor.model.lora.rank=4"))
    adapters = size.lora_parameters(4, "all-linear", None)
    assert "ref" not in lora.states  # the reference is the actor with its adapters disabled
    assert lora.states["actor"].param_bytes == 4 * (size.total + adapters)
    assert lora.states["actor"].optimizer_bytes == 8 * adapters

    gae = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *base, "algorithm.adv_estimator=gae"))
    assert gae.states["critic"].parameters == size.backbone + size.text.hidden + 1
    assert "critic" not in with_ref.states
    no_kl = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir))
    assert gae.flops.total > with_ref.flops.total > no_kl.flops.total  # a value pass + update; a reference pass


def test_the_hf_engines_cache_holds_one_generates_rows(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    """The HF engine generates its rows in batches of the experience micro-batch: its cache is planned for one
    batch's full sequences, hand-computed here (2 attention layers, 2 KV heads of 32, fp32, max_model_len tokens)."""
    plans, config = {}, None
    for micro_batch in (4, 16, 128):
        config = cpu_config(
            tiny_qwen2_5_vl_dir,
            tiny_dataset_dir,
            "worker.rollout.name=hf",
            f"worker.actor.micro_batch_size_per_device_for_experience={micro_batch}",
        )
        plans[micro_batch] = plan_for(config)
    text = plans[4].size.text
    assert (text.attention_layers, text.kv_heads, text.head_dim) == (2, 2, 32)
    full_sequence = text.attention_layers * 2 * text.kv_heads * text.head_dim * 4 * config.worker.rollout.max_model_len
    own_rows = config.data.rollout_batch_size * config.worker.rollout.n // config.trainer.n_gpus_per_node
    assert 4 < own_rows < 128
    for micro_batch, plan in plans.items():
        assert plan.engine.kv_bytes == min(micro_batch, own_rows) * full_sequence, micro_batch


def test_gpu_dtypes_offload_and_sleep_move_memory(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    h100 = gpu_device("H100")
    gpu = ("trainer.device=cuda", "trainer.n_gpus_per_node=2", "algorithm.disable_kl=false")
    gpu += (
        "worker.rollout.dtype=null",
        "worker.actor.fsdp.torch_dtype=null",
        "worker.actor.fsdp.enable_rank0_init=true",
    )
    kept = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *gpu), h100)
    total = kept.size.total
    actor, ref = kept.states["actor"], kept.states["ref"]
    assert actor.param_bytes == 4 * total // 2 and actor.gathered_bytes == 2 * actor.gathered_parameters
    assert ref.param_bytes == 2 * total // 2  # the reference is stored in bf16 on GPU
    assert kept.engine.dtype == torch.bfloat16 and kept.engine.releases
    assert kept.engine.claimed_bytes == int(0.6 * h100.memory_bytes)
    offload = ("worker.actor.offload.offload_params=true", "worker.actor.offload.offload_optimizer=true")
    moved = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *gpu, *offload), h100)
    generation = {phase.name: phase.total for phase in kept.phases}["generation"]
    moved_generation = {phase.name: phase.total for phase in moved.phases}["generation"]
    assert generation - moved_generation == actor.param_bytes + actor.optimizer_bytes
    # ranks other than 0 never hold the full model (rank-0 init): their host memory is the base plus what is offloaded
    offloaded = actor.param_bytes + actor.optimizer_bytes
    assert moved.host_worker["other ranks"] - kept.host_worker["other ranks"] == offloaded


def test_activations_follow_checkpointing_padding_and_micro_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    plain = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir))
    checkpointed = plan_for(
        cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.actor.model.enable_gradient_checkpointing=true")
    )
    assert checkpointed.update.layers < plain.update.layers
    padded = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.actor.padding_free=false"))
    packed = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.actor.padding_free=true"))
    rows, length = packed.update_batch.samples, 64 + 4
    assert padded.update.mask == rows * length**2 and packed.update.mask == (rows * length) ** 2
    # fp32 logits and their gradient, plus the entropy bonus's softmax (the demo sets entropy_coeff): 12 bytes
    vocab = packed.size.text.vocab
    assert padded.update.logits == rows * (4 + 1) * vocab * 12  # padded rows ask for one logit more
    assert packed.update.logits == rows * 4 * vocab * 12
    half = plan_for(
        cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.actor.micro_batch_size_per_device_for_update=16")
    )
    assert half.update.layers * 2 == plain.update.layers


def test_ulysses_divides_each_ranks_activations(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    """A rank of a sequence-parallel group of 2 keeps half the decoder's tokens (plus the all-to-all's layout of the
    attention output and the whole row's embeddings), half the images' vision activations and half the response
    logits of the same pooled micro-batch; the group's micro-batch grows with the pooled rows."""
    packed = ("worker.actor.padding_free=true", "worker.actor.share_prompt=false", "worker.critic.ulysses_size=2")
    one = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *packed, "algorithm.adv_estimator=gae"))
    two = plan_for(
        cpu_config(
            tiny_qwen2_5_vl_dir,
            tiny_dataset_dir,
            *packed,
            "algorithm.adv_estimator=gae",
            "worker.actor.ulysses_size=2",
        )
    )
    assert one.update_batch == two.update_batch and one.update_batch.samples == 32
    text, batch = one.size.text, one.update_batch
    extras = batch.tokens // 2 * text.heads * text.head_dim * 4 * text.layers + batch.tokens * text.hidden * 4
    image_tokens = batch.samples * 3136 // 14**2 // 4
    assert two.update.layers == one.update.layers // 2 + extras + image_tokens * text.hidden * 4
    pixels = batch.samples * 3136 * 3 * 2 * 4  # the merged copy; in a group also the pooled rows and the share
    assert (two.update.vision - 2 * pixels) * 2 == one.update.vision - pixels > 0
    assert two.update.logits * 2 == one.update.logits > 0
    assert one.update.mask == two.update.mask == 0  # packed without shared prompts: a zero-stride mask
    embeddings = one.experience_batch.tokens * text.hidden * 4  # the whole row's, on every rank of the group
    assert two.experience.layers == one.experience.layers // 2 + embeddings
    assert two.experience.vision * 2 == one.experience.vision > 0
    # the critic (worker.critic.ulysses_size=2 in both) is planned with its own group, not the actor's
    critic = {phase.name: phase for phase in one.phases}["critic update"]
    assert dict(critic.items)["update micro-batch"] == two.update.layers + two.update.vision + two.update.mask
    # a group pools its members' shares: micro-batches larger than one rank's share come from the pool
    big = ("worker.actor.micro_batch_size_per_device_for_update=512", "data.rollout_batch_size=4")
    small = plan_for(
        cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *packed, *big, "worker.actor.global_batch_size=4")
    )
    pooled = plan_for(
        cpu_config(
            tiny_qwen2_5_vl_dir,
            tiny_dataset_dir,
            *packed,
            *big,
            "worker.actor.global_batch_size=4",
            "worker.actor.ulysses_size=2",
        )
    )
    assert pooled.update_batch.samples == 2 * small.update_batch.samples == 32


def test_last_line_and_cli(tiny_qwen2_5_vl_dir, tiny_dataset_dir, capsys):
    from easyr1.tools.plan import main

    plan = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir))
    assert LAST_LINE.match(summary_line(plan))
    assert render(plan).splitlines()[-1] == summary_line(plan)
    args = [
        "config=examples/config_cpu.yaml",
        f"worker.actor.model.model_path={tiny_qwen2_5_vl_dir}",
        f"data.train_files={tiny_dataset_dir / 'train.jsonl'}",
        "--gpu",
        "h100",
    ]
    assert main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert LAST_LINE.match(last) and last.startswith("plan: fits=yes")
    assert main([*args[:-2], "--gpu", "V100"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    missing = tiny_dataset_dir / "no_such_model"
    assert main([args[0], f"worker.actor.model.model_path={missing}", *args[2:]]) == 2
    assert f"cannot read the config.json of worker.actor.model.model_path={missing}" in capsys.readouterr().err


def test_72b_on_one_gpu_is_refused_with_numbers_and_skip_lets_it_pass(tmp_path, tiny_dataset_dir):
    model = write_reference_model("qwen2.5-vl-72b", tmp_path / "72b")
    config = cpu_config(model, tiny_dataset_dir, "trainer.n_gpus_per_node=1", "trainer.device=cuda")
    with pytest.raises(ConfigError) as refused:
        check_plan_fits(config, gpu_device("H100"))
    message = str(refused.value)
    assert "does not fit" in message and "GiB" in message and "skip_plan_check" in message
    # weights + grads + two moments of 73.4 B fp32 parameters on one device
    assert re.search(r"device peak (\d+\.\d\d) GiB", message)
    assert float(re.search(r"device peak (\d+\.\d\d) GiB", message).group(1)) > 16 * 73.4e9 / GIB
    config.trainer.skip_plan_check = True
    assert check_plan_fits(config, gpu_device("H100")).startswith("plan: fits=no")


def test_main_refuses_before_ray_or_any_model(tmp_path, tiny_dataset_dir, capsys):
    import ray

    from easyr1.main import main
    from easyr1.models import loading

    model = write_reference_model("qwen2.5-vl-72b", tmp_path / "72b")
    reads = loading.CHECKPOINT_READS
    args = [
        "config=examples/config_cpu.yaml",
        f"worker.actor.model.model_path={model}",
        f"data.train_files={tiny_dataset_dir / 'train.jsonl'}",
        f"data.val_files={tiny_dataset_dir / 'val.jsonl'}",
        "data.max_prompt_length=64",
        "trainer.n_gpus_per_node=1",
    ]
    assert main(args) == 2  # on this CPU machine: a 72B model's host memory exceeds the available RAM
    error = capsys.readouterr().err
    assert "this run does not fit" in error and "the RAM available on this machine" in error, error
    assert not ray.is_initialized() and loading.CHECKPOINT_READS == reads


def test_the_demo_and_easyr1_example_fit(tmp_path, tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    demo = cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir)
    assert check_plan_fits(demo).startswith("plan: fits=yes")  # this machine's available RAM
    model = write_reference_model("qwen2.5-vl-7b", tmp_path / "7b")
    example = load_config(["config=examples/config.yaml", f"worker.actor.model.model_path={model}"])
    assert check_plan_fits(example, gpu_device("H100")).startswith("plan: fits=yes")


def test_agent_runs_plan_an_image_per_turn(tiny_qwen2_5_vl_dir):
    config = load_config(
        ["config=examples/config_agent_cpu.yaml", f"worker.actor.model.model_path={tiny_qwen2_5_vl_dir}"]
    )
    plan = plan_for(config)
    assert plan.update_batch.images == config.env.max_turns == plan.experience_batch.images
    one_image = plan_for(
        load_config(
            [
                "config=examples/config_agent_cpu.yaml",
                f"worker.actor.model.model_path={tiny_qwen2_5_vl_dir}",
                "worker.rollout.limit_images=1",
            ]
        )
    )
    assert one_image.update.vision * config.env.max_turns == plan.update.vision


def test_agent_runs_with_one_row_per_turn_plan_one_image_and_max_turns_rows_per_episode(tiny_qwen2_5_vl_dir):
    base = ["config=examples/config_agent_cpu.yaml", f"worker.actor.model.model_path={tiny_qwen2_5_vl_dir}"]
    full = plan_for(load_config([*base, "worker.actor.micro_batch_size_per_device_for_update=1000"]))
    latest = plan_for(
        load_config([*base, "env.context=latest", "worker.actor.micro_batch_size_per_device_for_update=1000"])
    )
    turns = load_config(base).env.max_turns
    assert latest.update_batch.images == 1 and full.update_batch.images == turns
    # the micro-batch is the worker's whole share: 16 seeds x 8 episodes over 2 workers, a row per turn in latest
    assert full.update_batch.samples == 64 and latest.update_batch.samples == 64 * turns
    assert latest.flops.tokens == full.flops.tokens * turns  # each row as long as the limits allow


def test_step_flops_by_hand(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    config = cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.actor.reuse_update_log_probs=false")
    plan = plan_for(config)
    size, text, vision = plan.size, plan.size.text, plan.size.vision_shape
    length = 64 + 4
    patches = min(3136 // vision.patch_size**2, vision.merge_size**2 * 64)
    forward = 2 * size.matmul_language * length + 2 * text.layers * text.heads * text.head_dim * length**2
    forward += 2 * size.vision * patches
    samples = 16 * 8
    assert plan.flops.generation == pytest.approx(forward * samples)
    assert plan.flops.log_probs == pytest.approx(forward * samples)  # the old-log-prob pass; no reference
    assert plan.flops.updates == pytest.approx(3 * forward * samples)
    assert plan.step_seconds == pytest.approx(5 * forward * samples / (2 * CPU.peak_flops * plan.mfu))
    reused = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.actor.reuse_update_log_probs=true"))
    assert reused.flops.log_probs == 0  # one mini-batch, one epoch: the update's forward gives the old log-probs


def test_what_would_fit_is_planned_again_and_fits(tmp_path):
    from easyr1.plan.check import plan_run

    model = write_reference_model("qwen2.5-vl-7b", tmp_path / "7b")
    config = load_config(
        [
            "config=examples/config.yaml",
            f"worker.actor.model.model_path={model}",
            "worker.actor.micro_batch_size_per_device_for_update=16",
            "worker.actor.model.enable_gradient_checkpointing=false",
        ]
    )
    plan, suggestions = plan_run(config, gpu_device("H100"))
    assert not plan.fits and plan.peak_phase.name == "actor update"
    assert suggestions and all(result.fits for _, result in suggestions)
    changed = {key for change, _ in suggestions for key in change}
    assert "worker.actor.micro_batch_size_per_device_for_update" in changed
    assert config.worker.actor.micro_batch_size_per_device_for_update == 16  # the config itself is left alone
    text = render(plan, suggestions)
    assert "does not fit" in text and "would fit with" in text
