"""Function calling as OpenAI's chat API has it: `tools`, `tool_choice`, assistant `tool_calls` and
`tool` results in the conversation, and replies that call a function.

A call is written by the model as one JSON object, {"name": ..., "arguments": {...}}, and
constrained by a grammar (`grammar.Grammar`) built from the functions' parameter schemas:
- `tool_choice` "required": the reply is a call of one of the functions;
- a named function: a call of that one;
- "auto" (the default with tools): free text, or a call; the model chooses with its first token (a
  reply that begins with "{" is a call, and the grammar holds it to the schemas from there);
- "none": no call; the functions are still described to the model.

The conversation goes through the model's chat template with its `tools` variable where the
template reads one. Where it does not (the embedded SmolLM2's), the generic format below: the
functions and the way to call them in a system message, calls as the JSON the model would write,
results as user turns naming the function.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from ..grammar import JSON_OPTIONS, Grammar

CHOICES = ("none", "auto", "required")


class ToolsError(ValueError):
    """`tools` or `tool_choice` refused: the message, and the field it names (`param`)."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


_bad = ToolsError


@dataclass(frozen=True)
class Tools:
    functions: tuple[dict, ...]  # each {"name", "description", "parameters"}
    choice: str  # "none", "auto", "required", or a function's name

    def call_schema(self) -> dict:
        """The JSON Schema of a call of the functions `choice` allows."""
        names = [f["name"] for f in self.functions] if self.choice in CHOICES else [self.choice]
        calls = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                  "required": ["name", "arguments"], "additionalProperties": False}
                 for f in self.functions if f["name"] in names]
        return calls[0] if len(calls) == 1 else {"anyOf": calls}

    def grammar(self) -> Grammar | None:
        if self.choice == "none":
            return None
        if self.choice != "auto":
            return Grammar.json_schema(self.call_schema())
        schema = {**self.call_schema(), "x-guidance": JSON_OPTIONS}
        return Grammar.lark(f"start: call | TEXT\ncall: %json {json.dumps(schema)}\nTEXT: /[^{{](.|\\n)*/\n")

    def call_of(self, text: str) -> dict | None:
        """The reply as an OpenAI tool call ({id, type, function: {name, arguments}}), or None where it
        is text (tool_choice auto or none)."""
        if self.choice == "none" or not text.lstrip().startswith("{"):
            return None
        try:
            call = json.loads(text)
        except json.JSONDecodeError:
            return None  # cut short by max_tokens: not a call
        if not isinstance(call, dict) or call.get("name") not in {f["name"] for f in self.functions}:
            return None
        return {"id": "call_" + secrets.token_hex(12), "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))}}


def parse_tools(body: dict) -> Tools | None:
    """`tools` and `tool_choice` of a chat request, checked (None without tools)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise _bad("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise _bad("'tools' must be a list of {type: function, function: {name, parameters}}", "tools", "invalid_type")
    functions = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise _bad(f"'{param}' must be {{\"type\": \"function\", \"function\": {{...}}}}", param)
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"'{param}.function.name' must be a non-empty string", f"{param}.function.name")
        if name in {f["name"] for f in functions}:
            raise _bad(f"two tools are named {name!r}", f"{param}.function.name")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise _bad(f"'{param}.function.parameters' must be a JSON Schema object", f"{param}.function.parameters")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise _bad(f"'{param}.function.description' must be a string", f"{param}.function.description")
        functions.append({"name": name, "description": description, "parameters": parameters})
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in {f["name"] for f in functions}:
            raise _bad("'tool_choice' names no function of 'tools'", "tool_choice")
        choice = name
    elif choice not in CHOICES:
        raise _bad(f"'tool_choice' must be one of {', '.join(CHOICES)} or {{\"type\": \"function\", "
                   "\"function\": {\"name\": ...}}", "tool_choice")
    tools = Tools(tuple(functions), choice)
    try:
        tools.grammar()
    except ValueError as err:
        raise _bad(f"the tools' parameters are not usable schemas: {err}", "tools") from None
    return tools


def template_reads_tools(tokenizer) -> bool:
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def conversation(messages: tuple[dict, ...], tools: Tools | None, tokenizer) -> tuple[list[dict], list | None]:
    """The messages and tools to render: as they are (calls' arguments as objects) for a template
    that reads `tools`, else in the generic format of the module docstring."""
    if tools is None and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return list(messages), None
    specs = [{"type": "function", "function": f} for f in tools.functions] if tools else None
    if template_reads_tools(tokenizer):
        out = []
        for m in messages:
            if m.get("tool_calls"):
                m = {**m, "tool_calls": [{**c, "function": {**c["function"],
                                                            "arguments": json.loads(c["function"]["arguments"])}}
                                         for c in m["tool_calls"]]}
            out.append(m)
        return out, specs
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = "\n".join(json.dumps({"name": c["function"]["name"],
                                          "arguments": json.loads(c["function"]["arguments"])}, separators=(",", ":"))
                              for c in m["tool_calls"])
            out.append({"role": "assistant", "content": ((m.get("content") or "") + "\n" + calls).strip()})
        elif m["role"] == "tool":
            name = names.get(m.get("tool_call_id"), "a function")
            out.append({"role": "user", "content": f"Result of {name}: {m['content']}"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools is not None:
        lines = ["You can call these functions (their parameters as JSON Schema):"]
        lines += [json.dumps(f) for f in tools.functions]
        lines.append('To call one, reply with only a JSON object: {"name": <the function\'s name>, '
                     '"arguments": <its parameters>}.' if tools.choice != "none" else "Do not call them now.")
        text = "\n".join(lines)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out, None
