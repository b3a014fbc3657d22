"""The chat layer: templates, thinking, tool calls, messages -> tokens, and one assistant turn.

Entry points (import from the modules; this package imports nothing, so a template-only
user does not load llama.cpp):
- `kvmem.chat.template.ChatTemplate.from_engine_info(info, override)` and `.render(...)`;
- `kvmem.chat.prompt.build_prompt_tokens(engine, template, messages, ...)` -> `PromptTokens`;
- `kvmem.chat.turn.run_turn(engine, TurnRequest(...))` -> content/reasoning/tool-call events.
"""
