"""Tiny random-init checkpoints of every covered model type, for tests and benchmarks (no download).

``checkpoint(folder, model_type, task)`` saves the task's class of the model
type (the one ``from_pretrained_dir`` loads) with a config of a few thousand
parameters, and its feature extractor, as ``save_pretrained`` writes them.
transformers is imported only when a checkpoint is made.
"""
from __future__ import annotations

import json
import os
from typing import Optional

from . import families

_W2V = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
            conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
            vocab_size=12, num_labels=3, classifier_proj_size=16, tdnn_dim=(16, 16, 16), tdnn_kernel=(3, 3, 1),
            tdnn_dilation=(1, 2, 1), xvector_output_dim=8)
_LAYER = dict(_W2V, feat_extract_norm="layer")
_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_mel_bins=20,
                subsampling_conv_channels=8)
_SEQ2SEQ = dict(d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=64, decoder_ffn_dim=64, max_target_positions=20)
VOCAB = ["<pad>", "<s>", "</s>", "<unk>", "|", "a", "b", "c", "d", "e", "f", "g"]

# model type -> (config class, its arguments, feature extractor class, its arguments)
TINY = {
    "wav2vec2": ("Wav2Vec2Config", dict(_LAYER, do_stable_layer_norm=True), "Wav2Vec2FeatureExtractor",
                 dict(return_attention_mask=True)),
    "hubert": ("HubertConfig", _LAYER, "Wav2Vec2FeatureExtractor", dict(return_attention_mask=True)),
    "wavlm": ("WavLMConfig", dict(_LAYER, num_buckets=16, max_bucket_distance=20), "Wav2Vec2FeatureExtractor",
              dict(return_attention_mask=True)),
    "data2vec-audio": ("Data2VecAudioConfig", _W2V, "Wav2Vec2FeatureExtractor", dict(return_attention_mask=True)),
    "unispeech": ("UniSpeechConfig", _LAYER, "Wav2Vec2FeatureExtractor", dict(return_attention_mask=True)),
    "unispeech-sat": ("UniSpeechSatConfig", _LAYER, "Wav2Vec2FeatureExtractor", dict(return_attention_mask=True)),
    "wav2vec2-conformer": ("Wav2Vec2ConformerConfig", dict(_LAYER, conv_depthwise_kernel_size=7,
                                                           position_embeddings_type="relative"),
                           "Wav2Vec2FeatureExtractor", dict(return_attention_mask=True)),
    "sew": ("SEWConfig", _W2V, "Wav2Vec2FeatureExtractor", dict(return_attention_mask=True)),
    "sew-d": ("SEWDConfig", dict(_W2V, position_buckets=16, max_position_embeddings=64), "Wav2Vec2FeatureExtractor",
              dict(return_attention_mask=True)),
    "wav2vec2-bert": ("Wav2Vec2BertConfig", dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, output_hidden_size=32,
        feature_projection_input_dim=40, conv_depthwise_kernel_size=7, vocab_size=12, num_labels=3,
        classifier_proj_size=16, tdnn_dim=(16, 16, 16), tdnn_kernel=(3, 3, 1), tdnn_dilation=(1, 2, 1),
        xvector_output_dim=8), "SeamlessM4TFeatureExtractor", dict(feature_size=20, num_mel_bins=20, stride=2)),
    "parakeet_ctc": ("ParakeetCTCConfig", dict(vocab_size=12, encoder_config=dict(
        _ENCODER, conv_kernel_size=9, subsampling_factor=4)), "ParakeetFeatureExtractor", dict(feature_size=20)),
    "lasr_ctc": ("LasrCTCConfig", dict(vocab_size=12, encoder_config=dict(_ENCODER, conv_kernel_size=32)),
                 "LasrFeatureExtractor", dict(feature_size=20)),
    "speech_to_text": ("Speech2TextConfig", dict(_SEQ2SEQ, vocab_size=20, input_feat_per_channel=20,
                                                 conv_channels=16, max_source_positions=200),
                       "Speech2TextFeatureExtractor", dict(feature_size=20, num_mel_bins=20)),
    "whisper": ("WhisperConfig", dict(_SEQ2SEQ, vocab_size=60, num_mel_bins=20, max_source_positions=50,
                                      decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      num_labels=3, classifier_proj_size=16),
                "WhisperFeatureExtractor", dict(feature_size=20, chunk_length=1)),
    "audio-spectrogram-transformer": ("ASTConfig", dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_length=64,
        num_mel_bins=32, patch_size=8, frequency_stride=8, time_stride=8, num_labels=3),
        "ASTFeatureExtractor", dict(num_mel_bins=32, max_length=64)),
}
# the x-vector head's default init gives embeddings of about 1e-6: a wider one makes them worth comparing
TASK_CONFIG = {"xvector": dict(initializer_range=0.5)}


def checkpoint(folder, model_type: str, task: str, *, config: Optional[dict] = None,
               extractor: Optional[dict] = None, save_as: Optional[str] = None, tokenizer: bool = False,
               seed: int = 0) -> str:
    """Save a tiny ``model_type`` checkpoint for ``task`` in ``folder``; the folder.

    ``config``/``extractor``: arguments over the tiny ones. ``save_as``: a
    transformers class name to save instead of the task's (a checkpoint
    without the task's head). ``tokenizer``: a CTC character vocabulary too.
    """
    import torch
    import transformers
    config_cls, config_args, extractor_cls, extractor_args = TINY[model_type]
    made = getattr(transformers, config_cls)(**{**config_args, **TASK_CONFIG.get(task, {}), **(config or {})})
    name = save_as or families.model_class_name(families.task_named(task), model_type)
    torch.manual_seed(seed)
    folder = os.fspath(folder)
    getattr(transformers, name)(made).save_pretrained(folder)
    getattr(transformers, extractor_cls)(**{**extractor_args, **(extractor or {})}).save_pretrained(folder)
    if tokenizer:
        vocab = os.path.join(folder, "vocab.json")
        with open(vocab, "w", encoding="utf-8") as fh:
            json.dump({token: i for i, token in enumerate(VOCAB)}, fh)
        transformers.Wav2Vec2CTCTokenizer(vocab).save_pretrained(folder)
    return folder
