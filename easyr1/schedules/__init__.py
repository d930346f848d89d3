"""Asynchronous schedules (``async_training.schedule``): rollout stages that let generation run ahead of training.

Each schedule is a :class:`~easyr1.stages.base.RolloutStage`, so the trainer's loop is the synchronous one: it asks
the stage for a step's scored samples and trains on them. What differs is when those samples were generated
(``one_step_off.py``: during the previous step, on generator workers; ``partial_rollout.py``: partly during earlier
steps, continued under newer weights) and what the stage keeps between steps, which it saves with each checkpoint
(``state_dict`` / ``load_state_dict``). ``versions.py``: the weight versions samples carry and their metrics.
"""
