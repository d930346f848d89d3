"""The ``async_training`` section: when samples are generated relative to the updates that train on them.

``schedule=sync`` (the default) is the loop as it always was: a step's samples are generated with the weights the
step starts from. The asynchronous schedules (:mod:`easyr1.schedules`) let generation run ahead of training, so a
sample may come from older weights; its age is counted in weight versions (version ``v`` = the weights after ``v``
optimizer steps; step ``k`` trains from version ``k - 1``; a sample's staleness at step ``k`` is ``k - 1`` minus the
version of its first token):

- ``one_step_off``: the batch of step ``k + 1`` is generated with the weights of step ``k - 1`` while step ``k``
  trains (staleness 1); generation and training run on different workers (``placement=split``).
- ``partial_rollout``: more prompts generate than a step needs; generation stops once the step's groups are
  complete, the step trains, and the unfinished responses continue under the new weights (colocated workers).

The section's names follow verl's ``async_training`` (``staleness_threshold`` there counts samples; here
``max_staleness`` counts weight versions, AReaL's ``max_head_offpolicyness``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from easyr1.config.fields import option
from easyr1.config.rules import AT_LEAST_ONE, AT_LEAST_ONE_OR_NULL, NON_NEGATIVE, one_of


SCHEDULES = ("sync", "one_step_off", "partial_rollout")
PLACEMENTS = ("colocated", "split")
STALE_SAMPLES = ("wait", "drop")


@dataclass
class AsyncConfig:
    """Asynchronous schedules: generation overlapped with training, with a bound on how old a sample may be."""

    schedule: str = option(
        "sync",
        "sync (each step generates with the weights it trains from), one_step_off (the next batch generates while "
        "this one trains; placement=split), partial_rollout (extra prompts generate; unfinished responses continue "
        "under the next step's weights)",
    )
    placement: str = option(
        "colocated",
        "colocated (every worker generates and trains, sleeping its engine while it trains) or split "
        "(generator_workers workers only generate, the others only train; new weights pushed after each update)",
    )
    generator_workers: int = option(0, "placement=split: the workers that only generate (the others train)")
    max_staleness: int = option(
        1,
        "most weight versions between a sample's first token and the step that trains on it (one_step_off needs 1)",
    )
    stale_samples: str = option(
        "wait",
        "partial_rollout, a response at the staleness bound: wait (the step waits for it to finish and trains on "
        "it) or drop (it is discarded and its prompt generated again)",
    )
    in_flight_prompts: int | None = option(
        None,
        "partial_rollout: prompts generating at once (null: twice data.rollout_batch_size); the step stops "
        "generation once data.rollout_batch_size of their groups are complete",
    )

    @property
    def enabled(self) -> bool:
        """Whether generation may run ahead of training (any schedule but ``sync``)."""
        return self.schedule != "sync"


def generating_prompts(config: Any) -> int:
    """Prompts whose responses generate at once: the pool of ``partial_rollout``, else one rollout batch."""
    schedule = config.async_training
    if schedule.schedule == "partial_rollout":
        return schedule.in_flight_prompts or 2 * config.data.rollout_batch_size
    return config.data.rollout_batch_size


def generating_workers(config: Any) -> int:
    """Workers that run an engine: the generators of a split placement, else every worker."""
    schedule = config.async_training
    return schedule.generator_workers if schedule.placement == "split" else config.world_size


# Value rules of single keys, relative to ``async_training``.
ASYNC_RANGES = {
    "generator_workers": NON_NEGATIVE,
    "max_staleness": AT_LEAST_ONE,
    "in_flight_prompts": AT_LEAST_ONE_OR_NULL,
}


def check_schedule(config: Any, world_size: int, problems: list[str]) -> None:
    """The schedule, its placement and the run's other settings fit together (``config`` is the whole PPOConfig)."""
    schedule = config.async_training
    one_of(problems, "async_training.schedule", schedule.schedule, SCHEDULES)
    one_of(problems, "async_training.placement", schedule.placement, PLACEMENTS)
    one_of(problems, "async_training.stale_samples", schedule.stale_samples, STALE_SAMPLES)
    if schedule.placement == "split":
        if config.trainer.single_process:
            problems.append(
                "async_training.placement=split runs generators and trainers as separate workers side by side; it "
                "cannot run with trainer.single_process=true (one worker in this process). Use placement=colocated"
            )
        elif not 1 <= schedule.generator_workers < world_size:
            problems.append(
                f"async_training.placement=split needs 1 <= async_training.generator_workers < {world_size} (the "
                f"workers: trainer.nnodes * trainer.n_gpus_per_node), got {schedule.generator_workers}: a split "
                "needs at least one generator and one trainer"
            )
        else:
            _check_split_sizes(config, world_size, problems)
    elif schedule.generator_workers:
        problems.append(
            f"async_training.generator_workers={schedule.generator_workers} is only read with "
            "async_training.placement=split; set it to 0 or use placement=split"
        )
    if not schedule.enabled:
        if schedule.placement == "split":
            problems.append(
                "async_training.placement=split with schedule=sync would leave the generators idle while the "
                "trainers train; use schedule=one_step_off, or placement=colocated"
            )
        return
    if schedule.schedule == "one_step_off" and schedule.placement != "split":
        problems.append(
            "async_training.schedule=one_step_off overlaps generation with training on different workers; on "
            "colocated workers both share each device and nothing would overlap. Set async_training.placement=split "
            "and async_training.generator_workers, or use schedule=partial_rollout on colocated workers"
        )
    if schedule.schedule == "partial_rollout" and schedule.placement != "colocated":
        problems.append(
            "async_training.schedule=partial_rollout with placement=split (generators that never stop, partial "
            "responses streamed to the trainers) is not built yet; use placement=colocated, or "
            "schedule=one_step_off for a split"
        )
    if schedule.schedule == "one_step_off" and schedule.max_staleness < 1:
        problems.append(
            f"async_training.max_staleness={schedule.max_staleness} is below what one_step_off needs: its samples "
            "are always 1 version old; set async_training.max_staleness=1 or more"
        )
    _check_schedule_combinations(config, problems)
    if schedule.schedule == "partial_rollout":
        _check_partial_rollout_sizes(config, world_size, problems)


