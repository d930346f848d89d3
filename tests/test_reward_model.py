"""worker.reward_model: the classifier and the generative judge see each sample's images (two images, the same prompt
and response: two scores, each equal to a direct transformers forward of the same inputs); unparseable judgements get
the configured score and are counted; the reward function reads the results through its ``reward_model`` argument;
bad settings are refused at start-up naming the key; the judge's text reaches the rollout log and the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import (
    ONE_PROCESS,
    REPO,
    demo_config,
    judge_config,
    one_response_two_images,
    tiny_judge_files,
    train,
)

from easyr1.config import PPOConfig
from easyr1.errors import ConfigError
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.protocol import Batch
from easyr1.reward import Rewards, build_reward_inputs
from easyr1.reward.function import RewardFunction
from easyr1.reward_model.checks import check_reward_model_inputs
from easyr1.reward_model.client import image_counts, render_requests, reward_model_metrics
from easyr1.reward_model.parser import JudgementParser
from easyr1.reward_model.scorer import PARSED, REQUEST, SCORE, TEXT, RewardModelScorer, _objects
from easyr1.reward_model.template import JudgeTemplate


@pytest.fixture(scope="module")
def judge_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny judge, a tiny classifier (value head, seed 2), a judge template and a parser file."""
    return tiny_judge_files(tmp_path_factory.mktemp("reward_models"))


@pytest.fixture(scope="module")
def same_response_two_images(tiny_qwen2_5_vl_dir: Path, tiny_dataset_dir: Path) -> Batch:
    """Two shape prompts (the same question, different images) with the same response."""
    return one_response_two_images(tiny_qwen2_5_vl_dir, tiny_dataset_dir)


def judged(config, batch: Batch, tokenizer) -> tuple[Batch, list[str]]:
    """The worker's results for ``batch`` and the requests the driver rendered for it."""
    inputs = build_reward_inputs(batch, tokenizer, True)
    requests = render_requests(JudgeTemplate(config.worker.reward_model.template), inputs, image_counts(batch))
    sent = batch.union(Batch())
    sent[REQUEST] = _objects(requests)
    return RewardModelScorer(config, torch.float32, "cpu").score(sent), requests


def test_judge_score_depends_on_the_image(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files, same_response_two_images
):
    """The HF judge's two judgements differ by image alone, and each is what transformers generates from the judge's
    processor inputs (chat template, expanded image placeholders, pixel values)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    config = judge_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files)
    tokenizer, _ = load_tokenizer_and_processor(str(tiny_qwen2_5_vl_dir))
    results, requests = judged(config, same_response_two_images, tokenizer)
    assert requests[0] == requests[1]  # the same text: only the image differs
    texts, scores = list(results[TEXT]), results[SCORE].tolist()
    assert texts[0] != texts[1] and scores[0] != scores[1]
    parser = JudgementParser(config.worker.reward_model.parser)
    assert scores == [parser.parse(text) for text in texts]

    processor = AutoProcessor.from_pretrained(judge_files["judge"])
    model = AutoModelForImageTextToText.from_pretrained(judge_files["judge"], dtype=torch.float32).eval()
    for row, request in enumerate(requests):
        image = same_response_two_images["multi_modal_data"][row]["images"][0]
        content = [{"type": "image"}, {"type": "text", "text": request.replace("<image>", "")}]
        text = processor.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        output = model.generate(
            **inputs, do_sample=False, max_new_tokens=6, pad_token_id=processor.tokenizer.pad_token_id
        )
        expected = processor.tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        assert texts[row] == expected


def test_classifier_score_depends_on_the_image(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files, same_response_two_images
):
    """The classifier's two scores differ by image alone, and each is the value head on the hidden state of the
    response's last token in a plain transformers forward of the same ids and pixels."""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from easyr1.protocol import merge_vision_inputs

    config = demo_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        "worker.reward_model.kind=classifier",
        f"worker.reward_model.model_path={judge_files['classifier']}",
    )
    batch = same_response_two_images
    results = RewardModelScorer(config, torch.float32, "cpu").score(batch)
    scores = results[SCORE]
    assert results[PARSED].all() and list(results[TEXT]) == [None, None]
    assert abs(scores[0] - scores[1]) > 0.1  # far beyond the tolerance of the comparison below

    model = AutoModelForImageTextToText.from_pretrained(judge_files["classifier"], dtype=torch.float32).eval()
    head = load_file(str(judge_files["classifier"] / "value_head.safetensors"))
    last = batch["prompts"].shape[1] + 4 - 1
    for row in range(2):
        vision = merge_vision_inputs([batch["multi_modal_inputs"][row]])
        with torch.no_grad():
            hidden = model.model(
                input_ids=batch["input_ids"][row : row + 1],
                attention_mask=batch["attention_mask"][row : row + 1],
                **vision,
            ).last_hidden_state
        expected = hidden[0, last] @ head["weight"][0] + head["bias"][0]
        # one row alone here, two padded rows there: fp32 sums in another order
        torch.testing.assert_close(scores[row], expected, rtol=1e-3, atol=1e-3)

    config.worker.reward_model.normalize = "sigmoid"
    sigmoid = RewardModelScorer(config, torch.float32, "cpu").score(batch)[SCORE]
    torch.testing.assert_close(sigmoid, torch.sigmoid(scores))


