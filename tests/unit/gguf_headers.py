"""GGUF files with a header and no tensors: what the pre-load metadata checks read."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFWriter


def header_gguf(path: Path, arch: str, ints: dict[str, int]) -> str:
    """A GGUF of architecture `arch` holding the uint32 keys `<arch>.<name>` of `ints`,
    after a tokenizer array (which the scans skip)."""
    writer = GGUFWriter(str(path), arch)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    for name, value in ints.items():
        writer.add_uint32(f"{arch}.{name}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)
