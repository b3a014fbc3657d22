"""The llama.cpp adapter: the only package that imports llama_cpp.

Subpackages: `llama` (library, model, context, sampler), `session` (the turn and the GPU
window), `query`, `transfer`, `hybrid`, `spec`, `media`, `persist`; `build` assembles a
session from its parts. Import names from their modules; this package exports nothing, so
importing a record such as `kvmem.engine.settings.EngineSettings` does not load llama_cpp.
"""
