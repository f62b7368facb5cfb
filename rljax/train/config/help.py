"""What each training field does: the one source of every flag's help.

`FIELD_HELP` says what a dotted field means, in one or two sentences;
`flag_help` adds the values it accepts, read from the field's rule in
`validation.FIELD_RULES` (so the help and the check cannot disagree), and
`sections_help` is the section list `--help` prints. A new field needs an
entry here (tests/train/test_flag_help.py checks every one).
"""

from __future__ import annotations

import textwrap

from rljax.train.config import sections
from rljax.train.config import validation

FIELD_HELP: dict[str, str] = {
  "algorithm": (
    "Algorithm preset: sets several fields of loss/advantage/kl/update at "
    "once; flags you type override it."
  ),
  # model
  "model.name": (
    "The policy trained: 'smollm2-135m-instruct' (the embedded GGUF), an HF "
    "safetensors directory, a .gguf file, or 'tiny' (a random few-layer "
    "decoder for tests and smoke runs). The presets of "
    "rljax.models.config are random-weight shapes for the benchmarks only."
  ),
  "model.lora_rank": "LoRA rank r of the trained adapters; 0 trains every weight.",
  "model.lora_alpha": "LoRA scale alpha (the update is alpha/r · B·A).",
  "model.lora_dropout": "Dropout on the LoRA adapters' input.",
  "model.lora_targets": (
    "Projections that get adapters: all, attn, mlp, or a comma list such as "
    "q_proj,v_proj."
  ),
  "model.lora_base_dtype": (
    "dtype of the frozen base under LoRA: float32, bfloat16 or int8 (less "
    "memory)."
  ),
  "model.param_dtype": "dtype of the master weights θ and of Adam's state.",
  "model.compute_dtype": (
    "dtype of the forward passes (policy, proximal, reference, critic); "
    "auto = bfloat16 on GPU/TPU and on CPUs with AVX512-BF16/AMX, float32 "
    "elsewhere. A reference (unquantized) arm of a quantization study pins "
    "float32 (docs/precision.md)."
  ),
  # task
  "task.name": "The prompts: a generated task or a dataset of rljax.data.",
  "task.difficulty": (
    "Generated tasks: a level (easy, medium, hard) or a spec such as "
    "steps=2_digits=2."
  ),
  "task.data_path": (
    "Dataset tasks: the local .jsonl or .parquet file (refused with a "
    "generated task, which reads none)."
  ),
  "task.eval_size": (
    "Held-out prompts (never trained on) for the accuracy before/after; 0 "
    "turns held-out evaluation off. Generated tasks: at most their training "
    "pool's size, and fewer than the distinct problems they draw."
  ),
  "task.max_prompt_tokens": (
    "Longer prompts are dropped from the pool. Tool tasks: the context of "
    "every turn (first prompt + up to rollout.max_new_tokens ids of the "
    "trajectory), so first prompts keep max_prompt_tokens - max_new_tokens."
  ),
  "task.reward_workers": "Verifier processes; 0 scores in the trainer's process.",
  "task.tool": (
    "Tool tasks (tool_arithmetic): the tool the model may call, calculator "
    "or python (a sandboxed process)."
  ),
  "task.tool_format": (
    "Tool tasks: the call format, tags (<calculator>...</calculator>) or "
    "qwen (<tool_call>{json}</tool_call>), each turn stopped at its closing "
    "tag; or a chat format, the model's own syntax with several calls per "
    "turn ended by its end-of-turn id: chat_qwen, chat_llama3 or "
    "chat_smollm2 (the tools go through the chat template where it takes "
    "tools=)."
  ),
  "task.tool_prompt": (
    "Tool tasks: plain (the tool's description) or example (plus one worked "
    "call and its output)."
  ),
  "task.python_sandbox": (
    "Tool tasks with task.tool=python: strong (namespaces, a read-only "
    "root, seccomp, a cgroup per call; needs root) or unsafe_rlimits_only "
    "(rlimits alone: the code can reach the network and what its user "
    "can). The run refuses to start rather than fall back (docs/sandbox.md)."
  ),
  "task.tool_choice": (
    "Tool tasks: auto (the model decides) or required (each episode's first "
    "turn opens with the call's opening tag, in the prompt's ids: the model "
    "writes the arguments; as the OpenAI API's tool_choice)."
  ),
  "task.max_turns": "Tool tasks: model turns per episode.",
  "task.max_calls_per_turn": (
    "Tool tasks: tool calls run per model turn, concurrently; further calls "
    "of the turn get an error observation and count as malformed."
  ),
  "task.env_url": (
    "Tool tasks: an environment server (experiments/env_server.py) whose "
    "episodes replace the in-process environment; its tool, format and "
    "prompt are the server's. Empty = in-process."
  ),
  "task.max_turn_tokens": (
    "Tool tasks: ids of one model turn; 0 = rollout.max_new_tokens, which "
    "bounds the whole trajectory (model and tool ids)."
  ),
  "task.tool_kv_reuse": (
    "Tool tasks: keep each episode's KV across its turns in one run of "
    "the continuous JAX engine, tools running off the decode batch, "
    "instead of one engine call per turn that prefills the history again. "
    "Sampled episodes draw other random streams than the per-turn calls."
  ),
  # reward
  "reward.name": (
    "The training reward: the task's verifier, a Bradley-Terry reward "
    "model, VR-CLI likelihood, or an LLM judge."
  ),
  "reward.model_path": (
    "reward_model: the directory written by experiments/train_reward_model.py."
  ),
  "reward.vrcli_reference": (
    "vrcli: the frozen reference model; empty = the initial policy."
  ),
  "reward.vrcli_separator": "vrcli: the text between the reasoning and gold y.",
  "reward.judge_url": "judge: the OpenAI-compatible server's base URL.",
  "reward.judge_model": "judge: the model name to ask for; empty = the first served.",
  "reward.judge_rubrics": "judge: a rubric file; empty = grade correctness.",
  "reward.judge_api": "judge: completions or chat (the chat template).",
  "reward.judge_timeout_s": "judge: seconds per request before it scores 0.",
  "reward.judge_allow_remote": (
    "judge: allow a non-loopback judge_url (the API key is sent to it)."
  ),
  # rollout
  "rollout.engine": "Rollout engine: jax (in-process sampler) or vllm (sidecar).",
  "rollout.vllm_urls": (
    "vllm: comma-separated URLs of running servers; empty starts one."
  ),
  "rollout.vllm_allow_remote": (
    "vllm: allow non-loopback vllm_urls (the run's key is sent to them)."
  ),
  "rollout.quant": (
    "Weights the actor samples with: none (θ as trained), bf16, int8 "
    "(W8A8), int8_wo (weight-only), fp8."
  ),
  "rollout.fake_quant": (
    "Quantize-dequantize emulation of the quantized matmuls (quantized "
    "modes only)."
  ),
  "rollout.uaq_scale": (
    "Update-aware quantization scale s (QuRL §4.3); 1.0 turns it off."
  ),
  "rollout.prompts_per_step": "Prompts drawn per RL step.",
  "rollout.group_size": "Samples per prompt (the group of GRPO-style baselines).",
  "rollout.max_new_tokens": "Longest response, in tokens.",
  "rollout.temperature": "Sampling temperature (the loss uses the same).",
  "rollout.top_p": "Nucleus sampling mass; 1.0 samples the full distribution.",
  "rollout.batching": (
    "JAX sampler batching: static (each chunk of prompts decodes until its "
    "longest row ends) or continuous (decode slots refilled with waiting "
    "prompts between chunks of decode steps); JAX engine only."
  ),
  "rollout.kv_page_size": (
    "batching=continuous: token slots a page of the KV pool that holds "
    "every prompt's and row's keys and values (0: the default, 16); at "
    "most task.max_prompt_tokens + rollout.max_new_tokens."
  ),
  "rollout.chunk_steps": (
    "batching=continuous: most decode steps between two scheduling points "
    "(finished rows leave, waiting prompts join, a streaming run takes new "
    "weights); shorter chunks let updates land inside shorter responses."
  ),
  "rollout.speculative": (
    "batching=continuous: off, or suffix (speculative decoding: drafts "
    "from suffix matches over the row's own text, its group's and earlier "
    "responses to the prompt, verified where that pays; the samples and "
    "log-probs are plain decoding's, only faster)."
  ),
  "rollout.inflight_kv": (
    "async_mode=streaming: a weight update taken mid-generation keeps the "
    "in-flight rows' stale KV cache (keep, PipelineRL) or recomputes it with "
    "the new weights (recompute, AReaL)."
  ),
  # loss
  "loss.surrogate": (
    "Policy-gradient surrogate: ppo (clipped), cispo, gspo (sequence "
    "ratio), reinforce, ..."
  ),
  "loss.correction": (
    "Off-policy correction between behaviour (actor) and proximal policy: "
    "naive, ignore_behavior, decoupled, tis, acr (QuRL), mis, seq_tis, "
    "seq_mis, geo_rs."
  ),
  "loss.eps_low": "Lower clip: the ratio is clipped below at 1 - eps_low.",
  "loss.eps_high": "Upper clip: the ratio is clipped above at 1 + eps_high.",
  "loss.dual_clip": "Dual-clip c (> 1) for negative advantages; unset = off.",
  "loss.tis_cap": (
    "Truncation C of the behaviour importance weight (tis, acr, mis and "
    "the sequence-level corrections)."
  ),
  "loss.aggregation": (
    "How token losses become one number: token-mean, seq-mean-token-sum, "
    "seq-mean-token-mean, ..."
  ),
  "loss.norm_const": (
    "The constant divisor of the constant-normalised aggregation (Dr.GRPO); "
    "unset = the mask size."
  ),
  "loss.veto_threshold": (
    "Sequence-level corrections: drop a sequence with any token ratio "
    "below this; unset = no veto."
  ),
  "loss.positive_nll_coef": (
    "VAPO: weight of the NLL on positive-reward samples; 0 = off."
  ),
  # kl
  "kl.coef": "Weight of KL(π_θ ‖ π_ref) as a loss term; 0 = off.",
  "kl.estimator": "KL estimator of the loss term: k1, k2 or k3.",
  "kl.in_reward_coef": "KL to the reference as a reward penalty; 0 = off.",
  # advantage
  "advantage.estimator": (
    "Advantage estimator: grpo, drgrpo, rloo, reinforce_pp(_baseline), "
    "reinforce, or gae (needs the critic)."
  ),
  "advantage.gamma": "Discount γ of GAE / returns.",
  "advantage.gae_lambda": "GAE λ of the policy's advantages (VC-PPO: the actor's).",
  "advantage.vapo_alpha": (
    "VAPO length-adaptive λ = 1 - 1/(α·length); 0 = the fixed gae_lambda."
  ),
  "advantage.dynamic_sampling": (
    "DAPO: resample groups whose rewards are all equal (zero advantage)."
  ),
  "advantage.max_resample_rounds": "dynamic_sampling: rounds of resampling at most.",
  "advantage.overlong_shaping": "DAPO soft overlong punishment of long responses.",
  "advantage.overlong_max_len": (
    "Its L_max; 0 = rollout.max_new_tokens (a size also turns shaping on)."
  ),
  "advantage.overlong_cache_len": "Its L_cache; 0 = L_max / 5.",
  "advantage.overlong_filter": "Mask truncated responses out of the loss.",
  # critic
  "critic.learning_rate": "The critic's AdamW learning rate (advantage.estimator=gae).",
  "critic.gae_lambda": "λ of the critic's value targets (VC-PPO).",
  "critic.value_clip": "PPO value clipping range.",
  "critic.value_coef": "Weight of the value loss.",
  "critic.pretrain_steps": (
    "VC-PPO: first steps that train the critic alone on Monte-Carlo returns. "
    "Every critic.* field is refused where no critic trains."
  ),
  # update
  "update.ppo_epochs": "Passes over each rollout batch.",
  "update.minibatches": "Optimizer updates per epoch (the batch split in as many).",
  "update.micro_batches": (
    "Gradient accumulation: each minibatch in as many forward/backward "
    "passes (memory, not math)."
  ),
  "update.entropy_coef": "Entropy bonus weight; 0 = off.",
  "update.remat": "Recompute activations in the backward pass (less memory).",
  "update.remat_policy": "update.remat: what is recomputed.",
  "update.logprob_chunk": (
    "Log-probs over chunks of this many positions (vocabulary-wide memory); "
    "0 = all at once."
  ),
  # optim
  "optim.learning_rate": "Policy AdamW learning rate.",
  "optim.steps": (
    "Optimizer updates of the schedule; 0 = run.steps × ppo_epochs × "
    "minibatches."
  ),
  "optim.warmup_steps": "Linear warmup updates from 0.",
  "optim.schedule": "Learning-rate schedule after warmup: constant or cosine.",
  "optim.weight_decay": "AdamW decoupled weight decay.",
  "optim.max_grad_norm": "Global gradient-norm clip; 0 = no clipping.",
  "optim.b1": "Adam β1 (the critic's too).",
  "optim.b2": "Adam β2 (the critic's too).",
  # mesh
  "mesh.data": "Devices on the data axis; -1 = those left over.",
  "mesh.fsdp": "Devices the params are sharded over (FSDP); -1 = those left over.",
  "mesh.tensor": "Tensor-parallel devices; -1 = those left over.",
  # run
  "run.steps": "RL steps to train (a resume trains up to this many in all).",
  "run.seed": "Seed of the model init (tiny), prompts and sampling.",
  "run.run_dir": "The run directory: metrics, checkpoints, plots, export.",
  "run.checkpoint_every": "Checkpoint every this many steps (and at the end).",
  "run.keep_checkpoints": "Checkpoints kept (the newest).",
  "run.resume": "Continue the run in run_dir from its last checkpoint.",
  "run.allow_config_change": (
    "On resume: comma-separated dotted fields or sections allowed to "
    "differ from the checkpoint's config."
  ),
  "run.eval_every": "Held-out evaluation every this many steps; 0 = before/after only.",
  "run.export_hf": "Write an HF export (and a LoRA adapter) at the end.",
  "run.tensorboard": "Write TensorBoard logs next to metrics.jsonl.",
  "run.pipelined": "Alias of --run.async_mode=one_step (true) / off (false).",
  "run.max_staleness": (
    "one_step: rollouts in flight (policy lag in steps); streaming: the "
    "largest lag of any token (the worker admits step j's prompts once "
    "step j-1-max_staleness has trained; 0 = synchronous)."
  ),
  "run.async_mode": (
    "off: rollout then update; one_step: the next rollout overlaps this "
    "step's update (off-policy by max_staleness steps); streaming: a worker "
    "generates ahead and takes each new θ between decode chunks "
    "(rollout.inflight_kv; JAX engine, batching=continuous)."
  ),
}

