"""Drive trainer runs for one suite x profile and write its run folder; shared by the CLI and pytest.

    from rlbench.run.runner import run_profile
    outcome = run_profile(suite, "cpu", out="runs", arch="cpu", seeds=1)
    outcome.verdict            # "pass" | "fail" | "error" | "skip"
    outcome.report             # runs/<suite>/cpu/report.html

For every seed and every mode the profile runs (colocated before fully_async), the suite's
trainer config is resolved (`Suite.resolve_trainer_config`), the `--set key=value` overrides are
applied, and `trainer.api.train` writes its log into

    <out>/<suite_id>/<profile>/<mode>/metrics.jsonl            (one seed)
    <out>/<suite_id>/<profile>/<mode>/seed<k>/metrics.jsonl    (several seeds)

Then the run folder `<out>/<suite_id>/<profile>/` gets `config.<mode>.yaml` (the resolved config
of the first seed; each training folder keeps its own `config.yaml`), `env.json` (the machine),
`checks.json` (every check result, with its seed) and `report.html` (one section per seed).

Runs start fresh (`trainer.resume: false`) unless `--set trainer.resume=true` is given: a folder
left by an earlier run with other settings must not be continued silently. The profile's `env`
(e.g. AITER flags) is set in the process environment for the duration of its runs.

Arch: `--arch cpu` is accepted on any machine and means "use the CPU only" (profiles that need
GPUs are then skipped); any other `--arch` must equal the detected one (`arch_mismatch`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as _dt
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from rlbench.checks.evaluate import evaluate, profile_engines
from rlbench.checks.history import HistorySource
from rlbench.checks.results import CheckResult
from rlbench.ingest.load import load_metrics
from rlbench.report.html import ReportSection, overall_verdict, render_report, render_session_report
from rlbench.report.summary import counts_text
from rlbench.run import isolated as run_isolated
from rlbench.run.isolated import MEMORY_FILE, require_free_memory
from rlbench.run.memory import machine_memory_gb
from rlbench.run.progress import MetricsTail
from rlbench.store.target import StoreLocation, store_device
from rlbench.suites.suite import Suite, load_suite, profile_unmet_requirements
from trainer.config import apply_overrides
from trainer.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# What to run on, by arch, for the message of a contradicting --arch.
ARCH_DEVICES = {"gfx942": "an MI300X/MI325X", "gfx950": "an MI350X/MI355X", "sm_90": "an H100/H200/H20",
                "sm_80": "an A100"}

Status = Callable[[str], None]


def stderr_status(line: str) -> None:
    """One status line per phase, on stderr beside the trainer's tqdm bar."""
    print(f"[rlbench] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- suites and machine
def find_suite(name: str, suites_dir: str | Path | None = None) -> Suite:
    """A suite by path (`suites/x.yaml`) or by id (`x`, looked up in ./suites then the project's)."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return load_suite(p)
    dirs = [Path(suites_dir)] if suites_dir else [Path.cwd() / "suites", PROJECT_ROOT / "suites"]
    for d in dirs:
        cand = d / f"{name}.yaml"
        if cand.is_file():
            return load_suite(cand)
    known = sorted({f.stem for d in dirs if d.is_dir() for f in d.glob("*.yaml")})
    raise ConfigError(f"suite {name!r}: no file {dirs[0] / (name + '.yaml')}; pass a suite path or one of: "
                      f"{', '.join(known) or '(no suites found)'}")


def installed_packages(versions: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in versions.items() if v}


def machine_info(arch: str | None = None, env: dict[str, Any] | None = None) -> dict[str, Any]:
    """`profile_unmet_requirements`' env_info for this machine, seen as `arch` (default: detected).

    `env`: a `trainer.platform.env.collect_env()` record (probed when None). With arch `cpu` the GPUs
    are ignored: that arch means "run on the CPU".
    """
    if env is None:
        from trainer.platform.env import collect_env

        env = collect_env()
    arch = arch or str(env.get("arch") or "cpu")
    return {
        "arch": arch,
        "device_name": "cpu" if arch == "cpu" else (env.get("device_name") or ""),
        "num_gpus": 0 if arch == "cpu" else int(env.get("num_gpus") or 0),
        "packages": installed_packages(env.get("versions") or {}),
        "memory_gb": machine_memory_gb()["total_gb"],
    }


def arch_mismatch(requested: str, detected: str, device_name: str | None = None) -> str | None:
    """One-line message when `--arch requested` contradicts the machine, else None."""
    if requested in ("cpu", detected):
        return None
    what = f"{detected} ({device_name})" if device_name and detected != "cpu" else detected
    if detected == "cpu":
        what = "cpu (no ROCm or CUDA GPU visible)"
    where = ARCH_DEVICES.get(requested, f"a {requested} GPU")
    return (f"--arch {requested} but this machine is {what}: run on {where}, or use --arch {detected}, "
            f"or `rlbench check` / `--rlbench-logs` to validate logs of a run made elsewhere")


def seed_list(suite: Suite, profile: str, num_seeds: int | None) -> list[int]:
    """The first `num_seeds` of the profile's seeds (continued 0, 1, ... past them); None: the first."""
    seeds = list(suite.profile(profile).seeds)
    n = 1 if num_seeds is None else num_seeds
    if n < 1:
        raise ConfigError(f"--seeds {n}: give at least 1 seed")
    extra = (s for s in range(10_000) if s not in seeds)
    while len(seeds) < n:
        seeds.append(next(extra))
    return seeds[:n]


# ---------------------------------------------------------------------------- training
@dataclass
class ProfileRuns:
    """Where the metrics of each (seed, mode) were written."""

    folder: Path  # <out>/<suite_id>/<profile>
    seeds: list[int]
    modes: list[str]
    metrics: dict[int, dict[str, Path]] = field(default_factory=dict)  # seed -> mode -> metrics.jsonl
    memory: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)  # seed -> mode -> memory record

    def frames(self, seed: int) -> dict[str, pd.DataFrame]:
        return {m: load_metrics(p).frame for m, p in self.metrics[seed].items()}


