"""Pipeline parallelism for the Megatron backend: megatron-core's 1F1B schedule runs the update.

    actor = MegatronActor.from_hf(hf, cfg)   # cfg.megatron.pipeline_model_parallel_size = P > 1
    actor.update(batch, n)                   # forward_backward(actor, micros, loss_fn) per mini-batch
    actor.compute_logprobs(batch)            # logprobs(actor, micros): the forward-only schedule
    python3 -m pytest -m integration tests/unit/test_megatron_pipeline.py   # 2 gloo ranks, PP=2 == PP=1

Stages: each rank builds the GPTModel of its stage (`pre_process` on the first: the embedding;
`post_process` on the last: the final norm and the output layer) with only its own decoder layers,
split evenly (megatron-core's `get_num_layers_to_build`). Megatron names a stage's layers from 0;
weights load and export by the *global* layer index (`global_layer_name`: the stage's offset, from its
first layer's `layer_number`, added before mbridge's name tables). Export gathers every stage's
tensors onto every rank (`gather_stage_weights`), so `named_weights()` yields the whole HF-named state
on each one. Tied embeddings (`tie_word_embeddings`): the last stage holds its own copy of the word
embedding as its output layer, loaded equal (the HF `lm_head` is the embedding); after every
backward its gradient and the first stage's are summed over megatron's embedding group
(`reduce_tied_embedding_grad`), as megatron-core's `finalize_model_grads` does, so both copies take
the same step; the last stage's copy is left out of the export and of the gradient norm.

Schedule: `get_forward_backward_func()` (non-interleaved 1F1B, the same call in megatron-core 0.16
and 0.19) over the micro-batches of one mini-batch. Its forward step runs the actor's own decoder
forward (`MegatronActor._decoder_forward`) on every stage; the last stage then takes the log-probs
(`_head_logprobs`) and calls the update's loss function (`Actor.micro_batch_loss`, the plain loop's,
not a copy), and returns the loss to the schedule, which backpropagates it and sends the gradients
of each stage's input back. Loss scale: the schedule divides what the loss function returns by the
number of micro-batches M (megatron's mean over micro-batches: `output_tensor /= num_microbatches` in
`forward_step_calc_loss`, both versions, for a `(loss, stats)` pair; `calculate_per_token_loss`
would skip that but also changes the MoE aux loss). This trainer's micro-batch loss is already
normalized by the mini-batch's global token counts, so the loss function hands the schedule
`loss * M`: the gradient of each micro-batch is the plain loop's times fl(fl(1/M) * M), exactly 1
in fp32 for every M <= 40 and every power of two (else one unit in the last place, 6e-8 relative;
checked for M <= 4096). The MoE aux loss: megatron's `MoEAuxLossAutoScaler` reads one global
scale at backward time, and 1F1B runs a micro-batch's backward after later forwards, so the scale
set before the forward would be another micro-batch's; each stage's output passes through
`_AuxScaleAtBackward`, whose backward (the first node of that micro-batch's backward) sets the
scale to that micro-batch's token share. The schedule's p2p buffers have one shape per call, so
consecutive micro-batches of equal shape run as one call (`_equal_shape_runs`; the last
micro-batch of a mini-batch may be smaller).

Statistics: the last stage's loss statistics, and each stage's MoE router statistics of its own
layers (weighted by its share of the layers: the per-layer means of `RouterRecorder.pop` then add up
to the all-layer mean; top-k counts concatenated in layer order), are gathered over the pipeline
group, so `update` returns the same metrics on every rank. Log-probs come from the last stage and
are broadcast over the pipeline group. Gradient norm: each stage's squared norm summed over the
pipeline group (`sum_over_pipeline`).

On a CPU-only torch (gloo; batch_isend_irecv, isend and irecv), `cpu_cuda_calls` serves the
schedule's and the tied-embedding setup's unconditional CUDA calls (`torch.zeros(device="cuda")`,
`tensor.cuda()`) on the CPU. With sequence parallelism the stages pass
their TP slices `[T / TP, N, H]` (the schedule's shapes from the rows padded to a multiple of TP) and a
later stage's routers get their slice of the padding mask (`sequence_parallel_slice`; megatron-core
splits it on the first stage only). Not built: virtual (interleaved) stages, pipeline parallelism with
megatron's DDP / distributed optimizer (the CUDA path: `check_pipeline_config` stops it at start, or
`from_hf` when the device is `auto`; only one GPU was lent, so it could not be run).
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from trainer.backends.actor import LossFn, MicroBatchOut
from trainer.components.batch import Batch


def pipeline_size() -> int:
    """The number of pipeline stages (1 before megatron's groups exist)."""
    from megatron.core import parallel_state as ps

    return ps.get_pipeline_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1


class _CudaOnCpu(TorchFunctionMode):
    """Tensor factories asked for a CUDA device get the CPU; `tensor.cuda()` returns the tensor."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def cpu_cuda_calls() -> contextlib.AbstractContextManager:
    """Inside: megatron-core's unconditional CUDA tensors made on the CPU (a CPU-only torch); else nothing."""
    return contextlib.nullcontext() if torch.cuda.is_available() else _CudaOnCpu()


# --------------------------------------------------------------------------- what is built

def check_pipeline_config(cfg: Any, loop: str, world: int) -> None:
    """ConfigError (one line) for `actor.megatron.pipeline_model_parallel_size > 1` settings not run: the
    single-process loop, megatron's optimizer asked for (CUDA), stages x TP (or x EP) that do not divide the
    trainer ranks."""
    from trainer.errors import ConfigError

    m = cfg.actor.megatron
    pp, tp, ep = m.pipeline_model_parallel_size, m.tensor_model_parallel_size, m.expert_model_parallel_size
    field = f"actor.megatron.pipeline_model_parallel_size={pp}"
    if loop == "colocated":
        raise ConfigError(f"{field}: the single-process loop has one rank (fix: trainer.use_ray=true with "
                          f"trainer.n_gpus_per_node workers, or set it to 1)")
    if m.optimizer == "megatron" or (m.optimizer == "auto" and cfg.trainer.device == "cuda"):  # else at build
        raise ConfigError(f"{field}: pipeline parallelism is not built with megatron's DDP and distributed optimizer "
                          f"(actor.megatron.optimizer={m.optimizer} on CUDA; untested) (fix: "
                          f"actor.megatron.optimizer=torch, or pipeline_model_parallel_size=1)")
    where = "async.train_gpus" if loop == "fully_async" else "trainer.n_gpus_per_node * trainer.nnodes"
    for other, size in (("tensor_model_parallel_size", tp), ("expert_model_parallel_size", ep)):
        if world % (pp * size):
            raise ConfigError(f"{field}: {pp} stages x {other}={size} = {pp * size} ranks does not divide the {world} "
                              f"trainer ranks ({where}) (fix: sizes whose product divides {world})")


def check_pipeline_model(cfg: Any, hf_config: Any, megatron_optimizer: bool) -> None:
    """ConfigError (one line) when the model's layers do not split evenly over the stages, or the run would use
    megatron's DDP / distributed optimizer (CUDA), which this backend does not run with pipeline parallelism."""
    from trainer.errors import ConfigError

    pp = cfg.megatron.pipeline_model_parallel_size
    field = f"actor.megatron.pipeline_model_parallel_size={pp}"
    layers = int(hf_config.num_hidden_layers)
    if layers < pp or layers % pp:
        raise ConfigError(f"{field}: the model's {layers} decoder layers do not split evenly over {pp} stages "
                          f"(fix: a divisor of {layers})")
    if megatron_optimizer:
        raise ConfigError(f"{field}: pipeline parallelism is not built with megatron's DDP and distributed optimizer "
                          f"(the CUDA path; untested) (fix: actor.megatron.optimizer=torch, or "
                          f"pipeline_model_parallel_size=1)")


# --------------------------------------------------------------------------- weights of a stage

_LAYER = re.compile(r"^((?:module\.)*decoder\.layers\.)(\d+)\.")


def layer_offset(gpt: torch.nn.Module) -> int:
    """Global index of this stage's first decoder layer (0 without pipeline parallelism)."""
    layers = gpt.decoder.layers
    return int(layers[0].layer_number) - 1 if len(layers) else 0


def global_layer_name(name: str, offset: int) -> str:
    """`decoder.layers.<local>.` -> `decoder.layers.<local + offset>.`: the name mbridge's tables map."""
    return _LAYER.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + offset}.", name)


