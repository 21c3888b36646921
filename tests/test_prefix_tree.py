"""Prefix-tree queries on a small real run (tests/support/runs.py), with exact rows; merging runs of
blocks; token ids to text and back with a tokenizer built on the spot and with Mistral's, as
the mistral_common package ships it (nothing is downloaded)."""

from __future__ import annotations

import importlib.resources
import shutil
from pathlib import Path

import pandas as pd
import pytest

from collector import token_text
from collector.queries import prefix_tree
from collector.queries.config import recorded_tokenizer
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from tests.support.runs import hex_names, shared_prefix_run, stored_hashes


@pytest.fixture
def run_file(tmp_path: Path) -> RunFile:
    return RunFile.open(shared_prefix_run(tmp_path))


def test_tree_nodes(run_file: RunFile) -> None:
    names = hex_names(run_file)
    nodes = prefix_tree.tree_nodes(run_file, time_grid(run_file).whole_run())
    assert nodes.to_dict("records") == [
        {"block_hash": names["A1"], "block_position": 0, "hits": 2, "tenant": "a",
         "lora": None, "first_stored_s": 0.0, "parent": ""},
        {"block_hash": names["A2"], "block_position": 1, "hits": 1, "tenant": "a",
         "lora": None, "first_stored_s": 0.0, "parent": names["A1"]},
    ]  # fmt: skip
    # The hottest one only: A2's parent is then not drawn.
    top = prefix_tree.tree_nodes(run_file, time_grid(run_file).whole_run(), max_nodes=1)
    assert top["block_hash"].tolist() == [names["A1"]]


def test_tree_nodes_in_a_window_and_merged(run_file: RunFile) -> None:
    names = hex_names(run_file)
    # b0's bucket: A1 and A2 hit once each, so they merge into one node named after A2.
    nodes = prefix_tree.tree_nodes(run_file, time_grid(run_file).buckets(200, 200))
    assert nodes[["block_hash", "hits", "parent"]].to_dict("records") == [
        {"block_hash": names["A1"], "hits": 1, "parent": ""},
        {"block_hash": names["A2"], "hits": 1, "parent": names["A1"]},
    ]
    merged = prefix_tree.merge_unbranched(nodes)
    assert merged.to_dict("records") == [
        {"block_hash": names["A2"], "parent": "", "first_position": 0, "block_position": 1,
         "blocks": 2, "hits": 1, "tenant": "a", "lora": None, "first_stored_s": 0.0},
    ]  # fmt: skip


