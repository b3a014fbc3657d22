"""The vision flags are checked before any weights load: the projector must be a vision
GGUF feeding the model's embedding size; token bounds ordered; --media-path a directory;
the token bounds need --mmproj; --media-path without it starts with a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmem.bench.synth_mmproj import MmprojShape, write_mmproj
from kvmem.cli.server_config import load_server_settings
from kvmem.engine_settings import VisionSettings
from kvmem.errors import ConfigError


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory) -> str:
    return str(write_mmproj(tmp_path_factory.mktemp("mm") / "mm.gguf", MmprojShape()))


def load(*argv: str):
    return load_server_settings(list(argv), {})[0]


@pytest.mark.model
def test_projector_for_the_default_model(mmproj: str, tmp_path: Path) -> None:
    s = load("-mm", mmproj, "--image-max-tokens", "64", "--image-min-tokens", "8", "-t", "3")
    assert s.engine.vision == VisionSettings(mmproj, True, 8, 64, 3)
    vision = s.engine.vision
    assert (s.mmproj, vision.image_min_tokens, vision.image_max_tokens, s.media_path) == (
        mmproj,
        8,
        64,
        None,
    )
    s = load("--mmproj", mmproj, "--no-mmproj-offload", "--media-path", str(tmp_path))
    assert s.engine.vision is not None and s.engine.vision.offload is False
    assert s.media_path == str(tmp_path)
    assert load().engine.vision is None


@pytest.mark.model
def test_projector_of_another_width_is_refused(tmp_path: Path) -> None:
    wide = write_mmproj(tmp_path / "wide.gguf", MmprojShape(n_embd_text=896))
    with pytest.raises(ConfigError, match="produces 896-wide embeddings but the model's .* 576"):
        load("-mm", str(wide))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--image-min-tokens", "8"], "--image-min-tokens: needs a vision projector"),
        (["--image-max-tokens", "8"], "--image-max-tokens: needs a vision projector"),
        (["--media-path", "/nonexistent/dir"], "--media-path: not a directory"),
        pytest.param(
            ["-mm", "{mm}", "--image-min-tokens", "9", "--image-max-tokens", "8"],
            "is more than",
            marks=pytest.mark.model,  # the projector is checked against the default model
        ),
        pytest.param(
            ["-mm", "{mm}", "--media-path", "/nonexistent/dir"],
            "not a directory",
            marks=pytest.mark.model,
        ),
        (["-mm", "/nonexistent/mm.gguf"], "--mmproj: file not found"),
    ],
)
def test_bad_vision_flags(mmproj: str, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(*[a.replace("{mm}", mmproj) for a in argv])


@pytest.mark.model
def test_a_text_model_is_not_a_projector() -> None:
    from kvmem.gguf.model_path import default_model_path

    with pytest.raises(ConfigError, match="is not a multimodal projector"):
        load("-mm", default_model_path())


def test_media_path_without_a_projector_starts_with_a_warning(tmp_path: Path) -> None:
    """llama-server starts a text model with --media-path; so does kvmem-server, saying the
    flag has no effect (an image part then gets 400: no vision projector is loaded)."""
    settings, warnings = load_server_settings(["--media-path", str(tmp_path)], {})
    assert (settings.mmproj, settings.engine.vision, settings.media_path) == (
        None,
        None,
        str(tmp_path),
    )
    assert warnings == [
        "--media-path has no effect without a vision projector (-mm): image parts get 400"
    ]
    assert load_server_settings([], {})[1] == []
