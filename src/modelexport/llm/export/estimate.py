"""The host memory and disk a resolved plan will take (llm/job_estimate.py's model of the phases),
and the worker count that fits this machine: both read before any weight is loaded."""
from __future__ import annotations

import dataclasses

from ...quant.precision import get_precision
from ...quant.weight_rounding import get_rounding
from ..job_estimate import GB, JobEstimate, available_memory, config_from_shape, estimate_job
from ..layerwise_rounding import rounding_bytes
from .memory import plan_parts
from .plan import LlmPlan, embed_head_bits


def estimate(plan: LlmPlan, quantized: bool) -> JobEstimate | None:
    """The plan and the host estimate of a resolved job (None when the source's shape is unknown)."""
    cfg = config_from_shape(plan.facts.shape)
    if cfg is None:
        return None
    prec = get_precision(plan.precision)
    embed_bits, head_bits = embed_head_bits(plan.overrides, prec.weight_bits)
    parts, _ = plan_parts(cfg, plan.variants, plan.max_seq_len, prec.weight_bits, prec.activation_bits, plan.limit_mb,
                          embed_bits, head_bits)
    q = plan.quality
    data_aware = q and (get_rounding(q.rounding).needs_activations or q.max_ppl_ratio)
    return estimate_job(cfg, parts, list(plan.variants), plan.jobs, prec.weight_bits,
                        plan.facts.weights_dtype == "bfloat16", len(plan.socs), quantized=quantized,
                        chunk_bytes=plan.chunk_mb * 2**20,
                        rounding_bytes=(rounding_bytes(plan.facts.shape) or 0) if data_aware else 0,
                        embedder=plan.embedder_precision, mapped=mapped_weights(plan))


def mapped_weights(plan: LlmPlan) -> bool:
    """A bf16 Hugging Face folder: loaded as stored, its weights stay mapped from the files (graphs.load_model)."""
    return plan.facts.format == "hf" and plan.facts.weights_dtype == "bfloat16"


def fitted_estimate(plan: LlmPlan, quantized: bool) -> tuple[JobEstimate | None, LlmPlan, str | None]:
    """(the estimate, the plan with the workers that run, a note when they are fewer): if the default
    worker count does not fit the memory the machine has but one worker does, the job runs with one
    (slower, not refused). A --jobs the user gave is kept (and refused if it does not fit)."""
    est = estimate(plan, quantized)
    if est is None or plan.jobs_given or plan.jobs == 1:
        return est, plan, None
    have = available_memory()
    if have is None or est.peak_bytes <= have:
        return est, plan, None
    default, plan = plan.jobs, dataclasses.replace(plan, jobs=1)
    one = estimate(plan, quantized)
    if one.peak_bytes > have:      # one worker does not fit either: check_machine refuses with what would help
        return one, plan, None
    return one, plan, (f"one worker instead of {default}: the machine has {have / GB:.1f} GB available, "
                       f"{default} workers would need about {est.peak_bytes / GB:.1f} GB")
