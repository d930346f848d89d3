"""The judge of the reward-model demo (``python -m easyr1.tools.demo --judge``): a classifier trained offline to tell
whether a response names the colour of the shape in the image.

It is the demo's tiny Qwen2.5-VL (its tokenizer, so it reads the policy's token ids) with a value head, in the
classifier checkpoint format of :mod:`easyr1.reward_model.classifier`, trained supervised on shape images of its
own (not the demo's training images) paired with one-token answers: a colour word, right or wrong, or any other
token of the vocabulary. Each pair's label is the demo reward's ``overall`` score (0.2 for naming a colour, 0.8 more
for the right one), the target of the head's logit under binary cross-entropy, so the run's ``normalize=sigmoid``
score is the judge's estimate of that score; an auxiliary caption loss (the LM head names the shape's colour after
the prompt) teaches it to read the image. The demo's policy answers in one token (``data.max_response_length=1``),
inside what the judge was trained on.

Its accuracy on held-out images (every colour word against each image, score > 0.5 read as "right") and the highest
score it gives a one-token answer that names no colour are written beside it (``judge_accuracy.json``) and printed.
Built once under ``.cache/demo/judge/shape_classifier``; ``python -m easyr1.tools.demo_judge [OUT_DIR]`` builds it
anew.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from easyr1.tools.build_cache import DEMO_ROOT, build_once
from easyr1.tools.shape_task import COLOURS


JUDGE_DIR = DEMO_ROOT / "judge" / "shape_classifier"
ACCURACY_FILE = "judge_accuracy.json"
_SHAPE_REWARD = Path(__file__).resolve().parents[2] / "reward_function" / "shape_color.py"


@dataclass
class JudgeTraining:
    """How the demo's judge is trained (about three minutes on two free CPU cores)."""

    seed: int = 1
    num_train_images: int = 512
    num_heldout_images: int = 64
    steps: int = 800
    batch_size: int = 64
    lr: float = 1e-3
    max_prompt_length: int = 40  # the shape prompt's 33 tokens; less padding to train through than the demo's 64
    response_length: int = 4  # the packed response width (at least 2: a one-token answer and EOS)
    pixels: int = 3136  # the demo's data.min_pixels / max_pixels
    # the rule's score the judge learns to predict: "overall" = 0.2 for naming a colour + 0.8 for the right one, the
    # shaping that lets the demo's tiny policy find colour words long before it is right; with "accuracy" (wrong
    # colours and other tokens all 0) a one-token policy collapsed onto "\n" (rule accuracy 0 after 380 steps)
    label: str = "overall"
    # weight of an auxiliary caption loss (the LM head names the shape's colour after the prompt): the image features
    # then name the colour within 100 steps (held-out 0.98); the judge's loss alone left them blind for 600-1000
    # steps, or for good, depending on the seed, the batch size and the label mix
    caption_weight: float = 1.0
    empty_share: float = 0.1  # empty answers (EOS alone): unseen, the judge scored them ~0.5, a reward to hack
    # First mostly colour words (right a little more often than wrong: with a quarter right "always wrong" was a
    # trap, with 60% right "always right" was) ...
    image_steps: int = 300
    image_right_share: float = 0.5
    image_other_share: float = 0.1
    # ... then every other token of the vocabulary as a negative: a policy finds the tokens a judge never saw that
    # happen to score high (runs learned to answer "?", scored 0.6-0.8, and "<|im_start|>", 0.93).
    right_share: float = 0.35
    other_share: float = 0.3
    # hard-negative mining, as the policy searches for them: every mining_every steps of the second phase, the
    # hard_negatives other tokens scored highest on some training image become half of the other tokens drawn
    mining_every: int = 50
    hard_negatives: int = 32
    hidden_size: int = 128
    # the policy's width, a 4x wider MLP: comparing the image's colour with the word's is an XOR-like feature that the
    # demo policy's 256 learned slowly (held-out 0.875 after 500 steps, one colour pair confused)
    intermediate_size: int = 1024
    num_layers: int = 2


