"""The `rlbench` command: run a case-study suite, check logs of a run made elsewhere, record golden values.

    rlbench list                                                   # suites, profiles, can each run here?
    rlbench rehearse SUITE --profile full [--mode M]               # that profile on CPU at tiny scale (mechanics)
    rlbench run suites/verl_grpo_qwen3_8b_sglang_gfx950.yaml --profile cpu
    rlbench run verl_dapo_qwen25_math_7b_fully_async_gfx942 --profile cpu --set trainer.total_steps=4
    rlbench check run/metrics.jsonl --suite verl_grpo_qwen3_8b_sglang_gfx950 --profile full --arch gfx950
    rlbench check --suite verl_geo3k_qwen35_35b_a3b_moe_gfx950 --arch gfx950 \\
        --run colocated=coloc/metrics.jsonl --run fully_async=async/metrics.jsonl
    rlbench golden verl_grpo_qwen3_8b_sglang_gfx950 --profile cpu --seeds 3
    rlbench golden SUITE --profile cpu --seeds 8 --extend --band prediction   # more seeds for a recorded file
    rlbench compare runs/a/SUITE/cpu runs/b/SUITE/cpu --out compare.html   # two runs or seed sets side by side
    rlbench compare mlflow:http://host:5000#RUN_A mlflow:http://host:5000#RUN_B    # two runs of an MLflow store
    rlbench selftest                       # planted trainer bugs x the checks that catch them (rlbench/selftest/run.py)

`run` trains the profile's modes and seeds (see rlbench/run/runner.py for the run folder), `check`
reads verl (JSONL or console), Miles or rlbench logs (rlbench/ingest/load.py), `golden` records
per-arch references over seeds (rlbench/checks/golden.py). Each prints one line per check.

`check` also reads a TensorBoard folder and an MLflow run, `mlflow:TRACKING_URI#RUN_ID[/MODE]`
(rlbench/ingest/mlflow_run.py). It guesses the profile from the log's shape when `--profile` is not
given (steps, sequences per step, response cap: rlbench/suites/profile_guess.py) and says what it
guessed; with `--profile` it warns when the log plainly does not have that profile's shape. `--arch` must be a known arch;
for the cpu profile on a CPU-only machine it defaults to cpu (and says so).

Exit status: 0 at least one check was evaluated and every evaluated check passed (the rest
skipped), 1 a check failed, could not be computed, or was not evaluated (the log lacks its
metric or steps), or no check at all was evaluated (the reasons are printed), 2 bad input (one
line `error: ...` on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from rlbench.checks.results import BAD_VERDICTS, CheckResult
from rlbench.run.inputs import (
    check_arch,
    check_out_folder,
    check_profile,
    read_logs,
    validate_arch,
    validate_device,
)
from rlbench.suites.suite import MODE_NAMES, PROFILE_NAMES, Suite, discover_suites, profile_unmet_requirements
from trainer.errors import ConfigError, RLBenchError

_MARK = {"pass": "PASS ", "fail": "FAIL ", "skip": "skip ", "error": "ERROR", "not_evaluated": "N/E  "}
_COUNTED = ("pass", "fail", "error", "not_evaluated", "skip")
_REASON = re.compile(r": (?:SKIP|NOT EVALUATED|ERROR) \((.*)\)$")


# ---------------------------------------------------------------------------- output
def verdict_lines(results: list[CheckResult], seeds: list[int] | None = None) -> list[str]:
    """One line per check: verdict, then the check's own one-line message."""
    lines = []
    for i, r in enumerate(results):
        seed = f"[seed {seeds[i]}] " if seeds is not None and len(set(seeds)) > 1 else ""
        lines.append(f"{_MARK[r.verdict]} {seed}{r.message or r.check_id}")
    return lines


def summary_line(results: list[CheckResult], where: Path | None) -> str:
    counts = {v: sum(r.verdict == v for r in results) for v in _COUNTED}
    text = ", ".join(f"{n} {v.replace('_', ' ')}" for v, n in counts.items() if n)
    return f"{text or 'no checks'}" + (f"; report: {where}" if where else "")


def evaluated(results: list[CheckResult]) -> list[CheckResult]:
    """The results whose check was compared against a number (pass or fail)."""
    return [r for r in results if r.verdict in ("pass", "fail")]