def _nodes(rows: list[tuple[str, str, int, int]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["block_hash", "parent", "block_position", "hits"])
    return frame.assign(tenant="t", lora=None, first_stored_s=0.0)


def test_merge_unbranched_keeps_branches_and_uneven_hits() -> None:
    # r - a - b (b: two children c, d); d - e (fewer hits: not merged); f a second root.
    nodes = _nodes(
        [
            ("r", "", 0, 9),
            ("a", "r", 1, 9),
            ("b", "a", 2, 9),
            ("c", "b", 3, 5),
            ("d", "b", 3, 4),
            ("e", "d", 4, 3),
            ("f", "", 0, 1),
        ]
    )
    merged = prefix_tree.merge_unbranched(nodes)
    shape = merged[["block_hash", "parent", "first_position", "block_position", "blocks"]]
    assert shape.to_dict("records") == [
        {"block_hash": "b", "parent": "", "first_position": 0, "block_position": 2, "blocks": 3},
        {"block_hash": "c", "parent": "b", "first_position": 3, "block_position": 3, "blocks": 1},
        {"block_hash": "d", "parent": "b", "first_position": 3, "block_position": 3, "blocks": 1},
        {"block_hash": "e", "parent": "d", "first_position": 4, "block_position": 4, "blocks": 1},
        {"block_hash": "f", "parent": "", "first_position": 0, "block_position": 0, "blocks": 1},
    ]
    assert prefix_tree.chain_to(nodes, "e") == ["r", "a", "b", "d", "e"]
    single = prefix_tree.single_blocks(nodes)
    assert (single["blocks"] == 1).all()
    assert single["first_position"].tolist() == nodes["block_position"].tolist()


def test_node_details_summary_and_history(run_file: RunFile) -> None:
    hashes = stored_hashes(run_file)
    whole = time_grid(run_file).whole_run()
    details = prefix_tree.node_details(run_file, hashes["A1"], whole)
    assert details.summary == prefix_tree.NodeSummary(
        hits=2,
        stores=1,
        restores=0,
        evictions=0,
        requests=3,
        first_use_s=0.0,
        last_use_s=0.02,
        block_position=0,
        parent_hash="",
        tenant="a",
        lora=None,
        first_stored_by="a0",
        cached_s=0.03,
    )
    evicted = prefix_tree.node_details(run_file, hashes["B3"], whole).summary
    assert (evicted.evictions, evicted.cached_s, evicted.parent_hash) == (
        1,
        0.02,
        f"{hashes['A2']:016x}",
    )
    history = details.history
    assert history.to_dict("records") == [
        {"t_s": 0.0, "kind": "store", "request_id": "a0", "tenant": "a", "lora": None,
         "block_id": 1},
        {"t_s": 0.01, "kind": "hit", "request_id": "b0", "tenant": "b", "lora": None,
         "block_id": 1},
        {"t_s": 0.02, "kind": "hit", "request_id": "a1", "tenant": "a", "lora": None,
         "block_id": 1},
    ]  # fmt: skip
    cut = prefix_tree.node_details(run_file, hashes["A1"], whole, history_rows=2)
    assert cut.history.to_dict("records") == history.to_dict("records")[:2]
    assert cut.summary == details.summary  # the summary counts every row, not the first 2
    late = time_grid(run_file).buckets(300, 600)
    assert prefix_tree.node_details(run_file, hashes["A1"], late).summary.requests == 1
    with pytest.raises(LookupError, match="not in this run"):
        prefix_tree.node_details(run_file, 12345, whole)


def test_block_and_chain_token_ids(run_file: RunFile) -> None:
    names = hex_names(run_file)
    assert prefix_tree.has_token_ids(run_file)
    chains = [
        [names["A1"], names["A2"]],
        [names["A1"], names["C2"]],
        [names["A1"], "00000000000000ff"],  # no such block
    ]
    tokens = prefix_tree.block_token_ids(run_file, {block for chain in chains for block in chain})
    assert set(tokens) == {names["A1"], names["A2"], names["C2"]}
    assert prefix_tree.chain_token_ids(tokens, chains) == [
        list(range(1, 9)),
        [1, 2, 3, 4, 21, 22, 23, 24],
        None,
    ]


def write_word_tokenizer(folder: Path, vocabulary_size: int) -> Path:
    """A real word-level tokenizer (token i is the word "w<i>"), saved as tokenizer.json."""
    from tokenizers import Tokenizer, models  # noqa: PLC0415 - tokenizers is optional: only token text needs it

    vocabulary = {f"w{index}": index for index in range(vocabulary_size)}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="w0"))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_token_text_with_a_local_tokenizer(tmp_path: Path) -> None:
    folder = write_word_tokenizer(tmp_path / "tokenizer", 30)
    tokenizer = token_text.load_local_tokenizer(str(folder))
    assert tokenizer is not None
    assert tokenizer.decode([1, 2, 21]) == "w1 w2 w21"
    assert token_text.load_local_tokenizer(str(folder / "tokenizer.json")) is not None


def test_token_text_with_a_sentencepiece_model_in_a_package(tmp_path: Path) -> None:
    tokenizer = token_text.load_local_tokenizer(token_text.SAMPLE_TOKENIZER)
    assert tokenizer is not None
    ids = tokenizer.encode("Daily operations report.")
    assert tokenizer.decode(ids) == "Daily operations report."
    # The same file by its path, and in a folder as tokenizer.model.
    file = Path(str(importlib.resources.files("mistral_common") / "data/tokenizer.model.v1"))
    by_path = token_text.load_local_tokenizer(str(file))
    assert by_path is not None and by_path.encode("Daily operations report.") == ids
    (tmp_path / "model").mkdir()
    shutil.copy(file, tmp_path / "model" / "tokenizer.model")
    in_folder = token_text.load_local_tokenizer(str(tmp_path / "model"))
    assert in_folder is not None and in_folder.decode(ids) == "Daily operations report."
    assert token_text.load_local_tokenizer("mistral_common:data/no-such-file") is None
    assert token_text.load_local_tokenizer("no_such_package:data/tokenizer.model") is None


def test_no_tokenizer_means_none(tmp_path: Path) -> None:
    assert token_text.load_local_tokenizer("") is None
    assert token_text.load_local_tokenizer("kvscope-tests/no-such-model") is None
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json")
    assert token_text.load_local_tokenizer(str(broken)) is None
    not_a_model = tmp_path / "tokenizer.model"
    not_a_model.write_bytes(b"not a SentencePiece model")
    assert token_text.load_local_tokenizer(str(not_a_model)) is None


def test_the_tokenizer_a_run_names() -> None:
    assert recorded_tokenizer({"options": '{"tokenizer": "t", "model": "m"}'}) == "t"
    assert recorded_tokenizer({"options": {"model": "meta-llama/Llama-3.1-8B"}}) == (
        "meta-llama/Llama-3.1-8B"
    )
    assert recorded_tokenizer({"options": '{"tokenizer": null}'}) == ""
    assert recorded_tokenizer({"options": None}) == ""
