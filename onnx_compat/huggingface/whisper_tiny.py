"""Tiny Whisper checkpoint folders written the way transformers writes a fine-tune (no download), for the tests
and the docs' example of ``export_whisper``.

``whisper_checkpoint(folder, ...)`` saves a random ``WhisperForConditionalGeneration`` with its tokenizer
(``WhisperTokenizer``: a byte-level vocabulary of a few dozen pieces, then the special tokens in Whisper's order:
``<|endoftext|>``, ``<|startoftranscript|>``, the languages, ``<|translate|>``, ``<|transcribe|>``,
``<|startoflm|>``, ``<|startofprev|>``, ``<|nospeech|>``, ``<|notimestamps|>``, a few timestamps) and its
generation config. ``vocab_size`` may exceed the tokenizer (timestamp ids no tokenizer file names, as in older
checkpoints). A random model's greedy decode repeats one token or ends at once; the special tokens' embeddings
(the logits are tied to them) are shrunk so the decodes run to several distinct ordinary pieces, and ``eot_bias``
is about ``<|endoftext|>``'s logit (the final norm's bias
points along its embedding), so some decodes stop early.
"""
from __future__ import annotations

import os
import string
from typing import Sequence

LANGUAGES = ("en", "de", "fa")
_LETTERS = list(string.ascii_lowercase)
# byte-level spellings: "Ġ" is the space byte, "Ã©" the two bytes of "é"
PIECES = tuple(["Ġ", ".", ",", "Ã©"] + _LETTERS + ["Ġ" + c for c in _LETTERS] + ["Ġthe", "ing", "er", "Ġand"])


def special_tokens(languages: Sequence[str], timestamps: int) -> list:
    return (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{code}|>" for code in languages] +
            ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
             "<|notimestamps|>"] + [f"<|{0.02 * k:.2f}|>" for k in range(timestamps)])


def whisper_checkpoint(folder, *, multilingual: bool = True, languages: Sequence[str] = LANGUAGES,
                       n_mels: int = 80, layers: tuple = (2, 2), d_model: int = 32, extra_ids: int = 4,
                       timestamps: int = 4, eot_bias: float = 1.7, audio_ctx: int = 1500, drop: Sequence[str] = (),
                       seed: int = 0) -> str:
    """Save the checkpoint in ``folder``; the folder. ``layers``: (encoder, decoder) layer counts;
    ``extra_ids``: logit ids past the tokenizer's last (unnamed timestamps; negative: the tokenizer names ids the
    logits lack); ``audio_ctx``: the encoder's positions (``max_source_positions``); ``drop``: special tokens
    the tokenizer leaves out."""
    import torch
    import transformers
    from tokenizers import AddedToken
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    specials = [t for t in special_tokens(languages, timestamps) if t not in drop]
    vocab = {p: i for i, p in enumerate(PIECES)}
    tokenizer = transformers.WhisperTokenizer(vocab=dict(vocab), merges=[])
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in specials], special_tokens=True)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    config = transformers.WhisperConfig(
        vocab_size=len(tokenizer) + extra_ids, num_mel_bins=n_mels, d_model=d_model, encoder_layers=layers[0],
        decoder_layers=layers[1], encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model, max_source_positions=audio_ctx, max_target_positions=448, init_std=0.2,
        decoder_start_token_id=sot, eos_token_id=eot, pad_token_id=eot, bos_token_id=eot,
        begin_suppress_tokens=None, suppress_tokens=None)
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    quiet = [i for t, i in ids.items() if t != "<|endoftext|>"] + list(range(len(tokenizer), config.vocab_size))
    _shape_logits(model, [i for i in quiet if i < config.vocab_size], eot, eot_bias)
    gen = model.generation_config
    gen.is_multilingual = multilingual
    gen.lang_to_id = {f"<|{c}|>": ids[f"<|{c}|>"] for c in languages} if multilingual else None
    gen.task_to_id = {"translate": ids["<|translate|>"], "transcribe": ids["<|transcribe|>"]}
    gen.no_timestamps_token_id = ids.get("<|notimestamps|>")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformers.WhisperFeatureExtractor(feature_size=n_mels).save_pretrained(folder)
    return folder


def _shape_logits(model, quiet: Sequence[int], eot: int, eot_bias: float) -> None:
    """Shrink the embeddings (tied to the logits) of the special ids, and scale ``<|endoftext|>``'s."""
    import torch
    with torch.no_grad():
        weight = model.model.decoder.embed_tokens.weight
        weight[list(quiet)] *= 0.05
        norm = model.model.decoder.layer_norm
        direction = torch.nn.functional.normalize(torch.randn(weight.shape[1]), dim=0)
        norm.bias.copy_(direction)  # every position's output leans on this direction ...
        weight[eot] = 0.05 * weight[eot] + eot_bias * direction  # ... so eot's logit is about eot_bias
