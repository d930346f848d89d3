"""The memory and step-time plan of a run, computed from its config and the model's ``config.json`` alone.

``make_plan(config, device)`` answers, before anything is launched, how much device and host memory each worker
needs, where each model state lives, how many sequences the rollout engine holds, how many FLOPs a step costs and
how long it takes, and whether the run fits. ``python -m easyr1.tools.plan`` prints it; ``easyr1.main`` refuses a
run that cannot fit (:func:`easyr1.plan.check.check_plan_fits`). docs/plan.md gives the formulas and their limits.
"""

from easyr1.plan.hardware import Device, cpu_device, gpu_device
from easyr1.plan.model_size import ModelSize, measure_model
from easyr1.plan.plan import Plan, make_plan


__all__ = ["Device", "ModelSize", "Plan", "cpu_device", "gpu_device", "make_plan", "measure_model"]
