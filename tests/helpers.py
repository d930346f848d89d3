"""Helpers shared by the integration tests: a local Ray cluster and training batches built from real data."""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from easyr1.config import PPOConfig, load_config
from easyr1.data import RLDataset, collate_fn
from easyr1.engines.base import pack_responses
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.protocol import Batch


REPO = Path(__file__).resolve().parents[1]


# The resources of the cluster start_ray started last (None: none, or it was shut down since).
_started: tuple[int, int] | None = None


def start_ray(num_cpus: int = 6, num_gpus: int = 0) -> None:
    """A small local Ray cluster for the tests (logical CPUs for 4 workers and a reward actor; a small object store; no
    dashboard), closed as the CLI's is (loopback only, token required: ``easyr1.main.closed_local_cluster``), started
    once per session: a module that needs Ray calls this, and gets the cluster already running unless it asks for
    other resources (or the last one was shut down)."""
    import ray

    from easyr1.main import closed_local_cluster

    global _started
    if ray.is_initialized() and _started == (num_cpus, num_gpus):
        return
    if ray.is_initialized():
        # another shape, or a cluster the CLI started, which lacks the tests' import path
        ray.shutdown()
    _started = (num_cpus, num_gpus)
    with closed_local_cluster():
        ray.init(
            num_cpus=num_cpus,
            **({"num_gpus": num_gpus} if num_gpus else {}),  # a GPU count claimed for placement tests
            object_store_memory=256 * 1024**2,
            include_dashboard=False,
            logging_level="WARNING",
            # test modules define worker classes; the workers import them (and this checkout's easyr1) from here
            runtime_env={
                "env_vars": {
                    "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
                }
            },
        )


def fork_ranks(function, args: tuple, nprocs: int, timeout: float = 300) -> None:
    """``function(rank, *args)`` in ``nprocs`` processes forked from this one, which already has torch and the test's
    modules loaded (a spawned rank imports them again, seconds each); fails naming the rank if one fails, and kills
    them all past ``timeout``. Call it before this process joins a process group: the ranks would inherit it."""
    import time

    import torch.multiprocessing as mp

    assert not dist.is_initialized(), "fork the ranks before this process joins a process group"
    ranks = mp.start_processes(function, args=args, nprocs=nprocs, join=False, start_method="fork")
    deadline = time.monotonic() + timeout
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(f"the {nprocs} forked ranks did not finish within {timeout:.0f} s")


# The CLI's arguments for a run in this process, without Ray (one worker): for runs whose point is neither Ray nor two
# workers. Tests using it ask for the `rank_environment` fixture (what the worker sets in this process is put back).
ONE_PROCESS = ["trainer.single_process=true", "trainer.n_gpus_per_node=1"]


@dataclass
class Run:
    """What a run of the CLI left: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def train(args: list[str]) -> Run:
    """``python -m easyr1.main ARGS`` in this process, on the session's Ray cluster (none with
    ``trainer.single_process``): the CLI's whole path but the interpreter's start-up, for tests whose point is not the
    process (those that kill it or look at what it leaves behind run it in a process of its own:
    ``test_cli.run_cli``)."""
    from easyr1.main import main

    if "trainer.single_process=true" not in args:
        start_ray()
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(args)
    return Run(code, out.getvalue(), err.getvalue())


def validated_run_args(model_dir: Path, data_dir: Path, run_dir: Path) -> list[str]:
    """The CLI arguments of the session's ``validated_run`` (conftest.py): 3 steps on 2 Ray workers with validation
    before training, every 2 steps and after the last, two prompts' rollouts kept, responses of up to 8 tokens."""
    return [
        f"config={REPO / 'examples' / 'config_cpu.yaml'}",
        f"worker.actor.model.model_path={model_dir}",
        f"data.train_files={data_dir / 'train.jsonl'}",
        f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
        f"data.val_files={data_dir / 'val.jsonl'}",
        "data.val_batch_size=6",  # 16 rows in rounds of 6, 6, 4: not a multiple of the 2 workers' share
        # responses of different lengths, so that balancing the batch reorders it (test_e2e.py)
        "data.max_response_length=8",
        "trainer.max_steps=3",
        "trainer.val_before_train=true",
        "trainer.val_freq=2",
        "trainer.val_generations_to_log=2",
        "trainer.rollouts_to_log=2",
        "worker.rollout.val_override_config={temperature: 0.6, top_p: 0.95, n: 2}",
        f"trainer.save_checkpoint_path={run_dir}",
    ]


