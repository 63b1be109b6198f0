"""`RolloutWorker`: the fully-async rollouter, a Ray actor streaming scored sample groups into a queue.

A background thread loops: take `groups_per_call` prompts, sample `rollout.n` responses each
(one `generate` call), score every group whose responses all finished, and append it to a bounded
FIFO queue tagged with the policy version it started under. The trainer side takes groups with
`get_groups(k)`. Semantics follow verl's fully_async_policy:

- Staleness bound. Per weight version (the window between two syncs) the rollouter starts at
  most `max_required = required * (1 + staleness_threshold) * trigger_parameter_sync_step`
  groups, where `required = require_batches * ppo_mini_batch_size` groups feed one trainer step.
  At a sync the window's count restarts at the groups carried over (queued + in flight), as
  verl's `staleness_samples` does. The trainer takes `required * trigger` groups per window, so
  at most `staleness_threshold * required * trigger` groups from older versions are ever waiting
  at a sync: the "stale groups per window" that the test bounds. (Counts here are in prompt
  groups; verl counts samples the same way, `n` trajectories each.)
- Partial rollout. With `partial_rollout`, `begin_sync` interrupts the running `generate` at its
  next decode step (`generate(should_stop=...)`: the `hf` and `static` engines' host decode loop,
  trainer/rollout/base.py, or vLLM's / SGLang's abort of their running requests);
  after the new weights land the unfinished responses continue under them
  (`continue_generation`). Tokens sampled before the sync keep the log-probs and the policy
  version of the weights that sampled them (`_Group.versions`), so `rollout_logprobs` is always
  the behaviour policy of each token. Without it, a sync waits for the running call to finish.
  With `agent.enable` the engine is the tool loop (trainer/agent/loop.py), interrupted the same
  way: a trajectory stops mid-segment or between turns (tool calls already running finish first),
  and resumes from its tokens, mask and turn counts (`_Group.masks`, `_Group.turns`).
- Each response records the version it started and ended under; `max_partial_span` and
  `partial_ratio` come from those (verl's `fully_async/partial/*`).

Checkpoints (`checkpoint_state` / `load_checkpoint_state`, called while the loop is parked at a
sync, so the weights equal the trainer's): the prompt sampler's position, the engine's sampling
generator, the policy version and the generation counters. Groups waiting in the queue or
interrupted in flight are not saved: on resume they are gone, and their prompts are not drawn
again (the sampler is past them). verl's fully-async rollouter does the same (its
`save_checkpoint` keeps only the dataloader state and says in-flight samples are lost).

Weights arrive over the bucketed broadcast group (`init_sync_group` / `receive_weights`,
trainer/rollout/weight_sync.py) in the order and dtypes of `weight_plan()`: the engine's
parameters for the built-in engines, the HF checkpoint names for vLLM (whose worker fuses them).

Several replicas (`async.rollout_gpus = M`): M of these workers, replica `i` of `M`, each with
its own engine, its own shard of the training prompts (`rows[i::M]`, shuffled with
`data.seed + i`), its own sampling seed (`trainer.seed + 1000 * i`) and its own share of
`max_required` (the shares sum to it, so the staleness bound above holds for the run as a whole).
Each finished group is stamped with the time it was queued (`done_t`); the driver takes the
oldest groups over all the replicas' queues (`queued_times`, then `get_groups` on each), one FIFO
as verl's single message queue. Every replica is a receiver of the same weight broadcast (ranks
1..M of the sync group), and after a sync `weight_fingerprint()` lets the driver check that they
all hold the same weights.

Images (a vision-language `model.path`): the prompt rows carry their pixel values and image
grid (`multi_modal_inputs`) and decoded images; `image_inputs` hands them to `generate` as
`trainer.modes.steps.generate` does, and each scored group's batch carries `multi_modal_inputs` in its
meta to the trainer worker's log-prob forward. With `actor.freeze_vision_tower` the weight plan
leaves the tower out, as the trainer's `named_weights` does. No partial rollout with images
(`trainer.models.vlm.check_multimodal_support`).

Departures: `groups_per_call` prompts per generate call (verl streams single prompts to a server).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.components.batch import Batch, batch_from_rollout, concat_batches
from trainer.config import TrainerConfig
from trainer.errors import ConfigError, RLBenchError
from trainer.rollout.base import Rollout


@dataclass
class _Group:
    item: dict[str, Any]  # the prompt row (prompt_ids, data_source, ground_truth, extra_info)
    start_version: int
    ids: list[list[int]] = field(default_factory=list)  # [n] response tokens so far
    logps: list[list[float]] = field(default_factory=list)  # [n] log-prob of each token, at sampling time
    versions: list[list[int]] = field(default_factory=list)  # [n] policy version that sampled each token
    finish: list[str] = field(default_factory=list)  # [n] "stop" | "length" | "abort"
    end_version: list[int] = field(default_factory=list)  # [n] version when the response finished
    interrupted: bool = False
    masks: list[list[int]] = field(default_factory=list)  # [n] multi-turn: 0 on tool-observation tokens
    turns: list[dict[str, Any]] = field(default_factory=list)  # [n] multi-turn: num_turns, tool_calls, ...
    done_t: float = 0.0  # time.time() when the scored group was queued (the driver's FIFO over replicas)

    def done(self) -> bool:
        return all(f != "abort" for f in self.finish)


class RolloutWorker:
    def __init__(self, cfg_dict: dict[str, Any], *, max_required_groups: int, groups_per_call: int,
                 replica: int = 0, num_replicas: int = 1, pace_s: float = 0.0):
        from trainer.data.dataset import PromptDataset
        from trainer.models.loading import load_model_and_tokenizer
        from trainer.models.specs import eos_token_ids
        from trainer.modes.steps import load_split
        from trainer.rollout.registry import build_engine

        self.cfg = cfg = TrainerConfig.model_validate(cfg_dict)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        self.device = torch.device("cuda", 0) if (cfg.trainer.device != "cpu" and torch.cuda.is_available()) \
            else torch.device("cpu")
        from trainer.agent.prompts import agent_rows

        train_rows, val_rows = agent_rows(cfg.agent, *load_split(cfg.data))  # tool-use prompts when agent.enable
        self.replica, self.num_replicas = replica, num_replicas
        train_rows = train_rows[replica::num_replicas]  # each replica samples its own shard of the prompts
        if not train_rows:
            raise ConfigError(f"async.rollout_gpus={num_replicas}: rollout replica {replica} gets no training "
                              f"prompts (fix: lower async.rollout_gpus, or use more training rows)")
        model, self.tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.trainer.seed)
        self.eos_ids = eos_token_ids(self.tokenizer, model)
        self.engine = build_engine(cfg, model, self.tokenizer, self.eos_ids, self.device)
        self.engine.generator.manual_seed(cfg.trainer.seed + 1000 * replica)  # replicas sample differently
        self.base_engine = self.engine
        if cfg.agent.enable:  # multi-turn tool use: the agent loop (interruptible like the engine) with its sandbox
            from trainer.agent.loop import AgentRolloutEngine

            self.engine = AgentRolloutEngine(self.engine, self.tokenizer, cfg.agent,
                                             out_dir=cfg.trainer.out_dir if replica == 0 else None)
        del model
        if cfg.async_.partial_rollout and not callable(getattr(self.engine, "continue_generation", None)):
            raise ConfigError(f"async.partial_rollout: rollout.engine={cfg.rollout.engine} cannot interrupt and continue "
                              f"a generation (fix: set async.partial_rollout=false, or rollout.engine=hf, static, vllm "
                              f"or sglang)")
        from trainer.models.vlm import load_vision_processor

        processor = load_vision_processor(cfg.model.path, self.tokenizer)  # None for a text-only model
        self.train_data = PromptDataset(train_rows, self.tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                                        batch_size=groups_per_call, seed=cfg.data.seed + replica,
                                        shuffle=cfg.data.shuffle,
                                        filter_overlong_prompts=cfg.data.filter_overlong_prompts,
                                        source=cfg.data.train_files, processor=processor)
        self.val_data = None
        if val_rows:
            rows = val_rows[: cfg.data.num_val_samples] if cfg.data.num_val_samples is not None else val_rows
            self.val_data = PromptDataset(rows, self.tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                                          batch_size=cfg.data.val_batch_size or len(rows), seed=0, shuffle=False,
                                          filter_overlong_prompts=True, source=cfg.data.val_files or cfg.data.train_files,
                                          processor=processor)
        self.max_required = max_required_groups
        self.groups_per_call = min(groups_per_call, max_required_groups)
        self.partial_rollout = cfg.async_.partial_rollout

        self.version = 0
        self.cond = threading.Condition()
        self.queue: deque[tuple[_Group, Batch]] = deque()
        self.pending: list[_Group] = []  # interrupted groups waiting for new weights
        self.window_started = 0  # groups started (or carried over) under the current version
        self.max_window_started = 0
        self.running = False
        self.pause_requested = False
        self.interrupt = False
        self.parked = True
        self.pace_s = pace_s  # test-only decode pacing, read by the driver (trainer/components/faults.py)
        self.error: BaseException | None = None
        self.idle_s = 0.0
        self.window_t0 = time.perf_counter()
        self.num_generated_groups = 0
        self.num_generated_tokens = 0
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control (called by the driver)
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def weight_plan(self) -> list:
        from trainer.rollout.weight_sync import engine_weight_plan

        plan = getattr(self.engine, "weight_plan", None)
        plan = plan() if callable(plan) else engine_weight_plan(self.engine.model)
        if self.cfg.actor.freeze_vision_tower:  # the trainer sends no frozen tower (`Actor.named_weights`)
            from trainer.models.vlm import VISION_PREFIX

            plan = [s for s in plan if not s.name.startswith(VISION_PREFIX)]
        return plan

    def init_sync_group(self, master_addr: str, master_port: int, world_size: int, rank: int) -> None:
        from trainer.rollout.weight_sync import SyncGroup

        self.sync_group = SyncGroup(rank, world_size, master_addr, master_port, device=self.device)

    def start(self) -> None:
        with self.cond:
            self.running = True
            self.window_t0 = time.perf_counter()
        self.thread = threading.Thread(target=self._loop, name="rollouter", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.running = False
            self.interrupt = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=600)

    def begin_sync(self) -> None:
        """Park the generation loop: interrupt the running call (partial rollout) or let it finish."""
        with self.cond:
            self.pause_requested = True
            self.interrupt = self.partial_rollout
            self.cond.notify_all()
            while not self.parked and self.error is None:
                self.cond.wait(timeout=1.0)
            self._raise_error()

    def engine_facts(self) -> dict[str, Any]:
        """Which engine runs, and (static engine) graph-capture seconds and any capture failure."""
        from trainer.rollout.base import engine_facts

        return engine_facts(self.engine)

    def receive_weights(self, plan: list, bucket_mb: float) -> float:
        from trainer.rollout.weight_sync import receive

        t0 = time.perf_counter()
        self.engine.update_weights(receive(self.sync_group, plan, bucket_mb=bucket_mb))
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def weight_fingerprint(self) -> str:
        """A digest of the weights this replica's engine holds (call while parked, after a sync);
        equal digests on every replica mean every replica got the same weights."""
        from trainer.rollout.weight_sync import weight_fingerprint

        return weight_fingerprint(self.base_engine)

    def end_sync(self, version: int) -> dict[str, float]:
        """Adopt `version`, restart the staleness window at the carried-over groups, resume."""
        with self.cond:
            now = time.perf_counter()
            window = max(now - self.window_t0, 1e-9)
            stats = {"fully_async/rollouter/idle_ratio": min(self.idle_s / window, 1.0),
                     "fully_async/rollouter/window_started_groups": float(self.max_window_started),
                     "fully_async/rollouter/max_required_groups": float(self.max_required)}
            self.version = version
            self.engine.version = version
            carried = len(self.queue) + len(self.pending)
            self.window_started = carried
            self.max_window_started = carried
            stats["fully_async/count/staleness_samples"] = float(carried)
            self.idle_s, self.window_t0 = 0.0, now
            self.pause_requested = False
            self.interrupt = False
            self.cond.notify_all()
        return stats

    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed run needs from the rollouter (call between begin_sync and end_sync)."""
        with self.cond:
            return {"data": self.train_data.state_dict(), "engine_generator": self.engine.generator.get_state(),
                    "num_generated_groups": self.num_generated_groups,
                    "num_generated_tokens": self.num_generated_tokens,
                    "unsaved_groups": len(self.queue) + len(self.pending)}

    def load_checkpoint_state(self, state: dict[str, Any], version: int) -> None:
        """Restore `checkpoint_state` before `start`, after `receive_weights` brought the checkpointed
        weights, whose policy `version` the rollouter adopts."""
        with self.cond:
            if self.thread is not None:
                raise RuntimeError("load_checkpoint_state after start")
            self.train_data.load_state_dict(state["data"])
            self.engine.generator.set_state(state["engine_generator"])
            self.version = self.engine.version = version
            self.num_generated_groups = int(state["num_generated_groups"])
            self.num_generated_tokens = int(state["num_generated_tokens"])

    def queued_times(self, known: int, timeout_s: float) -> list[float]:
        """`done_t` of every queued group, once more than `known` are queued or after `timeout_s`."""
        with self.cond:
            deadline = time.perf_counter() + timeout_s
            while len(self.queue) <= known and self.error is None and time.perf_counter() < deadline:
                self.cond.wait(timeout=max(deadline - time.perf_counter(), 0.0))
            self._raise_error()
            return [g.done_t for g, _ in self.queue]

    def get_groups(self, k: int) -> tuple[list[tuple[dict, Batch]], dict[str, float]]:
        """Block until `k` groups are queued; return them (FIFO) with their version facts."""
        with self.cond:
            while len(self.queue) < k and self.error is None:
                self.cond.wait(timeout=1.0)
            self._raise_error()
            out = []
            for _ in range(k):
                g, batch = self.queue.popleft()
                out.append(({"start_version": g.start_version, "end_version": list(g.end_version),
                             "interrupted": g.interrupted, "token_versions": [list(v) for v in g.versions],
                             "replica": self.replica}, batch))
            self.cond.notify_all()
            return out, {"fully_async/monitor/queue/mq_queue_size": float(len(self.queue)),
                         "fully_async/count/total_generated_samples": float(self.num_generated_groups),
                         "fully_async/rollouter/num_generated_tokens": float(self.num_generated_tokens)}

    def validate(self) -> dict[str, float]:
        """Validation with the current weights (call between begin_sync and end_sync)."""
        from trainer.modes.steps import Components, validate

        c = Components(self.cfg, self.tokenizer, None, self.engine, None, None, None, self.val_data, self.device,
                       self.eos_ids)
        return validate(c)

    # ------------------------------------------------------------------ the generation loop
    def _raise_error(self) -> None:
        if isinstance(self.error, RLBenchError):  # e.g. the engine died: its one-line message, unchanged
            raise self.error
        if self.error is not None:
            raise RuntimeError(f"rollout loop failed: {self.error!r}") from self.error

    def _should_park(self) -> bool:
        if self.pause_requested:
            return True
        if self.pending:
            return False  # interrupted groups were already counted in this window
        full = len(self.queue) >= self.max_required
        return full or self.window_started + self.groups_per_call > self.max_required

    def _loop(self) -> None:
        from trainer.modes.steps import sampling_params

        params = sampling_params(self.cfg, self.eos_ids)
        try:
            while True:
                with self.cond:
                    t_idle = time.perf_counter()
                    while self.running and self._should_park():
                        self.parked = True
                        self.cond.notify_all()
                        self.cond.wait(timeout=1.0)
                    self.idle_s += time.perf_counter() - t_idle
                    self.parked = False
                    if not self.running:
                        return
                    if self.pending:
                        groups, self.pending = self.pending, []
                    else:
                        groups = [_Group(item, self.version) for item in self.train_data.next_batch()]
                        self.window_started += len(groups)
                        self.max_window_started = max(self.max_window_started, self.window_started)
                self._generate(groups, params)
        except BaseException as e:  # surfaced to the driver by get_groups / begin_sync
            with self.cond:
                self.error = e
                self.parked = True
                self.cond.notify_all()

    def _paced_stop(self) -> bool:
        time.sleep(self.pace_s)
        return self.interrupt

    def _generate(self, groups: list[_Group], params: Any) -> None:
        # engines that can be interrupted are, at a partial-rollout sync and at shutdown (`stop`)
        stop = (lambda: self.interrupt) if callable(getattr(self.engine, "continue_generation", None)) else None
        if stop is not None and self.pace_s > 0:  # test-only pacing (trainer/components/faults.py)
            stop = self._paced_stop
        n = self.cfg.rollout.n
        if groups[0].ids:  # continuing interrupted groups: only their unfinished responses
            where = [(gi, j) for gi, g in enumerate(groups) for j in range(n) if g.finish[j] == "abort"]
            multi_turn = bool(groups[0].turns)  # tool-use trajectories resume from their mask and turn counts
            out = self.engine.continue_generation(
                [groups[gi].item["prompt_ids"] for gi, _ in where], [groups[gi].ids[j] for gi, j in where],
                [groups[gi].logps[j] for gi, j in where], params, should_stop=stop,
                partial_versions=[groups[gi].versions[j] for gi, j in where],
                partial_masks=[groups[gi].masks[j] for gi, j in where] if multi_turn else None,
                partial_turn_stats=[groups[gi].turns[j] for gi, j in where] if multi_turn else None)
        else:
            for g in groups:
                g.ids, g.logps, g.versions = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
                g.finish, g.end_version = ["abort"] * n, [g.start_version] * n
            where = [(gi, j) for gi in range(len(groups)) for j in range(n)]
            prompts = [g.item["prompt_ids"] for g in groups]
            kw = image_inputs(self.engine, [g.item for g in groups])  # {} for text prompts
            out = self.engine.generate(prompts, params, should_stop=stop, **kw) if stop is not None \
                else self.engine.generate(prompts, params, **kw)
        for row, (gi, j) in enumerate(where):
            g = groups[gi]
            self.num_generated_tokens += len(out.response_ids[row]) - len(g.ids[j])
            g.ids[j], g.logps[j], g.finish[j] = out.response_ids[row], out.response_logprobs[row], out.finish_reasons[row]
            g.versions[j] = out.token_versions[row] if out.token_versions else [self.version] * len(g.ids[j])
            g.end_version[j] = self.version
            if out.turn_stats:  # multi-turn: the mask and turn counts of the whole response so far
                g.masks = g.masks or [[] for _ in range(n)]
                g.turns = g.turns or [{} for _ in range(n)]
                g.masks[j], g.turns[j] = out.response_mask[row], out.turn_stats[row]
            if out.finish_reasons[row] == "abort":
                g.interrupted = True
        done = [g for g in groups if g.done()]
        scored = [(g, self._score(g)) for g in done]
        with self.cond:
            self.pending.extend(g for g in groups if not g.done())
            for g, _ in scored:
                g.done_t = time.time()
            self.queue.extend(scored)
            self.num_generated_groups += len(done)
            self.cond.notify_all()

    def _score(self, g: _Group) -> Batch:
        from trainer.modes.steps import score

        n = len(g.ids)
        rollout = Rollout(prompt_ids=[g.item["prompt_ids"]] * n, response_ids=g.ids, response_logprobs=g.logps,
                          finish_reasons=g.finish, group_index=[0] * n, policy_version=[g.start_version] * n,
                          response_mask=g.masks, turn_stats=g.turns)
        batch = batch_from_rollout(rollout, pad_token_id=self.tokenizer.pad_token_id,
                                   max_response_length=self.cfg.data.max_response_length)
        batch.meta = {k: [g.item[k]] * n for k in ("data_source", "ground_truth", "extra_info")}
        if "multi_modal_inputs" in g.item:  # the trainer's forward reads the prompt's images there
            batch.meta["multi_modal_inputs"] = [g.item["multi_modal_inputs"]] * n
        if g.turns:  # as trainer.modes.steps.generate does: turn counts in meta, num_turns for the ReTool reward
            from trainer.agent.trajectory import TURN_KEYS

            for key in TURN_KEYS:
                batch.meta[key] = [t.get(key, 0) for t in g.turns]
            batch.meta["extra_info"] = [{**(e or {}), "num_turns": t["num_turns"]}
                                        for e, t in zip(batch.meta["extra_info"], g.turns)]
        batch.meta["finish_reason"] = list(g.finish)
        batch.scores, acc = score(batch, self.tokenizer, self.cfg)
        batch.meta["acc"] = acc.tolist()
        from trainer.components.invariants import witness_group

        witness_group(batch, g.item, self.tokenizer, self.cfg, self.eos_ids)  # trainer/components/invariants.py
        return batch


def image_inputs(engine: Any, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The image keyword arguments of `engine.generate` for prompt `items` ({} when none has images), as
    `trainer.modes.steps.generate` passes them: `multi_modal_inputs`, and the decoded `images` for vLLM."""
    if not any("multi_modal_inputs" in it for it in items):
        return {}
    kw: dict[str, Any] = {"multi_modal_inputs": [it.get("multi_modal_inputs") for it in items]}
    if getattr(engine, "takes_images", False):
        kw["images"] = [it.get("images") for it in items]
    return kw


def merge_groups(groups: list[tuple[dict, Batch]], pad_token_id: int) -> Batch:
    """One training batch from queued groups (group_index made distinct per group)."""
    return concat_batches([b for _, b in groups], pad_token_id=pad_token_id)
