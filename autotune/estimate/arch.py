"""A model's ``config.json`` (as a dict) -> the architecture summary the estimator needs.  [pure]

Parameter counts are exact for the families listed in ``FAMILIES`` (checked against
transformers meta-device builds in tests/test_estimate.py): every weight, bias and norm is counted,
and a tied ``lm_head`` is counted once. Other decoder-only models written in the Llama style
(``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``,
``vocab_size``) are summarised as Llama-like and flagged in ``Arch.notes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import SpecError

__all__ = [
    "Arch",
    "FAMILIES",
    "arch_from_config",
    "lora_modules",
    "lora_param_count",
    "lora_targets_problem",
    "peft_lora_modules",
    "peft_lora_param_count",
]

# model_type -> (default tie_word_embeddings, norms per layer, q/k/v bias, q/k norm)
FAMILIES: dict[str, tuple[bool, int, bool, bool]] = {
    "llama": (False, 2, False, False),
    "mistral": (False, 2, False, False),
    "mixtral": (False, 2, False, False),
    "qwen2": (False, 2, True, False),
    "qwen3": (False, 2, False, True),
    "gemma": (True, 2, False, False),
    "gemma2": (True, 4, False, False),
    "gemma3_text": (True, 4, False, True),
    "phi3": (False, 2, False, False),
    "granite": (True, 2, False, False),
    "olmo2": (False, 2, False, False),
    "gpt2": (True, 2, True, False),
}

# Module names peft matches, per family: our canonical names -> the module that holds them.
_FUSED_NAMES: dict[str, dict[str, str]] = {
    "phi3": {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
             "up_proj": "gate_up_proj"},
    "gpt2": {"q_proj": "c_attn", "k_proj": "c_attn", "v_proj": "c_attn", "o_proj": "attn.c_proj",
             "gate_proj": "c_fc", "up_proj": "c_fc", "down_proj": "mlp.c_proj"},
}  # fmt: skip


@dataclass(frozen=True)
class Arch:
    """What the memory and speed models need to know about a decoder-only transformer.

    ``linears`` maps each per-layer linear module (as peft names it) to ``(in, out)`` features;
    ``params_layer_linear`` is the per-layer weight count in those linears (what QLoRA quantizes).
    ``params_embedding`` counts the input token embedding plus learned position embeddings;
    ``params_lm_head`` is 0 when the output projection is tied to the input embedding.
    """

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int | None
    tied: bool
    gated_mlp: bool
    norms_per_layer: int
    params_total: int
    params_embedding: int
    params_lm_head: int
    params_per_layer: int
    params_layer_linear: int
    params_final_norm: int
    num_experts: int = 1
    experts_per_token: int = 1
    act_saved: int = 1  # f-sized tensors the MLP activation saves (input included): 1 fused, 4 gelu_new
    resid_dropout: float = 0.0
    attn_dropout: float = 0.0
    logit_softcap: bool = False
    learned_positions: bool = False  # a learned position table (GPT-2) ends at max_positions; RoPE extends
    linears: tuple[tuple[str, int, int], ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def q_width(self) -> int:
        """heads x head_dim (differs from hidden for Gemma)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def params_linear_total(self) -> int:
        """Weights in the transformer blocks' linears (QLoRA quantizes these, not embeddings)."""
        return self.params_layer_linear * self.layers

    @property
    def params_matmul(self) -> int:
        """Parameters that take part in a matmul per token: all but the embedding look-up, with the
        (tied or not) output projection counted, and only the active experts of an MoE."""
        inactive = 0
        if self.num_experts > 1:
            expert = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
            inactive = (self.num_experts - self.experts_per_token) * expert * self.layers
        head = self.vocab * self.hidden
        return self.params_total - self.params_embedding - self.params_lm_head + head - inactive

    @property
    def largest_param(self) -> int:
        """Elements of the largest single parameter tensor (the embedding, for LLMs)."""
        return max(self.vocab * self.hidden, max((i * o for _, i, o in self.linears), default=0))

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        d["linears"] = [list(x) for x in self.linears]
        d["notes"] = list(self.notes)
        return d


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return default


def arch_from_config(config: Mapping[str, Any]) -> Arch:
    """Summarise a ``config.json`` dict. Raises SpecError listing every missing or bad field."""
    if not isinstance(config, Mapping):
        raise SpecError(
            f"model config must be a mapping (the parsed config.json), got {type(config).__name__}"
        )
    cfg: Mapping[str, Any] = config
    if "hidden_size" not in cfg and "n_embd" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        cfg = cfg["text_config"]  # multimodal wrappers: the language model is what trains
    mt = str(cfg.get("model_type", "")).lower()
    if mt in ("gpt2",) or ("n_embd" in cfg and "n_layer" in cfg):
        return _gpt2(cfg)
    return _llama_like(cfg, mt)


