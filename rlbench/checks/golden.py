"""Golden values: per-arch statistics this project recorded for the mini and cpu profiles.

Published numbers exist only for the full-scale runs. For the scaled-down profiles the
project records its own references, the way Megatron-LM's functional tests keep
`golden_values_{env}_{platform}.json`: run the profile over N seeds, compute each statistic a
suite's `golden` reference lists (see `GoldenStat` in rlbench/suites/suite.py) on every seed, and store

    mean_i  = (1/N) sum_s x_{i,s}
    tol_i   = max(safety_factor * max_s |x_{i,s} - mean_i|, floor_abs, floor_rel * |mean_i|)

in `reports/golden/<suite_id>.<profile>.<arch>.json` with the provenance the caller passes
(machine, versions, seeds, commit, date). The floor keeps a tolerance when all seeds agree
(e.g. a single seed, or a deterministic statistic). A later run passes a golden check when
each statistic lies within mean +- tol. Golden values are per arch, so keep device-bound
statistics (step time, throughput) out of them unless the file is only ever used on one board.

The rule above (`band: max_dev`, Megatron-LM's, with a factor 3) states no false-alarm rate. The other rule,
`band: prediction`, sets the band for a stated one: the two-sided prediction interval for one new run,

    tol_i = t_{1 - a/2, N-1} * s_i * sqrt(1 + 1/N),    a = false_alarm / K,

with s_i the seeds' sample standard deviation, N seeds and K statistics in the file (Bonferroni: the chance
that a clean run fails any of the K is at most `false_alarm`), assuming each statistic is normal over seeds.
`implied_false_alarm` reads any band the other way: the per-check rate a tolerance gives under the same
assumption. With 3 seeds t is large (t_{0.9917, 2} = 7.6 at K = 3, 5%): few seeds buy either wide bands or
frequent false alarms, and `python -m rlbench.checks.bands` tabulates both for every recorded file
(reports/golden/BANDS.md). `rlbench golden ... --reband` re-derives a file's bands from its recorded per-seed
values, without new runs.

    path = record_golden(suite, "cpu", "cpu", [runs_seed0, runs_seed1, runs_seed2],
                         {"machine": ..., "commit": ..., "date": ...}, "reports/golden")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlbench.checks.metric import check_metric, compute_stat, missing_metric, skipped, stat_label
from rlbench.checks.results import CheckResult
from rlbench.suites.suite import GoldenStat, Reference, Suite
from trainer.errors import ConfigError, DataError

DEFAULT_SAFETY_FACTOR = 3.0
DEFAULT_FLOOR_ABS = 1e-6
DEFAULT_FLOOR_REL = 0.01
DEFAULT_FALSE_ALARM = 0.05  # band: prediction; for the whole file (all its statistics together)
BANDS = ("max_dev", "prediction")


def band_doc(band: str, false_alarm: float = DEFAULT_FALSE_ALARM) -> dict[str, Any]:
    """The `band` entry of a golden file (its rule, and the rate a prediction band is set for); ConfigError for
    a rule that is not one of BANDS."""
    if band not in BANDS:
        raise ConfigError(f"band={band!r}: not a band rule (fix: one of {', '.join(BANDS)})")
    return {"rule": band, **({"false_alarm": false_alarm} if band == "prediction" else {})}


def band_tolerance(per_seed: list[float], band: str, *, num_stats: int, safety_factor: float = DEFAULT_SAFETY_FACTOR,
                   false_alarm: float = DEFAULT_FALSE_ALARM, floor_abs: float = DEFAULT_FLOOR_ABS,
                   floor_rel: float = DEFAULT_FLOOR_REL) -> float:
    """The half-width of one statistic's band by rule `band` (module docstring), floors applied."""
    if not 0 < false_alarm < 1:
        raise ConfigError(f"false_alarm={false_alarm}: a probability, between 0 and 1 (fix: e.g. 0.05)")
    x = np.asarray(per_seed, dtype=float)  # [N]
    mean = float(x.mean())
    if band == "max_dev":
        width = safety_factor * float(np.abs(x - mean).max())
    elif band == "prediction":
        if len(x) < 2:
            raise DataError(f"band: prediction needs at least 2 seeds to estimate a spread (got {len(x)}); record "
                            "more seeds, or use band: max_dev")
        from scipy import stats

        a = false_alarm / num_stats
        width = float(stats.t.ppf(1 - a / 2, len(x) - 1) * x.std(ddof=1) * np.sqrt(1 + 1 / len(x)))
    else:
        band_doc(band)  # raises: not a band rule
    return max(width, floor_abs, floor_rel * abs(mean))