def is_tied_copy(name: str, gpt: torch.nn.Module) -> bool:
    """The last stage's copy of a tied word embedding (its output layer): not exported, not in the norm."""
    return bool(gpt.share_embeddings_and_output_weights and not gpt.pre_process
                and name.endswith("output_layer.weight"))


def gather_stage_weights(items: list[tuple[str, torch.Tensor]], device: torch.device) -> list[tuple[str, torch.Tensor]]:
    """Every stage's `(HF name, tensor)` list, in stage order, on every rank of the pipeline group, on
    `device`: each stage broadcasts its names and shapes, then its tensors (a collective)."""
    from megatron.core import parallel_state as ps

    group = ps.get_pipeline_model_parallel_group()
    out: list[tuple[str, torch.Tensor]] = []
    for stage in range(dist.get_world_size(group)):
        src, mine = dist.get_global_rank(group, stage), stage == dist.get_rank(group)
        meta = [[(n, tuple(t.shape), t.dtype) for n, t in items] if mine else None]
        dist.broadcast_object_list(meta, src=src, group=group, device=device)
        for i, (name, shape, dtype) in enumerate(meta[0]):
            t = items[i][1].to(device).contiguous() if mine else torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(t, src=src, group=group)
            out.append((name, t))
    return out


# --------------------------------------------------------------------------- gradients

