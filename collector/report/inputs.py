"""The report's two inputs: run files are read as they are; traces are replayed first.

A path ending in `.duckdb` is a run file, and a folder `kvscope export` wrote is a run as a
Parquet dataset; anything else is a trace, replayed with the command's replay options into
`OUT_DIR/<role>.duckdb`. Every input is checked before the first replay starts, and a failed
replay removes the run files this report made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collector.replay.replayer import ReplayOptions, replay
from collector.store.parquet_dataset import is_dataset
from collector.store.run_file import RunStore

RUN_SUFFIX = ".duckdb"


class ReportInputError(ValueError):
    """A baseline or candidate kvscope cannot use; the message names the file and reason."""


@dataclass(frozen=True)
class ReportInput:
    """The baseline or the candidate, as given on the command line."""

    role: str
    path: Path

    @property
    def is_run(self) -> bool:
        """A run file, or a run exported as a Parquet dataset."""
        return self.path.suffix == RUN_SUFFIX or is_dataset(self.path)


def check_inputs(inputs: list[ReportInput], out_dir: Path) -> None:
    """Every input exists, every run file opens with this kvscope's schema version, and no
    replay would overwrite a run."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportInputError(f"{out_dir}: not a directory (--out-dir)")
    for report_input in inputs:
        if not (report_input.path.is_file() or is_dataset(report_input.path)):
            raise ReportInputError(
                f"{report_input.path}: no such file (the --{report_input.role} input)"
            )
        if report_input.is_run:
            RunStore.open(report_input.path).close()
        elif replayed_run(out_dir, report_input).exists():
            raise ReportInputError(
                f"{replayed_run(out_dir, report_input)}: already exists; kvscope does not "
                "overwrite runs (use another --out-dir)"
            )


def replayed_run(out_dir: Path, report_input: ReportInput) -> Path:
    """Where a trace input's replay goes."""
    return out_dir / f"{report_input.role}{RUN_SUFFIX}"


def prepare_runs(
    inputs: list[ReportInput], out_dir: Path, options: ReplayOptions, secret: bytes
) -> dict[str, Path]:
    """The run file of each role, replaying traces into `out_dir` first."""
    runs: dict[str, Path] = {}
    made: list[Path] = []
    try:
        for report_input in inputs:
            if report_input.is_run:
                runs[report_input.role] = report_input.path
                continue
            out_dir.mkdir(parents=True, exist_ok=True)
            out = replayed_run(out_dir, report_input)
            replay(report_input.path, out, options, secret)
            made.append(out)
            runs[report_input.role] = out
    except BaseException:
        for path in made:
            path.unlink(missing_ok=True)
        raise
    return runs