def implied_false_alarm(per_seed: list[float], tol: float) -> float:
    """The chance that one clean new run falls outside mean +- tol, if the statistic is normal over seeds with
    the seeds' mean and sample standard deviation (Student t with N-1 degrees of freedom); NaN under 2 seeds,
    0 when the seeds agree exactly."""
    from scipy import stats

    x = np.asarray(per_seed, dtype=float)
    if len(x) < 2:
        return float("nan")
    scale = x.std(ddof=1) * np.sqrt(1 + 1 / len(x))
    return 0.0 if scale == 0 else float(2 * stats.t.sf(tol / scale, len(x) - 1))


def reband(path: str | Path, band: str, *, false_alarm: float = DEFAULT_FALSE_ALARM) -> dict[str, Any]:
    """Re-derive every tolerance of a golden file from its recorded per-seed values by rule `band`; the
    previous tolerance is kept as `tol_before`. Rewrites the file and returns it."""
    path = Path(path)
    band_entry = band_doc(band, false_alarm)
    doc = json.loads(path.read_text())
    values = doc["values"]
    for entry in values.values():
        entry["tol_before"] = entry["tol"]
        entry["tol"] = band_tolerance(entry["per_seed"], band, num_stats=len(values), false_alarm=false_alarm,
                                      safety_factor=doc.get("safety_factor", DEFAULT_SAFETY_FACTOR),
                                      floor_abs=doc.get("floor_abs", DEFAULT_FLOOR_ABS),
                                      floor_rel=doc.get("floor_rel", DEFAULT_FLOOR_REL))
    doc["band"] = band_entry
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    return doc


def golden_path(suite: Suite, profile: str, arch: str, directory: str | Path) -> Path:
    return Path(directory) / f"{suite.id}.{profile}.{arch}.json"


def stat_key(gs: GoldenStat, mode: str) -> str:
    """Stable key of one recorded statistic, e.g. 'colocated:critic/score/mean:mean_last[5]@[1:20]'."""
    win = f"@[{gs.window[0]}:{gs.window[1]}]" if gs.window else ""
    return f"{mode}:{gs.metric}:{stat_label(gs.stat, gs.n, gs.threshold)}{win}"


def golden_refs(suite: Suite, profile: str) -> list[Reference]:
    return [r for r in suite.references if r.kind == "golden" and profile in r.profiles]


def default_dir(suite: Suite, ref: Reference) -> Path:
    """`ref.golden_dir` relative to the project root (the folder above `suites/`)."""
    root = suite.path.resolve().parent.parent if suite.path else Path.cwd()
    return root / ref.golden_dir


