"""Golden renders for the C++ Jinja interpreter (server/jinja.h), made by Python's jinja2 (Debian's
python3-jinja2) configured the way Hugging Face transformers renders chat templates: a sandboxed
environment with trim_blocks and lstrip_blocks, the loop-controls extension, `raise_exception`
and `strftime_now` globals, and a `tojson` filter that is json.dumps with ensure_ascii=False
(jinja2's own escapes <, > and &; chat templates never want that).

Two kinds of case: small templates, one per feature of the supported subset, and the chat
templates of real models (*.jinja beside this script) over conversations. Writes goldens.json;
an "error" is {"raise": message} for raise_exception and "error" for any other jinja2 failure.

The templates are the models' published ones, as their tokenizer_config.json "chat_template" (or,
for SmolLM2, the GGUF key tokenizer.chat_template) holds them: SmolLM2-135M-Instruct (read from
models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf when that file is there), Meta-Llama-3-8B-Instruct
(llama3), Llama-3.1-8B-Instruct (llama3_1), Qwen2-7B-Instruct (qwen2), Qwen2.5-7B-Instruct
(qwen2_5).

    python3 tests/testdata/chat_templates/make_goldens.py      # rewrites goldens.json
"""

import datetime
import json
import os
import struct
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
GGUF = os.path.join(ROOT, "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


class TemplateRaise(Exception):
    pass


def raise_exception(message):
    raise TemplateRaise(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class Generation(jinja2.ext.Extension):
    """transformers' {% generation %} block (it marks assistant tokens); renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, Generation])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def render(env, source, context):
    try:
        return {"output": env.from_string(source).render(**context)}
    except TemplateRaise as e:
        return {"error": {"raise": str(e)}}
    except Exception:  # jinja2 syntax, undefined, type and security errors alike
        return {"error": "error"}


def gguf_chat_template(path):
    """tokenizer.chat_template of a GGUF v2/v3 file (the metadata section only)."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    off = 0

    def take(fmt):
        nonlocal off
        vals = struct.unpack_from(fmt, data, off)
        off += struct.calcsize(fmt)
        return vals

    magic, version = take("<4sI")
    assert magic == b"GGUF" and version in (2, 3), path
    _, num_kv = take("<QQ")
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
              12: "d"}

    def value(t):
        nonlocal off
        if t == 8:
            (n,) = take("<Q")
            off += n
            return data[off - n:off]
        if t == 9:
            et, n = take("<IQ")
            return [value(et) for _ in range(n)]
        return take("<" + scalar[t])[0]

    for _ in range(num_kv):
        (n,) = take("<Q")
        key = data[off:off + n].decode()
        off += n
        (t,) = take("<I")
        v = value(t)
        if key == "tokenizer.chat_template":
            return v.decode()
    raise KeyError(f"{path}: no tokenizer.chat_template")


# --- the supported subset, one feature per case -------------------------------------------------
FEATURES = [
    ("text", "plain text only", {}),
    ("variable", "{{ x }}", {"x": "hi"}),
    ("undefined_prints_empty", "[{{ nope }}]", {}),
    ("undefined_attribute_is_error", "{{ nope.attr }}", {}),
    ("none_attribute_is_undefined", "[{{ x.attr }}]", {"x": None}),
    ("missing_key_is_undefined", "[{{ m.nope }}][{{ m['nope'] }}]", {"m": {"a": 1}}),
    ("print_types", "{{ 1 }} {{ 1.5 }} {{ true }} {{ none }} {{ 'a' }} {{ [1, 'b', none, false] }}"
     " {{ {'k': 'v', 'n': 2} }} {{ (1, 2) }} {{ 1e20 }} {{ 0.1 }} {{ 2.0 }} {{ -0.0 }} {{ 1e-7 }}"
     " {{ 12345678901234567.0 }} {{ [\"it's\"] }} {{ ['a\"b'] }} {{ ['x\\ny'] }}", {}),
    ("print_json_values", "{{ v }}|{{ v.f }}|{{ v.l }}", {"v": {"f": 3.25, "l": [1, {"x": None}]}}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e' }}{{ \"q\\\"r\" }}", {}),
    ("adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("arithmetic", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }}"
     " {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }} {{ 1.5 + 1 }} {{ 10 - 2.5 }}"
     " {{ -3 }} {{ - 3 + 1 }} {{ 6 / 3 }} {{ 7.5 // 2 }} {{ 'ab' * 3 }} {{ true + 1 }}", {}),
    ("division_by_zero_is_error", "{{ 1 / 0 }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ [1] }}|{{ 'x' ~ nope ~ 'y' }}", {}),
    ("string_plus", "{{ 'a' + 'b' }}{{ [1] + [2, 3] }}", {}),
    ("string_plus_int_is_error", "{{ 'a' + 1 }}", {}),
    ("undefined_plus_is_error", "{{ nope + 'a' }}", {}),
    ("comparisons", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 == '1' }}"
     " {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ 1 != 2 }} {{ 1 < 2 < 3 }}"
     " {{ 3 > 2 > 2 }} {{ none == none }} {{ nope == none }} {{ true == 1 }} {{ [1, 2] < [1, 3] }}",
     {}),
    ("compare_mixed_is_error", "{{ 1 < 'a' }}", {}),
    ("logic", "{{ true and false }} {{ true or false }} {{ not true }} {{ not 0 }} {{ 0 or 'x' }}"
     " {{ 'a' and 'b' }} {{ none or [] }} {{ not (1 == 1 and 2 == 3) }} {{ not nope }}", {}),
    ("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, {'a': 1}, none, 0.0, false] %}"
     "{{ 'T' if v else 'F' }}{% endfor %}", {}),
    ("membership", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}"
     " {{ 'z' not in 'abc' }} {{ 'tool_calls' in m }}", {"m": {"role": "user"}}),
    ("conditional_expression", "{{ 'y' if true else 'n' }}{{ 'y' if false else 'n' }}"
     "[{{ 'y' if false }}]", {}),
    ("attribute_and_item", "{{ m.role }} {{ m['role'] }} {{ l[0] }} {{ l[-1] }} {{ l.0 }}"
     " {{ d.a.b }} {{ d['a']['b'] }}", {"m": {"role": "user"}, "l": [5, 6, 7],
                                         "d": {"a": {"b": "deep"}}}),
    ("index_out_of_range_is_undefined", "[{{ l[5] }}][{{ l[-9] }}]", {"l": [1]}),
    ("slices", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[1:-1] }} {{ s[1:3] }} {{ s[::-1] }}"
     " {{ l[-2:] }} {{ l[::2] }}", {"l": [1, 2, 3, 4], "s": "hello"}),
    ("string_index", "{{ s[0] }}{{ s[-1] }}", {"s": "héllo"}),
    ("unicode_strings", "{{ s | length }} {{ s[1] }} {{ s | upper }} {{ s[::-1] }}",
     {"s": "añ😀b"}),
    ("list_and_dict_literals", "{{ [1, [2, 3], {'a': [4]}] }} {{ {'x': 1, 'y': 2}['y'] }}"
     " {{ [] }} {{ {} }} {{ [1, 2,] }}", {}),
    ("tuple_literal", "{% for a, b in [(1, 2), (3, 4)] %}{{ a }}{{ b }};{% endfor %}", {}),
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}"
     "many{% endif %} {% endfor %}", {}),
    ("nested_if", "{% if a %}{% if b %}ab{% else %}a{% endif %}{% endif %}",
     {"a": True, "b": False}),
    ("for_loop_variables", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
     "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {}),
    ("for_previtem_nextitem", "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]"
     "{% endfor %}", {}),
    ("for_cycle", "{% for x in range(4) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }},{% endfor %}", {}),
    ("for_over_dict_and_items", "{% for k in d %}{{ k }}{% endfor %};{% for k, v in d.items() %}"
     "{{ k }}={{ v }},{% endfor %};{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}",
     {"d": {"b": 1, "a": 2}}),
    ("for_nested_loop", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} "
     "{% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("for_over_undefined_is_empty", "[{% for x in nope %}x{% endfor %}]", {}),
    ("for_over_none_is_error", "{% for x in v %}x{% endfor %}", {"v": None}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
     "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("range", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }}", {}),
    ("set_and_scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};"
     "{% endfor %}{{ x }}{% if true %}{% set x = 5 %}{% endif %}{{ x }}", {}),
    ("set_in_loop_unset_before", "{% for i in [1, 2] %}[{{ y }}]{% set y = i %}{% endfor %}[{{ y }}]",
     {}),
    ("set_tuple_unpack", "{% set a, b = [1, 2] %}{{ b }}{{ a }}", {}),
    ("set_block", "{% set body %}in {{ 'side' }}{% endset %}[{{ body }}]", {}),
    ("namespace", "{% set ns = namespace(n=0, found=false) %}{% for x in [1, 2, 3] %}"
     "{% set ns.n = ns.n + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}"
     "{{ ns.n }} {{ ns.found }}", {}),
    ("namespace_set_new_attribute", "{% set ns = namespace() %}{% set ns.a = 'v' %}{{ ns.a }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
     "{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}", {}),
    ("macro_reads_outer", "{% set who = 'w' %}{% macro m() %}{{ who }}{% endmacro %}{{ m() }}", {}),
    ("comments", "a{# a comment {{ x }} #}b{#- trimmed -#}  c", {}),
    ("whitespace_control", "a  {{- 'b' -}}  c\n  {%- if true -%}  d  {%- endif -%}\n e", {}),
    ("trim_blocks", "{% if true %}\nline\n{% endif %}\nafter\n", {}),
    ("lstrip_blocks", "  {% if true %}\n    x\n  {% endif %}\n  {{ 'y' }}\n", {}),
    ("lstrip_blocks_comment", "a\n    {# c #}\nb", {}),
    ("plus_disables_lstrip", "  {%+ if true %}x{% endif %}", {}),
    ("plus_keeps_newline", "{% if true +%}\nx{% endif %}", {}),
    ("crlf_text", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("raw_block", "{% raw %}{{ not evaluated }}{% endraw %}", {}),
    ("filter_trim", "[{{ '  a b \n' | trim }}][{{ 'xxaxx' | trim('x') }}]", {}),
    ("filter_length", "{{ [1, 2] | length }} {{ 'abc' | length }} {{ {'a': 1} | length }}"
     " {{ nope | length }} {{ 'abc' | count }}", {}),
    ("filter_tojson", "{{ v | tojson }}|{{ v | tojson(indent=2) }}|{{ 'é\"<' | tojson }}"
     "|{{ [1.5, 2, none, true] | tojson }}|{{ {} | tojson(indent=4) }}|{{ [] | tojson(indent=2) }}",
     {"v": {"b": [1, {"c": "x"}], "a": "y\n\u0001"}}),
    ("filter_tojson_sort_keys", "{{ v | tojson(sort_keys=true) }}|{{ v | tojson(separators=(',', ':')) }}",
     {"v": {"b": 1, "a": [1, 2]}}),
    ("filter_string_and_numbers", "{{ 5 | string }}{{ '7' | int + 1 }} {{ '2.5' | float }}"
     " {{ 'x' | int }} {{ 3.9 | int }} {{ 2 | float }} {{ -2.5 | abs }} {{ 2.567 | round(1) }}"
     " {{ 2.5 | round }} {{ 7 | round }}", {}),
    ("filter_case", "{{ 'hEllo wOrld' | lower }} {{ 'a' | upper }} {{ 'hello world' | title }}"
     " {{ 'hELLO' | capitalize }}", {}),
    ("filter_join", "{{ ['a', 'b'] | join(', ') }} {{ [1, 2] | join }}"
     " {{ users | join('/', attribute='n') }}", {"users": [{"n": "x"}, {"n": "y"}]}),
    ("filter_first_last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'ab' | first }}", {}),
    ("filter_list_reverse", "{{ 'ab' | list }} {{ [1, 2] | reverse | list }} {{ 'abc' | reverse }}",
     {}),
    ("filter_sort_unique", "{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }}"
     " {{ ['b', 'A', 'a'] | sort }} {{ [1, 2, 1, 3] | unique | list }}"
     " {{ us | sort(attribute='k') | map(attribute='k') | list }}",
     {"us": [{"k": 2}, {"k": 1}]}),
    ("filter_default", "{{ nope | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }}"
     " {{ none | default('d') }} {{ 'v' | d('x') }}", {}),
    ("filter_map_select", "{{ ms | map(attribute='role') | list }} {{ [1, 2, 3] | select('odd') | list }}"
     " {{ [1, 2, 3] | reject('odd') | list }} {{ ms | selectattr('role', 'equalto', 'user') | list"
     " | length }} {{ ms | rejectattr('role', 'equalto', 'user') | map(attribute='role') | list }}"
     " {{ ['a', 'b'] | map('upper') | list }} {{ ms | selectattr('content') | list | length }}",
     {"ms": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}),
    ("filter_replace_indent", "{{ 'a-b-c' | replace('-', '+') }} {{ 'a-b-c' | replace('-', '', 1) }}"
     "|{{ 'x\ny\n\nz' | indent(2) }}|{{ 'x\ny' | indent(2, true) }}", {}),
    ("filter_minmax_sum", "{{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ [1, 2, 3] | sum }}", {}),
    ("filter_dictsort", "{{ d | dictsort }}", {"d": {"b": 1, "a": 2}}),
    ("filter_safe_escape", "{{ '<b>' | safe }}", {}),
    ("filter_wordcount", "{{ 'one two  three' | wordcount }}", {}),
    ("filter_unknown_is_error", "{{ 1 | no_such_filter }}", {}),
    ("tests", "{{ nope is defined }} {{ x is defined }} {{ nope is undefined }} {{ none is none }}"
     " {{ x is string }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }}"
     " {{ d is mapping }} {{ l is sequence }} {{ l is iterable }} {{ x is iterable }}"
     " {{ d is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby(3) }}"
     " {{ 9 is divisibleby 4 }} {{ x is not none }} {{ 'A' is upper }} {{ 'a' is lower }}"
     " {{ true is true }} {{ 0 is false }} {{ x is equalto 'v' }} {{ 1 is eq 1 }} {{ 1 is ne 2 }}"
     " {{ 2 is gt 1 }} {{ 2 is lt 1 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 1 is in [1, 2] }}"
     " {{ range is callable }} {{ none is sameas none }} {{ 1 is boolean }} {{ d is string }}",
     {"x": "v", "d": {"a": 1}, "l": [1]}),
    ("test_unknown_is_error", "{{ 1 is no_such_test }}", {}),
    ("string_methods", "{{ '  a  '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'a\n'.rstrip() }}|"
     "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a-b-c'.split('-', 1) }}|"
     "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}|"
     "{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'ab cd'.title() }}{{ 'aB'.capitalize() }}|"
     "{{ 'aXbX'.replace('X', '-') }}|{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}"
     "{{ 'abc'.find('z') }}|{{ 'abcb'.count('b') }}|{{ ', '.join(['x', 'y']) }}|"
     "{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ 'a1'.isalnum() }}|"
     "{{ 'a</think>b'.split('</think>')[-1].lstrip('\n') }}", {}),
    ("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}"
     " {{ d.get('a') }} {{ d.get('z', 'dflt') }} [{{ d.get('z') }}]", {"d": {"a": 1, "b": 2}}),
    ("list_mutation_is_error", "{% set l = [1] %}{{ l.append(2) }}", {}),
    ("raise_exception", "{% if true %}{{ raise_exception('roles must alternate') }}{% endif %}", {}),
    ("call_undefined_is_error", "{{ nope() }}", {}),
    ("unclosed_block_is_error", "{% if true %}x", {}),
    ("unknown_tag_is_error", "{% frobnicate %}", {}),
    ("unterminated_string_is_error", "{{ 'abc }}", {}),
    ("bad_expression_is_error", "{{ 1 + }}", {}),
    ("endfor_without_for_is_error", "{% endfor %}", {}),
    ("filter_chain_precedence", "{{ 'a' + ' b ' | trim + 'c' }} {{ -2 | abs }} {{ not 'x' | length }}"
     " {{ [1, 2] | length + 1 }}", {}),
    ("attribute_on_filter_result", "{{ (ms | last).role }} {{ ms[-1]['role'] }}",
     {"ms": [{"role": "a"}, {"role": "b"}]}),
    ("string_formatting_via_tilde", "{{ 'n=' ~ 3 }}", {}),
    ("integer_literals", "{{ 1_000 }} {{ 0x10 }} {{ 0o17 }} {{ 0b101 }} {{ 1.5e3 }} {{ 2E-2 }}", {}),
    ("leading_zero_is_error", "{{ 010 }}", {}),
    ("keyword_constants", "{{ True }} {{ False }} {{ None }} {{ true }}", {}),
    ("length_of_messages", "{{ messages | length }}{{ messages[0].content }}",
     {"messages": [{"role": "user", "content": "hi"}]}),
    ("bos_eos", "{{ bos_token }}x{{ eos_token }}", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("generation_block", "{% for m in ms %}{% if m.role == 'assistant' %}{% generation %}"
     "[{{ m.content }}]{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
     {"ms": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
]

# --- real chat templates over conversations ------------------------------------------------------
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, now.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}]

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello. How can I help?"},
                   {"role": "user", "content": "Tell me a joke."}],
    "whitespace": [{"role": "system", "content": "  padded system \n"},
                   {"role": "user", "content": "\n  lead and trail  \n\n"}],
    "unicode": [{"role": "user", "content": "Grüße, 世界! 😀 — \"quotes\" and 'apostrophes'"}],
    "template_syntax_in_content": [{"role": "user", "content": "{{ not a tag }} {% if x %} {# c #}"}],
    "empty_content": [{"role": "user", "content": ""}],
}

