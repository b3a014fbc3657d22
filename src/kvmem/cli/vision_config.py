"""The vision flags (-mm/--mmproj, --mmproj-offload, --image-min/max-tokens, --media-path)
-> `VisionSettings`, checked before any weights load: the projector is a vision GGUF whose
output width is the model's embedding size, the token bounds are ordered, the media
directory exists."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kvmem.engine.settings import VisionSettings
from kvmem.errors import ConfigError
from kvmem.gguf.mmproj_meta import check_projector
from kvmem.gguf.model_path import resolve_model_path

_ONLY_WITH_MMPROJ = ("image_min_tokens", "image_max_tokens", "media_path")


def vision_from_values(v: dict[str, Any], model: str | None) -> VisionSettings | None:
    """None without --mmproj (the other vision flags are then refused)."""
    mmproj = v.get("mmproj")
    if mmproj is None:
        for key in _ONLY_WITH_MMPROJ:
            if v.get(key) is not None:
                flag = "--" + key.replace("_", "-")
                raise ConfigError(flag, "needs a vision projector (-mm/--mmproj)")
        return None
    check_projector(str(mmproj), resolve_model_path(model))
    lo, hi = v.get("image_min_tokens"), v.get("image_max_tokens")
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError("--image-min-tokens", f"{lo} is more than --image-max-tokens {hi}")
    media = v.get("media_path")
    if media is not None and not Path(media).is_dir():
        raise ConfigError("--media-path", f"not a directory: {media}")
    threads = v.get("threads")
    return VisionSettings(
        mmproj=str(mmproj),
        offload=bool(v.get("mmproj_offload", True)),
        image_min_tokens=lo or 0,
        image_max_tokens=hi or 0,
        n_threads=threads if isinstance(threads, int) and threads > 0 else os.cpu_count() or 1,
    )
