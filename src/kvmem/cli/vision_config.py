"""The vision flags (-mm/--mmproj, --mmproj-offload, --image-min/max-tokens, --media-path)
-> `VisionSettings`, checked before any weights load: the projector is a vision GGUF whose
output width is the model's embedding size, the token bounds are ordered, the media
directory exists. `--media-path` without a projector starts, as on llama-server, with a
warning (image parts are then refused with 400); the token bounds need one."""

from __future__ import annotations

import os
from pathlib import Path

from kvmem.cli.server_flags import VisionFlags
from kvmem.engine_settings import VisionSettings
from kvmem.errors import ConfigError
from kvmem.gguf.mmproj_meta import check_projector
from kvmem.gguf.model_path import resolve_model_path

_ONLY_WITH_MMPROJ = ("image_min_tokens", "image_max_tokens")
MEDIA_PATH_WITHOUT_MMPROJ = (
    "--media-path has no effect without a vision projector (-mm): image parts get 400"
)


def vision_from_flags(f: VisionFlags, threads: int, model: str | None) -> VisionSettings | None:
    """None without --mmproj (the token bounds are then refused)."""
    if f.media_path is not None and not Path(f.media_path).is_dir():
        raise ConfigError("--media-path", f"not a directory: {f.media_path}")
    if f.mmproj is None:
        for key in _ONLY_WITH_MMPROJ:
            if getattr(f, key) is not None:
                flag = "--" + key.replace("_", "-")
                raise ConfigError(flag, "needs a vision projector (-mm/--mmproj)")
        return None
    check_projector(f.mmproj, resolve_model_path(model))
    lo, hi = f.image_min_tokens, f.image_max_tokens
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError("--image-min-tokens", f"{lo} is more than --image-max-tokens {hi}")
    return VisionSettings(
        mmproj=f.mmproj,
        offload=f.mmproj_offload,
        image_min_tokens=lo or 0,
        image_max_tokens=hi or 0,
        n_threads=threads if threads > 0 else os.cpu_count() or 1,
    )
