"""Chat-template fixtures: what transformers renders for real chat templates and for small Jinja
snippets, so that the C++ interpreter in src/tokenizer/ is compared against jinja2 itself.

    /work/refvenv/bin/python tools/reference/make_chat_template_fixtures.py [--shared ../shared] [--out tests/fixtures/chat_templates]

Needs `transformers` (for its chat-template renderer, which owns the jinja2 Environment settings:
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its own tojson,
raise_exception, strftime_now, namespace and dict), `jinja2` and `gguf`. Writes:

  templates/*.jinja          the templates taken from tokenizer files: the bundled model's
                             tokenizer_config.json, ../shared's Llama 3 tokenizer_config.json and
                             the Phi-3 vocabulary GGUF (the other .jinja files there are committed
                             as they were fetched; see README.md)
  expected_renders.json      the conversations below (messages and tools) and, for every template
                             x conversation x add_generation_prompt true/false (plus a few extra
                             template variables), the text transformers'
                             apply_chat_template(tokenize=False) renders, or the error it raises
  expected_features.json     one small template per Jinja feature (statements, whitespace
                             control, expressions, filters, tests, methods, errors) rendered with
                             the same environment

strftime_now sees a fixed clock (FIXED_NOW), so the C++ test can pass the same time.
"""

import argparse
import datetime as real_datetime
import json
import os
import platform
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils
from transformers.utils.chat_template_utils import (_compile_jinja_template, _normalize_chat_messages,
                                                    render_jinja_template)

FIXED_NOW = real_datetime.datetime(2025, 3, 7, 9, 5, 2)


class _FixedDatetime(real_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


# transformers' strftime_now calls `datetime.now()` through its module's global name.
chat_template_utils.datetime = _FixedDatetime

# ----------------------------------------------------------------------------------------------
# Templates: file name -> (bos_token, eos_token). None means the model declares no such token, so
# the variable is undefined in the template (transformers leaves it out of the special tokens).

TEMPLATES = {
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3-8b-instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": (None, "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": (None, "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "phi-3-gguf.jinja": ("<s>", "<|endoftext|>"),
    "google-gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("<|begin_of_text|>", "<|im_end|>"),
    "tachyon-demo.jinja": ("<|begin_of_text|>", "<|end_of_text|>"),
}

# The templates that take tools (the others ignore them or fail on tool messages).
TOOL_TEMPLATES = {
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
}

# The templates that only work with tools (they iterate over `tools` unconditionally): only the
# tool conversations and one plain one (an expected error) are rendered with them.
TOOLS_REQUIRED = {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"}

# The built-in fallback of the C++ side (src/tokenizer/chat_template.cpp, kChatMlTemplate); kept
# identical here so that its renderings are checked against jinja2 as well.
CHATML_FALLBACK = ("{% for message in messages %}"
                   "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
                   "{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# ----------------------------------------------------------------------------------------------
# Conversations.

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and country, e.g. Paris, France"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
                "days": {"type": ["integer", "string"], "description": "  Forecast days  "},
                "hourly": {"type": "boolean", "description": "Hourly values"},
                "stations": {"type": "array", "items": {"type": "string"}, "description": "Station ids"},
                "extra": {"type": "object", "additionalProperties": {"type": "number"},
                          "description": "Named thresholds"},
            },
            "required": ["location"],
        },
        "return": {"type": "number", "description": "The temperature"},
    },
}

TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone (IANA name, e.g. \"Europe/Paris\")",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "description": "Zone — ünïcödé ok"}},
            "required": ["zone"],
        },
    },
}


def tool_call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = {
    "user_only": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_user": {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
    },
    "multi_turn": {
        "messages": [
            {"role": "system", "content": "  You answer briefly.  \n"},
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "  Tell me a joke.\n\n"},
            {"role": "assistant", "content": "Why did the chicken cross the road?\nTo get to the other side."},
            {"role": "user", "content": "Another one"},
        ]
    },
    "unicode": {
        "messages": [
            {"role": "user", "content": "Grüße aus Köln! 日本語のテキスト 🦙🔥 👨‍👩‍👧 עברית مرحبا"},
            {"role": "assistant", "content": "Ça va très bien — merci ! 😊 ∑∞≠"},
            {"role": "user", "content": "ẞ ǅ İ ﬁ \u00a0nbsp\u2003em-space\u200bzwsp"},
        ]
    },
    "quotes_newlines": {
        "messages": [
            {"role": "system", "content": "Say \"hi\" and 'bye'.\nBackslash: \\ Tab:\there"},
            {"role": "user", "content": "{{ not_a_variable }} {% if %} {# no comment #}\r\nWindows line\n\n\n"},
            {"role": "assistant", "content": "<|im_end|> </s> [INST] <|eot_id|> are just text here"},
            {"role": "user", "content": "\n\t  leading and trailing whitespace \t \n"},
        ]
    },
    "empty_content": {
        "messages": [
            {"role": "user", "content": ""},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "ok"},
        ]
    },
    "non_alternating": {
        "messages": [
            {"role": "user", "content": "First"},
            {"role": "user", "content": "Second, without an answer in between"},
        ]
    },
    "assistant_first": {
        "messages": [
            {"role": "assistant", "content": "I speak first."},
            {"role": "user", "content": "Fine."},
        ]
    },
    "tools_question": {
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "messages": [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "What's the weather in Paris?"},
        ],
    },
    "tool_call_and_result": {
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": "What's the weather in Paris, in celsius?"},
            {"role": "assistant", "content": None,
             "tool_calls": [tool_call("call9Xk2Q", "get_current_weather",
                                      {"location": "Paris, France", "unit": "celsius", "days": 2})]},
            {"role": "tool", "tool_call_id": "call9Xk2Q", "name": "get_current_weather",
             "content": "{\"temperature\": 22.5, \"condition\": \"sunny\"}"},
            {"role": "assistant", "content": "It is 22.5 °C and sunny in Paris."},
            {"role": "user", "content": "Thanks!"},
        ],
    },
    "parallel_tool_calls": {
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "messages": [
            {"role": "system", "content": "Be precise."},
            {"role": "user", "content": "Weather and time in Tokyo?"},
            {"role": "assistant", "content": "Let me check both.",
             "tool_calls": [tool_call("aaaaBBBB1", "get_current_weather", {"location": "Tokyo, Japan"}),
                            tool_call("ccccDDDD2", "get_time", {"zone": "Asia/Tokyo"})]},
            {"role": "tool", "tool_call_id": "aaaaBBBB1", "content": "{\"temperature\": 18}"},
            {"role": "tool", "tool_call_id": "ccccDDDD2", "content": "21:05"},
        ],
    },
    "tool_call_string_arguments": {
        "tools": [TIME_TOOL],
        "messages": [
            {"role": "user", "content": "Time in Lima?"},
            {"role": "assistant", "content": "",
             "tool_calls": [tool_call("ZZZZzzzz9", "get_time", "{\"zone\": \"America/Lima\"}")]},
            {"role": "tool", "tool_call_id": "ZZZZzzzz9", "content": "09:05"},
        ],
    },
    "tools_without_user": {
        "tools": [TIME_TOOL],
        "messages": [{"role": "system", "content": "Only a system message."}],
    },
    "reasoning": {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n4"},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "6", "reasoning_content": "Add three and three."},
        ]
    },
    "long_conversation": {
        "messages": [{"role": "system", "content": "Count with me."}]
        + [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: " + "word " * (i % 7)}
           for i in range(40)]
    },
}

