"""Models from the ecosystem's libraries, built from configs with random weights (no downloads).

Takes a size preset; gives `BenchModel`s for Hugging Face `transformers` GPT-2, BERT and a
Llama-style decoder, `torchvision` ResNet-50 and `timm` ViT-B/16. Each names the package it
needs in `requires`; when that package is missing the runner skips the model and prints why, so
this module imports none of them at import time. The Hugging Face models are wrapped to take
token ids and return one tensor (logits or hidden states) with the KV cache off, which is how
they are benchmarked in training and prefill; dropout is 0 so training steps are deterministic.
"""

from __future__ import annotations

import torch
from torch import nn

from .common import BenchModel, pick, randn, token_ids


class TensorOutput(nn.Module):
    """Calls a Hugging Face model on `input_ids` and returns one field of its output."""

    def __init__(self, model: nn.Module, field: str):
        super().__init__()
        self.model = model
        self.field = field

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids), self.field)


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()


# (layers, width, heads, vocab, batch, seq) per preset, shared by the three HF models.
def _hf_dims(size: str, large: tuple) -> tuple[int, int, int, int, int, int]:
    return pick(size, (1, 32, 2, 128, 2, 16), (2, 256, 4, 2048, 4, 128), large)


_GPT2_LARGE = (12, 768, 12, 50257, 8, 512)  # GPT-2 small
_BERT_LARGE = (12, 768, 12, 30522, 16, 256)  # BERT-base at issue 6's 16 × 256 (8 × 512 before)
_LLAMA_LARGE = (12, 1024, 16, 32000, 8, 512)  # a ~250M-parameter Llama-style decoder


def _gpt2_model(size: str) -> nn.Module:
    _quiet_transformers()
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, width, heads, vocab, _, seq = _hf_dims(size, _GPT2_LARGE)
    cfg = GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        vocab_size=vocab,
        n_positions=max(seq, 16),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return TensorOutput(GPT2LMHeadModel(cfg), "logits")


def _bert_model(size: str) -> nn.Module:
    _quiet_transformers()
    from transformers import BertConfig, BertModel

    layers, width, heads, vocab, _, seq = _hf_dims(size, _BERT_LARGE)
    cfg = BertConfig(
        num_hidden_layers=layers,
        hidden_size=width,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        vocab_size=vocab,
        max_position_embeddings=max(seq, 16),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    return TensorOutput(BertModel(cfg, add_pooling_layer=False), "last_hidden_state")


def _llama_model(size: str) -> nn.Module:
    _quiet_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, width, heads, vocab, _, seq = _hf_dims(size, _LLAMA_LARGE)
    cfg = LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=width,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        intermediate_size=(width * 8 // 3 + 63) // 64 * 64,
        vocab_size=vocab,
        max_position_embeddings=max(seq, 16),
        attention_dropout=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return TensorOutput(LlamaForCausalLM(cfg), "logits")


def _token_inputs(large: tuple):
    def make(size: str, gen: torch.Generator) -> tuple:
        _, _, _, vocab, batch, seq = _hf_dims(size, large)
        return (token_ids(gen, vocab, batch, seq),)

    return make


def _image_dims(size: str) -> tuple[int, int]:
    """(batch, image side)"""
    return pick(size, (1, 32), (2, 224), (32, 224))  # large: the batch issue 6 names


def _image_inputs(size: str, gen: torch.Generator) -> tuple:
    batch, side = _image_dims(size)
    return (randn(gen, batch, 3, side, side),)


def _channels_last_inputs(size: str, gen: torch.Generator) -> tuple:
    return tuple(x.contiguous(memory_format=torch.channels_last) for x in _image_inputs(size, gen))


def _resnet50_model(size: str) -> nn.Module:
    """ResNet-50 in channels-last memory format (as the images are): cuDNN's fast layout."""
    import torchvision

    model = torchvision.models.resnet50(weights=None, num_classes=pick(size, 10, 1000, 1000))
    return model.to(memory_format=torch.channels_last)


def _vit_model(size: str) -> nn.Module:
    import timm

    if size == "tiny":  # ViT-B/16's code path at a test-sized width and depth
        return timm.create_model(
            "vit_base_patch16_224",
            pretrained=False,
            img_size=32,
            depth=1,
            embed_dim=64,
            num_heads=2,
            num_classes=10,
        )
    return timm.create_model("vit_base_patch16_224", pretrained=False)


_HF = ("transformers",)

MODELS = {
    m.name: m
    for m in (
        BenchModel(
            "hf_gpt2",
            "transformers GPT-2 LM (random weights), ids -> logits",
            _gpt2_model,
            _token_inputs(_GPT2_LARGE),
            requires=_HF,
        ),
        BenchModel(
            "hf_bert",
            "transformers BERT encoder (random weights), ids -> hidden states",
            _bert_model,
            _token_inputs(_BERT_LARGE),
            requires=_HF,
        ),
        BenchModel(
            "hf_llama",
            "transformers Llama-style decoder with GQA (random weights)",
            _llama_model,
            _token_inputs(_LLAMA_LARGE),
            requires=_HF,
        ),
        BenchModel(
            "tv_resnet50",
            "torchvision ResNet-50, channels-last (random weights)",
            _resnet50_model,
            _channels_last_inputs,
            requires=("torchvision",),
        ),
        BenchModel(
            "timm_vit_b16",
            "timm ViT-B/16 (random weights)",
            _vit_model,
            _image_inputs,
            requires=("timm", "torchvision"),
        ),
    )
}
