"""Run rehearsals and record them: one suite x profile x mode on CPU, its verdict on mechanics, a JSON each.

    python -m rlbench.rehearse SUITE --profile full [--mode colocated] [--fault tp_shard]
    python -m rlbench.rehearse --all --profile full --profile mini        # every suite, one at a time
    make rehearse

Each run: the transformed config (`rlbench/rehearse/transform.py`) goes to `python -m trainer` in a child
process (niced), with the SGLang double first on PYTHONPATH for an SGLang profile and, where the profile
spans nodes, Ray's own multi-node test cluster (`ray.cluster_utils.Cluster`, one raylet per node on this
machine) joined through RAY_ADDRESS. A child that exits at start gives a *refusal*: the one line it printed
(`error: ...`). Otherwise the mechanics checks (`rlbench/rehearse/mechanics.py`) read its metrics.jsonl.
Published references are not evaluated (rehearsal).

Each result is written to `reports/rehearsal/<suite>.<profile>.<mode>.json` (commit, date, machine, the
changes, the checks, wall time, the refusal line) and the table of all of them to
`reports/rehearsal/README.md`; `rlbench list` reads those files (`rehearsal_status`), no line is written
by hand. A planted fault (`--fault`) writes `<...>.fault-<name>.json` instead and never enters the table.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from rlbench.rehearse.mechanics import evaluate_mechanics, read_metrics
from rlbench.rehearse.transform import Plan, rehearsal_config

ROOT = Path(__file__).resolve().parents[2]
REPORT_DIR = ROOT / "reports" / "rehearsal"
DOUBLE_DIR = Path(__file__).resolve().parent / "double"
HOOKS_DIR = Path(__file__).resolve().parent / "hooks"
FAULT_ENV = "RLBENCH_REHEARSAL_FAULT"
FAULTS = ("tp_shard",)
NOT_EVALUATED = "not evaluated (rehearsal)"
REHEARSED_PROFILES = ("full", "mini")


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+uncommitted" if dirty else "")
    except OSError:
        return "unknown"


def _refusal_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("error: "):
            return ln.removeprefix("error: ")
    return lines[-1] if lines else "the run stopped with no message"


def _model_facts(cfg: dict[str, Any]) -> tuple[int, bool]:
    """(routed experts of the model, 0 when dense; whether it is a vision-language model)."""
    from trainer.config import load_config
    from trainer.models.moe import is_moe
    from trainer.platform.preflight import model_config

    hf = model_config(load_config(cfg))
    if hf is None:
        return 0, False
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    experts = max(int(getattr(text, k, 0) or 0) for k in ("num_local_experts", "num_experts", "n_routed_experts"))
    return (experts if is_moe(hf) else 0), hasattr(hf, "vision_config")


def materialize_model(plan: Plan) -> None:
    """Save the plan's tiny stand-in as the HF folder its model.path names (once; reused after)."""
    if plan.folder_model is None:
        return
    folder = ROOT / plan.config["model"]["path"]
    plan.config["model"]["path"] = str(folder)
    if (folder / "config.json").is_file():
        return
    from trainer.config import ModelConfig
    from trainer.models.loading import load_model_and_tokenizer
    from trainer.models.vlm import is_vlm, load_vision_processor

    tiny, over = plan.folder_model["tiny"], plan.folder_model["override_config"]
    model, tok = load_model_and_tokenizer(ModelConfig(path=tiny, override_config=over), seed=0)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if is_vlm(model):
        load_vision_processor(tiny, tok, model).image_processor.save_pretrained(tmp)
    tmp.rename(folder)


def child_env(plan: Plan, fault: str | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT)]
    if plan.config.get("rollout", {}).get("engine") == "sglang":
        paths.insert(0, str(DOUBLE_DIR))
    if fault:
        paths.insert(0, str(HOOKS_DIR))
        env[FAULT_ENV] = fault
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["RAY_DEDUP_LOGS"] = "0"  # every worker's lines (the double's evidence lines are counted)
    return env


