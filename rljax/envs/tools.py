"""Tools an environment can run for the model: the interface and two tools.

A tool has a ``name``, a one-line ``description``, a JSON-schema
``parameters`` object (what the Qwen chat template lists under ``<tools>``),
the ``argument`` that the tag format's body fills (``<calculator>BODY
</calculator>`` is ``{"expression": BODY}``), and ``run(arguments,
timeout_s)`` returning a ``ToolResult``. A tool never raises for what the
model wrote: every failure is a ``ToolResult`` with a named ``error``, so the
episode goes on and the error is counted.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, runtime_checkable

from rljax.envs import calculator as calc
from rljax.envs import sandbox

__all__ = [
  "TOOL_ERROR_KINDS",
  "CalculatorTool",
  "PythonTool",
  "Tool",
  "ToolResult",
]

# Every named error a tool result can carry. "malformed": a call the format
# could not read (no tool ran); "arguments": the call's arguments do not fit
# the tool's parameters; "limit" and "math": the calculator's refusals; the
# rest: the sandbox's (sandbox.SANDBOX_ERROR_KINDS).
TOOL_ERROR_KINDS = (
  "malformed",
  "arguments",
  "limit",
  "math",
  *sandbox.SANDBOX_ERROR_KINDS,
)


@dataclasses.dataclass(frozen=True)
class ToolResult:
  """What a tool call gave back.

  Attributes:
    output: the text for the model (its answer, or the error explained).
    error: None on success, else one of ``TOOL_ERROR_KINDS``.
  """

  output: str
  error: str | None = None

  def __post_init__(self):
    if self.error is not None and self.error not in TOOL_ERROR_KINDS:
      raise ValueError(
        f"ToolResult.error={self.error!r}; expected None or one of {TOOL_ERROR_KINDS}"
      )


@runtime_checkable
class Tool(Protocol):
  name: str
  description: str
  parameters: Mapping[str, Any]
  argument: str

  def run(
    self, arguments: Mapping[str, Any], timeout_s: float
  ) -> ToolResult: ...


def _string_argument(
  arguments: Mapping[str, Any], key: str, tool: str
) -> str | ToolResult:
  value = arguments.get(key) if isinstance(arguments, Mapping) else None
  if not isinstance(value, str):
    return ToolResult(
      f"{tool} expects {{{key!r}: <text>}}; got {arguments!r}"[:300],
      "arguments",
    )
  return value


@dataclasses.dataclass(frozen=True)
class CalculatorTool:
  """Exact arithmetic (``calculator.calculate``); in-process, bounded by
  construction, so it ignores the timeout."""

  config: calc.CalculatorConfig = calc.CalculatorConfig()
  name: str = "calculator"
  description: str = (
    "Evaluates an arithmetic expression exactly: numbers, + - * / // % ** "
    "and parentheses."
  )
  argument: str = "expression"

  @property
  def parameters(self) -> Mapping[str, Any]:
    return {
      "type": "object",
      "properties": {
        "expression": {
          "type": "string",
          "description": "e.g. 48213 * 7391 - 120934",
        }
      },
      "required": ["expression"],
    }

  def run(self, arguments: Mapping[str, Any], timeout_s: float) -> ToolResult:
    expression = _string_argument(arguments, "expression", self.name)
    if isinstance(expression, ToolResult):
      return expression
    try:
      return ToolResult(
        calc.format_number(calc.calculate(expression, self.config))
      )
    except calc.CalculatorError as error:
      kind = "arguments" if error.kind == "syntax" else error.kind
      return ToolResult(f"error: {error}", kind)


@dataclasses.dataclass(frozen=True)
class PythonTool:
  """Runs model-written Python in a fresh sandbox process
  (``sandbox.run_python``); the output is what it printed. The call's
  wall-time limit is the smaller of ``timeout_s`` and the sandbox's own.

  The sandbox mode is ``config.mode``: "strong" unless the weaker
  "unsafe_rlimits_only" is named. Where the named mode cannot run, ``run``
  raises ``sandbox.SandboxUnavailable`` (and ``check`` says so before any
  call): no call ever runs in a weaker mode than the one named."""

  config: sandbox.SandboxConfig = sandbox.SandboxConfig()
  name: str = "python"
  description: str = (
    "Runs a Python 3 program and returns what it prints (no network, no "
    "files outside its working directory)."
  )
  argument: str = "code"

  @property
  def parameters(self) -> Mapping[str, Any]:
    return {
      "type": "object",
      "properties": {
        "code": {"type": "string", "description": "a Python program"}
      },
      "required": ["code"],
    }

  def check(self) -> None:
    """Raises ``sandbox.SandboxUnavailable`` unless the mode can run here."""
    sandbox.require(self.config.mode)

  def run(self, arguments: Mapping[str, Any], timeout_s: float) -> ToolResult:
    code = _string_argument(arguments, "code", self.name)
    if isinstance(code, ToolResult):
      return code
    config = self.config
    if timeout_s < config.timeout_s:
      config = dataclasses.replace(config, timeout_s=timeout_s)
    result = sandbox.run_python(code, config)
    output = (result.stdout + result.stderr).rstrip("\n")
    if result.truncated:
      output += "\n[output truncated]"
    if result.ok:
      return ToolResult(output)
    return ToolResult(
      (output + "\n" if output else "")
      + f"error ({result.kind}): {result.message}",
      result.kind,
    )
