"""Every kvmem-bench command with -ngl takes `all` (and N, auto), as the server's flag does."""

from __future__ import annotations

import argparse

from kvmem.bench.main import build_parser
from kvmem.settings.values import gpu_layers


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_ngl_flag_takes_all():
    with_ngl = {}
    for name, sub in _subcommands().items():
        for action in sub._actions:
            if "-ngl" in action.option_strings:
                with_ngl[name] = action
    assert {"decode-sweep", "lookup-drafts", "needle", "fidelity"} <= set(with_ngl)
    for name, action in with_ngl.items():
        assert action.type is gpu_layers, name
        assert (action.type("all"), action.type("auto"), action.type("8")) == (-1, -1, 8), name
