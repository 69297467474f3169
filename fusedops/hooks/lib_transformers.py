"""Hooks on Hugging Face transformers: QuickGELU (class and activation tables), RMSNorm family.

- quick_gelu: ``transformers.activations.QuickGELUActivation`` is replaced in the module, in the
  activation tables ``ACT2CLS`` and ``ACT2FN`` (entries ``"quick_gelu"``; model files read
  ``ACT2FN[config.hidden_act]``, and ``ACT2FN`` is a copy of ``ACT2CLS`` made at import, so
  both dicts are patched in place; ``get_activation`` reads ``ACT2FN``) and in the model files
  that import the class by name (BridgeTower).
- rms_norm: the RMSNorm-family classes below (``LlamaRMSNorm``, ``T5LayerNorm``, ...), each
  replaced in its modeling module by a fused subclass of the variant of its math
  (``fusedops/nn/rms_norm_variants.py``).
- swin (defined here; timm's classes are added by ``lib_timm``): Swin / Swinv2 layers and
  attentions (``fusedops/nn/swin_transformers.py``).

Nothing here imports transformers: targets are (module, class) names, patched when the module
is imported (or now, if it is). The lists are static because hooks are enabled before
transformers is imported; ``tests/test_transformers_norm_list.py`` reads the modeling sources and
checks every listed forward against its variant and that every RMSNorm-like class is listed or
excluded (with the reason) below. Classes of other transformers versions that are missing are
skipped silently (the targets are optional); a listed name that holds another class (a model
file's ``T5LayerNorm = FusedRMSNorm``) or whose forward is not its variant's code (another
transformers version) is left unpatched with a warning.
"""

from __future__ import annotations

import ast
import functools
import importlib
from typing import Any

from fusedops.hooks import lib_torch  # noqa: F401  (defines the hooks contributed to)
from fusedops.hooks.machinery import (
    ClassPatches,
    Hook,
    Target,
    Unpatched,
    contribute,
    disable,
    enable,
    register_hook,
    resolve,
)

_ACTIVATIONS = "transformers.activations"
_QUICK_GELU = "QuickGELUActivation"
#: Model files that import QuickGELUActivation by name (patched there too: a file imported
#: before the hook was enabled keeps its own reference).
_QUICK_GELU_IMPORTERS = ("transformers.models.bridgetower.modeling_bridgetower",)


def _fused_quick_gelu(original: Any) -> Any:
    """The fused class for a class, or for a ``(class, kwargs)`` activation-table entry."""
    fused_subclass = resolve("fusedops.nn.quick_gelu:fused_subclass")
    if isinstance(original, tuple):
        cls, kwargs = original
        return fused_subclass(cls), kwargs
    return fused_subclass(original)


_QUICK_GELU_CLASS = ClassPatches(
    {(_ACTIVATIONS, _QUICK_GELU): _fused_quick_gelu},
    importers={(_ACTIVATIONS, _QUICK_GELU): _QUICK_GELU_IMPORTERS},
)


def _quick_gelu_targets(**_: Any) -> list[Target]:
    return [
        *_QUICK_GELU_CLASS.targets(),
        Target(_ACTIVATIONS, "ACT2CLS", _fused_quick_gelu, key="quick_gelu"),
        Target(_ACTIVATIONS, "ACT2FN", _fused_quick_gelu, key="quick_gelu"),
    ]


contribute("quick_gelu", _quick_gelu_targets, _QUICK_GELU_CLASS.swap, package="transformers")


