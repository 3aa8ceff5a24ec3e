"""Tool calling through the official `openai` client: tools rendered through the chat template (or,
for a template without a tool section, the system prompt), tool_choice "required" and a named
function forced by the tools' grammar, "auto" parsed, streamed deltas, parallel_tool_calls, the
legacy functions / function_call, a second turn that sends the calls and their results back, and
400s for bad tools. Every call must name a requested tool and its arguments must validate against
the tool's parameters (`jsonschema`); content quality is not judged.

Run by tests/server/server_test.cpp against servers started with --batch-invariant and the
bundled model's template (no tool section) or a real one (--chat-template: Llama 3.2, Qwen2.5,
Mistral Nemo). Environment: TACHYON_BASE_URL, TACHYON_MODEL_NAME, TACHYON_TOOL_FORMAT (hermes,
llama3_json or mistral: what the server's template makes calls look like).
"""
import json
import os
import re
import unittest

import jsonschema
import openai

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
FORMAT = os.environ.get("TACHYON_TOOL_FORMAT", "hermes")

client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key="none", max_retries=0, timeout=300)

# Small tools: the bundled model's context is 512 tokens, and a template's tool section takes most of it.
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "time", "parameters": TIME}}]
SCHEMAS = {"weather": WEATHER, "time": TIME}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
ID = re.compile(r"[A-Za-z0-9]{9}" if FORMAT == "mistral" else r"call_[A-Za-z0-9]{24}")


def check_calls(testcase, calls):
    """Each call names a requested tool, has a well-formed id, and arguments valid for its tool."""
    testcase.assertTrue(calls)
    for call in calls:
        testcase.assertEqual(call.type, "function")
        testcase.assertRegex(call.id, ID)
        testcase.assertIn(call.function.name, SCHEMAS)
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def chat(**kwargs):
    """max_tokens defaults to the rest of the context: room for any call the tools' grammar allows."""
    args = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=0)
    args.update(kwargs)
    return client.chat.completions.create(**args)


class Forced(unittest.TestCase):
    def test_required(self):
        # One call: the grammar then ends the output (a small model would repeat calls to the end of
        # its context when allowed several).
        choice = chat(tool_choice="required", parallel_tool_calls=False).choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls", choice.message)
        self.assertEqual(len(choice.message.tool_calls), 1)
        check_calls(self, choice.message.tool_calls)
        self.assertIn(choice.message.content, (None, ""))

    def test_several_calls(self):
        # Parallel calls allowed: a small model may go on calling to the end of its context. Then the
        # finish_reason is "length", complete calls still parse (Mistral's one array does not, unclosed)
        # and the call cut off is content.
        choice = chat(tool_choice="required", temperature=0.8, seed=2).choices[0]
        self.assertIn(choice.finish_reason, ("tool_calls", "length"))
        if choice.finish_reason == "tool_calls" or FORMAT != "mistral":
            check_calls(self, choice.message.tool_calls)
        if choice.finish_reason == "tool_calls":
            self.assertIn(choice.message.content, (None, ""))

    def test_named_function(self):
        r = chat(tool_choice={"type": "function", "function": {"name": "time"}})
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        calls = r.choices[0].message.tool_calls
        check_calls(self, calls)
        self.assertEqual([c.function.name for c in calls], ["time"])

    def test_sampled_choices(self):
        r = chat(tool_choice="required", parallel_tool_calls=False, temperature=1.0, n=3, seed=9)
        self.assertEqual(len(r.choices), 3)
        for choice in r.choices:
            self.assertEqual(choice.finish_reason, "tool_calls")
            check_calls(self, choice.message.tool_calls)

    def test_streamed_deltas_build_the_same_calls(self):
        whole = chat(tool_choice="required", parallel_tool_calls=False).choices[0].message.tool_calls
        calls, finish, content = {}, None, ""
        for chunk in chat(tool_choice="required", parallel_tool_calls=False, stream=True):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for d in delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(content.strip(), "")
        self.assertEqual(sorted(calls), list(range(len(calls))))
        self.assertEqual([(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)],
                         [(c.function.name, c.function.arguments) for c in whole])
        for i in calls:
            self.assertRegex(calls[i]["id"], ID)


class Auto(unittest.TestCase):
    def test_auto_is_well_formed(self):
        for seed in range(3):
            choice = chat(tool_choice="auto", temperature=1, seed=seed, max_tokens=96).choices[0]
            if choice.message.tool_calls:
                self.assertEqual(choice.finish_reason, "tool_calls")
                check_calls(self, choice.message.tool_calls)
            else:
                self.assertIsInstance(choice.message.content, str)
                self.assertIn(choice.finish_reason, ("stop", "length"))

    def test_second_turn_with_results(self):
        first = chat(tool_choice="required", parallel_tool_calls=False).choices[0].message
        messages = MESSAGES + [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": c.id, "type": "function",
                             "function": {"name": c.function.name, "arguments": c.function.arguments}}
                            for c in first.tool_calls]}]
        for c in first.tool_calls:
            messages.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps({"result": "ok"})})
        r = chat(messages=messages, tool_choice="auto", max_tokens=32)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        # Without tools in this turn, the earlier calls still render.
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
        self.assertIsInstance(r.choices[0].message.content, str)

    def test_none_gives_content(self):
        choice = chat(tool_choice="none", max_tokens=16).choices[0]
        self.assertIsNone(choice.message.tool_calls)
        self.assertIsInstance(choice.message.content, str)


class Legacy(unittest.TestCase):
    def test_functions_and_function_call(self):
        r = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, temperature=0,
            functions=[t["function"] for t in TOOLS], function_call={"name": "weather"})
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "function_call")
        self.assertEqual(choice.message.function_call.name, "weather")
        jsonschema.validate(json.loads(choice.message.function_call.arguments), WEATHER)


class Refusals(unittest.TestCase):
    def assert_400(self, param, **kwargs):
        with self.assertRaises(openai.BadRequestError) as ctx:
            chat(**kwargs)
        self.assertEqual(ctx.exception.body["param"], param, ctx.exception.body)
        self.assertIn(f"'{param}'", ctx.exception.body["message"])

    def test_bad_tools(self):
        self.assert_400("tool_choice", tool_choice={"type": "function", "function": {"name": "nope"}})
        self.assert_400("tools", tools=[{"type": "function", "function": {"name": "has space"}}])
        self.assert_400("tools",
                        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}])
        self.assert_400("tool_choice", tool_choice="required", response_format={"type": "json_object"})
        self.assert_400("tool_choice", tool_choice="sometimes")


if __name__ == "__main__":
    unittest.main(verbosity=2)
