"""TensorBoard log folders (rlbench/ingest/tensorboard.py): what torch's SummaryWriter writes reads back
with every value equal (as the float32 TensorBoard stores), and `rlbench check` takes the folder.

    pytest tests/unit/test_tensorboard_reader.py -q
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'rlbench[loggers]')")

from torch.utils.tensorboard import SummaryWriter

from rlbench.ingest.load import load_metrics
from trainer.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "reports/cpu/grpo_smollm2_arithmetic.metrics.jsonl"


def write_real_log(folder: Path) -> dict[tuple[int, str], float]:
    """The real cpu-profile log's every number, written with SummaryWriter.add_scalar."""
    frame = load_metrics(LOG).frame
    written = {}
    with SummaryWriter(log_dir=str(folder)) as w:
        for step, row in frame.iterrows():
            for key, value in row.dropna().items():
                w.add_scalar(str(key), float(value), global_step=int(step))
                written[(int(step), str(key))] = float(value)
    return written


def test_summary_writer_values_read_back_equal(tmp_path: Path) -> None:
    written = write_real_log(tmp_path / "tb")
    log = load_metrics(tmp_path / "tb")
    assert log.source_format == "tensorboard" and not log.warnings
    got = {(int(s), k): v for k, col in log.frame.items() for s, v in col.dropna().items()}
    assert set(got) == set(written) and len(got) > 1000
    assert all(got[k] == float(np.float32(v)) for k, v in written.items())


def test_rlbench_check_reads_a_tensorboard_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlbench.cli import main

    write_real_log(tmp_path / "tb")
    rc = main(["check", str(tmp_path / "tb"), "--suite", "verl_grpo_qwen3_8b_sglang_gfx950", "--profile", "cpu",
               "--arch", "cpu", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "(tensorboard, 31 steps: steps 0-30" in err
    assert rc in (0, 1)


def test_refusals(tmp_path: Path) -> None:
    write_real_log(tmp_path / "runs" / "a")
    with pytest.raises(DataError, match="sub-folders a have event files: pass one of them"):
        from rlbench.ingest.tensorboard import read_tensorboard

        read_tensorboard(tmp_path / "runs")
    empty = tmp_path / "empty"
    with SummaryWriter(log_dir=str(empty)) as w:
        w.add_text("note", "no scalars here", 0)
    with pytest.raises(DataError, match="TensorBoard events with no scalar"):
        load_metrics(empty)
