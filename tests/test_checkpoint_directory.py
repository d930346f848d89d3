"""The checkpoint directory: atomic commits, resume selection, save_limit, and clear errors on damage."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from easyr1.checkpoint.manager import TRACKER_NAME, TRAINER_STATE_NAME, CheckpointDirectory
from easyr1.errors import UserError


pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def write_step(checkpoints: CheckpointDirectory, step: int, val_score: float | None = None) -> Path:
    """A committed step with the files a resumable checkpoint has: small but real (the resume choice checks them)."""
    staging = checkpoints.staging_dir(step)
    for name in ("model", "optimizer"):
        dcp.save({"weight": torch.full((2,), float(step))}, checkpoint_id=str(staging / "actor" / name), no_dist=True)
    torch.save({"global_step": step}, staging / TRAINER_STATE_NAME)
    return checkpoints.commit(step, staging, val_score)


def tracker(root: Path) -> dict:
    return json.loads((root / TRACKER_NAME).read_text())


def test_commit_renames_the_staged_step_and_updates_the_tracker(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path)
    staging = checkpoints.staging_dir(3)
    assert staging.name == "global_step_3.partial" and checkpoints.complete_steps() == []
    (staging / "actor/model").mkdir(parents=True)
    (staging / "actor/model/.metadata").write_text("x")
    (staging / "actor/optimizer").mkdir()
    (staging / "actor/optimizer/.metadata").write_text("x")
    (staging / TRAINER_STATE_NAME).write_text("x")
    final = checkpoints.commit(3, staging)
    assert final == tmp_path / "global_step_3" and not staging.exists()
    assert checkpoints.complete_steps() == [3]
    assert tracker(tmp_path)["last_global_step"] == 3
    assert tracker(tmp_path)["last_actor_path"] == str(final / "actor")


def test_resume_picks_the_newest_complete_step_and_ignores_partial_ones(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path)
    assert checkpoints.resume_path(None, find_last_checkpoint=True) is None
    for step in (2, 4):
        write_step(checkpoints, step)
    checkpoints.staging_dir(6)  # a write that was interrupted
    assert checkpoints.resume_path(None, find_last_checkpoint=True) == tmp_path / "global_step_4"
    assert checkpoints.resume_path(None, find_last_checkpoint=False) is None
    assert checkpoints.remove_leftovers() == [tmp_path / "global_step_6.partial"]
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == ["checkpoint_tracker.json", "global_step_2", "global_step_4"]


def test_resume_prefers_a_committed_step_newer_than_the_tracker(tmp_path):
    # killed after the rename but before the tracker was replaced
    checkpoints = CheckpointDirectory(tmp_path)
    write_step(checkpoints, 2)
    saved_tracker = (tmp_path / TRACKER_NAME).read_text()
    write_step(checkpoints, 4)
    (tmp_path / TRACKER_NAME).write_text(saved_tracker)
    assert checkpoints.resume_path(None, find_last_checkpoint=True) == tmp_path / "global_step_4"


def test_explicit_load_path_wins_and_is_checked(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path / "run")
    for step in (2, 4):
        write_step(checkpoints, step)
    assert checkpoints.resume_path(str(tmp_path / "run/global_step_2"), True) == tmp_path / "run/global_step_2"
    with pytest.raises(UserError, match="does not exist"):
        checkpoints.resume_path(str(tmp_path / "run/global_step_9"), True)
    partial = checkpoints.staging_dir(6)
    with pytest.raises(UserError, match="partial checkpoint"):
        checkpoints.resume_path(str(partial), True)
    (tmp_path / "run/global_step_4/actor/model/.metadata").unlink()
    with pytest.raises(UserError, match=r"not a complete easyr1 checkpoint \(missing actor/model/.metadata\)"):
        checkpoints.resume_path(str(tmp_path / "run/global_step_4"), True)


def test_model_only_checkpoint_cannot_be_resumed(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path)
    step_dir = write_step(checkpoints, 2)
    shutil.rmtree(step_dir / "actor/optimizer")  # what trainer.save_model_only=true writes
    with pytest.raises(UserError, match="save_model_only.*model_merger"):
        checkpoints.resume_path(None, True)


def test_damaged_tracker_is_an_error_not_a_fresh_start(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path)
    write_step(checkpoints, 2)
    (tmp_path / TRACKER_NAME).write_text('{"last_global_st')
    with pytest.raises(UserError, match=r"checkpoint_tracker.json is damaged.*\[2\]"):
        checkpoints.resume_path(None, True)


def test_tracker_naming_a_missing_step_is_an_error(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path)
    write_step(checkpoints, 2)
    write_step(checkpoints, 4)
    (tmp_path / "global_step_4").rename(tmp_path / "moved_away")
    with pytest.raises(UserError, match=r"last checkpoint is step 4.*global_step_4 is missing.*\[2\]"):
        checkpoints.resume_path(None, True)


def test_save_limit_keeps_the_newest_and_the_best(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path, save_limit=2)
    scores = {1: 0.1, 2: 0.9, 3: 0.3, 4: 0.2, 5: 0.4}
    for step, score in scores.items():
        write_step(checkpoints, step, val_score=score)
    assert checkpoints.complete_steps() == [2, 4, 5]
    assert (tracker(tmp_path)["best_global_step"], tracker(tmp_path)["best_val_reward_score"]) == (2, 0.9)
    assert checkpoints.leftovers() == []
    write_step(checkpoints, 6, val_score=0.95)  # a new best: the old best may go now
    assert checkpoints.complete_steps() == [5, 6]


def test_save_limit_without_scores_keeps_the_newest(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path, save_limit=1)
    for step in (1, 2, 3):
        write_step(checkpoints, step)
    assert checkpoints.complete_steps() == [3]
    assert tracker(tmp_path)["best_global_step"] is None


def test_recommitting_a_step_keeps_the_older_copy(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path)
    write_step(checkpoints, 2)
    write_step(checkpoints, 2)
    assert checkpoints.complete_steps() == [2]
    replaced = [path for path in tmp_path.iterdir() if path.name.startswith("global_step_2.replaced-")]
    assert len(replaced) == 1 and torch.load(replaced[0] / TRAINER_STATE_NAME)["global_step"] == 2