def exit_code(results: list[CheckResult]) -> int:
    """1 when a check failed, errored or was not evaluated, or when no check was evaluated at all."""
    return 1 if any(r.verdict in BAD_VERDICTS for r in results) or not evaluated(results) else 0


def nothing_evaluated_reason(results: list[CheckResult]) -> str:
    """Why no check was evaluated: the most common reasons, counted."""
    reasons: dict[str, int] = {}
    for r in results:
        m = _REASON.search(r.message)
        why = m.group(1) if m else r.verdict
        reasons[why] = reasons.get(why, 0) + 1
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
    return "; ".join(f"{n} x {why}" for why, n in top) or "the suite has no reference for this profile"


def _print_outcome(outcome: Any) -> int:
    """The verdict table of the references that apply to the profile, a summary line; the exit code."""
    results, seeds = outcome.applicable()
    print("\n".join(verdict_lines(results, seeds)))
    other = len(outcome.results) - len(results)
    note = f" ({other} references of other profiles not shown)" if other else ""
    print(summary_line(results, outcome.report) + note)
    if not evaluated(outcome.results):
        print(f"error: no check was evaluated ({nothing_evaluated_reason(results or outcome.results)}); "
              "a validation that compared nothing does not pass", file=sys.stderr)
    return exit_code(outcome.results)


# ---------------------------------------------------------------------------- helpers
def _env(arch: str | None) -> tuple[dict[str, Any], str]:
    """The machine record and the arch to use (`--arch`, checked against the detected one)."""
    from rlbench.run.runner import arch_mismatch
    from trainer.platform.env import collect_env

    env = collect_env()
    detected = str(env.get("arch") or "cpu")
    if arch is not None:
        validate_arch(arch, detected=detected)
    arch = arch or detected
    msg = arch_mismatch(arch, detected, env.get("device_name"))
    if msg:
        raise ConfigError(msg)
    return env, arch


def _run_item(item: str) -> tuple[str, str]:
    """`--run MODE=PATH` as (mode, path)."""
    name, sep, path = item.partition("=")
    if not sep or name not in MODE_NAMES or not path:
        raise ConfigError(f"--run {item!r}: expected MODE=PATH with MODE one of {', '.join(MODE_NAMES)} "
                          "(e.g. --run fully_async=async/metrics.jsonl)")
    return name, path


def _mode_logs(suite: Suite, profile: str, logs: list[str], mode: list[str] | None,
               run: list[str] | None) -> dict[str, Path]:
    """Which log is which mode: `--run mode=path`, else LOGs matched to `--mode` or the profile's modes."""
    prof_modes = suite.profile(profile).modes
    out: dict[str, Path] = {}
    for item in run or []:
        name, path = _run_item(item)
        out[name] = Path(path)
    if logs and run:
        raise ConfigError("give the logs either as LOG arguments or as --run MODE=PATH, not both "
                          "(--run says which mode each log is)")
    if logs:
        modes = mode or (prof_modes if len(logs) == len(prof_modes) else None)
        if modes is None or len(modes) != len(logs):
            raise ConfigError(f"{len(logs)} log(s) for profile {profile} which runs {', '.join(prof_modes)}: "
                              "say which mode each log is with --mode M (one per log) or --run MODE=PATH")
        for m in modes:
            if m not in MODE_NAMES:
                raise ConfigError(f"--mode {m}: choose one of {', '.join(MODE_NAMES)}")
        if len(set(modes)) != len(modes):
            raise ConfigError(f"--mode {' --mode '.join(modes)}: each mode once, one per LOG")
        out = dict(zip(modes, map(Path, logs)))
    for m in out:
        if m not in prof_modes:
            raise ConfigError(f"--mode {m}: profile {profile} of {suite.id} runs {', '.join(prof_modes)} only, so "
                              f"no check reads a {m} log; give the log's real mode, or another --profile")
    if not out:
        raise ConfigError("no logs given: pass LOG (a verl/Miles/rlbench metrics log) or --run MODE=PATH")
    return out


# ---------------------------------------------------------------------------- commands
def _store(args: argparse.Namespace, source: str) -> Any:
    """The results store this command appends to (rlbench/store/target.py), or None."""
    from rlbench.store.target import resolve_target

    return resolve_target(args.store, args.trusted, source)


