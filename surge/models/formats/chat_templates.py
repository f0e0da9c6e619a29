"""Chat templates for model files that carry none (llama.cpp falls back to built-in ones too):
a GGUF converted without tokenizer_config.json has no tokenizer.chat_template."""

from __future__ import annotations

# Gemma's turns (the template of Google's Gemma 3 instruction-tuned models): a system message
# goes before the first user turn; the assistant is "model"; tools' answers come as user turns.
GEMMA = """{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}
{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}
{{- (message['content'] or '') | trim }}{{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"""

BUILTIN = {"gemma3": GEMMA}
# Tokens that end an assistant's turn, wherever a vocabulary has them (as llama.cpp's list of
# end-of-generation tokens): a chat stops there even when the file names another EOS.
TURN_ENDS = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>")
