"""The generative judge's engines: each turns judge requests (text with image markers, and the images) into
judgements, greedily by default (``worker.reward_model.temperature`` 0, one fixed seed for every request).

:class:`HFJudge` runs ``transformers`` ``generate`` on a private copy of the judge (the processor's tensors, as the
HF rollout engine reads them); :class:`VLLMJudge` is a second in-process ``vllm.LLM`` on the worker, beside the
policy's, which takes the images and expands their placeholders itself. Both sleep (free their device memory, GPU
only) while the policy generates and trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from PIL import Image

from easyr1.reward_model.template import judge_messages


@dataclass(frozen=True)
class JudgeRequest:
    """One sample's judge request: the rendered text (with one marker per image shown) and its images."""

    text: str
    images: list[Image.Image]


class Judge(Protocol):
    """What a judge engine does."""

    def judge(self, requests: list[JudgeRequest]) -> list[str]:
        """One judgement text per request, in order."""

    def sleep(self) -> None:
        """Release the device memory the engine holds (GPU), until :meth:`wake`."""

    def wake(self) -> None:
        """Take the device memory back before judging."""

    def close(self) -> None:
        """Release what the engine holds beyond its memory."""


def chat_text(processor: Any, request: JudgeRequest) -> str:
    """The request in the judge's chat template, with the generation prompt."""
    messages = judge_messages(request.text, len(request.images))
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class HFJudge:
    """The judge on ``transformers``: one ``generate`` per request, on this worker's device."""

    def __init__(self, model_path: str, settings: Any, dtype: torch.dtype, device: str) -> None:
        from easyr1.models.loading import load_model, load_tokenizer_and_processor

        self.tokenizer, processor = load_tokenizer_and_processor(model_path)
        self.processor = processor or self.tokenizer  # a text-only judge: the tokenizer renders its chat
        self.model = load_model(model_path, dtype).eval()
        self.settings = settings
        self.device = device
        self.on_device = False

    def inputs(self, request: JudgeRequest) -> dict[str, torch.Tensor]:
        """The processor's tensors of a request (expanded image placeholders, pixel values, grids)."""
        text = chat_text(self.processor, request)
        if request.images:
            return dict(self.processor(text=[text], images=request.images, return_tensors="pt"))
        return dict(self.tokenizer([text], return_tensors="pt"))

    @torch.no_grad()
    def judge(self, requests: list[JudgeRequest]) -> list[str]:
        """Each request's judgement, decoded without special tokens."""
        self.wake()
        settings, texts = self.settings, []
        for request in requests:
            inputs = {key: value.to(self.device) for key, value in self.inputs(request).items()}
            generator_state = torch.random.get_rng_state()
            torch.manual_seed(settings.seed)  # every request from the same seed: a judgement depends on itself only
            try:
                output = self.model.generate(
                    **inputs,
                    do_sample=settings.temperature > 0,
                    temperature=settings.temperature if settings.temperature > 0 else None,
                    top_p=None,
                    top_k=None,
                    max_new_tokens=settings.max_tokens,
                    pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                )
            finally:
                torch.random.set_rng_state(generator_state)
            new_tokens = output[0, inputs["input_ids"].shape[1] :]
            texts.append(self.tokenizer.decode(new_tokens, skip_special_tokens=True))
        return texts

    def sleep(self) -> None:
        """Off the GPU between judgements (the policy needs the memory); nothing to do on CPU."""
        if self.on_device and self.device != "cpu":
            self.model.to("cpu")
            torch.cuda.empty_cache()
            self.on_device = False

    def wake(self) -> None:
        """On this worker's device for judging."""
        if not self.on_device:
            self.model.to(self.device)
            self.on_device = True

    def close(self) -> None:
        """Nothing beyond the model's memory."""


class VLLMJudge:
    """The judge on a second in-process ``vllm.LLM`` of this worker (joined to the workers' process group through
    vLLM's external launcher, as the policy's engine is), asleep (level 1 on GPU: weights kept in host memory)
    between judgements."""

    def __init__(self, model_path: str, settings: Any, dtype: torch.dtype, device: str) -> None:
        from vllm import LLM

        on_gpu = torch.cuda.is_available()
        extra: dict[str, Any] = {}
        if not on_gpu:
            extra["kv_cache_memory_bytes"] = int(settings.cpu_kv_cache_gb * 2**30)
            extra["block_size"] = 32  # vLLM's CPU attention takes multiples of 32
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            seed=settings.seed,
            tensor_parallel_size=1,
            distributed_executor_backend="external_launcher",
            disable_custom_all_reduce=True,
            max_model_len=settings.max_model_len,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enforce_eager=True,
            enable_sleep_mode=on_gpu,
            disable_log_stats=True,
            use_tqdm_on_load=False,
            **extra,
        )
        self.settings = settings
        self.sleep_supported = on_gpu
        self.sleeping = False
        self.processor = self.llm.get_tokenizer()

    def judge(self, requests: list[JudgeRequest]) -> list[str]:
        """Each request's judgement: the chat-templated text and its images, one vLLM request each."""
        from vllm import SamplingParams

        self.wake()
        settings = self.settings
        prompts = []
        for request in requests:
            prompt: dict[str, Any] = {"prompt": chat_text(self.processor, request)}
            if request.images:
                prompt["multi_modal_data"] = {"image": request.images}
            prompts.append(prompt)
        params = SamplingParams(
            temperature=settings.temperature,
            max_tokens=settings.max_tokens,
            seed=settings.seed,
            skip_special_tokens=True,
        )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [output.outputs[0].text for output in outputs]

    def sleep(self) -> None:
        """Free the judge's GPU memory, keeping its weights in host memory (level 1); a no-op on CPU."""
        if self.sleep_supported and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake(self) -> None:
        """Map the weights and the KV cache back before judging."""
        if self.sleeping:
            torch.cuda.empty_cache()
            self.llm.wake_up()
            self.sleeping = False

    def close(self) -> None:
        """Drop the engine (the parallel state is the policy engine's, released with it)."""
        del self.llm
