"""Cache policies across pool sizes (collector/model/policy_curves.py): exact curves and
verdicts on a trace built for them (hits known by hand), Belady's MIN on top at every size,
the chart, and the Cache policies page on the sample run showing what the model gives."""

from __future__ import annotations

import json
import random

import pytest

from collector.advisor.context import RunContext
from collector.model.kv_memory import DEFAULT_MODEL, MODELS, gib_for_blocks
from collector.model.mrc import miss_ratio_curve
from collector.model.policies import ReplayTooLarge
from collector.model.policy_curves import (
    default_pool_sizes,
    policy_curves,
    verdict,
)
from collector.store.run_file import RunFile
from tests.support.app import go_to, metrics, start
from tests.support.repo import SAMPLE_RUN
from tests.support.streams import BLOCK_SIZE, hot_and_scan, stream_of
from visualizer.charts.policies import policy_curves_figure
from visualizer.views.policies import COLUMNS

PROMPT_TOKENS = 13 * 13
HOT_HITS = 12 * BLOCK_SIZE / PROMPT_TOKENS  # the hot prompt's 3 blocks on each later visit


def test_curves_at_the_default_sizes() -> None:
    stream = hot_and_scan()
    # The pool times 1/4 to 4, capped where LRU holds all it could ever hit: 11 blocks.
    assert miss_ratio_curve(stream, BLOCK_SIZE).saturation_num_blocks == 11
    curves = policy_curves(stream, BLOCK_SIZE, 8)
    assert curves.skipped_sizes == (2, 4)
    assert curves.skipped_reason() == (
        "pools of 2 and 4 blocks are left out: the largest request needs 4 blocks besides "
        "vLLM's null block"
    )
    assert (curves.pinned_families, curves.one_off_families) == (1, 8)
    # 512 KiB a block (4 tokens of llama-3.1-8b's 128 KiB).
    assert curves.rows(MODELS["llama-3.1-8b"]) == [
        {
            "num_blocks": 8,
            "gib": 8 / 2048,
            "lru": 0.0,
            "pin": HOT_HITS,
            "admit": HOT_HITS,
            "min": HOT_HITS,
            "lru_share": 0.0,
        },
        {
            "num_blocks": 11,
            "gib": 11 / 2048,
            "lru": HOT_HITS,
            "pin": HOT_HITS,
            "admit": HOT_HITS,
            "min": HOT_HITS,
            "lru_share": 1.0,
        },
    ]
    assert "gib" not in curves.rows()[0]


def test_curves_at_every_size_hit_what_each_policy_keeps() -> None:
    curves = policy_curves(hot_and_scan(), BLOCK_SIZE, 8, sizes=range(5, 13))
    hits = [
        (point.num_blocks, point.lru.hit_blocks, point.pin.hit_blocks, point.ceiling.hit_blocks)
        for point in curves.points
    ]
    # Each block more past 5 keeps one more of H's blocks through the scans: for pinning
    # from 6 (1 pinned, 4 for the scans), for LRU from 9 (8 for the scans).
    assert hits == [
        (5, 0, 0, 0),
        (6, 0, 4, 4),
        (7, 0, 8, 8),
        (8, 0, 12, 12),
        (9, 4, 12, 12),
        (10, 8, 12, 12),
        (11, 12, 12, 12),
        (12, 12, 12, 12),
    ]
    assert [point.admit.hit_blocks for point in curves.points] == [0, 4, 8, 12, 12, 12, 12, 12]


def test_default_sizes_stop_where_lru_holds_everything() -> None:
    assert default_pool_sizes(1_200, 8_755) == [300, 600, 1_200, 2_400, 4_800]
    assert default_pool_sizes(1_200, 1_500) == [300, 600, 1_200, 1_500]
    assert default_pool_sizes(1_200, 100) == [300, 600, 1_200]


@pytest.mark.parametrize(
    ("num_blocks", "sizes", "room", "text"),
    [
        (
            8,
            None,
            "a lot",
            "At the run's 8 blocks LRU (vLLM's policy) reaches 0% of the ceiling (0.0% token hit "
            "ratio against Belady's 28.4%): this traffic leaves 28.4 points of token hit ratio "
            "for a cache policy to win (a lot). What simple policies take of it: pinning the "
            "hottest prefix family +28.4 points, leaving the 8 one-off prefix families uncached "
            "+28.4; the better of them reaches the ceiling.",
        ),
        (
            10,
            None,
            "some",
            "At the run's 10 blocks LRU (vLLM's policy) reaches 67% of the ceiling (18.9% token "
            "hit ratio against Belady's 28.4%): this traffic leaves 9.5 points of token hit "
            "ratio for a cache policy to win (some; 10 or more is a lot). What simple policies "
            "take of it: pinning the hottest prefix family +9.5 points, leaving the 8 one-off "
            "prefix families uncached +9.5; the better of them reaches the ceiling.",
        ),
        (
            12,
            None,
            "nothing",
            "At the run's 12 blocks LRU (vLLM's policy) reaches 100% of the ceiling (28.4% token "
            "hit ratio against Belady's 28.4%): this traffic leaves nothing for a cache policy "
            "to win; LRU already hits all that any policy could.",
        ),
        # A pool too small for the largest request is left out, the run's own too.
        (
            4,
            [4, 8],
            "unknown",
            "The policy replay cannot hold this run at its own 4 blocks: its largest request "
            "needs 4 blocks besides vLLM's null block.",
        ),
    ],
)
def test_verdicts_in_plain_words(
    num_blocks: int, sizes: list[int] | None, room: str, text: str
) -> None:
    said = verdict(policy_curves(hot_and_scan(), BLOCK_SIZE, num_blocks, sizes=sizes))
    assert (said.room, said.text) == (room, text)