def test_unparseable_judgements_get_the_configured_score(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files, same_response_two_images
):
    """A judgement the regex cannot read is scored with unparseable_score, flagged and counted; never an error."""
    config = judge_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        judge_files,
        "worker.reward_model.parser=VERDICT=(\\d+)",
        "worker.reward_model.unparseable_score=-3.5",
    )
    tokenizer, _ = load_tokenizer_and_processor(str(tiny_qwen2_5_vl_dir))
    results, _ = judged(config, same_response_two_images, tokenizer)
    assert results[SCORE].tolist() == [-3.5, -3.5]
    assert not results[PARSED].any()
    texts = list(results[TEXT])
    rewards = Rewards(
        {"overall": [-3.5, -3.5]},
        reward_model=[{"score": -3.5, "text": text, "parsed": False} for text in texts],
    )
    assert reward_model_metrics(rewards) == {"reward_model/score_mean": -3.5, "reward_model/unparseable": 2.0}


def test_parsers(tmp_path):
    """A regex's group as a number or a word of the table; a parser file's function, whose failures read as None."""
    assert JudgementParser(r"score: (\d+)").parse("so... score: 7 of 10") == 7.0
    assert JudgementParser(r"score: (\d+)").parse("no verdict") is None
    words = JudgementParser(r"(?i)\b(yes|no)\b", {"yes": 1.0, "no": 0.0})
    assert words.parse("Answer: Yes.") == 1.0 and words.parse("no") == 0.0 and words.parse("maybe") is None
    path = tmp_path / "parse.py"
    path.write_text("def parse(text):\n    return 1 / len(text)\n")
    function = JudgementParser(f"{path}:parse")
    assert function.parse("ab") == 0.5
    assert function.parse("") is None  # ZeroDivisionError in user code: unparseable, not a crash


def test_reward_function_reads_the_reward_model(tmp_path):
    """A reward file that declares ``reward_model`` gets the results through it (a format gate here); one that does
    not is called as before; the built-in one makes the reward model's score the reward."""
    gated = tmp_path / "gated.py"
    gated.write_text(
        "def compute_score(inputs, reward_model):\n"
        "    results = reward_model(inputs)\n"
        "    return [{'overall': r['score'] if '<' in i['response'] else 0.0, 'judge': r['score']}\n"
        "            for i, r in zip(inputs, results)]\n"
    )
    plain = tmp_path / "plain.py"
    plain.write_text(
        "def compute_score(inputs):\n    return [{'overall': float(len(i['response']))} for i in inputs]\n"
    )
    inputs = [
        {"response": "<a>", "response_length": 3, "ground_truth": "x", "prompt": "p"},
        {"response": "b", "response_length": 1, "ground_truth": "x", "prompt": "p"},
    ]
    for reward_input, score in zip(inputs, (0.25, 0.75)):
        reward_input["reward_model"] = {"score": score, "text": f"judged {score}", "parsed": True}
    assert RewardFunction(f"{gated}:compute_score")(inputs) == [
        {"overall": 0.25, "judge": 0.25},
        {"overall": 0.0, "judge": 0.75},
    ]
    assert RewardFunction(f"{plain}:compute_score")(inputs) == [{"overall": 3.0}, {"overall": 1.0}]
    config = PPOConfig()
    config.worker.reward.reward_function = None
    config.worker.reward_model.kind = "judge"
    config.fill_derived()  # no reward file and a reward model: the built-in function
    builtin = RewardFunction(config.worker.reward.reward_function)
    assert [score["overall"] for score in builtin(inputs)] == [0.25, 0.75]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["worker.reward_model.kind=judge", "worker.reward_model.model_path=x"], "worker.reward_model.template"),
        (["worker.reward_model.kind=judges", "worker.reward_model.model_path=x"], "worker.reward_model.kind"),
        (["worker.reward_model.kind=classifier"], "worker.reward_model.model_path"),
        (["worker.reward_model.parser=(a)(b)", "worker.reward_model.kind=judge"], "worker.reward_model.parser"),
        (["worker.reward_model.parser=(a", "worker.reward_model.kind=judge"], "worker.reward_model.parser"),
        (
            ["worker.reward_model.parser=/nowhere/p.py:f", "worker.reward_model.kind=judge"],
            "worker.reward_model.parser",
        ),
        (["worker.reward_model.kind=judge", "worker.reward_model.engine=sglang"], "worker.reward_model.engine"),
    ],
)
def test_config_refusals_name_the_key(tiny_qwen2_5_vl_dir, tiny_dataset_dir, overrides, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, *overrides)  # loading validates