def train_dir(folder: Path, mode: str, seed: int, several_seeds: bool) -> Path:
    return folder / mode / f"seed{seed}" if several_seeds else folder / mode


def resolved_config(suite: Suite, profile: str, mode: str, seed: int, out_dir: Path,
                    sets: list[str] | None = None) -> dict[str, Any]:
    """The trainer config dict of one run: suite resolution, then the runner's settings, then `sets`."""
    cfg = suite.resolve_trainer_config(profile, mode, seed=seed)
    tr = cfg.setdefault("trainer", {})
    tr["out_dir"] = str(out_dir)
    tr["resume"] = False
    return apply_overrides(cfg, list(sets or []))


@contextlib.contextmanager
def profile_env(env: dict[str, str]) -> Iterator[None]:
    """Set the profile's environment variables for the duration of its runs, then restore."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def train_profile(suite: Suite, profile: str, out: str | Path, *, seeds: list[int],
                  modes: list[str] | None = None, sets: list[str] | None = None,
                  status: Status = stderr_status, progress_every_s: float = 10.0) -> ProfileRuns:
    """Train every (seed, mode) of a profile; returns where each metrics.jsonl is.

    Each run trains in a process of its own (rlbench/run/isolated.py), so this process keeps no memory
    of it; its peak memory over its processes is recorded in `<run>/memory.json`. A run that cannot
    get the profile's memory budget (`requires.memory_gb`) when it starts stops with one line first.
    While a run trains, `status` gets a progress line per new step (step k/N, s/step, score), at
    most one per `progress_every_s` seconds plus the last step (rlbench/run/progress.py).
    """
    from trainer.config import load_config

    prof = suite.profile(profile)
    modes = list(modes or prof.modes)
    for m in modes:
        if m not in prof.modes:
            raise ConfigError(f"--mode {m}: profile {profile} of {suite.id} runs {', '.join(prof.modes)}; "
                              "pick one of those")
    folder = Path(out) / suite.id / profile
    folder.mkdir(parents=True, exist_ok=True)
    runs = ProfileRuns(folder=folder, seeds=seeds, modes=modes)
    several = len(seeds) > 1
    with profile_env(prof.env):
        for seed in seeds:
            runs.metrics[seed], runs.memory[seed] = {}, {}
            for mode in modes:
                tdir = train_dir(folder, mode, seed, several)
                cfg = load_config(resolved_config(suite, profile, mode, seed, tdir, sets))
                if seed == seeds[0]:
                    (folder / f"config.{mode}.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
                label = f"{suite.id} [{profile}] {mode} seed {seed}"
                require_free_memory(prof.requires.memory_gb, label)
                status(f"{label}: training {cfg.trainer.total_steps} steps -> {tdir}")
                with MetricsTail(Path(cfg.trainer.out_dir) / "metrics.jsonl", total=cfg.trainer.total_steps,
                                 label=label, status=status, every_s=progress_every_s):
                    done = run_isolated.train_isolated(cfg)
                runs.metrics[seed][mode], runs.memory[seed][mode] = done.metrics, done.memory
                status(f"{label}: peak memory {memory_line(done.memory)}")
    return runs


# ---------------------------------------------------------------------------- checks and report
@dataclass
class Outcome:
    """Results of one suite x profile (all seeds) and where its files went."""

    suite: Suite
    profile: str
    folder: Path
    results: list[CheckResult]  # every seed's results, in seed order
    seed_of: list[int]  # the seed of each result (same length as results)
    by_ref: dict[int, list[list[CheckResult]]] = field(default_factory=dict)  # seed -> per reference
    report: Path | None = None
    sections: list[ReportSection] = field(default_factory=list)  # report sections, one per seed
    arch: str = ""  # the arch the checks were evaluated as
    device: str = ""  # the board (store_device: "cpu" for a CPU run), as the results store keys it

    @property
    def verdict(self) -> str:
        return overall_verdict(self.results)

    def applicable(self) -> tuple[list[CheckResult], list[int]]:
        """(results, their seeds) of the references that list this profile (others are only skips)."""
        keep = [i for i, ref in enumerate(self.suite.references) if self.profile in ref.profiles]
        pairs = [(r, seed) for seed, per_ref in self.by_ref.items() for i in keep for r in per_ref[i]]
        return [r for r, _ in pairs], [s for _, s in pairs]


def suite_meta(suite: Suite, profile: str, steps: int | None = None) -> dict[str, Any]:
    """The report's suite table; `steps` (default: the profile's) is what the runs' coverage is checked against."""
    return {"suite": suite.id, "title": suite.title, "profile": profile, "file": str(suite.path or ""),
            "steps": steps if steps is not None else suite.profile(profile).steps,
            "profile_steps": suite.profile(profile).steps,
            "published_on": suite.published_on.model_dump(),
            "sources": [f"{s.doc}: {s.where}" for s in suite.source]}


