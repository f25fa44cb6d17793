#!/usr/bin/env bash
# The GPU check of `sampler: vllm`, in one go on a machine with an NVIDIA GPU (prepared on the
# CPU build machine, which has none): builds vLLM's GPU environment (`draco-gym setup vllm
# --build gpu`: vllm with the CUDA torch it pins, plus this project's ray), then runs
# bench/sampler.py on the GPU: tokens/s of the torch sampler and of the vLLM sampler (same
# prompts, batch, model, LoRA adapter and token budget), then one GRPO iteration with each
# sampler and its phase times (the learner stays on the CPU: one GPU, and the engine holds
# it; in the iteration the torch sampler runs on its env runner's CPU). The last line is the
# sampling ratio vLLM/torch.
#
#   bash bench/gpu_check.sh            # from the repository root, with its venv active
#   GPU_CHECK_TOKENS=128 bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled LITELLM_LOCAL_MODEL_COST_MAP=True
nvidia-smi -L
draco-gym setup model
draco-gym setup vllm --build gpu
# torch for the torch sampler in this venv must see the GPU too
python -c "import torch; assert torch.cuda.is_available(), 'this venv has a CPU torch: pip install torch==2.13.0 (CUDA) here'"
python bench/sampler.py --device cuda --prompts "${GPU_CHECK_PROMPTS:-64}" --tokens "${GPU_CHECK_TOKENS:-128}"
