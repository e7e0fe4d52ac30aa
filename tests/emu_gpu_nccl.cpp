/* CUDA emulation build: tests/gpu_nccl.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "gpu_nccl.cu"