TOOL_CONVERSATIONS = {
    "tools_offered": ([{"role": "system", "content": "Use tools."},
                       {"role": "user", "content": "Weather in Paris?"}], {"tools": TOOLS}),
    "tool_call_and_result": ([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {
             "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temperature\": 21}"},
        {"role": "user", "content": "Thanks."}], {"tools": TOOLS}),
    "two_tool_calls": ([
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                            "arguments": {"city": "Paris"}}},
                        {"type": "function", "function": {"name": "get_weather",
                                                            "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "rain"}], {"tools": TOOLS}),
    "tools_not_in_user_message": ([{"role": "user", "content": "Hi"}],
                                  {"tools": TOOLS, "tools_in_user_message": False}),
    "tools_without_user_message": ([{"role": "system", "content": "S"}], {"tools": TOOLS}),
    "builtin_tools_and_date": ([
        {"role": "user", "content": "Search it."},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {
             "name": "brave_search", "arguments": {"query": "modserve"}}}]},
        {"role": "ipython", "content": {"result": "ok"}}],
        {"builtin_tools": ["brave_search", "code_interpreter"], "date_string": "01 Dec 2025"}),
}

# The special tokens each model's tokenizer defines (Qwen2 has no BOS token: the variable is then
# undefined in the template, as transformers leaves it).
MODELS = {
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2": {"eos_token": "<|im_end|>"},
    "qwen2_5": {"eos_token": "<|im_end|>"},
}
TOOL_MODELS = ("llama3_1", "qwen2_5")


