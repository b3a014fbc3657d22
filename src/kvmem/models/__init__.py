"""Named models shipped as PyPI packages (standard library only).

`kvmem.models` may be imported by `cli`, `server` and `bench`; it never imports llama_cpp.
"""

from .assemble import default_cache_dir, ensure_model, file_md5, is_verified, locate_part
from .catalog import MODELS, QWEN_05B, ModelPart, PartedModel, lookup, model_names
from .resolve import resolve_model_arg, resolve_model_flag

__all__ = [
    "MODELS",
    "QWEN_05B",
    "ModelPart",
    "PartedModel",
    "default_cache_dir",
    "ensure_model",
    "file_md5",
    "is_verified",
    "locate_part",
    "lookup",
    "model_names",
    "resolve_model_arg",
    "resolve_model_flag",
]