def latest_samples(run_dirs: dict[str, Path]) -> dict[str, list[dict[str, Any]]]:
    """Each run's validation samples (``samples/step_K.jsonl``, trainer/components/val_samples.py) of its last sampled step."""
    from trainer.components.val_samples import read_samples

    out = {}
    for mode, d in run_dirs.items():
        by_step = read_samples(d)
        if by_step:
            out[mode] = by_step[max(by_step)]
    return out


def memory_line(record: dict[str, Any]) -> str:
    """`12.9 GB (TrainerWorker 9.6, ...)`: a run's peak summed over its processes, the largest of them."""
    parts = ", ".join(f"{k} {v:.1f}" for k, v in list(record.get("peak_by_process", {}).items())[:3])
    return f"{record['peak_rss_gb']:.1f} GB ({parts})"


def run_env_extras(run_dirs: dict[str, Path]) -> dict[str, Any]:
    """What a run's own files add to the machine's environment: the tool sandbox's layers in force, and
    the run's peak memory (memory.json, written by rlbench/run/isolated.py)."""
    extras: dict[str, Any] = {}
    for mode, d in run_dirs.items():
        try:
            extras[f"memory ({mode})"] = json.loads((d / MEMORY_FILE).read_text())
        except (OSError, ValueError):
            pass
        try:
            doc = json.loads((d / "env.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and "sandbox" in doc:
            extras[f"sandbox ({mode})"] = doc["sandbox"]
    return extras


def evaluate_runs(suite: Suite, profile: str, runs_by_seed: dict[int, dict[str, pd.DataFrame]], *,
                  arch: str, device_name: str, folder: Path, env: dict[str, Any],
                  provenance: dict[str, Any], report: Path | None = None,
                  golden_dir: str | Path | None = None, ran_modes: list[str] | None = None,
                  status: Status = stderr_status, store: StoreLocation | None = None) -> Outcome:
    """Evaluate the suite's checks on each seed's runs; write checks.json, env.json and report.html.

    `ran_modes`: when only some of the profile's modes were run on purpose (`--mode`), checks
    that read another mode are skipped instead of reported as errors. The rollout engine of each
    mode (for checks scoped to engines) is the profile's after `provenance["overrides"]` (the
    runs' `--set`s), or for logs made elsewhere (`provenance["logs"]`) the `rollout.engine` of the
    `config.yaml` the trainer wrote beside a log, where there is one. `store`: the results store
    the references with `history` read their trusted runs from (rlbench/checks/history.py).
    """
    engines = {**profile_engines(suite, profile, provenance.get("overrides")),
               **logged_engines(provenance.get("logs") or {})}
    folder.mkdir(parents=True, exist_ok=True)
    results: list[CheckResult] = []
    seed_of: list[int] = []
    sections: list[ReportSection] = []
    by_ref: dict[int, list[list[CheckResult]]] = {}
    history = HistorySource(store=store, suite=suite.id, profile=profile, arch=arch,
                            device=store_device(arch, device_name), host=str(env.get("hostname") or ""))
    for seed, runs in runs_by_seed.items():
        # One reference at a time, so each result is known to come from its reference (pytest items).
        by_ref[seed] = [evaluate(suite.model_copy(update={"references": [ref]}), profile, runs, arch=arch,
                                 device_name=device_name, golden_dir=golden_dir, engines=engines, history=history)
                        for ref in suite.references]
        if ran_modes is not None:
            by_ref[seed] = [[_unrun_to_skip(r, ran_modes) for r in rs] for rs in by_ref[seed]]
        res = [r for rs in by_ref[seed] for r in rs]
        results += res
        seed_of += [seed] * len(res)
        title = f"{suite.title} [{profile}]" + (f" seed {seed}" if len(runs_by_seed) > 1 else "")
        dirs = {m: train_dir(folder, m, seed, len(runs_by_seed) > 1) for m in runs}
        sections.append(ReportSection(title=title, runs=runs, results=res, env={**env, **run_env_extras(dirs)},
                                      provenance={**provenance, "seed": seed},
                                      suite_meta=suite_meta(suite, profile, _steps_set(provenance)),
                                      samples=latest_samples(dirs)))
    if store is not None:  # each check's value over the store's earlier runs (this run is appended after)
        from rlbench.report.trends import load_trends

        for sec in sections:
            sec.trends = load_trends(store, suite=suite.id, profile=profile, mode="+".join(sec.runs),
                                     device=store_device(arch, device_name))
    outcome = Outcome(suite, profile, folder, results, seed_of, by_ref, arch=arch,
                      device=store_device(arch, device_name))
    doc = {"suite": suite.id, "profile": profile, "arch": arch, "device": device_name,
           "verdict": outcome.verdict, "provenance": provenance,
           "results": [{**r.to_dict(), "seed": s} for r, s in zip(results, seed_of)]}
    (folder / "checks.json").write_text(json.dumps(doc, indent=2, default=str))
    (folder / "env.json").write_text(json.dumps(env, indent=2, default=str))
    report = Path(report) if report is not None else folder / "report.html"
    if len(sections) == 1:
        s = sections[0]
        render_report(report, title=s.title, runs=s.runs, results=s.results, env=s.env,
                      provenance=s.provenance, suite_meta=s.suite_meta, samples=s.samples, trends=s.trends)
    else:
        render_session_report(report, sections, title=f"{suite.title} [{profile}]")
    outcome.report = report
    outcome.sections = sections
    status(f"{suite.id} [{profile}]: {outcome.verdict.upper()}: {counts_text(results)} -> {report}")
    return outcome


# How much the driver (pytest, `rlbench run`) may grow over one profile: its runs train in processes of
# their own, so what is left is the first import of the report's libraries and the checks' frames. A run
# made in-process left ~9.6 GB (a colocated MoE); a leak of one SmolLM2 copy is ~0.5 GB.
DRIVER_GROWTH_BOUND_GB = 0.5
_MEMORY_SOURCE = "rlbench: measured (rlbench/run/memory.py: RSS summed over the run's processes)"


def peak_check_id(suite: Suite, profile: str, mode: str) -> str:
    budget = suite.profile(profile).requires.memory_gb
    return f"memory/peak_rss_gb<={budget:g}" + (f"[{mode}]" if len(suite.profile(profile).modes) > 1 else "")


DRIVER_CHECK_ID = f"memory/driver_rss_growth_gb<={DRIVER_GROWTH_BOUND_GB:g}"


def memory_checks_and_modes(suite: Suite, profile: str) -> list[tuple[str, set[str]]]:
    """(id, the modes it reads) of each result `memory_checks` gives (the pytest items of a profile that trains
    here): each mode's peak, and the driver's growth over whatever the profile ran."""
    peaks = ([(peak_check_id(suite, profile, m), {m}) for m in suite.profile(profile).modes]
             if suite.profile(profile).requires.memory_gb else [])
    return [*peaks, (DRIVER_CHECK_ID, set())]


def memory_check_ids(suite: Suite, profile: str) -> list[str]:
    """The ids `memory_checks` gives (the pytest items of a profile that trains here)."""
    return [cid for cid, _ in memory_checks_and_modes(suite, profile)]


def memory_checks(suite: Suite, profile: str, memory: dict[str, dict[str, Any]],
                  driver_gb: tuple[float, float]) -> list[CheckResult]:
    """The profile's memory items: each mode's peak against `requires.memory_gb` (when the profile states
    one), and the driver's growth over the whole profile (`driver_gb` = before, after) against
    `DRIVER_GROWTH_BOUND_GB`. A mode that did not run (no record) is `not_evaluated`, never a pass."""
    out: list[CheckResult] = []
    budget = suite.profile(profile).requires.memory_gb
    modes = suite.profile(profile).modes
    if budget:
        for mode in modes:
            cid = peak_check_id(suite, profile, mode)
            rec = memory.get(mode)
            peak = None if rec is None else float(rec["peak_rss_gb"])
            verdict = "not_evaluated" if peak is None else ("pass" if peak <= budget else "fail")
            msg = (f"{cid}: NOT EVALUATED (mode {mode} has no memory record)" if peak is None else
                   f"{cid}: {verdict.upper()}: peak {memory_line(rec)} vs the profile's budget {budget:g} GB "
                   f"(requires.memory_gb)")
            out.append(CheckResult(check_id=cid, verdict=verdict, metric="memory/peak_rss_gb", statistic="max",
                                   expected=f"<= {budget:g} GB", actual=peak, source=_MEMORY_SOURCE,
                                   why="the profile must fit its budget, with headroom, on the machine it names",
                                   message=msg, scope="device", run=mode if len(modes) > 1 else ""))
    before, after = driver_gb
    growth = after - before
    cid = DRIVER_CHECK_ID
    verdict = "pass" if growth <= DRIVER_GROWTH_BOUND_GB else "fail"
    out.append(CheckResult(
        check_id=cid, verdict=verdict, metric="memory/driver_rss_growth_gb", statistic="after - before",
        expected=f"<= {DRIVER_GROWTH_BOUND_GB:g} GB", actual=round(growth, 3), source=_MEMORY_SOURCE,
        why="each run trains in a process of its own; the driver must leave the profile as it found it",
        message=(f"{cid}: {verdict.upper()}: the driver's resident memory went {before:.2f} -> {after:.2f} GB "
                 f"over {suite.id} [{profile}] ({growth:+.2f} GB)"), scope="device"))
    return out


def logged_engines(logs: dict[str, Any]) -> dict[str, str]:
    """mode -> rollout.engine read from the trainer's `config.yaml` beside each log (modes without one: none)."""
    out = {}
    for mode, path in logs.items():
        cfg_path = Path(str(path)).parent / "config.yaml"
        try:
            cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.is_file() else None
        except (OSError, yaml.YAMLError):
            continue
        engine = ((cfg or {}).get("rollout") or {}).get("engine") if isinstance(cfg, dict) else None
        if isinstance(engine, str):
            out[mode] = engine
    return out


def _steps_set(provenance: dict[str, Any]) -> int | None:
    """`trainer.total_steps` from the run's `--set` overrides, when one set it."""
    for item in reversed(provenance.get("overrides") or []):
        key, _, value = str(item).partition("=")
        if key.strip() == "trainer.total_steps" and value.strip().isdigit():
            return int(value)
    return None


def _unrun_to_skip(r: CheckResult, ran_modes: list[str]) -> CheckResult:
    missing = [m for m in r.run.split("/") if m and m not in ran_modes]
    if r.verdict != "error" or not missing:
        return r
    return dataclasses.replace(r, verdict="skip", message=f"{r.check_id}: SKIP (mode {missing[0]} was not run; "
                                                          f"this run selected {', '.join(ran_modes)})")


def provenance(suite: Suite, profile: str, seeds: list[int], env: dict[str, Any],
               sets: list[str] | None = None) -> dict[str, Any]:
    git = env.get("git") or {}
    return {"suite_file": str(suite.path or suite.id), "profile": profile, "seeds": seeds,
            "overrides": list(sets or []), "machine": env.get("hostname"), "commit": git.get("commit"),
            "dirty": git.get("dirty"), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}


def run_profile(suite: Suite, profile: str, *, out: str | Path, arch: str, seeds: int | None = None,
                modes: list[str] | None = None, sets: list[str] | None = None,
                env: dict[str, Any] | None = None, status: Status = stderr_status,
                store: StoreLocation | None = None) -> Outcome:
    """Train the profile (see module docstring), evaluate its checks (history references against
    `store`), write the run folder."""
    if env is None:
        from trainer.platform.env import collect_env

        env = collect_env()
    env = {**copy.deepcopy(env), "arch": arch}
    info = machine_info(arch, env)
    unmet = profile_unmet_requirements(suite, profile, info)
    if unmet:
        raise ConfigError(f"{suite.id} profile {profile} cannot run here: {'; '.join(unmet)}")
    seed_ids = seed_list(suite, profile, seeds)
    runs = train_profile(suite, profile, out, seeds=seed_ids, modes=modes, sets=sets, status=status)
    status(f"{suite.id} [{profile}]: evaluating checks")
    frames = {s: runs.frames(s) for s in seed_ids}
    return evaluate_runs(suite, profile, frames, arch=arch, device_name=info["device_name"], folder=runs.folder,
                         env=env, provenance=provenance(suite, profile, seed_ids, env, sets),
                          ran_modes=runs.modes, status=status, store=store)
