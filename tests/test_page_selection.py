"""Only the pages a run has something for (visualizer/page_selection.py): on the sample runs
and a hand-built run of two engines whose collision check was off, which pages the navigation
hides and the Overview's one line naming them; a hidden page still opens by its address."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.queries.features import RunFeatures, run_features
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks.events import Pool
from tests.support.app import go_to, start
from tests.support.repo import SAMPLE_RUN
from visualizer.page_selection import navigation_for, note
from visualizer.pages import PAGES
from visualizer.views.fleet import ONE_ENGINE_NOTE

SAMPLE_NOTE = (
    "KV cache groups, Fleet, vLLM KV events: not in this run (one KV cache group, one engine, "
    "no vLLM KV events), so left out of the navigation."
)


def features_of(run: Path) -> RunFeatures:
    return run_features(RunFile.open(run))


def hidden(features: RunFeatures | None) -> list[str]:
    pages = navigation_for(features)
    return [
        page.title for page, shown in zip(PAGES, pages, strict=True) if shown.visibility == "hidden"
    ]


@pytest.fixture(scope="module")
def two_engine_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two engines' pool snapshots, recorded without the collision check."""
    path = tmp_path_factory.mktemp("two_engines") / "run.duckdb"
    config = RunConfig("test", 4, 10, "sha256", "test", options={"check_collisions": False})
    store = RunStore.create(path, config)
    for engine_id in ("a", "b"):
        snapshot = Pool(0, 0, None, 9, None, 0)
        snapshot.engine_id = engine_id
        store.append([snapshot])
    store.finalize()
    store.close()
    return path


def test_the_single_engine_sample_hides_groups_fleet_and_vllm_kv_events() -> None:
    features = features_of(SAMPLE_RUN)
    assert features == {
        "kv_groups": 1,
        "hybrid": False,
        "engines": 1,
        "vllm_kv_events": False,
        "collisions_checked": True,
    }
    assert hidden(features) == ["KV cache groups", "Fleet", "vLLM KV events"]
    assert note(features) == SAMPLE_NOTE


def test_the_hybrid_sample_shows_its_kv_cache_groups() -> None:
    features = features_of(SAMPLE_RUN.with_name("run_hybrid.duckdb"))
    assert features["kv_groups"] == 2
    assert hidden(features) == ["Fleet", "vLLM KV events"]
    assert note(features).startswith("Fleet, vLLM KV events: not in this run (one engine, no")


def test_the_tier_sample_shows_the_vllm_kv_events_it_received() -> None:
    features = features_of(SAMPLE_RUN.with_name("run_tier.duckdb"))
    assert features["vllm_kv_events"]
    assert hidden(features) == ["KV cache groups", "Fleet"]


def test_two_engines_show_fleet_and_an_unchecked_run_hides_collisions(
    two_engine_run: Path,
) -> None:
    features = features_of(two_engine_run)
    assert (features["engines"], features["collisions_checked"]) == (2, False)
    assert hidden(features) == ["KV cache groups", "Collisions", "vLLM KV events"]
    assert "(one KV cache group, collision check off, no vLLM KV events)" in note(features)


def test_a_run_that_cannot_be_read_shows_every_page() -> None:
    assert hidden(None) == []
    assert note(None) == ""


def test_the_overview_names_the_pages_left_out_and_they_still_open() -> None:
    app = start(SAMPLE_RUN)
    assert SAMPLE_NOTE in [caption.value for caption in app.caption]
    fleet = go_to(app, "views/fleet.py")
    assert [title.value for title in fleet.title] == ["Fleet"]
    assert fleet.info[0].value == ONE_ENGINE_NOTE


def test_a_damaged_run_names_no_page_left_out(tmp_path: Path) -> None:
    path = tmp_path / "not_a_run.duckdb"
    path.write_text("not a run\n")
    app = start(path)
    assert app.error  # the Overview says it cannot show this run
    assert not [caption for caption in app.caption if "left out" in caption.value]
