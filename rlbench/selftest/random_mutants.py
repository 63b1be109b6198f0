"""`rlbench selftest --random N`: mutants drawn from the trainer's own code, each trained and checked.

    rlbench selftest --random 40 --random-seed 0        # 40 mutants, the GRPO suite's cpu checks, tiny model

Operators (Python's `ast`, in the spirit of mutmut's and cosmic-ray's operator sets; neither fits here:
both drive a test command per mutant over a whole package and own the scratch copy, while a mutant here
is one training run in a scratch copy of `trainer/` whose metrics are compared with a clean run's):

| operator | example |
|---|---|
| `binop` | `a + b` -> `a - b`, `*` <-> `/`, `//` -> `/`, `**` -> `*` |
| `compare` | `<` <-> `<=`, `>` <-> `>=`, `==` <-> `!=`, `is` <-> `is not`, `in` <-> `not in` |
| `boolop` | `and` <-> `or` |
| `not` | `not x` -> `x` |
| `constant` | an int `k` -> `k + 1`, a float `x` -> `x * 2` (0.0 -> 1.0), `True` <-> `False` |
| `drop` | a statement (an assignment, an augmented assignment or a call) -> `pass` |

Sites: every such node inside the functions `TARGETS` names (the algorithms, the actor's update and loss,
the optimizer step, the rollout's sampling and stopping, the data sampler, the rewards, the step's
scoring); docstrings, logging and error messages are left out. The draw is `random.Random(seed).sample`
over the sites in file and line order, so one seed names one sample.

Each mutant is the file with one node's source segment replaced by its mutated `ast.unparse`, in a scratch
copy of the trainer; it trains the selftest profile (`TINY_SETS`: a random 2-layer model of SmolLM2's
architecture, `tiny:llama`, one step of 4 prompts in 2 mini-batches), and the suite's checks that hold for
any model (`TINY_METRICS` and the mechanics invariants) are evaluated on its log. A mutant is

- *killed* when a check fails or cannot be computed on it, or the run crashes or times out (reported apart),
- *equivalent* when every logged number (timings and throughput aside) is bit-identical to the clean run's,
- *survived* otherwise (listed with the metrics it moved).

Mutation score = killed / (mutants - equivalent). Two clean runs must log the same numbers (else the
tool stops: equivalence would mean nothing). Result: `reports/selftest/<suite>.<profile>.random<N>.seed<S>.{md,json}`.
"""

from __future__ import annotations

import ast
import datetime as _dt
import json
import os
import random
import shutil
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
from rlbench.run.runner import resolved_config
from rlbench.selftest.mutations import TRAINER_DIR
from rlbench.selftest.run import TINY_METRICS
from rlbench.suites.suite import Suite
from trainer.errors import ConfigError

# The functions mutants are drawn from, per file of the trainer package ("Class.method" or a function).
TARGETS: dict[str, tuple[str, ...]] = {
    "algorithms/advantages.py": ("group_mean_std", "compute_grpo_advantages", "compute_advantages", "scores_to_token_rewards"),
    "algorithms/policy_loss.py": ("compute_policy_loss",),
    "algorithms/kl.py": ("_kl_forward", "kl_penalty"),
    "algorithms/aggregation.py": ("agg_loss", "masked_sum", "masked_mean", "global_counts"),
    "backends/actor.py": ("Actor.update", "Actor.micro_batch_loss", "Actor.forward_backward", "Actor.finish_grads_and_clip",
                          "Actor.__init__", "token_share"),
    "rollout/hf.py": ("HFRolloutEngine.decode_rows", "sample_next"),
    "data/sampler.py": ("EpochSampler.next_indices", "EpochSampler.order"),
    "rewards/arithmetic.py": ("extract_answer", "compute_score", "_as_decimal"),
    "modes/steps.py": ("score", "generate", "sampling_params"),
    "components/batch.py": ("batch_from_rollout",),
    "ops/logprobs.py": ("response_logprobs",),
}
RANDOM_METRICS = TINY_METRICS  # the checks a tiny model can judge (the mechanics invariants among them)
RANDOM_SETS = ("model.path=tiny:llama", "model.dtype=float32", "actor.entropy_coeff=0.01", "trainer.total_steps=1",
               "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "trainer.num_threads=1")
_VOLATILE = ("timing_s/", "perf/")  # wall-clock numbers: never part of the equivalence test
_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
          ast.Pow: ast.Mult, ast.Mod: ast.FloorDiv}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
        ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}


