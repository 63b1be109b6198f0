"""`rlbench selftest`: plant known bugs in a scratch copy of the trainer and see which checks catch them.

    rlbench selftest                                    # every mutation + 3 clean seeds, the GRPO suite's cpu profile
    rlbench selftest --mutations weights_never_synced,reward_inverted --clean-seeds 5
    rlbench selftest --tiny --mutations ... --set trainer.total_steps=3   # tiny random model, mechanics checks only

For each job -- one clean run per `--clean-seeds` seed, one run per mutation at `--mutation-seed`
-- the `trainer` package is copied to a temporary folder, the mutation (rlbench/selftest/mutations.py) is
applied there by exact-match replace (a target that moved fails the selftest), and the suite
profile's resolved trainer config is trained by `python -m trainer` in a subprocess that imports
the scratch copy (checked). The suite's checks (rlbench/checks/evaluate.py, golden values included) are
evaluated on each run's metrics. A mutation is *caught* by a check that fails (or cannot be
computed) on it; a check that fails on a clean run is a *false alarm*. Clean seeds should lie
outside the seeds the golden values were recorded from, so that the golden bands are tested on
runs they did not see.

`--steps N` (default 1) trains the first N steps of the profile and evaluates only the checks that
those steps settle as the whole run would (`prefix_checks`): bands over every step, `first`,
`no_nan`, `mean_first(n <= N)`, upper bounds on a max, lower bounds on a min, and any statistic
whose window ends by step N; golden statistics likewise. `--steps 0` runs the whole profile and
every check. Each planted bug of the default list shows at step 0 or 1 (`old_logprobs_from_reference`
needs step 2 and is left out of it), so one step instead of eight makes the selftest 4-5x cheaper.

`--tiny` swaps in the tiny random-init model (seconds per run) and counts only the checks whose
bounds hold for any model (`TINY_METRICS`: log-prob agreement, on-policy first mini-batch, weight
sync, advantage centring, finite loss); the learning and golden checks need the real model.

The trainer copied is the working tree's, or with `--rev REV` that commit's (`git archive`; REV is
resolved once, so every job mutates the same trainer). `--evaluate-only` trains nothing: it
re-evaluates the runs already in `<work>` (after a check changed) and says so in the table.
A mutated run that crashes is shown as such and not counted as caught (a crash is as likely a
broken setup as a caught bug). Runs go to `<work>/<job>/` (metrics.jsonl, train.log, job.json); a job whose job.json matches its
mutation and config is reused, so an interrupted selftest resumes. The result table goes to
`<out>/<suite>.<profile>[.tiny].md` and `.json` with the machine, versions, commit and date.
Exit status 0 when every mutation was caught and no clean run raised an alarm, else 1.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlbench.checks.evaluate import evaluate
from rlbench.ingest.load import load_metrics
from rlbench.run.runner import PROJECT_ROOT, resolved_config
from rlbench.selftest.mutations import (
    DEFAULT_MUTATIONS,
    MUTATIONS,
    Mutation,
    apply_mutation,
    copy_trainer,
    trainer_digest,
)
from rlbench.suites.suite import Suite
from trainer.errors import ConfigError

DEFAULT_SUITE = "verl_grpo_qwen3_8b_sglang_gfx950"
DEFAULT_CLEAN_SEEDS = (5, 6, 7)
DEFAULT_STEPS = 1  # the first of the cpu profile's 8 steps (see the module docstring)
# The mechanics invariants of trainer/components/invariants.py: they hold for any model.
INVARIANT_METRICS = frozenset({
    "training/reward_audit_failures", "training/reward_rescore_max_abs_diff", "training/data_repeats_in_epoch",
    "training/data_epoch_err", "training/gen_stop_violations", "training/optimizer_update_err",
    "training/optimizer_steps_err", "training/grad_stale_max", "training/grad_clip_err",
    "training/loss_witness_err", "training/clipfrac_witness_err",
})
TINY_METRICS = frozenset({
    "training/rollout_probs_diff_max", "training/weight_sync_max_abs_diff", "actor/ppo_kl_first_minibatch",
    "actor/pg_clipfrac_first_minibatch", "critic/advantages/group_mean_abs_max", "actor/pg_loss",
}) | INVARIANT_METRICS
# The random tiny model scores 0 everywhere, so GRPO advantages are 0 and nothing would train: an
# entropy bonus gives every step a gradient, so that weight sync and off-policy signals exist.
TINY_SETS = ("model.path=tiny:qwen2", "model.dtype=float32", "actor.entropy_coeff=0.01")
_OK = ("pass", "skip")  # any other verdict (fail, error, not evaluated) means the check saw a problem


@dataclass
class Job:
    name: str  # "clean" or the mutation name
    seed: int
    mutation: Mutation | None
    folder: Path
    verdicts: dict[str, str] = field(default_factory=dict)  # check id -> pass | fail | error | skip
    messages: dict[str, str] = field(default_factory=dict)  # check id -> message of a failed check
    crashed: str | None = None  # last lines of the trainer's output when it exited non-zero
    wall_s: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.name}@seed{self.seed}"

    def failed(self) -> list[str]:
        return sorted(c for c, v in self.verdicts.items() if v not in _OK)


def resolve_rev(rev: str | None) -> str | None:
    """`rev` as a full commit hash, once, so that every job of a selftest mutates the same trainer."""
    if rev is None:
        return None
    out = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise ConfigError(f"--rev {rev}: not a commit of this repository ({out.stderr.strip()})")
    return out.stdout.strip()


def _reuse_only(job: Job, status) -> None:
    """`evaluate_only`: take the job's earlier run as it is (its job.json says how it went)."""
    done = job.folder / "job.json"
    if not done.is_file():
        job.crashed = f"no earlier run in {job.folder}"
        return
    prev = json.loads(done.read_text())
    job.crashed, job.wall_s = prev.get("crashed"), float(prev.get("wall_s", 0.0))
    status(f"{job.key}: evaluating the earlier run in {job.folder}")