def _shape_accuracy() -> Any:
    """The demo reward's rule (``reward_function/shape_color.py``), loaded from its file."""
    from easyr1.errors import RewardError
    from easyr1.user_code import import_user_file

    return import_user_file(
        str(_SHAPE_REWARD),
        config_key="reward_function",
        what="reward file",
        module_prefix="demo_judge",
        error=RewardError,
    )


class _Pairs:
    """Shape prompts (collated once) and random candidate responses with the rule's labels."""

    def __init__(self, model_dir: Path, data_file: Path, settings: JudgeTraining) -> None:
        from easyr1.data import RLDataset
        from easyr1.models.loading import load_model_config, load_tokenizer_and_processor

        self.tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
        model_config = load_model_config(str(model_dir))
        dataset = RLDataset(
            str(data_file),
            self.tokenizer,
            processor,
            prompt_key="problem",
            answer_key="answer",
            max_prompt_length=settings.max_prompt_length,
            min_pixels=settings.pixels,
            max_pixels=settings.pixels,
            model_config=model_config,
        )
        self.items = [dataset[index] for index in range(len(dataset))]
        self.settings = settings
        # a colour as the policy may write it: the bare word or the word after a space, each one token
        self.colour_ids = {
            colour: [self.tokenizer.encode(word)[0] for word in (colour, f" {colour}")] for colour in COLOURS
        }
        colour_tokens = {token for tokens in self.colour_ids.values() for token in tokens}
        # every token the policy can write that is no colour word: special tokens included (unseen, "<|im_start|>"
        # decoded to "" and scored 0.93: the policy answered with it), only the vision placeholders left out (the
        # rollout bans them) and EOS (an answer of its own, empty_share)
        banned = {getattr(model_config, name, None) for name in ("image_token_id", "video_token_id")}
        excluded = colour_tokens | banned | {self.tokenizer.eos_token_id}
        self.filler_ids = [token for token in range(len(self.tokenizer)) if token not in excluded]
        self.hard_negatives: list[int] = []  # the other tokens the judge scores highest now (build_shape_judge)
        self.eos_id = self.tokenizer.eos_token_id
        self.rule = _shape_accuracy()

    def response(self, truth: str, rng: random.Random, right_share: float, other_share: float) -> list[int]:
        """A candidate one-word answer: the right colour word (``right_share``), any other token of the vocabulary
        (``other_share``) or a wrong colour word, half of them followed by the end-of-sequence token; or
        (``empty_share``) that token alone."""
        if rng.random() < self.settings.empty_share:
            return [self.eos_id]
        draw = rng.random()
        if draw < right_share:
            ids = [rng.choice(self.colour_ids[truth])]
        elif draw < right_share + other_share:
            hard = self.hard_negatives if self.hard_negatives and rng.random() < 0.5 else self.filler_ids
            ids = [rng.choice(hard)]
        else:
            ids = [rng.choice(self.colour_ids[rng.choice([other for other in COLOURS if other != truth])])]
        if rng.random() < 0.5:
            ids.append(self.eos_id)
        return ids

    def batch(self, rows: list[int], responses: list[list[int]]) -> tuple[Any, torch.Tensor]:
        """The packed batch of ``rows`` with ``responses`` (as a rollout batch looks) and the rule's scores (the
        ``label`` sub-score) as labels."""
        from easyr1.data import collate_fn
        from easyr1.engines.base import pack_responses
        from easyr1.reward import build_reward_inputs

        prompts = collate_fn([self.items[row] for row in rows])
        batch = pack_responses(
            prompts,
            responses,
            [[0.0] * len(ids) for ids in responses],
            self.settings.response_length,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        scores = self.rule.compute_score(build_reward_inputs(batch, self.tokenizer, True))
        return batch, torch.tensor([score[self.settings.label] for score in scores], dtype=torch.float32)


def response_logits(model: Any, batch: Any) -> torch.Tensor:
    """(B,) the value head's output at each sample's last response token: what the classifier scores."""
    from easyr1.workers.actor import forward_inputs

    values = model(**forward_inputs(batch)).float()
    last = batch["prompts"].shape[-1] + batch["response_mask"].sum(dim=-1) - 1
    return values[torch.arange(len(batch)), last]


@torch.no_grad()
def heldout_accuracy(model: Any, pairs: _Pairs) -> float:
    """Share of (held-out image, colour word) pairs the judge gets right (score > 0.5 means "names the colour")."""
    model.eval()
    correct = total = 0
    for start in range(0, len(pairs.items), 16):
        rows = list(range(start, min(start + 16, len(pairs.items))))
        for colour in COLOURS:
            batch, labels = pairs.batch(rows, [[pairs.colour_ids[colour][0]] for _ in rows])
            predicted = torch.sigmoid(response_logits(model, batch)) > 0.5
            correct += int((predicted == (labels > 0.5)).sum())
            total += len(rows)
    model.train()
    return correct / total


@torch.no_grad()
def other_token_scores(model: Any, pairs: _Pairs, images: int = 8, chunk: int = 64) -> dict[int, float]:
    """Each one-token answer that is not a colour word -> the highest score the judge gives it on the first
    ``images`` images of ``pairs``: a token scored high on some image is a reward the policy can collect there without
    naming the colour (a judge scored "\\n" 0.98 on blue shapes, and the policy answered "\\n" to them)."""
    model.eval()
    images = min(images, len(pairs.items))
    tokens = pairs.filler_ids + [pairs.eos_id]
    highest: dict[int, float] = {}
    for start in range(0, len(tokens), chunk):
        part = tokens[start : start + chunk]
        rows = [row for _ in part for row in range(images)]
        batch, _ = pairs.batch(rows, [[token] for token in part for _ in range(images)])
        scores = torch.sigmoid(response_logits(model, batch)).view(len(part), images).amax(dim=1)
        highest.update(zip(part, scores.tolist()))
    model.train()
    return highest


def build_shape_judge(out_dir: str | Path, settings: JudgeTraining | None = None, log: bool = True) -> Path:
    """Train the demo's judge and write it to ``out_dir`` as a classifier checkpoint, with ``judge_accuracy.json``
    (held-out accuracy, training seconds and settings). Returns ``out_dir``."""
    from easyr1.models.loading import load_model
    from easyr1.reward_model.classifier import save_value_head
    from easyr1.tools.tiny_dataset import build_shape_dataset
    from easyr1.tools.tiny_model import build_tiny_model
    from easyr1.workers.actor import forward_inputs
    from easyr1.workers.critic import ValueModel

    settings = settings or JudgeTraining()
    start = time.time()
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    out_dir = build_tiny_model(
        out_dir,
        family="qwen2_5_vl",
        seed=settings.seed,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_layers=settings.num_layers,
    )
    with tempfile.TemporaryDirectory() as data_dir:
        # images of the judge's own (a seed the demo's data does not use): train and held-out
        build_shape_dataset(
            data_dir, settings.num_train_images, settings.num_heldout_images, seed=1000 + settings.seed
        )
        train_pairs = _Pairs(out_dir, Path(data_dir) / "train.jsonl", settings)
        heldout_pairs = _Pairs(out_dir, Path(data_dir) / "val.jsonl", settings)

    language_model = load_model(str(out_dir), torch.float32)
    model = ValueModel(language_model).train()
    # the LM head too: the caption loss trains it (and it is saved with the backbone, unused by the classifier)
    parameters = [*model.parameters(), *language_model.lm_head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=0.0)
    # decayed to zero: the held-out accuracy swings by 0.1-0.3 between checks at a constant rate
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / settings.steps)
    judge_loss = torch.nn.BCEWithLogitsLoss()
    for step in range(1, settings.steps + 1):
        rows = [rng.randrange(len(train_pairs.items)) for _ in range(settings.batch_size)]
        if step <= settings.image_steps:
            shares = (settings.image_right_share, settings.image_other_share)
        else:
            shares = (settings.right_share, settings.other_share)
        truths = [train_pairs.items[row]["ground_truth"] for row in rows]
        batch, labels = train_pairs.batch(rows, [train_pairs.response(truth, rng, *shares) for truth in truths])
        hidden = model.backbone(**forward_inputs(batch), use_cache=False).last_hidden_state
        values = model.value_head(hidden).squeeze(-1).float()
        last = batch["prompts"].shape[-1] + batch["response_mask"].sum(dim=-1) - 1
        loss = judge_loss(values[torch.arange(len(batch)), last], labels)
        if settings.caption_weight:
            # the caption: the colour word from the prompt's last position (prompts are left-padded)
            logits = language_model.lm_head(hidden[:, batch["prompts"].shape[-1] - 1]).float()
            targets = torch.tensor([train_pairs.colour_ids[truth][0] for truth in truths])
            loss = loss + settings.caption_weight * torch.nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        if step >= settings.image_steps and step % settings.mining_every == 0:
            # hard negatives: half the other tokens of the next steps are those the judge now scores highest
            scores = other_token_scores(model, train_pairs)
            train_pairs.hard_negatives = sorted(scores, key=scores.get, reverse=True)[: settings.hard_negatives]
        if log and step % 100 == 0 and step < settings.steps:
            accuracy = heldout_accuracy(model, heldout_pairs)
            print(
                f"judge training: step {step}/{settings.steps} loss={loss.item():.3f} held-out {accuracy:.3f}",
                flush=True,
            )
    accuracy = heldout_accuracy(model, heldout_pairs)
    other = max(other_token_scores(model, heldout_pairs).values())
    language_model.save_pretrained(out_dir)
    save_value_head(model, out_dir)
    seconds = time.time() - start
    record = {
        "judge_accuracy": accuracy,
        "highest_other_score": other,
        "seconds": round(seconds, 1),
        "settings": vars(settings),
    }
    (Path(out_dir) / ACCURACY_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if log:
        print(
            f"judge_accuracy={accuracy:.3f} (held-out image / colour pairs) highest_other_score={other:.3f} (a "
            f"one-token answer that names no colour, on any of 8 held-out images) seconds={seconds:.0f}",
            flush=True,
        )
    return Path(out_dir)


def judge_overrides(path: str | Path = JUDGE_DIR) -> list[str]:
    """The config overrides of the judge demo: one-token answers, 16 samples a prompt; the classifier at ``path``
    scores, its sigmoid is the reward (through ``reward_function/shape_color_judge.py``, which logs the rule's
    accuracy beside it)."""
    return [
        # one-token answers: the judge was trained on every one-token answer, and a longer one is a sequence it never
        # saw (a first judge, trained on single words, scored "blue blue blue blue" 0.99 on a green shape)
        "data.max_response_length=1",
        # 16 samples a prompt, not 8: with one-token answers a group of 8 soon says one colour for every image (no
        # reward variance left: seed 2 ended at 0.23 rule accuracy, entropy 0.03; with 16, 0.48)
        "worker.rollout.n=16",
        "worker.reward_model.kind=classifier",
        f"worker.reward_model.model_path={path}",
        "worker.reward_model.normalize=sigmoid",
        "worker.reward.reward_function=./reward_function/shape_color_judge.py:compute_score",
    ]


def ensure_demo_judge(path: str | Path = JUDGE_DIR) -> Path:
    """Build the demo's judge at ``path`` unless it is there, trained with today's :class:`JudgeTraining`; return
    its directory. A judge recorded with other settings (built by an older version) is built again."""
    path = Path(path)
    record = path / ACCURACY_FILE
    if record.is_file() and json.loads(record.read_text(encoding="utf-8")).get("settings") != vars(JudgeTraining()):
        shutil.rmtree(path)
    return build_once(path, build_shape_judge)


def judge_accuracy(path: str | Path = JUDGE_DIR) -> float:
    """The held-out accuracy recorded when the judge at ``path`` was built."""
    return float(json.loads((Path(path) / ACCURACY_FILE).read_text(encoding="utf-8"))["judge_accuracy"])


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: build (again) the demo's judge and print its held-out accuracy."""
    parser = argparse.ArgumentParser(description="Train the reward-model demo's shape-colour judge (a classifier).")
    parser.add_argument("out_dir", nargs="?", default=str(JUDGE_DIR), help="directory to write the judge into")
    parser.add_argument("--seed", type=int, default=1, help="seed of the weights, images and pairs")
    parser.add_argument("--steps", type=int, default=JudgeTraining.steps, help="training steps")
    args = parser.parse_args(argv)
    build_shape_judge(args.out_dir, JudgeTraining(seed=args.seed, steps=args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
