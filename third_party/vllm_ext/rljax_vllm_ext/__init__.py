"""Code that rljax's vLLM sidecar runs inside vLLM's own processes."""
from rljax_vllm_ext.worker import RljaxWorkerExtension

__all__ = ["RljaxWorkerExtension"]
