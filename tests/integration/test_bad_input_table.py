"""Table of malformed trainer inputs (configs, overrides, data files, paths, the CLI): each gives exit
code 2, exactly one `error:` line naming the field or path (and a fix), and no traceback.

Each case runs `trainer.__main__.main` in-process (the same code path as `python -m trainer`). Cases
that pass config validation stop in the start-time checks or the data loading, before or right
after the tiny model is built, so the table takes seconds. Print the table (input -> message):

    python -m tests.integration.test_bad_input_table > table.md
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

BASE = ("model: {path: 'tiny:qwen2'}\n"
        "data: {train_files: 'synthetic:arithmetic-easy?num=16&num_val=4', max_prompt_length: 64, "
        "max_response_length: 4, train_batch_size: 4}\n"
        "rollout: {n: 2}\n"
        "actor: {ppo_mini_batch_size: 4}\n"
        "trainer: {total_steps: 1, test_freq: 0, device: cpu, progress: false, out_dir: '{tmp}/out'}\n")

GOOD_ROW = {"data_source": "synthetic/arithmetic", "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"index": 0}}


def _row(**changes: Any) -> dict[str, Any]:
    row = json.loads(json.dumps(GOOD_ROW))
    for k, v in changes.items():
        if k == "truth":
            row["reward_model"]["ground_truth"] = v
        elif v is _DROP:
            row.pop(k)
        else:
            row[k] = v
    return row


_DROP = object()


def _jsonl(*rows: Any) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@dataclass
class Case:
    name: str
    overrides: list[str] = field(default_factory=list)
    expect: tuple[str, ...] = ()
    config: str | bytes | None = BASE          # None: no config written (the path is in `config_path`)
    config_path: str | None = None             # relative to tmp; default cfg.yaml
    files: dict[str, bytes] = field(default_factory=dict)
    setup: Callable[[Path, Any], None] | None = None
    argv: list[str] | None = None              # full argv (the CLI itself)


def _data(name: str, content: bytes, *expect: str, key: str = "data.train_files", extra: tuple[str, ...] = ()) -> Case:
    fname = "rows" + Path(name).suffix if Path(name).suffix else name
    return Case(f"data: {name}", [f"{key}={{tmp}}/{fname}", *extra], (fname, *expect), files={fname: content})


def _parquet(rows: list[dict]) -> bytes:
    import pandas as pd

    buf = io.BytesIO()
    pd.DataFrame(rows).to_parquet(buf)
    return buf.getvalue()


def _hold_lock(tmp: Path, monkeypatch: Any) -> None:
    import fcntl

    out = tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    f = (out / ".lock").open("a+")
    fcntl.flock(f, fcntl.LOCK_EX)
    monkeypatch.setattr(_hold_lock, "handle", f, raising=False)  # kept open for the case


def _unreadable(tmp: Path, monkeypatch: Any) -> None:
    target = tmp / "cfg.yaml"
    real = Path.read_bytes

    def deny(self: Path) -> bytes:
        if self == target:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", deny)


def _no_cuda(tmp: Path, monkeypatch: Any) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _fault_env(tmp: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("RLBENCH_FAULT_AT", "explode:1")


def _threads_would_crash(tmp: Path, monkeypatch: Any) -> None:
    """torch.set_num_threads past the cores raises here instead of crashing the test process (libgomp
    aborts or the process segfaults with no message): the check must come before it."""
    import torch

    from trainer.platform.preflight import usable_cores

    real = torch.set_num_threads

    def guarded(n: int) -> None:
        if n > usable_cores():
            raise RuntimeError(f"torch.set_num_threads({n}) reached: this would crash the process")
        real(n)

    monkeypatch.setattr(torch, "set_num_threads", guarded)


def _fifo(tmp: Path, monkeypatch: Any) -> None:
    os.mkfifo(tmp / "pipe.yaml")


def _dev_null(tmp: Path, monkeypatch: Any) -> None:
    (tmp / "null.yaml").symlink_to(os.devnull)


CASES: list[Case] = [
    # --- the config file itself
    Case("config file missing", expect=("none.yaml", "not found"), config=None, config_path="none.yaml"),
    Case("config is a directory", expect=("is a directory",), config=None, config_path="adir",
         setup=lambda t, m: (t / "adir").mkdir()),
    Case("config is a binary file", expect=("cfg.yaml", "not a UTF-8"), config=bytes(range(256)) * 8),
    Case("config has NUL bytes", expect=("cfg.yaml", "NUL"), config=b"model: {}\n\x00\x00\n"),
    Case("config unreadable", expect=("cfg.yaml", "cannot read", "Permission denied"), setup=_unreadable),
    Case("config invalid YAML", expect=("invalid YAML", "line"), config="model: {path: [unclosed\n"),
    Case("config top level a list", expect=("top level must be a mapping",), config="- a\n- b\n"),
    Case("config over 1 MB", expect=("bytes, over",), config="# " + "x" * (1 << 20) + "\n"),
    Case("config unknown section", expect=("modle", "unknown key", "did you mean 'model'"), config=BASE + "modle: {}\n"),
    Case("config section not a mapping", expect=("rollout",), config=BASE.replace("rollout: {n: 2}", "rollout: 5")),
    Case("config with a top-level key twice", expect=("cfg.yaml line 6", "key 'rollout' is given twice",
                                                      "first on line 3", "YAML keeps only the last"),
         config=BASE + "rollout: {n: 4}\n"),
    Case("config is a FIFO", expect=("pipe.yaml", "not a regular file"), config=None, config_path="pipe.yaml",
         setup=_fifo),
    Case("config is /dev/null", expect=("null.yaml", "not a regular file"), config=None, config_path="null.yaml",
         setup=_dev_null),
    # --- overrides on the command line
    Case("override without =", ["actor.lr"], ("override 'actor.lr'", "key.sub=value")),
    Case("override with an empty key part", ["actor..lr=1"], ("empty key part",)),
    Case("override value not YAML", ["actor.betas=[2,3"], ("actor.betas", "not valid YAML")),
    Case("override into a leaf", ["actor.lr.x=1"], ("actor.lr",)),
    Case("override unknown key", ["actor.lrr=1e-5"], ("actor.lrr", "did you mean 'lr'")),
    Case("override wrong type", ["data.train_batch_size=many"], ("data.train_batch_size", "integer")),
    # --- field ranges: actor
    Case("actor.betas=[2,3]", ["actor.betas=[2,3]"], ("actor.betas", "less than 1")),
    Case("actor.betas one value", ["actor.betas=[0.9]"], ("actor.betas",)),
    Case("actor.weight_decay=-1", ["actor.weight_decay=-1"], ("actor.weight_decay", "greater than or equal to 0")),
    Case("actor.lr=0", ["actor.lr=0"], ("actor.lr", "greater than 0")),
    Case("actor.lr=nan", ["actor.lr=.nan"], ("actor.lr", "finite")),
    Case("actor.lr=inf", ["actor.lr=.inf"], ("actor.lr", "finite")),
    Case("actor.grad_clip=0", ["actor.grad_clip=0"], ("actor.grad_clip",)),
    Case("actor.clip_ratio_low=1.5", ["actor.clip_ratio_low=1.5"], ("actor.clip_ratio_low", "less than 1")),
    Case("actor.clip_ratio_c=0.5", ["actor.clip_ratio_c=0.5"], ("actor.clip_ratio_c",)),
    Case("actor.entropy_coeff=-0.1", ["actor.entropy_coeff=-0.1"], ("actor.entropy_coeff",)),
    Case("actor.kl_loss_coef=-1", ["actor.kl_loss_coef=-1"], ("actor.kl_loss_coef",)),
    Case("actor.kl_loss_type=foo", ["actor.kl_loss_type=foo"], ("actor.kl_loss_type", "low_var_kl")),
    Case("actor.tis_cap=0", ["actor.tis_cap=0"], ("actor.tis_cap",)),
    Case("actor.ppo_epochs=0", ["actor.ppo_epochs=0"], ("actor.ppo_epochs",)),
    Case("actor.ppo_mini_batch_size=3", ["actor.ppo_mini_batch_size=3"], ("actor.ppo_mini_batch_size", "divide")),
    Case("actor.warmup_steps=-1", ["actor.warmup_steps=-1"], ("actor.warmup_steps",)),
    Case("actor.mixed_precision=fp8", ["actor.mixed_precision=fp8"], ("actor.mixed_precision", "bf16")),
    # --- rollout
    Case("rollout.top_k=-5", ["rollout.top_k=-5"], ("rollout.top_k", "-1")),
    Case("rollout.top_k=0", ["rollout.top_k=0"], ("rollout.top_k=0", "-1 disables")),
    Case("rollout.top_p=1.5", ["rollout.top_p=1.5"], ("rollout.top_p",)),
    Case("rollout.temperature=0", ["rollout.temperature=0"], ("rollout.temperature",)),
    Case("rollout.n=0", ["rollout.n=0"], ("rollout.n",)),
    Case("rollout.val_temperature=0", ["rollout.val_temperature=0"], ("rollout.val_temperature",)),
    Case("rollout.engine=trt", ["rollout.engine=trt"], ("rollout.engine", "'hf'")),
    Case("rollout.gpu_memory_utilization=2", ["rollout.gpu_memory_utilization=2"], ("rollout.gpu_memory_utilization",)),
    Case("rollout.max_num_seqs=0", ["rollout.max_num_seqs=0"], ("rollout.max_num_seqs",)),
    Case("engine_kwargs for the hf engine", ["rollout.engine_kwargs={foo: 1}"],
         ("rollout.engine_kwargs.foo", "hf engine takes no engine options")),
    Case("engine_kwargs the static engine does not read",
         ["rollout.engine=static", "rollout.engine_kwargs={free_on_slep: false}"],
         ("rollout.engine_kwargs.free_on_slep", "did you mean 'free_on_sleep'")),
    Case("val_n=4 with greedy validation", ["rollout.val_n=4"],
         ("rollout.val_n=4 with rollout.val_greedy=true", "rollout.val_greedy=false")),
    # --- data section
    Case("data.num_val_samples=-1", ["data.num_val_samples=-1"], ("data.num_val_samples", "greater than or equal to 1")),
    Case("data.val_batch_size=0", ["data.val_batch_size=0"], ("data.val_batch_size", "greater than or equal to 1")),
    Case("data.max_prompt_length=0", ["data.max_prompt_length=0"], ("data.max_prompt_length",)),
    Case("data.max_response_length=-8", ["data.max_response_length=-8"], ("data.max_response_length",)),
    Case("data.train_batch_size=0", ["data.train_batch_size=0"], ("data.train_batch_size",)),
    Case("data.seed=-1", ["data.seed=-1"], ("data.seed",)),
    # --- trainer section
    Case("trainer.num_threads=0", ["trainer.num_threads=0"], ("trainer.num_threads", "greater than or equal to 1")),
    Case("trainer.total_steps=0", ["trainer.total_steps=0"], ("trainer.total_steps",)),
    Case("trainer.max_checkpoints=0", ["trainer.max_checkpoints=0"], ("trainer.max_checkpoints",)),
    Case("trainer.seed=-1", ["trainer.seed=-1"], ("trainer.seed",)),
    Case("trainer.device=tpu", ["trainer.device=tpu"], ("trainer.device", "'cuda'")),
    Case("trainer.mode=sync", ["trainer.mode=sync"], ("trainer.mode", "fully_async")),
    Case("trainer.num_threads over the machine's cores", ["trainer.num_threads=100000"],
         ("trainer.num_threads=100000", "CPU cores this process may use"), setup=_threads_would_crash),
    # --- algorithm, critic, async, agent
    Case("algorithm.gamma=2", ["algorithm.gamma=2"], ("algorithm.gamma", "less than or equal to 1")),
    Case("algorithm.lam=-0.5", ["algorithm.lam=-0.5"], ("algorithm.lam",)),
    Case("ppo without a critic", ["algorithm.name=ppo", "algorithm.adv_estimator=gae"], ("critic.enable=true",)),
    Case("ppo with grpo advantages", ["algorithm.name=ppo"], ("adv_estimator=gae",)),
    Case("gae advantages without a critic", ["algorithm.adv_estimator=gae"],
         ("algorithm.adv_estimator=gae needs a value model", "critic.enable=true")),
    Case("overlong buffer longer than responses", ["algorithm.overlong_buffer.enable=true", "algorithm.overlong_buffer.len=8"],
         ("algorithm.overlong_buffer.len=8", "data.max_response_length=4")),
    Case("critic.lr=0", ["critic.lr=0"], ("critic.lr",)),
    Case("critic.cliprange_value=0", ["critic.cliprange_value=0"], ("critic.cliprange_value",)),
    Case("async.staleness_threshold=-1", ["async.staleness_threshold=-1"], ("async.staleness_threshold",)),
    Case("tensor parallelism inside a Ray replica", ["trainer.mode=fully_async", "rollout.tensor_parallel_size=2"],
         ("rollout.tensor_parallel_size=2", "add replicas with async.rollout_gpus")),
    Case("more prompts per call than a replica may start",
         ["trainer.mode=fully_async", "async.rollout_gpus=2", "async.staleness_threshold=0",
          "async.trigger_parameter_sync_step=1", "async.rollout_groups_per_call=3"],
         ("async.rollout_groups_per_call=3", "at most 2")),
    Case("more rollout replicas than the staleness cap allows",
         ["trainer.mode=fully_async", "async.rollout_gpus=5", "async.staleness_threshold=0",
          "async.trigger_parameter_sync_step=1"], ("async.rollout_gpus=5", "fewer than one per rollout replica")),
    Case("agent.tool_memory_mb=1", ["agent.tool_memory_mb=1"], ("agent.tool_memory_mb",)),
    # --- model
    Case("model.override_config num_hidden_layers=-1", ["model.override_config={num_hidden_layers: -1}"],
         ("model.override_config.num_hidden_layers=-1", "positive integer")),
    Case("model.override_config hidden_size=0", ["model.override_config={hidden_size: 0}"],
         ("model.override_config.hidden_size",)),
    Case("model.override_config unknown HF field", ["model.override_config={num_hidden_layrs: 3}"],
         ("model.override_config.num_hidden_layrs", "did you mean 'num_hidden_layers'")),
    Case("model.dtype=float8", ["model.dtype=float8"], ("model.dtype",)),
    Case("model.path empty", ["model.path="], ("model.path", "at least 1 character")),
    Case("data.train_files empty", ["data.train_files="], ("data.train_files", "at least 1 character")),
    Case("trainer.out_dir empty", ["trainer.out_dir="], ("trainer.out_dir", "at least 1 character")),
    Case("model.path missing folder", ["model.path={tmp}/nope"], ("model.path", "nope", "fix")),
    Case("model.tokenizer_path missing", ["model.tokenizer_path={tmp}/tok"], ("model.tokenizer_path", "not a folder")),
    Case("model.path unknown tiny arch", ["model.path=tiny:gpt9"], ("model.path", "tiny:gpt9")),
    Case("max_response_length beyond the model's positions", ["data.max_response_length=1100"],
         ("data.max_response_length", "1164", "max_position_embeddings=1024")),
    # --- start-time checks: paths and devices
    Case("out_dir names a file", ["trainer.out_dir={tmp}/afile"], ("trainer.out_dir", "existing file"),
         files={"afile": b"x"}),
    Case("out_dir under a file (unwritable)", ["trainer.out_dir={tmp}/afile/run"], ("trainer.out_dir", "cannot be written"),
         files={"afile": b"x"}),
    Case("out_dir in use by a running trainer", [], ("trainer.out_dir", "in use by a running trainer"), setup=_hold_lock),
    Case("trainer.device=cuda without CUDA", ["trainer.device=cuda"], ("trainer.device=cuda", "no CUDA device"),
         setup=_no_cuda),
    Case("bad RLBENCH_FAULT_AT", ["trainer.save_freq=1"], ("RLBENCH_FAULT_AT", "rollout"), setup=_fault_env),
    # --- data files
    Case("data file missing", ["data.train_files={tmp}/x.parquet"], ("x.parquet", "not found")),
    Case("data file is a directory", ["data.train_files={tmp}/adir"], ("adir", "is a directory"),
         setup=lambda t, m: (t / "adir").mkdir()),
    Case("val file missing", ["data.val_files={tmp}/v.jsonl"], ("v.jsonl", "not found")),
    _data("x.csv", b"a,b\n", "unsupported file type"),
    _data("empty.jsonl", b"", "dataset is empty"),
    _data("badjson.jsonl", _jsonl(GOOD_ROW) + b"{not json\n", "line 2", "not valid JSON"),
    _data("binary.jsonl", bytes(range(128, 256)) * 4 + b"\n", "line 1", "not UTF-8"),
    _data("notlist.json", b'{"a": 1}', "must hold a list"),
    _data("row_not_mapping.jsonl", b"5\n", "row 0", "must be a mapping"),
    _data("no_data_source.jsonl", _jsonl(_row(data_source=_DROP)), "row 0", "data_source"),
    _data("unknown_data_source.jsonl", _jsonl(_row(data_source="my/own")), "row 0", "my/own", "no reward function"),
    _data("prompt_not_list.jsonl", _jsonl(_row(prompt="hi")), "row 0", "'prompt'"),
    _data("content_none.jsonl", _jsonl(_row(prompt=[{"role": "user", "content": None}])), "row 0", "'prompt'"),
    _data("role_robot.jsonl", _jsonl(GOOD_ROW, _row(prompt=[{"role": "robot", "content": "hi"}])),
          "row 1", "prompt[0].role", "robot", "user"),
    _data("truth_nan.jsonl", (json.dumps(_row(truth=math.nan)) + "\n").encode(), "row 0", "ground_truth", "nan"),
    _data("truth_empty.jsonl", _jsonl(_row(truth="  ")), "row 0", "ground_truth"),
    _data("truth_list.jsonl", _jsonl(_row(truth=[1, 2])), "row 0", "ground_truth", "list"),
    _data("no_truth.jsonl", _jsonl(_row(reward_model={"style": "rule"})), "row 0", "ground_truth"),
    _data("extra_info_list.jsonl", _jsonl(_row(extra_info=[1])), "row 0", "extra_info"),
    _data("bad_row.parquet", _parquet([GOOD_ROW, _row(prompt=[{"role": "user", "content": None}])]), "row 1", "prompt"),
    _data("corrupt.parquet", b"PAR1 this is not parquet", "cannot read"),
    _data("overlong.jsonl", _jsonl(_row(prompt=[{"role": "user", "content": "one two three " * 40}])),
          "all 1 prompts are longer", "data.max_prompt_length"),
    _data("overlong_no_filter.jsonl", _jsonl(_row(prompt=[{"role": "user", "content": "one two three " * 40}])),
          "row 0", "over data.max_prompt_length", extra=("data.filter_overlong_prompts=false",)),
    _data("val_role.jsonl", _jsonl(_row(prompt=[{"role": "bot", "content": "hi"}])), "row 0", "role",
          key="data.val_files"),
    # --- the CLI
    Case("CLI: config argument missing", expect=("the following arguments are required: config",), argv=[]),
    Case("CLI: unknown option", expect=("unrecognized arguments: --fast",), argv=["{cfg}", "--fast"]),
]


def run_case(case: Case, tmp: Path, monkeypatch: Any) -> tuple[int, str, str]:
    """(exit code, the stderr text, the one error line) of one case."""
    from trainer.__main__ import main

    for name, content in case.files.items():
        (tmp / name).write_bytes(content)
    cfg_path = tmp / (case.config_path or "cfg.yaml")
    if case.config is not None:
        text = case.config if isinstance(case.config, bytes) else case.config.replace("{tmp}", str(tmp)).encode()
        cfg_path.write_bytes(text)
    if case.setup is not None:
        case.setup(tmp, monkeypatch)
    fill = lambda s: s.replace("{tmp}", str(tmp)).replace("{cfg}", str(cfg_path))
    argv = [fill(a) for a in case.argv] if case.argv is not None else [str(cfg_path), *map(fill, case.overrides)]
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = int(e.code or 0)
    text = err.getvalue()
    lines = [ln for ln in text.splitlines() if "error:" in ln]
    return code, text, lines[0] if len(lines) == 1 else f"<{len(lines)} error lines>"


def test_cases_are_distinct_and_many():
    assert len({c.name for c in CASES}) == len(CASES) >= 60


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, monkeypatch):
    monkeypatch.delenv("RLBENCH_FAULT_AT", raising=False)
    code, text, line = run_case(case, tmp_path, monkeypatch)
    assert "Traceback" not in text, text
    assert code == 2, (code, text)
    assert not line.startswith("<"), text  # exactly one error line
    for want in case.expect:
        assert want in line, (want, line)
    if case.argv is None:
        assert "fix" in line or "did you mean" in line or "use one of" in line or "should be" in line, line


def test_out_dir_with_a_tilde_is_the_home_folder_for_every_file(tmp_path: Path, monkeypatch) -> None:
    """`trainer.out_dir: ~/x` in a YAML file: the run folder, its lock, log and config are all under $HOME/x."""
    from trainer.__main__ import main

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(BASE.replace("out_dir: '{tmp}/out'", "out_dir: '~/x'"))
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = main([str(cfg)])
    assert code == 0, err.getvalue()
    run = home / "x"
    assert {".lock", "metrics.jsonl", "config.yaml"} <= {p.name for p in run.iterdir()}
    assert f"out_dir: {run}" in (run / "config.yaml").read_text()
    assert not (tmp_path / "~").exists()  # nothing at the literal path


def test_static_engine_options_are_the_ones_the_config_accepts() -> None:
    """rollout.engine_kwargs for the static engine are checked against STATIC_ENGINE_KWARGS: it must be
    exactly what trainer/rollout/static.py reads, or a real option would be refused (or a typo accepted)."""
    import re

    from trainer.config import STATIC_ENGINE_KWARGS

    src = (Path(__file__).resolve().parents[2] / "trainer" / "rollout" / "static.py").read_text()
    assert set(re.findall(r'opts\.get\("([a-z_]+)"', src)) == set(STATIC_ENGINE_KWARGS)


if __name__ == "__main__":  # the table: input -> message
    import tempfile

    class _Patch:
        def __init__(self) -> None:
            self.undo: list[Callable[[], None]] = []

        def setattr(self, obj: Any, name: str, value: Any, raising: bool = True) -> None:
            old = getattr(obj, name, None)
            setattr(obj, name, value)
            self.undo.append(lambda: setattr(obj, name, old))

        def setenv(self, key: str, value: str) -> None:
            old = os.environ.get(key)
            os.environ[key] = value
            self.undo.append(lambda: os.environ.pop(key) if old is None else os.environ.__setitem__(key, old))

    print("| # | input | exit | message |\n|---|---|---|---|")
    for i, case in enumerate(CASES, 1):
        patch = _Patch()
        with tempfile.TemporaryDirectory() as d:
            code, _, line = run_case(case, Path(d), patch)
            line = line.replace(d, "<tmp>")
        for u in reversed(patch.undo):
            u()
        shown = " ".join(case.overrides) if case.overrides else ""
        print(f"| {i} | {case.name}{' (`' + shown + '`)' if shown and shown != case.name else ''} | {code} | "
              f"{line.replace('|', '/')} |")
