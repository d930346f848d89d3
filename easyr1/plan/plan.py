"""The plan of one run: memory per worker by phase, host memory per worker and node, FLOPs and step time, verdict.

A worker goes through phases, and its device memory peaks in one of them:

- ``generation``: the engine awake (its claim) plus every model's states that offloading leaves on the device;
- ``log-probs`` (one model at a time: actor, reference, critic): that model's states and gathered units, one
  experience micro-batch; on CPU the engine stays (its sleep is a no-op);
- ``actor update`` / ``critic update``: the model's weights, gradients and optimizer states, its gathered units
  and one update micro-batch.

On CPU the device is the host: a worker's host peak is its process base plus its device peak (or the loading peak,
the full model in its storage dtype, when that is larger). On GPU the host holds the process base, offloaded states
and, while loading, the full model on each rank that reads the checkpoint (rank 0 only with
``fsdp.enable_rank0_init``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from easyr1.algorithms import estimator_needs
from easyr1.on_policy import reuses_update_log_probs
from easyr1.plan.activations import (
    ActivationPlan,
    MicroBatch,
    experience_activations,
    patches_per_image,
    update_activations,
)
from easyr1.plan.flops import StepFlops, forward_flops, step_flops, step_seconds
from easyr1.plan.hardware import Device
from easyr1.plan.host import driver_bytes, object_store_bytes, worker_base_bytes
from easyr1.plan.model_size import ModelSize
from easyr1.plan.rollout_engine import EnginePlan, engine_dtype, plan_engine, plan_reward_model
from easyr1.plan.states import ModelStates, actor_trainable, critic_trainable, dtype_bytes, model_states


GIB = 2**30
# Default MFU of a whole step: EasyR1's published 8xH100 baselines measure 6-19% actor MFU for the update alone, and
# generation (memory-bound decoding) runs further below peak; 10% is the middle of that range.
DEFAULT_MFU = 0.10


@dataclass(frozen=True)
class Phase:
    """Device bytes of one worker during one phase, item by item."""

    name: str
    items: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        """The phase's bytes."""
        return sum(value for _, value in self.items)


@dataclass
class Plan:
    """Everything the plan computed for one config on one device (bytes per worker unless named per node)."""

    device: Device
    world: int
    workers_per_node: int
    size: ModelSize
    states: dict[str, ModelStates]
    engine: EnginePlan
    update: ActivationPlan
    experience: ActivationPlan
    update_batch: MicroBatch
    experience_batch: MicroBatch
    phases: list[Phase]
    host_worker: dict[str, int]
    host_node: dict[str, int]
    flops: StepFlops
    mfu: float
    step_seconds: float
    steps_per_epoch: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def device_peak(self) -> int:
        """The largest phase: a worker's peak device memory."""
        return max(phase.total for phase in self.phases)

    @property
    def peak_phase(self) -> Phase:
        """The phase that sets the device peak."""
        return max(self.phases, key=lambda phase: phase.total)

    @property
    def host_worker_peak(self) -> int:
        """Peak host memory of the busiest worker process (rank 0)."""
        return max(self.host_worker.values())

    @property
    def host_node_total(self) -> int:
        """Host memory of the node holding rank 0: its workers, the driver, the object store."""
        return sum(self.host_node.values())

    @property
    def fits_device(self) -> bool:
        """GPU: the device peak within the device's memory. CPU: the node's host memory within the available RAM."""
        if self.device.on_gpu:
            return self.device_peak <= self.device.memory_bytes
        return self.host_node_total <= self.device.memory_bytes

    @property
    def fits_host(self) -> bool:
        """The node's host memory within the node's RAM."""
        return self.host_node_total <= self.device.host_bytes

    @property
    def fits(self) -> bool:
        """Whether the run fits its device and its host."""
        return self.fits_device and self.fits_host

    @property
    def tokens_per_second(self) -> float:
        """Tokens (prompt + response) of a step per second, per device."""
        return self.flops.tokens / self.step_seconds / self.world

    @property
    def hours_per_epoch(self) -> float | None:
        """Hours of one pass over the training data (``None`` when the data's size is not known)."""
        return None if self.steps_per_epoch is None else self.steps_per_epoch * self.step_seconds / 3600


def images_per_sample(config: Any, size: ModelSize) -> int:
    """Images the plan assumes per training row: none for a text model, else ``limit_images``, else one per turn of
    an agent run (``env.max_turns``: every observation may carry one; one with ``env.context=latest``, where a row is
    one turn), else one."""
    if size.vision_shape is None:
        return 0
    if config.worker.rollout.limit_images:
        return config.worker.rollout.limit_images
    return config.env.max_turns if config.env.enabled and config.env.context == "full" else 1


