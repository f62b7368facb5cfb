"""vLLM sidecar engines, one module per concern (lowest first):

  config   `VLLMSidecarConfig`, `SidecarError`, a checkpoint's weight format
  guard    the guard process: no server outlives its trainer
  process  a server's process: command, environment, launch, log, stop
  api      the server's HTTP routes; completion request/response translation
  client   requests to a server: start-up checks, rollout fan-out, reload
  sync     weights in a server's checkpoint format, sync dirs, timing
  inflight weight updates while requests run (pause / apply / resume)
  sidecar_sync  `SidecarSync`: the façade's weight syncs (its base class)
  sidecar  `VLLMSidecar`: the engine façade composing the three above
  pool     `VLLMSidecarPool`: one rollout over several sidecars
  export   a model's starting checkpoint and the engine serving it

Import from `rljax.rollout.vllm_sidecar`, which re-exports them.
"""
