"""The launcher llama.cpp's server suite runs instead of llama-server (LLAMA_SERVER_BIN_PATH).

It only maps the suite's model-download flags to the local SmolLM2-135M-Instruct file:
`--hf-repo R`, `--hf-file F` and `--offline` are dropped and `-m SMOLLM2` is added when the
line names no `--model`. Every other argument goes to kvmem-server unchanged.
"""

from __future__ import annotations

import os
import sys

DOWNLOAD_FLAGS_WITH_VALUE = ("--hf-repo", "-hf", "-hfr", "--hf-file", "-hff")
DOWNLOAD_SWITCHES = ("--offline",)


def map_argv(argv: list[str], model: str) -> list[str]:
    out: list[str] = []
    skip = False
    downloads = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in DOWNLOAD_FLAGS_WITH_VALUE:
            skip, downloads = True, True
            continue
        if arg in DOWNLOAD_SWITCHES:
            continue
        out.append(arg)
    if downloads and "--model" not in out and "-m" not in out:
        out = ["-m", model, *out]
    return out


def main() -> None:
    model = os.environ["KVMEM_CONFORMANCE_MODEL"]
    server = os.environ["KVMEM_CONFORMANCE_SERVER"]
    args = map_argv(sys.argv[1:], model)
    os.execv(server, [server, *args])


if __name__ == "__main__":
    main()
