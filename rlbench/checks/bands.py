"""The golden files' bands and the false-alarm rates they imply: `reports/golden/BANDS.md`.

    python -m rlbench.checks.bands [--golden-dir reports/golden] [--false-alarm 0.05]

For every recorded statistic: its seeds, its band as recorded, the per-check false-alarm rate that band
implies if the statistic is normal over seeds (`implied_false_alarm`), and the prediction-interval band for
a stated rate over the whole file (`band_tolerance(..., "prediction")`), so a reader sees what the number of
seeds buys. Read-only: the files are not changed (`rlbench golden ... --reband` changes one).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlbench.checks.golden import DEFAULT_FALSE_ALARM, band_tolerance, implied_false_alarm


def table(golden_dir: Path, false_alarm: float) -> str:
    intro = ("Written by `python -m rlbench.checks.bands` from the files beside it. Per statistic: the band as "
             "recorded (`tol`, rule in the file's `band`, default `max_dev`: 3x the largest seed deviation), the "
             "band before it was last re-derived (`rlbench golden --reband` or `--extend`: `tol_before`), the "
             "chance that one clean new run falls outside it if the statistic is normal over seeds (Student t, "
             "N-1 degrees of freedom), and the prediction-interval band that holds the chance that a clean run "
             f"fails any statistic of its file at {false_alarm:g} (Bonferroni over the file's K statistics).")
    header = ("| file | seeds | statistic | mean | band now (rule) | band before its last re-derivation | "
              f"false alarm per check, band now | prediction band, {false_alarm:g} per file |")
    lines = ["# Golden bands and their false-alarm rates", "", intro, "", header, "|---|---|---|---|---|---|---|---|"]
    per_file_intro = ("Per file: the chance that a clean run of a new seed fails at least one statistic with the "
                      "bands now, 1 - prod(1 - rate), if the statistics were independent (they are not: the score "
                      "statistics move together, so this is an upper bound).")
    per_file = ["", per_file_intro, "",
                "| file | seeds | statistics | band rule | chance a clean new seed fails a statistic |",
                "|---|---|---|---|---|"]
    for path in sorted(golden_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        values = doc["values"]
        rule = doc.get("band", {}).get("rule", "max_dev")
        clean = 1.0
        for key, e in values.items():
            fa = implied_false_alarm(e["per_seed"], e["tol"])
            clean *= 1 - fa
            pi = band_tolerance(e["per_seed"], "prediction", num_stats=len(values), false_alarm=false_alarm)
            before = f"+- {e['tol_before']:.3g}" if "tol_before" in e else "-"
            lines.append(f"| {path.stem} | {len(e['per_seed'])} | `{key}` | {e['mean']:.4g} | "
                         f"+- {e['tol']:.3g} ({rule}) | {before} | {fa:.1%} | +- {pi:.3g} |")
        per_file.append(f"| {path.stem} | {doc.get('num_seeds', '?')} | {len(values)} | {rule} | {1 - clean:.0%} |")
    return "\n".join(lines + per_file) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golden-dir", default="reports/golden")
    ap.add_argument("--false-alarm", type=float, default=DEFAULT_FALSE_ALARM)
    args = ap.parse_args(argv)
    out = Path(args.golden_dir) / "BANDS.md"
    out.write_text(table(Path(args.golden_dir), args.false_alarm))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
