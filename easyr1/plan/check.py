"""The start-up check of ``easyr1.main``: plan the run on the device it will use and refuse one that cannot fit.

The device is the config's: ``trainer.device=cpu`` (or ``auto`` without a visible GPU) compares the node's host
memory with the RAM available now; on CUDA the first visible GPU's memory is the limit. ``trainer.skip_plan_check``
turns the refusal into a notice.
"""

from __future__ import annotations

import os
from typing import Any

from easyr1.errors import ConfigError, UserError
from easyr1.plan.hardware import Device, cpu_device, local_cuda_device
from easyr1.plan.model_size import ModelSize, measure_model
from easyr1.plan.plan import Plan, make_plan
from easyr1.plan.report import gib, summary_line, verdict
from easyr1.plan.suggest import suggest


def run_device(config: Any) -> Device | None:
    """The device the run will use, as the plan sees it; ``None`` when this process cannot tell (a GPU run, or an
    ``auto`` one on a Ray cluster, driven from a machine without a GPU)."""
    peak = config.trainer.peak_flops_per_device
    if config.trainer.device == "cpu":
        return cpu_device(peak)
    gpu = local_cuda_device(peak)
    if gpu is not None:
        return gpu
    if config.trainer.device == "cuda" or os.environ.get("RAY_ADDRESS"):
        return None
    return cpu_device(peak)


def model_sizes(config: Any) -> tuple[ModelSize, ModelSize | None]:
    """Sizes of the actor's model and, when ``worker.critic.model.model_path`` names another, the critic's."""
    from easyr1.models.loading import load_model_config

    actor = config.worker.actor.model
    size = measure_model(load_model_config(actor.model_path, actor.trust_remote_code), actor.override_config)
    critic = config.worker.critic.model
    critic_size = None
    if critic.model_path and critic.model_path != actor.model_path:
        critic_size = measure_model(
            load_model_config(critic.model_path, critic.trust_remote_code), critic.override_config
        )
    return size, critic_size


def plan_run(config: Any, device: Device, **options: Any) -> tuple[Plan, list]:
    """The plan of ``config`` on ``device`` and the changes that would make it fit."""
    size, critic_size = model_sizes(config)

    reward_model_size = None
    # the judge or classifier on every worker (standalone: on devices of its own, outside the workers' plan)
    if config.worker.reward_model.colocated:
        from easyr1.models.loading import load_model_config

        reward_model_size = measure_model(load_model_config(config.worker.reward_model.model_path))

    def replan(changed: Any) -> Plan:
        return make_plan(
            changed, device, size, critic_size=critic_size, reward_model_size=reward_model_size, **options
        )

    plan = replan(config)
    return plan, suggest(config, plan, replan)


def check_plan_fits(config: Any, device: Device | None = None) -> str:
    """The plan's summary line for ``config``; a ``ConfigError`` with the numbers and the settings to change when it
    does not fit, unless ``trainer.skip_plan_check``."""
    device = device or run_device(config)
    if device is None:
        return "plan: skipped (the workers' device is not visible from here; python -m easyr1.tools.plan --gpu NAME)"
    try:
        plan, suggestions = plan_run(config, device)
    except UserError:
        raise
    except Exception as error:  # an architecture the plan cannot build on the meta device must not block the run
        return f"plan: skipped (the model could not be sized from its config: {type(error).__name__}: {error})"
    line = summary_line(plan)
    if plan.fits or config.trainer.skip_plan_check:
        return line
    fixes = "; ".join(" ".join(f"{key}={value}" for key, value in change.items()) for change, _ in suggestions)
    advice = (
        f"it would fit with: {fixes}"
        if fixes
        else "no single setting tried makes it fit (more devices or a smaller model)"
    )
    if plan.peak_phase.name == "reward model":
        advice += (
            "; the reward model's phase is the peak: lower worker.reward_model.gpu_memory_utilization (a vLLM judge), "
            "worker.reward_model.micro_batch_size (a classifier) or use a smaller worker.reward_model.model_path"
        )
    raise ConfigError(
        f"this run does not fit: {verdict(plan)}; device peak {gib(plan.device_peak)} GiB per worker, host "
        f"{gib(plan.host_worker_peak)} GiB per worker process, {gib(plan.host_node_total)} GiB per node. {advice}. "
        "`python -m easyr1.tools.plan` with the same arguments shows the whole plan; trainer.skip_plan_check=true "
        f"starts anyway. ({line})"
    )
