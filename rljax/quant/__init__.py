"""rljax.quant: INT8/FP8 quantized rollout weights (QuRL §3, §4.3, App. A).

  params_s = quant.fold_uaq(config, params, scale=1.5)           # same function
  qparams = quant.quantize_params(config, params_s, mode="int8")  # or fp8, int8_wo
  logits = models.forward(config, qparams, tokens)                 # via qdot
  models.export_compressed_tensors_int8(config, qparams, out_dir)  # for vLLM

quant sits below models: the decoder stands on `QTensor`/`qdot`, and the
export to HF names lives in `models.quant_export`.
"""

from rljax.quant.diagnostics import SyncDiagnostics
from rljax.quant.diagnostics import absolute_quant_error
from rljax.quant.diagnostics import normalized_quant_error
from rljax.quant.diagnostics import normalized_quant_error_per_layer
from rljax.quant.diagnostics import normalized_weight_update
from rljax.quant.diagnostics import quantized_change_fraction
from rljax.quant.params import LAYER_KERNELS
from rljax.quant.params import iter_qtensors
from rljax.quant.params import kernel_paths
from rljax.quant.params import quantize_params
from rljax.quant.qtensor import MODES
from rljax.quant.qtensor import QTensor
from rljax.quant.qtensor import bf16_dot
from rljax.quant.qtensor import contract_last
from rljax.quant.qtensor import qdot
from rljax.quant.qtensor import quantize_activations_fp8
from rljax.quant.qtensor import quantize_activations_int8
from rljax.quant.quantizers import dequantize
from rljax.quant.quantizers import quantize
from rljax.quant.quantizers import quantize_fp8
from rljax.quant.quantizers import quantize_int8
from rljax.quant.rollout import ROLLOUT_MODES
from rljax.quant.rollout import is_quantized
from rljax.quant.rollout import prepare_rollout_weights
from rljax.quant.rollout import quantized_float_dtype
from rljax.quant.uaq import fold_uaq
from rljax.quant.uaq import unfold_uaq
