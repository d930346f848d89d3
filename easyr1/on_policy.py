"""When the update may take the old log-probs from its own forward instead of a separate pass.

PPO-style losses compare the current policy with the policy that produced the batch (the "old" policy), whose
log-probs are normally computed in a separate no-grad pass before the update. When a rollout batch feeds exactly one
optimizer step, the policy has not changed between that pass and the update's first forward: both compute the same
log-probs. The update then uses its own log-probs, detached, as the old ones (the ratio is exactly 1 in value and
has PPO's gradient at the old policy) and returns them, so the driver still logs the rollout-mismatch and
rollout-correction metrics from them after the update. verl's actor makes the same choice (its ``on_policy``:
one mini-batch and one PPO epoch).
"""

from __future__ import annotations

from typing import Any


def reuses_update_log_probs(config: Any, samples: int, num_workers: int, step: int) -> bool:
    """Whether this step's update takes the old log-probs from its own forward (no separate old-log-prob pass).

    Each condition, and why it is there:

    * ``worker.actor.reuse_update_log_probs``: the switch; false always runs the separate pass.
    * ``step > trainer.critic_warmup``: the actor is updated this step. During the critic's warm-up there is no
      update forward to take them from, and the separate pass still gives the rollout-mismatch metrics.
    * ``worker.actor.ppo_epochs == 1``: a second epoch sees a policy the first one changed.
    * each worker's share is one mini-batch (``global_batch_size * n / num_workers >= samples / num_workers``):
      a second mini-batch would be scored by a policy the first optimizer step changed.
    * no KL in the reward (``algorithm.disable_kl or algorithm.use_kl_loss``): the in-reward KL subtracts
      ``old - ref`` from the rewards, so the advantages need the old log-probs before the update.
    * ``algorithm.rollout_correction_mode=decoupled``: in ``bypass`` mode the old log-probs are the engine's, so
      there is no pass to skip, and the update's own log-probs would make PPO's ratio 1 instead of
      ``pi_theta / pi_rollout``.

    Not conditions, since nothing they do reads the old log-probs before the update: the KL loss (it compares
    the current and the reference policy inside the update), the critic and GAE (values and rewards), ReMax's
    greedy baseline, DAPO's online filtering (scores), and every policy loss (each reads the old log-probs only in
    its ratio). Every rollout-correction method (:mod:`easyr1.algorithms.rollout_correction`: token / sequence TIS,
    IcePop, each rejection option) depends on one token or one response, and the loss normaliser counts the tokens
    before rejection, so the actor computes weights and rejection mask per micro-batch from its own log-probs with
    exactly the driver's result; their batch-wide metrics are computed on the driver after the update. (A method
    with batch-wide statistics, such as verl's ``rollout_is_batch_normalize``, would need the old pass.)

    Args:
        config: the run's ``PPOConfig``.
        samples: samples in this step's batch (prompts times ``worker.rollout.n``).
        num_workers: workers sharing the batch.
        step: the step about to be trained (1-based).
    """
    actor, algorithm = config.worker.actor, config.algorithm
    mini_batch_size = actor.global_batch_size * config.worker.rollout.n // num_workers
    share = -(-samples // num_workers)
    kl_in_reward = not algorithm.disable_kl and not algorithm.use_kl_loss
    return (
        actor.reuse_update_log_probs
        and step > config.trainer.critic_warmup
        and actor.ppo_epochs == 1
        and share <= mini_batch_size
        and not kl_in_reward
        and algorithm.rollout_correction_mode != "bypass"
    )
