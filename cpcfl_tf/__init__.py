"""cpcfl_tf: contrastive encoder pre-training-based clustered federated learning
(CP-CFL) in TensorFlow/Keras."""

import os

# TensorFlow turns its oneDNN CPU kernels on by default only on x86 CPUs with
# neural-network extensions (AVX512_VNNI, AVX512_BF16, AMX); elsewhere, e.g. on an
# AVX2-only AMD EPYC, it runs Eigen's, which made a simulator round about 1.5x slower
# there (docs/performance.md) and give other last bits. The kit
# asks for oneDNN everywhere, so every x86 machine runs the same kernel family. TensorFlow
# reads this once, when it is imported; an explicit TF_ENABLE_ONEDNN_OPTS=0 still wins,
# and every result's ``environment`` says which kernels ran.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# TensorFlow maps (nearly) all of a GPU's memory into the first process that touches it,
# so a second process on the card fails: Flower's Simulation Engine runs each ClientApp
# in its own actor, and several actors share a GPU (Flower issue 3159). Every process the
# kit starts imports this package before TensorFlow first touches a GPU (the scripts, the
# ServerApp, the ClientApp and so each Simulation Engine actor), so asking for memory
# growth here covers them all; an explicit TF_FORCE_GPU_ALLOW_GROWTH=false still wins.
# On a CPU it does nothing. Unverified on a GPU (docs/flower.md).
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
