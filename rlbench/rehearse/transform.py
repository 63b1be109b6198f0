"""The rehearsal transform: a suite profile's trainer config, shrunk to run on this CPU, every change recorded.

    from rlbench.rehearse.transform import rehearsal_config
    plan = rehearsal_config(suite, "full", "colocated")
    plan.config      # trainer config dict (trainer/config.py vocabulary), ready for `python -m trainer`
    plan.changes     # [Change(field, profile value, rehearsal value, why), ...]: the only differences
    plan.nodes       # simulated Ray nodes (1: the local cluster)
    plan.engine_note # "SGLang: adapter against a double, not a real SGLang run" (or "")

What a rehearsal keeps from the profile: the engine, the training backend (`actor.strategy`), the mode,
the algorithm and every knob (clip ratios, KL loss, loss aggregation, mixture-of-experts coefficients,
staleness, sync cadence, partial rollout, agent settings ...), the parallel degrees (Megatron TP / EP /
PP, sequence parallelism, the number of trainer and rollout workers) and the node count. What it changes,
and only this, each entry recorded with its reason:

- the device: `trainer.device` cuda -> cpu (gloo instead of NCCL);
- the model: `model.path` -> a tiny random-init model of the same HF architecture (`MODEL_STANDINS`),
  fp32, sdpa attention; `model.override_config` only where the layout's degrees need it (heads that TP
  divides, experts that EP divides) or an engine's CPU build needs it (vLLM's CPU attention refuses
  head_dim 16);
- the data: synthetic rows of the same kind (arithmetic for math sets, figures for image sets), a few
  validation prompts, short prompts and responses, small batches with the profile's number of
  mini-batches per step (capped at 2), DAPO's overlong buffer inside the short response;
- the steps: 3, or one sync window plus one step in fully-async mode (`trigger_parameter_sync_step + 1`);
- a world larger than this machine holds (`MAX_TRAINER_RANKS` trainer ranks, `MAX_ROLLOUT_WORKERS`
  fully-async rollout workers): fewer ranks with the layout's shape kept (each degree divided by the
  same factor, but a degree above 1 stays at least 2), recorded per degree;
- the rollout engine's tensor parallelism: 1 (vLLM's CPU build and the SGLang adapter refuse TP > 1 on
  a CPU device, `trainer/rollout/vllm_engine.py: check_tensor_parallel`).

SGLang has no CPU build: its adapter (`trainer/rollout/sglang_engine.py`) runs against the tests' engine
double (`tests/helpers/engines.py`), driven by a tiny model (`rlbench/rehearse/double/`), and the plan
says so. Nothing here decides whether a profile *can* run: the rehearsal runs the config and records
where it stops.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from rlbench.suites.suite import Suite

MAX_TRAINER_RANKS = 4  # trainer ranks (gloo processes) one rehearsal starts on the 2-core / 24 GB machine
MAX_ROLLOUT_WORKERS = 2  # fully-async rollout workers (one engine each)
COLOCATED_STEPS = 3
MODEL_ROOT = "runs/rehearsal/models"  # tiny stand-ins saved as HF folders (relative to the project root)
SGLANG_NOTE = "SGLang: adapter against a double, not a real SGLang run"

# model path (lower-case, as a regex searched in it) -> the tiny stand-in of the same HF architecture
MODEL_STANDINS: list[tuple[str, str, str]] = [
    (r"qwen3\.5-.*a\d+b", "tiny:qwen3.5-moe", "Qwen3_5MoeForConditionalGeneration (vision tower + MoE text model)"),
    (r"qwen3-.*a\d+b", "tiny:qwen3_moe", "Qwen3MoeForCausalLM"),
    (r"qwen3-\d+b", "tiny:qwen3", "Qwen3ForCausalLM"),
    (r"qwen2\.5", "tiny:qwen2", "Qwen2ForCausalLM (Qwen2.5 is the Qwen2 architecture)"),
    (r"smollm2", "tiny:llama", "LlamaForCausalLM (SmolLM2 is a Llama)"),
]
# the retool SFT checkpoint is a fine-tuned Qwen2.5-32B-Instruct (its suite's description)
MODEL_ALIASES = {"retool-sft-qwen2.5-32b-ins": "qwen2.5-32b-instruct"}


@dataclass
class Change:
    field: str
    profile: Any
    rehearsal: Any
    why: str


@dataclass
class Plan:
    suite: str
    profile: str
    mode: str
    config: dict[str, Any]
    changes: list[Change] = field(default_factory=list)
    nodes: int = 1
    engine_note: str = ""
    folder_model: dict[str, Any] | None = None  # {tiny, override_config}: build model.path's folder before the run

    def changes_as_dicts(self) -> list[dict[str, Any]]:
        return [asdict(c) for c in self.changes]


class _Recorder:
    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.changes: list[Change] = []

    def get(self, path: str, default: Any = None) -> Any:
        node: Any = self.cfg
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    def set(self, path: str, value: Any, why: str) -> None:
        old = self.get(path)
        if old == value:
            return
        node = self.cfg
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
        self.changes.append(Change(path, old, value, why))


def model_standin(path: str) -> tuple[str, str] | None:
    """(tiny model id, architecture) standing in for `path`, or None when no tiny model of its architecture exists."""
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    name = MODEL_ALIASES.get(name, name)
    for pattern, tiny, arch in MODEL_STANDINS:
        if re.search(pattern, name):
            return tiny, arch
    return None


def model_folder_name(tiny: str, override_config: dict[str, Any]) -> str:
    name = tiny.split(":", 1)[1]
    for k, v in sorted(override_config.items()):
        name += f"-{k}{v}"
    return name


def _scaled(degree: int, factor: int) -> int:
    """A parallel degree on `1/factor` of the ranks, the layout's shape kept: above 1 it stays at least 2."""
    if degree <= 1 or factor <= 1:
        return degree
    return max(degree // factor, 2)


def rehearsal_config(suite: Suite, profile: str, mode: str) -> Plan:
    """The rehearsal plan of one suite x profile x mode (module docstring)."""
    cfg = copy.deepcopy(suite.resolve_trainer_config(profile, mode, expand=False))
    r = _Recorder(cfg)
    engine = r.get("rollout.engine", "hf")
    strategy = r.get("actor.strategy", "fsdp2")

    # ---- device
    r.set("trainer.device", "cpu", "no GPU on this machine: CPU workers, gloo process groups instead of NCCL")
    r.set("trainer.progress", False, "a log, not a progress bar")
    r.set("trainer.save_freq", 0, "no checkpoints in a rehearsal") if r.get("trainer.save_freq", 0) > 0 else None
    r.set("trainer.out_dir", f"runs/rehearsal/{suite.id}/{profile}/{mode}", "rehearsal runs have a folder of their own")

    # ---- model
    path = str(r.get("model.path"))
    over_profile = dict(r.get("model.override_config") or {})
    stand = model_standin(path)
    if stand is None:
        raise ValueError(f"{suite.id} {profile}: model.path={path} has no tiny stand-in of its architecture "
                         f"(add one to rlbench/rehearse/transform.py MODEL_STANDINS)")
    tiny, arch = stand
    as_folder = not path.startswith(("embedded:", "tiny:", "shape:")) and not path.endswith(".gguf")
    r.set("model.path", tiny, f"a random-init tiny model of the same HF architecture ({arch}); the profile's "
          f"weights are not on this machine and would not fit it")
    if r.get("model.dtype", "float32") != "float32":
        r.set("model.dtype", "float32", "CPU; fp32 keeps engine and trainer log-probs equal to fp32 rounding")
    if r.get("model.attn_implementation", "sdpa") == "flash_attention_2":
        r.set("model.attn_implementation", "sdpa", "flash-attention has no CPU build")
    over = dict(r.get("model.override_config") or {})
    new_over = {k: v for k, v in over.items() if k != "max_position_embeddings"}
    if new_over != over:
        r.set("model.override_config", new_over, "the stretched context is the full model's; the tiny model's "
              "1024 positions hold the rehearsal's short sequences")
        over = new_over

    # ---- world: trainer ranks and their layout
    fully_async = mode == "fully_async"
    nnodes = int(r.get("trainer.nnodes", 1))
    meg = r.get("actor.megatron", {}) or {}
    if fully_async:
        train, roll = int(r.get("async.train_gpus")), int(r.get("async.rollout_gpus"))
        if roll > MAX_ROLLOUT_WORKERS:
            r.set("async.rollout_gpus", MAX_ROLLOUT_WORKERS, f"{roll} rollout workers (one engine each) do not fit "
                  f"2 cores / 24 GB next to the trainer; {MAX_ROLLOUT_WORKERS} keep several replicas")
        world = train
    else:
        world = int(r.get("trainer.n_gpus_per_node", 1)) * nnodes
    factor = 1
    if world > MAX_TRAINER_RANKS:
        factor = math.ceil(world / MAX_TRAINER_RANKS)
        new_world = world // factor
        why = (f"{world} trainer ranks do not fit 2 cores / 24 GB (one gloo process each); {new_world} ranks "
               f"with the layout's shape kept")
        if fully_async:
            r.set("async.train_gpus", new_world, why)
        else:
            r.set("trainer.n_gpus_per_node", max(new_world // nnodes, 1), why)
            if new_world < nnodes:
                r.set("trainer.nnodes", new_world, why)
                nnodes = new_world
        world = new_world
    if fully_async and nnodes > 1:
        per_node = math.ceil((int(r.get("async.train_gpus")) + int(r.get("async.rollout_gpus"))) / nnodes)
        r.set("trainer.n_gpus_per_node", max(per_node, 1), "devices per node after the world was shrunk")
    if strategy == "megatron":
        for key in ("tensor_model_parallel_size", "expert_model_parallel_size", "pipeline_model_parallel_size"):
            d = int(meg.get(key, 1))
            nd = _scaled(d, factor)
            if nd != d:
                r.set(f"actor.megatron.{key}", nd, f"{d} does not fit {world} ranks; {nd} keeps the degree above 1")
    tp = int(r.get("actor.megatron.tensor_model_parallel_size", 1)) if strategy == "megatron" else 1
    ep = int(r.get("actor.megatron.expert_model_parallel_size", 1)) if strategy == "megatron" else 1
    # the tiny model's shape where the degrees need it: kv heads TP divides, experts EP divides
    if tp > 2:
        over = {**over, "num_attention_heads": max(4, tp), "num_key_value_heads": tp}
        r.set("model.override_config", over, f"TP={tp} splits the attention heads and kv heads; the tiny model's "
              f"4 / 2 get {max(4, tp)} / {tp}")
    if ep > 4 and tiny in ("tiny:qwen3_moe", "tiny:qwen3.5-moe"):
        over = {**over, "num_experts": ep}
        r.set("model.override_config", over, f"EP={ep} splits the experts; the tiny model's 4 experts get {ep}")
    if engine == "vllm":
        over = {**over, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
                "intermediate_size": 256}
        r.set("model.override_config", over, "vLLM's CPU attention kernel refuses the tiny model's head_dim 16 "
              "(docs/hardware.md); width 128 with 2 heads gives head_dim 64, kv heads 1 keeps GQA")
    nodes = nnodes

    # ---- rollout engine
    rtp = int(r.get("rollout.tensor_parallel_size", 1))
    if rtp > 1:
        why = {"vllm": "vLLM's CPU build is run with TP=1 (the adapter refuses TP > 1 on a CPU device)",
               "sglang": "the SGLang adapter refuses TP > 1 on a CPU device; SGLang's own TP happens inside "
                         "SGLang, which the double does not have"}.get(engine, "one CPU device per engine")
        r.set("rollout.tensor_parallel_size", 1, why)
    if engine == "vllm":
        r.set("rollout.gpu_memory_utilization", 0.05, "on CPU vLLM takes this fraction of the machine's RAM "
              "for its engine; 5% (1.2 GB) holds a tiny model's weights and KV cache")

    # ---- data of the same kind
    # the profile's own data (a mini profile may swap the suite's image set for text rows)
    images = "geo3k" in str(r.get("data.train_files", "")).lower() or tiny == "tiny:qwen3.5-moe"
    kind = "synthetic:geometry-count?num=64&num_val=8" if images else "synthetic:arithmetic-easy?num=64&num_val=8"
    r.set("data.train_files", kind, "synthetic rows of the same kind (figures with a question for an image set, "
          "arithmetic with a boxed answer for a math set); the profile's data is not on this machine")
    r.set("data.val_files", None, "the synthetic task's own validation split")
    r.set("data.num_val_samples", 4, "a few validation prompts: the rehearsal checks mechanics")
    agent = bool(r.get("agent.enable", False))
    resp = 32 if agent else 16
    r.set("data.max_prompt_length", 128, "the synthetic prompts fit 128 tokens of the tiny byte-level tokenizer")
    r.set("data.max_response_length", resp, "a few tokens per response (a random-init model); "
          + ("room for a tool call and its output" if agent else "enough for every step's mechanics"))
    if agent:
        obs = int(r.get("agent.max_observation_tokens", 64))
        if obs > 8:
            r.set("agent.max_observation_tokens", 8, "tool output kept within the short response")
    ob = r.get("algorithm.overlong_buffer") or {}
    if ob.get("enable") and int(ob.get("len", 16)) >= resp:
        r.set("algorithm.overlong_buffer.len", resp // 2, "the overlong buffer must start inside the short response")

    # ---- batches: the profile's mini-batches per step (at most 2), each split over the data-parallel ranks
    tb, mb = int(r.get("data.train_batch_size")), int(r.get("actor.ppo_mini_batch_size"))
    n_mini = min(max(tb // mb, 1), 2)
    if fully_async:
        n_mini = 1  # the fully-async trainer takes one mini-batch per update (x async.require_batches)
    mini = max(2, world)  # the trainer splits a mini-batch's prompts over its workers
    r.set("actor.ppo_mini_batch_size", mini, f"{mini} prompts per mini-batch (x rollout.n responses), a multiple "
          f"of the {world} trainer ranks")
    r.set("data.train_batch_size", mini * n_mini, f"{n_mini} mini-batch(es) per step, as the profile's "
          f"{tb} / {mb} (at most 2)" if not fully_async else "the fully-async trainer's update takes its own "
          "mini-batches from the queue")
    micro = int(r.get("actor.ppo_micro_batch_size_per_gpu"))
    if micro > 4:
        r.set("actor.ppo_micro_batch_size_per_gpu", 4, "small micro-batches: several forward/backward passes per rank")
    if fully_async and r.get("async.rollout_groups_per_call") is None:
        pass  # the loop's default (require_batches x ppo_mini_batch_size) already follows the new mini-batch
    val_n = int(r.get("rollout.val_n", 1))
    if val_n > 2:
        r.set("rollout.val_n", 2, "two validation samples per prompt keep val_n > 1 and the time short")

    # ---- validation and steps
    if fully_async:
        steps = int(r.get("async.trigger_parameter_sync_step", 1)) + 1
        why = "one sync window plus one step: the run crosses a weight sync"
    else:
        steps = COLOCATED_STEPS
        why = "a few steps: three updates and two weight syncs"
    r.set("trainer.total_steps", steps, why)
    r.set("trainer.test_freq", steps, "validation before training and at the end")
    r.set("trainer.resume", False, "a rehearsal starts fresh")
    folder_model = None
    if as_folder:  # the profile names an HF folder: so does the rehearsal (the engines then load it as it is)
        folder_model = {"tiny": tiny, "override_config": dict(r.get("model.override_config") or {})}
        folder = f"{MODEL_ROOT}/{model_folder_name(tiny, folder_model['override_config'])}"
        r.cfg["model"]["path"] = folder
        r.changes = [c for c in r.changes if c.field != "model.override_config"]
        for c in r.changes:
            if c.field == "model.path":
                c.rehearsal = folder
                c.why += (f"; saved as an HF folder ({tiny}" + (f" with {folder_model['override_config']}"
                          if folder_model["override_config"] else "") + "), as the profile's model.path is a folder")
        r.cfg["model"].pop("override_config", None)
        if over_profile:
            r.changes.append(Change("model.override_config", over_profile, None, "baked into the folder's config.json"))
    return Plan(suite=suite.id, profile=profile, mode=mode, config=r.cfg, changes=r.changes, nodes=nodes,
                engine_note=SGLANG_NOTE if engine == "sglang" else "", folder_model=folder_model)
