"""pytest plugin: every suite x profile x check of `suites/*.yaml` becomes a test item.

    pytest suites/ --arch cpu                                   # every profile this machine can run
    pytest suites/ --arch cpu --profile cpu -k dapo --rlbench-set trainer.total_steps=2
    pytest suites/ --arch gfx950 --profile full --rlbench-report parity.html
    pytest suites/ --arch gfx942 --profile full --rlbench-logs logs/  # check logs, train nothing

Loaded by `suites/conftest.py` (which imports these hooks), so a plain `pytest` of `tests/` never
sees it. Items are named `<suite_id>[<profile>]::<check id>`, e.g.
`verl_grpo_qwen3_8b_sglang_gfx950[cpu]::critic/score/mean:delta[5]>=0.05`, so `-k` selects by
suite, profile or metric. Only the references that list a profile become its items.

- One training run per suite x profile (every mode it runs, the profile's first seed), started
  lazily by the first item that needs it and shared by the profile's other items; its run
  folder is `<--rlbench-out>/<suite_id>/<profile>/` (see rlbench/run/runner.py). A status line per
  phase and a progress line per run (step k/N, s/step, score; rlbench/run/progress.py) go to the
  terminal (the trainer's own progress bar is captured by pytest; `-s` shows it).
- A profile's `slow_modes` are pytest's `slow` tier: the items reading their runs are marked `slow`,
  and a mode none of whose items is selected is not trained. `make test` runs `-m 'not slow'`
  (the cpu profiles' fast modes), `make test-suites-all` every mode.
- `--profile` (full | mini | cpu | cpu-vllm | cpu-vlm, comma-separated; default: all; cpu-vllm and cpu-vlm are optional,
  collected only from the suites that define it): a profile that this
  machine cannot run (GPU count, arch, packages, model/data paths) has every item skipped with
  the reason from `profile_unmet_requirements`. So the default runs exactly what can run here.
- `--arch` (default: detected) that contradicts the detected hardware stops the session at
  start (`pytest.UsageError`); `--arch cpu` is accepted anywhere and means "CPU only".
- `--rlbench-logs DIR` checks logs of runs made elsewhere instead of training: per suite and
  profile, `<DIR>/<suite_id>/<profile>/<mode>.jsonl` or `<mode>/metrics.jsonl` (so a previous
  `--rlbench-out` folder works), any format `rlbench.ingest.load` reads. `--arch` then names the arch
  the logs came from and is not compared to this machine; `--rlbench-device` names the board.
  A mode without a log has its checks skipped; a profile without any log, all of its items.
- Verdicts: pass -> pass; fail, error and not_evaluated (the log lacks the metric or steps the
  check reads) -> a failure whose text is the check's one-line message; skip (e.g. a device-scoped reference on another board, golden values not recorded
  for this arch) -> a pytest skip with the reason.
- `--rlbench-report PATH`: one HTML report for the session (a section per suite x profile that
  ran, the profiles that could not run with their reason and number of checks, and pytest's own
  item counts), written at session end; default `<--rlbench-out>/session-report.html`. A
  reference skipped as a whole (golden values not recorded for this arch) is counted once per
  item there, as pytest counts it.
- `--rlbench-store PATH` (or `RLBENCH_STORE`): each profile's run, its checks and metrics are appended
  to that results store when the profile is evaluated (rlbench/run/record.py; `mlflow:URI` or
  `http(s)://...`: an MLflow server, rlbench/store/target.py); `--rlbench-trusted`
  (or `RLBENCH_TRUSTED=1`) marks them trusted, the history that references with `history` gate
  against (rlbench/checks/history.py). Without a store nothing is written.
- At the end, the skipped items are summarised by reason, one line each (also with `-q`, where
  pytest lists no skip reason).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import threading
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rlbench.checks.golden import stat_key
from rlbench.checks.results import CheckResult
from rlbench.report.html import ReportSection, UnrunProfile, render_session_report
from rlbench.run.memory import process_rss_gb
from rlbench.suites.suite import PROFILE_NAMES, Reference, Suite, load_suite, profile_unmet_requirements
from trainer.errors import RLBenchError

__all__ = [
    "pytest_addoption",
    "pytest_collect_file",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_report_header",
    "pytest_runtest_setup",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
]

_STATE = pytest.StashKey["RLBenchState"]()
_VERDICT_WORD = {"fail": "FAIL", "error": "ERROR"}


# ---------------------------------------------------------------------------- options and state
def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("rlbench", "rlbench case-study suites")
    g.addoption("--arch", default=None, help="arch to run and check as (default: detected; cpu = CPU only)")
    g.addoption("--profile", default=",".join(PROFILE_NAMES),
                help="profiles to collect: full, mini, cpu, cpu-vllm, cpu-vlm, comma-separated (default: all; those "
                     "this machine cannot run are skipped with the reason; a suite without one has no items for it)")
    g.addoption("--rlbench-out", default="runs/suites", help="run folders go here (default: runs/suites)")
    g.addoption("--rlbench-report", default=None, help="session HTML report (default: <out>/session-report.html)")
    g.addoption("--rlbench-logs", default=None,
                help="check logs from DIR/<suite>/<profile>/<mode>.jsonl instead of training")
    g.addoption("--rlbench-device", default=None, help="with --rlbench-logs: the board the logs came from")
    g.addoption("--rlbench-set", action="append", default=[], metavar="KEY=VALUE",
                help="trainer override for every run, e.g. trainer.total_steps=2 (repeatable)")
    g.addoption("--rlbench-store", default=None, metavar="PATH|URI",
                help="append each profile's run to this results store: a SQLite file, or an MLflow server "
                     "(mlflow:URI or http(s)://..., #experiment=NAME) (default: $RLBENCH_STORE, else none)")
    g.addoption("--rehearse", action="store_true",
                help="rehearse the full and mini profiles on this CPU at tiny scale instead (rlbench/rehearse/): "
                     "one item per profile and mode, a verdict on mechanics only")
    g.addoption("--rlbench-trusted", action="store_true",
                help="mark the runs trusted, a baseline for history references (also RLBENCH_TRUSTED=1)")


@dataclass
class _ProfileRun:
    """The cached outcome of one suite x profile: results by reference, or why there are none."""

    by_ref: list[list[CheckResult]] | None = None
    error: str | None = None  # one line: why the run or the log loading failed
    section: ReportSection | None = None
    memory: list[CheckResult] = field(default_factory=list)  # the profile's memory items (runs made here)
    memory_rows: list[str] = field(default_factory=list)  # one line per run for the session summary


@dataclass
class RLBenchState:
    arch: str
    device_name: str
    profiles: list[str]
    out: Path
    logs: Path | None
    sets: list[str]
    report: Path
    store: Any = None  # rlbench.store.target.StoreTarget, or None: nothing is written
    env: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)  # env_info for profile_unmet_requirements
    runs: dict[tuple[str, str], _ProfileRun] = field(default_factory=dict)
    # the modes each suite x profile trains: every mode but the slow ones no selected item reads
    train_modes: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    report_written: bool = False
    terminal: Any = None  # pytest's terminal reporter: status lines reach the user while output is captured

    capture: Any = None  # pytest's capture manager, suspended while a status line is written
    # Outcomes of this session's items, to state pytest's numbers in the report and the summary.
    item_key: dict[str, tuple[str, str]] = field(default_factory=dict)  # nodeid -> (suite id, profile)
    outcomes: Counter[str] = field(default_factory=Counter)  # passed / failed / skipped
    skip_reasons: Counter[str] = field(default_factory=Counter)  # reason -> items skipped for it
    unrun: dict[tuple[str, str], tuple[str, str, int]] = field(default_factory=dict)  # key -> title, reason, n
    lock: threading.Lock = field(default_factory=threading.Lock)  # progress lines come from a thread

    def status(self, line: str) -> None:
        with self.lock:
            if self.terminal is None:
                print(f"[rlbench] {line}", file=sys.stderr, flush=True)
                return
            ctx = (self.capture.global_and_fixture_disabled() if self.capture is not None
                   else contextlib.nullcontext())
            with ctx:
                self.terminal.write_line(f"[rlbench] {line}")

    def unmet(self, suite: Suite, profile: str) -> list[str]:
        if self.logs is not None:
            if _log_paths(self.logs, suite, profile):
                return []
            modes = ", ".join(suite.profile(profile).modes)
            reason = (f"no logs for {suite.id} [{profile}] under {self.logs / suite.id / profile} "
                      f"(expected <mode>.jsonl or <mode>/metrics.jsonl for {modes})")
            return [reason]
        return profile_unmet_requirements(suite, profile, self.machine)

    def results(self, suite: Suite, profile: str) -> _ProfileRun:
        key = (suite.id, profile)
        if key not in self.runs:
            self.runs[key] = self._run(suite, profile)
        return self.runs[key]

    def _run(self, suite: Suite, profile: str) -> _ProfileRun:
        from rlbench.ingest.load import load_metrics
        from rlbench.run.runner import (
            evaluate_runs,
            memory_checks,
            memory_line,
            provenance,
            seed_list,
            train_profile,
        )

        seeds = seed_list(suite, profile, 1)
        driver_before = process_rss_gb()
        memory: dict[str, dict[str, Any]] = {}
        try:
            if self.logs is not None:
                paths = _log_paths(self.logs, suite, profile)
                runs = {m: load_metrics(p).frame for m, p in paths.items()}
                folder = self.out / suite.id / profile
                prov = {"suite_file": str(suite.path), "profile": profile,
                        "logs": {m: str(p) for m, p in paths.items()}}
            else:
                modes = self.train_modes.get((suite.id, profile))
                dropped = [m for m in suite.profile(profile).modes if m not in (modes or suite.profile(profile).modes)]
                if dropped:
                    self.status(f"{suite.id} [{profile}]: {', '.join(dropped)} not trained (the profile's slow_modes; "
                                f"their checks are deselected; make test-suites-all runs them)")
                trained = train_profile(suite, profile, self.out, seeds=seeds, modes=modes, sets=self.sets,
                                        status=self.status)
                runs, folder = trained.frames(seeds[0]), trained.folder
                memory = trained.memory[seeds[0]]
                prov = provenance(suite, profile, seeds, self.env, self.sets)
            outcome = evaluate_runs(suite, profile, {seeds[0]: runs}, arch=self.arch, device_name=self.device_name,
                                    folder=folder, env=self.env, provenance=prov, ran_modes=list(runs),
                                    status=self.status, store=self.store.path if self.store else None)
        except RLBenchError as e:
            return _ProfileRun(error=f"{suite.id} [{profile}]: {e}")
        except Exception as e:  # noqa: BLE001 - a crash in training is reported on every item of the profile
            tb = traceback.format_exc(limit=-8)
            return _ProfileRun(error=f"{suite.id} [{profile}] crashed: {type(e).__name__}: {e}\n{tb}")
        by_ref = [_per_item(suite, profile, ref, rs) for ref, rs in zip(suite.references, outcome.by_ref[seeds[0]])]
        driver = (driver_before, process_rss_gb())
        mem = memory_checks(suite, profile, memory, driver) if self.logs is None else []
        rows = [f"{suite.id} [{profile}] {mode}: peak {memory_line(rec)}" for mode, rec in memory.items()]
        if self.logs is None:
            rows.append(f"{suite.id} [{profile}]: driver {driver[0]:.2f} -> {driver[1]:.2f} GB")
        section = dataclasses.replace(outcome.sections[0], results=[r for rs in by_ref for r in rs] + mem)
        if self.store is not None:
            from rlbench.run.record import record_outcome

            ids = record_outcome(self.store, outcome, extra={seeds[0]: mem})
            self.status(f"{suite.id} [{profile}]: results store {self.store.path}: appended "
                        f"{'trusted ' if self.store.trusted else ''}run {', '.join(map(str, ids))}")
        return _ProfileRun(by_ref=by_ref, section=section, memory=mem, memory_rows=rows)


def _per_item(suite: Suite, profile: str, ref: Reference, results: list[CheckResult]) -> list[CheckResult]:
    """One result per pytest item: a reference skipped as a whole (e.g. golden values not recorded
    for this arch: one skip) is repeated under each of its items' check ids, so the report counts
    what pytest counts. References of other profiles (no items) are kept as they are."""
    ids = expected_check_ids(suite, profile, ref)
    if len(ids) > 1 and len(results) == 1 and results[0].verdict == "skip":
        return [dataclasses.replace(results[0], check_id=cid) for cid in ids]
    return results


def _log_paths(logs: Path, suite: Suite, profile: str) -> dict[str, Path]:
    base = logs / suite.id / profile
    out: dict[str, Path] = {}
    for mode in suite.profile(profile).modes:
        for cand in (base / f"{mode}.jsonl", base / mode / "metrics.jsonl"):
            if cand.is_file():
                out[mode] = cand
                break
    return out


@pytest.hookimpl(trylast=True)  # after the terminal reporter and capture manager are registered
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rlbench: a check of a case-study suite (suites/*.yaml)")
    for p in PROFILE_NAMES:
        config.addinivalue_line("markers", f"profile_{p}: a check of a suite's {p} profile")
    profiles = [p.strip() for p in str(config.getoption("--profile")).split(",") if p.strip()]
    for p in profiles:
        if p not in PROFILE_NAMES:
            raise pytest.UsageError(f"--profile {p}: choose from {', '.join(PROFILE_NAMES)} (comma-separated)")
    logs = config.getoption("--rlbench-logs")
    out = Path(config.getoption("--rlbench-out"))
    report = config.getoption("--rlbench-report")
    state = RLBenchState(arch="cpu", device_name="", profiles=profiles, out=out,
                         logs=Path(logs) if logs else None, sets=list(config.getoption("--rlbench-set")),
                         report=Path(report) if report else out / "session-report.html")
    from rlbench.store.target import resolve_target

    try:
        state.store = resolve_target(config.getoption("--rlbench-store"), config.getoption("--rlbench-trusted"),
                                     "pytest")
    except RLBenchError as e:
        raise pytest.UsageError(str(e)) from None
    if state.logs is not None:
        if not state.logs.is_dir():
            raise pytest.UsageError(f"--rlbench-logs {logs}: not a folder; pass the folder holding "
                                    "<suite_id>/<profile>/<mode>.jsonl")
        arch, device = _arch_and_device(config, None)
        state.arch = _detect()["arch"] if arch is None else arch
        state.device_name = device or ""
        state.env = {"arch": state.arch, "device_name": state.device_name, "logs": str(state.logs)}
    else:
        from rlbench.run.runner import arch_mismatch, machine_info

        env = _detect()
        detected = str(env.get("arch") or "cpu")
        arch, device = _arch_and_device(config, detected)
        if device is not None:
            raise pytest.UsageError(f"--rlbench-device {device}: names the board of logs made elsewhere, so it goes "
                                    "with --rlbench-logs; a run made here is on this machine's board (drop it)")
        state.arch = detected if arch is None else arch
        msg = arch_mismatch(state.arch, detected, env.get("device_name"))
        if msg and not config.getoption("--rehearse"):  # a rehearsal runs on this CPU whatever --arch names
            raise pytest.UsageError(msg)
        state.machine = machine_info(state.arch, env)
        state.device_name = state.machine["device_name"]
        state.env = {**env, "arch": state.arch}
    state.terminal = config.pluginmanager.get_plugin("terminalreporter")
    state.capture = config.pluginmanager.get_plugin("capturemanager")
    config.stash[_STATE] = state
    config.pluginmanager.register(ItemRecorder(state), "rlbench-item-recorder")


def _arch_and_device(config: pytest.Config, detected: str | None) -> tuple[str | None, str | None]:
    """`--arch` and `--rlbench-device` as given (None: not given; '' is given, and refused), each checked
    against the known ones as `rlbench check` checks them."""
    from rlbench.run.inputs import validate_arch, validate_device

    arch, device = config.getoption("--arch"), config.getoption("--rlbench-device")
    try:
        if arch is not None:
            validate_arch(arch, detected=detected)
        if device is not None:
            validate_device(device, flag="--rlbench-device")
    except RLBenchError as e:
        raise pytest.UsageError(str(e)) from None
    return arch, device


def pytest_report_header(config: pytest.Config) -> str | None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return None
    source = f"logs from {state.logs}" if state.logs else f"runs into {state.out}"
    return (f"rlbench: arch {state.arch}, device {state.device_name or '-'}, profiles {','.join(state.profiles)}, "
            f"{source}" + (f", overrides {' '.join(state.sets)}" if state.sets else ""))


def _detect() -> dict[str, Any]:
    from trainer.platform.env import collect_env

    return collect_env()


# ---------------------------------------------------------------------------- collection
def expected_checks(suite: Suite, profile: str, ref: Reference) -> list[tuple[str, set[str]]]:
    """(check id, the modes whose runs it reads) of each result `rlbench.checks.evaluate.evaluate` gives `ref`
    on `profile` (none if it does not apply)."""
    if profile not in ref.profiles:
        return []
    prof_modes = suite.profile(profile).modes
    if ref.kind == "golden":
        return [(f"golden:{stat_key(gs, m)}", {m}) for gs in ref.stats for m in (gs.modes or prof_modes)]
    if ref.kind == "ratio":
        return [(ref.check_id(), {str(ref.num), str(ref.den)})]
    modes = ref.modes or prof_modes
    return [(ref.check_id(m if (ref.modes or len(modes) > 1) else None), {m}) for m in modes]


def expected_check_ids(suite: Suite, profile: str, ref: Reference) -> list[str]:
    """The check ids `rlbench.checks.evaluate.evaluate` gives `ref`'s results on `profile` (none if it does not apply)."""
    return [cid for cid, _ in expected_checks(suite, profile, ref)]