# Extra template variables, tried on top of the plain conversations for the templates that read
# them.
EXTRA_CASES = [
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "tools_question", {"date_string": "01 Jan 2030"}),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "tool_call_and_result", {"tools_in_user_message": False}),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "tool_call_and_result", {"tools_in_user_message": False}),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "system_user", {"builtin_tools": ["brave_search", "wolfram_alpha"]}),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "builtin_tool_call",
     {"builtin_tools": ["brave_search", "code_interpreter"]}),
    ("Qwen-Qwen3-0.6B.jinja", "reasoning", {"enable_thinking": False}),
    ("Qwen-Qwen3-0.6B.jinja", "user_only", {"enable_thinking": False}),
    ("Qwen-Qwen3-0.6B.jinja", "user_only", {"enable_thinking": True}),
]

EXTRA_CONVERSATIONS = {
    "builtin_tool_call": {
        "messages": [
            {"role": "user", "content": "Search the web for llamas"},
            {"role": "assistant", "tool_calls": [tool_call("search001", "brave_search", {"query": "llamas \"wool\""})]},
            {"role": "ipython", "content": "Llamas are South American camelids."},
        ]
    },
}


def render_like_transformers(template, messages, tools, add_generation_prompt, bos, eos, extra):
    """What `tokenizer.apply_chat_template(messages, tools=..., tokenize=False, ...)` returns."""
    conversation = _normalize_chat_messages(messages)
    special = {}
    if bos is not None:
        special["bos_token"] = bos
    if eos is not None:
        special["eos_token"] = eos
    kwargs = {**special, **extra}
    rendered, _ = render_jinja_template(conversations=[conversation], tools=tools, documents=None,
                                        chat_template=template, add_generation_prompt=add_generation_prompt, **kwargs)
    return rendered[0]


def describe_error(e):
    return f"{type(e).__name__}: {e}"


def make_renders(template_dir):
    cases = []
    conversations = {**CONVERSATIONS, **EXTRA_CONVERSATIONS}
    templates = {name: open(os.path.join(template_dir, name), encoding="utf-8", newline="").read()
                 for name in TEMPLATES}
    templates["chatml-fallback"] = CHATML_FALLBACK
    tokens = dict(TEMPLATES)
    tokens["chatml-fallback"] = ("<s>", "</s>")

    plan = []
    for name in templates:
        for conv_name, conv in CONVERSATIONS.items():
            if "tools" in conv and name not in TOOL_TEMPLATES:
                continue
            if name in TOOLS_REQUIRED and "tools" not in conv and conv_name != "user_only":
                continue
            plan.append((name, conv_name, {}))
    plan += EXTRA_CASES

    for name, conv_name, extra in plan:
        conv = conversations[conv_name]
        bos, eos = tokens[name]
        for agp in (False, True):
            case = {"template": name, "conversation": conv_name, "add_generation_prompt": agp,
                    "bos_token": bos, "eos_token": eos}
            if extra:
                case["extra"] = extra
            try:
                case["expected"] = render_like_transformers(templates[name], conv["messages"], conv.get("tools"), agp,
                                                            bos, eos, extra)
            except Exception as e:  # noqa: BLE001 - every failure is a recorded expectation
                case["error"] = describe_error(e)
            cases.append(case)
    return cases


# ----------------------------------------------------------------------------------------------
# Feature snippets: (name, template, context or None for the default context).

DEFAULT_CONTEXT = {
    "s": "Hello World",
    "n": 5,
    "f": 2.5,
    "neg": -7,
    "t": True,
    "nothing": None,
    "l": [3, 1, 2],
    "words": ["b", "A", "c", "a", "B"],
    "d": {"b": 2, "a": 1, "c": None},
    "empty": [],
    "empty_dict": {},
    "text": "  padded text \n",
    "uni": "héllo wörld ✓ 日本 🦙",
    "users": [
        {"name": "ann", "age": 31, "admin": True, "tags": ["x"]},
        {"name": "Bob", "age": 25, "admin": False, "tags": []},
        {"name": "cid", "age": 40, "admin": True},
    ],
    "nested": {"a": {"b": {"c": [10, 20, {"d": "deep"}]}}},
    "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ],
    "json_like": {"z": 1, "a": [1.5, "two", None, True, False], "m": {"k": "v\"q\"\n\t\u0001é😊"}},
}

