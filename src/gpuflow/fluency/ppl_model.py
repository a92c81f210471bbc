"""Load a local Hugging Face causal LM and its tokenizer, downloading nothing; pad its LM head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpuflow.errors import ConfigError, GpuflowError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The LM head's vocabulary is padded to a multiple of 64 for half-precision GEMMs.
MULTIPLE = 64
HALF = (torch.float16, torch.bfloat16)


def load_config(reference: str, trust_remote_code: bool = False) -> Any:
    """The model config of `reference`; a clear error if it is missing or not a causal LM."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig

    try:
        config = AutoConfig.from_pretrained(
            reference, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as error:
        raise GpuflowError(
            f"model {reference!r}: no readable Hugging Face model config there "
            f"(expected a folder saved with save_pretrained or a cached model id): {error}"
        ) from error
    remote_causal = "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING and not remote_causal:
        raise GpuflowError(
            f"model {reference!r} is a {type(config).__name__} ({config.model_type!r}), "
            "not a causal language model (expected e.g. GPT-2, Llama, Mistral)"
        )
    return config


def model_context(config: Any, reference: str) -> int:
    """The longest sequence the model takes (n_positions or max_position_embeddings)."""
    for name in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 1:
            return value
    raise GpuflowError(
        f"model {reference!r}: its config gives no context length "
        "(expected n_positions or max_position_embeddings)"
    )


def model_identity(reference: str) -> list[Any]:
    """A model folder's files (name, size, modification time), or the model id as given."""
    folder = Path(reference)
    if not folder.is_dir():
        return [reference]
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return [reference, *[[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]]


def load_tokenizer(reference: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer saved with the model; a clear error naming the folder if there is none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            reference, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, TypeError) as error:
        raise GpuflowError(
            f"model {reference!r}: no usable tokenizer there "
            f"(save one with tokenizer.save_pretrained into the model folder): {error}"
        ) from error


def start_token_id(tokenizer: Any, reference: str) -> int:
    """The id put before every text: the tokenizer's BOS token, else its EOS token."""
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    raise GpuflowError(
        f"model {reference!r}: the tokenizer has neither a BOS nor an EOS token "
        "(one is needed to predict the first token of each text)"
    )


def load_causal_lm(
    reference: str,
    dtype: str,
    device: torch.device,
    trust_remote_code: bool = False,
    device_map: str | dict[str, str] | None = None,
) -> torch.nn.Module:
    """The causal LM in `dtype`, in eval mode: on `device`, or spread by accelerate's device map."""
    from transformers import AutoModelForCausalLM

    placed = {"device_map": device_map} if device_map is not None else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            reference,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
            dtype=DTYPES[dtype],
            **placed,
        )
    except (OSError, ValueError) as error:
        raise GpuflowError(
            f"model {reference!r} could not be loaded as a causal language model: {error}"
        ) from error
    return (model if placed else model.to(device)).eval()


def check_dtype(dtype: str, devices: list[torch.device]) -> None:
    """Half precision runs on GPUs only: refuse it for CPU workers."""
    if dtype not in DTYPES:
        raise ConfigError("fluency.perplexity.dtype", f"unknown dtype {dtype!r}", str(list(DTYPES)))
    if dtype != "float32" and any(d.type == "cpu" for d in devices):
        raise ConfigError(
            "fluency.perplexity.dtype",
            f"{dtype} was asked for but the job runs on the CPU (no GPU visible)",
            "float32 on CPU; float16/bfloat16 only with a GPU",
        )


def prepare_for_scoring(model: torch.nn.Module, attn_implementation: str) -> torch.nn.Module:
    """The loaded model made fast to score with, computing the same function."""
    from transformers.activations import GELUTanh, NewGELUActivation

    from gpuflow.settings.blocks import family_schema

    perplexity = family_schema("fluency")["properties"]["perplexity"]
    choices = list(perplexity["properties"]["attn_implementation"]["enum"])  # the schema's values
    if attn_implementation not in choices:
        raise ConfigError(
            "fluency.perplexity.attn_implementation",
            f"unknown attention implementation {attn_implementation!r}",
            str(choices),
        )
    if attn_implementation != "auto":
        try:
            model.set_attn_implementation(attn_implementation)
        except (ImportError, ValueError) as error:
            raise ConfigError(
                "fluency.perplexity.attn_implementation",
                f"{attn_implementation} cannot run this model here: {error}",
                "auto, sdpa or eager",
            ) from error
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is NewGELUActivation:
                setattr(parent, name, GELUTanh())
    return pad_lm_head(model)


class PaddedHead(nn.Module):
    """`head`'s linear map padded to a multiple of 64 rows; returns the first `vocab` logits."""

    def __init__(self, head: nn.Linear):
        super().__init__()
        self.vocab = head.out_features
        padded = padded_vocab(self.vocab) - self.vocab
        with torch.no_grad():
            self.weight = nn.Parameter(F.pad(head.weight, (0, 0, 0, padded)), requires_grad=False)
            self.bias = (
                None
                if head.bias is None
                else nn.Parameter(F.pad(head.bias, (0, padded)), requires_grad=False)
            )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden.to(self.weight.device), self.weight, self.bias)
        return logits[..., : self.vocab]


def padded_vocab(vocab: int) -> int:
    """`vocab` rounded up to a multiple of 64."""
    return vocab + -vocab % MULTIPLE


def pads(head: nn.Module | None, dtype: torch.dtype) -> bool:
    """Whether scoring pads `head` in `dtype`: half precision, vocabulary not a multiple of 64."""
    return type(head) is nn.Linear and dtype in HALF and head.out_features % MULTIPLE != 0


def padded_head_bytes(head: nn.Module | None, dtype: torch.dtype) -> int:
    """Bytes of the PaddedHead's own weight copy of `head` in `dtype` (0 where it is not padded)."""
    if not pads(head, dtype):
        return 0
    return padded_vocab(head.out_features) * head.in_features * dtype.itemsize


def pad_lm_head(model: nn.Module) -> nn.Module:
    """`model` with its output embeddings replaced by a PaddedHead where `pads` says so."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)  # none where the model has no output embeddings
    if weight is not None and weight.device.type != "meta" and pads(head, weight.dtype):
        model.set_output_embeddings(PaddedHead(head))
    return model