def _record(target: Any, outcome: Any) -> None:
    from rlbench.run.record import record_outcome

    ids = record_outcome(target, outcome)
    if ids:
        kind = "trusted " if target.trusted else ""
        print(f"[rlbench] results store {target.path}: appended {kind}run(s) {', '.join(map(str, ids))}",
              file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from rlbench.run.runner import find_suite, run_profile

    suite = find_suite(args.suite)
    target = _store(args, "run")
    check_out_folder("--out", args.out, example="runs")
    env, arch = _env(args.arch)
    outcome = run_profile(suite, args.profile, out=args.out, arch=arch, seeds=args.seeds,
                          modes=args.mode, sets=args.set, env=env, store=target.path if target else None)
    _record(target, outcome)
    return _print_outcome(outcome)


def cmd_check(args: argparse.Namespace) -> int:
    from rlbench.checks.coverage import Coverage
    from rlbench.ingest.mlflow_run import is_mlflow_locator
    from rlbench.run.runner import evaluate_runs, find_suite

    suite = find_suite(args.suite)
    target = _store(args, "check")
    if args.arch is not None:
        validate_arch(args.arch, suite)
    if args.device is not None:
        validate_device(args.device, suite)
    if args.out is not None:
        check_out_folder("--out", args.out)
    if args.profile is not None:
        args.arch = check_arch(args, suite, args.profile)
        _mode_logs(suite, args.profile, args.logs, args.mode, args.run)  # bad --run/--mode before any reading
    elif not args.logs and not args.run:
        raise ConfigError("no logs given: pass LOG (a verl/Miles/rlbench metrics log) or --run MODE=PATH")
    for item in args.run or []:
        _run_item(item)
    logs = read_logs(args) if not (args.logs and args.run) else {}
    profile = check_profile(args, suite, logs)
    if args.profile is None:
        args.arch = check_arch(args, suite, profile)
    paths = _mode_logs(suite, profile, args.logs, args.mode, args.run)
    runs = {}
    steps = suite.profile(profile).steps
    names: dict[str, str] = {}  # mode -> the log as shown: its path, or an mlflow:URI#RUN_ID as given
    for mode, given in paths.items():
        key = str(given) if str(given) in logs else next(p for p in logs if Path(p) == given)
        path = names[mode] = key if is_mlflow_locator(key) else str(given)
        log = logs[key]
        for w in log.warnings:
            print(f"warning: {path}: {w}", file=sys.stderr)
        for n in log.notes:
            print(f"note: {path}: {n}", file=sys.stderr)
        span = f"steps {log.first_step}-{log.last_step}"
        print(f"{mode}: {path} ({log.source_format}, {len(log.frame)} steps: {span}, {len(log.frame.columns)} "
              "metrics)", file=sys.stderr)
        cov = Coverage.of(log.frame, steps)
        if cov is not None and cov.note():
            print(f"warning: {path}: {cov.note()}: the checks that read the missing steps are not evaluated",
                  file=sys.stderr)
        runs[mode] = log.frame
    out = Path(args.out) if args.out else Path("runs") / "check" / suite.id / profile
    env = {"arch": args.arch, "device_name": args.device or "", "logs": names}
    coverage = {m: (Coverage.of(f, steps).note() if Coverage.of(f, steps) else "") for m, f in runs.items()}
    prov = {"suite_file": str(suite.path), "profile": profile, "logs": env["logs"],
            "log_coverage": {m: c or "the whole run" for m, c in coverage.items()},
            "command": " ".join(sys.argv)}
    outcome = evaluate_runs(suite, profile, {0: runs}, arch=args.arch, device_name=args.device or "",
                            folder=out, env=env, provenance=prov, report=args.report, ran_modes=list(runs),
                            status=lambda line: print(f"[rlbench] {line}", file=sys.stderr),
                            store=target.path if target else None)
    _record(target, outcome)
    return _print_outcome(outcome)


def cmd_golden(args: argparse.Namespace) -> int:
    from rlbench.checks.golden import (
        DEFAULT_FALSE_ALARM,
        default_dir,
        golden_path,
        golden_refs,
        reband,
        record_golden,
    )
    from rlbench.run.runner import find_suite, provenance, seed_list, train_profile

    suite = find_suite(args.suite)
    refs = golden_refs(suite, args.profile)
    if not refs:
        raise ConfigError(f"{suite.path}: references: no 'golden' reference for profile {args.profile}; "
                          f"add one with kind: golden, profiles: [{args.profile}], stats: [...]")
    env, arch = _env(args.arch)
    out_dir = Path(args.golden_dir) if args.golden_dir else default_dir(suite, refs[0])
    if args.reband and args.extend:
        raise ConfigError("--reband and --extend: --reband re-derives bands without runs, --extend trains new "
                          "seeds and re-derives them too (fix: give one of the two)")
    if args.reband:  # the recorded per-seed values, new bands; no runs
        path = golden_path(suite, args.profile, arch, out_dir)
        if not path.is_file():
            raise ConfigError(f"--reband: {path} does not exist (fix: record it first, without --reband)")
        doc = reband(path, args.band or "max_dev", false_alarm=args.false_alarm or DEFAULT_FALSE_ALARM)
        for key, entry in doc["values"].items():
            print(f"{key}: {entry['mean']:.4g} +- {entry['tol']:.3g} (was +- {entry['tol_before']:.3g})")
        print(f"golden bands of {path} re-derived by rule {args.band or 'max_dev'}")
        return 0
    if args.extend:
        return _golden_extend(args, suite, env, arch, out_dir)
    seeds = seed_list(suite, args.profile, args.seeds or len(suite.profile(args.profile).seeds))
    runs = train_profile(suite, args.profile, args.out, seeds=seeds, sets=args.set)
    prov = provenance(suite, args.profile, seeds, env, args.set)
    prov.update({"arch": arch, "device": env.get("device_name") or "cpu", "versions": env.get("versions"),
                 "python": env.get("python"), "platform": env.get("platform")})
    path = record_golden(suite, args.profile, arch, [runs.frames(s) for s in seeds], prov, out_dir,
                         band=args.band or "max_dev", false_alarm=args.false_alarm or DEFAULT_FALSE_ALARM)
    doc = json.loads(path.read_text())
    for key, entry in doc.get("values", {}).items():
        print(f"{key}: {entry.get('mean'):.4g} +- {entry.get('tol'):.3g}")
    print(f"golden values for {suite.id} [{args.profile}] on {arch} over seeds {seeds}: {path}")
    return 0


def _golden_extend(args: argparse.Namespace, suite: Suite, env: dict[str, Any], arch: str, out_dir: Path) -> int:
    """`rlbench golden --extend`: train the seeds the file lacks, and its first recorded seed again as a witness
    that the code path has not changed (rlbench/checks/golden.py: extend_golden)."""
    from rlbench.checks.golden import DEFAULT_FALSE_ALARM, extend_golden, golden_path, witness_drift
    from rlbench.run.runner import provenance, seed_list, train_profile

    path = golden_path(suite, args.profile, arch, out_dir)
    if not path.is_file():
        raise ConfigError(f"--extend: {path} does not exist (fix: record it first, without --extend)")
    recorded_doc = json.loads(path.read_text())
    recorded_prov = recorded_doc.get("provenance", {})
    band = recorded_doc.get("band", {"rule": "max_dev"})  # the file's own rule, unless --band / --false-alarm
    band = {"rule": args.band or band["rule"], "false_alarm": args.false_alarm or band.get("false_alarm")}
    recorded = list(recorded_prov.get("seeds") or [])
    if not recorded:
        raise ConfigError(f"--extend: {path}: provenance.seeds is empty; re-record it without --extend")
    if list(recorded_prov.get("overrides") or []) != list(args.set):
        raise ConfigError(f"--extend: {path} was recorded with --set {recorded_prov.get('overrides') or '(none)'}, "
                          f"this call gives {args.set or '(none)'} (fix: the same --set options, in order)")
    if not args.seeds:
        raise ConfigError(f"--extend: give --seeds N, the number of seeds the file should hold (has {len(recorded)})")
    new = [s for s in seed_list(suite, args.profile, args.seeds) if s not in recorded]
    if not new:
        raise ConfigError(f"--extend --seeds {args.seeds}: {path} holds seeds {recorded} already "
                          "(fix: a larger --seeds)")
    witness = recorded[0]  # trained first: a changed code path stops the extension before the new seeds train
    wruns = train_profile(suite, args.profile, Path(args.out) / "witness", seeds=[witness], sets=args.set)
    witness_drift(path, json.loads(path.read_text()), suite, args.profile, witness, wruns.frames(witness))
    runs = train_profile(suite, args.profile, args.out, seeds=new, sets=args.set)
    prov = provenance(suite, args.profile, new, env, args.set)
    prov.update({"arch": arch, "device": env.get("device_name") or "cpu", "versions": env.get("versions"),
                 "python": env.get("python"), "platform": env.get("platform")})
    doc = extend_golden(path, suite, args.profile, (witness, wruns.frames(witness)),
                        {s: runs.frames(s) for s in new}, prov, band=band["rule"],
                        false_alarm=band["false_alarm"] or DEFAULT_FALSE_ALARM)
    for key, entry in doc["values"].items():
        print(f"{key}: {entry['mean']:.4g} +- {entry['tol']:.3g} (was +- {entry['tol_before']:.3g})")
    print(f"golden values of {path}: seeds {doc['provenance']['seeds']} (witness seed {witness} agreed within "
          f"{doc['provenance']['recordings'][-1]['witness_max_drift_of_band']:.2%} of its bands)")
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    from rlbench.run.runner import find_suite
    from rlbench.selftest.run import exit_code, markdown, run_selftest

    if args.random is not None:
        from rlbench.selftest import random_mutants

        res = random_mutants.run_random(find_suite(args.suite), args.profile, num=args.random, seed=args.random_seed,
                                        work=args.work, out=args.out, sets=args.set)
        print(random_mutants.markdown(res))
        return 0
    seeds = [int(x) for x in args.clean_seeds.split(",")] if args.clean_seeds else None
    result = run_selftest(find_suite(args.suite), args.profile, mutations=args.mutations.split(",") if args.mutations else None,
                          clean_seeds=seeds, mutation_seed=args.mutation_seed, steps=args.steps or None,
                          work=args.work, out=args.out,
                          tiny=args.tiny, sets=args.set, rev=args.rev, evaluate_only=args.evaluate_only)
    print(markdown(result))
    return exit_code(result)


def cmd_compare(args: argparse.Namespace) -> int:
    from rlbench.report.compare import compare_sides, load_side, render_compare, side_name, text_table
    from rlbench.run.runner import find_suite

    suite = find_suite(args.suite) if args.suite else None
    if suite is not None and args.profile is None:
        raise ConfigError("--suite given without --profile: say which profile the logs ran (e.g. --profile mini)")
    for arch in (args.arch, args.arch_b):
        if arch is not None:
            validate_arch(arch, suite)
    if (args.arch_b is not None or args.device_b is not None) and suite is None:
        raise ConfigError("--arch-b/--device-b given without --suite: they say what side B's logs ran on, which "
                          "only matters when the logs are checked against a suite here")
    arch_a, device_a = args.arch or "cpu", args.device or ""
    a = load_side(args.a, args.label_a or side_name(args.a), suite=suite, profile=args.profile, arch=arch_a,
                  device=device_a)
    b = load_side(args.b, args.label_b or side_name(args.b), suite=suite, profile=args.profile,
                  arch=args.arch_b or arch_a, device=device_a if args.device_b is None else args.device_b)
    rows = compare_sides(a, b)
    print(text_table(a, b, rows))
    out = render_compare(args.out, a, b, rows, title=f"rlbench compare: {a.name} vs {b.name}")
    print(f"compare page: {out}")
    return 0


def cmd_rehearse(args: argparse.Namespace) -> int:
    from rlbench.rehearse.run import main as rehearse_main

    argv = [*args.suite] + (["--all"] if args.all else []) + [f"--profile={p}" for p in args.profile or []] + \
        [f"--mode={m}" for m in args.mode or []] + ([f"--fault={args.fault}"] if args.fault else []) + \
        [f"--timeout-s={args.timeout_s}"]
    return rehearse_main(argv)


def cmd_list(args: argparse.Namespace) -> int:
    from rlbench.rehearse.run import rehearsal_status
    from rlbench.run.runner import PROJECT_ROOT, machine_info

    directory = Path(args.suites_dir) if args.suites_dir else (
        Path("suites") if Path("suites").is_dir() else PROJECT_ROOT / "suites")
    if args.arch is not None:
        from rlbench.run.inputs import detected_arch

        validate_arch(args.arch, detected=detected_arch())
    info = machine_info(args.arch)
    print(f"machine: arch {info['arch']}, {info['num_gpus']} GPU(s), device {info['device_name'] or '-'}")
    for suite in discover_suites(directory):
        print(f"{suite.id}  ({suite.path})")
        for pname in suite.profile_names():
            prof = suite.profile(pname)
            unmet = profile_unmet_requirements(suite, pname, info)
            stops = rehearsal_status(suite.id, pname)  # lines recorded by `rlbench rehearse`, never by hand
            lines = (["cannot run here: " + "; ".join(unmet)] if unmet else []) + stops
            can = "; ".join(lines) or "runs here"
            print(f"  {pname:8} {'+'.join(prof.modes):22} {prof.steps:4} steps  {can}")
    return 0


# ---------------------------------------------------------------------------- parser
def store_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--store", metavar="PATH|URI", help="append the run to this results store (a SQLite file, or "
                    "an MLflow server: mlflow:URI or http(s)://..., #experiment=NAME; default: $RLBENCH_STORE, "
                    "else none); history references read its trusted runs")
    sp.add_argument("--trusted", action="store_true", help="mark the run trusted: a baseline for history "
                    "references (e.g. nightly on main; also RLBENCH_TRUSTED=1)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlbench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def common_run(sp: argparse.ArgumentParser, default_profile: str | None) -> None:
        sp.add_argument("suite", help="suite file (suites/<id>.yaml) or suite id")
        sp.add_argument("--profile", choices=PROFILE_NAMES, required=default_profile is None,
                        default=default_profile, help="full | mini | cpu | cpu-vllm | cpu-vlm (where the suite defines it)")
        sp.add_argument("--arch", help="arch to run and check as (default: detected; cpu = CPU only)")
        sp.add_argument("--out", default="runs", help="runs go to OUT/<suite>/<profile>/ (default: runs)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="trainer override applied to every run, e.g. trainer.total_steps=4 (repeatable)")

    r = sub.add_parser("run", help="train a suite profile and check it")
    common_run(r, None)
    r.add_argument("--seeds", type=int, help="number of seeds (the profile's first N; default 1)")
    r.add_argument("--mode", action="append", choices=MODE_NAMES, help="run only this mode (repeatable)")
    store_options(r)
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("check", help="check logs of a run made elsewhere (verl, Miles, rlbench)")
    c.add_argument("logs", nargs="*", metavar="LOG", help="metrics log(s), or an MLflow run "
                   "mlflow:TRACKING_URI#RUN_ID[/MODE]; see --mode / --run")
    c.add_argument("--suite", required=True, help="suite file or id")
    c.add_argument("--profile", choices=PROFILE_NAMES,
                   help="profile the logs ran (default: guessed from the log's shape, else full)")
    c.add_argument("--arch", help="arch the run ran on (default for full: the published arch; for cpu on a "
                                  "CPU-only machine: cpu)")
    c.add_argument("--device", help="board the run ran on, e.g. MI300X (device-scoped checks need it)")
    c.add_argument("--mode", action="append", choices=MODE_NAMES, help="mode of each LOG, in order")
    c.add_argument("--run", action="append", metavar="MODE=PATH", help="a log and its mode (repeatable)")
    c.add_argument("--format", default="auto", help="log format (default: detected)")
    c.add_argument("--reward-is-accuracy", action="store_true",
                   help="rewards are 0/1 per sample: read val-core/<ds>/reward/mean@N as the accuracy too")
    c.add_argument("--out", help="folder for checks.json and report.html (default runs/check/<suite>/<profile>)")
    c.add_argument("--report", help="report path (default: OUT/report.html)")
    store_options(c)
    c.set_defaults(func=cmd_check)

    g = sub.add_parser("golden", help="record golden values of a mini/cpu profile over seeds")
    common_run(g, "cpu")
    g.add_argument("--seeds", type=int, help="number of seeds (default: the profile's seeds)")
    g.add_argument("--golden-dir", help="where golden files go (default: the reference's golden_dir)")
    g.add_argument("--band", choices=["max_dev", "prediction"], help=(
        "band rule: max_dev (3x the largest seed deviation; the default) or prediction (a prediction interval for "
        "one new run at --false-alarm over the file's statistics); with --extend, the file's rule by default; "
        "rlbench/checks/golden.py"))
    g.add_argument("--false-alarm", type=float, help=(
        "band prediction: the chance that a clean run fails any statistic of the file (default 0.05; with "
        "--extend, the file's)"))
    g.add_argument("--reband", action="store_true",
                   help="re-derive the recorded file's bands from its per-seed values by --band; no runs")
    g.add_argument("--extend", action="store_true", help=(
        "add seeds to the recorded file up to --seeds N: trains the seeds it lacks, and its first seed again as "
        "a witness that must match its recorded values (else nothing is written)"))
    g.set_defaults(func=cmd_golden)

    st = sub.add_parser("selftest", help="plant known bugs in a copy of the trainer; which checks catch them")
    st.add_argument("suite", nargs="?", default="verl_grpo_qwen3_8b_sglang_gfx950", help="a colocated suite")
    st.add_argument("--profile", choices=PROFILE_NAMES, default="cpu", help="profile to run (default cpu)")
    st.add_argument("--mutations", help="comma-separated names from rlbench/selftest/mutations.py, or all (default: "
                    "all but the known blind spots)")
    st.add_argument("--clean-seeds", help="comma-separated seeds of the clean runs (default 5,6,7)")
    st.add_argument("--mutation-seed", type=int, default=0, help="seed of the mutated runs (default 0)")
    st.add_argument("--steps", type=int, default=1, help="train the first N steps, check what they settle "
                    "(default 1; 0: the whole profile, every check)")
    st.add_argument("--tiny", action="store_true", help="tiny random-init model, mechanics checks only")
    st.add_argument("--set", action="append", metavar="KEY=VALUE", default=[], help="trainer override (repeatable)")
    st.add_argument("--rev", help="mutate the trainer of this git commit (default: the working tree's)")
    st.add_argument("--evaluate-only", action="store_true", help="train nothing; re-check the runs in --work")
    st.add_argument("--random", type=int, metavar="N", help="instead of the named mutations: N mutants drawn from "
                    "the trainer's code with ast operators, each on a tiny model for one step (rlbench/selftest/"
                    "random_mutants.py); prints the mutation score")
    st.add_argument("--random-seed", type=int, default=0, help="seed of the --random draw (default 0)")
    st.add_argument("--work", default="runs/selftest", help="run folders (default runs/selftest)")
    st.add_argument("--out", default="reports/selftest", help="table .md and .json (default reports/selftest)")
    st.set_defaults(func=cmd_selftest)

    cp = sub.add_parser("compare", help="two runs or two seed sets side by side (rlbench/report/compare.py)")
    cp.add_argument("a", metavar="A", help="run folder (checks.json), folder of logs, or folder of those (seeds); "
                    "or an MLflow run the results store wrote: mlflow:TRACKING_URI#RUN_ID[,RUN_ID...][/MODE]")
    cp.add_argument("b", metavar="B", help="the same for the other side")
    cp.add_argument("--suite", help="suite to check log folders against (folders with checks.json need none)")
    cp.add_argument("--profile", choices=PROFILE_NAMES, help="with --suite: the profile the logs ran")
    cp.add_argument("--arch", help="with --suite: the arch the logs ran on (default cpu)")
    cp.add_argument("--device", help="with --suite: the board the logs ran on, e.g. MI300X")
    cp.add_argument("--arch-b", help="with --suite: side B's arch when it differs from A's (default: --arch), e.g. "
                    "gfx942 against gfx950; each side's logs are checked against its own arch's references")
    cp.add_argument("--device-b", help="with --suite: side B's board when it differs from A's (default: --device), "
                    "e.g. --device MI300X --device-b H20")
    cp.add_argument("--label-a", help="name of side A (default: its folder name)")
    cp.add_argument("--label-b", help="name of side B (default: its folder name)")
    cp.add_argument("--out", default="compare.html", help="the HTML page (default compare.html)")
    cp.set_defaults(func=cmd_compare)

    rh = sub.add_parser("rehearse", help="run a full/mini profile on CPU at tiny scale; verdict on mechanics "
                        "(rlbench/rehearse/)")
    rh.add_argument("suite", nargs="*", help="suite ids or files (none with --all)")
    rh.add_argument("--all", action="store_true", help="every suite in suites/")
    rh.add_argument("--profile", action="append", choices=("full", "mini"), help="full and/or mini (default both)")
    rh.add_argument("--mode", action="append", choices=MODE_NAMES, help="only this mode (repeatable)")
    rh.add_argument("--fault", choices=("tp_shard",), help="plant a fault in the parallel path (rlbench/rehearse/faults.py)")
    rh.add_argument("--timeout-s", type=int, default=1500, help="per rehearsal (default 1500)")
    rh.set_defaults(func=cmd_rehearse)

    ls = sub.add_parser("list", help="suites, profiles, and whether each can run here")
    ls.add_argument("--arch", help="see the machine as this arch (default: detected)")
    ls.add_argument("--suites-dir", help="folder of suite files (default: ./suites or the project's)")
    ls.set_defaults(func=cmd_list)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except RLBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
