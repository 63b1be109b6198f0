"""The Megatron training backend: megatron-core's GPTModel built from the HF config through mbridge.

    actor = MegatronActor.from_hf(hf_model, cfg.actor, temperature=1.0, max_response_length=R, device=dev)
    actor.compute_logprobs(batch); actor.update(batch, n); dict(actor.named_weights())   # HF names

`MegatronActor` implements the interface of `trainer/backends/actor.py` (log-probs of a batch, the
PPO-style update, weights out by HF name, state for checkpoints, statistics summed over the
data-parallel ranks): it *is* an `Actor` whose forward, gradient reduction and clipping, and weight
export are megatron-core's, so the update loop and the loss math (`trainer/algorithms`) are the
FSDP2 backend's, not a copy.

Model: `mbridge.AutoBridge.from_config(hf_config)` maps the HF config onto a `TransformerConfig`
(qwen2, qwen3, qwen3_moe, llama, mixtral, ...); the layers come from megatron-core's local spec
(`get_gpt_layer_local_spec`: no TransformerEngine, no Apex). mbridge's own loaders assume the
TransformerEngine layer names and CUDA, so this module walks the parameters itself and uses
mbridge's name tables and tensor conversions (fused QKV layout, gate/up fusion, TP split and merge)
for each one, with `LOCAL_TO_TE` translating the local spec's names to the names mbridge knows.
HF weights come from the checkpoint layout `save_pretrained` writes (per-expert tensors for MoE);
export converts back to that layout, then to transformers' in-memory layout (experts fused in 3D
`gate_up_proj` / `down_proj`): the names the FSDP2 backend yields, so every rollout engine's weight
sync takes them as it takes FSDP2's (hf and static load them in memory; vLLM and SGLang get them
turned into the checkpoint layout by `trainer/rollout/checkpoint_layout.py`; tests/engines/
test_vllm_megatron.py, tests/unit/test_sglang_megatron_sync.py).

Batches: megatron-core's RoPE uses the token's index in the row, not `position_ids`, so each row is
left-aligned (its real tokens moved to the front, the padding to the back; positions then equal the
HF `position_ids` of the real tokens) and run under a plain causal mask.
Log-probs: the decoder's final hidden states of the response positions go through the trainer's
chunked LM-head function (`trainer/ops/logprobs.py`, the FSDP2 backend's), with the output layer's
weight (TP shards gathered), so no `[N, T, V]` logits are materialized.

MoE: the router load-balancing loss (`actor.moe_aux_loss_coeff`) is megatron-core's own
(`moe_router_load_balancing_type: aux_loss`), given the padding mask and its gradient scaled to each
micro-batch's share of the mini-batch's response tokens, so the same coefficient takes the FSDP2
path's update; the `actor/moe/*` metrics come from megatron's routers (`trainer/backends/megatron/moe.py`).

Parallelism: tensor (`actor.megatron.tensor_model_parallel_size`), with sequence parallelism
(`sequence_parallel`: megatron-core's own SP layers, norms from `trainer/backends/megatron/norm.py`; each
row padded to a multiple of TP, the decoder's output gathered over TP before the log-prob head, whose
loss every TP rank computes whole; MoE under TP needs it, as in megatron-core), expert
(`expert_model_parallel_size`: megatron-core's alltoall token dispatcher on every device, CPU included,
`tests/unit/test_megatron_dispatcher.py`; experts are never tensor-parallel, so under TP the ranks of a
TP group hold the same experts and train them on their own slices of the sequence), pipeline
(`pipeline_model_parallel_size`: each rank builds its stage's layers, megatron-core's non-interleaved
1F1B schedule runs the update's micro-batches through the same loss function as the plain loop;
`trainer/backends/megatron/pipeline.py`; not with megatron's DDP and distributed optimizer);
data parallel over the remaining ranks (N / (TP x PP)). The ranks are the Ray trainer workers (colocated with
`trainer.use_ray`, or fully-async `async.train_gpus`; `trainer/distributed/worker_actor.py`); the
single-process loop has one. Checkpoints of several ranks hold each rank's own state
(`trainer/distributed/actor_state.py`). PPO's critic (`critic.enable`) is `MegatronCritic`
(`trainer/backends/megatron/critic.py`): a second GPTModel body in the policy's layout with a replicated
`Linear(H, 1)` head, the FSDP2 critic's update loop and loss; not under pipeline parallelism.
On CPU (gloo) a shim (`cpu_shim`) serves megatron-core's unconditional `torch.cuda` calls; gradients are
all-reduced with torch over the data-parallel groups and the optimizer is torch's AdamW. On CUDA
(`actor.megatron.optimizer: auto` or `megatron`)
`from_hf` wraps the model in megatron's DDP and gives it megatron's distributed optimizer
(`trainer/backends/megatron/gpu.py`: fp32 grad buffers, fp32 masters for bf16 params, Adam state
sharded over the data-parallel ranks, fused Adam), in every loop that builds the actor; its state
(masters and moments included) goes into the checkpoints. `actor.megatron.optimizer: torch` keeps
the CPU path's all-reduce and AdamW on CUDA; `megatron` on a CPU run stops at start.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from trainer.backends.actor import Actor, LossFn, MicroBatchOut
from trainer.components.batch import Batch
from trainer.config import ActorConfig, TrainerConfig
from trainer.errors import ConfigError
from trainer.ops.logprobs import lm_head_logprobs

# local-spec parameter names -> the TransformerEngine-spec names mbridge's tables use
LOCAL_TO_TE = [
    (re.compile(r"\.input_layernorm\.weight$"), ".self_attention.linear_qkv.layer_norm_weight"),
    (re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$"), r".mlp.experts.\2.weight\1"),
]
DENSE_PRE_MLP = (re.compile(r"\.pre_mlp_layernorm\.weight$"), ".mlp.linear_fc1.layer_norm_weight")


def trainer_world(cfg: TrainerConfig) -> tuple[str, int]:
    """(the loop, its number of trainer ranks): the single-process loop has one; the colocated Ray loop
    `trainer.n_gpus_per_node * nnodes`; the fully-async loop `async.train_gpus`."""
    t = cfg.trainer
    if t.mode == "fully_async":
        return "fully_async", cfg.async_.train_gpus
    if t.use_ray or t.n_gpus_per_node * t.nnodes > 1:
        return "colocated_ray", t.n_gpus_per_node * t.nnodes
    return "colocated", 1


def check_megatron_supported(cfg: TrainerConfig, num_experts: int = 0) -> None:
    """Raise ConfigError for `actor.strategy=megatron` settings this backend does not run (one line each);
    `num_experts`: routed experts per MoE layer of the model (0: dense)."""
    a = cfg.actor
    m = a.megatron
    loop, world = trainer_world(cfg)
    tp, ep = m.tensor_model_parallel_size, m.expert_model_parallel_size
    is_moe = num_experts > 1
    pp = m.pipeline_model_parallel_size
    if pp > 1:  # trainer/backends/megatron/pipeline.py
        from trainer.backends.megatron.pipeline import check_pipeline_config

        check_pipeline_config(cfg, loop, world)
    if m.sequence_parallel and tp == 1:
        raise ConfigError("actor.megatron.sequence_parallel=true: sequence parallelism splits the sequence over the "
                          "tensor-parallel ranks, and actor.megatron.tensor_model_parallel_size=1 (fix: set "
                          "sequence_parallel false, or tensor_model_parallel_size > 1)")
    if loop == "colocated" and tp * ep > 1:
        raise ConfigError(f"actor.megatron.tensor_model_parallel_size={tp} / expert_model_parallel_size={ep}: the "
                          f"single-process loop has one rank (fix: trainer.use_ray=true with trainer.n_gpus_per_node "
                          f"workers, or set both to 1)")
    for field, size in (("tensor_model_parallel_size", tp), ("expert_model_parallel_size", ep)):
        if world % size:
            where = "async.train_gpus" if loop == "fully_async" else "trainer.n_gpus_per_node * trainer.nnodes"
            raise ConfigError(f"actor.megatron.{field}={size}: does not divide the {world} trainer ranks "
                              f"({where}) (fix: a divisor of {world})")
    if ep > 1 and not is_moe:
        raise ConfigError(f"actor.megatron.expert_model_parallel_size={ep}: model.path={cfg.model.path} is a dense "
                          f"model, it has no experts (fix: set it to 1, or train an MoE model)")
    if is_moe and num_experts % ep:
        raise ConfigError(f"actor.megatron.expert_model_parallel_size={ep}: does not divide the model's {num_experts} "
                          f"experts (fix: a divisor of {num_experts})")
    if tp > 1 and is_moe and not m.sequence_parallel:  # megatron-core's own rule for MoE under TP
        raise ConfigError(f"actor.megatron.tensor_model_parallel_size={tp}: an MoE model under tensor parallelism "
                          f"needs sequence parallelism (fix: actor.megatron.sequence_parallel=true)")
    for field in ("mixed_precision", "compile"):
        if getattr(a, field) not in ("none", False):
            raise ConfigError(f"actor.{field}={getattr(a, field)}: not supported by actor.strategy=megatron "
                              f"(fix: remove it, or use actor.strategy=fsdp2)")
    if a.use_kl_loss and pp > 1:
        raise ConfigError(f"actor.use_kl_loss: the KL loss's reference policy is not built under pipeline parallelism "
                          f"(actor.megatron.pipeline_model_parallel_size={pp}) (fix: turn the KL loss off, or "
                          f"pipeline_model_parallel_size=1)")
    if cfg.critic.enable and pp > 1:  # the value model: trainer/backends/megatron/critic.py
        raise ConfigError(f"critic.enable: the value model is not built under pipeline parallelism "
                          f"(actor.megatron.pipeline_model_parallel_size={pp}) (fix: pipeline_model_parallel_size=1, "
                          f"or actor.strategy=fsdp2)")
    if cfg.model.gradient_checkpointing:
        raise ConfigError("model.gradient_checkpointing: not wired for actor.strategy=megatron (fix: set it false)")


def use_megatron_optimizer_on(cfg: ActorConfig, device: torch.device) -> bool:
    """Whether the actor gets megatron's DDP + distributed optimizer (`actor.megatron.optimizer`:
    auto = on CUDA; megatron on a CPU device is a ConfigError)."""
    choice = cfg.megatron.optimizer
    if choice == "megatron" and device.type != "cuda":
        raise ConfigError(f"actor.megatron.optimizer=megatron: megatron-core's DDP and distributed optimizer run on "
                          f"CUDA only, this run's device is {device.type} (fix: actor.megatron.optimizer=auto or torch)")
    return choice == "megatron" or (choice == "auto" and device.type == "cuda")


# --------------------------------------------------------------------------- process setup

# the stand-in for the alltoall MoE dispatcher's CUDA side stream on a CPU-only torch (cpu_shim)
_CPU_STREAM = SimpleNamespace(record_event=lambda: SimpleNamespace(synchronize=lambda: None))


def cpu_shim() -> None:
    """Serve megatron-core's unconditional CUDA calls on a CPU-only torch (RNG tracker, RoPE buffer,
    attention buffer, the MoE dispatchers' device lookups, the alltoall dispatcher's side stream and split
    sizes). With CUDA only the TransformerEngine-less router fix below applies."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):  # 0.16: the router's GEMM reads this name even without TE
        moe_utils.te_general_gemm = None
    if torch.cuda.is_available():
        return
    import megatron.core.tensor_parallel.random as mr

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.manual_seed = lambda seed: None
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda new_state, device="cuda": torch.set_rng_state(new_state)
    mr._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    mr._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)
    # MoEAlltoAllTokenDispatcher: its device-to-host copies of the split sizes run on a side stream made once
    # (`cuda_dtoh_stream = torch.cuda.Stream()` in __init__), compared with `torch.cuda.current_stream()` and
    # waited on by `cuda_dtoh_stream.record_event().synchronize()`. On CPU every op has finished when it
    # returns: one stand-in stream, also the current one (so no cross-stream wait), whose events are done.
    from megatron.core.transformer.moe import token_dispatcher as td

    td.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _CPU_STREAM
    torch.cuda.current_stream = lambda device=None: _CPU_STREAM
    # ... and those copies, `maybe_move_tensor_to_cpu(splits, as_numpy=True)`, give all_to_all_single its split
    # sizes as numpy arrays, but only from a CUDA tensor: a CPU tensor comes back a tensor, which
    # all_to_all_single refuses (it takes a sequence of ints). Same arrays here.
    td.maybe_move_tensor_to_cpu = lambda tensor, as_numpy=False, record_stream=False: (
        tensor.numpy() if as_numpy and torch.is_tensor(tensor)
        else moe_utils.maybe_move_tensor_to_cpu(tensor, as_numpy, record_stream))


