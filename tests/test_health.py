"""The health scorecard (collector/health/): on the sample runs each line's status is the one
its own figures imply under the shipped thresholds; runs made bad on purpose (a pool far too
small, a cache salt per request, a fleet routed by prefix affinity or round-robin) turn red
lines that name the cause; the thresholds file overrides the defaults key by key and bad
input names its file and key; the Overview shows the scorecard, linked, above its charts."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from collector.advisor.context import RunContext
from collector.cli import main
from collector.health.line import HealthLine
from collector.health.scorecard import scorecard
from collector.health.thresholds import (
    DEFAULTS,
    ENVIRONMENT,
    HealthThresholdsError,
    load_thresholds,
)
from collector.queries.miss_causes import cause_totals
from collector.queries.pool import free_block_extremes
from collector.queries.summary import run_summary
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay_requests
from collector.replay.traces import read_trace
from collector.store.run_file import RunFile
from tests.support.app import start
from tests.support.repo import SAMPLE_HYBRID_RUN, SAMPLE_RUN, SAMPLE_TRACE, SECRET
from visualizer.pages import PAGES

SAMPLE_TIER_RUN = SAMPLE_RUN.with_name("run_tier.duckdb")
NAMES = (
    "Hit ratio against this traffic's ceiling",
    "Biggest miss cause",
    "Pool pressure",
    "Hot prefixes evicted and stored again",
    "Collisions and dropped records",
    "Fleet balance and routing",
    "Advisor's top action",
)
# The page each line links to, in the scorecard's order.
PAGE_ORDER = (
    "policies",
    "requests",
    "free_blocks",
    "free_blocks",
    "collisions",
    "fleet",
    "advisor",
)


def lines_of(path: Path) -> dict[str, HealthLine]:
    with RunFile.open(path) as run:
        lines = scorecard(run, load_thresholds(DEFAULTS))
    assert tuple(line.name for line in lines) == NAMES
    return {line.name: line for line in lines}


def band(value: float, amber: float, red: float) -> str:
    return "red" if value >= red else "amber" if value >= amber else "green"


@pytest.mark.parametrize("path", [SAMPLE_RUN, SAMPLE_HYBRID_RUN, SAMPLE_TIER_RUN])
def test_each_sample_lines_status_follows_from_its_figures(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))  # no advice kept: the advisor line grey
    with RunFile.open(path) as run:
        summary = run_summary(run)
        curve = RunContext(run, path).curve  # the advisor's one-pass curve, the same ceiling
        totals = cause_totals(run).set_index("cause")["share"]
        pool = free_block_extremes(run)
    lines = lines_of(path)
    served = summary["token_hit_ratio"] + summary["tier_token_hit_ratio"]
    ceiling = curve.hit_blocks[-1] * curve.block_size / curve.prompt_tokens
    reach = served / ceiling
    hit = lines[NAMES[0]]
    assert hit.status == ("amber" if 0.6 <= reach < 0.9 else "other")
    assert f"{served:.1%} of prompt tokens" in hit.sentence
    assert f"{reach:.0%} of the {ceiling:.1%} an unlimited cache" in hit.sentence
    # The sample loses tokens to evictions (14.9-15.9 %): amber on both lines that judge it.
    evicted = totals["evicted"]
    assert 0.05 <= evicted < 0.20
    assert lines[NAMES[1]].status == "amber"
    assert f"the biggest avoidable one is evicted at {evicted:.1%}" in lines[NAMES[1]].sentence
    assert lines[NAMES[3]].status == band(evicted, 0.05, 0.20) == "amber"
    assert f"evictions cost {evicted:.1%} of the prompt tokens" in lines[NAMES[3]].sentence
    assert pool["low_free_time_share"] < 0.05 and summary["preemptions"] / 500 < 0.01
    assert lines[NAMES[2]].status == "green"
    assert summary["collisions"] == summary["dropped_events"] == 0
    assert lines[NAMES[4]].status == "green"
    assert lines[NAMES[4]].sentence.startswith("0 hash collisions in ")
    assert lines[NAMES[5]].status == lines[NAMES[6]].status == "grey"
    assert tuple(line.page for line in lines.values()) == PAGE_ORDER


def test_the_sample_names_its_biggest_loss_and_what_it_could_not_tell(tmp_path: Path) -> None:
    sample, tier = lines_of(SAMPLE_RUN), lines_of(SAMPLE_TIER_RUN)
    assert sample[NAMES[1]].sentence.startswith(
        "The biggest loss is diverged from a cached prefix, inherent to the traffic, at 26.9%"
    )
    # The tier sample recorded no token ids, but its key-free fingerprints tell every cause.
    assert tier[NAMES[1]].sentence == (
        "The biggest loss is diverged from a cached prefix, inherent to the traffic, at 26.9%; "
        "the biggest avoidable one is evicted at 8.8%."
    )
    assert "(the offload tier's loads included)" in tier[NAMES[0]].sentence
    # Neither token ids nor fingerprints: a key mismatch cannot be told from a cold block.
    blind = lines_of(replayed(tmp_path, "blind", 80, check_collisions=False))
    assert blind[NAMES[1]].sentence.startswith(
        "The biggest loss is unexplained, could not be told, at 40.1%"
    )


def replayed(tmp_path: Path, name: str, limit: int, **options: object) -> Path:
    """The sample trace's first `limit` requests replayed (a cache salt per request with
    `salted`), into tmp_path/NAME.duckdb."""
    salted = options.pop("salted", False)
    requests = read_trace(SAMPLE_TRACE, limit=limit)
    if salted:
        requests = [
            dataclasses.replace(request, cache_salt=f"user-{index}")
            for index, request in enumerate(requests)
        ]
    out = tmp_path / f"{name}.duckdb"
    replay_requests(requests, SAMPLE_TRACE, out, ReplayOptions(**options), SECRET)  # type: ignore[arg-type]
    return out


def test_a_pool_far_too_small_is_red_and_names_evictions(tmp_path: Path) -> None:
    # The longest of the first 40 prompts takes 105 blocks: 115 leaves room for little else.
    path = replayed(tmp_path, "small", 40, settings=CacheSettings(16, 115))
    with RunFile.open(path) as run:
        evicted = float(cause_totals(run).set_index("cause")["share"]["evicted"])
    lines = lines_of(path)
    assert evicted >= 0.20
    assert lines[NAMES[0]].status == "red"
    assert lines[NAMES[1]].status == "red"
    assert f"the biggest avoidable one is evicted at {evicted:.1%}" in lines[NAMES[1]].sentence
    assert lines[NAMES[3]].status == "red"
    assert "evicted blocks were needed again and stored afresh" in lines[NAMES[3]].sentence


def test_a_salt_per_request_is_red_and_names_the_cache_salt(tmp_path: Path) -> None:
    lines = lines_of(replayed(tmp_path, "salted", 40, salted=True))
    cause = lines[NAMES[1]]
    assert cause.status == "red"
    assert cause.sentence.startswith("The biggest loss is same tokens, another key (cache_salt): ")
    # No cache size helps requests keyed apart: the hit line says so rather than judging.
    assert "an unlimited cache would reach only 0.0%" in lines[NAMES[0]].sentence


def test_a_fleet_routed_by_prefix_affinity_is_red_for_its_idle_engine(tmp_path: Path) -> None:
    path = replayed(tmp_path, "affinity", 120, engines=4, router="prefix-affinity")
    fleet = lines_of(path)[NAMES[5]]
    assert fleet.status == "red"
    assert "engine-3 got 11 requests against the others' mean of 36 (0.30x)" in fleet.sentence


def test_a_round_robin_fleet_is_red_for_its_routing_misses(tmp_path: Path) -> None:
    path = replayed(tmp_path, "round_robin", 120, engines=4)
    with RunFile.open(path) as run:
        routed = float(cause_totals(run).set_index("cause")["share"]["other_engine"])
    lines = lines_of(path)
    assert routed >= 0.10
    assert lines[NAMES[5]].status == "red"
    assert (
        f"{routed:.1%} of the prompt tokens missed because another engine had them cached"
        in lines[NAMES[5]].sentence
    )
    # Round-robin spreads 120 requests 30 to an engine: the line says so, naming no engine.
    assert (
        "Of 4 engines, the requests spread evenly (the farthest engine from the others' "
        "mean at 1.00x); no engine's hit ratio lags" in lines[NAMES[5]].sentence
    )
    assert "(each engine on its own pool)" in lines[NAMES[0]].sentence


def test_a_thresholds_file_overrides_the_defaults_key_by_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "health.toml"
    own.write_text("[pool]\namber_time_share = 0.001\n")
    monkeypatch.setenv(ENVIRONMENT, str(own))
    limits = load_thresholds()
    assert limits["pool"]["amber_time_share"] == 0.001
    assert limits["pool"]["red_time_share"] == 0.25  # the default, untouched
    with RunFile.open(SAMPLE_RUN) as run:
        lines = {line.name: line for line in scorecard(run)}
    assert lines["Pool pressure"].status == "amber"  # 0.7 % of the time under 10 % free


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[pool]\namber_share = 1\n", "unknown key 'pool.amber_share'"),
        ("[pools]\n", "unknown section [pools]"),
        ("[pool]\nred_time_share = -1\n", "'pool.red_time_share' must be >= 0"),
        ("[miss_cause]\ninherent = 'cold'\n", "'miss_cause.inherent' must be a list"),
        ("[pool\n", "not valid TOML"),
    ],
)
def test_a_bad_thresholds_file_names_its_file_and_key(
    tmp_path: Path, text: str, reason: str
) -> None:
    own = tmp_path / "health.toml"
    own.write_text(text)
    with pytest.raises(HealthThresholdsError, match=re.escape(reason)) as raised:
        load_thresholds(own)
    assert str(raised.value).startswith(f"{own}: ")


def test_the_overview_opens_on_the_scorecard_with_its_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))  # no advice kept for the sample
    app = start(SAMPLE_RUN)
    subheaders = [subheader.value for subheader in app.subheader]
    assert subheaders[0] == "Health"  # above the miss-cause waterfall's verdict
    assert subheaders[1].startswith("53.6% of prompt tokens were served from the cache")
    lines = [markdown.value for markdown in app.markdown if "-badge[" in markdown.value]
    assert len(lines) == len(NAMES)
    assert lines[0].startswith(":orange-badge[look] **Hit ratio against this traffic's ceiling.**")
    assert lines[4].startswith(":green-badge[healthy] **Collisions and dropped records.**")
    assert lines[6].startswith(":gray-badge[n/a] **Advisor's top action.**")
    titles = {page.url_path: page.title for page in PAGES}
    links = [(link.proto.label, link.proto.page) for link in app.get("page_link")]
    assert links[: len(PAGE_ORDER)] == [(titles[page], page) for page in PAGE_ORDER]
    assert links[len(PAGE_ORDER) :] == [("Advisor", "advisor")]  # diverged tokens' rule


def test_kvscope_summary_prints_the_scorecard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["summary", str(SAMPLE_RUN), "--health"]) == 0
    printed = capsys.readouterr().out.split("\nhealth (the whole run; docs/health.md):\n")[1]
    lines = lines_of(SAMPLE_RUN)
    assert printed.splitlines() == [
        f"  {line.status:<5}  {line.name}: {line.sentence} [{line.page}]" for line in lines.values()
    ]
    assert main(["summary", str(SAMPLE_RUN), "--health", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["health"]
    assert [line["status"] for line in shown] == [line.status for line in lines.values()]
    own = tmp_path / "health.toml"
    own.write_text("[fleet]\nred_hit_gap = 'wide'\n")
    monkeypatch.setenv(ENVIRONMENT, str(own))
    assert main(["summary", str(SAMPLE_RUN), "--health"]) == 2
    assert f"{own}: 'fleet.red_hit_gap' must be a number, got 'wide'" in capsys.readouterr().err
