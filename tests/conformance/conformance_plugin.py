"""A pytest plugin for llama.cpp's server suite run against kvmem-server.

The suite's session fixture first starts every preset once to download its model from
the Hugging Face hub. Nothing is downloaded here (the launcher maps every preset to the
local SmolLM2 file), and some presets start features kvmem-server rejects on purpose
(`--embedding`), so that warm-up is skipped; every test still starts its own server.
"""

from __future__ import annotations


def pytest_sessionstart(session) -> None:  # noqa: ANN001 - pytest hook signature
    import utils  # the suite's own module (its directory is the rootdir)

    utils.ServerPreset.load_all = staticmethod(lambda: None)
