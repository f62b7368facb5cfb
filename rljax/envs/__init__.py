"""rljax.envs: environments for multi-turn rollouts with tools.

The protocol (``Environment``: reset with a problem, step with a model turn),
a tool environment (``ToolEnv``, limits in ``ToolEnvConfig``), two tools
(``CalculatorTool``: exact arithmetic without eval; ``PythonTool``: code in
a sandboxed process, ``sandbox.py``), an HTTP boundary (``env_server.py``
serves any environment in its own process, ``remote.py`` is its client),
two tool-call formats (Qwen's
``<tool_call>`` JSON and plain tags) and a generated task that needs the
calculator (``generate_tool_arithmetic``), word problems that take a
program (``generate_tool_word_problems``). The engines run them through
``rljax.rollout.multiturn.rollout_multiturn`` (one folder up, since
``rollout`` imports ``envs``): token in / token out trajectories with an
action mask. The trainer trains on them with ``--task.name=tool_arithmetic``
(``rljax/train/tool_task.py``; ``experiments/tool_rl.py``).
"""

from rljax.envs.base import (
  Environment,
  StepResult,
  TokenEnv,
  TokenStep,
  summarize,
)
from rljax.envs.calculator import CalculatorConfig, CalculatorError, calculate
from rljax.envs.env_server import EnvServer, EnvServerConfig
from rljax.envs.formats import (
  FORMATS,
  ParsedTurn,
  QwenFormat,
  TagFormat,
  ToolCall,
  ToolCallFormat,
  make_format,
  tool_schemas,
)
from rljax.envs.remote import (
  RemoteEnv,
  RemoteEnvError,
  RemoteEnvFactory,
  connect,
)
from rljax.envs.sandbox import (
  SandboxConfig,
  SandboxResult,
  run_python,
  sandbox_mode,
)
from rljax.envs.tasks import (
  ToolArithmeticConfig,
  generate_tool_arithmetic,
  score_answer,
)
from rljax.envs.tool_env import ToolEnv, ToolEnvConfig, truncate
from rljax.envs.word_problems import (
  WORD_PROBLEM_LEVELS,
  generate_tool_word_problems,
)
from rljax.envs.tools import (
  TOOL_ERROR_KINDS,
  CalculatorTool,
  PythonTool,
  Tool,
  ToolResult,
)

__all__ = [
  "FORMATS",
  "TOOL_ERROR_KINDS",
  "WORD_PROBLEM_LEVELS",
  "CalculatorConfig",
  "CalculatorError",
  "CalculatorTool",
  "EnvServer",
  "EnvServerConfig",
  "Environment",
  "ParsedTurn",
  "PythonTool",
  "QwenFormat",
  "RemoteEnv",
  "RemoteEnvError",
  "RemoteEnvFactory",
  "SandboxConfig",
  "SandboxResult",
  "StepResult",
  "TagFormat",
  "TokenEnv",
  "TokenStep",
  "Tool",
  "ToolArithmeticConfig",
  "ToolCall",
  "ToolCallFormat",
  "ToolEnv",
  "ToolEnvConfig",
  "ToolResult",
  "calculate",
  "connect",
  "generate_tool_arithmetic",
  "generate_tool_word_problems",
  "make_format",
  "run_python",
  "sandbox_mode",
  "score_answer",
  "summarize",
  "tool_schemas",
]