def _check_schedule_combinations(config: Any, problems: list[str]) -> None:
    """Features an asynchronous schedule does not carry yet, each refused with the reason."""
    name = f"async_training.schedule={config.async_training.schedule}"
    if config.env.enabled:
        problems.append(
            f"{name} with an agent environment (env.name / env.env_class) is not built: an episode is played turn "
            "by turn on the driver between generation calls, so it cannot continue across a weight update as a "
            "single response can. Use async_training.schedule=sync for agent runs"
        )
    if config.algorithm.online_filtering:
        problems.append(
            f"{name} with algorithm.online_filtering (DAPO's refill rounds) is not built: refills would generate "
            "with the step's own weights and mix schedules. Use async_training.schedule=sync with online filtering"
        )
    from easyr1.algorithms.advantage import ADV_ESTIMATORS, estimator_needs

    estimator = config.algorithm.adv_estimator
    if estimator in ADV_ESTIMATORS.names() and estimator_needs(estimator).greedy_baseline:
        problems.append(
            f"{name} with algorithm.adv_estimator={config.algorithm.adv_estimator} (a greedy baseline response "
            "per prompt, generated with the step's weights) is not built; use async_training.schedule=sync"
        )


def _check_split_sizes(config: Any, world_size: int, problems: list[str]) -> None:
    """A split's two groups: each spread evenly over the nodes, the generators in whole engines, the batches in
    equal shares over the trainers (who compute experience and update; the generators pad their shares)."""
    generators = config.async_training.generator_workers
    trainers = world_size - generators
    nnodes = config.trainer.nnodes
    if generators % nnodes or trainers % nnodes:
        problems.append(
            f"async_training.generator_workers={generators} leaves {trainers} trainers; with trainer.nnodes={nnodes} "
            "both groups must divide evenly over the nodes (each node holds its share of each); choose "
            f"generator_workers as a multiple of {nnodes}"
        )
    tensor_parallel = config.worker.rollout.tensor_parallel_size
    if tensor_parallel > 1 and generators % tensor_parallel:
        problems.append(
            f"async_training.generator_workers={generators} is not a multiple of "
            f"worker.rollout.tensor_parallel_size={tensor_parallel}: the generators run whole engines of "
            f"{tensor_parallel} workers each"
        )
    n = config.worker.rollout.n
    for key, prompts in (
        ("data.rollout_batch_size", config.data.rollout_batch_size),
        ("worker.actor.global_batch_size", config.worker.actor.global_batch_size),
    ):
        if prompts >= 1 and n >= 1 and (prompts * n) % trainers:
            problems.append(
                f"{key}={prompts} times worker.rollout.n={n} is {prompts * n} samples, which do not split evenly "
                f"over the {trainers} trainers of async_training.placement=split (the workers but the "
                f"{generators} generators); choose sizes whose samples divide by {trainers}"
            )


def _check_partial_rollout_sizes(config: Any, world_size: int, problems: list[str]) -> None:
    """Every worker stops at its own share of the step's groups, so the sizes divide over the workers."""
    batch = config.data.rollout_batch_size
    in_flight = config.async_training.in_flight_prompts or 2 * batch
    if in_flight < batch:
        problems.append(
            f"async_training.in_flight_prompts={in_flight} is below data.rollout_batch_size={batch}: a step "
            f"trains on {batch} prompts' groups, so at least that many must be generating"
        )
    if in_flight % batch:
        problems.append(
            f"async_training.in_flight_prompts={in_flight} must be a multiple of data.rollout_batch_size={batch}: "
            "prompts are admitted a batch at a time, as the steps train them"
        )
    if in_flight > (schedule_bound := config.async_training.max_staleness + 1) * batch:
        problems.append(
            f"async_training.in_flight_prompts={in_flight} is more than (max_staleness + 1) * data.rollout_batch_size "
            f"= {schedule_bound * batch}: prompts would wait longer than the staleness bound allows before a step "
            "can train them. Raise async_training.max_staleness or lower in_flight_prompts"
        )
    for key, value in (("data.rollout_batch_size", batch), ("async_training.in_flight_prompts", in_flight)):
        if value % world_size:
            problems.append(
                f"{key}={value} must divide over the {world_size} workers under partial_rollout: each worker "
                "continues its own prompts and stops at its share of the step's groups"
            )
    if config.data.mini_rollout_batch_size not in (None, batch):
        problems.append(
            "async_training.schedule=partial_rollout admits prompts one group at a time; data.mini_rollout_batch_size "
            "is not read by it: leave it null"
        )
