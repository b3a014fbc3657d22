"""Built-in chat templates for `--chat-template NAME` (llama.cpp's names), as Jinja.

Written for KVMem from the formats' public descriptions; each renders `messages` with
`add_generation_prompt`. None writes a leading BOS, as llama.cpp's built-ins do not: the
tokenizer adds it where the model's vocabulary asks for one (add_bos), so `/apply-template`
shows what llama-server shows. Llama 2 writes `bos_token` before the later `[INST]` turns
only. Message content is a string here (the chat layer flattens text parts before
rendering).
"""

from __future__ import annotations

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3 = (
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

# [INST] turns; a system message is folded into the first user turn in <<SYS>> tags.
LLAMA2 = (
    "{%- set ns = namespace(system='', bos='') %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- set ns.system = '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' %}"
    "{%- elif message['role'] == 'user' %}"
    "{{- ns.bos + '[INST] ' + ns.system + message['content'] | trim + ' [/INST]' }}"
    "{%- set ns.system = '' %}"
    "{%- set ns.bos = bos_token %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + message['content'] | trim + ' ' + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)

MISTRAL_V7 = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}"
    "{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- message['content'] + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)

# Gemma has no system role: a system message prefixes the first user turn.
GEMMA = (
    "{%- set ns = namespace(system='') %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- set ns.system = message['content'] + '\\n\\n' %}"
    "{%- else %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{- '<start_of_turn>' + role + '\\n' + ns.system + message['content'] | trim"
    " + '<end_of_turn>\\n' }}"
    "{%- set ns.system = '' %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)

PHI3 = (
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)

COMMAND_R = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{%- set role = '<|SYSTEM_TOKEN|>' %}"
    "{%- elif message['role'] == 'user' %}{%- set role = '<|USER_TOKEN|>' %}"
    "{%- else %}{%- set role = '<|CHATBOT_TOKEN|>' %}{%- endif %}"
    "{{- '<|START_OF_TURN_TOKEN|>' + role + message['content'] | trim + '<|END_OF_TURN_TOKEN|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}"
    "{%- endif %}"
)

# DeepSeek (LLM / Coder v1): "User: ...\n\nAssistant: ..." after an optional system text.
DEEPSEEK = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{- message['content'] + '\\n\\n' }}"
    "{%- elif message['role'] == 'user' %}{{- 'User: ' + message['content'] + '\\n\\n' }}"
    "{%- else %}{{- 'Assistant: ' + message['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'Assistant:' }}{%- endif %}"
)

DEEPSEEK3 = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{- message['content'] }}"
    "{%- elif message['role'] == 'user' %}{{- '<｜User｜>' + message['content'] }}"
    "{%- else %}{{- '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}{%- endif %}"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": CHATML,
    "llama3": LLAMA3,
    "llama2": LLAMA2,
    "mistral-v7": MISTRAL_V7,
    "gemma": GEMMA,
    "phi3": PHI3,
    "command-r": COMMAND_R,
    "deepseek": DEEPSEEK,
    "deepseek3": DEEPSEEK3,
}