def record_golden(suite: Suite, profile: str, arch: str, runs_by_seed: list[dict[str, pd.DataFrame]],
                  provenance: dict[str, Any], out_dir: str | Path, *,
                  safety_factor: float = DEFAULT_SAFETY_FACTOR, floor_abs: float = DEFAULT_FLOOR_ABS,
                  floor_rel: float = DEFAULT_FLOOR_REL, band: str = "max_dev",
                  false_alarm: float = DEFAULT_FALSE_ALARM) -> Path:
    """Compute the golden statistics over seeds and write the per-arch JSON file; returns its path."""
    band_entry = band_doc(band, false_alarm)
    refs = golden_refs(suite, profile)
    if not refs:
        raise ConfigError(f"{suite.path or suite.id}: references: no 'golden' reference for profile "
                          f"{profile}; add one with kind: golden, profiles: [{profile}], stats: [...]")
    if not runs_by_seed:
        raise DataError(f"record_golden: no runs given for {suite.id}.{profile}; run at least one seed")
    modes = suite.profile(profile).modes
    stats = [(gs, mode) for ref in refs for gs in ref.stats for mode in gs.modes or modes]
    values: dict[str, dict[str, Any]] = {}
    for gs, mode in stats:
        per_seed = [_seed_value(runs, gs, mode, i, suite.id) for i, runs in enumerate(runs_by_seed)]
        x = np.asarray(per_seed, dtype=float)  # [N]
        mean = float(x.mean())
        tol = band_tolerance(per_seed, band, num_stats=len(stats), safety_factor=safety_factor,
                             false_alarm=false_alarm, floor_abs=floor_abs, floor_rel=floor_rel)
        values[stat_key(gs, mode)] = {
            **gs.model_dump(exclude={"modes"}), "mode": mode, "mean": mean, "tol": tol,
            "spread": float(np.abs(x - mean).max()), "per_seed": per_seed,
        }
    doc = {
        "suite": suite.id, "profile": profile, "arch": arch, "num_seeds": len(runs_by_seed),
        "band": band_entry,
        "safety_factor": safety_factor, "floor_abs": floor_abs, "floor_rel": floor_rel,
        "provenance": provenance, "values": values,
    }
    path = golden_path(suite, profile, arch, out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    return path


WITNESS_FRACTION = 0.01


def witness_drift(path: Path, doc: dict[str, Any], suite: Suite, profile: str, wseed: int,
                  wruns: dict[str, pd.DataFrame]) -> tuple[dict[str, tuple[GoldenStat, str]], dict[str, float]]:
    """Each statistic of the recorded seed `wseed` trained again (`wruns`) against its recorded value, as a
    fraction of the statistic's band half-width; DataError naming the statistic when one is over
    WITNESS_FRACTION (see extend_golden). Returns the file's statistics and the drifts."""
    values, prov = doc["values"], doc.get("provenance", {})
    recorded = list(prov.get("seeds") or [])
    if wseed not in recorded:
        raise DataError(f"{path}: witness seed {wseed} is not one of its recorded seeds {recorded}")
    wi = recorded.index(wseed)
    stats = {stat_key(gs, mode): (gs, mode) for ref in golden_refs(suite, profile) for gs in ref.stats
             for mode in gs.modes or suite.profile(profile).modes}
    if set(stats) != set(values):
        raise DataError(f"{path}: its statistics ({', '.join(sorted(values))}) are not the suite's golden "
                        f"statistics ({', '.join(sorted(stats))}); re-record every seed without --extend")
    drift = {}
    for key, (gs, mode) in stats.items():
        entry = values[key]
        now = _seed_value(wruns, gs, mode, 0, suite.id)
        drift[key] = abs(now - entry["per_seed"][wi]) / entry["tol"]
        if drift[key] > WITNESS_FRACTION:
            raise DataError(
                f"{path}: witness seed {wseed} {key} = {now:.6g} now, {entry['per_seed'][wi]:.6g} when recorded "
                f"(commit {str(prov.get('commit'))[:10]}): {drift[key]:.1%} of the band's half-width, over "
                f"{WITNESS_FRACTION:.0%}; the code path changed since, or the run does not reproduce itself (a "
                f"timing-dependent mode): re-record every seed without --extend")
    return stats, drift


def extend_golden(path: str | Path, suite: Suite, profile: str, witness: tuple[int, dict[str, pd.DataFrame]],
                  new_runs: dict[int, dict[str, pd.DataFrame]], provenance: dict[str, Any], *, band: str,
                  false_alarm: float = DEFAULT_FALSE_ALARM) -> dict[str, Any]:
    """Add seeds to a recorded golden file without training its seeds again; rewrites the file, returns it.

    `witness` is one already-recorded seed trained again now: each statistic of it must equal its recorded
    value within WITNESS_FRACTION of that statistic's band half-width (1%: a drift that small cannot move the
    mean or the spread the band is set from by more than it moves by sampling one more seed), else the code path
    changed since the recording and the seeds of two code versions would be mixed: DataError, nothing written.
    `new_runs` maps each new seed to its runs. Bands are re-derived over all seeds by rule `band`; the
    earlier recording's provenance is kept under `provenance.recordings`."""
    path = Path(path)
    doc = json.loads(path.read_text())
    values = doc["values"]
    old_prov = doc.get("provenance", {})
    recorded = list(old_prov.get("seeds") or [])
    wseed, wruns = witness
    clash = sorted(set(new_runs) & set(recorded))
    if clash:
        raise DataError(f"{path}: seeds {clash} are recorded already; extend with seeds it does not have")
    stats, drift = witness_drift(path, doc, suite, profile, wseed, wruns)
    seeds = recorded + sorted(new_runs)
    for key, (gs, mode) in stats.items():
        entry = values[key]
        entry["per_seed"] = entry["per_seed"] + [_seed_value(new_runs[s], gs, mode, seeds.index(s), suite.id)
                                                 for s in sorted(new_runs)]
        x = np.asarray(entry["per_seed"], dtype=float)
        entry["mean"] = float(x.mean())
        entry["spread"] = float(np.abs(x - entry["mean"]).max())
        entry["tol_before"] = entry["tol"]
        entry["tol"] = band_tolerance(entry["per_seed"], band, num_stats=len(values), false_alarm=false_alarm,
                                      safety_factor=doc.get("safety_factor", DEFAULT_SAFETY_FACTOR),
                                      floor_abs=doc.get("floor_abs", DEFAULT_FLOOR_ABS),
                                      floor_rel=doc.get("floor_rel", DEFAULT_FLOOR_REL))
    earlier = old_prov.pop("recordings", None) or [old_prov]
    doc["provenance"] = {**provenance, "seeds": seeds, "recordings": earlier + [{
        **provenance, "seeds": sorted(new_runs), "witness_seed": wseed,
        "witness_max_drift_of_band": max(drift.values())}]}
    doc["num_seeds"] = len(seeds)
    doc["band"] = band_doc(band, false_alarm)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    return doc


def _seed_value(runs: dict[str, pd.DataFrame], gs: GoldenStat, mode: str, seed_idx: int, suite_id: str) -> float:
    if mode not in runs:
        raise DataError(f"record_golden {suite_id}: seed #{seed_idx} has no run for mode {mode} "
                        f"(has: {', '.join(runs) or 'none'}); run every mode of the profile")
    frame = runs[mode]
    if gs.metric not in frame.columns:
        raise DataError(f"record_golden {suite_id}: seed #{seed_idx}: {missing_metric(frame, gs.metric, mode)}")
    sv = compute_stat(frame.sort_index(), gs.metric, gs.stat, n=gs.n, window=gs.window, threshold=gs.threshold)
    if sv.value is None:
        raise DataError(f"record_golden {suite_id}: seed #{seed_idx} {mode}: {gs.metric} "
                        f"{stat_label(gs.stat, gs.n, gs.threshold)} is undefined ({sv.note}); fix the run "
                        "or the statistic")
    return sv.value


def check_golden(suite: Suite, ref: Reference, profile: str, runs: dict[str, pd.DataFrame], *, arch: str,
                 golden_dir: str | Path | None = None) -> list[CheckResult]:
    """Each recorded statistic of `ref` against `runs`: pass when within mean +- tol."""
    path = golden_path(suite, profile, arch, golden_dir if golden_dir is not None else default_dir(suite, ref))
    suite_arg = suite.path or f"suites/{suite.id}.yaml"
    if not path.exists():
        return [skipped(ref, f"no golden values recorded for arch {arch}; record with "
                           f"`rlbench golden {suite_arg} --profile {profile}` ({path.name} absent)", "golden")]
    try:
        doc = json.loads(path.read_text())
        values = doc["values"]
    except (json.JSONDecodeError, KeyError) as e:
        raise DataError(f"{path}: not a golden values file ({e}); re-record it with `rlbench golden`") from None
    prov = doc.get("provenance", {})
    band = doc.get("band", {"rule": "max_dev"})
    rule = band["rule"] + (f" at a {band['false_alarm']:g} false-alarm rate" if "false_alarm" in band else "")
    source = (f"golden {path.name} ({doc.get('num_seeds', '?')} seeds, commit "
              f"{str(prov.get('commit', '?'))[:10]}, {prov.get('date', '?')}; band {rule})")
    results: list[CheckResult] = []
    for gs in ref.stats:
        for mode in gs.modes or suite.profile(profile).modes:
            key = stat_key(gs, mode)
            cid = f"golden:{key}"
            entry = values.get(key)
            if entry is None:
                results.append(CheckResult(cid, "error", gs.metric, gs.stat, "", None, source, ref.why, [],
                                           f"{cid}: ERROR ({path.name} has no value for {key}; re-record "
                                           "golden values after changing the stats)", "golden", mode))
                continue
            if mode not in runs:
                results.append(CheckResult(cid, "error", gs.metric, gs.stat, "", None, source, ref.why, [],
                                           f"{cid}: ERROR (no run for mode {mode})", "golden", mode))
                continue
            probe = Reference(kind="metric", metric=gs.metric, stat=gs.stat, n=gs.n, window=gs.window,
                              threshold=gs.threshold, op="approx", value=entry["mean"], tol=entry["tol"],
                              profiles=[profile], source=source, why=ref.why)
            results.append(check_metric(probe, runs[mode], tol=entry["tol"], run=mode, check_id=cid,
                                        scope="golden"))
    return results
