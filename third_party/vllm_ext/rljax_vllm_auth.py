"""ASGI middleware that rljax's vLLM sidecar adds to the server it launches.

vLLM 0.32's `--api-key` / `VLLM_API_KEY` only guards paths under /v1, /v2,
/inference and /cohere (vllm/entrypoints/serve/middleware/authenticate.py,
GUARDED_PREFIX). The development routes that the sidecar needs
(`VLLM_SERVER_DEV_MODE=1`: /collective_rpc, which calls any worker method,
e.g. `reload_weights` from any path; /reset_prefix_cache; /sleep; /pause ...)
stay open to every local process. This middleware requires the same bearer
token on every path except /health (liveness carries no data), so that only
the trainer that launched the server can drive it.

Loaded with `--middleware rljax_vllm_auth.BearerTokenMiddleware`; the key comes
from the server's environment (`VLLM_API_KEY`), never from argv (which any
local user can read in /proc/PID/cmdline).
"""
import hashlib
import hmac
import json
import os

OPEN_PATHS = ("/health",)


class BearerTokenMiddleware:
  """Answers 401 to any HTTP or websocket request without
  `Authorization: Bearer $VLLM_API_KEY`, except OPTIONS and OPEN_PATHS."""

  def __init__(self, app):
    key = os.environ.get("VLLM_API_KEY", "")
    if not key:
      raise RuntimeError(
          "rljax_vllm_auth.BearerTokenMiddleware: VLLM_API_KEY is not set in "
          "the server's environment; refusing to start without a key")
    self.app = app
    self._digest = hashlib.sha256(key.encode()).digest()

  def _authorized(self, scope) -> bool:
    for name, value in scope.get("headers") or ():
      if name.lower() == b"authorization":
        scheme, _, token = value.decode("latin-1").partition(" ")
        if scheme.lower() == "bearer":
          return hmac.compare_digest(
              hashlib.sha256(token.strip().encode()).digest(), self._digest)
    return False

  async def __call__(self, scope, receive, send):
    if scope["type"] not in ("http", "websocket") or (
        scope.get("method") == "OPTIONS"):
      return await self.app(scope, receive, send)
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    if path in OPEN_PATHS or self._authorized(scope):
      return await self.app(scope, receive, send)
    if scope["type"] == "websocket":
      await send({"type": "websocket.close", "code": 1008})
      return None
    body = json.dumps({"error": "Unauthorized: this rljax sidecar needs "
                                "its per-run API key"}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
    return None