def main():
    env = environment()
    if os.path.exists(GGUF):
        with open(os.path.join(HERE, "smollm2.jinja"), "w") as f:
            f.write(gguf_chat_template(GGUF))
    cases = []
    for name, source, context in FEATURES:
        cases.append({"name": name, "template": source, "context": context,
                      **render(env, source, context)})
    for model, tokens in MODELS.items():
        with open(os.path.join(HERE, model + ".jinja")) as f:
            source = f.read()
        convs = [(n, m, {}) for n, m in CONVERSATIONS.items()]
        if model in TOOL_MODELS:
            convs += [(n, m, extra) for n, (m, extra) in TOOL_CONVERSATIONS.items()]
        for conv_name, messages, extra in convs:
            for gen in (True, False):
                context = {"messages": messages, "add_generation_prompt": gen, **tokens, **extra}
                cases.append({"name": f"{model}/{conv_name}/{'gen' if gen else 'nogen'}",
                              "template_file": model + ".jinja", "context": context,
                              **render(env, source, context)})
    out = os.path.join(HERE, "goldens.json")
    with open(out, "w") as f:
        json.dump({"generator": f"jinja2 {jinja2.__version__}, python {sys.version.split()[0]}",
                   "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    errors = sum(1 for c in cases if "error" in c)
    print(f"{out}: {len(cases)} cases ({errors} expected errors)")


if __name__ == "__main__":
    main()
