"""A what-if sweep on a Ray cluster: each point is one Ray task (`kvscope whatif --ray`).

The nodes need not share the driver's filesystem: the requests go into the object store
once, each task replays into a temporary run file on its own node and returns the point's
figures with the file's bytes, and the driver writes each run file into the sweep's folder
under a temporary name and renames it, as the local process pool's replays do. Ray is
imported only here, when a sweep asks for it.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path

from collector.model.trace_request import TraceRequest
from collector.replay.replayer import ReplayOptions
from collector.replay.sweep_point import SweepPoint, replay_point
from collector.replay.sweep_results import PointFigures
from collector.replay.traces import TraceError
from collector.store.run_file import StoreError
from collector.unavailable import Unavailable

CONNECT_TIMEOUT_S = 5.0  # ray.init itself retries an address nobody answers for minutes
TOKEN_FILE = "~/.ray/auth_token"


class RayUnavailable(Unavailable):
    """No Ray to run the sweep on: not installed, or no cluster answers at the address."""


def require_ray() -> str:
    """The version of this environment's Ray; `RayUnavailable` when it has none."""
    try:
        import ray  # noqa: PLC0415 - Ray is the optional `ray` extra; only --ray loads it
    except ImportError as error:
        raise RayUnavailable(
            f"--ray runs the sweep's points as Ray tasks and needs Ray in this Python "
            f"environment: `pip install 'kvscope[ray]'` ({error})"
        ) from None
    return str(ray.__version__)


@contextmanager
def ray_session(address: str) -> Iterator[None]:
    """Connected to the Ray cluster at `address` ("": wherever `ray.init()` finds one,
    else a new local instance) for the block's duration."""
    require_ray()
    import ray  # noqa: PLC0415 - Ray is the optional `ray` extra; only --ray loads it

    _check_answers(address)
    try:
        # log_to_driver off: the workers' logs would interleave with --json on stdout
        ray.init(address=address or None, log_to_driver=False)
    except Exception as error:
        if not _refused_for_its_token(error):
            raise
        ray.shutdown()
        where = f"at {address}" if address else "that ray.init() found"
        raise RayUnavailable(
            f"the Ray cluster {where} refused this driver: its authentication token is missing "
            f"or not the cluster's. A Ray started where {TOKEN_FILE} exists requires that "
            "token (a local Ray, as `kvscope whatif --ray` without an address starts, writes "
            "one); run again with RAY_AUTH_MODE=token and the cluster's token in "
            f"{TOKEN_FILE} (or RAY_AUTH_TOKEN), or delete {TOKEN_FILE} and restart the cluster"
        ) from None
    try:
        yield
    finally:
        ray.shutdown()


def _refused_for_its_token(error: BaseException) -> bool:
    """Whether Ray's refusal to connect was its token check's (Ray raises a ConnectionError
    whose cause holds the AuthenticationError only as text)."""
    from ray.exceptions import AuthenticationError  # noqa: PLC0415 - Ray is the optional `ray` extra; only --ray loads it

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, AuthenticationError) or "InvalidAuthToken" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _check_answers(address: str) -> None:
    """Refuse at once a host:port nobody listens on."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "", "auto", "local": Ray resolves them itself
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise RayUnavailable(f"no Ray cluster answers at {address}: {error}") from None


def replay_on_ray(
    requests: list[TraceRequest],
    planned: list[tuple[SweepPoint, ReplayOptions, Path]],
    source: Path,
    secret: bytes,
) -> Generator[PointFigures, None, None]:
    """Replay each (point, options, run file) as one Ray task of one CPU, as many at once as
    the cluster allows; yield each point's figures once its run file is in place."""
    import ray  # noqa: PLC0415 - Ray is the optional `ray` extra; only --ray loads it

    task = ray.remote(num_cpus=1)(_replay_remotely)
    requests_ref = ray.put(requests)
    pending = {
        task.remote(requests_ref, point, options, str(source), secret): out_path
        for point, options, out_path in planned
    }
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            out_path = pending.pop(done[0])
            try:
                figures, run_bytes = ray.get(done[0])
            except ray.exceptions.RayTaskError as error:
                if isinstance(error.cause, TraceError | StoreError):
                    raise error.cause from None  # kvscope's own refusal, as a local replay's
                raise
            _write_atomically(out_path, run_bytes)
            yield figures
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def _replay_remotely(
    requests: list[TraceRequest],
    point: SweepPoint,
    options: ReplayOptions,
    source: str,
    secret: bytes,
) -> tuple[PointFigures, bytes]:
    """On a Ray node: the point's figures and its run file's bytes."""
    with tempfile.TemporaryDirectory(prefix="kvscope-whatif-") as folder:
        out_path = Path(folder) / point.run_name
        figures = replay_point(
            requests, point, options, out_path=out_path, source=Path(source), secret=secret
        )
        return figures, out_path.read_bytes()


def _write_atomically(path: Path, content: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        temporary.write_bytes(content)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