@pytest.hookimpl(trylast=True)  # after `-m` / `-k` deselected items: the selection is final
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each suite x profile trains its modes but the slow ones (`slow_modes`) that no selected item reads."""
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    read: dict[SuiteProfile, set[str]] = {}
    for item in items:
        if isinstance(item, CheckItem):
            read.setdefault(item._owner, set()).update(item.modes)
    for owner, modes in read.items():
        prof = owner.suite.profile(owner.profile)
        state.train_modes[(owner.suite.id, owner.profile)] = [m for m in prof.modes
                                                              if m not in prof.slow_modes or m in modes]


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    if file_path.suffix == ".yaml" and _STATE in parent.config.stash:
        return SuiteFile.from_parent(parent, path=file_path)
    return None


class SuiteFile(pytest.File):
    """One suite file: a collector per selected profile."""

    def collect(self) -> Any:
        try:
            suite = load_suite(self.path)
        except RLBenchError as e:
            raise self.CollectError(str(e)) from None
        if self.config.getoption("--rehearse"):
            from rlbench.rehearse.pytest_items import rehearsal_items

            yield from rehearsal_items(self, suite, self.config.stash[_STATE].profiles)
            return
        for profile in self.config.stash[_STATE].profiles:
            if profile not in suite.profile_names():  # an optional profile (cpu-vllm) this suite lacks
                continue
            yield SuiteProfile.from_parent(self, name=f"{suite.id}[{profile}]", suite=suite, profile=profile)


class SuiteProfile(pytest.Collector):
    """One suite x profile: an item per check id of the references that list the profile."""

    def __init__(self, *, suite: Suite, profile: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.suite, self.profile = suite, profile

    def collect(self) -> Any:
        seen: set[str] = set()
        for i, ref in enumerate(self.suite.references):
            for cid, modes in expected_checks(self.suite, self.profile, ref):
                if cid in seen:
                    continue
                seen.add(cid)
                yield self._item(cid, i, modes)
        if self.config.stash[_STATE].logs is None:  # runs trained here: their memory is measured
            from rlbench.run.runner import memory_checks_and_modes

            for cid, modes in memory_checks_and_modes(self.suite, self.profile):
                yield self._item(cid, MEMORY_ITEMS, modes)

    def _item(self, cid: str, ref_index: int, modes: set[str]) -> CheckItem:
        """An item reading the runs of `modes`: in pytest's `slow` tier when one of them is a slow mode of the profile."""
        item = CheckItem.from_parent(self, name=cid, ref_index=ref_index, check_id=cid, modes=modes)
        item.add_marker("rlbench")
        item.add_marker(f"profile_{self.profile}")
        if modes & set(self.suite.profile(self.profile).slow_modes):
            item.add_marker("slow")
        return item