def init_parallel(tp: int = 1, ep: int = 1, *, pp: int = 1, seed: int = 0) -> None:
    """megatron-core's parallel groups over the default process group (a one-rank gloo group is started
    when none exists). Experts are never tensor-parallel (expert-TP size 1: each expert whole on its
    rank, `GroupedExperts`); under TP the ranks of a TP group hold the same experts and train them on
    their own slices of the sequence, reduced over the expert-data-parallel group."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    cpu_shim()
    if not dist.is_initialized():  # one rank: an in-process store, no port to race other processes for
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=dist.HashStore(),
                                rank=0, world_size=1)
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep, pipeline_model_parallel_size=pp,
                                 expert_tensor_parallel_size=1)
    model_parallel_cuda_manual_seed(seed)


def build_bridge(hf_config: Any, *, dtype: torch.dtype, moe_aux_loss_coeff: float = 0.0,
                 sequence_parallel: bool = False, token_dispatcher: str = "alltoall", **overrides: Any):
    """mbridge's bridge for `hf_config` with the TransformerConfig switched to what runs without
    TransformerEngine (no fusions; megatron's alltoall MoE dispatcher on every device, on CPU through
    `cpu_shim`). `token_dispatcher="local"`: the models `build_gpt_model` makes from it dispatch with
    `LocalTokenDispatcher` (trainer/backends/megatron/dispatch.py; EP = 1)."""
    import copy

    from mbridge import AutoBridge

    hf_config = copy.deepcopy(hf_config)
    rope = getattr(hf_config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"actor.strategy=megatron: rope_type={rope['rope_type']} is not mapped (fix: a model with "
                          f"default RoPE, or actor.strategy=fsdp2)")
    if "rope_theta" in rope:  # transformers 5 keeps it in rope_parameters; mbridge reads config.rope_theta
        hf_config.rope_theta = rope["rope_theta"]
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    # TP > 1: vocab padded to a multiple of 128 * TP (megatron's default); export trims it
    bridge = AutoBridge.from_config(hf_config, dtype=dtype, make_vocab_size_divisible_by=128 * tp if tp > 1 else None)
    extra: dict[str, Any] = {
        "use_cpu_initialization": True, "gradient_accumulation_fusion": False, "bias_activation_fusion": False,
        "masked_softmax_fusion": False, "persist_layer_norm": False, "apply_rope_fusion": False,
        "bias_dropout_fusion": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "variable_seq_lengths": False, "sequence_parallel": sequence_parallel}
    if bridge.config.num_moe_experts:
        extra.update(moe_token_dispatcher_type="alltoall", moe_permute_fusion=False, moe_grouped_gemm=False,
                     moe_router_pre_softmax=False,  # top-k of the logits, then softmax: HF's normalized top-k
                     moe_router_load_balancing_type="aux_loss" if moe_aux_loss_coeff > 0 else "none",
                     moe_aux_loss_coeff=moe_aux_loss_coeff,
                     calculate_per_token_loss=False)  # the aux loss's scale is set per micro-batch (megatron_moe.py)
        if getattr(hf_config, "norm_topk_prob", True) is False:
            extra["moe_router_pre_softmax"] = True  # softmax over all experts, top-k not renormalized
    extra.update(overrides)
    bridge.set_extra_args(**extra)
    if token_dispatcher not in ("local", "alltoall"):
        raise ValueError(f"build_bridge: token_dispatcher={token_dispatcher!r} (local or alltoall)")
    bridge.token_dispatcher = token_dispatcher
    return bridge


def build_gpt_model(bridge: Any, *, grouped_experts: bool = True, sdpa_attention: bool = True) -> torch.nn.Module:
    """megatron-core GPTModel with the local layer spec, from the bridge's config. Norms:
    `SequenceParallelNorm` (`trainer/backends/megatron/norm.py`), MoE experts:
    `GroupedExperts` (grouped GEMMs, `trainer/backends/megatron/experts.py`) or megatron's SequentialMLP,
    dispatched as the bridge says (`build_bridge`'s `token_dispatcher`); attention: `CausalSDPA` (torch's
    fused kernels, `trainer/backends/megatron/attention.py`) or megatron's `DotProductAttention`."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    c = bridge.config
    spec = get_gpt_layer_local_spec(num_experts=c.num_moe_experts, moe_grouped_gemm=c.moe_grouped_gemm,
                                    qk_layernorm=c.qk_layernorm, normalization=c.normalization)
    if c.num_moe_experts and grouped_experts:
        from trainer.backends.megatron.experts import use_grouped_experts

        use_grouped_experts(spec)
    if sdpa_attention:
        from trainer.backends.megatron.attention import use_sdpa_attention

        use_sdpa_attention(spec)
    from trainer.backends.megatron.norm import use_sequence_parallel_norms

    spec = use_sequence_parallel_norms(spec, c)
    kw = bridge._get_gptmodel_args()
    bridge.vocab_size = bridge.padded_vocab_size = kw["vocab_size"]
    if bridge.make_vocab_size_divisible_by:
        d = bridge.make_vocab_size_divisible_by
        bridge.padded_vocab_size = kw["vocab_size"] = -(-bridge.vocab_size // d) * d
    from megatron.core import parallel_state as ps

    from trainer.backends.megatron.pipeline import cpu_cuda_calls, pipeline_size

    # a pipeline stage: the embedding on the first, the final norm and output layer on the last, its own layers
    with cpu_cuda_calls() if pipeline_size() > 1 else contextlib.nullcontext():  # tied embeddings' setup
        gpt = GPTModel(config=c, transformer_layer_spec=spec, pre_process=ps.is_pipeline_first_stage(),
                       post_process=ps.is_pipeline_last_stage(),
                       share_embeddings_and_output_weights=bool(getattr(bridge.hf_config, "tie_word_embeddings",
                                                                        False)),
                       **kw)
    if c.num_moe_experts and bridge.token_dispatcher == "local":
        from trainer.backends.megatron.dispatch import install_local_dispatch

        install_local_dispatch(gpt)
    return gpt


# --------------------------------------------------------------------------- weights in and out

def _te_name(name: str, is_moe: bool) -> str:
    for pat, rep in LOCAL_TO_TE:
        name = pat.sub(rep, name)
    if not is_moe:
        name = DENSE_PRE_MLP[0].sub(DENSE_PRE_MLP[1], name)
    return name


_GROUPED = re.compile(r"^(.*\.mlp\.experts)\.(fc[12])$")


def _expanded(items: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """`GroupedExperts` weights `...mlp.experts.fc1 [E, 2I, H]` as per-expert views named like
    SequentialMLP's (`...mlp.experts.local_experts.<e>.linear_fc1.weight`); other items unchanged."""
    for name, t in items:
        m = _GROUPED.match(name)
        if m is None:
            yield name, t
            continue
        for e in range(t.shape[0]):
            yield f"{m.group(1)}.local_experts.{e}.linear_{m.group(2)}.weight", t[e]


def _global_expert(name: str, bridge: Any) -> str:
    """Local expert index -> global (expert-parallel rank offset)."""
    m = re.search(r"\.mlp\.experts\.(linear_fc[12])\.weight(\d+)$", name)
    if m is None or bridge.mpu.ep_size == 1:
        return name
    per_rank = bridge.config.num_moe_experts // bridge.mpu.ep_size
    return name[:m.start(2)] + str(int(m.group(2)) + per_rank * bridge.mpu.ep_rank)


def hf_checkpoint_tensors(hf_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The HF model's weights in its checkpoint layout (what `save_pretrained` writes; per-expert
    tensors for MoE), which is the layout mbridge's tables name."""
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        # every rank needs the tensors; transformers writes on distributed rank 0 only
        hf_model.should_save_on_this_rank = lambda is_main_process: True
        try:
            hf_model.save_pretrained(tmp)
        finally:
            del hf_model.should_save_on_this_rank
        out: dict[str, torch.Tensor] = {}
        for f in sorted(os.listdir(tmp)):
            if f.endswith(".safetensors"):
                out.update(load_file(os.path.join(tmp, f)))
    if "lm_head.weight" not in out and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


@torch.no_grad()
def load_hf_weights(model: torch.nn.Module, bridge: Any, hf: dict[str, torch.Tensor]) -> None:
    """Copy HF checkpoint-layout tensors into this rank's shard of every megatron parameter."""
    from trainer.backends.megatron.pipeline import global_layer_name, layer_offset

    is_moe, offset = bool(bridge.config.num_moe_experts), layer_offset(model)
    for name, param in _expanded(model.state_dict(keep_vars=True).items()):
        if "_extra_state" in name:
            continue
        te = _global_expert(_te_name(global_layer_name(name, offset), is_moe), bridge)
        hf_names = bridge._weight_name_mapping_mcore_to_hf(te)
        missing = [h for h in hf_names if h not in hf]
        if missing:
            raise ConfigError(f"actor.strategy=megatron: the HF weights lack {missing[0]} for {name} (fix: a model "
                              f"mbridge maps, or actor.strategy=fsdp2)")
        full = bridge._weight_to_mcore_format(te, [hf[h] for h in hf_names])
        expert = ".mlp.experts." in te
        size = bridge.mpu.etp_size if expert else bridge.mpu.tp_size
        rank = bridge.mpu.etp_rank if expert else bridge.mpu.tp_rank
        piece = bridge._weight_split_across_tp(te, full, param, size)[rank] if size > 1 else full
        if piece.shape != param.shape:
            raise ConfigError(f"actor.strategy=megatron: {name}: HF shape {tuple(piece.shape)} != megatron "
                              f"{tuple(param.shape)} (fix: check the model config)")
        param.copy_(piece)


def _runtime_layout(items: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """HF checkpoint layout -> transformers' in-memory names: per-expert MLP tensors stacked into the
    fused `experts.gate_up_proj [E, 2I, H]` and `experts.down_proj [E, H, I]` (Mixtral's
    `block_sparse_moe.experts.e.w1/w3/w2`, Qwen-MoE's `mlp.experts.e.gate_proj/up_proj/down_proj`)."""
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    pat = re.compile(r"^(model\.layers\.\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight$")
    for name, t in items:
        m = pat.match(name)
        if m is None:
            yield name.replace(".block_sparse_moe.gate.", ".mlp.gate."), t
            continue
        experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
    for layer, by_e in experts.items():
        order = sorted(by_e)
        gate = [by_e[e].get("w1", by_e[e].get("gate_proj")) for e in order]
        up = [by_e[e].get("w3", by_e[e].get("up_proj")) for e in order]
        down = [by_e[e].get("w2", by_e[e].get("down_proj")) for e in order]
        yield f"{layer}.mlp.experts.gate_up_proj", torch.stack([torch.cat([g, u], 0) for g, u in zip(gate, up)])
        yield f"{layer}.mlp.experts.down_proj", torch.stack(down)


@torch.no_grad()
def export_hf_weights(model: torch.nn.Module, bridge: Any) -> list[tuple[str, torch.Tensor]]:
    """Full weights by HF in-memory name (TP shards gathered, EP shards gathered) of this pipeline stage's
    parameters, on every rank (`named_weights` gathers the stages)."""
    from megatron.core import parallel_state as ps

    from trainer.backends.megatron.pipeline import global_layer_name, is_tied_copy, layer_offset

    is_moe, offset = bool(bridge.config.num_moe_experts), layer_offset(model)
    out: list[tuple[str, torch.Tensor]] = []
    for name, param in _expanded(model.named_parameters()):
        if is_tied_copy(name, model):  # the first stage exports the tied embedding
            continue
        te = _te_name(global_layer_name(name, offset), is_moe)
        t = param.detach()
        expert = ".mlp.experts." in te
        tp_size = bridge.mpu.etp_size if expert else bridge.mpu.tp_size
        if getattr(param, "tensor_model_parallel", False) and tp_size > 1:
            group = ps.get_expert_tensor_parallel_group() if expert else ps.get_tensor_model_parallel_group()
            parts = [torch.empty_like(t) for _ in range(tp_size)]
            dist.all_gather(parts, t.contiguous(), group=group)
            t = bridge._weight_merge_across_tp(te, parts, param)
        if expert and bridge.mpu.ep_size > 1:
            parts = [torch.empty_like(t) for _ in range(bridge.mpu.ep_size)]
            dist.all_gather(parts, t.contiguous(), group=ps.get_expert_model_parallel_group())
            per_rank = bridge.config.num_moe_experts // bridge.mpu.ep_size
            local = int(re.search(r"weight(\d+)$", te).group(1))
            for r, part in enumerate(parts):
                g = re.sub(r"weight\d+$", f"weight{local + per_rank * r}", te)
                out.extend(zip(*bridge._weight_to_hf_format(g, part)))
            continue
        out.extend(zip(*bridge._weight_to_hf_format(te, t)))
    out.sort(key=lambda kv: kv[0])
    return list(_runtime_layout(out))


# --------------------------------------------------------------------------- the actor

def left_align(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """`(ids [N, T], index [N, R])`: each row's real tokens moved to the front (zeros after), and the
    column of the left-aligned row whose output predicts response token j (`prompt tokens - 1 + j`)."""
    attn = batch.attention_mask
    t = attn.shape[1]
    start = attn.float().argmax(-1)  # first real token (left-padded prompt)
    cols = (torch.arange(t, device=attn.device)[None] + start[:, None]).clamp(max=t - 1)
    ids = torch.gather(batch.input_ids, 1, cols)
    ids = ids * torch.gather(attn, 1, cols) * (cols >= start[:, None]).long()
    prompt_real = attn[:, : batch.prompt_len].sum(-1)  # [N]
    r = batch.responses.shape[1]
    index = (prompt_real[:, None] - 1 + torch.arange(r, device=attn.device)[None]).clamp(max=t - 1)
    return ids, index


class _GatherVocabShards(torch.autograd.Function):
    """All-gather of the output layer's vocab shards `[V / TP, H]` -> `[V, H]`. Backward keeps this rank's
    rows of the gradient without summing: every TP rank computes the same full gradient, since the
    hidden states that multiply the weight are replicated over TP (no sequence parallelism)."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor) -> torch.Tensor:
        from megatron.core import parallel_state as ps

        group = ps.get_tensor_model_parallel_group()
        ctx.rank, ctx.rows = dist.get_rank(group), shard.shape[0]
        parts = [torch.empty_like(shard) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, shard.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]


def output_weight(gpt: torch.nn.Module) -> torch.Tensor:
    """The LM head's weight `[V_padded, H]` (tied to the embedding where the model ties them), TP shards
    gathered, so the trainer's chunked log-prob function (`trainer/ops/logprobs.py`) runs on it and no
    `[N, T, V]` logits are materialized."""
    from megatron.core import parallel_state as ps

    w = gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights else gpt.output_layer.weight
    return _GatherVocabShards.apply(w) if ps.get_tensor_model_parallel_world_size() > 1 else w


class MegatronActor(Actor):
    """`Actor` on a megatron-core GPTModel (module docstring)."""

    def __init__(self, model: torch.nn.Module, bridge: Any, hf_config: Any, cfg: ActorConfig, *, temperature: float,
                 max_response_length: int, device: torch.device):
        self.cfg, self.temperature, self.max_response_length, self.device = cfg, temperature, max_response_length, device
        self.model, self.bridge, self.hf_config = model, bridge, hf_config
        self.gpt = model  # the GPTModel itself (self.model may become megatron's DDP wrapper on CUDA)
        self.megatron_optimizer = None
        self.master = None
        self.compile_backend = None
        from trainer.backends.actor import lm_head_compile_backend

        self.lm_head_backend = lm_head_compile_backend(cfg, device)  # actor.lm_head_compile (auto: on CUDA)
        self.router = None  # MoE: router statistics (actor/moe/*); the aux loss is megatron's own
        self._mini_batch_tokens: float | None = None  # response tokens of the mini-batch being updated
        if bridge.config.num_moe_experts:
            from trainer.backends.megatron.moe import MegatronRouterRecorder

            self.router = MegatronRouterRecorder(self.gpt)
        elif cfg.moe_aux_loss_coeff > 0:
            raise ConfigError(f"actor.moe_aux_loss_coeff={cfg.moe_aux_loss_coeff}: the model is not a mixture of "
                              f"experts, so there is no router to balance (fix: set it to 0, or train an MoE model)")
        self.hf_order: list[str] | None = None  # the HF model's parameter names, in order (from_hf)
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                           betas=cfg.betas, weight_decay=cfg.weight_decay,
                                           fused=(device.type == "cuda") or None)
        warmup = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0)

    @classmethod
    def from_hf(cls, hf_model: torch.nn.Module, cfg: ActorConfig, *, temperature: float, max_response_length: int,
                device: torch.device, seed: int = 0, dtype: torch.dtype | None = None) -> MegatronActor:
        """Parallel groups (from `cfg.megatron`), model through the bridge, HF weights loaded
        (`dtype`: the megatron parameters' dtype; default the HF model's)."""
        m = cfg.megatron
        megatron_optimizer = use_megatron_optimizer_on(cfg, device)  # a ConfigError before anything is built
        if m.pipeline_model_parallel_size > 1:
            from trainer.backends.megatron.pipeline import check_pipeline_model

            check_pipeline_model(cfg, hf_model.config, megatron_optimizer)
        init_parallel(m.tensor_model_parallel_size, m.expert_model_parallel_size, pp=m.pipeline_model_parallel_size,
                      seed=seed)
        dtype = dtype or next(hf_model.parameters()).dtype
        bridge = build_bridge(hf_model.config, dtype=dtype, moe_aux_loss_coeff=cfg.moe_aux_loss_coeff,
                              sequence_parallel=m.sequence_parallel, token_dispatcher=m.resolved_token_dispatcher())
        model = build_gpt_model(bridge).to(device=device, dtype=dtype)
        load_hf_weights(model, bridge, hf_checkpoint_tensors(hf_model))
        actor = cls(model, bridge, hf_model.config, cfg, temperature=temperature,
                    max_response_length=max_response_length, device=device)
        actor.hf_order = [name for name, _ in hf_model.named_parameters()]
        if megatron_optimizer:
            from trainer.backends.megatron.gpu import use_megatron_optimizer

            use_megatron_optimizer(actor)
        return actor

    # ------------------------------------------------------------------ forward
    def reference_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The KL loss's frozen reference policy: a second GPTModel in the policy's TP / EP layout, built through
        the same bridge, with `model`'s weights (a copy of the initial HF model; dropped after the load).
        Pipeline parallelism is refused at start (check_megatron_supported)."""
        ref = build_gpt_model(self.bridge).to(device=self.device, dtype=next(self.gpt.parameters()).dtype)
        load_hf_weights(ref, self.bridge, hf_checkpoint_tensors(model))
        return ref.requires_grad_(False).eval()

    def _logprobs(self, micro: Batch, *, with_entropy: bool = False, model: torch.nn.Module | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        gpt = None if model is None or model is self.model else model  # None: the policy; else the reference
        return self._head_logprobs(micro, self._decoder_forward(micro, gpt), with_entropy=with_entropy, gpt=gpt)

    def _decoder_forward(self, micro: Batch, gpt: torch.nn.Module | None = None) -> torch.Tensor:
        """This pipeline stage's decoder output `[T, N, H]` on the micro-batch's left-aligned rows (sequence
        parallel: this rank's `[T / TP, N, H]`); the last stage's has the final norm applied. A stage after the
        first takes the previous stage's output (megatron's `set_input_tensor`, megatron_pipeline.py).
        `gpt`: another GPTModel of the same layout (the reference policy) instead of the policy."""
        module = self.model if gpt is None else gpt  # the policy may be wrapped in megatron's DDP
        gpt = self.gpt if gpt is None else gpt
        ids, _ = left_align(micro)
        sp = self.bridge.config.sequence_parallel
        if sp:  # the sequence splits evenly over the TP ranks: padding after every row's tokens (causal: unread)
            tp = self.bridge.mpu.tp_size
            ids = torch.nn.functional.pad(ids, (0, -ids.shape[1] % tp))
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)[None].expand_as(ids)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=ids.device), 1)[None, None]  # True: masked
        kw = {}
        if self.router is not None:  # MoE: the padding (after each row's real tokens) left out of the router's
            # load-balancing loss; its gradient scaled to this micro-batch's token share (megatron_moe.py)
            kw["padding_mask"] = torch.arange(t, device=ids.device)[None] >= micro.attention_mask.sum(-1)[:, None]
            if sp and not gpt.pre_process:  # megatron-core splits it over TP on the first pipeline stage only
                from trainer.backends.megatron.pipeline import sequence_parallel_slice

                kw["padding_mask"] = sequence_parallel_slice(kw["padding_mask"])
            if self.cfg.moe_aux_loss_coeff > 0 and module.training and torch.is_grad_enabled():
                from trainer.backends.megatron.moe import set_aux_loss_scale

                if self._mini_batch_tokens is None:
                    raise RuntimeError("MegatronActor: the mini-batch's token count is not known before its "
                                       "micro-batches (begin_mini_batch was not called)")
                set_aux_loss_scale(float(micro.response_mask.sum()) / self._mini_batch_tokens, ids.device)
        post_process, gpt.post_process = gpt.post_process, False  # decoder output, no [N, T, V] logits
        try:
            return module(ids, pos, causal, **kw)  # [T, N, H]; sequence parallel: this rank's [T / TP, N, H]
        finally:
            gpt.post_process = post_process

    def _head_logprobs(self, micro: Batch, hidden: torch.Tensor, *, with_entropy: bool = False,
                       gpt: torch.nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`(logprobs [n, R], entropy [n, R])` of the responses from the last stage's decoder output (`gpt`:
        whose output layer, the policy's by default)."""
        _, index = left_align(micro)
        if self.bridge.config.sequence_parallel:  # every TP rank computes the whole loss: its gradient's own slice flows back (no reduction)
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        hidden = hidden.transpose(0, 1)  # [N, T, H]
        r = index.shape[1]
        h = torch.gather(hidden, 1, index[..., None].expand(-1, r, hidden.shape[-1]))  # [N, R, H]
        head = SimpleNamespace(weight=output_weight(self.gpt if gpt is None else gpt)[: self.bridge.vocab_size], bias=None)  # [V, H]
        return lm_head_logprobs(h, head, micro.responses, temperature=self.temperature,
                                chunk_size=self.cfg.logprob_chunk_size, with_entropy=with_entropy,
                                compile_backend=self.lm_head_backend, keep_logits=self.cfg.lm_head_keep_logits)

    # ------------------------------------------------------------------ pipeline parallelism (megatron_pipeline.py)
    def forward_backward(self, micros: list[Batch], loss_fn: LossFn) -> list[MicroBatchOut]:
        from trainer.backends.megatron import pipeline as megatron_pipeline

        if megatron_pipeline.pipeline_size() == 1:
            return super().forward_backward(micros, loss_fn)
        return megatron_pipeline.forward_backward(self, micros, loss_fn)

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, micro_batch_size: int | None = None,
                         model: torch.nn.Module | None = None) -> torch.Tensor:
        from trainer.backends.megatron import pipeline as megatron_pipeline

        if megatron_pipeline.pipeline_size() == 1 or model not in (None, self.model):
            return super().compute_logprobs(batch, micro_batch_size, model)
        self.model.eval()
        return megatron_pipeline.logprobs(self, list(batch.chunks(micro_batch_size or
                                                                  self.cfg.ppo_micro_batch_size_per_gpu)))

    # ------------------------------------------------------------------ reductions
    def data_parallel(self) -> tuple[int, int]:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()

    def all_reduce_sum(self, values: dict[str, float]) -> dict[str, float]:
        from megatron.core import parallel_state as ps

        group = ps.get_data_parallel_group()
        if dist.get_world_size(group) == 1:
            return values
        t = torch.tensor(list(values.values()), dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=group)
        return dict(zip(values, t.tolist()))

    def begin_mini_batch(self, counts: dict[str, float]) -> None:
        """The mini-batch's response tokens (over all DP ranks), for the aux loss's per-micro-batch scale."""
        self._mini_batch_tokens = max(counts["global_num_tokens"], 1.0)  # as the update loop's n_tok

    def finish_grads_and_clip(self) -> torch.Tensor:
        """Sum partial gradients over the TP group (`tp_partial_grad_params`), then over the data-parallel
        groups (dense: DP, experts: expert-DP), then the global norm over the model-parallel shards, then clip."""
        from megatron.core import parallel_state as ps

        if self.megatron_optimizer is not None:  # CUDA: megatron's DDP + distributed optimizer
            from trainer.backends.megatron.gpu import megatron_step

            return megatron_step(self)
        from trainer.backends.megatron import pipeline as pipe
        from trainer.backends.megatron.norm import tp_partial_grad_params

        dense, experts = [], []
        for name, p in self.model.named_parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            (experts if ".mlp.experts." in name else dense).append((name, p))
        if ps.get_tensor_model_parallel_world_size() > 1:  # q/k norms (own heads), sequence-parallel norms and routers
            for p in tp_partial_grad_params(self.gpt):
                dist.all_reduce(p.grad, group=ps.get_tensor_model_parallel_group())
        if pipe.pipeline_size() > 1:  # the tied embedding's copies on the first and last stage: one gradient
            pipe.reduce_tied_embedding_grad(self.gpt)
        for params, group in ((dense, ps.get_data_parallel_group()), (experts, ps.get_expert_data_parallel_group())):
            if dist.get_world_size(group) > 1:
                for _, p in params:
                    dist.all_reduce(p.grad, group=group)
        tp_rank = ps.get_tensor_model_parallel_rank()
        dense_sq = sum((p.grad.double().pow(2).sum() for name, p in dense
                        if (getattr(p, "tensor_model_parallel", False) or tp_rank == 0)
                        and not pipe.is_tied_copy(name, self.gpt)), torch.zeros((), dtype=torch.float64))
        expert_sq = sum((p.grad.double().pow(2).sum() for _, p in experts), torch.zeros((), dtype=torch.float64))
        if ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(dense_sq, group=ps.get_tensor_model_parallel_group())
        if experts and ps.get_expert_tensor_and_model_parallel_group() is not None and \
                dist.get_world_size(ps.get_expert_tensor_and_model_parallel_group()) > 1:
            dist.all_reduce(expert_sq, group=ps.get_expert_tensor_and_model_parallel_group())
        sq = dense_sq + expert_sq
        if pipe.pipeline_size() > 1:  # each stage's own parameters
            pipe.sum_over_pipeline(sq)
        norm = sq.sqrt().float()
        scale = min(1.0, self.cfg.grad_clip / (float(norm) + 1e-6))
        if scale < 1.0:
            for p in self.model.parameters():
                p.grad.mul_(scale)
        return norm

    # ------------------------------------------------------------------ weights, checkpoint, MFU
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights by HF name (a collective: every rank gathers the TP / EP shards), in the HF
        model's `named_parameters()` order, the order the fully-async weight broadcast sends in."""
        weights = export_hf_weights(self.gpt, self.bridge)
        from trainer.backends.megatron.pipeline import gather_stage_weights, pipeline_size

        weights = dict(gather_stage_weights(weights, self.device) if pipeline_size() > 1 else weights)
        if self.hf_order is None:
            yield from sorted(weights.items())
            return
        if set(weights) != set(self.hf_order):
            odd = sorted(set(weights) ^ set(self.hf_order))
            raise RuntimeError(f"megatron weight export: HF names differ from the model's ({odd[:3]} ...)")
        for name in self.hf_order:
            yield name, weights[name]

    def flops_config(self) -> Any:
        return self.hf_config

    @property
    def optimizer_impl(self) -> str:
        """`megatron` (megatron's DDP + distributed optimizer) or `torch` (all-reduce + torch AdamW)."""
        return "torch" if self.megatron_optimizer is None else "megatron"

    def state_dict(self) -> dict:
        return {**super().state_dict(), "optimizer_impl": self.optimizer_impl}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("optimizer_impl", "torch")
        if saved != self.optimizer_impl:
            raise ConfigError(f"actor.megatron.optimizer: the checkpoint holds the state of the {saved} optimizer, "
                              f"this run builds the {self.optimizer_impl} one (fix: resume with "
                              f"actor.megatron.optimizer={saved} on the same device kind, or trainer.resume=false)")
        super().load_state_dict({k: v for k, v in state.items() if k != "optimizer_impl"})

    def checkpoint_layout(self) -> str:
        """`megatron_tp<T>_pp<P>_ep<E>_world<N>`: one state per rank, each its own shards (actor_state.py)."""
        from megatron.core import parallel_state as ps

        return (f"megatron_tp{ps.get_tensor_model_parallel_world_size()}_pp{ps.get_pipeline_model_parallel_world_size()}"
                f"_ep{ps.get_expert_model_parallel_world_size()}_world{dist.get_world_size()}")