#: transformers' RMSNorm-family classes by variant (fusedops/nn/rms_norm_variants.py: llama, t5,
#: fp32_weight, unweighted, gemma), as ``<package>.<modeling module>.<class>`` under
#: ``transformers.models``; checked against transformers 5.23.
RMS_NORM_CLASSES: dict[str, str] = {
    "llama": """
        aimv2.modeling_aimv2.Aimv2RMSNorm apertus.modeling_apertus.ApertusRMSNorm
        arcee.modeling_arcee.ArceeRMSNorm aria.modeling_aria.AriaTextRMSNorm
        axk1.modeling_axk1.AXK1RMSNorm axk2.modeling_axk2.AXK2RMSNorm
        bailing_hybrid.modeling_bailing_hybrid.BailingHybridRMSNorm
        bamba.modeling_bamba.BambaRMSNorm bitnet.modeling_bitnet.BitNetRMSNorm
        blt.modeling_blt.BltRMSNorm chameleon.modeling_chameleon.ChameleonRMSNorm
        clvp.modeling_clvp.ClvpRMSNorm cohere2_moe.modeling_cohere2_moe.Cohere2MoeRMSNorm
        cosmos3_edge.modeling_cosmos3_edge.Cosmos3EdgeTextRMSNorm csm.modeling_csm.CsmRMSNorm
        cwm.modeling_cwm.CwmRMSNorm deepseek_ocr2.modeling_deepseek_ocr2.DeepseekOcr2TextRMSNorm
        deepseek_ocr2.modeling_deepseek_ocr2.DeepseekOcr2VisionRMSNorm
        deepseek_v2.modeling_deepseek_v2.DeepseekV2RMSNorm
        deepseek_v3.modeling_deepseek_v3.DeepseekV3RMSNorm
        deepseek_v32.modeling_deepseek_v32.DeepseekV32RMSNorm deimv2.modeling_deimv2.Deimv2RMSNorm
        dia.modeling_dia.DiaRMSNorm diffllama.modeling_diffllama.DiffLlamaRMSNorm
        doge.modeling_doge.DogeRMSNorm dots1.modeling_dots1.Dots1RMSNorm
        dots3_note.modeling_dots3_note.Dots3NoteRMSNorm emu3.modeling_emu3.Emu3RMSNorm
        ernie4_5.modeling_ernie4_5.Ernie4_5RMSNorm
        ernie4_5_moe.modeling_ernie4_5_moe.Ernie4_5_MoeRMSNorm
        ernie4_5_vl_moe.modeling_ernie4_5_vl_moe.Ernie4_5_VLMoeRMSNorm
        eurobert.modeling_eurobert.EuroBertRMSNorm evolla.modeling_evolla.EvollaRMSNorm
        exaone4.modeling_exaone4.Exaone4RMSNorm exaone4_5.modeling_exaone4_5.Exaone4_5_RMSNorm
        exaone_moe.modeling_exaone_moe.ExaoneMoeRMSNorm
        falcon_h1.modeling_falcon_h1.FalconH1RMSNorm
        falcon_mamba.modeling_falcon_mamba.FalconMambaRMSNorm glm.modeling_glm.GlmRMSNorm
        glm4.modeling_glm4.Glm4RMSNorm glm4_moe.modeling_glm4_moe.Glm4MoeRMSNorm
        glm4_moe_lite.modeling_glm4_moe_lite.Glm4MoeLiteRMSNorm glm4v.modeling_glm4v.Glm4vRMSNorm
        glm4v_moe.modeling_glm4v_moe.Glm4vMoeRMSNorm
        glm4v_moe.modeling_glm4v_moe.Glm4vMoeTextRMSNorm
        glm5_next.modeling_glm5_next.Glm5NextRMSNorm
        glm5_next.modeling_glm5_next.Glm5NextTextRMSNorm
        glm_image.modeling_glm_image.GlmImageRMSNorm
        glm_moe_dsa.modeling_glm_moe_dsa.GlmMoeDsaRMSNorm glm_ocr.modeling_glm_ocr.GlmOcrRMSNorm
        granite.modeling_granite.GraniteRMSNorm
        granite4_vision.modeling_granite4_vision.Granite4VisionTextRMSNorm
        granite_docling.modeling_granite_docling.GraniteDoclingTextRMSNorm
        granite_swa.modeling_granite_swa.GraniteSWARMSNorm
        granitemoe.modeling_granitemoe.GraniteMoeRMSNorm
        granitemoe_swa.modeling_granitemoe_swa.GraniteMoeSWARMSNorm
        granitemoehybrid.modeling_granitemoehybrid.GraniteMoeHybridRMSNorm
        granitemoeshared.modeling_granitemoeshared.GraniteMoeSharedRMSNorm
        higgs_audio_v2.modeling_higgs_audio_v2.HiggsAudioV2RMSNorm
        hunyuan_v1_dense.modeling_hunyuan_v1_dense.HunYuanDenseV1RMSNorm
        hunyuan_v1_moe.modeling_hunyuan_v1_moe.HunYuanMoEV1RMSNorm
        hunyuan_vl.modeling_hunyuan_vl.HunYuanVLRMSNorm hy_v3.modeling_hy_v3.HYV3RMSNorm
        hy_v4.modeling_hy_v4.HYV4RMSNorm hyperclovax.modeling_hyperclovax.HyperCLOVAXRMSNorm
        idefics2.modeling_idefics2.Idefics2RMSNorm idefics3.modeling_idefics3.Idefics3RMSNorm
        inkling.modeling_inkling.InklingRMSNorm internvl.modeling_internvl.InternVLVisionRMSNorm
        jamba.modeling_jamba.JambaRMSNorm jetmoe.modeling_jetmoe.JetMoeRMSNorm
        kimi_linear.modeling_kimi_linear.KimiLinearRMSNorm
        kolibri1.modeling_kolibri1.Kolibri1RMSNorm laguna.modeling_laguna.LagunaRMSNorm
        lfm2.modeling_lfm2.Lfm2RMSNorm lfm2_moe.modeling_lfm2_moe.Lfm2MoeRMSNorm
        lfm3.modeling_lfm3.Lfm3RMSNorm lfm3_vl.modeling_lfm3_vl.Lfm3VlVisionRMSNorm
        lighton_ocr.modeling_lighton_ocr.LightOnOcrRMSNorm llama.modeling_llama.LlamaRMSNorm
        llama4.modeling_llama4.Llama4TextRMSNorm
        longcat_flash.modeling_longcat_flash.LongcatFlashRMSNorm mamba.modeling_mamba.MambaRMSNorm
        mamba2.modeling_mamba2.Mamba2RMSNorm mellum.modeling_mellum.MellumRMSNorm
        mimo_v2_flash.modeling_mimo_v2_flash.MiMoV2FlashRMSNorm
        minicpm3.modeling_minicpm3.MiniCPM3RMSNorm minimax.modeling_minimax.MiniMaxRMSNorm
        minimax_m2.modeling_minimax_m2.MiniMaxM2RMSNorm
        ministral.modeling_ministral.MinistralRMSNorm
        ministral3.modeling_ministral3.Ministral3RMSNorm mistral.modeling_mistral.MistralRMSNorm
        mistral3.modeling_mistral3.Mistral3RMSNorm mistral4.modeling_mistral4.Mistral4RMSNorm
        mistral_large4.modeling_mistral_large4.MistralLarge4RMSNorm
        mixtral.modeling_mixtral.MixtralRMSNorm mllama.modeling_mllama.MllamaTextRMSNorm
        molmo2.modeling_molmo2.Molmo2RMSNorm
        muse_glimmer_assistant.modeling_muse_glimmer_assistant.MuseGlimmerAssistantRMSNorm
        neucodec.modeling_neucodec.NeuCodecRMSNorm olmoe.modeling_olmoe.OlmoeRMSNorm
        ovis2.modeling_ovis2.Ovis2RMSNorm paddleocr_vl.modeling_paddleocr_vl.PaddleOCRRMSNorm
        pe_audio.modeling_pe_audio.PeAudioEncoderRMSNorm
        pe_audio_video.modeling_pe_audio_video.PeAudioVideoEncoderRMSNorm
        pe_video.modeling_pe_video.PeVideoEncoderRMSNorm phi3.modeling_phi3.Phi3RMSNorm
        phi4_multimodal.modeling_phi4_multimodal.Phi4MultimodalRMSNorm
        pixtral.modeling_pixtral.PixtralRMSNorm
        qianfan_ocr.modeling_qianfan_ocr.QianfanOCRVisionRMSNorm qwen2.modeling_qwen2.Qwen2RMSNorm
        qwen2_5_omni.modeling_qwen2_5_omni.Qwen2_5OmniRMSNorm
        qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLRMSNorm
        qwen2_moe.modeling_qwen2_moe.Qwen2MoeRMSNorm qwen2_vl.modeling_qwen2_vl.Qwen2VLRMSNorm
        qwen3.modeling_qwen3.Qwen3RMSNorm qwen3_moe.modeling_qwen3_moe.Qwen3MoeRMSNorm
        qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoeCode2WavRMSNorm
        qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoeRMSNorm
        qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoeTextRMSNorm
        qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoeThinkerTextRMSNorm
        qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRMSNorm
        qwen3_vl_moe.modeling_qwen3_vl_moe.Qwen3VLMoeTextRMSNorm
        sapiens2.modeling_sapiens2.Sapiens2RMSNorm seed_oss.modeling_seed_oss.SeedOssRMSNorm
        smollm3.modeling_smollm3.SmolLM3RMSNorm solar_open.modeling_solar_open.SolarOpenRMSNorm
        timesfm.modeling_timesfm.TimesFmRMSNorm timesfm2_5.modeling_timesfm2_5.TimesFm2_5RMSNorm
        ultrabert.modeling_ultrabert.UltrabertRMSNorm
        ultravbert.modeling_ultravbert.UltraVBertRMSNorm
        unlimited_ocr.modeling_unlimited_ocr.UnlimitedOcrTextRMSNorm
        vibevoice.modeling_vibevoice.VibeVoiceRMSNorm
        vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer.VibeVoiceAcousticTokenizerRMSNorm
        vibevoice_asr.modeling_vibevoice_asr.VibeVoiceAsrRMSNorm
        voxtral_realtime.modeling_voxtral_realtime.VoxtralRealtimeRMSNorm
        xcodec2.modeling_xcodec2.Xcodec2RMSNorm youtu.modeling_youtu.YoutuRMSNorm
        zamba.modeling_zamba.ZambaRMSNorm zamba2.modeling_zamba2.Zamba2RMSNorm
        zaya.modeling_zaya.ZayaRMSNorm
    """,
    "t5": """
        idefics.modeling_idefics.IdeficsRMSNorm longt5.modeling_longt5.LongT5LayerNorm
        mt5.modeling_mt5.MT5LayerNorm t5.modeling_t5.T5LayerNorm umt5.modeling_umt5.UMT5LayerNorm
    """,
    "fp32_weight": """
        afmoe.modeling_afmoe.AfmoeRMSNorm beam.modeling_beam.BeamRMSNorm
        deepseek_v4.modeling_deepseek_v4.DeepseekV4RMSNorm
        diffusion_gemma.modeling_diffusion_gemma.DiffusionGemmaRMSNorm
        embedding_gemma2.modeling_embedding_gemma2.EmbeddingGemma2RMSNorm
        flex_olmo.modeling_flex_olmo.FlexOlmoRMSNorm flint.modeling_flint.FlintRMSNorm
        gemma3n.modeling_gemma3n.Gemma3nRMSNorm gemma4.modeling_gemma4.Gemma4RMSNorm
        gemma4_unified.modeling_gemma4_unified.Gemma4UnifiedRMSNorm
        gpt_oss.modeling_gpt_oss.GptOssRMSNorm helium.modeling_helium.HeliumRMSNorm
        inkling2.modeling_inkling2.Inkling2RMSNorm
        kyutai_speech_to_text.modeling_kyutai_speech_to_text.KyutaiSpeechToTextRMSNorm
        moshi.modeling_moshi.MoshiRMSNorm muse_glimmer.modeling_muse_glimmer.MuseGlimmerRMSNorm
        muse_spark.modeling_muse_spark.MuseSparkRMSNorm
        nemotron_h.modeling_nemotron_h.NemotronHRMSNorm
        nemotron_h_omni.modeling_nemotron_h_omni.NemotronH_Omni_RMSNorm
        neomme.modeling_neomme.NeoMMERMSNorm olmo2.modeling_olmo2.Olmo2RMSNorm
        olmo3.modeling_olmo3.Olmo3RMSNorm olmo_hybrid.modeling_olmo_hybrid.OlmoHybridRMSNorm
        openai_privacy_filter.modeling_openai_privacy_filter.OpenAIPrivacyFilterRMSNorm
    """,
    "unweighted": """
        esmfold2.modeling_esmfold2.EsmFold2RMSNorm
        falcon_mamba.modeling_falcon_mamba.FalconMambaWeightlessRMSNorm
        hrm_text.modeling_hrm_text.HrmTextRMSNorm nanochat.modeling_nanochat.NanoChatRMSNorm
    """,
    "gemma": """
        gemma.modeling_gemma.GemmaRMSNorm gemma2.modeling_gemma2.Gemma2RMSNorm
        gemma3.modeling_gemma3.Gemma3RMSNorm
        minimax_m3_vl.modeling_minimax_m3_vl.MiniMaxM3VLRMSNorm
        muse_glimmer.modeling_muse_glimmer.MuseGlimmerTextCenteredRMSNorm
        qwen3_5.modeling_qwen3_5.Qwen3_5RMSNorm qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeRMSNorm
        qwen3_next.modeling_qwen3_next.Qwen3NextRMSNorm
        recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaRMSNorm
        step3p7.modeling_step3p7.Step3p7RMSNorm t5gemma.modeling_t5gemma.T5GemmaRMSNorm
        t5gemma2.modeling_t5gemma2.T5Gemma2RMSNorm vaultgemma.modeling_vaultgemma.VaultGemmaRMSNorm
    """,
}

