"""The collector's own limits on what engines may claim over its socket.

Every count, size and number a batch carries is bounded here, never by what the sender says
of itself: a header that claims a pool of two billion blocks, a ten-thousandth engine, a
record numbered 2^63 - 1 or a millionth tenant is refused whole (or, for labels, folded),
and counted. The defaults fit any engine vLLM runs today with room to spare, and bound the
collector's own memory beside DuckDB's (`--memory-limit`) to about half a gigabyte; `kvscope
collect --limit NAME=N` raises one (docs/privacy-and-security.md, "Limits").

- `engines`: engine and DP-rank pairs in one run (each holds a cache mirror and a stream).
- `pool-blocks`: blocks in one engine's KV cache pool. 4,194,304 is four times vLLM's
  largest pools in practice (a 0.5B model, 12 KiB of KV per token, on a 141 GB GPU at block
  size 16 makes about 700 thousand blocks); an engine's mirror costs 18 bytes a block.
- `total-pool-blocks`: the pools of all the run's engines together, so that the mirrors
  together stay within 18 bytes times this (302 MB at 16,777,216).
- `seq-jump`: how far one batch may move an engine's record numbers on (records missing
  in one gap, stored as one `drop`): 2^32 is half a day of records lost at 100 thousand a
  second.
- `tokens`: tokens in one request (prompt, hits, output), in one block, and block positions
  in a request: 16,777,216 is over the longest context any model has (10 million), and
  keeps every sum and product of them the run file's queries make within their columns.
- `tenants`, `adapters`: tenant and LoRA adapter names tracked for the Prometheus labels;
  the rest are counted under "other".
- `requests`: requests in flight whose tenant is remembered until their lookup (the oldest
  are forgotten first: a request that never finishes does not stay).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

# Record times, in nanoseconds, lie in [0, MAX_TS_NS): the engines' clocks (vLLM's
# monotonic clock) start near 0 and 2^62 ns is 146 years, so any difference of two times,
# or a sum of a few, fits the run file's 64-bit columns.
MAX_TS_NS = 1 << 62


class LimitError(ValueError):
    """A `--limit` setting that names no limit or gives no positive whole number."""


@dataclass(frozen=True)
class Limits:
    engines: int = 256
    pool_blocks: int = 4_194_304
    total_pool_blocks: int = 16_777_216
    seq_jump: int = 1 << 32
    tokens: int = 1 << 24
    tenants: int = 100
    adapters: int = 20
    requests: int = 65_536

    @classmethod
    def names(cls) -> list[str]:
        """The limits' names as `--limit` takes them."""
        return [field.name.replace("_", "-") for field in fields(cls)]

    @classmethod
    def parse(cls, settings: Iterable[str]) -> Limits:
        """Defaults, with each `NAME=N` setting applied in turn."""
        limits = cls()
        for setting in settings:
            name, _, value = setting.partition("=")
            if name not in cls.names():
                raise LimitError(
                    f"--limit {setting}: no limit named {name!r} (one of: {', '.join(cls.names())})"
                )
            number = value.replace("_", "").replace(",", "")
            if not re.fullmatch(r"[0-9]{1,19}", number) or not 1 <= int(number) <= 1 << 62:
                raise LimitError(f"--limit {setting}: give a whole number from 1 to 2^62")
            limits = replace(limits, **{name.replace("-", "_"): int(number)})
        return limits
