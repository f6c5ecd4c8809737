"""Writes a tiny Llama-architecture GGUF model for the llama-server test.

    python make_model.py OUT.gguf

The weights are random (fixed seed, so the file and the server's
temperature-0 output are the same on every run); the output is meaningless
but well-formed. What the test relies on:

- a byte-level SentencePiece-style vocabulary, so any text tokenizes and
  every tool-call marker is one token a logit bias can favour. Its ids,
  which llama_server.rs biases: 0 <unk>, 1 <s>, 2 </s>, 3 + b for the byte
  b, then 259 <|im_start|> and 260 <|im_end|> (control tokens; the end of
  sequence is <|im_end|>) and 261 <tool_call> and 262 </tool_call>
  (user-defined);
- a model that writes nothing but printable ASCII, newlines, the tool-call
  markers and the end of sequence (see `writable`), so its output is valid
  UTF-8 unless a request forces another byte;
- no space prefix, so the text the server prefills for a grammar tokenizes
  to what the grammar expects;
- a Qwen2.5-style chat template, whose <tool_call> blocks llama-server
  (started with --jinja) recognises and parses out of the generated text;
  with reasoning the way Qwen3 writes it: an answer's `reasoning_content`
  rendered as <think>…</think>, and a generation prompt that opens <think>
  when a request asks for thinking (`chat_template_kwargs.enable_thinking`),
  so llama-server (with `--reasoning off` unless asked) parses reasoning out.
"""

import re
import sys

import numpy as np
from gguf import GGUFWriter, TokenType

EMBED = 64
LAYERS = 2
HEADS = 4
FEED_FORWARD = 128
CONTEXT = 4096

CONTROL_TOKENS = ["<|im_start|>", "<|im_end|>"]
TOOL_MARKERS = ["<tool_call>", "</tool_call>"]

# Calls are rendered with no newline around the JSON, the way the model is
# expected to write them.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou are provided with function signatures within <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call, return <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.reasoning_content %}{{- '\\n<think>' + message.reasoning_content + '</think>' }}{%- endif %}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls or [] %}
{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}
{{- '<tool_call>{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking %}{{- '<think>' }}{%- endif %}{%- endif %}
"""


def vocabulary():
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [TokenType.BYTE] * 256
    tokens += CONTROL_TOKENS
    types += [TokenType.CONTROL] * len(CONTROL_TOKENS)
    tokens += TOOL_MARKERS
    types += [TokenType.USER_DEFINED] * len(TOOL_MARKERS)
    return tokens, types


def writable(token):
    """Whether the model may write `token`: printable ASCII, a newline, the
    tool-call markers and the end of sequence."""
    byte = re.fullmatch(r"<0x([0-9A-F]{2})>", token)
    if byte:
        value = int(byte.group(1), 16)
        return value == 0x0A or 0x20 <= value < 0x7F
    return token in TOOL_MARKERS or token == "<|im_end|>"


def main(path):
    tokens, types = vocabulary()
    rng = np.random.default_rng(15)

    def weights(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    def ones(size):
        return np.ones(size, dtype=np.float32)

    writer = GGUFWriter(path, "llama")
    writer.add_name("turnstile-test-tiny-llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(EMBED)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBED // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))

    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_unk_token_id(tokens.index("<unk>"))
    writer.add_bos_token_id(tokens.index("<s>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    # numpy shapes are (rows, columns): ggml's dimensions reversed.
    # Dimension 0 of the residual stream is a constant no layer writes to,
    # so its column of the output matrix is a per-token bias: it keeps the
    # model to the `writable` tokens.
    embedding = weights(len(tokens), EMBED)
    embedding[:, 0] = 4.0
    writer.add_tensor("token_embd.weight", embedding)
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        attention_out = weights(EMBED, EMBED)
        attention_out[0, :] = 0.0
        feed_forward_down = weights(EMBED, FEED_FORWARD)
        feed_forward_down[0, :] = 0.0
        writer.add_tensor(f"{block}.attn_norm.weight", ones(EMBED))
        for name in ("attn_q", "attn_k", "attn_v"):
            writer.add_tensor(f"{block}.{name}.weight", weights(EMBED, EMBED))
        writer.add_tensor(f"{block}.attn_output.weight", attention_out)
        writer.add_tensor(f"{block}.ffn_norm.weight", ones(EMBED))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(FEED_FORWARD, EMBED))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(FEED_FORWARD, EMBED))
        writer.add_tensor(f"{block}.ffn_down.weight", feed_forward_down)
    # The final norm scales dimension 0 up again, whatever the layers added
    # to the other dimensions.
    output_norm = ones(EMBED)
    output_norm[0] = 1000.0
    output = weights(len(tokens), EMBED)
    output[:, 0] = [0.0 if writable(token) else -1.0 for token in tokens]
    writer.add_tensor("output_norm.weight", output_norm)
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py OUT.gguf")
    main(sys.argv[1])