_NO_VALUE = float("nan")  # fails every rule: its message is what it expects


def allowed(name: str) -> str:
  """What `validation.FIELD_RULES` accepts for `name` ('' without a rule)."""
  rule = validation.FIELD_RULES.get(name)
  if rule is None:
    return ""
  try:
    text = rule(_NO_VALUE)
  except Exception:  # pylint: disable=broad-except
    return ""  # a rule that needs a real value says nothing here
  return text or ""


def flag_help(name: str) -> str:
  """The help of flag `--name`: what it does, then the values it takes."""
  text = FIELD_HELP.get(name, "")
  values = allowed(name)
  if values:
    text = f"{text} Allowed: {values}." if text else f"Allowed: {values}."
  return text


SECTION_HELP: dict[str, str] = {
  "model": "the policy trained, its LoRA and its precision",
  "task": "the prompts (generated task or dataset) and the held-out split",
  "reward": "the training reward: verifier, reward model, VR-CLI, judge",
  "rollout": "the actor: engine, its (quantized) weights, sampling",
  "loss": "the policy loss: surrogate, off-policy correction, clipping",
  "kl": "KL to the reference: a loss term and/or a reward penalty",
  "advantage": "rewards to advantages, dynamic sampling, overlong shaping",
  "critic": "the value model of advantage.estimator=gae",
  "update": "epochs, minibatches, micro-batches, memory knobs",
  "optim": "AdamW and its schedule",
  "mesh": "the device mesh (data, fsdp, tensor)",
  "run": "length, seed, run directory, checkpoints, logging, pipelining",
}


def sections_help() -> str:
  """The sections of the training flags, for `--help`."""
  lines = [
    "Training flags: --SECTION.FIELD=VALUE, e.g. --loss.eps_high=0.28",
    "(--helpfull gives each one's meaning, default and allowed values).",
    "  --algorithm: "
    + FIELD_HELP["algorithm"].split(":")[0].lower()
    + ", "
    + ", ".join(sections.ALGORITHMS),
  ]
  for section, cls in sections.SECTIONS.items():
    names = ", ".join(f.name for f in sections.fields(cls))
    lines.append(f"  --{section}.*: {SECTION_HELP.get(section, '')}")
    lines += textwrap.wrap(
      names, 78, initial_indent="      ", subsequent_indent="      "
    )
  return "\n".join(lines)