FEATURES = [
    # --- Text and whitespace control ------------------------------------------------------------
    ("text_plain", "plain text only", None),
    ("text_empty", "", None),
    ("expr_simple", "a {{ s }} b", None),
    ("ws_minus_both", "a   {{- s -}}   b", None),
    ("ws_minus_left_newlines", "a\n\n  {{- s }}\n\nb", None),
    ("ws_minus_right_newlines", "a {{ s -}}\n\n   \tb", None),
    ("ws_block_minus", "x  \n  {%- if true -%}  \n  y  \n  {%- endif -%}  \n  z", None),
    ("trim_blocks_newline", "{% if true %}\nline\n{% endif %}\nafter", None),
    ("trim_blocks_only_one_newline", "{% if true %}\n\nline{% endif %}\n\nafter", None),
    ("trim_blocks_not_for_expressions", "{{ s }}\nnext", None),
    ("lstrip_blocks_indent", "<ul>\n    {% for x in l %}\n    <li>{{ x }}</li>\n    {% endfor %}\n</ul>", None),
    ("lstrip_blocks_not_after_text", "text {% if true %}kept{% endif %}\n", None),
    ("lstrip_blocks_tabs", "\t \t{% if true %}\nA\n\t{% endif %}\nB", None),
    ("lstrip_plus_disables", "    {%+ if true %}x{% endif %}", None),
    ("trim_plus_disables", "{% if true +%}\nx{% endif +%}\ny", None),
    ("comment_plain", "a{# comment #}b", None),
    ("comment_trim_newline", "a\n{# comment #}\nb", None),
    ("comment_lstrip", "a\n    {# comment #}\nb", None),
    ("comment_minus", "a   {#- comment -#}   b", None),
    ("comment_multiline", "a{# line1\nline2 {{ x }} {% if %} #}b", None),
    ("trailing_newline_removed", "x\n", None),
    ("trailing_newline_only_one", "x\n\n", None),
    ("crlf_normalized", "a\r\nb{% if true %}\r\nc{% endif %}\r\nd\re", None),
    ("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}!", None),
    ("raw_block_trim", "  {% raw %}\n{{ x }}\n  {% endraw %}\nend", None),
    ("unicode_whitespace_minus", "a\u00a0\u2003 {{- 'b' -}} \u3000\u2028c", None),
    ("block_newline_after_minus_expr", "{{- s -}}\n{% if true %}\nx\n{% endif %}", None),
    ("line_starting_after_block", "{% if true %}\n    {% if true %}\nin\n    {% endif %}\n{% endif %}\n", None),
    ("lstrip_after_expression_line", "{{ s }}\n    {% if true %}x{% endif %}", None),
    # --- Literals ---------------------------------------------------------------------------------
    ("lit_strings", "{{ 'single' }}|{{ \"double\" }}|{{ 'it\\'s' }}|{{ \"say \\\"hi\\\"\" }}", None),
    ("lit_escapes", "{{ 'a\\nb\\tc\\\\d\\x41\\u00e9\\U0001F600\\101\\q' }}", None),
    ("lit_adjacent_strings", "{{ 'a' 'b' \"c\" }}", None),
    ("lit_string_newline_inside", "{{ 'line1\nline2' }}", None),
    ("lit_numbers", "{{ 42 }} {{ -3 }} {{ 1.5 }} {{ 1e3 }} {{ 2.5E-3 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 0 }} {{ 00 }} {{ 1.5e+2 }}", None),
    ("error_leading_zero_integer", "{{ 007 }}", None),
    ("lit_bools_none", "{{ true }} {{ false }} {{ True }} {{ False }} {{ none }} {{ None }}", None),
    ("lit_list_tuple_dict", "{{ [1, 'a', [2.0, none]] }} {{ (1, 2) }} {{ (1,) }} {{ () }} {{ {'k': 'v', 'n': 1} }} {{ [] }} {{ {} }}", None),
    ("lit_trailing_commas", "{{ [1, 2,] }} {{ {'a': 1,} }} {{ (1, 2,) }}", None),
    ("lit_dict_nested_braces", "{{ {'a': {'b': {'c': 1}}} }}", None),
    ("print_repr_strings", "{{ ['it\\'s', \"q\\\"d\", 'both \\' \"', 'nl\\n', 'tab\\t', 'bs\\\\', 'é✓'] }}", None),
    ("print_floats", "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 2.0 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ 123456789.125 }} {{ -0.0 }} {{ 1e300 * 1e10 }} {{ 5e-324 }}", None),
    ("print_ints", "{{ 9223372036854775807 }} {{ -9223372036854775807 }} {{ 0 }}", None),
    ("print_context_values", "{{ l }} {{ d }} {{ t }} {{ nothing }} {{ f }} {{ users[1] }}", None),
    ("print_undefined", "[{{ undefined_name }}]", None),
    # --- Expressions ------------------------------------------------------------------------------
    ("arith_ints", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}", None),
    ("arith_floats", "{{ 7.5 + 1 }} {{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 2.0 ** 0.5 }} {{ 10 / 4 }} {{ 9 / 3 }}", None),
    ("arith_precedence", "{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 100 / 10 / 5 }} {{ 2 * 3 ~ 4 }} {{ 'a' ~ 2 * 3 }}", None),
    ("error_concat_binds_tighter_than_plus", "{{ 1 + 2 ~ 3 + 4 }}", None),
    ("arith_bool_numbers", "{{ true + 1 }} {{ false * 3 }} {{ 1 == 1.0 }} {{ true == 1 }}", None),
    ("arith_strings_lists", "{{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 3 }} {{ 'a' + 'b' }} {{ [1] + [2, 3] }} {{ (1,) + (2,) }}", None),
    ("arith_unary", "{{ -n }} {{ +n }} {{ - -n }} {{ -f }} {{ -(n + 1) }}", None),
    ("concat_tilde", "{{ 'a' ~ 1 ~ 2.5 ~ none ~ true ~ undefined_name ~ [1] }}", None),
    ("compare_basic", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 3 >= 3 }} {{ 1 == 1 }} {{ 1 != 1 }} {{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }}", None),
    ("compare_chained", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1 == 1 }} {{ 3 > 2 > 1 > 0 }}", None),
    ("compare_mixed_types", "{{ 1 == '1' }} {{ none == none }} {{ none == 0 }} {{ [1] == [1] }} {{ {'a': 1} == {'a': 1} }} {{ {'a': 1} == {'a': 2} }} {{ (1, 2) == [1, 2] }}", None),
    ("compare_unicode_strings", "{{ 'é' > 'z' }} {{ '日' > 'é' }} {{ 'abc' < 'abd' }} {{ 'ab' < 'abc' }}", None),
    ("in_operator", "{{ 'a' in 'cat' }} {{ 'x' in 'cat' }} {{ 2 in l }} {{ 9 in l }} {{ 'a' in d }} {{ 'z' in d }} {{ 'z' not in d }} {{ not 'a' in d }} {{ 1 in (1, 2) }} {{ '' in 'abc' }}", None),
    ("logic_values", "{{ 'a' or 'b' }} {{ '' or 'b' }} {{ 0 or none }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ not '' }} {{ not 'x' }} {{ not none }}", None),
    ("logic_precedence", "{{ true or false and false }} {{ not true or true }} {{ not (true or true) }} {{ false and undefined_name.x }}", None),
    ("truthiness", "{% for v in [0, 1, '', 'x', [], [0], {}, {'a': 1}, none, 0.0, 0.1, true, false] %}{{ 'T' if v else 'F' }}{% endfor %}", None),
    ("cond_expr", "{{ 'yes' if t else 'no' }} {{ 'yes' if nothing else 'no' }} [{{ 'only' if false }}] {{ 1 if false else 2 if true else 3 }}", None),
    ("cond_expr_with_filter", "{{ s | upper if t else s | lower }}", None),
    ("getattr_getitem", "{{ d.a }} {{ d['b'] }} {{ users[0].name }} {{ users[0]['age'] }} {{ nested.a.b.c[2].d }} {{ l.1 }} {{ messages[-1].content }}", None),
    ("missing_attr_is_empty", "[{{ d.zzz }}][{{ d['zzz'] }}][{{ l[10] }}][{{ s.nope }}][{{ users[0].tags[5] }}]", None),
    ("missing_attr_defined_test", "{{ d.zzz is defined }} {{ d.a is defined }} {{ users[1].tags is defined }} {{ users[2].tags is defined }}", None),
    ("string_index", "{{ s[0] }} {{ s[-1] }} {{ uni[1] }} {{ uni[-1] }} {{ uni[12] }}", None),
    ("slicing", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[5:] }} {{ l[-2:] }} {{ l[:0] }} {{ l[1:2] }} {{ l[::-2] }} {{ l[2:0:-1] }}", None),
    ("slicing_strings", "{{ s[:5] }}|{{ s[6:] }}|{{ s[::-1] }}|{{ uni[::-1] }}|{{ uni[2:8] }}|{{ s[-5:] }}|{{ s[100:] }}", None),
    ("slice_of_messages", "{% for m in messages[1:] %}{{ m.role }};{% endfor %}", None),
    ("list_index_float_key", "[{{ l[1.0] }}]", None),
    ("dict_literal_int_keys", "{% set m = {1: 'one', 'two': 2} %}{{ m[1] }} {{ m['two'] }} {{ m }}", None),
    # --- Statements -------------------------------------------------------------------------------
    ("if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}other{% endif %};{% endfor %}", None),
    ("if_nested", "{% if t %}{% if n > 3 %}big{% else %}small{% endif %}{% endif %}", None),
    ("for_loop_vars", "{% for x in l %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.depth }}/{{ loop.depth0 }};{% endfor %}", None),
    ("for_prev_next", "{% for x in l %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{{ loop.previtem is defined }}{% endfor %}", None),
    ("for_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", None),
    ("for_else", "{% for x in empty %}x{% else %}empty!{% endfor %}{% for x in l %}{{ x }}{% else %}no{% endfor %}", None),
    ("for_filter", "{% for u in users if u.admin %}{{ u.name }}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}", None),
    ("for_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", None),
    ("for_unpack_paren", "{% for (k, v) in d | items %}{{ k }}={{ v }};{% endfor %}", None),
    ("for_dict_keys", "{% for k in d %}{{ k }};{% endfor %}", None),
    ("for_string_chars", "{% for c in 'héy' %}[{{ c }}]{% endfor %}", None),
    ("for_undefined_is_empty", "{% for x in undefined_name %}x{% else %}none{% endfor %}", None),
    ("for_nested_loop_vars", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", None),
    ("for_scope_no_leak", "{% set x = 'outer' %}{% for i in l %}{% set x = i %}{{ x }}{% endfor %}{{ x }}", None),
    ("for_scope_fresh_each_iteration", "{% for i in range(3) %}{% if i > 0 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}", None),
    ("for_reassign_loop_var", "{% for m in messages %}{% set m = m.role %}{{ m }};{% endfor %}", None),
    ("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", None),
    ("for_over_reversed_messages", "{% for m in messages[::-1] %}{{ loop.index0 }}{{ m.role[0] }}{% endfor %}", None),
    ("for_tuple_literal", "{% for x in 1, 2, 3 %}{{ x }}{% endfor %}", None),
    ("for_loop_changed", "{% for x in [1, 1, 2, 2, 1] %}{{ loop.changed(x) }} {% endfor %}", None),
    ("if_scope_leaks", "{% if true %}{% set z = 'set in if' %}{% endif %}{{ z }}", None),
    ("set_simple", "{% set a = 1 + 2 %}{% set b = 'x' ~ a %}{{ a }}{{ b }}", None),
    ("set_tuple_unpack", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set (c, d) = ['x', 'y'] %}{{ c }}{{ d }}", None),
    ("set_block", "{% set block %}Hello {{ s }}!\n{% endset %}[{{ block }}]", None),
    ("set_block_filter", "{% set block | upper | trim %}  shout {{ n }}  {% endset %}[{{ block }}]", None),
    ("set_overrides_context", "{{ n }}{% set n = 10 %}{{ n }}", None),
    ("namespace_basic", "{% set ns = namespace(count=0, name='x') %}{% for i in range(4) %}{% set ns.count = ns.count + i %}{% endfor %}{{ ns.count }} {{ ns.name }}", None),
    ("namespace_empty_then_set", "{% set ns = namespace() %}{% set ns.found = false %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}", None),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}", None),
    ("namespace_block_set", "{% set ns = namespace(t='') %}{% set ns.t %}block{{ n }}{% endset %}{{ ns.t }}", None),
    ("macro_basic", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('ann') }} {{ greet('bob', '?') }} {{ greet(punct='.', name='cid') }}", None),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", None),
    ("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}][{{ b }}]{% endmacro %}{{ m(1) }}", None),
    ("macro_recursive", "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1) | int }}{% endif %}{% endmacro %}{{ fact(6) }}", None),
    ("macro_sees_toplevel", "{% set greeting = 'hey' %}{% macro m() %}{{ greeting }} {{ n }}{% endmacro %}{{ m() }}", None),
    ("macro_result_in_expression", "{% macro wrap(x) %}<{{ x }}>{% endmacro %}{{ wrap('a') + wrap('b') | upper }}", None),
    ("macro_caller", "{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}inside {{ n }}{% endcall %}", None),
    ("macro_caller_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}", None),
    ("macro_set_is_local", "{% set v = 'top' %}{% macro m() %}{% set v = 'inner' %}{{ v }}{% endmacro %}{{ m() }}{{ v }}", None),
    ("filter_block", "{% filter upper %}hello {{ s }}{% endfilter %}", None),
    ("with_block", "{% with a = 1, b = 'z' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]", None),
    ("generation_block", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}", None),
    # --- Filters ----------------------------------------------------------------------------------
    ("filter_trim", "[{{ text | trim }}][{{ 'xxhixx' | trim('x') }}][{{ '\u3000 wide \u00a0' | trim }}]", None),
    ("filter_case", "{{ s | upper }} {{ s | lower }} {{ 'hELLO wORLD' | capitalize }} {{ 'hello big-world (yes)' | title }} {{ uni | upper }}", None),
    ("filter_length", "{{ l | length }} {{ s | length }} {{ uni | length }} {{ d | count }} {{ empty | length }} {{ undefined_name | length }}", None),
    ("filter_first_last", "{{ l | first }} {{ l | last }} {{ s | first }} {{ s | last }} [{{ empty | first }}]", None),
    ("filter_join", "{{ l | join(', ') }} {{ words | join }} {{ users | join('|', attribute='name') }} {{ [1, none, 'x'] | join('-') }}", None),
    ("filter_default", "{{ undefined_name | default('dflt') }} {{ nothing | default('dflt') }} {{ '' | default('dflt') }} {{ '' | default('dflt', true) }} {{ s | d('x') }} {{ undefined_name | d }}", None),
    ("filter_tojson_basic", "{{ json_like | tojson }}", None),
    ("filter_tojson_indent", "{{ json_like | tojson(indent=2) }}\n{{ users | tojson(indent=4) }}\n{{ {'e': [], 'o': {}} | tojson(indent=1) }}", None),
    ("filter_tojson_options", "{{ json_like | tojson(sort_keys=true) }}\n{{ json_like | tojson(ensure_ascii=true) }}\n{{ json_like | tojson(separators=(',', ':')) }}", None),
    ("filter_tojson_scalars", "{{ 'str' | tojson }} {{ 1 | tojson }} {{ 1.0 | tojson }} {{ none | tojson }} {{ true | tojson }} {{ (1, 2) | tojson }} {{ '</script>' | tojson }}", None),
    ("filter_tojson_indent_string", "{{ {'a': [1]} | tojson(indent='--') }}", None),
    ("filter_string", "{{ 12 | string }} {{ none | string }} {{ l | string }} {{ (d | string) ~ '!' }} {{ undefined_name | string }}|", None),
    ("filter_int_float", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '0x1A' | int(base=16) }} {{ '2.5' | float }} {{ 'y' | float }} {{ 3 | float }} {{ true | int }} {{ none | int }}", None),
    ("filter_items", "{% for k, v in d | items %}{{ k }}:{{ v }} {% endfor %}{{ d | items | list }}", None),
    ("filter_list", "{{ 'abc' | list }} {{ d | list }} {{ l | list }} {{ range(3) | list }}", None),
    ("filter_replace", "{{ s | replace('o', '0') }} {{ s | replace('l', 'L', 2) }} {{ 'aaa' | replace('', '-') }}", None),
    ("filter_round", "{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.567 | round(2) }} {{ 2.561 | round(1, 'floor') }} {{ 2.521 | round(1, 'ceil') }} {{ 7 | round }} {{ -2.5 | round }}", None),
    ("filter_abs", "{{ neg | abs }} {{ -2.5 | abs }} {{ n | abs }}", None),
    ("filter_map", "{{ users | map(attribute='name') | join(',') }} {{ words | map('upper') | list }} {{ users | map(attribute='tags', default='none') | list }} {{ ['1', '2'] | map('int') | sum }}", None),
    ("filter_select_reject", "{{ range(10) | select('odd') | list }} {{ range(10) | reject('even') | list }} {{ [0, 1, '', 'a', none] | select | list }} {{ l | select('gt', 1) | list }} {{ words | reject('equalto', 'a') | list }}", None),
    ("filter_selectattr", "{{ users | selectattr('admin') | map(attribute='name') | list }} {{ users | rejectattr('admin') | map(attribute='name') | list }} {{ users | selectattr('age', 'gt', 30) | map(attribute='name') | list }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ users | selectattr('tags', 'defined') | list | length }}", None),
    ("filter_unique", "{{ [1, 2, 1, 3, 2] | unique | list }} {{ words | unique | list }} {{ words | unique(case_sensitive=true) | list }} {{ users | unique(attribute='admin') | map(attribute='name') | list }}", None),
    ("filter_sort", "{{ l | sort }} {{ l | sort(reverse=true) }} {{ words | sort }} {{ words | sort(case_sensitive=true) }} {{ users | sort(attribute='age') | map(attribute='name') | list }}", None),
    ("filter_reverse", "{{ l | reverse | list }} {{ s | reverse }} {{ uni | reverse }}", None),
    ("filter_min_max_sum", "{{ l | min }} {{ l | max }} {{ l | sum }} {{ users | sum(attribute='age') }} {{ words | min }} {{ words | max(case_sensitive=true) }} {{ [1.5, 2] | sum(start=10) }}", None),
    ("filter_dictsort", "{{ d | dictsort }} {{ {'b': 1, 'A': 2, 'a': 3} | dictsort }} {{ {'x': 2, 'y': 1} | dictsort(by='value') }} {{ d | dictsort(reverse=true) }}", None),
    ("filter_indent", "{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb\n\nc' | indent(2, true) }}|{{ 'a\nb\n\nc' | indent(2, blank=true) }}|{{ 'x\n' | indent(first=true) }}|{{ 'a\nb' | indent('> ') }}", None),
    ("filter_escape_safe", "{{ '<a href=\"x\">&\\'</a>' | escape }} {{ '<b>' | e }} {{ '<i>' | safe }} {{ '<u>' | forceescape }}", None),
    ("filter_wordcount", "{{ 'one two  three\nfour' | wordcount }} {{ '' | wordcount }}", None),
    ("filter_attr", "{{ users[0] | attr('name') }}|{{ d | attr('zz') }}|", None),
    ("filter_batch_slice_lists", "{{ range(7) | batch(3) | list }} {{ range(7) | batch(3, 'x') | list }}", None),
    ("filter_format", "{{ '%s-%d' | format('a', 3) }} {{ '%5.2f|%-4s|%03d' | format(3.14159, 'ab', 7) }} {{ '%(x)s' | format(x=1) }}", None),
    ("filter_center_truncate", "[{{ 'ab' | center(6) }}] {{ 'hello world foo' | truncate(9) }} {{ 'hello world foo' | truncate(9, true, '..') }}", None),
    ("filter_chain", "{{ '  Mixed Case  ' | trim | lower | replace(' ', '_') | upper }}", None),
    ("filter_on_expression", "{{ (l + [9]) | sort | join }} {{ ('a' ~ 'b') | upper }}", None),
    ("filter_striptags", "{{ '<p>Hello   <b>world</b></p>' | striptags }}", None),
    ("filter_groupby", "{% for g in users | groupby('admin') %}{{ g.grouper }}:{{ g.list | map(attribute='name') | join(',') }};{% endfor %}", None),
    # --- Tests ------------------------------------------------------------------------------------
    ("test_defined", "{{ n is defined }} {{ zz is defined }} {{ zz is undefined }} {{ n is not defined }} {{ nothing is defined }}", None),
    ("test_none", "{{ nothing is none }} {{ n is none }} {{ zz is none }} {{ nothing is not none }}", None),
    ("test_types", "{{ s is string }} {{ n is string }} {{ n is number }} {{ f is number }} {{ t is number }} {{ n is integer }} {{ f is float }} {{ t is boolean }} {{ n is boolean }} {{ d is mapping }} {{ l is mapping }} {{ l is sequence }} {{ s is sequence }} {{ d is sequence }} {{ n is sequence }} {{ l is iterable }} {{ s is iterable }} {{ d is iterable }} {{ n is iterable }} {{ zz is iterable }} {{ nothing is iterable }}", None),
    ("test_true_false", "{{ t is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ none is false }}", None),
    ("test_comparisons", "{{ 3 is eq 3 }} {{ 3 is equalto 4 }} {{ 3 is ne 4 }} {{ 3 is lt 4 }} {{ 3 is le 3 }} {{ 3 is gt 4 }} {{ 3 is ge 3 }} {{ 3 is sameas 3 }} {{ none is sameas none }} {{ 2 is lessthan 3 }} {{ 2 is greaterthan 3 }}", None),
    ("error_test_operator_name", "{{ 3 is == 3 }}", None),
    ("test_numbers", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 10 is divisibleby(3) }}", None),
    ("test_strings", "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aBc' is lower }}", None),
    ("test_in", "{{ 2 is in l }} {{ 'z' is in 'xyz' }} {{ 5 is in l }}", None),
    ("test_callable", "{{ range is callable }} {{ s is callable }} {{ namespace is callable }}", None),
    ("test_filter_test_exist", "{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }} {{ 'nope' is test }}", None),
    ("test_undefined_iterable", "{{ zz is iterable }} {{ zz is sequence }} {{ zz is mapping }} {{ zz is string }} {{ zz is number }}", None),
    ("test_escaped", "{{ s is escaped }} {{ (s | e) is escaped }}", None),
    # --- Methods ----------------------------------------------------------------------------------
    ("str_strip_methods", "[{{ text.strip() }}][{{ text.lstrip() }}][{{ text.rstrip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\nq\\n'.lstrip('\\n') }}][{{ 'ab;;'.rstrip(';') }}][{{ 'abcba'.strip('ab') }}]", None),
    ("str_split", "{{ 'a,b,,c'.split(',') }} {{ '  a  b\\tc\\n'.split() }} {{ 'a,b,c'.split(',', 1) }} {{ ''.split(',') }} {{ ''.split() }} {{ 'a<think>b</think>c'.split('</think>')[-1] }} {{ 'x'.split('x') }}", None),
    ("str_rsplit_splitlines", "{{ 'a,b,c'.rsplit(',', 1) }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }}", None),
    ("str_startswith_endswith", "{{ s.startswith('Hello') }} {{ s.startswith('World') }} {{ s.endswith('World') }} {{ s.startswith(('x', 'He')) }} {{ s.endswith('') }} {{ uni.startswith('hé') }}", None),
    ("str_case_methods", "{{ s.upper() }} {{ s.lower() }} {{ 'hello world-foo bar_baz'.title() }} {{ 'hELLO'.capitalize() }} {{ 'Hello'.swapcase() }} {{ uni.upper() }} {{ 'ÉCOLE'.lower() }}", None),
    ("str_replace_method", "{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ 'a.b.c'.replace('.', '') }}", None),
    ("str_find_count", "{{ s.find('o') }} {{ s.find('zz') }} {{ s.rfind('o') }} {{ s.count('l') }} {{ uni.find('w') }} {{ s.index('W') }}", None),
    ("str_join_method", "{{ ', '.join(['a', 'b']) }} {{ ''.join(words) }} {{ '-'.join('abc') }}", None),
    ("str_predicates", "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'ab1'.isalnum() }} {{ '  '.isspace() }} {{ 'abc'.islower() }} {{ 'ABC'.isupper() }}", None),
    ("str_format_method", "{{ '{} and {}'.format('a', 'b') }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }}", None),
    ("str_misc_methods", "{{ 'ab'.zfill(5) }} [{{ 'ab'.center(6, '*') }}] [{{ 'ab'.ljust(4) }}] [{{ 'ab'.rjust(4, '.') }}] {{ 'a b'.partition(' ') }}", None),
    ("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.get('c', 'dflt') }}", None),
    ("dict_key_shadowing_method", "{% set m = {'items': 'key-value', 'keys': 1} %}{{ m['items'] }} {{ m['keys'] }} {{ m.items() | list | length }}", None),
    ("list_methods", "{{ l.index(2) }} {{ l.count(3) }} {{ [1, 2, 1].count(1) }}", None),
    # --- Globals ----------------------------------------------------------------------------------
    ("global_range", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }} {{ range(0) | list }} {% for i in range(2) %}{{ i }}{% endfor %}", None),
    ("global_dict", "{{ dict(a=1, b='x') }} {{ dict({'z': 1}, y=2) }} {{ dict() }}", None),
    ("global_namespace_attrs", "{% set ns = namespace(a=[1]) %}{{ ns.a }} {{ ns.missing is defined }}", None),
    ("global_strftime", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%A %B %j %y %I%p %%') }}|{{ strftime_now('%-d %a %e') }}", None),
    ("global_raise_exception_not_called", "{% if false %}{{ raise_exception('never') }}{% endif %}fine", None),
    ("global_defined_tests", "{{ strftime_now is defined }} {{ raise_exception is defined }} {{ range is defined }} {{ lipsum is defined }} {{ cycler is defined }}", None),
    ("global_joiner_cycler", "{% set j = joiner(', ') %}{% for x in l %}{{ j() }}{{ x }}{% endfor %} {% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}", None),
    # --- Realistic fragments ----------------------------------------------------------------------
    ("chatml_inline", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}", {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}),
    ("system_extraction", "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}{{ sys }}|{% for m in loop_messages %}{{ m.role }}{% endfor %}", None),
    ("tojson_tool_arguments", "{% for m in msgs %}{{ m.tool_calls[0].function.arguments | tojson }}{% endfor %}", {"msgs": [{"tool_calls": [{"function": {"arguments": {"q": "ü \"x\"", "n": [1, 2.5]}}}]}]}),
    ("undefined_in_condition", "{% if tools %}T{% else %}F{% endif %}{% if tools is not none %}N{% endif %}", {"tools": None}),
    # --- Errors -----------------------------------------------------------------------------------
    ("error_raise_exception", "{{ raise_exception('Conversation roles must alternate!') }}", None),
    ("error_raise_in_loop", "{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('no assistant: ' ~ loop.index) }}{% endif %}{{ m.role }}{% endfor %}", None),
    ("error_attr_of_undefined", "{{ undefined_name.attr }}", None),
    ("error_item_of_undefined", "{{ undefined_name['k'] }}", None),
    ("error_defined_test_on_undefined_chain", "{{ undefined_name.attr is defined }}", None),
    ("error_unknown_filter", "{{ s | no_such_filter }}", None),
    ("error_unknown_test", "{{ s is no_such_test }}", None),
    ("error_unclosed_expression", "{{ s ", None),
    ("error_unclosed_block", "{% if true %}no end", None),
    ("error_unexpected_end", "{% endfor %}", None),
    ("error_mismatched_end", "{% if true %}{% endfor %}", None),
    ("error_unknown_tag", "{% frobnicate %}", None),
    ("error_unclosed_comment", "{# never closed", None),
    ("error_unclosed_string", "{{ 'abc }}", None),
    ("error_bad_token", "{{ 1 $ 2 }}", None),
    ("error_unbalanced_paren", "{{ (1 + 2 }}", None),
    ("error_division_by_zero", "{{ 1 / 0 }}", None),
    ("error_modulo_by_zero", "{{ 1 % 0 }}", None),
    ("error_floordiv_by_zero", "{{ 1 // 0 }}", None),
    ("error_add_str_int", "{{ 'a' + 1 }}", None),
    ("error_add_undefined", "{{ undefined_name + 'x' }}", None),
    ("error_compare_str_int", "{{ 'a' < 1 }}", None),
    ("error_call_undefined", "{{ undefined_function() }}", None),
    ("error_call_string", "{{ s() }}", None),
    ("error_list_append_sandbox", "{% set x = [1] %}{{ x.append(2) }}", None),
    ("error_dict_update_sandbox", "{% set x = {} %}{{ x.update({'a': 1}) }}", None),
    ("error_tojson_undefined", "{{ undefined_name | tojson }}", None),
    ("error_iterate_int", "{% for x in 5 %}{% endfor %}", None),
    ("error_iterate_none", "{% for x in nothing %}{% endfor %}", None),
    ("error_unpack_mismatch", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", None),
    ("error_macro_too_many_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", None),
    ("error_set_attr_on_dict", "{% set d2 = {} %}{% set d2.x = 1 %}", None),
    ("error_break_outside_loop", "{% break %}", None),
    ("error_namespace_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}", None),
    ("error_private_attribute", "{{ s.__class__ }}", None),
    ("int_overflow_beyond_int64", "{{ 2 ** 62 * 2 - 1 + 2 ** 62 * 2 }}", None),
    ("error_recursive_macro_depth", "{% macro r(k) %}{{ r(k + 1) }}{% endmacro %}{{ r(0) }}", None),
    ("error_extends", "{% extends 'base.html' %}", None),
    ("error_include", "{% include 'other.html' %}", None),
    ("error_else_without_if", "{% else %}", None),
    ("error_elif_after_else", "{% if true %}{% else %}{% elif false %}{% endif %}", None),
    ("error_missing_in", "{% for x l %}{% endfor %}", None),
    ("error_empty_expression", "{{ }}", None),
    ("error_dangling_operator", "{{ 1 + }}", None),
    ("error_chained_is", "{{ 1 is number is number }}", None),
    ("error_invalid_assignment", "{% set 1 = 2 %}", None),
    ("error_slice_step_zero", "{{ l[::0] }}", None),
    ("error_string_minus", "{{ 'a' - 'b' }}", None),
    ("error_lt_undefined", "{{ undefined_name < 1 }}", None),
    ("error_sum_strings", "{{ ['a', 'b'] | sum }}", None),
    ("error_first_of_int", "{{ 5 | first }}", None),
]


def make_features():
    cases = []
    for name, template, context in FEATURES:
        ctx = DEFAULT_CONTEXT if context is None else context
        case = {"name": name, "template": template}
        if context is not None:
            case["context"] = context
        try:
            case["expected"] = _compile_jinja_template(template).render(**ctx)
        except Exception as e:  # noqa: BLE001
            case["error"] = describe_error(e)
        cases.append(case)
    return cases


def extract_templates(repo, shared, template_dir):
    """The templates that live in tokenizer files rather than as .jinja files."""
    with open(os.path.join(repo, "models/tachyon-demo/tokenizer_config.json"), encoding="utf-8") as f:
        demo = json.load(f)["chat_template"]
    with open(os.path.join(template_dir, "tachyon-demo.jinja"), "w", encoding="utf-8", newline="") as f:
        f.write(demo)
    with open(os.path.join(shared, "tokenizers/llama3/tokenizer_config.json"), encoding="utf-8") as f:
        llama3 = json.load(f)["chat_template"]
    with open(os.path.join(template_dir, "llama3-8b-instruct.jinja"), "w", encoding="utf-8", newline="") as f:
        f.write(llama3)
    import gguf
    reader = gguf.GGUFReader(os.path.join(shared, "tokenizers/llama.cpp-vocab/ggml-vocab-phi-3.gguf"))
    phi3 = reader.fields["tokenizer.chat_template"].contents()
    with open(os.path.join(template_dir, "phi-3-gguf.jinja"), "w", encoding="utf-8", newline="") as f:
        f.write(phi3)


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", ".."))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default=os.path.join(repo, "..", "shared"))
    parser.add_argument("--out", default=os.path.join(repo, "tests", "fixtures", "chat_templates"))
    args = parser.parse_args()

    template_dir = os.path.join(args.out, "templates")
    extract_templates(repo, args.shared, template_dir)

    reference = {
        "renderer": "transformers.utils.chat_template_utils (render_jinja_template / _compile_jinja_template)",
        "versions": {"python": platform.python_version(), "transformers": transformers.__version__,
                     "jinja2": jinja2.__version__},
        "now": FIXED_NOW.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    renders = make_renders(template_dir)
    write_json(os.path.join(args.out, "expected_renders.json"),
               {"reference": reference, "conversations": {**CONVERSATIONS, **EXTRA_CONVERSATIONS}, "cases": renders})
    features = make_features()
    write_json(os.path.join(args.out, "expected_features.json"),
               {"reference": reference, "context": DEFAULT_CONTEXT, "cases": features})
    n_err = sum("error" in c for c in renders)
    print(f"renders: {len(renders)} cases ({n_err} errors) over {len(TEMPLATES) + 1} templates; "
          f"features: {len(features)} cases ({sum('error' in c for c in features)} errors)", file=sys.stderr)


if __name__ == "__main__":
    main()