def reduce_tied_embedding_grad(gpt: torch.nn.Module) -> None:
    """Sum the tied word embedding's gradient over its copies (first and last stage; megatron's embedding
    group), as `finalize_model_grads` does; nothing when the embeddings are untied."""
    from megatron.core import parallel_state as ps

    if not gpt.share_embeddings_and_output_weights or not ps.is_rank_in_embedding_group():
        return
    w = gpt.shared_embedding_or_output_weight()
    if w is None:
        return
    if w.grad is None:
        w.grad = torch.zeros_like(w)
    dist.all_reduce(w.grad, group=ps.get_embedding_group())


def sum_over_pipeline(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over the pipeline group (in place; e.g. each stage's squared gradient norm)."""
    from megatron.core import parallel_state as ps

    dist.all_reduce(t, group=ps.get_pipeline_model_parallel_group())
    return t


def sequence_parallel_slice(padding_mask: torch.Tensor) -> torch.Tensor:
    """This TP rank's slice `[N, T / TP]` of a padding mask `[N, T]` under sequence parallelism, what the first
    stage's GPTModel makes of it (`scatter_to_sequence_parallel_region` over the sequence); megatron-core 0.16 and
    0.19 pass a later stage's mask on whole, which its routers cannot match with their `T / TP` tokens."""
    from megatron.core.tensor_parallel import scatter_to_sequence_parallel_region

    return scatter_to_sequence_parallel_region(padding_mask.transpose(0, 1).contiguous()).transpose(0, 1).contiguous()


# --------------------------------------------------------------------------- the schedule

class _AuxScaleAtBackward(torch.autograd.Function):
    """Identity whose backward sets megatron's MoE aux-loss gradient scale to this micro-batch's token share
    before the rest of the micro-batch's backward runs (module docstring)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, weight: float) -> torch.Tensor:
        ctx.weight = weight
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        from trainer.backends.megatron.moe import set_aux_loss_scale

        set_aux_loss_scale(ctx.weight, grad.device)
        return grad, None


def _equal_shape_runs(micros: list[Batch]) -> Iterator[list[Batch]]:
    """Consecutive micro-batches of one `input_ids` shape (one schedule call each)."""
    run: list[Batch] = []
    for m in micros:
        if run and m.input_ids.shape != run[0].input_ids.shape:
            yield run
            run = []
        run.append(m)
    if run:
        yield run


def _schedule(actor: Any, run: list[Batch], step: Any, *, forward_only: bool) -> None:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    rows, t = run[0].input_ids.shape
    if actor.bridge.config.sequence_parallel:  # the rows padded to a multiple of TP (`_decoder_forward`)
        t += -t % actor.bridge.mpu.tp_size
    with cpu_cuda_calls():
        get_forward_backward_func()(forward_step_func=step, data_iterator=iter(run), model=[actor.model],
                                    num_microbatches=len(run), seq_length=t, micro_batch_size=rows,
                                    forward_only=forward_only)


def _layer_share(actor: Any) -> float:
    """This stage's share of the model's decoder layers."""
    return len(actor.gpt.decoder.layers) / actor.gpt.config.num_layers


def _undo_schedule_mean(num_microbatches: int) -> Any:
    """The schedule's loss function: the loss times the micro-batch count, which the schedule divides by
    (module docstring), so each micro-batch's gradient is the plain loop's."""
    return lambda loss: (loss * num_microbatches, {})


def forward_backward(actor: Any, micros: list[Batch], loss_fn: LossFn) -> list[MicroBatchOut]:
    """`Actor.forward_backward` under pipeline parallelism: the same results on every rank of the pipeline
    group (module docstring)."""
    from megatron.core import parallel_state as ps

    last = ps.is_pipeline_last_stage()
    share = _layer_share(actor)
    outs: list[MicroBatchOut] = []
    for run in _equal_shape_runs([m.to(actor.device) for m in micros]):
        m_count = len(run)

        def step(data_iterator: Iterator[Batch], model: Any, m_count: int = m_count):
            micro = next(data_iterator)
            w = float(micro.response_mask.sum()) / actor._mini_batch_tokens
            if actor.router is None:
                hidden, routed = actor._decoder_forward(micro), None
            else:
                with actor.router.capture():
                    hidden = actor._decoder_forward(micro)
                routed = actor.router.pop()  # this stage's layers only
            _, moe_stats, expert_counts = actor.router_terms(routed, w)
            stats = {k: v * share for k, v in moe_stats.items()}
            out: torch.Tensor = hidden
            old = None
            if last:
                logp, entropy = actor._head_logprobs(micro, hidden, with_entropy=True)
                out, result = loss_fn(micro, logp, entropy, None)  # the router's part is this stage's, above
                stats.update(result.stats)
                old = result.old_logprobs
            outs.append(MicroBatchOut(stats, expert_counts, old))
            if actor.router is not None:
                out = _AuxScaleAtBackward.apply(out, w)
            if not last:
                return out, None
            return out, _undo_schedule_mean(m_count)

        _schedule(actor, run, step, forward_only=False)
    return _merge_stages(outs)


def _merge_stages(outs: list[MicroBatchOut]) -> list[MicroBatchOut]:
    """Each micro-batch's statistics summed over the stages, its top-k counts concatenated in layer order,
    its old log-probs from the last stage: the same list on every rank of the pipeline group."""
    from megatron.core import parallel_state as ps

    group = ps.get_pipeline_model_parallel_group()
    stages: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(stages, outs, group=group)
    merged = []
    for per_stage in zip(*stages):
        stats: dict[str, float] = defaultdict(float)
        for o in per_stage:
            for k, v in o.stats.items():
                stats[k] += v
        counts = [o.expert_counts for o in per_stage if o.expert_counts is not None]
        old = next((o.old_logprobs for o in per_stage if o.old_logprobs is not None), None)
        merged.append(MicroBatchOut(dict(stats), torch.cat(counts) if counts else None, old))
    return merged


@torch.no_grad()
def logprobs(actor: Any, micros: list[Batch]) -> torch.Tensor:
    """`compute_logprobs` under pipeline parallelism: the forward-only schedule, the last stage's log-probs
    `[N, R]` broadcast over the pipeline group."""
    from megatron.core import parallel_state as ps

    last = ps.is_pipeline_last_stage()
    got: list[torch.Tensor] = []

    def step(data_iterator: Iterator[Batch], model: Any):
        micro = next(data_iterator)
        hidden = actor._decoder_forward(micro)
        if not last:
            return hidden, None
        logp, _ = actor._head_logprobs(micro, hidden)
        got.append(logp.float())
        return logp, lambda _: (torch.zeros((), device=logp.device), {})  # nothing to reduce

    for run in _equal_shape_runs([m.to(actor.device) for m in micros]):
        _schedule(actor, run, step, forward_only=True)
    n, r = sum(len(m) for m in micros), micros[0].responses.shape[1]
    out = torch.cat(got) if last else torch.empty(n, r, dtype=torch.float32, device=actor.device)
    dist.broadcast(out, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group())
    return out.cpu()