@dataclass(frozen=True)
class Mutant:
    file: str
    func: str
    line: int
    col: int  # character offset of the node in its line
    op: str
    before: str  # the node's source
    after: str  # its replacement

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}:{self.col}:{self.op}"


def _functions(tree: ast.Module, names: tuple[str, ...]) -> list[tuple[str, ast.AST]]:
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            out.append((node.name, node))
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and f"{node.name}.{sub.name}" in names:
                    out.append((f"{node.name}.{sub.name}", sub))
    return out


def _skip(node: ast.AST) -> bool:
    """Nodes whose mutants only change messages: raise / log / assert statements and f-strings."""
    return isinstance(node, (ast.Raise, ast.Assert, ast.JoinedStr)) or (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))


def _walk(node: ast.AST):
    """ast.walk without descending into message-only nodes."""
    todo = [node]
    while todo:
        n = todo.pop(0)
        if _skip(n):
            continue
        yield n
        todo.extend(ast.iter_child_nodes(n))


def _node_mutants(node: ast.AST) -> list[tuple[str, ast.AST]]:
    import copy

    out: list[tuple[str, ast.AST]] = []
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
        m = copy.deepcopy(node)
        m.op = _BINOP[type(node.op)]()
        out.append(("binop", m))
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        m = copy.deepcopy(node)
        m.ops = [_CMP[type(node.ops[0])]()]
        out.append(("compare", m))
    elif isinstance(node, ast.BoolOp):
        m = copy.deepcopy(node)
        m.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(("boolop", m))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not", copy.deepcopy(node.operand)))
    elif isinstance(node, ast.Constant) and not isinstance(node.value, str):
        v = node.value
        if isinstance(v, bool):
            out.append(("constant", ast.Constant(not v)))
        elif isinstance(v, int):
            out.append(("constant", ast.Constant(v + 1)))
        elif isinstance(v, float):
            out.append(("constant", ast.Constant(v * 2 if v else 1.0)))
    return out