def _rows(path: str) -> int | None:
    file = Path(str(path).split("@", 1)[0])
    if file.is_file() and file.suffix == ".jsonl":
        with file.open("rb") as handle:
            return sum(1 for line in handle if line.strip())
    return None


def steps_per_epoch(config: Any) -> int | None:
    """Steps of one epoch: local jsonl rows (or ``env.num_seeds``) over ``data.rollout_batch_size``."""
    if config.env.enabled:
        rows = config.env.num_seeds
    else:
        rows = _rows(config.data.train_files)
    return None if rows is None else max(rows // config.data.rollout_batch_size, 1)


def _critic_needed(config: Any) -> bool:
    return estimator_needs(config.algorithm.adv_estimator).critic


def make_plan(
    config: Any,
    device: Device,
    size: ModelSize,
    *,
    critic_size: ModelSize | None = None,
    reward_model_size: ModelSize | None = None,
    mfu: float = DEFAULT_MFU,
    prompt_fill: float = 1.0,
    response_fill: float = 1.0,
) -> Plan:
    """Plan ``config`` on ``device`` for the model of ``size`` (``critic_size``: the critic's own model when
    ``worker.critic.model.model_path`` names another one; ``reward_model_size``: ``worker.reward_model``'s, which is
    planned only when given). ``prompt_fill`` / ``response_fill``: mean lengths as
    fractions of the maximum ones, for FLOPs and time only (memory is planned at the maximum lengths)."""
    trainer, data, worker = config.trainer, config.data, config.worker
    split = config.async_training.placement == "split"
    generators = config.async_training.generator_workers if split else 0
    world = trainer.world_size - generators  # the workers that hold the models (a split's trainers)
    kind = device.kind
    actor_params, actor_train = actor_trainable(size, worker.actor.model)
    states = {"actor": model_states("actor", worker.actor, size, kind, world, actor_train, actor_params)}
    lora = worker.actor.model.lora.rank > 0
    if not config.algorithm.disable_kl and not lora:  # with LoRA the reference is the actor without adapters
        states["ref"] = model_states("ref", worker.ref, size, kind, world, 0, size.total)
    if _critic_needed(config):
        critic_model = critic_size or size
        params, trainable = critic_trainable(critic_model, worker.critic.model)
        states["critic"] = model_states("critic", worker.critic, critic_model, kind, world, trainable, params)

    actor = states["actor"]
    compute = dtype_bytes(actor.precision.compute)
    flash = device.on_gpu and compute < 4
    images = images_per_sample(config, size)
    n = worker.rollout.n * config.env.rows_per_episode  # rows per prompt
    share = -(-data.rollout_batch_size * n // world)
    mini_batch = max(worker.actor.global_batch_size * n // world, 1)
    ulysses = worker.actor.ulysses_size

    def micro_batches(group_size: int) -> tuple[MicroBatch, MicroBatch]:
        """The update's and the log-prob pass's micro-batch on a rank of a sequence-parallel group of
        ``group_size``, which pools its members' rows: its micro-batches are cut from ``group_size`` shares."""
        lengths = (data.max_prompt_length, data.max_response_length, images)
        sizes = worker.actor
        return (
            MicroBatch(
                min(sizes.micro_batch_size_per_device_for_update, mini_batch * group_size, share * group_size),
                *lengths,
            ),
            MicroBatch(min(sizes.micro_batch_size_per_device_for_experience, share * group_size), *lengths),
        )

    update_batch, experience_batch = micro_batches(ulysses)
    model = worker.actor.model
    update_settings = {
        "checkpointing": model.enable_gradient_checkpointing,
        "padding_free": worker.actor.padding_free,
        "flash": flash,
        "max_pixels": data.max_pixels or 0,
        "entropy_bonus": worker.actor.entropy_coeff > 0,
        "share_prompt": worker.actor.share_prompt,
    }
    update = update_activations(
        size,
        update_batch,
        compute,
        vision_trainable=not model.freeze_vision_tower and not lora,
        ulysses_size=ulysses,
        **update_settings,
    )
    experience_settings = {
        key: update_settings[key] for key in ("padding_free", "flash", "max_pixels", "share_prompt")
    }
    experience = experience_activations(size, experience_batch, compute, ulysses_size=ulysses, **experience_settings)
    critic_update, critic_values = update, experience
    critic_ulysses = worker.critic.ulysses_size
    if "critic" in states and critic_ulysses != ulysses:
        # the critic's group pools its own rows; its micro-batches are sized as the actor's (as without the split),
        # packed without shared prompts (workers/critic.py)
        critic_batches = micro_batches(critic_ulysses)
        critic_settings = {**update_settings, "share_prompt": False}
        critic_update = update_activations(
            size,
            critic_batches[0],
            compute,
            vision_trainable=not model.freeze_vision_tower and not lora,
            ulysses_size=critic_ulysses,
            **critic_settings,
        )
        critic_values = experience_activations(
            size,
            critic_batches[1],
            compute,
            ulysses_size=critic_ulysses,
            **{key: critic_settings[key] for key in experience_settings},
        )
    engine = plan_engine(config, size, engine_dtype(config, actor.precision.compute, kind), kind, device.memory_bytes)
    phases = _phases(states, engine, update, experience, split, critic_update, critic_values)
    reward_model = None
    if reward_model_size is not None and worker.reward_model.colocated and not split:  # standalone: its own devices
        reward_model = plan_reward_model(config, reward_model_size, engine.dtype, kind, device.memory_bytes)
        phases = _with_reward_model(phases, states, engine, reward_model)
    host_worker, host_node = _host(config, device, states, phases, size)
    flops = _flops(config, size, world, states, prompt_fill, response_fill)
    seconds = step_seconds(flops, trainer.world_size, device.peak_flops, mfu)
    if split:  # generation on the generators overlaps the trainers' passes: the slower side sets the step
        generation = flops.generation / (generators * device.peak_flops * mfu)
        training = (flops.log_probs + flops.updates) / (world * device.peak_flops * mfu)
        seconds = max(generation, training)
    plan = Plan(
        device=device,
        world=world,
        workers_per_node=trainer.n_gpus_per_node,
        size=size,
        states=states,
        engine=engine,
        update=update,
        experience=experience,
        update_batch=update_batch,
        experience_batch=experience_batch,
        phases=phases,
        host_worker=host_worker,
        host_node=host_node,
        flops=flops,
        mfu=mfu,
        step_seconds=seconds,
        steps_per_epoch=steps_per_epoch(config),
    )
    if split:
        plan.notes.append(
            f"async_training.placement=split: {world} trainer(s) hold the models (sharded over them), "
            f"{generators} generator(s) hold only the engine; the step time is the slower of generation "
            f"({generation:.1f} s on the generators) and the trainers' passes ({training:.1f} s), which overlap "
            "under one_step_off"
        )
    if config.async_training.schedule == "partial_rollout":
        plan.notes.append(
            f"async_training.schedule=partial_rollout: the engine holds {engine.rows} rows at once (the pool of "
            "in_flight_prompts); the step time counts a batch's FLOPs, not the long tail partial rollout avoids"
        )
    if engine.sequences < engine.rows:
        plan.notes.append(
            f"the engine's KV cache holds {engine.sequences} sequences at full length, fewer than the {engine.rows} "
            "rows it is given per step: the rest wait in vLLM's queue (slower, not an error)"
        )
    if images:
        plan.notes.append(f"assumes {images} image(s) per sample at data.max_pixels={data.max_pixels}")
    for key, group_size in (("worker.actor.ulysses_size", ulysses), ("worker.critic.ulysses_size", critic_ulysses)):
        if group_size > 1 and (key.startswith("worker.actor") or "critic" in states):
            plan.notes.append(
                f"{key}={group_size}: each rank's micro-batch is cut from its group's pooled rows; it keeps the "
                f"activations of 1/{group_size} of the packed row, the logits of the response positions in it and "
                "the vision tower's on its share of the images"
            )
    if reward_model is not None:
        held = "while it scores, released otherwise" if reward_model.releases else "throughout (never released)"
        plan.notes.append(
            f"worker.reward_model ({worker.reward_model.kind}): {reward_model.claimed_bytes / GIB:.2f} GiB per worker "
            f"{held}; worker.reward_model.gpu_memory_utilization / max_model_len / micro_batch_size size it"
        )
    return plan


def _with_reward_model(
    phases: list[Phase], states: dict[str, ModelStates], engine: EnginePlan, reward_model: EnginePlan
) -> list[Phase]:
    """The phases with the reward model: its own phase after generation (the idle models' states, and the policy's
    engine unless it released its memory), and its memory in every phase when it never releases it."""
    idle = [(f"{role} states (idle)", s.resident_bytes(False, False)) for role, s in states.items()]
    engine_item = [] if engine.releases else [("rollout engine (never released)", engine.claimed_bytes)]
    scoring = Phase("reward model", (("reward model", reward_model.claimed_bytes), *idle, *engine_item))
    if not reward_model.releases:
        kept = ("reward model (never released)", reward_model.claimed_bytes)
        phases = [Phase(phase.name, (*phase.items, kept)) for phase in phases]
    return [phases[0], scoring, *phases[1:]]


def _phases(
    states: dict[str, ModelStates],
    engine: EnginePlan,
    update: ActivationPlan,
    experience: ActivationPlan,
    split: bool = False,
    critic_update: ActivationPlan | None = None,
    critic_values: ActivationPlan | None = None,
) -> list[Phase]:
    """The phases of a worker. With a split placement the generators hold the engine alone (their one phase) and the
    trainers every model but no engine. ``critic_update`` / ``critic_values``: the critic's micro-batches where its
    sequence-parallel size differs from the actor's (default: the actor's)."""
    critic_update = critic_update or update
    critic_values = critic_values or experience

    def others(active: str | None) -> list[tuple[str, int]]:
        return [
            (f"{role} states (idle)", s.resident_bytes(False, False)) for role, s in states.items() if role != active
        ]

    engine_item = [] if engine.releases or split else [("rollout engine (never released)", engine.claimed_bytes)]
    if split:
        phases = [Phase("generation (a generator)", (("rollout engine", engine.claimed_bytes),))]
    else:
        phases = [Phase("generation", (("rollout engine", engine.claimed_bytes), *others(None)))]
    for role, model in states.items():
        phases.append(
            Phase(
                f"{role} log-probs" if role != "critic" else "critic values",
                (
                    (f"{role} states", model.resident_bytes(True, False)),
                    (f"{role} gathered units", model.gathered_bytes),
                    ("experience micro-batch", experience.total if role != "critic" else critic_values.layers),
                    *others(role),
                    *engine_item,
                ),
            )
        )
    for role in ("actor", "critic"):
        if role not in states:
            continue
        model = states[role]
        batch = update.total if role == "actor" else critic_update.layers + critic_update.vision + critic_update.mask
        phases.append(
            Phase(
                f"{role} update",
                (
                    (f"{role} weights + grads + optimizer", model.resident_bytes(True, True)),
                    (f"{role} gathered units", model.gathered_bytes),
                    ("update micro-batch", batch),
                    *others(role),
                    *engine_item,
                ),
            )
        )
    return phases


def _host(
    config: Any, device: Device, states: dict[str, ModelStates], phases: list[Phase], size: ModelSize
) -> tuple[dict[str, int], dict[str, int]]:
    """Host bytes per worker (rank 0 and the others) and per node (rank 0's node)."""
    base = worker_base_bytes(config, device.on_gpu)
    worker = config.worker
    loading = {}  # role -> bytes of the full model while it loads, on a rank that reads the checkpoint
    for role, model in states.items():
        loading[role] = model.parameters * dtype_bytes(model.precision.storage)
    rank0_init = worker.actor.fsdp.enable_rank0_init
    if device.on_gpu:
        offloaded = sum(model.host_bytes() for model in states.values())
        steady = base + offloaded
        load_peak, held = 0, 0
        for role, model in states.items():  # models load one after another; earlier ones are offloaded by then
            load_peak = max(load_peak, base + held + loading[role])
            held += model.host_bytes()
        rank0 = max(steady, load_peak)
        other = steady if rank0_init else rank0
    else:
        device_peak = max(phase.total for phase in phases)
        actor = states["actor"]
        load_peak = base + loading["actor"] + actor.param_bytes
        rank0 = max(base + device_peak, load_peak)
        other = rank0 if not rank0_init else max(base + device_peak, base + actor.param_bytes)
    workers = config.trainer.n_gpus_per_node
    node = {
        "worker rank 0": rank0,
        f"other workers ({workers - 1})": other * (workers - 1),
        "driver (process + dataset files)": driver_bytes(config),
        "Ray object store (one step's batch)": object_store_bytes(config, device.on_gpu),
    }
    return {"rank 0": rank0, "other ranks": other}, node


def _flops(
    config: Any, size: ModelSize, world: int, states: dict[str, ModelStates], prompt_fill: float, response_fill: float
) -> StepFlops:
    data, worker = config.data, config.worker
    length = prompt_fill * data.max_prompt_length + response_fill * data.max_response_length
    images = images_per_sample(config, size)
    vision = 0.0
    if size.vision_shape is not None and images:
        prompt = int(prompt_fill * data.max_prompt_length)
        patches = patches_per_image(size.vision_shape, data.max_pixels or 0, images, prompt)
        vision = 2.0 * size.vision * images * patches
    text = size.text
    forward = forward_flops(
        size.matmul_language,
        text.attention_layers,
        text.heads * text.head_dim,
        length,
        vision,
        text.linear_layers,
        text.linear_flops_per_token,
    )
    samples = data.rollout_batch_size * worker.rollout.n
    old_pass = not reuses_update_log_probs(config, samples, world, config.trainer.critic_warmup + 1)
    return step_flops(
        forward,
        samples * config.env.rows_per_episode,
        length,
        old_pass=old_pass,
        ref_pass=not config.algorithm.disable_kl,
        critic="critic" in states,
        ppo_epochs=worker.actor.ppo_epochs,
        critic_epochs=worker.critic.ppo_epochs,
        checkpointing=worker.actor.model.enable_gradient_checkpointing,
    )
