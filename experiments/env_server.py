"""Serves the tool-arithmetic environment over HTTP, in its own process.

The example environment of `rljax/envs/env_server.py`'s protocol: each
episode is the trainer's own tool environment (`tool_task.make_tool_env`:
a calculator or the sandboxed Python tool, tags or `<tool_call>` JSON), run
here instead of in the trainer. Start it, then point a tool task at it:

  python experiments/env_server.py --port=8765 &
  python experiments/tool_rl.py --task.env_url=http://127.0.0.1:8765 \\
      --task.tool_choice=auto --task.tool_prompt=plain --task.max_turns=4

It prints one line, `serving http://HOST:PORT`, once it answers (with
--port=0 the port is a free one). The tokenizer must be the policy's:
`smollm2` (SmolLM2's, also the tiny test models') or an HF directory.
"""

from __future__ import annotations

from absl import app, flags

from rljax import envs
from rljax.envs.env_server import (
  EnvServer,
  EnvServerConfig,
  serve_until_stopped,
)
from rljax.train import tool_task

_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind.")
_PORT = flags.DEFINE_integer("port", 0, "Port; 0 picks a free one.")
_TOKENIZER = flags.DEFINE_string(
  "tokenizer", "smollm2", "smollm2 (SmolLM2's) or an HF directory."
)
_TOOL = flags.DEFINE_enum("tool", "calculator", ["calculator", "python"], "")
_SANDBOX = flags.DEFINE_enum(
  "python_sandbox",
  "strong",
  ["strong", "unsafe_rlimits_only"],
  "How the python tool confines code (docs/sandbox.md).",
)
_FORMAT = flags.DEFINE_enum("tool_format", "tags", ["tags", "qwen"], "")
_PROMPT = flags.DEFINE_enum(
  "tool_prompt", "plain", ["plain", "example"], "A worked call or not."
)
_MAX_TURNS = flags.DEFINE_integer("max_turns", 4, "Model turns per episode.")
_MAX_TOKENS = flags.DEFINE_integer(
  "max_total_tokens", 4096, "Tokens after the prompt, model and tools."
)
_MAX_EPISODES = flags.DEFINE_integer("max_episodes", 65536, "Open episodes.")
_IDLE_S = flags.DEFINE_float(
  "idle_timeout_s", 600.0, "An episode not stepped this long is dropped."
)


def load_tokenizer(name: str):
  if name == "smollm2":
    from rljax.models.pretrained import tiny_tokenizer

    return tiny_tokenizer()
  from rljax.models.tokenizer import load_tokenizer as load

  return load(name)


def main(argv) -> None:
  del argv
  tokenizer = load_tokenizer(_TOKENIZER.value)
  tool = tool_task.make_tool(_TOOL.value, _SANDBOX.value)
  example = (
    tool_task.worked_example(tool, _FORMAT.value)
    if _PROMPT.value == "example"
    else ""
  )
  env_config = envs.ToolEnvConfig(
    format=_FORMAT.value,
    max_turns=_MAX_TURNS.value,
    max_total_tokens=_MAX_TOKENS.value,
  )

  def make_env():
    return tool_task.make_tool_env(
      tool, env_config, tool_task.ToolPrompt(example), tokenizer
    )

  config = EnvServerConfig(
    host=_HOST.value,
    port=_PORT.value,
    max_episodes=_MAX_EPISODES.value,
    idle_timeout_s=_IDLE_S.value,
  )
  server = EnvServer(make_env, tokenizer, config, name="tool_arithmetic")
  serve_until_stopped(server)


if __name__ == "__main__":
  app.run(main)
