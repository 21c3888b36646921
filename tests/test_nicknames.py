"""Pseudonymous tenants and adapters by short, stable nicknames on every page, and back to
their names for whoever holds the secret (`kvscope names`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from collector.cli import main
from collector.model.nicknames import nickname, nicknames, with_nicknames
from engine_hooks.privacy import Pseudonymizer
from tests.support.app import go_to, start
from tests.support.block_manager import tiny_run
from tests.support.repo import SECRET


def test_a_nickname_is_two_words_picked_by_the_pseudonyms_digits() -> None:
    # 0x...c9d1: its last 6 bits are 17 ("frost", the 18th adjective), the 6 above them 39
    # ("quail", the 40th animal).
    assert nickname("tenant-0e13a5b7c9d1") == "frost-quail"
    assert nickname("lora-0e13a5b7c9d1") == "frost-quail"
    assert nickname("acme") == "acme"  # a name kept by choice is shown as it is
    assert nickname("tenant-0e13") == "tenant-0e13"  # not a pseudonym


def test_pseudonyms_that_pick_the_same_words_keep_digits_that_tell_them_apart() -> None:
    # The words come from the last three hex digits: these two share them.
    named = nicknames(["tenant-0e13a5b7c9d1", "tenant-0e17a5b7c9d1", "tenant-000000000000"])
    assert named == {
        "tenant-0e13a5b7c9d1": "frost-quail-0e13",
        "tenant-0e17a5b7c9d1": "frost-quail-0e17",
        "tenant-000000000000": "amber-badger",
    }


def test_one_naming_over_several_columns() -> None:
    frame = pd.DataFrame(
        {
            "stored_tenant": ["tenant-0e13a5b7c9d1", None],
            "hit_tenant": ["acme", "tenant-0e13a5b7c9d1"],
        }
    )
    named = with_nicknames(frame, "stored_tenant", "hit_tenant", "not_a_column")
    assert named["stored_tenant"][0] == "frost-quail" and pd.isna(named["stored_tenant"][1])
    assert named["hit_tenant"].tolist() == ["acme", "frost-quail"]


def rows() -> list[dict[str, object]]:
    shared = list(range(1, 17))
    return [
        {
            "request_id": f"r{index}",
            "timestamp": index,
            "token_ids": shared + [100 + index] * 4,
            "output_length": 1,
            "tenant": ("acme", "globex")[index % 2],
            "lora": "globex-sql" if index % 2 else None,
            "cache_salt": "acme-salt" if index % 2 == 0 else None,
        }
        for index in range(6)
    ]


def test_the_tenants_page_shows_nicknames(tmp_path: Path) -> None:
    run = tiny_run(tmp_path, rows(), num_blocks=40)
    app = go_to(start(run), "views/tenants.py")
    assert not app.exception, app.exception
    table = next(table.value for table in app.dataframe if "adapter" in table.value)
    pseudonyms = Pseudonymizer(SECRET)
    acme, globex = (nickname(str(pseudonyms.tenant(name))) for name in ("acme", "globex"))
    assert set(table["tenant"]) == {acme, globex}
    assert set(table["adapter"]) == {"(none)", nickname(str(pseudonyms.lora("globex-sql")))}
    assert all("-" in name and not name.startswith("tenant-") for name in table["tenant"])


def test_names_maps_pseudonyms_back_with_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tiny_run(tmp_path, rows(), num_blocks=40)
    names = tmp_path / "names.txt"
    names.write_text("acme\nglobex-sql\nacme-salt\nsomeone-else\n")
    monkeypatch.setenv("KVSCOPE_SECRET", SECRET.decode())
    assert main(["names", str(run), "--names", str(names)]) == 0
    pseudonyms = Pseudonymizer(SECRET)
    lines = capsys.readouterr().out.splitlines()
    acme, globex = str(pseudonyms.tenant("acme")), str(pseudonyms.tenant("globex"))
    lora, salt = str(pseudonyms.lora("globex-sql")), str(pseudonyms.salt("acme-salt"))
    assert [line.split() for line in lines[1:-1]] == sorted(
        [
            ["adapter", lora, nickname(lora), "globex-sql"],
            ["salt", salt, "acme-salt"],
            ["tenant", acme, nickname(acme), "acme"],
            ["tenant", globex, nickname(globex), "(not", "among", "the", "names", "given)"],
        ]
    )
    assert lines[-1] == "3 of 4 labels named with this machine's secret"
    # Another secret names nothing.
    monkeypatch.setenv("KVSCOPE_SECRET", "another-secret")
    assert main(["names", str(run), "--names", str(names)]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1] == "0 of 4 labels named with this machine's secret"
    )


def test_names_needs_a_readable_names_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tiny_run(tmp_path, rows(), num_blocks=40)
    assert main(["names", str(run), "--names", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt: cannot read" in capsys.readouterr().err
