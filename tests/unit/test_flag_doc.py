"""The flag table drives the parsers, the environment bindings and docs/server.md."""

from __future__ import annotations

import pytest

from kvmem.cli import flag_doc
from kvmem.cli.chat_cli import build_parser
from kvmem.cli.flag_parser import env_bindings
from kvmem.cli.flag_table import FLAGS, flags_for
from kvmem.cli.server_args import build_server_parser
from kvmem.settings.flag import Program, Status


def test_docs_server_md_flag_table_is_current() -> None:
    text = flag_doc.DOC.read_text(encoding="utf-8")
    assert flag_doc.current_block(text) == flag_doc.render(), (
        "run: python -m kvmem.cli.flag_doc --write"
    )


def _names(program: Program) -> set[str]:
    return {n for r in flags_for(program) for n in r.flags + r.negative}


def test_each_parser_has_exactly_its_programs_rows() -> None:
    own = {"-h", "--help", "--usage"}
    server = set(build_server_parser()._option_string_actions)
    cli = set(build_parser()._option_string_actions)
    assert server == _names(Program.SERVER) | own | {"--version"}
    assert cli == _names(Program.CLI) | own
    assert "--slots" in server and "--slots" not in cli
    assert "-p" in cli and "-p" not in server
    assert "--kvmem-budget" in cli and "--kvmem-budget" in server


def test_environment_bindings_come_from_the_rows() -> None:
    names = {b.name for b in env_bindings(Program.SERVER)}
    expected = {r.env for r in flags_for(Program.SERVER, Status.ACTIVE) if r.env}
    assert names == expected
    assert {"LLAMA_ARG_CTX_SIZE", "LLAMA_ARG_CACHE_TYPE_K", "LLAMA_ARG_MAIN_GPU"} <= names


@pytest.mark.parametrize("row", [r for r in FLAGS if r.status is not Status.ACTIVE])
def test_noop_and_rejected_rows_have_a_reason(row) -> None:
    assert row.reason and row.used_by(Program.SERVER) and not row.used_by(Program.CLI)


def test_doc_shows_every_server_flag_once() -> None:
    block = flag_doc.render()
    for row in flags_for(Program.SERVER):
        for name in row.flags:
            assert f"`{name}`" in block, name