def demo_config(model_dir: Path, data_dir: Path, *overrides: str) -> PPOConfig:
    """``examples/config_cpu.yaml`` pointed at a test model and dataset, with overrides."""
    return load_config(
        [
            f"config={REPO / 'examples' / 'config_cpu.yaml'}",
            f"worker.actor.model.model_path={model_dir}",
            f"data.train_files={data_dir / 'train.jsonl'}",
            f"data.val_files={data_dir / 'val.jsonl'}",
            f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
            *overrides,
        ]
    )


def prompt_batch(
    model_dir: Path, data_dir: Path, count: int, max_prompt_length: int = 64, pixels: int = 3136
) -> Batch:
    """The first ``count`` prompts of the dataset, collated (images resized to ``pixels`` pixels)."""
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    dataset = RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        answer_key="answer",
        max_prompt_length=max_prompt_length,
        min_pixels=pixels,
        max_pixels=pixels,
        model_config=load_model_config(str(model_dir)),
    )
    return collate_fn([dataset[i] for i in range(count)])


def training_batch(
    model_dir: Path, data_dir: Path, count: int, response_length: int = 6, seed: int = 0, pixels: int = 3136
) -> Batch:
    """Prompts with random responses of random lengths, random advantages and perturbed old log-probs."""
    generator = torch.Generator().manual_seed(seed)
    prompts = prompt_batch(model_dir, data_dir, count, pixels=pixels)
    lengths = torch.randint(1, response_length + 1, (count,), generator=generator).tolist()
    responses = [torch.randint(0, 300, (length,), generator=generator).tolist() for length in lengths]
    batch = pack_responses(prompts, responses, [[0.0] * len(r) for r in responses], response_length, pad_token_id=0)
    batch["advantages"] = torch.randn(count, response_length, generator=generator) * batch["response_mask"]
    return batch


def vllm_shared_memory() -> set[str]:
    """vLLM's segments in /dev/shm now: its CPU TP communicator's (``...cpushm...``) and its message queues'
    (``psm_...``); other processes' files (a test tier running beside this one) are not counted."""
    return {name for name in os.listdir("/dev/shm") if "cpushm" in name or name.startswith("psm_")}


@contextmanager
def single_rank_vllm_world(**extra_env: str) -> Iterator[None]:
    """A one-rank gloo world plus the environment vLLM's external launcher reads (``extra_env`` added); on exit
    vLLM's own teardown removes the world and the environment is restored."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    environment = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_LOGGING_LEVEL": "WARNING",
        **extra_env,
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in environment.items():
            patch.setenv(key, value)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        yield
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()  # also destroys torch's default group


def tiny_vllm_engine(model_dir: Path | str, **settings):
    """easyr1's :class:`~easyr1.engines.vllm_engine.VLLMEngine` of a tiny model in this process (inside
    :func:`single_rank_vllm_world`): fp32, eager, 256 tokens, one image per prompt, a 32 MiB KV cache; ``settings``
    replace any of these or add others (``load_format``, ``block_size``, ...)."""
    from easyr1.engines.vllm_engine import VLLMEngine

    defaults = dict(
        dtype=torch.float32,
        max_model_len=256,
        tensor_parallel_size=1,
        seed=0,
        pad_token_id=0,
        banned_token_ids=[],
        limit_images=1,
        enforce_eager=True,
        cpu_kv_cache_bytes=32 * 2**20,
    )
    return VLLMEngine(str(model_dir), str(model_dir), **{**defaults, **settings})


def vllm_generate(model_dir: Path, requests: list, params, **engine_args) -> list:
    """A plain ``vllm.LLM`` of ``model_dir`` (float32, eager) generating ``requests`` in this process, on a one-rank
    world through vLLM's external launcher; the engine is gone afterwards."""
    from vllm import LLM

    with single_rank_vllm_world(VLLM_CPU_KVCACHE_SPACE="1"):
        llm = LLM(
            model=str(model_dir),
            dtype="float32",
            max_model_len=256,
            seed=0,
            enforce_eager=True,
            distributed_executor_backend="external_launcher",
            **engine_args,
        )
        outputs = llm.generate(requests, params, use_tqdm=False)
        del llm
    return outputs