def _train(job: Job, cfg: dict[str, Any], *, rev: str | None, status) -> None:
    """Train `cfg` with a scratch copy of the trainer carrying `job.mutation`; reuse a matching earlier run."""
    job.folder.mkdir(parents=True, exist_ok=True)
    cfg = {**cfg, "trainer": {**cfg["trainer"], "out_dir": str(job.folder.resolve()), "progress": False}}
    ident = hashlib.sha256(json.dumps({"cfg": cfg, "mutation": job.mutation.__dict__ if job.mutation else None,
                                       "trainer": trainer_digest(rev)}, sort_keys=True, default=str)
                           .encode()).hexdigest()
    done = job.folder / "job.json"
    if done.is_file():
        prev = json.loads(done.read_text())
        if prev.get("ident") == ident and prev.get("crashed") is None:  # a crashed run is tried again
            job.crashed, job.wall_s = prev.get("crashed"), float(prev.get("wall_s", 0.0))
            status(f"{job.key}: reusing {job.folder}")
            return
    with tempfile.TemporaryDirectory(prefix="rlbench-selftest-") as tmp:
        root = copy_trainer(Path(tmp), rev)
        if job.mutation is not None:
            apply_mutation(job.mutation, root)
        (root / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        code = ("import sys, trainer; from pathlib import Path; "
                f"assert Path(trainer.__file__).resolve().is_relative_to(Path({str(root.resolve())!r})), trainer.__file__; "
                "from trainer.__main__ import main; sys.exit(main(['config.yaml']))")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        status(f"{job.key}: training -> {job.folder}")
        t0 = time.perf_counter()
        with open(job.folder / "train.log", "w") as log:
            rc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        job.wall_s = time.perf_counter() - t0
    tail = (job.folder / "train.log").read_text().strip().splitlines()[-3:]
    job.crashed = None if rc == 0 else f"exit {rc}: " + " | ".join(tail)
    done.write_text(json.dumps({"ident": ident, "crashed": job.crashed, "wall_s": job.wall_s,
                                "trainer": rev or "working tree", "trainer_tree": trainer_digest(rev)}, indent=2))


def _prefix_determined(stat: str | None, op: str | None, n: int, window: tuple[int, int] | None, steps: int) -> bool:
    """Does a run's first `steps` steps settle this check as the whole run would (for a clean run)?"""
    if window is not None and window[1] <= steps:
        return True
    if op == "band" or stat in ("first", "no_nan"):
        return True  # every step seen holds the bound / the first step is the first step
    if stat == "mean_first":
        return n <= steps
    return (stat, op) in (("max", "<="), ("min", ">="))  # a prefix's max is at most the run's


def prefix_checks(suite: Suite, steps: int | None) -> Suite:
    """The suite with only the references (and golden statistics) that the first `steps` steps settle;
    the whole suite when `steps` is None (the profile's own length)."""
    if steps is None:
        return suite
    refs = []
    for ref in suite.references:
        if ref.kind == "golden":
            stats = [gs for gs in ref.stats if _prefix_determined(gs.stat, "approx", gs.n, gs.window, steps)]
            if stats:
                refs.append(ref.model_copy(update={"stats": stats}))
        elif ref.kind == "metric" and _prefix_determined(ref.stat, ref.op, ref.n, ref.window, steps):
            refs.append(ref)
    return suite.model_copy(update={"references": refs})


def _evaluate(job: Job, suite: Suite, profile: str, metrics_filter: frozenset[str] | None, steps: int | None,
              engine: str) -> None:
    path = job.folder / "metrics.jsonl"
    if job.crashed or not path.is_file():
        return
    frame = load_metrics(path).frame
    for r in evaluate(suite, profile, {"colocated": frame}, arch="cpu", device_name="cpu", steps=steps,
                      engines={"colocated": engine}):
        if r.verdict == "skip" or (metrics_filter is not None and r.metric not in metrics_filter):
            continue
        job.verdicts[r.check_id] = r.verdict
        if r.verdict not in _OK:
            job.messages[r.check_id] = r.message


def run_selftest(suite: Suite, profile: str = "cpu", *, mutations: list[str] | None = None,
                 clean_seeds: list[int] | None = None, mutation_seed: int = 0, steps: int | None = DEFAULT_STEPS,
                 work: str | Path = "runs/selftest",
                 out: str | Path | None = "reports/selftest", tiny: bool = False, sets: list[str] | None = None, rev: str | None = None,
                 evaluate_only: bool = False, status=lambda line: print(f"[selftest] {line}", file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Run the clean seeds and the mutations, evaluate the suite's checks; write and return the result."""
    prof = suite.profile(profile)
    if prof.modes != ["colocated"]:
        raise ConfigError(f"selftest: {suite.id} profile {profile} runs {', '.join(prof.modes)}; the selftest "
                          "drives the colocated loop only (pick a colocated suite, e.g. " + DEFAULT_SUITE + ")")
    names = list(DEFAULT_MUTATIONS) if not mutations else (list(MUTATIONS) if mutations == ["all"] else mutations)
    unknown = [n for n in names if n not in MUTATIONS]
    if unknown:
        raise ConfigError(f"--mutations: unknown {', '.join(unknown)}; known: {', '.join(MUTATIONS)}")
    clean_seeds = list(DEFAULT_CLEAN_SEEDS if clean_seeds is None else clean_seeds)
    rev = resolve_rev(rev)
    if steps is not None and not 1 <= steps <= prof.steps:
        raise ConfigError(f"--steps {steps}: give 1..{prof.steps} (the {profile} profile's steps), or 0 for all of them")
    steps = None if steps is None or steps == prof.steps else steps
    sets = [*(TINY_SETS if tiny else ()), *([f"trainer.total_steps={steps}"] if steps else []), *(sets or [])]
    checked = prefix_checks(suite, steps)
    tag = f"{suite.id}.{profile}" + (f".{steps}steps" if steps else "") + (".tiny" if tiny else "")
    work = Path(work) / tag
    jobs = [Job("clean", s, None, work / f"clean_seed{s}") for s in clean_seeds]
    jobs += [Job(n, mutation_seed, MUTATIONS[n], work / n) for n in names]
    t0 = time.perf_counter()
    for job in jobs:
        cfg = resolved_config(suite, profile, "colocated", job.seed, job.folder, sets)
        if evaluate_only:
            _reuse_only(job, status)
        else:
            _train(job, cfg, rev=rev, status=status)
        _evaluate(job, checked, profile, TINY_METRICS if tiny else None, steps,
                  str((cfg.get("rollout") or {}).get("engine") or "hf"))
        status(f"{job.key}: " + (f"CRASHED {job.crashed}" if job.crashed else
                                  f"{len(job.failed())} of {len(job.verdicts)} checks failed: {', '.join(job.failed())}"))
    result = summarize(suite, profile, jobs, tiny=tiny, sets=sets, wall_s=time.perf_counter() - t0)
    result["steps"] = steps or prof.steps
    result["trainer_rev"] = rev or "working tree"
    result["evaluate_only"] = evaluate_only
    if out is not None:
        write_result(result, Path(out), tag)
    return result


def summarize(suite: Suite, profile: str, jobs: list[Job], *, tiny: bool, sets: list[str], wall_s: float) -> dict[str, Any]:
    """Caught-by per mutation (checks failing on it and on no clean run), false alarms per clean seed."""
    from trainer.platform.env import collect_env

    clean = [j for j in jobs if j.mutation is None]
    alarms = {c for j in clean for c in j.failed()}
    rows = []
    for j in jobs:
        if j.mutation is None:
            continue
        caught = [c for c in j.failed() if c not in alarms]
        rows.append({"mutation": j.name, "area": j.mutation.area, "what": j.mutation.what, "file": j.mutation.file,
                     "expect": j.mutation.expect, "seed": j.seed, "crashed": j.crashed, "caught_by": caught,
                     "caught": bool(caught), "messages": {c: j.messages[c] for c in caught},
                     "wall_s": round(j.wall_s, 1)})
    clean_rows = [{"seed": j.seed, "crashed": j.crashed, "checks": len(j.verdicts), "false_alarms": j.failed(),
                   "messages": j.messages, "wall_s": round(j.wall_s, 1)} for j in clean]
    env = collect_env()
    return {
        "suite": suite.id, "profile": profile, "tiny": tiny, "sets": sets,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"hostname": env.get("hostname"), "platform": env.get("platform"), "cpu_count": os.cpu_count(),
                    "device": env.get("device_name") or "cpu"},
        "versions": env.get("versions"), "python": env.get("python"), "git": env.get("git"),
        "checks": sorted({c for j in jobs for c in j.verdicts}),
        "mutations": rows, "clean": clean_rows,
        "summary": {"mutations": len(rows), "caught": sum(r["caught"] for r in rows),
                    "clean_runs": len(clean_rows), "clean_crashed": sum(r["crashed"] is not None for r in clean_rows),
                    "false_alarms": sum(len(r["false_alarms"]) for r in clean_rows)},
        "wall_s": round(wall_s, 1),
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    git = result.get("git") or {}
    v = result.get("versions") or {}
    lines = [
        f"# rlbench selftest: {result['suite']} [{result['profile']}], first {result.get('steps')} "
        f"step{'' if result.get('steps') == 1 else 's'}"
        + (" (tiny model)" if result["tiny"] else ""),
        "",
        f"{s['caught']} of {s['mutations']} mutations caught; {s['false_alarms']} false alarms over "
        f"{s['clean_runs']} clean seeds ({s['clean_crashed']} crashed).",
        "",
        f"Machine: {result['machine']['hostname']}, {result['machine']['cpu_count']} CPUs, {result['machine']['platform']}; "
        f"torch {v.get('torch')}, transformers {v.get('transformers')}, python {result.get('python')}; "
        f"commit {str(git.get('commit'))[:10]}{' (dirty)' if git.get('dirty') else ''}; {result['date']}; "
        f"trainer from {result.get('trainer_rev', 'working tree')}; {result['wall_s'] / 60:.1f} min"
        + (" (checks re-evaluated on earlier runs)." if result.get("evaluate_only") else ".") + (f" Overrides: {' '.join(result['sets'])}." if result["sets"] else ""),
        "",
        "| mutation | area | the bug | caught by (checks failing here and on no clean run) | run s |",
        "|---|---|---|---|---|",
    ]
    for r in result["mutations"]:
        by = "run crashed: " + r["crashed"][:80] if r["crashed"] else (", ".join(f"`{c}`" for c in r["caught_by"]) or "**NOT CAUGHT**")
        lines.append(f"| {r['mutation']} | {r['area']} | {r['what']} | {by} | {r['wall_s']:.0f} |")
    lines += ["", "| clean seed | checks evaluated | false alarms | run s |", "|---|---|---|---|"]
    for r in result["clean"]:
        fa = "run crashed: " + r["crashed"][:80] if r["crashed"] else (", ".join(f"`{c}`" for c in r["false_alarms"]) or "0")
        lines.append(f"| {r['seed']} | {r['checks']} | {fa} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def write_result(result: dict[str, Any], out: Path, tag: str) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / f"{tag}.json", out / f"{tag}.md"
    js.write_text(json.dumps(result, indent=2, default=str) + "\n")
    md.write_text(markdown(result))
    return js, md


def exit_code(result: dict[str, Any]) -> int:
    s = result["summary"]
    crashed = s["clean_crashed"] or any(r["crashed"] for r in result["mutations"])
    return 0 if s["caught"] == s["mutations"] and s["false_alarms"] == 0 and not crashed else 1
