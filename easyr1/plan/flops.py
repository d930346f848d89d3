"""FLOPs of one training step and the time they take at a device's peak and a stated MFU.

A forward pass over a sequence of L tokens costs ``2 N L`` (N: parameters in matmuls: the language model without
its embedding lookup, the LM head included) plus causal attention ``2 layers q L^2`` (QK^T and AV over the lower
triangle, q = heads x head_dim; a linear-attention layer costs a fixed amount per token instead), plus the vision
tower's ``2 N_vision`` per patch. Generation runs the same token count once (prefill + decode); each log-prob or
value pass is one forward; an update is forward + backward (3x), one forward more with gradient checkpointing, per
PPO epoch. Lengths are ``prompt_fill x max_prompt_length`` and ``response_fill x max_response_length`` (both 1
unless told).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one step by phase (all workers together) and the tokens the step processes."""

    generation: float
    log_probs: float
    updates: float
    tokens: int

    @property
    def total(self) -> float:
        """All FLOPs of the step."""
        return self.generation + self.log_probs + self.updates


def forward_flops(
    matmul_parameters: int,
    layers: int,
    q_width: int,
    length: float,
    vision_flops: float,
    linear_layers: int = 0,
    linear_flops_per_token: int = 0,
) -> float:
    """One forward over one sequence of ``length`` tokens (``vision_flops``: its images through the tower).
    ``layers`` attend over the sequence; ``linear_layers`` (linear attention) cost ``linear_flops_per_token`` each
    token instead, whatever the length."""
    attention = 2.0 * layers * q_width * length**2
    recurrence = float(linear_layers * linear_flops_per_token) * length
    return 2.0 * matmul_parameters * length + attention + recurrence + vision_flops


def step_flops(
    forward: float,
    samples: int,
    tokens_per_sample: float,
    *,
    old_pass: bool,
    ref_pass: bool,
    critic: bool,
    ppo_epochs: int,
    critic_epochs: int,
    checkpointing: bool,
) -> StepFlops:
    """A step of ``samples`` sequences, each costing ``forward`` per forward pass."""
    train_pass = 4.0 if checkpointing else 3.0
    log_prob_passes = int(old_pass) + int(ref_pass) + int(critic)
    updates = train_pass * ppo_epochs + (train_pass * critic_epochs if critic else 0.0)
    return StepFlops(
        generation=forward * samples,
        log_probs=forward * samples * log_prob_passes,
        updates=forward * samples * updates,
        tokens=int(samples * tokens_per_sample),
    )


def step_seconds(flops: StepFlops, devices: int, peak_flops: float, mfu: float) -> float:
    """Seconds of a step on ``devices`` devices of ``peak_flops`` each, running at ``mfu`` of their peak."""
    return flops.total / (devices * peak_flops * mfu)