def rehearse(suite_name: str, profile: str, mode: str, *, fault: str | None = None, timeout_s: int = 1500,
             report_dir: Path = REPORT_DIR, run_root: Path | None = None, status=print) -> dict[str, Any]:
    from rlbench.run.runner import find_suite

    suite = find_suite(suite_name)
    plan = rehearsal_config(suite, profile, mode)
    materialize_model(plan)
    cfg = plan.config
    out_dir = ROOT / cfg["trainer"]["out_dir"]
    if run_root is not None:  # e.g. a test's tmp folder instead of runs/rehearsal/
        out_dir = Path(run_root) / suite.id / profile / mode
        cfg["trainer"]["out_dir"] = str(out_dir)
    if fault:
        out_dir = out_dir.with_name(out_dir.name + f"-fault-{fault}")
        cfg["trainer"]["out_dir"] = str(out_dir)
    if out_dir.exists():  # a rehearsal starts from nothing: no metrics of an earlier one may be read as its own
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    cfg_path = out_dir.parent / f"{out_dir.name}.rehearsal.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = ["nice", "-n", "10", sys.executable, "-m", "rlbench.rehearse.child", str(cfg_path), "--nodes", str(plan.nodes)]
    status(f"rehearse {suite.id} {profile} {mode}{' fault=' + fault if fault else ''}: {len(plan.changes)} changes"
           + (f"; {plan.engine_note}" if plan.engine_note else ""))
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=child_env(plan, fault), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout_s)
        rc, stderr = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        rc, stderr = 124, (e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")) + \
            f"\nerror: the rehearsal ran past {timeout_s} s"
    wall = time.time() - t0
    (out_dir / "rehearsal.log").write_text(stderr[-200_000:])
    rows = read_metrics(out_dir / "metrics.jsonl")
    total = int(cfg["trainer"]["total_steps"])
    experts, vlm = _model_facts(cfg)
    checks = evaluate_mechanics(rows, total_steps=total, mode=mode, moe_experts=experts,
                                agent=bool(cfg.get("agent", {}).get("enable")), images=vlm) if rows else []
    steps_run = len([s for s in rows if s >= 1])
    if rows and cfg.get("rollout", {}).get("engine") == "sglang":
        starts = stderr.count("[sglang double] Engine(")
        syncs = stderr.count("[sglang double] weights reloaded")
        checks.append({"check": "engine:sglang_double", "result": "pass" if starts and syncs else "fail",
                       "detail": f"{starts} double engine(s) started, {syncs} weight reloads ({plan.engine_note})"})
    if rc != 0 and steps_run == 0:
        outcome, line = "refused", _refusal_line(stderr)
    elif rc != 0:
        outcome, line = "failed", _refusal_line(stderr)
    else:
        outcome = "pass" if all(c["result"] != "fail" for c in checks) else "failed"
        line = "; ".join(f"{c['check']}: {c['detail']}" for c in checks if c["result"] == "fail")
    rec = {
        "suite": suite.id, "profile": profile, "mode": mode, "fault": fault,
        "outcome": outcome, "line": line, "exit_code": rc,
        "as_profile_says": not plan.changes, "changes": plan.changes_as_dicts(), "engine_note": plan.engine_note,
        "nodes": plan.nodes, "steps_planned": total, "steps_run": steps_run, "checks": checks,
        "checks_passed": sum(c["result"] == "pass" for c in checks), "checks_evaluated": sum(
            c["result"] in ("pass", "fail") for c in checks),
        "published_references": f"{sum(1 for r in suite.references if profile in r.profiles)} {NOT_EVALUATED}",
        "wall_s": round(wall, 1), "commit": _commit(), "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "node": platform.node()},
        "config": _rel(cfg_path), "run_dir": _rel(out_dir),
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    name = f"{suite.id}.{profile}.{mode}" + (f".fault-{fault}" if fault else "") + ".json"
    (report_dir / name).write_text(json.dumps(rec, indent=2, default=str) + "\n")
    status(f"  -> {outcome} in {wall:.0f} s ({steps_run}/{total} steps, {rec['checks_passed']}/{rec['checks_evaluated']} "
           f"checks){': ' + line if line else ''}")
    if not fault:
        write_table(report_dir)
    return rec


# ---------------------------------------------------------------------------- records -> table, list
def load_records(report_dir: Path = REPORT_DIR, faults: bool = False) -> list[dict[str, Any]]:
    out = []
    for p in sorted(report_dir.glob("*.json")):
        rec = json.loads(p.read_text())
        if bool(rec.get("fault")) == faults:
            out.append(rec)
    return out


def rehearsal_status(suite_id: str, profile: str, report_dir: Path = REPORT_DIR) -> list[str]:
    """Lines for `rlbench list` from the recorded rehearsals of one suite profile: one per mode that
    stopped ('cannot run anywhere yet: <mode>: <line> (rehearsal <commit> <date>)'); [] when every
    recorded mode passed or none is recorded."""
    lines = []
    for rec in load_records(report_dir):
        if rec["suite"] == suite_id and rec["profile"] == profile and rec["outcome"] != "pass":
            lines.append(f"cannot run anywhere yet: {rec['mode']}: {rec['line']} "
                         f"(rehearsal {rec['commit']} {rec['date'][:10]})")
    return lines


def write_table(report_dir: Path = REPORT_DIR) -> None:
    recs = load_records(report_dir)
    head = ("| suite | profile | mode | outcome | as the profile says / changes | steps | mechanics checks passed | "
            "wall s | commit, date |\n|---|---|---|---|---|---|---|---|---|\n")
    body = []
    for r in recs:
        ch = "as the profile says" if r["as_profile_says"] else f"{len(r['changes'])} changes"
        if r["engine_note"]:
            ch += f"; {r['engine_note']}"
        out = r["outcome"] + (f": {r['line']}" if r["line"] else "")
        body.append(f"| {r['suite']} | {r['profile']} | {r['mode']} | {out.replace('|', '/')} | {ch} | "
                    f"{r['steps_run']}/{r['steps_planned']} | {r['checks_passed']}/{r['checks_evaluated']} | "
                    f"{r['wall_s']} | {r['commit']} {r['date'][:16]} |")
    faults = load_records(report_dir, faults=True)
    fault_rows = [f"| {r['suite']} | {r['profile']} | {r['mode']} | {r['fault']} | {r['outcome']}: {r['line'][:300]} |"
                  for r in faults]
    text = (Path(__file__).with_name("TABLE_HEADER.md").read_text() + "\n" + head + "\n".join(body) + "\n")
    if fault_rows:
        text += ("\n## Planted faults\n\n| suite | profile | mode | fault | outcome |\n|---|---|---|---|---|\n"
                 + "\n".join(fault_rows) + "\n")
    text += "\nPer run: `<suite>.<profile>.<mode>.json` (every change with its reason, every check with its values).\n"
    (report_dir / "README.md").write_text(text)


def runs_for(suite_names: list[str], profiles: list[str], modes: list[str] | None) -> list[tuple[str, str, str]]:
    from rlbench.run.runner import find_suite

    out = []
    for name in suite_names:
        suite = find_suite(name)
        for p in profiles:
            for m in suite.profile(p).modes:
                if modes is None or m in modes:
                    out.append((suite.id, p, m))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlbench.rehearse", description=__doc__.splitlines()[0])
    ap.add_argument("suite", nargs="*", help="suite ids or files (none with --all)")
    ap.add_argument("--all", action="store_true", help="every suite in suites/")
    ap.add_argument("--profile", action="append", choices=REHEARSED_PROFILES, help="full and/or mini (default both)")
    ap.add_argument("--mode", action="append", choices=("colocated", "fully_async"))
    ap.add_argument("--fault", choices=FAULTS, help="plant a fault in the parallel path (rlbench/rehearse/faults.py)")
    ap.add_argument("--timeout-s", type=int, default=1500)
    args = ap.parse_args(argv)
    names = args.suite
    if args.all:
        names = sorted(p.stem for p in (ROOT / "suites").glob("*.yaml"))
    if not names:
        ap.error("name a suite, or --all")
    fails = 0
    for sid, p, m in runs_for(names, args.profile or list(REHEARSED_PROFILES), args.mode):
        rec = rehearse(sid, p, m, fault=args.fault, timeout_s=args.timeout_s)
        fails += rec["outcome"] != "pass"
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
