"""Constants of op semantics that kernels and references share."""

#: QuickGELU's slope: ``y = x * sigmoid(QUICK_GELU_ALPHA * x)`` (CLIP's activation). The Triton
#: kernel keeps the same literal (its sources are hashed for the verified-dispatch table;
#: tests/test_quick_gelu.py checks the two agree).
QUICK_GELU_ALPHA = 1.702