#: RMSNorm-like classes of transformers 5.23 that are not fused, and why.
EXCLUDED: dict[str, str] = {
    **dict.fromkeys(
        (
            "bamba.modeling_bamba.BambaRMSNormGated",
            "granitemoehybrid.modeling_granitemoehybrid.GraniteMoeHybridRMSNormGated",
            "mamba2.modeling_mamba2.MambaRMSNormGated",
            "nemotron_h.modeling_nemotron_h.NemotronHRMSNormGated",
            "zamba2.modeling_zamba2.Zamba2RMSNormGated",
            "falcon_h1.modeling_falcon_h1.FalconH1RMSNormGated",
        ),
        "gated, grouped: silu(gate) multiplied in before normalising over groups",
    ),
    **dict.fromkeys(
        (
            "olmo_hybrid.modeling_olmo_hybrid.OlmoHybridRMSNormGated",
            "qwen3_5.modeling_qwen3_5.Qwen3_5RMSNormGated",
            "qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeRMSNormGated",
            "qwen3_next.modeling_qwen3_next.Qwen3NextRMSNormGated",
            "qwen4_exp.modeling_qwen4_exp.Qwen4ExpTextRMSNormGated",
            "bailing_hybrid.modeling_bailing_hybrid.BailingHybridRMSNormGated",
            "glm5_next.modeling_glm5_next.Glm5NextTextRMSNormGated",
            "kimi_linear.modeling_kimi_linear.KimiLinearRMSNormGated",
        ),
        "gated: forward(hidden_states, gate) multiplies by act(gate) after the norm",
    ),
    **dict.fromkeys(
        (
            "deepseek_v4.modeling_deepseek_v4.DeepseekV4UnweightedRMSNorm",
            "glm5_next.modeling_glm5_next.Glm5NextTextUnweightedRMSNorm",
            "inkling2.modeling_inkling2.Inkling2UnweightedRMSNorm",
        ),
        "x * rstd.to(x.dtype): rstd is rounded to x's dtype and multiplied in x's dtype",
    ),
    "axk2.modeling_axk2.AXK2GatedRMSNorm": "a block (AXK2RMSNorm, listed, then a gate MLP)",
    "hy_v4.modeling_hy_v4.HYV4UnweightedRMSNorm": "returns rstd only, not a normalised x",
    "muse_spark.modeling_muse_spark.MuseSparkTextCenteredRMSNorm": (
        "(1 + weight) computed in the weight's dtype before the fp32 multiply"
    ),
    "muse_spark.modeling_muse_spark.MuseSparkTextInputScaledRMSNorm": (
        "x is scaled by (1 + weight) before it is normalised"
    ),
    "qwen4_exp.modeling_qwen4_exp.Qwen4ExpTextRMSNorm": (
        "optional group_size: normalises groups of the hidden dim, (1 + weight) scaling"
    ),
    "speecht5.modeling_speecht5.SpeechT5LayerNormConvLayer": "a conv layer, not a norm",
}


