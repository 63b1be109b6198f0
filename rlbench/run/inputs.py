"""What `rlbench check` checks against: the arch (`--arch`, validated, or defaulted and said), the
profile (`--profile`, or guessed from the logs' shape and said), and the logs read once.

    from rlbench.run.inputs import check_arch, check_profile, validate_arch
    validate_arch("gfx999")                     # ConfigError listing the known arches
    validate_device("MI355")                    # ConfigError listing the known boards (MI355X, ...)
    profile = check_profile(args, suite, logs)  # notes and mismatch warnings on stderr

Known arches: cpu, those of the device table (trainer/platform/env.py), of the suite (published and
reference arches) and this machine's. Defaults: the full profile checks as the published arch;
the cpu profile on a CPU-only machine as cpu; mini needs `--arch`. Profile guessing is
rlbench/suites/profile_guess.py; without a single match the published profile (full) is used, and said.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

from rlbench.suites.suite import Suite
from trainer.errors import ConfigError


def known_arches(suite: Suite | None = None, detected: str | None = None) -> list[str]:
    """Arches `--arch` accepts: cpu, the device table's, the suites' and this machine's."""
    from rlbench.run.runner import ARCH_DEVICES
    from trainer.platform.env import KNOWN_DEVICES

    out = {"cpu", *ARCH_DEVICES, *(d.arch for d in KNOWN_DEVICES.values())}
    if suite is not None:
        out.add(suite.published_on.arch)
        out.update(a for ref in suite.references for a in (ref.arch or []) if a != "any")
    if detected:
        out.add(detected)
    return sorted(out)


def validate_arch(arch: str, suite: Suite | None = None, detected: str | None = None) -> None:
    """A ConfigError naming the known arches when `arch` is none of them ('' included: never "not given")."""
    known = known_arches(suite, detected)
    if arch not in known:
        close = [k for k in known if k.lower() == arch.strip().lower()] or difflib.get_close_matches(
            arch, known, n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"--arch {arch or repr(arch)}: not a known arch; choose one of {', '.join(known)} "
                          f"(the part of the GPU's arch name before ':', e.g. gfx942 or sm_90){hint}")


def validate_device(device: str, suite: Suite | None = None, flag: str = "--device") -> None:
    """A ConfigError naming the known boards when `device` matches none of them (device-scoped checks
    would then skip as "another board" on a name that is only misspelt)."""
    from rlbench.checks.evaluate import device_matches
    from trainer.platform.env import KNOWN_DEVICES

    known = set(KNOWN_DEVICES)
    if suite is not None:
        known |= {suite.published_on.device, *(ref.device for ref in suite.references if ref.device)}
    if any(device_matches(k, device) for k in known):
        return
    close = difflib.get_close_matches(device.strip().upper(), sorted(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ConfigError(f"{flag} {device or repr(device)}: matches no known board; {hint}give one of "
                      f"{', '.join(sorted(known))}, or the name the GPU reports (e.g. 'AMD Instinct MI300X')")


def check_out_folder(flag: str, out: str, example: str = "runs/check") -> None:
    """A ConfigError when `out` (a folder to create) is an existing file or lies under one."""
    p = Path(out)
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                what = "is an existing file" if q == p else f"lies under {q}, an existing file"
                raise ConfigError(f"{flag} {out}: {what}, not a folder (fix: pass a folder to write into, e.g. "
                                  f"{flag} {example})")
            return


def detected_arch() -> str:
    from trainer.platform.env import detect_arch

    return detect_arch()


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def check_arch(args: argparse.Namespace, suite: Suite, profile: str) -> str:
    """The arch to check as: `--arch` (validated), the published arch for full, cpu on a CPU machine."""
    if args.arch is not None:
        validate_arch(args.arch, suite)
        return args.arch
    if profile == "full":
        _note(f"--arch not given; checking as the published arch {suite.published_on.arch}")
        return suite.published_on.arch
    if profile == "cpu" and detected_arch() == "cpu":
        _note("--arch not given; profile cpu on this CPU-only machine: checking as arch cpu")
        return "cpu"
    raise ConfigError(f"--arch: say which arch the {profile} run ran on (e.g. --arch cpu or gfx942)")


def read_logs(args: argparse.Namespace) -> dict[str, Any]:
    """Every log named on the command line, read once: path -> MetricLog."""
    from rlbench.ingest.load import load_metrics

    paths = list(args.logs) + [item.partition("=")[2] for item in args.run or [] if "=" in item]
    logs = {}
    for p in dict.fromkeys(paths):
        if p:
            logs[p] = load_metrics(p, fmt=args.format, reward_is_accuracy=args.reward_is_accuracy)
    return logs


def check_profile(args: argparse.Namespace, suite: Suite, logs: dict[str, Any]) -> str:
    """`--profile`, or the one the logs' shape matches (said on stderr); warns on a plain mismatch."""
    from rlbench.suites.profile_guess import guess_profile, shape_mismatch

    if args.profile is not None:
        for p, log in logs.items():
            warning = shape_mismatch(suite, args.profile, log.frame)
            if warning:
                print(f"warning: {p}: {warning}", file=sys.stderr)
        return args.profile
    guesses = {p: guess_profile(suite, log.frame) for p, log in logs.items()}
    found = {g for g, _ in guesses.values()}
    if len(found) == 1 and None not in found:
        profile = found.pop()
        seen = "; ".join(why for _, why in guesses.values())
        _note(f"--profile not given; the log's shape ({seen}) matches profile {profile} of {suite.id}: "
              f"checking as {profile} (pass --profile to choose)")
        return profile
    why = "; ".join(why for _, why in guesses.values()) or "no log"
    _note(f"--profile not given and {why}: checking as full, the published run (pass --profile to choose)")
    for p, log in logs.items():
        warning = shape_mismatch(suite, "full", log.frame)
        if warning:
            print(f"warning: {p}: {warning}", file=sys.stderr)
    return "full"