def test_a_run_too_large_to_replay_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("collector.model.policy_curves.MAX_BLOCK_REFERENCES", 10)
    # 13 requests of 3 full blocks each.
    with pytest.raises(ReplayTooLarge, match="has 39 block references, more than the 10 "):
        policy_curves(hot_and_scan(), BLOCK_SIZE, 8)


def shared_openings(seed: int, count: int) -> list[list[int]]:
    """Prompts from a few shared openings and random tails: prefixes repeat and grow apart."""
    rng = random.Random(seed)
    openings = [[rng.randrange(1, 50) for _ in range(rng.randint(2, 14))] for _ in range(4)]
    return [
        [*rng.choice(openings), *(rng.randrange(1, 6) for _ in range(rng.randint(1, 10)))]
        for _ in range(count)
    ]


@pytest.mark.parametrize("seed", [1, 7, 11, 309, 2026])
def test_min_is_never_below_any_policy_at_any_size(seed: int) -> None:
    stream = stream_of(shared_openings(seed, 40), output_length=3)
    curve = miss_ratio_curve(stream, BLOCK_SIZE)
    sizes = range(curve.min_num_blocks, curve.saturation_num_blocks + 3)
    curves = policy_curves(stream, BLOCK_SIZE, curve.min_num_blocks + 2, sizes=sizes)
    assert [point.num_blocks for point in curves.points] == list(sizes)
    for point in curves.points:
        others = (point.lru, point.pin, point.admit)
        assert point.ceiling.hit_blocks >= max(result.hit_blocks for result in others)
    # Past the saturation size every policy hits the same.
    last = curves.points[-1]
    assert last.lru.hit_blocks == last.ceiling.hit_blocks and last.lru_share == 1.0


def test_chart_draws_each_policy_and_marks_the_runs_pool() -> None:
    rows = policy_curves(hot_and_scan(), BLOCK_SIZE, 8, sizes=[6, 8, 12]).rows()
    figure = policy_curves_figure(rows, 8)
    assert [trace.name for trace in figure.data] == [
        "LRU (vLLM)",
        "LRU + pinning",
        "LRU + admission",
        "Belady's MIN (ceiling)",
    ]
    assert [list(trace.y) for trace in figure.data] == [
        [row[key] for row in rows] for key in ("lru", "pin", "admit", "min")
    ]
    assert [trace.line.dash for trace in figure.data] == ["solid", "solid", "solid", "dash"]
    assert list(figure.data[0].x) == [6, 8, 12]
    (marker,) = figure.layout.shapes
    assert (marker.x0, marker.label.text) == (8, "this run: 8 blocks")
    assert figure.layout.xaxis.type == "log"


def test_page_shows_the_models_verdict_and_curve_on_the_sample_run() -> None:
    with RunFile.open(SAMPLE_RUN) as run_file:
        context = RunContext(run_file, SAMPLE_RUN)
        curves = policy_curves(context.block_stream, context.block_size, context.num_blocks)
    found = verdict(curves)
    app = go_to(start(), "views/policies.py")
    boxes = {"nothing": "success", "some": "info", "a lot": "warning", "unknown": "info"}
    assert [box.value for box in app.get(boxes[found.room])] == [found.text]
    point = curves.at(curves.run_num_blocks)
    assert point is not None
    assert metrics(app) == {
        "LRU (vLLM) at this pool": f"{point.lru.token_hit_ratio:.1%}",
        "Ceiling (Belady's MIN)": f"{point.ceiling.token_hit_ratio:.1%}",
        "Left to win": f"{point.gap * 100:.1f} points",
    }
    rows = curves.rows(MODELS[DEFAULT_MODEL])
    (table,) = [frame.value for frame in app.dataframe]
    shown = [{COLUMNS[key]: value for key, value in row.items()} for row in rows]
    assert table.to_dict("records") == shown
    (chart,) = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    assert len(chart["data"]) == 4
    assert "vLLM has no pinning or admission flag today" in "\n".join(
        block.value for block in app.markdown
    )
    # Another model's KV spec changes the GiB column, not the replays.
    app.selectbox(key="policies_model").set_value("llama-3.1-70b").run()
    assert not app.exception, app.exception
    (table,) = [frame.value for frame in app.dataframe]
    assert list(table[COLUMNS["gib"]]) == [
        gib_for_blocks(MODELS["llama-3.1-70b"], curves.block_size, row["num_blocks"])
        for row in rows
    ]
    assert list(table[COLUMNS["lru"]]) == [row["lru"] for row in rows]