MEMORY_ITEMS = -1  # CheckItem.ref_index of a profile's memory items (not a suite reference)


class CheckFailed(Exception):
    """A check that failed or errored; its text is the one-line message."""


class CheckItem(pytest.Item):
    def __init__(self, *, ref_index: int, check_id: str, modes: set[str] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.ref_index, self.check_id = ref_index, check_id
        self.modes = modes or set()  # the modes whose runs it reads (none: the profile as a whole)

    @property
    def _owner(self) -> SuiteProfile:
        assert isinstance(self.parent, SuiteProfile)
        return self.parent

    def runtest(self) -> None:
        owner = self._owner
        run = self.config.stash[_STATE].results(owner.suite, owner.profile)
        if run.error is not None:
            raise CheckFailed(run.error)
        assert run.by_ref is not None
        mine = run.memory if self.ref_index == MEMORY_ITEMS else run.by_ref[self.ref_index]
        results = [r for r in mine if r.check_id == self.check_id] or mine  # e.g. one skip for all golden stats
        # fail, error and any other verdict but pass and skip (not_evaluated: the log lacks what the
        # check reads) fail the item: a check that was not evaluated is never a pass.
        bad = [r for r in results if r.verdict not in ("pass", "skip")]
        if bad:
            raise CheckFailed(" | ".join(r.message for r in bad))
        if results and all(r.verdict == "skip" for r in results):
            _skip(results[0].message)
        if not results:
            raise CheckFailed(f"{self.check_id}: no result came back for this check")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"{self._owner.name}::{self.check_id}"


def _skip(reason: str) -> None:
    """Skip reported at the suite file (as a skip marker is), not at this module's line."""
    raise pytest.skip.Exception(reason, _use_item_location=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not isinstance(item, CheckItem):
        return
    owner = item._owner
    state = item.config.stash[_STATE]
    key = (owner.suite.id, owner.profile)
    state.item_key[item.nodeid] = key
    reasons = state.unmet(owner.suite, owner.profile)
    if reasons:
        title = f"{owner.suite.title} [{owner.profile}]"
        _, _, n = state.unrun.get(key, (title, "", 0))
        state.unrun[key] = (title, "; ".join(reasons), n + 1)
        _skip(f"{owner.suite.id} [{owner.profile}] cannot run here: {'; '.join(reasons)}")


_SKIP_PREFIX = re.compile(r"^(?:Skipped:\s*)?(?:\S+: SKIP \((.*)\)|(.*))$", re.DOTALL)


def skip_reason_text(longrepr: Any) -> str:
    """The reason of a skip report, without pytest's 'Skipped: ' and the check id's '<id>: SKIP (...)'."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    m = _SKIP_PREFIX.match(text.strip())
    return ((m.group(1) or m.group(2)) if m else text).strip()


class ItemRecorder:
    """Registered per session: counts the rlbench items the way pytest does (a skip in setup or
    call, a pass or a failure), so the report and the summary state pytest's numbers."""

    def __init__(self, state: RLBenchState) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self.state
        if report.nodeid not in state.item_key:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = "skipped" if report.skipped else ("passed" if report.passed else "failed")
            state.outcomes[outcome] += 1
            if report.skipped:
                state.skip_reasons[skip_reason_text(report.longrepr)] += 1


# ---------------------------------------------------------------------------- session end
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    sections = [r.section for r in state.runs.values() if r.section is not None]
    if not sections and not session.config.getoption("--rlbench-report"):
        return  # nothing ran and no report was asked for
    unrun = [UnrunProfile(title, reason, n) for title, reason, n in state.unrun.values()]
    render_session_report(state.report, sections, title=f"rlbench suites on {state.arch}", unrun=unrun,
                          items={k: state.outcomes[k] for k in ("passed", "failed", "skipped") if state.outcomes[k]})
    state.report_written = True


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The skips grouped by reason (shown with -q too, where pytest lists none), then the report path."""
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    if state.skip_reasons:
        total = sum(state.skip_reasons.values())
        terminalreporter.write_line(f"rlbench: {total} skipped, by reason:")
        for reason, n in state.skip_reasons.most_common():
            terminalreporter.write_line(f"  {n:4d}  {reason}")
    rows = [row for run in state.runs.values() for row in run.memory_rows]
    if rows:
        terminalreporter.write_line("rlbench: memory per run (peak RSS summed over its processes) and the driver's "
                                    "resident memory before -> after each profile:")
        for row in rows:
            terminalreporter.write_line(f"  {row}")
    if state.report_written:
        terminalreporter.write_line(f"rlbench session report: {state.report}")