def _require_ints(cfg: Mapping[str, Any], spec: dict[str, tuple[str, ...]], mt: str) -> dict[str, int]:
    out: dict[str, int] = {}
    problems: list[str] = []
    for name, keys in spec.items():
        v = _get(cfg, *keys)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            problems.append(f"config field {keys[0]} must be a positive integer, got {v!r}")
        else:
            out[name] = v
    if problems:
        raise SpecError([f"cannot summarise model_type {mt or '?'!r}: {p}" for p in problems])
    return out


def _gpt2(cfg: Mapping[str, Any]) -> Arch:
    v = _require_ints(
        cfg,
        {"hidden": ("n_embd",), "layers": ("n_layer",), "heads": ("n_head",), "vocab": ("vocab_size",),
         "positions": ("n_positions", "n_ctx")},
        "gpt2",
    )  # fmt: skip
    h, L, a, V, P = v["hidden"], v["layers"], v["heads"], v["vocab"], v["positions"]
    f = int(cfg.get("n_inner") or 4 * h)
    linears = (("c_attn", h, 3 * h), ("attn.c_proj", h, h), ("c_fc", h, f), ("mlp.c_proj", f, h))
    linear_w = sum(i * o for _, i, o in linears)
    linear_b = 3 * h + h + f + h
    per_layer = linear_w + linear_b + 2 * 2 * h  # two LayerNorms, weight + bias
    emb = V * h + P * h
    final = 2 * h
    tied = bool(cfg.get("tie_word_embeddings", True))
    head = 0 if tied else V * h
    return Arch(
        model_type="gpt2", hidden=h, layers=L, heads=a, kv_heads=a, head_dim=h // a, intermediate=f,
        vocab=V, max_positions=P, tied=tied, gated_mlp=False, norms_per_layer=2,
        params_total=emb + L * per_layer + final + head, params_embedding=emb, params_lm_head=head,
        params_per_layer=per_layer, params_layer_linear=linear_w, params_final_norm=final,
        linears=linears, act_saved=_act_saved(cfg.get("activation_function", "gelu_new")),
        resid_dropout=float(cfg.get("resid_pdrop", 0.1) or 0.0), attn_dropout=float(cfg.get("attn_pdrop", 0.1) or 0.0),
        learned_positions=True,
    )  # fmt: skip


