/* CUDA emulation build: tests/gpu_parity_backend.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "gpu_parity_backend.cu"