def test_start_up_checks_name_the_key(tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files, tmp_path):
    """A model path that is no checkpoint, a classifier without its head, a template that fails on the first row:
    each a ConfigError naming its key, from the check read_inputs runs before anything starts."""
    from easyr1.data import RLDataset
    from easyr1.models.loading import load_model_config

    tokenizer, processor = load_tokenizer_and_processor(str(tiny_qwen2_5_vl_dir))
    config = judge_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files)
    dataset = RLDataset.from_config(
        config.data, config.data.val_files, tokenizer, processor, load_model_config(str(tiny_qwen2_5_vl_dir))
    )
    check_reward_model_inputs(config, tokenizer, dataset)  # the good settings pass

    config.worker.reward_model.model_path = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"worker\.reward_model\.model_path"):
        check_reward_model_inputs(config, tokenizer, dataset)

    config.worker.reward_model.model_path = str(judge_files["judge"])
    broken = tmp_path / "broken.jinja"
    broken.write_text("{{ response }} {{ row.missing.deeper }}")
    config.worker.reward_model.template = str(broken)
    with pytest.raises(ConfigError, match=r"worker\.reward_model\.template=.*broken\.jinja.*failed to render"):
        check_reward_model_inputs(config, tokenizer, dataset)
    broken.write_text("{{ response }} {{ ''.__class__.__mro__ }}")
    with pytest.raises(ConfigError, match=r"worker\.reward_model\.template=.*sandbox"):
        check_reward_model_inputs(config, tokenizer, dataset)

    config.worker.reward_model.kind = "classifier"
    config.worker.reward_model.model_path = str(judge_files["judge"])  # no value head there
    with pytest.raises(ConfigError, match=r"worker\.reward_model\.model_path=.*value_head\.safetensors"):
        check_reward_model_inputs(config, tokenizer, dataset)


@pytest.mark.e2e
def test_judge_only_run_logs_its_text(tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files, tmp_path, rank_environment):
    """A 1-step run in this process with a judge and no reward file: the reward is the judge's score (here every
    judgement unparseable, so the configured score), counted in reward_model/unparseable; the judge's raw text is in
    rollouts.jsonl next to the response and on the report page."""
    from easyr1.tools.report import rollouts_html

    run_dir = tmp_path / "run"
    result = train(
        [
            f"config={REPO / 'examples' / 'config_cpu.yaml'}",
            f"worker.actor.model.model_path={tiny_qwen2_5_vl_dir}",
            f"data.train_files={tiny_dataset_dir / 'train.jsonl'}",
            f"data.val_files={tiny_dataset_dir / 'val.jsonl'}",
            "trainer.val_before_train=false",
            "trainer.val_freq=-1",
            "worker.reward.reward_function=null",
            "worker.rollout.name=hf",
            "data.rollout_batch_size=2",
            "worker.rollout.n=2",
            "worker.actor.global_batch_size=2",
            "data.max_response_length=4",
            "trainer.max_steps=1",
            "trainer.rollouts_to_log=1",
            f"trainer.save_checkpoint_path={run_dir}",
            "worker.reward_model.kind=judge",
            f"worker.reward_model.model_path={judge_files['judge']}",
            f"worker.reward_model.template={judge_files['template']}",
            "worker.reward_model.parser=VERDICT=(\\d+)",
            "worker.reward_model.unparseable_score=-2",
            "worker.reward_model.max_tokens=4",
            *ONE_PROCESS,
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["reward_model/unparseable"] == 4.0
    assert metrics["reward/overall"] == -2.0 and metrics["reward/reward_model_parsed"] == 0.0
    logged = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    responses = logged[0]["prompts"][0]["responses"]
    assert all(isinstance(r["reward_model"]["text"], str) and not r["reward_model"]["parsed"] for r in responses)
    page = rollouts_html(logged)
    assert "reward model" in page and "(unparseable)" in page


def test_plan_counts_the_judge_and_refuses_one_that_does_not_fit(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    """The plan has a reward-model phase after generation with the judge engine's share of the GPU; a 72B judge
    beside a tiny policy on one H100 does not fit, and the refusal names the reward model's settings."""
    from easyr1.plan import gpu_device, make_plan, measure_model
    from easyr1.plan.check import check_plan_fits
    from easyr1.plan.reference_models import write_reference_model

    h100 = gpu_device("H100")
    config = demo_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        "trainer.device=cuda",
        "trainer.n_gpus_per_node=1",
        "worker.rollout.tensor_parallel_size=1",
        "worker.reward_model.kind=classifier",
        f"worker.reward_model.model_path={tiny_qwen2_5_vl_dir}",
    )
    config.worker.reward_model.kind = "judge"  # the checks above need no template for this plan
    config.worker.reward_model.engine = "vllm"
    size = measure_model(load_model_config(str(tiny_qwen2_5_vl_dir)))
    plan = make_plan(config, h100, size, reward_model_size=size)
    names = [phase.name for phase in plan.phases]
    assert names[:2] == ["generation", "reward model"]
    judge = dict(plan.phases[1].items)["reward model"]
    assert judge == int(config.worker.reward_model.gpu_memory_utilization * h100.memory_bytes)
    assert "reward model" not in names[2:] and all("reward model" not in dict(p.items) for p in plan.phases[2:])

    config.worker.reward_model.model_path = str(write_reference_model("qwen2.5-vl-72b", tmp_path / "judge72b"))
    with pytest.raises(ConfigError, match=r"worker\.reward_model\.gpu_memory_utilization"):
        check_plan_fits(config, h100)
