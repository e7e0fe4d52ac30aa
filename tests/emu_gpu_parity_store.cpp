/* CUDA emulation build: tests/gpu_parity_store.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "gpu_parity_store.cu"
