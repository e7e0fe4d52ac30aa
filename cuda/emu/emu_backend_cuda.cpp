/* CUDA emulation build: cuda/backend_cuda.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../backend_cuda.cu"