def _llama_like(cfg: Mapping[str, Any], mt: str) -> Arch:
    v = _require_ints(
        cfg,
        {"hidden": ("hidden_size",), "layers": ("num_hidden_layers",), "heads": ("num_attention_heads",),
         "intermediate": ("intermediate_size",), "vocab": ("vocab_size",)},
        mt,
    )  # fmt: skip
    h, L, a, f, V = v["hidden"], v["layers"], v["heads"], v["intermediate"], v["vocab"]
    notes: list[str] = []
    known = mt in FAMILIES
    if not known:
        notes.append(f"model_type {mt or '?'!r} summarised as Llama-like; parameter count not verified")
    tie_default, norms, qkv_bias, qk_norm = FAMILIES.get(mt, FAMILIES["llama"])
    kv = int(_get(cfg, "num_key_value_heads", default=a))
    hd = int(_get(cfg, "head_dim", default=h // a))
    tied = bool(cfg.get("tie_word_embeddings", tie_default))
    attn_bias = bool(cfg.get("attention_bias", False)) or qkv_bias
    mlp_bias = bool(cfg.get("mlp_bias", False))
    qw, kvw = a * hd, kv * hd
    if mt == "phi3":
        linears: tuple[tuple[str, int, int], ...] = (
            ("qkv_proj", h, qw + 2 * kvw), ("o_proj", qw, h), ("gate_up_proj", h, 2 * f), ("down_proj", f, h),
        )  # fmt: skip
    else:
        linears = (("q_proj", h, qw), ("k_proj", h, kvw), ("v_proj", h, kvw), ("o_proj", qw, h))
    num_experts = int(_get(cfg, "num_local_experts", "num_experts", default=1))
    top_k = int(_get(cfg, "num_experts_per_tok", default=1)) if num_experts > 1 else 1
    mlp_linears = (("gate_proj", h, f), ("up_proj", h, f), ("down_proj", f, h))
    if mt != "phi3":
        if num_experts > 1:
            if mt != "mixtral":
                raise SpecError(f"mixture-of-experts model_type {mt!r} is not supported by the estimator yet")
            notes.append(f"MoE: {num_experts} experts, {top_k} active per token")
        else:
            linears = linears + mlp_linears
    attn_linear = qw * h + 2 * kvw * h + qw * h
    mlp_linear = 3 * h * f * num_experts
    linear_w = attn_linear + mlp_linear
    bias = 0
    if attn_bias:
        bias += qw + 2 * kvw
        if mt != "qwen2":  # Qwen2 has q/k/v biases only; attention_bias=True on Llama also biases o_proj
            bias += h
    if mlp_bias:
        bias += (2 * f + h) * num_experts
    router = h * num_experts if num_experts > 1 else 0
    per_layer = linear_w + bias + router + norms * h + (2 * hd if qk_norm else 0)
    emb = V * h
    head = 0 if tied else V * h
    final = h
    return Arch(
        model_type=mt or "llama", hidden=h, layers=L, heads=a, kv_heads=kv, head_dim=hd, intermediate=f,
        vocab=V, max_positions=_get(cfg, "max_position_embeddings"), tied=tied, gated_mlp=True,
        norms_per_layer=norms, params_total=emb + L * per_layer + final + head, params_embedding=emb,
        params_lm_head=head, params_per_layer=per_layer, params_layer_linear=linear_w + router,
        params_final_norm=final, num_experts=num_experts, experts_per_token=top_k, linears=linears,
        act_saved=_act_saved(_get(cfg, "hidden_activation", "hidden_act", default="silu")),
        resid_dropout=float(_get(cfg, "resid_pdrop", "hidden_dropout", default=0.0) or 0.0),
        attn_dropout=float(_get(cfg, "attention_dropout", default=0.0) or 0.0),
        logit_softcap=bool(cfg.get("final_logit_softcapping")), notes=tuple(notes),
    )  # fmt: skip


def _act_saved(name: Any) -> int:
    """gelu_new is written as Python ops in transformers (saves 4 f-sized tensors); others 1."""
    return 4 if str(name) in ("gelu_new", "gelu_fast", "gelu_python") else 1


def lora_modules(arch: Arch, targets: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The per-layer linears (``arch.linears`` names) that LoRA ``targets`` adapt.

    ``targets`` are peft module names (``q_proj``...) or ``"all-linear"``. Canonical Llama names are
    mapped to fused modules where a family fuses them (Phi-3 ``qkv_proj``, GPT-2 ``c_attn``); a fused
    module is adapted once. Names that match nothing are ignored (peft would refuse them).
    """
    names = {n for n, _, _ in arch.linears}
    if "all-linear" in targets:
        return frozenset(names)
    fused = _FUSED_NAMES.get(arch.model_type, {})
    chosen: set[str] = set()
    for t in targets:
        if t in names:
            chosen.add(t)
        elif fused.get(t) in names:
            chosen.add(fused[t])
        elif arch.model_type == "gpt2" and t == "c_proj":
            chosen.update({"attn.c_proj", "mlp.c_proj"})
    return frozenset(chosen)


def lora_param_count(arch: Arch, r: int, targets: tuple[str, ...] | list[str]) -> int:
    """Trainable LoRA parameters: r·(d_in + d_out) per adapted per-layer linear, times layers."""
    chosen = lora_modules(arch, targets)
    return sum(r * (i + o) for n, i, o in arch.linears if n in chosen) * arch.layers


def peft_lora_modules(arch: Arch, targets: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The per-layer linears the probe's peft config really adapts for ``targets``.

    The probe (``autotune.formats.model.lora_target_modules``) passes peft the requested names
    that are leaf module names of the model, or ``"all-linear"`` when none is; peft then matches by
    leaf name. So GPT-2 (``c_attn``/``c_proj``/``c_fc``) gets every linear for the Llama-style default,
    and Phi-3 gets only ``o_proj`` for ``q_proj,k_proj,v_proj,o_proj``, unlike ``lora_modules``'
    canonical mapping.
    """
    from autotune.formats.model import lora_target_modules

    leaf = {n: n.rsplit(".", 1)[-1] for n, _, _ in arch.linears}
    chosen = lora_target_modules(set(leaf.values()), tuple(targets))
    if chosen == "all-linear":
        return frozenset(leaf)
    return frozenset(n for n, lf in leaf.items() if lf in chosen)


def lora_targets_problem(arch: Arch, targets: tuple[str, ...] | list[str], *, named: str = "--lora-targets") -> str | None:
    """One line when module names the user listed match no linear of the model, else None.

    The probe adapts every linear when none of the requested names is a module of the model (the default
    ``attn`` on GPT-2, whose projections have other names: ``lora_target_modules``); for names the user typed
    that would plan and measure something else than asked, so it is bad input. ``attn`` and ``all-linear``
    are never a problem. ``named``: where the names came from, as the line says it (the option, or a file)."""
    from autotune.formats.model import lora_target_modules
    from autotune.spec.probe_request import ATTN_TARGETS

    if tuple(targets) in (ATTN_TARGETS, ("all-linear",)) or not arch.linears:
        return None
    leaves = {n.rsplit(".", 1)[-1] for n, _, _ in arch.linears}
    if lora_target_modules(leaves, tuple(targets)) != "all-linear":  # the probe's rule: some name matched
        return None
    return (f"{named} {','.join(targets)} match no linear layer of this {arch.model_type} model (its "
            f"linears: {', '.join(sorted(leaves))}): name some of those, or give attn or all-linear")


def peft_lora_param_count(arch: Arch, r: int, targets: tuple[str, ...] | list[str]) -> int:
    """Trainable LoRA parameters of the probe's peft config (see ``peft_lora_modules``)."""
    chosen = peft_lora_modules(arch, targets)
    return sum(r * (i + o) for n, i, o in arch.linears if n in chosen) * arch.layers