# A judge parser whose score is a function of the whole judgement: different texts, different scores.
JUDGE_PARSER_FILE = "def parse(text):\n    return float(sum(ord(c) * (i + 1) for i, c in enumerate(text)) % 1000)\n"


def tiny_judge_files(root: Path) -> dict[str, Path]:
    """Under ``root``: a tiny random judge (seed 1), a tiny classifier (value head, seed 2), a judge template and a
    parser file (:data:`JUDGE_PARSER_FILE`)."""
    from easyr1.tools.tiny_judge import build_tiny_judge, write_template

    parser = root / "parser.py"
    parser.write_text(JUDGE_PARSER_FILE)
    return {
        "judge": build_tiny_judge(root / "judge", "judge", seed=1),
        "classifier": build_tiny_judge(root / "classifier", "classifier", seed=2),
        "template": write_template(root / "judge.jinja"),
        "parser": parser,
    }


def judge_config(model_dir: Path, data_dir: Path, files: dict[str, Path], *overrides: str) -> PPOConfig:
    """The demo config with the tiny judge of ``files`` on the HF engine (6 tokens), its template and parser file."""
    return demo_config(
        model_dir,
        data_dir,
        "worker.reward_model.kind=judge",
        f"worker.reward_model.model_path={files['judge']}",
        f"worker.reward_model.template={files['template']}",
        f"worker.reward_model.parser={files['parser']}:parse",
        "worker.reward_model.engine=hf",
        "worker.reward_model.max_tokens=6",
        *overrides,
    )


def classifier_config(model_dir: Path, data_dir: Path, files: dict[str, Path], *overrides: str) -> PPOConfig:
    """The demo config with the tiny classifier of ``files`` as the reward model."""
    return demo_config(
        model_dir,
        data_dir,
        "worker.reward_model.kind=classifier",
        f"worker.reward_model.model_path={files['classifier']}",
        *overrides,
    )


def with_judge_requests(config: PPOConfig, batch: Batch, model_dir: Path) -> Batch:
    """A shallow copy of ``batch`` with each sample's rendered judge request (a judge config), as the driver sends it
    to the workers; ``batch`` itself unchanged for a classifier."""
    from easyr1.reward import build_reward_inputs
    from easyr1.reward_model.client import image_counts, render_requests
    from easyr1.reward_model.scorer import REQUEST, _objects
    from easyr1.reward_model.template import JudgeTemplate

    sent = batch.union(Batch())
    if config.worker.reward_model.kind == "judge":
        tokenizer, _ = load_tokenizer_and_processor(str(model_dir))
        inputs = build_reward_inputs(batch, tokenizer, True)
        template = JudgeTemplate(config.worker.reward_model.template)
        sent[REQUEST] = _objects(render_requests(template, inputs, image_counts(batch)))
    return sent


def one_response_two_images(model_dir: Path, data_dir: Path) -> Batch:
    """Two shape prompts (the same question, different images) with the same response and the same answer."""
    prompts = prompt_batch(model_dir, data_dir, 2)
    first, second = (data["images"][0] for data in prompts["multi_modal_data"])
    assert list(prompts["raw_prompt_ids"][0]) == list(prompts["raw_prompt_ids"][1])
    assert first.tobytes() != second.tobytes()
    response = [40, 41, 42, 43]
    batch = pack_responses(prompts, [response, response], [[0.0] * 4] * 2, 6, pad_token_id=0)
    answers = np.empty(2, dtype=object)
    answers[:] = ["red", "red"]  # the judge is shown the answer too: the same for both
    batch["ground_truth"] = answers
    return batch