#: Listed classes that no model construction path of transformers 5.23 reaches (their modeling
#: file never instantiates them): patched like the others, for code that uses them directly.
UNREACHED: dict[str, str] = {
    "idefics3.modeling_idefics3.Idefics3RMSNorm": "defined in modeling_idefics3, never built",
}


#: The code of each variant's forward (and ``_norm``, where the class has one) as transformers
#: 5.23 writes it, normalised (no docstrings or annotations); the classes' own code is checked
#: against it before they are patched (``rms_norm_code_mismatch``), and
#: ``tests/test_transformers_norm_list.py`` checks every listed class's source against it.
RMS_NORM_FORWARDS: list[tuple[str, str]] = [
    # llama: Aimv2RMSNorm (140 classes)
    (
        "llama",
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
""",
    ),
    # gemma: GemmaRMSNorm (13 classes)
    (
        "gemma",
        """
def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight.float())
    return output.type_as(x)
""",
    ),
    # fp32_weight: AfmoeRMSNorm (11 classes)
    (
        "fp32_weight",
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return (self.weight * hidden_states).to(input_dtype)
""",
    ),
    # fp32_weight: DiffusionGemmaRMSNorm (8 classes)
    (
        "fp32_weight",
        """
def _norm(self, hidden_states):
    mean_squared = hidden_states.pow(2).mean(-1, keepdim=True) + self.eps
    return hidden_states * torch.pow(mean_squared, -0.5)
def forward(self, hidden_states):
    normed_output = self._norm(hidden_states.float())
    if self.with_scale:
        normed_output = normed_output * self.weight.float()
    return normed_output.type_as(hidden_states)
""",
    ),
    # t5: IdeficsRMSNorm (5 classes)
    (
        "t5",
        """
def forward(self, hidden_states):
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states
""",
    ),
    # unweighted: EsmFold2RMSNorm (4 classes)
    (
        "unweighted",
        """
def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
def forward(self, x):
    return self._norm(x.float()).type_as(x)
""",
    ),
    # fp32_weight: HeliumRMSNorm (3 classes)
    (
        "fp32_weight",
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return (self.weight.to(torch.float32) * hidden_states).to(input_dtype)
""",
    ),
    # fp32_weight: KyutaiSpeechToTextRMSNorm (2 classes)
    (
        "fp32_weight",
        """
def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
def forward(self, x):
    output = self._norm(x.float())
    output = output * self.weight.float()
    return output.type_as(x)
""",
    ),
    # llama: Llama4TextRMSNorm (1 classes)
    (
        "llama",
        """
def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
def forward(self, x):
    output = self._norm(x.float()).type_as(x)
    return output * self.weight
""",
    ),
]


@functools.lru_cache(maxsize=256)
def _compiled(source: str, docstrings: tuple[str | None, ...]) -> tuple:
    """The code of the functions ``source`` defines, each with its docstring (None: none),
    as ``_code`` keys: compiled (never run) in a module that imports torch, as modeling files
    do (the compiler emits other bytecode for attributes of an imported module)."""
    tree = ast.parse(source)
    for function, doc in zip(tree.body, docstrings):
        if doc is not None:
            function.body.insert(0, ast.Expr(ast.Constant(doc)))
    tree.body.insert(0, ast.Import([ast.alias("torch")]))
    module = compile(ast.fix_missing_locations(tree), "<fusedops rms_norm variant>", "exec")
    functions = {c.co_name: c for c in module.co_consts if hasattr(c, "co_code")}
    return tuple(_code_key(functions[node.name]) for node in tree.body[1:])


def _code_key(code: Any) -> tuple:
    """What a code object computes, without where it is written: bytecode, constants, names."""
    return code.co_code, code.co_consts, code.co_names, code.co_varnames


def _code(function: Any) -> tuple | None:
    code = getattr(function, "__code__", None)
    return None if code is None else _code_key(code)


def rms_norm_code_mismatch(original: type, variant: str) -> str | None:
    """None when ``original``'s forward (and ``_norm``) is the code of one of ``variant``'s
    forwards in ``RMS_NORM_FORWARDS`` (compiled here: docstrings and annotations do not count),
    else why it is not."""
    for name, source in RMS_NORM_FORWARDS:
        if name != variant:
            continue
        names = [node.name for node in ast.parse(source).body]
        functions = [getattr(original, function, None) for function in names]
        docstrings = tuple(getattr(function, "__doc__", None) for function in functions)
        if tuple(map(_code, functions)) == _compiled(source, docstrings):
            return None
    return f"its forward is not the code of the {variant!r} RMSNorm variant fusedops fuses"


def _fused_rms_norm(variant: str):
    def make(original: type) -> type:
        mismatch = rms_norm_code_mismatch(original, variant)
        if mismatch is not None:
            raise Unpatched(mismatch)
        return resolve("fusedops.nn.rms_norm_variants:fused_subclass")(original, variant)

    return make


def _rms_norm_classes() -> dict[tuple[str, str], Any]:
    """(module, class) -> its make, for every listed class."""
    found = {}
    for variant, names in RMS_NORM_CLASSES.items():
        for name in names.split():
            module, _, cls = name.rpartition(".")
            found[(f"transformers.models.{module}", cls)] = _fused_rms_norm(variant)
    return found


_RMS_NORM = ClassPatches(_rms_norm_classes(), optional=True)
contribute("rms_norm", _RMS_NORM.targets, _RMS_NORM.swap, package="transformers")


# ------------------------------------------------------------------------------------------
# Swin / Swinv2 (the "swin" hook; timm's classes are added by lib_timm): the layers' shift +
# partition / reverse + unshift become the fused window gathers, the attention's bias + mask +
# softmax the fused Swin softmax (fusedops/nn/swin_transformers.py).

SWIN_TRANSFORMERS_CLASSES = (
    ("transformers.models.swin.modeling_swin", "SwinLayer"),
    ("transformers.models.swin.modeling_swin", "SwinAttention"),
    ("transformers.models.swinv2.modeling_swinv2", "Swinv2Layer"),
    ("transformers.models.swinv2.modeling_swinv2", "Swinv2SelfAttention"),
)


def swin_patches(classes, recognise: str, *, optional: bool = False) -> ClassPatches:
    """The Swin classes ``classes`` ((module, class) pairs), each replaced by its fused
    subclass, recognised by the ``"module:function"`` named (a class of a code shape it does not
    know is left unpatched, with the reason)."""

    def make(original):
        fused = importlib.import_module("fusedops.nn.swin").fused_subclass(
            original, resolve(recognise)
        )
        if isinstance(fused, str):
            raise Unpatched(fused)
        return fused

    return ClassPatches(dict.fromkeys(classes, make), optional=optional)


register_hook(
    Hook("swin", targets=lambda **_: [], nothing_hint="neither transformers nor timm is installed")
)
# Swinv2 (or a layout) may be missing from some transformers versions: optional targets.
_SWIN = swin_patches(
    SWIN_TRANSFORMERS_CLASSES, "fusedops.nn.swin_transformers:recognise", optional=True
)
contribute("swin", _SWIN.targets, _SWIN.swap, package="transformers")


def enable_fused_swin() -> None:
    """Make Swin models use fusedops' window gathers and Swin softmax: transformers'
    ``SwinLayer``, ``SwinAttention``, ``Swinv2Layer``, ``Swinv2SelfAttention`` and timm's
    ``SwinTransformerBlock``, ``WindowAttention`` are replaced by fused subclasses (now, or when
    their module is imported). Models built before: ``fusedops.replace_modules(model)``."""
    enable("swin")


def disable_fused_swin() -> None:
    """Restore the Swin classes ``enable_fused_swin`` replaced."""
    disable("swin")