def enumerate_mutants(trainer_dir: Path = TRAINER_DIR, targets: dict[str, tuple[str, ...]] = TARGETS) -> list[Mutant]:
    """Every mutant of the target functions, in file and source order."""
    out: list[Mutant] = []
    for rel, names in targets.items():
        path = trainer_dir / rel
        if not path.is_file():
            raise ConfigError(f"selftest --random: trainer/{rel} does not exist; update TARGETS in rlbench/selftest/random_mutants.py")
        text = path.read_text()
        tree = ast.parse(text)
        found = _functions(tree, names)
        missing = set(names) - {n for n, _ in found}
        if missing:
            raise ConfigError(f"selftest --random: trainer/{rel} has no {', '.join(sorted(missing))}; update TARGETS "
                              "in rlbench/selftest/random_mutants.py")
        for fname, fn in found:
            for stmt in fn.body:
                for node in _walk(stmt):
                    if getattr(node, "lineno", None) is None:
                        continue
                    seg = ast.get_source_segment(text, node)
                    if seg is None:
                        continue
                    for op, new in _node_mutants(node):
                        out.append(Mutant(rel, fname, node.lineno, _col(text, node), op, seg, f"({ast.unparse(new)})"))
                    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or (
                            isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
                        out.append(Mutant(rel, fname, node.lineno, _col(text, node), "drop", seg,
                                          "pass" + "\n" * seg.count("\n")))
    return out


def _col(text: str, node: ast.AST) -> int:
    """The node's column in characters (ast gives UTF-8 bytes)."""
    line = text.splitlines()[node.lineno - 1]
    return len(line.encode()[: node.col_offset].decode())


def apply_mutant(m: Mutant, root: Path) -> None:
    """Replace the mutant's node in `root/trainer/<file>` (checked: its source is still there)."""
    path = root / "trainer" / m.file
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    at = sum(len(x) for x in lines[: m.line - 1]) + m.col
    if text[at:at + len(m.before)] != m.before:
        raise ConfigError(f"mutant {m.id}: its source is not at trainer/{m.file} line {m.line} any more")
    path.write_text(text[:at] + m.after + text[at + len(m.before):])


@dataclass
class Outcome:
    mutant: Mutant | None
    status: str = ""  # killed | killed-crash | killed-timeout | equivalent | survived | clean
    failed: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    message: str = ""
    wall_s: float = 0.0


def _numbers(path: Path) -> dict[tuple[int, str], Any]:
    out = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        for k, v in d["data"].items():
            if not k.startswith(_VOLATILE):
                out[(d["step"], k)] = v
    return out


def _run(cfg: dict[str, Any], folder: Path, mutant: Mutant | None, timeout_s: float, trainer_dir: Path = TRAINER_DIR
         ) -> tuple[int | None, float]:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**cfg, "trainer": {**cfg["trainer"], "out_dir": str(folder.resolve()), "progress": False}}
    with tempfile.TemporaryDirectory(prefix="rlbench-random-") as tmp:
        root = Path(tmp)
        shutil.copytree(trainer_dir, root / "trainer", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if mutant is not None:
            apply_mutant(mutant, root)
        (root / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        code = ("import sys, trainer; from pathlib import Path; "
                f"assert Path(trainer.__file__).resolve().is_relative_to(Path({str(root.resolve())!r})), trainer.__file__; "
                "from trainer.__main__ import main; sys.exit(main(['config.yaml']))")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        t0 = time.perf_counter()
        with open(folder / "train.log", "w") as log:
            try:
                rc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, timeout=timeout_s, check=False).returncode
            except subprocess.TimeoutExpired:
                rc = None
        return rc, time.perf_counter() - t0


def _verdicts(suite: Suite, profile: str, path: Path, engine: str) -> tuple[list[str], dict[str, str]]:
    frame = load_metrics(path).frame
    failed, msgs = [], {}
    for r in evaluate(suite, profile, {"colocated": frame}, arch="cpu", device_name="cpu", steps=1,
                      engines={"colocated": engine}):
        if r.metric not in RANDOM_METRICS or r.verdict in ("pass", "skip"):
            continue
        failed.append(r.check_id)
        msgs[r.check_id] = r.message
    return sorted(failed), msgs


def run_random(suite: Suite, profile: str = "cpu", *, num: int, seed: int = 0, work: str | Path = "runs/selftest",
               out: str | Path | None = "reports/selftest", sets: list[str] | None = None, timeout_s: float = 180.0,
               trainer_dir: Path = TRAINER_DIR,
               status=lambda line: print(f"[selftest --random] {line}", file=sys.stderr, flush=True)) -> dict[str, Any]:
    from rlbench.selftest.run import prefix_checks

    prof = suite.profile(profile)
    if prof.modes != ["colocated"] and "colocated" not in prof.modes:
        raise ConfigError(f"selftest --random: {suite.id} profile {profile} has no colocated mode")
    sites = enumerate_mutants(trainer_dir)
    if not 1 <= num <= len(sites):
        raise ConfigError(f"--random {num}: give 1..{len(sites)} (the mutants of the target functions)")
    drawn = random.Random(seed).sample(sites, num)
    sets = [*RANDOM_SETS, *(sets or [])]
    checked = prefix_checks(suite, 1)
    tag = f"{suite.id}.{profile}.random{num}.seed{seed}"
    work = Path(work) / tag
    cfg = resolved_config(suite, profile, "colocated", 0, work / "clean0", sets)
    engine = str((cfg.get("rollout") or {}).get("engine") or "hf")
    t0 = time.perf_counter()
    clean = []
    for i in range(2):
        rc, wall = _run(cfg, work / f"clean{i}", None, timeout_s, trainer_dir)
        if rc != 0:
            raise ConfigError(f"selftest --random: the clean run failed (exit {rc}); see {work / f'clean{i}' / 'train.log'}")
        clean.append(_numbers(work / f"clean{i}" / "metrics.jsonl"))
        status(f"clean run {i}: {wall:.0f} s")
    if clean[0] != clean[1]:
        diff = sorted({k for k in clean[0].keys() | clean[1].keys() if clean[0].get(k) != clean[1].get(k)})
        raise ConfigError(f"selftest --random: two clean runs logged different numbers ({diff[:5]}): equivalence "
                          "cannot be judged on this machine")
    clean_failed, _ = _verdicts(checked, profile, work / "clean0" / "metrics.jsonl", engine)
    if clean_failed:
        raise ConfigError(f"selftest --random: checks fail on the clean run: {', '.join(clean_failed)}")
    outcomes: list[Outcome] = []
    for k, m in enumerate(drawn):
        folder = work / f"m{k:03d}"
        o = Outcome(m)
        rc, o.wall_s = _run(cfg, folder, m, timeout_s, trainer_dir)
        log = folder / "metrics.jsonl"
        if rc is None:
            o.status = "killed-timeout"
        elif rc != 0:
            o.status = "killed-crash"
            o.message = " | ".join((folder / "train.log").read_text().strip().splitlines()[-2:])[:200]
        else:
            nums = _numbers(log) if log.is_file() else {}
            o.moved = sorted({k2 for (_, k2) in nums.keys() | clean[0].keys()
                              if nums.get((_, k2)) != clean[0].get((_, k2))})
            o.failed, msgs = _verdicts(checked, profile, log, engine)
            o.status = "killed" if o.failed else ("equivalent" if nums == clean[0] else "survived")
            o.message = "; ".join(msgs.values())[:200]
        outcomes.append(o)
        status(f"{k + 1}/{num} {m.id} {m.before[:40]!r} -> {m.after[:40]!r}: {o.status} "
               f"{', '.join(o.failed) if o.failed else ''} ({o.wall_s:.0f} s)")
    result = summarize(suite, profile, outcomes, seed=seed, num=num, sites=len(sites), sets=sets,
                       wall_s=time.perf_counter() - t0)
    if out is not None:
        outp = Path(out)
        outp.mkdir(parents=True, exist_ok=True)
        (outp / f"{tag}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        (outp / f"{tag}.md").write_text(markdown(result))
    return result


def summarize(suite: Suite, profile: str, outcomes: list[Outcome], *, seed: int, num: int, sites: int,
              sets: list[str], wall_s: float) -> dict[str, Any]:
    from trainer.platform.env import collect_env

    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    killed = sum(v for k, v in counts.items() if k.startswith("killed"))
    equivalent = counts.get("equivalent", 0)
    live = len(outcomes) - equivalent
    env = collect_env()
    return {
        "suite": suite.id, "profile": profile, "seed": seed, "drawn": num, "sites": sites, "sets": sets,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"hostname": env.get("hostname"), "platform": env.get("platform"), "cpu_count": os.cpu_count()},
        "versions": env.get("versions"), "python": env.get("python"), "git": env.get("git"),
        "checks_metrics": sorted(RANDOM_METRICS),
        "summary": {"mutants": len(outcomes), "killed": killed, "equivalent": equivalent,
                    "survived": counts.get("survived", 0), "by_status": counts,
                    "score": killed / live if live else float("nan")},
        "mutants": [{"id": o.mutant.id, "func": o.mutant.func, "op": o.mutant.op, "before": o.mutant.before,
                     "after": o.mutant.after, "status": o.status, "caught_by": o.failed, "moved": o.moved[:12],
                     "message": o.message, "wall_s": round(o.wall_s, 1)} for o in outcomes],
        "wall_s": round(wall_s, 1),
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    git = result.get("git") or {}
    v = result.get("versions") or {}
    lines = [
        f"# rlbench selftest --random {result['drawn']} (seed {result['seed']}): {result['suite']} [{result['profile']}]",
        "",
        (f"Mutation score {s['killed']} / {s['mutants'] - s['equivalent']} = {s['score']:.0%} of the non-equivalent "
         f"mutants killed; {s['equivalent']} equivalent (every logged number bit-identical to the clean run), "
         f"{s['survived']} survived. Statuses: " + ", ".join(f"{k} {n}" for k, n in sorted(s["by_status"].items())) + "."),
        "",
        (f"Drawn with `random.Random({result['seed']}).sample` from {result['sites']} sites. Machine: "
         f"{result['machine']['hostname']}, {result['machine']['cpu_count']} CPUs; torch {v.get('torch')}; commit "
         f"{str(git.get('commit'))[:10]}{' (dirty)' if git.get('dirty') else ''}; {result['date']}; "
         f"{result['wall_s'] / 60:.1f} min. Overrides: {' '.join(result['sets'])}."),
        "",
        "| mutant | function | change | status | caught by / metrics moved | s |",
        "|---|---|---|---|---|---|",
    ]
    for m in result["mutants"]:
        change = f"`{m['before'][:50]}` -> `{m['after'][:50]}`".replace("|", "\\|").replace("\n", " ")
        by = ", ".join(f"`{c}`" for c in m["caught_by"]) if m["caught_by"] else (
            m["message"][:80] if m["status"].startswith("killed-") else ", ".join(m["moved"][:4]))
        lines.append(f"| {m['id']} | {m['func']} | {change} | {m['status']} | {by.replace('|', '/')} | {m['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"
